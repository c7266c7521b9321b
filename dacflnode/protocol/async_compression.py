"""Compressed exchanges under ``schedule: async`` (docs/compression.md, "Asynchronous runs").

An exchange carries two things, compressed differently:

* **The asking node's snapshot**, as ``Q(v − r)`` of each exchanged vector ``v`` against a
  *reference* ``r`` that both ends of the edge hold: the reconstruction ``r + dec(Q(v − r))``
  of the previous snapshot the asking node sent on that edge and saw answered (CHOCO-Gossip's
  public copy, kept per edge and direction). Error feedback is built in: the next snapshot
  sends what the reconstruction still misses. References start at the run's initial model,
  which every node starts from; a node that restarted holds none, and sends its first snapshot
  on each edge whole (float32, ``copy_base`` 0), which resets the reference at both ends. The
  request names its reference (``copy_base``, the XXH3 id of its bytes) and the
  reconstruction it makes (``copy_next``); the answering node refuses (``NOT_KEPT``) a
  reference it does not hold, and the asking node sends the next snapshot whole.
* **The transfer** ``c``, compressed itself (it is a difference, no reference needed). The
  answering node adds the *decoded* ``dec(Q(c))`` and the asking node subtracts the very same
  bits (decoding is deterministic everywhere), so ``Σ x = Σ τ`` stays exact whatever the
  compression loses. What the compression loses is mixing, not mass.

Snapshot references are committed when an exchange is applied (the asking end when the answer
comes, the answering end when it answers), so a retry of the same exchange decodes against the
same reference and a refused one changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from dacflnode.algorithms import pairwise
from dacflnode.algorithms.compression import stable_seed
from dacflnode.protocol.copies import Compression, copy_id
from dacflnode.wire.errors import Reason, WireError

Tensor = torch.Tensor
Vectors = dict[str, Tensor]
FIELDS = pairwise.EXCHANGED


class EdgeCodec:
    """One asynchronous node's compressed exchanges: its per-edge snapshot references and the
    coding of snapshots and transfers."""

    def __init__(self, compression: Compression, me: str, start: Mapping[str, Tensor] | None,
                 neighbours: list[str]) -> None:
        """``start``: the vectors every reference begins at (the run's initial model, when the
        node starts fresh); ``None``: no reference (a restart: first snapshots go whole)."""
        self.compression = compression
        self.me = me
        initial = None if start is None else self._reference(start)
        #: per neighbour: the reference of this node's snapshots to it, and of its snapshots to
        #: this node, as ``(id, vectors)``
        self.sent: dict[str, tuple[int, Vectors]] = {}
        self.received: dict[str, tuple[int, Vectors]] = {}
        if initial is not None:
            for peer in neighbours:
                self.sent[peer] = self.received[peer] = initial
        #: the reconstruction an unanswered request of this node makes, by neighbour
        self._pending: dict[str, tuple[int, tuple[int, Vectors]]] = {}

    @staticmethod
    def _reference(vectors: Mapping[str, Tensor]) -> tuple[int, Vectors]:
        flat = {name: vectors[name].detach().reshape(-1).to(torch.float32) for name in FIELDS}
        return copy_id(flat, FIELDS), flat

    def _seed(self, sender: str, exchange_id: int, what: str, name: str) -> int:
        return stable_seed(self.compression.seed, sender, exchange_id, what, name)

    # ------------------------------------------------------------------ the asking end
    def encode_snapshot(self, peer: str, exchange_id: int,
                        vectors: Mapping[str, Tensor]) -> tuple[Vectors, int, int]:
        """The request's tensors, ``copy_base`` and ``copy_next`` for a snapshot of
        ``vectors`` to ``peer``: compressed against the edge's reference, or whole (base 0)
        when this node holds none."""
        base = self.sent.get(peer)
        if base is None:
            whole = self._reference(vectors)
            self._pending[peer] = (exchange_id, whole)
            return dict(whole[1]), 0, whole[0]
        compressor = self.compression.compressor
        tensors: Vectors = {}
        made: Vectors = {}
        for name in FIELDS:
            seed = self._seed(self.me, exchange_id, "snapshot", name)
            reference = base[1][name]
            delta = vectors[name].detach().reshape(-1).to(torch.float32) - reference
            parts = compressor.encode(delta, seed)
            made[name] = reference + compressor.decode(parts, reference.numel(), seed)
            tensors.update({f"{name}.{part}": t for part, t in parts.items()})
        after = (copy_id(made, FIELDS), made)
        self._pending[peer] = (exchange_id, after)
        return tensors, base[0], after[0]

    def answered(self, peer: str, exchange_id: int) -> None:
        """The exchange with ``peer`` was answered: its reconstruction is the new reference."""
        pending = self._pending.pop(peer, None)
        if pending is not None and pending[0] == exchange_id:
            self.sent[peer] = pending[1]

    def refused(self, peer: str, reason: Reason) -> None:
        """The exchange with ``peer`` was refused (not applied): drop its reconstruction; when
        the neighbour holds no reference of the edge, send the next snapshot whole."""
        self._pending.pop(peer, None)
        if reason is Reason.NOT_KEPT:
            self.sent.pop(peer, None)

    # ------------------------------------------------------------------ the answering end
    def decode_snapshot(self, peer: str, exchange_id: int, tensors: Mapping[str, Tensor],
                        copy_base: int, copy_next: int) -> tuple[int, Vectors]:
        """The snapshot a request of ``peer`` stands for (not yet committed: :meth:`keep`);
        raises :class:`WireError` for a reference this node does not hold or parts that do
        not decode to the reconstruction the request names."""
        if copy_base == 0:
            if set(tensors) != set(FIELDS):
                raise WireError("INVALID_ARGUMENT", "a snapshot without a reference must be "
                                "whole", Reason.BAD_PAYLOAD)
            return self._reference(tensors)
        base = self.received.get(peer)
        if base is None or base[0] != copy_base:
            raise WireError("NOT_FOUND", f"{self.me} does not hold reference {copy_base:#x} "
                            f"of {peer}'s snapshots: send it whole", Reason.NOT_KEPT)
        compressor = self.compression.compressor
        made: Vectors = {}
        for name in FIELDS:
            prefix = f"{name}."
            parts = {k[len(prefix):]: t for k, t in tensors.items() if k.startswith(prefix)}
            reference = base[1][name]
            seed = self._seed(peer, exchange_id, "snapshot", name)
            try:
                made[name] = reference + compressor.decode(parts, reference.numel(), seed)
            except ValueError as exc:
                raise WireError("INVALID_ARGUMENT", f"a snapshot that does not decode: {exc}",
                                Reason.BAD_PAYLOAD) from None
        got = copy_id(made, FIELDS)
        if got != copy_next:
            raise WireError("INVALID_ARGUMENT", f"the snapshot decodes to {got:#x}, not the "
                            f"{copy_next:#x} its header names", Reason.BAD_PAYLOAD)
        return got, made

    def keep(self, peer: str, snapshot: tuple[int, Vectors]) -> None:
        """The answered snapshot of ``peer`` is the edge's new reference."""
        self.received[peer] = snapshot

    # ------------------------------------------------------------------ transfers
    def encode_transfer(self, exchange_id: int, asker: str,
                        c: Mapping[str, Tensor]) -> tuple[Vectors, Vectors]:
        """``(wire parts, decoded transfer)`` of transfer ``c``: the answering node adds the
        decoded one, the asking node will decode the same bits."""
        compressor = self.compression.compressor
        tensors: Vectors = {}
        decoded: Vectors = {}
        for name in FIELDS:
            seed = self._seed(asker, exchange_id, "transfer", name)
            parts = compressor.encode(c[name].reshape(-1), seed)
            decoded[name] = compressor.decode(parts, c[name].numel(), seed)
            tensors.update({f"{name}.{part}": t for part, t in parts.items()})
        return tensors, decoded

    def decode_transfer(self, exchange_id: int, tensors: Mapping[str, Tensor],
                        numel: int) -> Vectors:
        """The transfer an answer to this node's exchange ``exchange_id`` carries."""
        compressor = self.compression.compressor
        out: Vectors = {}
        for name in FIELDS:
            prefix = f"{name}."
            parts = {k[len(prefix):]: t for k, t in tensors.items() if k.startswith(prefix)}
            seed = self._seed(self.me, exchange_id, "transfer", name)
            try:
                out[name] = compressor.decode(parts, numel, seed)
            except ValueError as exc:
                raise WireError("INVALID_ARGUMENT", f"a transfer that does not decode: {exc}",
                                Reason.BAD_PAYLOAD) from None
        return out

    def forget(self, peer: str) -> None:
        """Drop the edge's references (a reconciliation after a restart of either end): the
        next snapshots on it go whole."""
        self.sent.pop(peer, None)
        self.received.pop(peer, None)
        self._pending.pop(peer, None)
