"""A node's bookkeeping of its edges across faults: who is mixed when, the one-sided uses still
to be settled, and the re-anchor rounds (docs/faults.md has the rules and the argument).

:class:`EdgeBook` is plain state and arithmetic on the messages of a round; the
:class:`~dacflnode.protocol.runner.NodeRunner` calls it between the steps of each round, and a
checkpoint stores it (:meth:`EdgeBook.checkpoint_fields`), so a restarted node settles what it
left open.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dacflnode.protocol.ledger import Entry, Ledger
from dacflnode.records.membership import QUARANTINE_OFFENCES, PeerState, PeerTrack
from dacflnode.wire.message import MAX_ANCHORS, MAX_USED_LOG, Kind, RoundMessage, UsedLog

log = logging.getLogger(__name__)


@dataclass
class Absorbed:
    """What a round's messages change beyond the mix: the terms to add to ``x`` (undone
    one-sided uses, handed-over shares), and who left. The terms are kept as they are and
    summed by :attr:`adjust`, a pass over the state per term, which the runner computes off
    the event loop."""

    terms: list[tuple[float, Entry | torch.Tensor]] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    corrections: int = 0
    shares: int = 0

    def add(self, term: Entry | torch.Tensor, sign: float) -> None:
        self.terms.append((sign, term))

    @property
    def adjust(self) -> torch.Tensor | None:
        """``Σ sign · term`` (``None`` without terms)."""
        out: torch.Tensor | None = None
        for sign, term in self.terms:
            vector = term.correction() if isinstance(term, Entry) else term
            if out is None:
                out = vector * sign  # a new tensor: the terms are never written to
            else:
                out.add_(vector, alpha=sign)
        return out


class EdgeBook:
    """The edges of ``node`` (see the module docstring).

    ``gone_after``: consecutive missed rounds after which a neighbour is declared gone.
    ``anchor_delay``: rounds between proposing a re-anchor and the anchor round (at least the
    network's diameter, so that every node hears of it in time). ``repair``: keep and settle
    one-sided uses (the algorithms whose ``x`` is mixed symmetrically: DACFL, CDSGD).
    """

    def __init__(
        self,
        node: str,
        neighbours: Sequence[str],
        *,
        gone_after: int = 3,
        anchor_delay: int = 4,
        repair: bool = True,
        peers: Mapping[str, PeerTrack] | None = None,
        ledger: Ledger | None = None,
        used_log: UsedLog = (),
        anchors: Sequence[int] = (),
        round_: int = 0,
    ) -> None:
        self.node = node
        self.gone_after = gone_after
        self.anchor_delay = max(1, anchor_delay)
        self.repair = repair
        self.peers: dict[str, PeerTrack] = {j: PeerTrack() for j in sorted(neighbours)}
        for j, track in (peers or {}).items():
            if j in self.peers:
                self.peers[j] = track
        self.ledger = ledger if ledger is not None else Ledger()
        #: the neighbours mixed in each of the rounds that are among the last :attr:`window`
        #: rounds in which some neighbour was active (see :meth:`record_round`)
        self.used_log: dict[int, tuple[str, ...]] = dict(used_log)
        #: each neighbour's last :attr:`window` active rounds (a restart takes every logged
        #: round as active for everyone: it may trim a little early, never too late)
        self._active_rounds: dict[str, list[int]] = {
            j: sorted(self.used_log)[-self.window:] for j in self.peers}
        #: anchor rounds not reached yet, and those applied (or passed) recently
        self.anchors: set[int] = {a for a in anchors if a >= round_}
        self.applied: set[int] = {a for a in anchors if a < round_}
        #: anchors before this round are not this node's business (it joined later)
        self.joined = 0
        self.reanchored = 0

    @property
    def window(self) -> int:
        """Active rounds of each edge that ``used_log`` covers: longer than it takes to declare
        a silent neighbour gone, so that every one-sided use is settled or given up for a
        re-anchor. Counted per edge, not in rounds: on a time-varying graph an edge may be idle
        for many rounds between two uses, and its last uses must still be in the log when it
        is active again."""
        return self.gone_after + 2

    # ------------------------------------------------------------------ who takes part
    def mixing(self, round_: int, scheduled: Sequence[str]) -> list[str]:
        """The neighbours of ``scheduled`` (the topology's active ones) mixed in ``round_``."""
        return [j for j in scheduled if j in self.peers and self.peers[j].mixes_in(round_)]

    def handovers_due(self, round_: int) -> list[str]:
        return sorted(j for j, p in self.peers.items()
                      if p.state is PeerState.LEFT and p.handover_round == round_)

    def to_greet(self) -> list[str]:
        """Neighbours to ask, every round, whether the edge can come back."""
        return sorted(j for j, p in self.peers.items()
                      if p.state in (PeerState.GONE, PeerState.ABSENT))

    # ------------------------------------------------------------------ headers
    def header(self, round_: int) -> tuple[UsedLog, tuple[int, ...]]:
        """``used_log`` and ``anchors`` for this node's message of ``round_``."""
        log_ = tuple((r, self.used_log[r]) for r in sorted(self.used_log)
                     if r < round_)[-MAX_USED_LOG:]
        recent = {a for a in self.applied if a > round_ - self.window}
        anchors = sorted(a for a in self.anchors | recent if a > 0)[-MAX_ANCHORS:]
        return log_, tuple(anchors)

    # ------------------------------------------------------------------ a round's messages
    def absorb(self, round_: int, received: Mapping[str, RoundMessage]) -> Absorbed:
        """Settle what the round's messages say: one-sided uses, anchors, leaves, handovers."""
        out = Absorbed()
        for sender in sorted(received):
            message = received[sender]
            track = self.peers.get(sender)
            if track is None:
                continue
            if self.repair and message.kind is not Kind.HANDOVER:
                settled = self.ledger.resolve(self.node, message)
                if settled.uncovered:  # a newer header that no longer says: give up on them
                    self.ledger.forget(settled.uncovered)
                    anchor = self.propose_anchor(round_)
                    log.warning("%d one-sided uses of %s could not be settled; re-anchor "
                                "at round %d", len(settled.uncovered), sender, anchor,
                                extra={"event": "unsettled", "node": self.node,
                                       "neighbour": sender})
                for (r, _), entry in settled.undo:
                    out.add(entry, -1.0)
                    out.corrections += 1
                    track.corrections += 1
                    log.info("round %d: %s did not mix this node's round-%d state; "
                             "undid the one-sided use", round_, sender, r,
                             extra={"event": "one_sided_undone", "node": self.node, "round": round_,
                                    "neighbour": sender})
            for anchor in message.anchors:
                self._hear_anchor(round_, anchor, sender)
            if message.kind is Kind.LEAVING:
                track.state = PeerState.LEFT
                track.handover_round = message.round + 1
                out.left.append(sender)
                unsettled = self.ledger.of_peer(sender)
                if unsettled:  # older than its log: give up on them, re-anchor
                    self.ledger.forget(unsettled)
                    self.propose_anchor(round_)
                log.info("%s leaves the network (round %d)", sender,
                         message.round,
                         extra={"event": "neighbour_leaving", "node": self.node,
                                "round": message.round, "neighbour": sender})
            elif message.kind is Kind.HANDOVER:
                track.state = PeerState.LEFT
                track.handover_round = None
                out.left.append(sender)  # not a missed round
                if round_ in self.applied:
                    continue  # re-anchored in this round: the share is in no one's sum
                out.add(message.tensors["x"], 1.0)
                out.shares += 1
                log.info("took over the share of %s", sender,
                         extra={"event": "handover_received", "node": self.node,
                                "neighbour": sender})
        return out

    def _hear_anchor(self, round_: int, anchor: int, sender: str) -> None:
        if anchor > round_:
            if anchor not in self.anchors:
                log.info("re-anchor at round %d (heard from %s)", anchor, sender,
                         extra={"event": "reanchor_heard", "node": self.node, "round": anchor,
                                "neighbour": sender})
            self.anchors.add(anchor)
        elif anchor not in self.applied and anchor >= self.joined:
            self.applied.add(anchor)  # heard too late: do not propose again for this one
            later = self.propose_anchor(round_)
            log.warning("heard of the round-%d re-anchor only in round %d; proposing "
                        "round %d", anchor, round_, later,
                        extra={"event": "reanchor_late", "node": self.node, "round": round_})

    def record_round(
        self, round_: int, active: Sequence[str], weights: Mapping[str, float],
        theirs: Mapping[str, torch.Tensor], mine: torch.Tensor | None,
    ) -> None:
        """Round ``round_``, whose mixed (active) neighbours were ``active``, mixed ``theirs``
        (``x`` of each neighbour used) with ``weights``."""
        used = tuple(sorted(theirs))
        self.used_log[round_] = used
        for j in active:
            recent = self._active_rounds.setdefault(j, [])
            recent.append(round_)
            del recent[:-self.window]
        keep = {r for recent in self._active_rounds.values() for r in recent}
        for r in [r for r in self.used_log if r not in keep and r != round_]:
            del self.used_log[r]
        if self.repair and mine is not None and used:
            self.ledger.record(round_, self.node, {j: weights[j] for j in used}, theirs, mine)

    def note_round(
        self, round_: int, present: Sequence[str], missing: Sequence[str],
        handovers_missing: Sequence[str] = (), alive: Collection[str] = (),
    ) -> list[str]:
        """Count the round's missing neighbours; returns those now declared gone. A missing
        neighbour in ``alive`` showed it was alive in the round (it is late, not silent): its
        run of silent rounds starts again, since declaring gone needs silence."""
        for j in present:
            self.peers[j].consecutive = 0
        gone = []
        for j in missing:
            track = self.peers[j]
            track.missed += 1
            if j in alive:
                track.late += 1
                track.consecutive = 0
                continue
            track.consecutive += 1
            if track.consecutive >= self.gone_after and track.state is PeerState.ACTIVE:
                track.state = PeerState.GONE
                gone.append(j)
        for j in handovers_missing:
            self.peers[j].handover_round = None
        if gone or handovers_missing:
            for j in gone:
                self.ledger.forget(self.ledger.of_peer(j))
            anchor = self.propose_anchor(round_)
            for j in gone:
                log.warning("%s missed %d rounds in a row: declared gone; re-anchor at "
                            "round %d", j, self.gone_after, anchor,
                            extra={"event": "neighbour_gone", "node": self.node, "neighbour": j})
            for j in handovers_missing:
                log.warning("the handover of %s did not come; re-anchor at round %d",
                            j, anchor,
                            extra={"event": "handover_missing", "node": self.node, "neighbour": j})
        return gone

    # ------------------------------------------------------------------ offences
    def offence(self, peer: str, round_: int, current: int) -> bool:
        """``peer``'s state of ``round_`` was refused as absurd or stale (by this node, or this
        node's by ``peer``: both ends count the same refusals); the node is in round
        ``current``. Returns True when this quarantines the edge (:meth:`quarantine`):
        :data:`~dacflnode.records.membership.QUARANTINE_OFFENCES` refusals in distinct rounds
        within :attr:`window` rounds."""
        track = self.peers.get(peer)
        if track is None or round_ in track.offence_rounds:
            return False
        track.refused_states += 1
        recent = tuple(r for r in (*track.offence_rounds, round_) if r > round_ - self.window)
        track.offence_rounds = recent[-QUARANTINE_OFFENCES:]
        if len(recent) >= QUARANTINE_OFFENCES and track.state is not PeerState.QUARANTINED:
            self.quarantine(peer, current)
            return True
        return False

    def quarantine(self, peer: str, current: int) -> int | None:
        """Declare the edge to ``peer`` gone for the rest of the run: its pending one-sided
        uses are given up and a re-anchor is proposed (the anchor round, ``None`` when it was
        quarantined already)."""
        track = self.peers[peer]
        if track.state is PeerState.QUARANTINED:
            return None
        track.state = PeerState.QUARANTINED
        track.consecutive = 0
        self.ledger.forget(self.ledger.of_peer(peer))
        return self.propose_anchor(current)

    @property
    def quarantined(self) -> list[str]:
        return sorted(j for j, p in self.peers.items() if p.state is PeerState.QUARANTINED)

    # ------------------------------------------------------------------ anchors
    def propose_anchor(self, round_: int) -> int:
        anchor = round_ + 1 + self.anchor_delay
        self.anchors.add(anchor)
        return anchor

    def anchor_due(self, round_: int) -> bool:
        return round_ in self.anchors

    def anchored(self, round_: int) -> None:
        """The node set ``x := tracked`` at the start of ``round_``: every pending use is moot."""
        self.anchors.discard(round_)
        self.applied.add(round_)
        self.ledger.clear()
        self.reanchored += 1
        for a in [a for a in self.applied if a < round_ - 4 * self.window]:
            self.applied.discard(a)

    # ------------------------------------------------------------------ joins
    def on_join(self, peer: str, proposed: int, current: int) -> int:
        """Answer ``peer``'s Hello (see :attr:`~dacflnode.transport.base.Inbox.on_join`):
        0 when the edge is mixed as always; otherwise the round from which this node mixes
        it. Only a proposal (``proposed > 0``) changes anything."""
        track = self.peers.get(peer)
        if track is None or track.state is PeerState.QUARANTINED:
            return 0  # never mixed again: its calls are refused (see quarantine)
        if proposed == 0:
            if track.state is PeerState.ACTIVE:
                return track.active_from if track.active_from > current else 0
            return current + 1  # a counter-proposal: the caller must propose to join
        agreed = max(proposed, current + 1)
        if track.state is PeerState.ACTIVE and track.active_from > current:
            agreed = max(agreed, track.active_from)
        self._activate(peer, agreed)
        return agreed

    def joined_with(self, peer: str, agreed: int) -> None:
        """This node's proposal to ``peer`` was answered with ``agreed``."""
        track = self.peers[peer]
        if track.state is PeerState.QUARANTINED:
            return
        if track.state is PeerState.ACTIVE and track.active_from > agreed:
            agreed = track.active_from  # a concurrent proposal of the peer's was later
        self._activate(peer, agreed)

    def _activate(self, peer: str, from_round: int) -> None:
        track = self.peers[peer]
        if track.state is not PeerState.ACTIVE or track.active_from != from_round:
            log.info("edge to %s mixed from round %d", peer, from_round,
                     extra={"event": "edge_active", "node": self.node, "round": from_round,
                            "neighbour": peer})
        track.state = PeerState.ACTIVE
        track.active_from = from_round
        track.consecutive = 0
        track.handover_round = None

    def reset(self, round_: int) -> None:
        """The node starts over from another node's model at ``round_`` (a join)."""
        self.ledger.clear()
        self.used_log.clear()
        self.anchors = {a for a in self.anchors if a > round_}
        self.joined = round_

    def resumed(self, since: int, round_: int, passed: Sequence[int]) -> None:
        """The node restarted from its round-``since`` checkpoint and re-enters at ``round_``
        with its mass: it mixed nobody in round ``since`` (a neighbour that mixed a state it
        pushed then undoes that use), and its pending uses stay to be settled, unless the
        anchors ``passed`` (applied by the others while it was down) made them moot."""
        if since not in self.used_log:
            self.record_round(since, list(self.peers), {}, {}, None)
        if passed:
            self.ledger.clear()
            self.applied |= set(passed)
        self.anchors = {a for a in self.anchors if a >= round_}
        self.joined = round_

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_fields(self) -> dict[str, Any]:
        return {"used_log": tuple(sorted(self.used_log.items())),
                "pending": self.ledger.tensors(),
                "anchors": sorted(self.anchors | self.applied),
                "peers": {j: PeerTrack(**vars(p)) for j, p in self.peers.items()}}
