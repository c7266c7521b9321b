"""The round message the transport and wire tests send: a seeded, random state."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dacflnode.wire.message import Kind, RoundMessage, UsedLog

#: Values per tensor of :func:`message` unless a test asks for another size.
SIZE = 16


def message(sender: str = "alice", round_: int = 0, *, size: int = SIZE, seed: int = 0,
            degree: int = 1, names: Sequence[str] = ("omega", "x"), used_log: UsedLog = (),
            kind: Kind = Kind.STATE, anchors: tuple[int, ...] = ()) -> RoundMessage:
    """``sender``'s state of round ``round_``: tensors ``names`` of ``size`` values each, drawn
    from a generator seeded by ``seed``, the round and the sender (the same arguments, the same
    values; another sender or round, other values)."""
    g = torch.Generator().manual_seed(seed + 1000 * round_ + sum(map(ord, sender)))
    tensors = {name: torch.randn(size, generator=g) for name in names}
    return RoundMessage(sender, round_, degree, tensors, used_log=used_log, kind=kind,
                        anchors=anchors)
