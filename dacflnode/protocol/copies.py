"""CHOCO-Gossip's public copies of one node in a compressed run (docs/compression.md).

Every node keeps a public copy ``v̂`` of each exchanged vector (``x``, ``omega``) of itself and of
each neighbour. Each round it sends ``q = Q(v − v̂)`` (compressed) and adds the *decoded* ``q`` to
its own copy; a neighbour adds the same decoded ``q`` to its copy of the node. Decoding gives the
same bits everywhere, so both ends of an edge hold the same copies, and CHOCO's mix
(:func:`~dacflnode.algorithms.rounds.choco_sum`) keeps ``Σ x`` exact.

Each copy carries an id, a 64-bit hash of its bytes (never 0): a message says which copy of its
sender it updates (``copy_base``) and which one it makes (``copy_next``). A receiver whose copy
of the sender is not ``copy_base`` (it missed a message, restarted, or the sender restarted)
cannot apply the update; it pulls the sender's full copy by id instead, which the sender keeps
for its last :data:`KEEP` updates. Copies are never written in place: an update makes new
tensors, so a copy handed out (to a pull, to the mix of a round) never changes under its reader.

A node that starts at round 0 starts every copy at the common initial model, which every node
derives from the seed: the copies agree from the start and no full copy moves. A node that
restarts from a checkpoint starts a new lineage from its own state and holds no neighbour's
copy: each side pulls the other's full copy once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import xxhash

from dacflnode.algorithms.compression import Compressor, make_compressor, stable_seed
from dacflnode.wire.message import RoundMessage

Tensor = torch.Tensor
Vectors = dict[str, Tensor]

#: Own copies kept for neighbours that pull one (a neighbour is at most a round or two behind).
KEEP = 4


@dataclass(frozen=True)
class Compression:
    """A run's compression as every node applies it: the compressor, CHOCO's step ``gamma``
    and the run's seed (stochastic rounding and random-k indices derive from it)."""

    compressor: Compressor
    gamma: float
    seed: int
    #: decoded updates the nodes of one process share (the simulator's); ``None``: each node
    #: decodes what it receives (a daemon)
    decodes: SharedDecodes | None = None

    @property
    def spec(self) -> str:
        return str(self.compressor.spec)


def compression_for(spec: str, gamma: float | None, seed: int) -> Compression | None:
    """The run's :class:`Compression` (``None`` for ``none``); ``gamma`` ``None``: the
    compressor's default step."""
    compressor = make_compressor(spec)
    if compressor is None:
        return None
    return Compression(compressor, compressor.default_gamma if gamma is None else gamma, seed)


def copy_id(vectors: Mapping[str, Tensor], fields: Sequence[str]) -> int:
    """The id of a copy: XXH3-64 of its fields' bytes in order (1 where that is 0)."""
    digest = xxhash.xxh3_64()
    for name in fields:
        flat = vectors[name].detach().reshape(-1)
        digest.update(memoryview(flat.contiguous().numpy()).cast("B"))  # type: ignore[arg-type]
    return digest.intdigest() or 1


def wire_parts(compression: Compression, fields: Sequence[str], numel: int
               ) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """The tensors of a compressed message: ``<field>.<part> -> (dtype, shape)``."""
    parts = compression.compressor.parts(numel)
    return {f"{name}.{part}": spec for name in fields for part, spec in parts.items()}


def is_compressed(message: RoundMessage) -> bool:
    """Whether ``message`` carries a compressed update of its sender's copy."""
    return message.copy_next != 0 and message.copy_base != 0


class SharedDecodes:
    """Decoded updates shared by the nodes of one process (the simulator): a sender decodes its
    own update to advance its copy, and each of its neighbours would decode the very same
    tensors again. An entry is found only for the tensors it was made from (the same objects),
    so a message changed on its way (a fault plan's poison) is decoded on its own."""

    def __init__(self, keep: int = 64) -> None:
        self.keep = max(1, keep)
        self._entries: OrderedDict[tuple[str, int, int, str],
                                   tuple[tuple[int, ...], Tensor]] = OrderedDict()
        self.hits = 0

    def put(self, key: tuple[str, int, int, str], parts: Mapping[str, Tensor],
            decoded: Tensor) -> None:
        self._entries[key] = (_identity(parts), decoded)
        while len(self._entries) > self.keep:
            self._entries.popitem(last=False)

    def get(self, key: tuple[str, int, int, str], parts: Mapping[str, Tensor]
            ) -> Tensor | None:
        entry = self._entries.get(key)
        if entry is None or entry[0] != _identity(parts):
            return None
        self.hits += 1
        return entry[1]


def _identity(parts: Mapping[str, Tensor]) -> tuple[int, ...]:
    return tuple(id(parts[k]) for k in sorted(parts))


@dataclass(frozen=True)
class Update:
    """A computed change of one copy, applied by :meth:`PublicCopies.commit` (computing runs
    off the event loop, committing on it)."""

    peer: str | None  # None: the node's own copy
    copy: Vectors
    id: int


