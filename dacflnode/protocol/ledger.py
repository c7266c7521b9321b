"""One-sided edge uses, kept until the other end says whether it used the edge too.

When node ``i`` mixes neighbour ``j``'s round-``t`` estimate, its mix gains
``w_ij (x_j^t − x_i^t)``. If ``j`` mixed ``i``'s in the same round, ``j`` gains the opposite
term and ``Σ x`` is unchanged; if ``j`` did not, ``Σ x`` is off by that term. ``i`` learns which
from the ``used_log`` of ``j``'s later headers, and then subtracts the term from its own ``x``:
``Σ x`` is exact again (docs/faults.md has the argument).

An entry holds the weight and the two vectors it came from (references, not copies: the
vectors are the round's states, which nobody mutates), so a healthy round costs no arithmetic;
the correction is computed only when it is needed or written to a checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

from dacflnode.wire.message import RoundMessage

Key = tuple[int, str]  # (round, neighbour)


@dataclass(frozen=True)
class Entry:
    """``weight · (theirs − mine)``; an entry read from a checkpoint has ``mine`` ``None`` and
    the correction itself in ``theirs`` (weight 1)."""

    weight: float
    theirs: torch.Tensor
    mine: torch.Tensor | None

    def correction(self) -> torch.Tensor:
        if self.mine is None:
            return self.theirs if self.weight == 1.0 else self.theirs * self.weight
        return (self.theirs - self.mine).mul_(self.weight)


@dataclass
class Resolution:
    """What a neighbour's header settled: the entries to undo, and how many entries turned out
    to be two-sided."""

    undo: list[tuple[Key, Entry]]
    confirmed: int
    #: entries of earlier rounds than the header's that it no longer covers: they cannot be
    #: settled any more
    uncovered: list[Key] = field(default_factory=list)

    @property
    def subtract(self) -> list[tuple[Key, torch.Tensor]]:
        """The corrections to subtract (computed here: a pass over the state each)."""
        return [(key, entry.correction()) for key, entry in self.undo]


class Ledger:
    """Pending one-sided uses of a node, by ``(round, neighbour)``."""

    def __init__(self, entries: Mapping[Key, Entry] | None = None) -> None:
        self.entries: dict[Key, Entry] = dict(entries or {})

    def __len__(self) -> int:
        return len(self.entries)

    def record(
        self, round_: int, node: str, weights: Mapping[str, float],
        theirs: Mapping[str, torch.Tensor], mine: torch.Tensor,
    ) -> None:
        """Round ``round_`` mixed ``theirs[j]`` with ``weights[j]`` for every neighbour ``j``."""
        for peer, weight in weights.items():
            if peer != node and weight != 0.0:
                self.entries[(round_, peer)] = Entry(float(weight), theirs[peer], mine)

    def resolve(self, node: str, message: RoundMessage) -> Resolution:
        """Settle this node's entries for ``message.sender`` that its ``used_log`` covers."""
        undo: list[tuple[Key, Entry]] = []
        confirmed = 0
        uncovered: list[Key] = []
        for key in [k for k in self.entries if k[1] == message.sender]:
            used = message.used_in(key[0])
            if used is None:
                # the sender logs each round in which it mixed this node's edge until the edge
                # has been active `window` more times; a header of a later round without it
                # says the answer is lost (see EdgeBook.record_round)
                if key[0] < message.round:
                    uncovered.append(key)
                continue
            entry = self.entries.pop(key)
            if node in used:
                confirmed += 1
            else:
                undo.append((key, entry))
        return Resolution(undo, confirmed, uncovered)

    def forget(self, keys: Iterable[Key]) -> None:
        for key in list(keys):
            self.entries.pop(key, None)

    def of_peer(self, peer: str) -> list[Key]:
        return [k for k in self.entries if k[1] == peer]

    def clear(self) -> None:
        self.entries.clear()

    # ------------------------------------------------------------------ checkpoints
    def tensors(self) -> dict[str, torch.Tensor]:
        """The corrections as ``pending.<round>.<peer>`` tensors (checkpoint format)."""
        return {f"pending.{r}.{peer}": entry.correction().contiguous()
                for (r, peer), entry in sorted(self.entries.items())}

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, torch.Tensor]) -> Ledger:
        entries: dict[Key, Entry] = {}
        for name, tensor in tensors.items():
            prefix, _, rest = name.partition(".")
            if prefix != "pending":
                continue
            round_text, _, peer = rest.partition(".")
            entries[(int(round_text), peer)] = Entry(1.0, tensor, None)
        return cls(entries)
