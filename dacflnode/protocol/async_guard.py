"""The state guard and the quarantine of an asynchronous node's exchanges (docs/security.md,
"Asynchronous runs").

The guard of the synchronous inbox (:class:`~dacflnode.wire.state_guard.RobustGuard`) judges
each neighbour's snapshot before the answering node computes a transfer from it: a snapshot
whose norm is far from the median of the norms this node trusts, or that points away from the
node's own model, is refused (``ABSURD_STATE``) and nothing is applied at either end, so the sum
stays exact. The asking node judges the answer the same way, through the state it implies
(``v_i − c / w``: the answering node's model, had it answered honestly); an answer it refuses
was applied at the answering end only, which only a misbehaving answerer causes.

Each refusal is an offence of the edge; :data:`~dacflnode.records.membership.QUARANTINE_OFFENCES`
of them within :data:`WINDOW` of the neighbour's blocks quarantine the edge for the rest of the
run, at both ends: the node refuses the neighbour's exchanges (``QUARANTINED``), asks it nothing
more and does not wait for it to be done; a neighbour refused that way drops the edge too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import torch

from dacflnode.records.membership import QUARANTINE_OFFENCES
from dacflnode.wire.errors import Reason, WireError
from dacflnode.wire.message import Kind, RoundMessage
from dacflnode.wire.state_guard import RobustGuard

log = logging.getLogger(__name__)

Tensor = torch.Tensor

#: Offences within this many of the neighbour's blocks quarantine the edge.
WINDOW = 10


class ExchangeGuard:
    """Judges one asynchronous node's incoming snapshots and answers, and keeps its
    quarantined edges."""

    def __init__(self, me: str, reference: Callable[[], Mapping[str, Tensor] | None]) -> None:
        self.me = me
        self.guard = RobustGuard(reference)
        #: per neighbour, the blocks of its offences
        self.offences: dict[str, list[int]] = {}
        self.quarantined: set[str] = set()

    def _judge(self, peer: str, blocks: int, vectors: Mapping[str, Tensor],
               what: str) -> WireError | None:
        refusal = self.guard(RoundMessage(peer, blocks, 1, vectors, kind=Kind.EXCHANGE),
                             replay=False)
        if refusal is None:
            return None
        return WireError(refusal.code, f"{what} of {peer}: {refusal.detail}", refusal.reason)

    def snapshot(self, peer: str, blocks: int,
                 vectors: Mapping[str, Tensor]) -> WireError | None:
        """The refusal of ``peer``'s snapshot (``None``: accepted); runs in a worker."""
        return self._judge(peer, blocks, vectors, "the snapshot")

    def answer(self, peer: str, blocks: int, mine: Mapping[str, Tensor], weight: float,
               c: Mapping[str, Tensor]) -> WireError | None:
        """The refusal of ``peer``'s answer ``c`` to this node's snapshot ``mine``, judged by
        the state it implies (``None``: accepted)."""
        implied = {name: mine[name] - c[name] / weight for name in c}
        return self._judge(peer, blocks, implied, "the answer")

    def offence(self, peer: str, blocks: int) -> bool:
        """Count a refusal of ``peer`` at its block ``blocks``; whether this quarantines the
        edge now."""
        if peer in self.quarantined:
            return False
        recent = [b for b in self.offences.get(peer, []) if b > blocks - WINDOW] + [blocks]
        self.offences[peer] = recent
        log.warning("refused an exchange of %s at its block %d (offence %d of %d)", peer,
                    blocks, len(recent), QUARANTINE_OFFENCES,
                    extra={"event": "state_refused", "node": self.me, "neighbour": peer,
                           "round": blocks, "reason": Reason.ABSURD_STATE})
        if len(recent) < QUARANTINE_OFFENCES:
            return False
        self.quarantine(peer)
        return True

    def quarantine(self, peer: str) -> None:
        if peer not in self.quarantined:
            self.quarantined.add(peer)
            log.warning("quarantined the edge to %s for the rest of the run", peer,
                        extra={"event": "quarantined", "node": self.me, "neighbour": peer})

    def refuse_quarantined(self, peer: str) -> None:
        if peer in self.quarantined:
            raise WireError("PERMISSION_DENIED", f"{self.me} quarantined the edge to {peer}",
                            Reason.QUARANTINED)