class PublicCopies:
    """The public copies a node holds (see the module docstring).

    ``initial``: the node's outgoing state it starts from; ``shared``: that state is the common
    initial model, which every neighbour's copy of every node starts at too.
    """

    def __init__(self, node: str, neighbours: Sequence[str], fields: Sequence[str],
                 compression: Compression, initial: Mapping[str, Tensor], shared: bool,
                 keep: int = KEEP) -> None:
        self.node = node
        self.decodes = compression.decodes
        self.fields = tuple(fields)
        self.compression = compression
        self.keep = max(1, keep)
        own = {name: initial[name].detach().reshape(-1).clone() for name in self.fields}
        self.numel = next(iter(own.values())).numel()
        self.own = own
        self.own_id = copy_id(own, self.fields)
        self._history: OrderedDict[int, Vectors] = OrderedDict({self.own_id: own})
        #: each neighbour's copy as this node holds it: ``(id, vectors)``
        self.theirs: dict[str, tuple[int, Vectors]] = (
            {j: (self.own_id, own) for j in neighbours} if shared else {})
        #: full copies pulled, and updates that could not be applied (counters for status)
        self.pulled = 0

    # ------------------------------------------------------------------ own copy
    def _seed(self, sender: str, round_: int, name: str) -> int:
        return stable_seed(self.compression.seed, sender, round_, name)

    def encode(self, round_: int, state: Mapping[str, Tensor]) -> tuple[Vectors, Update]:
        """The compressed tensors of the node's round-``round_`` message and the update of its
        own copy they make (commit it before the message leaves)."""
        compressor = self.compression.compressor
        parts: Vectors = {}
        new: Vectors = {}
        for name in self.fields:
            seed = self._seed(self.node, round_, name)
            base = self.own[name]
            delta = state[name].detach().reshape(-1).to(device="cpu", dtype=torch.float32) - base
            encoded = compressor.encode(delta, seed)
            decoded = compressor.decode(encoded, self.numel, seed)
            if self.decodes is not None:
                self.decodes.put((self.node, round_, self.own_id, name), encoded, decoded)
            new[name] = base + decoded
            for part, tensor in encoded.items():
                parts[f"{name}.{part}"] = tensor
        return parts, Update(None, new, copy_id(new, self.fields))

    def commit(self, update: Update) -> None:
        if update.peer is None:
            self.own = update.copy
            self.own_id = update.id
            self._history[update.id] = update.copy
            self._history.move_to_end(update.id)
            while len(self._history) > self.keep:
                self._history.popitem(last=False)
        else:
            self.theirs[update.peer] = (update.id, update.copy)

    def served(self, id_: int) -> Vectors | None:
        """The node's own copy ``id_`` if it still keeps it (what a copy pull answers)."""
        return self._history.get(id_)

    # ------------------------------------------------------------------ neighbours' copies
    def at(self, peer: str, id_: int) -> bool:
        """Whether this node holds ``peer``'s copy ``id_``."""
        have = self.theirs.get(peer)
        return have is not None and have[0] == id_

    def applies(self, message: RoundMessage) -> bool:
        """Whether ``message``'s update applies to the copy this node holds of its sender."""
        return self.at(message.sender, message.copy_base)

    def decode(self, message: RoundMessage) -> Update:
        """The sender's copy after ``message`` (it :meth:`applies`); raises ``ValueError`` for
        parts no honest encoder makes."""
        compressor = self.compression.compressor
        _, copy = self.theirs[message.sender]
        new: Vectors = {}
        for name in self.fields:
            prefix = f"{name}."
            parts = {key[len(prefix):]: t for key, t in message.tensors.items()
                     if key.startswith(prefix)}
            key = (message.sender, message.round, message.copy_base, name)
            decoded = None if self.decodes is None else self.decodes.get(key, parts)
            if decoded is None:
                seed = self._seed(message.sender, message.round, name)
                decoded = compressor.decode(parts, self.numel, seed)
            new[name] = copy[name] + decoded
        return Update(message.sender, new, message.copy_next)

    def adopt(self, peer: str, id_: int, tensors: Mapping[str, Tensor]) -> Update:
        """``peer``'s full copy ``id_`` as pulled (checked: its bytes must hash to ``id_``)."""
        copy = {name: tensors[name].detach().reshape(-1).clone() for name in self.fields}
        got = copy_id(copy, self.fields)
        if got != id_:
            raise ValueError(f"the copy {peer} sent is not copy {id_:#x} (it hashes to "
                             f"{got:#x})")
        return Update(peer, copy, id_)

    def forget(self, peer: str) -> None:
        self.theirs.pop(peer, None)

    def copies(self, peers: Sequence[str]) -> dict[str, Vectors]:
        """The copies a round mixes: the node's own and those of ``peers``."""
        out = {self.node: self.own}
        for j in peers:
            out[j] = self.theirs[j][1]
        return out
