"""The handshakes of one node with its neighbours (docs/faults.md).

* At start (:meth:`Handshakes.wait_for_neighbours`): hello every neighbour; they may start in
  any order, minutes apart.
* From which round an edge is mixed, when either end says it is not mixed as always (a join, a
  restart after being declared gone, a healed cut): proposed in a Hello
  (:meth:`Handshakes.greet`) and answered in the inbox (:meth:`Handshakes.on_join`).
* Once a round, each gone or absent neighbour is asked whether the edge can come back
  (:meth:`Handshakes.greet_the_missing`).
* A node far behind its neighbours joins at an agreed round from a neighbour's model
  (:meth:`Handshakes.behind`, :meth:`Handshakes.joined_state`, :meth:`Handshakes.agree_join`),
  keeping its own mass when it restarted from its checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import torch

from dacflnode.algorithms.rounds import NodeState
from dacflnode.protocol.clock import now
from dacflnode.protocol.copies import PublicCopies, is_compressed
from dacflnode.protocol.edges import EdgeBook
from dacflnode.protocol.fault_filter import FaultFilter
from dacflnode.protocol.scale_agreement import ScaleAgreement
from dacflnode.protocol.setup import NodeSetup
from dacflnode.records.membership import PeerState
from dacflnode.transport.base import HandshakeRefused, PeerUnavailable, Transport, TransportClosed
from dacflnode.wire.errors import WireError

log = logging.getLogger(__name__)


class Handshakes:
    """The handshakes of the node of ``setup`` over ``transport``; ``edges`` is its edge
    bookkeeping, ``round_of`` gives the round the node is in and ``faults`` is its fault
    filter (whose neighbours are down, which edge-rounds lose a handshake)."""

    def __init__(self, setup: NodeSetup, transport: Transport, edges: EdgeBook,
                 round_of: Callable[[], int], faults: FaultFilter) -> None:
        self.setup = setup
        self.faults = faults
        self.transport = transport
        self.edges = edges
        self.round_of = round_of
        #: the round each neighbour was in when it last answered a Hello
        self.peer_rounds: dict[str, int] = {}
        #: neighbours that had declared this node gone when it started (a restart)
        self.gone_for: set[str] = set()
        self._greetings: dict[str, asyncio.Task[None]] = {}
        if setup.scale is not None:  # neighbours may ask for its items from the start
            transport.serve_agreement(setup.scale.serve)

    async def agree_scale(self, agreement: ScaleAgreement) -> None:
        """Settle a table run's feature scale with the neighbours that answered the
        handshake (:mod:`dacflnode.protocol.scale_agreement`), within ``hello_timeout``; the
        agreed scale goes into the checkpoints (``feature_scale``)."""
        present = [p for p in self.setup.neighbours
                   if self.edges.peers[p].state is PeerState.ACTIVE]
        scale = await agreement.settle(self.transport, present, self.setup.hello_timeout)
        self.setup.run_info["feature_scale"] = scale.to_json()

    def on_join(self, peer: str, proposed: int) -> int:
        """Answer ``peer``'s Hello (:attr:`~dacflnode.transport.base.Inbox.on_join`)."""
        agreed = self.edges.on_join(peer, proposed, self.round_of())
        self.not_before(peer)
        return agreed

    def not_before(self, peer: str) -> None:
        """The edge to ``peer`` is mixed only from a later round now: stop waiting for its
        states of the rounds before (this node may be waiting in one right now)."""
        track = self.edges.peers[peer]
        for r in range(self.round_of(), track.active_from):
            self.transport.inbox.forgo_nowait(r, peer)

    async def wait_for_neighbours(self) -> None:
        """Handshake with every neighbour.

        Neighbours that have not answered within ``hello_timeout`` are marked absent and the
        node goes on without them (they join when they come up), unless none answered at all.
        """
        setup = self.setup
        peers = self.edges.peers
        deadline = now() + setup.hello_timeout
        pending = set(setup.neighbours) - set(self.edges.quarantined)
        for peer in sorted(pending):  # an injected crash or a later join: do not wait for it
            if self.faults.down(peer, self.round_of()):
                pending.discard(peer)
                peers[peer].state = PeerState.ABSENT
        delay = 0.05
        while pending:
            for peer in sorted(pending):
                try:
                    await self.greet(peer, startup=True)
                except PeerUnavailable:
                    continue
                except HandshakeRefused as exc:
                    raise RuntimeError(f"neighbour {peer} refused or was refused: {exc}") from exc
                pending.discard(peer)
                log.info("neighbour %s is up", peer,
                         extra={"event": "neighbour_up", "node": self.setup.node_id,
                                "neighbour": peer})
            if not pending:
                break
            if now() > deadline:
                if len(pending) == len(setup.neighbours):
                    raise RuntimeError(
                        f"neighbours {', '.join(sorted(pending))} did not answer within "
                        f"{setup.hello_timeout:.0f}s"
                    )
                for peer in sorted(pending):
                    track = peers[peer]
                    if track.state is PeerState.ACTIVE:
                        track.state = PeerState.ABSENT
                log.warning("%s did not answer within %.0fs; going on without them (they "
                            "join when they come up)", ", ".join(sorted(pending)),
                            setup.hello_timeout,
                            extra={"event": "neighbours_silent", "node": self.setup.node_id,
                                   "neighbour": sorted(pending)})
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def greet(self, peer: str, startup: bool = False, proposal: int = 0) -> None:
        """Hello ``peer``; settle from which round the edge is mixed when either side says it
        is not mixed as always (a join, a restart after being declared gone, a healed cut)."""
        track = self.edges.peers[peer]
        if startup and track.state is not PeerState.ACTIVE:
            proposal = self.round_of() + 2
        ident = await self.transport.hello(peer, proposal)
        self.peer_rounds[peer] = ident.round
        answer = getattr(ident, "join_round", 0)
        if proposal == 0 and answer > 0 and not (
                track.state is PeerState.ACTIVE and track.active_from >= answer):
            if startup and track.state is PeerState.ACTIVE:
                self.gone_for.add(peer)  # it declared this node gone while it was down
            proposal = max(answer, self.round_of() + 2)  # the peer does not mix us now: agree
            ident = await self.transport.hello(peer, proposal)
            self.peer_rounds[peer] = ident.round
            answer = getattr(ident, "join_round", 0)
        if proposal > 0:
            self.edges.joined_with(peer, max(proposal, answer))
            self.not_before(peer)

    # ------------------------------------------------------------------ a join
    def behind(self, t: int) -> dict[str, int] | None:
        """The rounds of the active neighbours when the node, in round ``t``, is far enough
        behind them to join (more than one round, or one with ``setup.join``); ``None`` when
        it is not: a node at most one round behind pulls what it missed instead."""
        ahead = {p: r for p, r in self.peer_rounds.items()
                 if self.edges.peers[p].state is PeerState.ACTIVE}
        if not ahead:
            return None
        front = max(ahead.values())
        if front <= t + (0 if self.setup.join else 1):
            return None
        return ahead

    async def joined_state(self, state: NodeState, ahead: dict[str, int],
                           copies: PublicCopies | None, restarted: bool) -> NodeState:
        """The node's state at the agreed round, two rounds after the front of ``ahead``,
        from a neighbour's model; its edge bookkeeping starts there.

        A node that restarts from its checkpoint (``restarted``) keeps its mass
        ``x − tracked`` (docs/faults.md, section 5): it is added to the model it adopts, unless
        the network re-anchored since the checkpoint (its mass is 0 then, as everyone's), a
        neighbour declared it gone (an anchor takes its mass), or the checkpoint is stale (a
        neighbour mixed a later state of this node than the checkpoint holds: its mass is
        unknown, so it asks for an anchor).
        """
        setup = self.setup
        me, since = setup.node_id, state.round
        join_round = max(ahead.values()) + 2
        model = None
        heard: tuple[int, ...] = ()
        stale = False
        for peer in sorted(ahead, key=lambda p: (-ahead[p], p)):
            try:
                message = await self.transport.pull(peer, max(0, ahead[peer] - 1))
                tensors = message.tensors
                if copies is not None and is_compressed(message):
                    # a compressed state holds no model: take the sender's public copy, which
                    # also starts this node's copy of it
                    full = await self.transport.pull(peer, message.round,
                                                     copy_id=message.copy_next)
                    copies.commit(copies.adopt(peer, message.copy_next, full.tensors))
                    tensors = full.tensors
            except (PeerUnavailable, WireError, ValueError) as exc:
                log.warning("could not pull a model from %s to join: %s", peer, exc,
                            extra={"event": "join_pull_failed", "node": self.setup.node_id,
                                   "neighbour": peer})
                continue
            model = (tensors["omega"] if "omega" in tensors else tensors["x"]).reshape(
                state.x.shape).clone()
            heard = message.anchors
            stale = any(r > since and me in used for r, used in message.used_log)
            log.info("joining at round %d from the round-%d model of %s", join_round,
                     message.round, peer,
                     extra={"event": "joining", "node": self.setup.node_id, "round": join_round,
                            "neighbour": peer})
            break
        if model is None:  # its own model keeps the invariant as well (x = ω = ω_prev)
            model = state.omega.clone()
            log.warning("no neighbour handed a model; joining at round %d with its own",
                        join_round,
                        extra={"event": "joining_alone", "node": self.setup.node_id,
                               "round": join_round})
        alg = setup.algorithm
        edges = self.edges
        passed = sorted(a for a in {*heard, *edges.anchors} if since < a < join_round)
        mass: torch.Tensor | None = None
        if alg.tracked_field != "x" and not (passed or stale or self.gone_for):
            mass = state.x - alg.tracked(state)
        if stale:
            log.warning("the checkpoint (round %d) is older than what its neighbours mixed "
                        "of this node: its mass is unknown; it joins without it and proposes a "
                        "re-anchor", since,
                        extra={"event": "stale_checkpoint", "node": me, "round": since})
        elif self.gone_for:
            log.info("%s declared this node gone: it joins without its mass (the "
                     "re-anchor takes it)", ", ".join(sorted(self.gone_for)),
                     extra={"event": "rejoin_after_gone", "node": me,
                            "neighbour": sorted(self.gone_for)})
        elif passed:
            log.info("the network re-anchored at round %s since this node's round %d: "
                     "it joins with mass 0", ", ".join(map(str, passed)), since,
                     extra={"event": "rejoin_after_anchor", "node": me})
        if stale or self.gone_for or not restarted:
            edges.reset(join_round)
        else:
            edges.resumed(since, join_round, passed)
        edges.anchors |= {a for a in heard if a >= join_round}
        if stale:
            edges.propose_anchor(join_round)
        self.transport.inbox.discard_before(join_round)
        # x = ω = ω_prev (+ its mass): it adds as much to Σ x as to Σ tracked, plus the mass
        # it had (docs/faults.md)
        x = model.clone() if mass is None else model + mass
        return NodeState(join_round, x, model, model.clone())

    async def agree_join(self, ahead: dict[str, int], join_round: int) -> None:
        """Agree the join round with the neighbours of ``ahead``, once the node is in it; the
        others (still at the start) join this node later."""
        for peer in sorted(ahead):
            try:
                await self.greet(peer, proposal=join_round)
            except (PeerUnavailable, HandshakeRefused) as exc:
                self.edges.peers[peer].state = PeerState.ABSENT
                log.warning("%s did not agree on the join: %s", peer,
                            exc,
                            extra={"event": "join_refused", "node": self.setup.node_id,
                                   "neighbour": peer})
        for peer, track in self.edges.peers.items():
            if peer not in ahead and track.state is PeerState.ACTIVE:
                track.state = PeerState.ABSENT  # a neighbour still at the start: it joins us

    # ------------------------------------------------------------------ missing neighbours
    def greet_the_missing(self) -> None:
        """Once a round, ask each gone or absent neighbour whether the edge can come back."""
        t = self.round_of()
        for peer in self.edges.to_greet():
            if not self.faults.linked(peer, t):
                continue  # an edge-round that loses states loses a handshake too
            task = self._greetings.get(peer)
            if task is not None and not task.done():
                continue
            self._greetings[peer] = asyncio.create_task(self._try_greet(peer))

    async def _try_greet(self, peer: str) -> None:
        try:
            await self.greet(peer, proposal=self.round_of() + 2)
        except (PeerUnavailable, HandshakeRefused, TransportClosed):
            pass
        except Exception:  # background work: log it, never let it end the node
            log.exception("handshake with %s failed unexpectedly", peer,
                          extra={"event": "handshake_failed", "node": self.setup.node_id,
                                 "neighbour": peer})

    async def stop(self) -> None:
        """Cancel the greetings in flight, and wait for them to end."""
        tasks = [t for t in self._greetings.values() if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self._greetings.clear()
