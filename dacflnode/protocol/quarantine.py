"""Offences and quarantines of one node's edges (docs/faults.md, "Misbehaving members").

A state refused as absurd or stale, by this node (its inbox's guard, or a public copy that
cannot be used) or by the neighbour (this node's pushed state), is an offence of the edge; both
ends count the same refusals, so both quarantine alike. :class:`Quarantine` counts them in the
node's :class:`~dacflnode.protocol.edges.EdgeBook` and says, as its return value, when an edge
is quarantined now: the caller then bars the sender in the inbox
(:meth:`~dacflnode.transport.base.Inbox.bar`). An offence takes effect at once, in the round the
node is in when it is known (the anchor it proposes is counted from that round).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from dacflnode.protocol.edges import EdgeBook
from dacflnode.wire.errors import Reason, Refusal
from dacflnode.wire.message import RoundMessage

log = logging.getLogger(__name__)

#: The refusals that are offences of the edge.
OFFENCES = (Reason.ABSURD_STATE, Reason.STALE_STATE)


class Quarantine:
    """The offences of node ``node``'s edges, kept in ``edges``; ``round_of`` gives the round
    the node is in."""

    def __init__(self, node: str, edges: EdgeBook, round_of: Callable[[], int]) -> None:
        self.node = node
        self.edges = edges
        self.round_of = round_of
        #: the ``(round, peer)`` states refused as absurd or stale, by this node or the peer
        self.refused: set[tuple[int, str]] = set()

    @property
    def count(self) -> int:
        """Edges quarantined in this run (kept across restarts, in the checkpoint)."""
        return len(self.edges.quarantined)

    def judge(self, message: RoundMessage, refusal: Refusal) -> bool:
        """The inbox's guard refused ``message`` (:attr:`~dacflnode.transport.base.Inbox.judge`);
        returns whether its sender is barred now."""
        if refusal.reason not in OFFENCES:
            return False
        return self.offence(message.sender, message.round, refusal.reason, mine=False)

    def offence(self, peer: str, round_: int, reason: Reason, mine: bool) -> bool:
        """A state of the edge to ``peer`` was refused as absurd or stale (``mine``: this
        node's state, by ``peer``); returns whether this quarantines the edge now."""
        self.refused.add((round_, peer))
        if mine:
            log.warning("%s refused this node's round-%d state (%s); not retried",
                        peer, round_, reason,
                        extra={"event": "state_refused_by_neighbour", "node": self.node,
                               "round": round_, "neighbour": peer, "reason": reason})
        else:
            log.warning("refused the round-%d state of %s (%s); the round goes on without "
                        "it", round_, peer, reason,
                        extra={"event": "state_refused", "node": self.node,
                               "round": round_, "neighbour": peer, "reason": reason})
        if self.edges.offence(peer, round_, self.round_of()):
            self._logged(peer)
            return True
        return False

    def quarantined_by(self, peer: str) -> bool:
        """``peer`` refused this node's state because it quarantined the edge: so does this
        node (a quarantine is for both ends). Returns whether the edge is quarantined now."""
        if self.edges.quarantine(peer, self.round_of()) is None:
            return False
        self._logged(peer)
        return True

    def was_refused(self, round_: int, peer: str) -> bool:
        return (round_, peer) in self.refused

    def forget_through(self, round_: int) -> None:
        """Forget the refusals of the rounds up to ``round_`` (done with)."""
        self.refused = {(r, j) for r, j in self.refused if r > round_}

    def _logged(self, peer: str) -> None:
        round_ = self.round_of()
        log.warning("edge to %s quarantined in round %d after %d refused states; it is not "
                    "mixed again in this run; re-anchor at round %d", peer,
                    round_, self.edges.peers[peer].refused_states,
                    max(self.edges.anchors, default=-1),
                    extra={"event": "quarantined", "node": self.node, "round": round_,
                           "neighbour": peer})
