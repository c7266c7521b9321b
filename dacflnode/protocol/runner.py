"""The round state machine of one node, over any :class:`~dacflnode.transport.base.Transport`.

Round ``t`` (the algorithm code of :mod:`dacflnode.algorithms.rounds`, see docs/algorithm.md):

1. *exchange* — push :meth:`Algorithm.outgoing` of the round-``t`` state, with this node's degree
   in round ``t``, to every neighbour active in round ``t``; wait for theirs (buffered by round in
   the :class:`~dacflnode.transport.base.Inbox`, so two rounds never mix);
2. *mix* — the :class:`~dacflnode.protocol.policies.MixingPolicy`'s weights (a daemon's:
   Metropolis–Hastings from the degrees the neighbours announced), then :meth:`Algorithm.prepare`;
3. *train* — the :class:`~dacflnode.protocol.training.NodeTrainer`, off the event loop, so the node
   keeps serving its neighbours;
4. *complete* — :meth:`Algorithm.complete`, evaluation every few rounds through the
   :class:`~dacflnode.protocol.policies.ModelView`, a metrics line and (optionally) a checkpoint
   (:mod:`dacflnode.protocol.outputs`).

Faults (docs/faults.md; the bookkeeping is :class:`~dacflnode.protocol.edges.EdgeBook`): a neighbour
that has not delivered by the round deadline is left out of that round's mix (its weight goes to
the node itself); every header lists the neighbours mixed in the node's last few rounds, so an
edge used on one end only is undone exactly by the node that used it. A neighbour silent for
``gone_after`` rounds is declared gone (one that shows it is alive is late, not gone), and all
nodes re-anchor at an agreed round. A node that drains out (:meth:`NodeRunner.request_leave`)
hands its share of ``Σ x`` to its neighbours; a node far behind its neighbours joins at an agreed
round from a neighbour's model, keeping its own mass when it restarted from its checkpoint
(:mod:`dacflnode.protocol.joining`, which also holds the handshakes). After
the last round every node runs ``anchor_delay`` more exchanges, without mixing, to settle the
last one-sided uses and apply the anchors proposed near the end.

The runner builds the node's :class:`~dacflnode.transport.base.Inbox`, with everything the inbox
asks of the node, and makes its transport from it (the function it is given).

Task lifetimes are structured: the pushes of a round run in a task group that ends with the round
(delivered, given up at the deadline, or cancelled when the round is abandoned); a stop request
abandons the exchange without leaving anything running; cancelling :meth:`NodeRunner.run`
cancels everything it started and the cancellation reaches the caller.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch

from dacflnode.algorithms.rounds import NodeState
from dacflnode.protocol.copies import PublicCopies, is_compressed
from dacflnode.protocol.edges import Absorbed, EdgeBook
from dacflnode.protocol.joining import Handshakes
from dacflnode.protocol.ledger import Ledger
from dacflnode.protocol.outputs import Outputs
from dacflnode.protocol.phase import Phase
from dacflnode.protocol.setup import NodeSetup, RoundReport
from dacflnode.records.checkpoint import FINAL_MODEL, Checkpoint
from dacflnode.records.membership import PeerTrack
from dacflnode.records.persist import PersistError
from dacflnode.transport.base import (
    DEFAULT_PULL_TIMEOUT,
    HandshakeRefused,
    Inbox,
    PeerUnavailable,
    Transport,
    TransportClosed,
)
from dacflnode.wire.errors import Reason, Refusal, WireError
from dacflnode.wire.message import Kind, RoundMessage
from dacflnode.wire.state_guard import RobustGuard

log = logging.getLogger(__name__)

T = TypeVar("T")

#: While a round waits, the neighbours whose states have not come are asked whether they are
#: there after this many seconds, then at doubling intervals up to PROBE_MAX (daemons only: a
#: round deadline that is finite).
PROBE_AFTER = 1.0
PROBE_MAX = 8.0
#: How long such a question may take.
PROBE_TIMEOUT = 2.0


class Stopped(Exception):
    """The node was asked to stop before the round could finish."""


class NodeFailed(RuntimeError):
    """The node cannot go on (its files cannot be written); the message says what to do."""


@dataclass
class _Exchanged:
    """What one exchange of a round gave (:meth:`NodeRunner._exchange_round`)."""

    #: the neighbours mixed in the round, and those whose handover was due
    active: list[str]
    handovers: Sequence[str]
    #: this node's message of the round
    message: RoundMessage
    received: dict[str, RoundMessage]
    #: the senders whose message can be mixed (in a compressed run: their copy matches it)
    usable: set[str]
    absorbed: Absorbed


class NodeRunner:
    """Runs the rounds of one node; :attr:`phase`, :attr:`state`, :attr:`last` and
    :attr:`peers` describe it.

    ``make_transport``: the node's transport around the inbox the runner built (a
    ``functools.partial`` of the transport's class, all but the inbox given). ``resume``: the
    checkpoint the node restarts from (its state is ``state``); its edge bookkeeping (one-sided
    uses to settle, anchors, what it knew of each neighbour) carries on.
    """

    def __init__(
        self, setup: NodeSetup, make_transport: Callable[[Inbox], Transport], state: NodeState,
        resume: Checkpoint | None = None,
    ) -> None:
        self.setup = setup
        self.state = state
        self.phase = Phase.STARTING
        self.last: RoundReport | None = None
        self.last_accuracy = math.nan
        self.last_loss = math.nan
        self.started = time.time()
        self._stop = asyncio.Event()
        self._leave = asyncio.Event()
        #: the ``(round, peer)`` states being pulled now (one pull each)
        self._pulling: set[tuple[int, str]] = set()
        #: neighbours that refused this round's push for being in another round: alive
        self._alive: set[str] = set()
        #: rounds in which the node mixed no neighbour although the topology had some
        self.alone_rounds = 0
        #: whether the node restarts from a checkpoint, and from which round
        self._restarted = resume is not None
        self._resumed_at = state.round if resume is not None else -1
        self.on_round: Callable[[RoundReport], None] | None = None
        self.outputs = Outputs(setup)
        alg = setup.algorithm
        self.edges = EdgeBook(
            setup.node_id, setup.neighbours, gone_after=setup.gone_after,
            anchor_delay=setup.anchor_delay,
            repair=setup.repair and alg.decentralized and "x" in alg.exchanged,
            peers=None if resume is None else resume.peers,
            ledger=None if resume is None else Ledger.from_tensors(resume.pending),
            used_log=() if resume is None else resume.used_log,
            anchors=() if resume is None else resume.anchors, round_=state.round,
        )
        #: The node's latest outgoing state: what the guard measures neighbours' states against.
        self._reference: Mapping[str, torch.Tensor] = alg.outgoing(state)
        #: a compressed run's public copies (docs/compression.md)
        self.copies: PublicCopies | None = None
        #: a compressed run's guard: it judges a neighbour's copy against the node's own copy
        self._copy_guard: RobustGuard | None = None
        guard: RobustGuard | None = None
        if setup.compression is not None:
            copies = PublicCopies(setup.node_id, setup.neighbours, alg.exchanged,
                                  setup.compression, alg.outgoing(state), shared=resume is None)
            self.copies = copies
            if setup.absurd_ratio is not None:
                self._copy_guard = RobustGuard(lambda: copies.own)
        elif setup.absurd_ratio is not None:
            guard = RobustGuard(lambda: self._reference)
        #: the ``(round, peer)`` states refused as absurd or stale, by this node or the peer
        self._refused: set[tuple[int, str]] = set()
        poisons = setup.faults is not None and any(
            p.node == setup.node_id for p in getattr(setup.faults, "poisons", ()))
        self._poisoned: dict[tuple[int, int, float], RoundMessage] = {}
        inbox = Inbox(senders=setup.neighbours, current_round=lambda: self.round, guard=guard,
                      on_join=self._on_join, on_refused=self._on_refused,
                      barred=set(self.edges.quarantined),
                      outgoing=self._poison if poisons else None,
                      copy_of=None if self.copies is None else self._copy_of)
        self.transport = make_transport(inbox)
        self.handshakes = Handshakes(setup, self.transport, self.edges, lambda: self.round)

    def _on_join(self, peer: str, proposed: int) -> int:
        return self.handshakes.on_join(peer, proposed)

    # ------------------------------------------------------------------ misbehaving members
    def _on_refused(self, message: RoundMessage, refusal: Refusal) -> None:
        """The inbox's guard refused ``message`` (it no longer waits for it)."""
        if refusal.reason in (Reason.ABSURD_STATE, Reason.STALE_STATE):
            self._offence(message.sender, message.round, refusal.reason, mine=False)

    def _offence(self, peer: str, round_: int, reason: Reason, mine: bool) -> None:
        """A state of the edge to ``peer`` was refused as absurd or stale (``mine``: this node's
        state, by ``peer``); both ends count the same refusals, so both quarantine alike."""
        self._refused.add((round_, peer))
        if mine:
            log.warning("%s: %s refused this node's round-%d state (%s); not retried",
                        self.setup.node_id, peer, round_, reason,
                        extra={"event": "state_refused_by_neighbour", "node": self.setup.node_id,
                               "round": round_, "neighbour": peer, "reason": reason})
        else:
            log.warning("%s: refused the round-%d state of %s (%s); the round goes on without "
                        "it", self.setup.node_id, round_, peer, reason,
                        extra={"event": "state_refused", "node": self.setup.node_id,
                               "round": round_, "neighbour": peer, "reason": reason})
        if self.edges.offence(peer, round_, self.round):
            self._quarantined(peer)

    def _quarantine(self, peer: str) -> None:
        """``peer`` refused this node's state because it quarantined the edge: so does this
        node (a quarantine is for both ends)."""
        if self.edges.quarantine(peer, self.round) is not None:
            self._quarantined(peer)

    @property
    def quarantines(self) -> int:
        """Edges quarantined in this run (kept across restarts, in the checkpoint)."""
        return len(self.edges.quarantined)

    def _quarantined(self, peer: str) -> None:
        self.transport.inbox.barred.add(peer)
        for r in (self.round, self.round + 1):
            self.transport.inbox.forgo_nowait(r, peer)
        track = self.peers[peer]
        log.warning("%s: edge to %s quarantined in round %d after %d refused states; it is not "
                    "mixed again in this run; re-anchor at round %d", self.setup.node_id, peer,
                    self.round, track.refused_states, max(self.edges.anchors, default=-1),
                    extra={"event": "quarantined", "node": self.setup.node_id, "round": self.round,
                           "neighbour": peer})

    def _poison(self, peer: str, message: RoundMessage) -> RoundMessage:
        """What the fault plan makes this node send ``peer`` instead of ``message``."""
        faults = self.setup.faults
        scale = None if faults is None else faults.poison(self.setup.node_id, peer,
                                                           message.round)
        if scale is None:
            return message
        key = (message.round, id(message), scale)
        poisoned = self._poisoned.get(key)
        if poisoned is None or poisoned.round != message.round:
            # a compressed message's integer parts (int8 codes, indices) stay: its floats scale
            tensors = {name: t * scale if t.is_floating_point() else t
                       for name, t in message.tensors.items()}
            poisoned = replace(message, tensors=tensors)
            for old in [k for k in self._poisoned if k[0] < message.round - 1]:
                del self._poisoned[old]
            self._poisoned[key] = poisoned
        return poisoned

    # ------------------------------------------------------------------ control
    @property
    def round(self) -> int:
        """Rounds completed = the round being worked on."""
        return self.state.round

    @property
    def peers(self) -> dict[str, PeerTrack]:
        return self.edges.peers

    @property
    def anchors(self) -> set[int]:
        return self.edges.anchors

    @property
    def reanchored(self) -> int:
        return self.edges.reanchored

    @property
    def leaving(self) -> bool:
        return self._leave.is_set()

    def request_stop(self) -> None:
        self._request(self._stop, "stop")

    def request_leave(self) -> None:
        """Drain: finish the round in progress, then leave the network (docs/faults.md)."""
        self._request(self._leave, "leave")

    def _request(self, flag: asyncio.Event, what: str) -> None:
        """Set ``flag``, logging the first request (``stop`` or ``leave``)."""
        if not flag.is_set():
            log.info("%s: %s requested in round %d (%s)", self.setup.node_id, what, self.round,
                     self.phase,
                     extra={"event": f"{what}_requested", "node": self.setup.node_id,
                            "round": self.round})
        flag.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def residual(self) -> float:
        """``‖x_i − ω_i‖``: how far the node's estimate is from its own latest model."""
        return float(torch.linalg.vector_norm(self.state.x - self.state.omega))

    def active(self, t: int) -> list[str]:
        """The neighbours the topology makes active in round ``t``."""
        if self.setup.active_neighbours is None:
            return sorted(self.setup.neighbours)
        return sorted(self.setup.active_neighbours(t))

    def mixing(self, t: int) -> list[str]:
        """The neighbours mixed in round ``t`` (active, and not gone, absent or left)."""
        return self.edges.mixing(t, self.active(t))

    def checkpoint(self, left: bool = False) -> Checkpoint:
        """The node as a checkpoint holds it (valid between rounds)."""
        fields = self.edges.checkpoint_fields()
        return Checkpoint(
            self.state, dict(self.setup.trainer.local_buffers()),
            {**self.setup.run_info, "round": str(self.round)}, fields["used_log"],
            fields["pending"], tuple(fields["anchors"]), fields["peers"],
            self.setup.algorithm.tracked_field, left)

    # ------------------------------------------------------------------ run
    async def run(self) -> bool:
        """Handshake (joining if the network is ahead), then every remaining round and the
        closing exchange. Returns True when all rounds completed, False when a stop request
        ended the run first or the node left the network."""
        try:
            try:
                await self._until_stopped(self.wait_for_neighbours())
                await self._until_stopped(self._join_if_behind())
                while self.round < self.setup.rounds:
                    if self._leave.is_set():
                        await self._leave_network()
                        return False
                    await self.run_round(self.round)
                await self._settle_the_end()
            finally:
                await self.handshakes.stop()
            self.phase = Phase.DONE
            await self.outputs.checkpoint(self.checkpoint)
            await self.outputs.final_model(self.state)
            log.info("%s: all %d rounds done", self.setup.node_id, self.setup.rounds,
                     extra={"event": "rounds_done", "node": self.setup.node_id,
                            "round": self.setup.rounds})
            return True
        except Stopped:
            self.phase = Phase.STOPPED
            log.info("%s: stopped at round %d", self.setup.node_id, self.round,
                     extra={"event": "stopped", "node": self.setup.node_id, "round": self.round})
            return False
        except PersistError as exc:
            self.phase = Phase.FAILED
            raise NodeFailed(str(exc)) from exc

    async def confirm_finished(self) -> bool:
        """Whether the node, started again, had already done every round (its checkpoint is of
        the last round): then it makes sure ``final.safetensors`` is sound (its checksum, its
        round) and writes it again from the checkpoint when it is missing or damaged, logs
        "run complete", and the caller exits at once, without waiting for neighbours that are
        gone (a service manager that restarts it then does not loop)."""
        setup = self.setup
        if self.round < setup.rounds:
            return False
        self.phase = Phase.DONE
        await self.outputs.repair_final_model(self.state)
        log.info("%s: run complete: %d/%d rounds; final model %s", setup.node_id, self.round,
                 setup.rounds, "not written (no state directory)" if setup.state_dir is None
                 else setup.state_dir / FINAL_MODEL,
                 extra={"event": "run_complete", "node": setup.node_id, "round": self.round})
        return True

    async def _until_stopped(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` unless a stop request comes first (then cancel it, raise Stopped).

        Neither the work nor the stop watcher outlives this call: both are cancelled and awaited
        whatever ends it, this task's own cancellation included, which is then re-raised.
        """
        if self._stop.is_set():
            coro.close()
            raise Stopped
        work = asyncio.ensure_future(coro)
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, stop):
                task.cancel()
            await asyncio.wait({work, stop})
        if not work.cancelled():
            return work.result()  # finished (or failed) before the stop: that outcome counts
        raise Stopped

    async def wait_for_neighbours(self) -> None:
        """Handshake with every neighbour (:meth:`Handshakes.wait_for_neighbours
        <dacflnode.protocol.joining.Handshakes.wait_for_neighbours>`)."""
        self.phase = Phase.WAITING_FOR_PEERS
        await self.handshakes.wait_for_neighbours()

    async def _join_if_behind(self) -> None:
        """Join at an agreed round, from a neighbour's model, when the network is ahead
        (:mod:`dacflnode.protocol.joining`)."""
        ahead = self.handshakes.behind(self.round)
        if ahead is None:
            return  # at most one round behind: pull what was missed (see _exchange)
        self.phase = Phase.JOINING
        self.state = await self.handshakes.joined_state(self.state, ahead, self.copies,
                                                        self._restarted)
        self._reference = self.setup.algorithm.outgoing(self.state)
        await self.handshakes.agree_join(ahead, self.round)

    # ------------------------------------------------------------------ one round
    def _reanchor_if_due(self, t: int) -> None:
        if not self.edges.anchor_due(t):
            return
        alg = self.setup.algorithm
        tracked = alg.tracked(self.state)
        bias = float(torch.linalg.vector_norm(self.state.x - tracked))
        self._set_x(tracked.clone())
        self.edges.anchored(t)
        log.info("%s: re-anchored at round %d (x := %s; |x - %s| was %.3g)", self.setup.node_id,
                 t, alg.tracked_field, alg.tracked_field, bias,
                 extra={"event": "reanchored", "node": self.setup.node_id, "round": t})

    def _set_x(self, x: torch.Tensor) -> None:
        state = self.state
        if state.omega is state.x:  # one vector in all three fields (CDSGD and the like)
            self.state = NodeState(state.round, x, x, x)
        else:
            self.state = NodeState(state.round, x, state.omega, state.omega_prev)

    def _apply(self, absorbed: Absorbed) -> None:
        """Add what the round's messages settled to ``x`` (a pass over the state per term:
        call it off the event loop)."""
        adjust = absorbed.adjust
        if adjust is not None:
            self._set_x(self.state.x + adjust)

    async def _message(self, t: int, degree: int,
                       message_kind: Kind = Kind.STATE) -> RoundMessage:
        """The node's round-``t`` message; in a compressed run, the compressed update of its
        public copy, which is committed here (encoding runs off the event loop)."""
        used_log, anchors = self.edges.header(t)
        tensors = self.setup.algorithm.outgoing(self.state)
        copies = self.copies
        if copies is None:
            return RoundMessage(self.setup.node_id, t, max(1, degree), tensors, used_log,
                                message_kind, anchors)
        parts, update = await asyncio.get_running_loop().run_in_executor(
            self.setup.executor, copies.encode, t, tensors)
        base = copies.own_id
        copies.commit(update)
        return RoundMessage(self.setup.node_id, t, max(1, degree), parts, used_log,
                            message_kind, anchors, copy_base=base, copy_next=update.id)

    def _copy_of(self, id_: int) -> RoundMessage | None:
        """The node's own public copy ``id_`` as a full message (a neighbour's copy pull)."""
        copy = None if self.copies is None else self.copies.served(id_)
        if copy is None:
            return None
        return RoundMessage(self.setup.node_id, self.round, 1, copy, copy_next=id_)

    async def _update_copies(self, t: int, received: Mapping[str, RoundMessage],
                             deadline: float, pull: bool = True) -> set[str]:
        """Apply the round's compressed updates to the copies of their senders; a copy that is
        not the one an update was made for is pulled in full (``pull``). Returns the senders
        whose copy now matches their message (the others are not mixed this round: their
        one-sided uses are undone as any missed state's). An update that cannot be decoded,
        or a copy the guard refuses, counts as a refused state."""
        copies = self.copies
        usable: set[str] = set()
        if copies is None:
            return usable
        loop = asyncio.get_running_loop()
        executor = self.setup.executor
        me = self.setup.node_id
        for j in sorted(received):
            message = received[j]
            if message.kind is Kind.HANDOVER or not is_compressed(message):
                continue
            try:
                if copies.at(j, message.copy_next):
                    pass  # pulled in full already
                elif copies.applies(message):
                    copies.commit(await loop.run_in_executor(executor, copies.decode, message))
                elif pull and message.kind is Kind.STATE:  # (a leaving node's: never mixed)
                    full = await self.transport.pull(
                        j, message.round, timeout=max(0.0, min(deadline - time.monotonic(),
                                                               DEFAULT_PULL_TIMEOUT)),
                        copy_id=message.copy_next)
                    copies.commit(await loop.run_in_executor(
                        executor, copies.adopt, j, message.copy_next, full.tensors))
                    copies.pulled += 1
                    log.info("%s: round %d: pulled the full public copy of %s", me, t, j,
                             extra={"event": "copy_pulled", "node": me, "round": t, "neighbour": j})
                else:
                    continue
            except ValueError as exc:
                log.warning("%s: round %d: the update of %s cannot be applied: %s", me, t, j,
                            exc,
                            extra={"event": "copy_update_refused", "node": me, "round": t,
                                   "neighbour": j})
                copies.forget(j)
                self._offence(j, message.round, Reason.ABSURD_STATE, mine=False)
                continue
            except (WireError, PeerUnavailable) as exc:
                log.warning("%s: round %d: could not pull the public copy of %s: %s; not mixed "
                            "this round", me, t, j, exc,
                            extra={"event": "copy_pull_failed", "node": me, "round": t,
                                   "neighbour": j})
                continue
            guard = self._copy_guard
            if guard is not None and message.kind is Kind.STATE:
                copy = copies.theirs[j][1]
                refused = await loop.run_in_executor(
                    executor, guard, replace(message, tensors=copy, copy_base=0), False)
                if refused is not None:
                    log.warning("%s: round %d: the public copy of %s is refused: %s", me, t, j,
                                refused.detail,
                                extra={"event": "copy_refused", "node": me, "round": t,
                                       "neighbour": j})
                    self._offence(j, message.round, refused.reason, mine=False)
                    continue
            usable.add(j)
        return usable

    def _traffic(self) -> tuple[int, int]:
        """Payload bytes sent to and received from all neighbours so far."""
        stats = self.transport.stats.values()
        return sum(s.bytes_sent for s in stats), sum(s.bytes_received for s in stats)

    async def run_round(self, t: int) -> RoundReport:
        setup = self.setup
        alg = setup.algorithm
        started = time.perf_counter()
        self.handshakes.greet_the_missing()
        self.phase = Phase.EXCHANGING
        self._alive.clear()
        since = time.monotonic()
        traffic = self._traffic()
        exchanged = await self._exchange_round(t)
        active, handovers, message = exchanged.active, exchanged.handovers, exchanged.message
        received, absorbed = exchanged.received, exchanged.absorbed
        mixed = {j: received[j] for j in active if j in received
                 and received[j].kind is Kind.STATE and j in exchanged.usable}
        missing = tuple(j for j in active if j not in mixed and j not in absorbed.left
                        and self.peers[j].mixes_in(t))  # not re-agreed to a later round
        heard = self.transport.inbox.heard
        faults = setup.faults
        # an edge-round an injected fault drops is silent by definition (so that a fault plan
        # plays the same whatever the timing, in the simulator and on daemons)
        alive = {j for j in missing if (j in self._alive or heard.get(j, -math.inf) >= since)
                 and not (faults is not None and faults.drops(j, setup.node_id, t))}
        self.edges.note_round(t, list(mixed), missing,
                             [j for j in handovers if j not in received], alive)
        if not mixed and self.active(t):
            self.alone_rounds += 1
        # (a state that came but whose public copy could not be matched was logged as such)
        late = [j for j in missing if (t, j) not in self._refused and j not in received]
        if late:
            log.warning("%s: round %d: no state from %s by the deadline; mixing without them",
                        setup.node_id, t, ", ".join(late),
                        extra={"event": "state_missing", "node": setup.node_id, "round": t,
                               "neighbour": late})
        self._refused = {(r, j) for r, j in self._refused if r > t}
        weights = setup.mixing.weights(setup.node_id, t, len(active),
                                       {j: mixed[j].degree for j in mixed})
        inbox = {j: mixed[j].tensors for j in mixed}
        # mixing touches every parameter of every neighbour: off the event loop, like training
        loop = asyncio.get_running_loop()
        if self.copies is None:
            prepared = await loop.run_in_executor(setup.executor, alg.prepare, self.state,
                                                  setup.node_id, weights, inbox)
            self.edges.record_round(t, active, weights,
                                   {j: inbox[j]["x"] for j in inbox if "x" in inbox[j]},
                                   message.tensors.get("x"))
        else:
            # CHOCO: the edge ij added γ w_ij (x̂_j − x̂_i); a one-sided use undoes that term
            copies = self.copies.copies(list(mixed))
            prepared = await loop.run_in_executor(setup.executor, alg.prepare, self.state,
                                                  setup.node_id, weights, {}, copies)
            gamma = setup.compression.gamma if setup.compression is not None else 1.0
            self.edges.record_round(t, active, {j: gamma * w for j, w in weights.items()},
                                   {j: copies[j]["x"] for j in mixed if "x" in copies[j]},
                                   copies[setup.node_id].get("x"))
        exchange_s = time.perf_counter() - started

        self.phase = Phase.TRAINING
        t0 = time.perf_counter()
        result = await setup.trainer.train(prepared.train_from, t)
        train_s = time.perf_counter() - t0
        self.state = await loop.run_in_executor(setup.executor, alg.complete, self.state,
                                                prepared, result.flat)
        if absorbed.terms:
            await loop.run_in_executor(setup.executor, self._apply, absorbed)
        self.transport.inbox.discard_before(self.state.round)

        accuracy = test_loss = None
        done = self.state.round
        if done % setup.eval_every == 0 or done == setup.rounds:
            self.phase = Phase.EVALUATING
            accuracy, test_loss = await setup.view.evaluate(done, alg.model(self.state),
                                                            setup.trainer)
            self.last_accuracy, self.last_loss = accuracy, test_loss
        report = RoundReport(
            round=done, used=tuple(sorted(mixed)), missing=missing, train_loss=result.loss,
            samples=result.samples, accuracy=accuracy, test_loss=test_loss,
            residual=self.residual(), exchange_s=exchange_s, train_s=train_s,
            seconds=time.perf_counter() - started,
            bytes_sent=self._traffic()[0] - traffic[0],
            bytes_received=self._traffic()[1] - traffic[1],
        )
        self.last = report
        await self.outputs.metrics_line(report, self.alone_rounds,
                                        sum(t.refused_states for t in self.peers.values()))
        await self.outputs.checkpoint(self.checkpoint)
        if self.on_round is not None:
            self.on_round(report)
        return report

    async def _settle_the_end(self) -> None:
        """After the last round ``R``: ``anchor_delay`` closing exchanges of kind ``FINAL``
        (rounds ``R .. R + anchor_delay − 1``), without mixing or training. Their headers settle
        the last one-sided uses and carry every anchor proposed in the last rounds to every
        node; each anchor up to ``R + anchor_delay`` is applied at its round, the last one after
        the exchanges. So no entry or anchor is dropped because the run ends, and every node
        that finishes holds ``Σ x = Σ tracked`` (docs/faults.md, section 1). A neighbour that
        misses a closing exchange is not waited for in the next ones. The node's round is
        ``R`` again afterwards."""
        self.phase = Phase.CLOSING
        end = self.setup.rounds
        last = end + self.edges.anchor_delay
        silent: set[str] = set()
        try:
            while self.round < last:
                heard = await self._closing_exchange(Kind.FINAL, skip=silent)
                silent |= {j for j in self.mixing(self.round) if j not in heard}
                self._set_round(self.round + 1)
            self._reanchor_if_due(last)
        finally:
            self._set_round(end)  # stopped or not: its round is R
        if len(self.edges.ledger):
            log.warning("%s: %d one-sided uses left unsettled at the end (a neighbour did not "
                        "answer the closing exchanges); dacflnode invariant settles them from "
                        "its checkpoint", self.setup.node_id, len(self.edges.ledger),
                        extra={"event": "unsettled_at_end", "node": self.setup.node_id})

    def _set_round(self, round_: int) -> None:
        state = self.state
        self.state = NodeState(round_, state.x, state.omega, state.omega_prev)

    async def _exchange_round(self, t: int, message_kind: Kind = Kind.STATE,
                              skip: Collection[str] = ()) -> _Exchanged:
        """Round ``t``'s exchange (a round's, or a closing one of ``message_kind``): re-anchor
        when due, push the node's message to the round's mixed neighbours (but ``skip``), hear
        theirs and any handover due, update the senders' public copies and absorb what the
        messages settle."""
        self._reanchor_if_due(t)
        active = [j for j in self.mixing(t) if j not in skip]
        handovers = self.edges.handovers_due(t)
        message = await self._message(t, len(active), message_kind)
        if message_kind is Kind.STATE:
            self._reference = (message.tensors if self.copies is None
                               else self.setup.algorithm.outgoing(self.state))
        deadline = time.monotonic() + self.setup.round_deadline
        received = await self._until_stopped(
            self._exchange(t, active, handovers, message, deadline))
        usable = set(received)
        if self.copies is not None:  # a closing exchange mixes nothing: no full copy is pulled
            usable = await self._until_stopped(self._update_copies(
                t, received, deadline, pull=message_kind is Kind.STATE))
        return _Exchanged(active, handovers, message, received, usable,
                          self.edges.absorb(t, received))

    async def _closing_exchange(self, message_kind: Kind,
                                skip: Collection[str] = ()) -> list[str]:
        """One more exchange of round ``self.round`` without mixing (after the last round, or
        before leaving): the neighbours' headers settle the last one-sided uses. Returns the
        neighbours heard from (``skip``: neighbours not to exchange with)."""
        t = self.round
        exchanged = await self._exchange_round(t, message_kind, skip)
        active, received, absorbed = exchanged.active, exchanged.received, exchanged.absorbed
        if absorbed.terms:
            await asyncio.get_running_loop().run_in_executor(self.setup.executor, self._apply,
                                                             absorbed)
        missing = [j for j in active if j not in received]
        if missing:
            log.warning("%s: round %d: no closing state from %s", self.setup.node_id, t,
                        ", ".join(missing),
                        extra={"event": "closing_state_missing", "node": self.setup.node_id,
                               "round": t, "neighbour": missing})
        self.edges.record_round(t, (), {}, {}, None)
        self.transport.inbox.discard_before(t + 1)
        return [j for j in active if j in received]

    async def _leave_network(self) -> None:
        """Drain: a LEAVING exchange (neighbours stop mixing this node, and its ledger is
        settled), then a HANDOVER of ``(x − tracked) / m`` to each of its ``m`` neighbours, so
        that ``Σ x = Σ tracked`` stays exact among the nodes that remain."""
        setup = self.setup
        alg = setup.algorithm
        self.phase = Phase.LEAVING
        t = self.round
        heard = await self._closing_exchange(Kind.LEAVING)
        targets = self.mixing(t)
        unsettled = len(self.edges.ledger)
        anchors: tuple[int, ...] = self.edges.header(t + 1)[1]
        if unsettled:  # the neighbours that did not answer cannot settle: ask for a re-anchor
            anchors = tuple(sorted({*anchors, self.edges.propose_anchor(t)}))
            log.warning("%s: %d one-sided uses unsettled at leave; re-anchor proposed",
                        setup.node_id, unsettled,
                        extra={"event": "unsettled_at_leave", "node": setup.node_id})
        if targets:
            mass = self.state.x - alg.tracked(self.state)
            share = mass / len(targets)
            tensors = {name: share if name == "x" else torch.zeros_like(share)
                       for name in alg.exchanged}
            handover = RoundMessage(setup.node_id, t + 1, len(targets), tensors,
                                    ((t, ()),), Kind.HANDOVER, anchors)
            deadline = time.monotonic() + setup.round_deadline
            async with asyncio.TaskGroup() as pushes:
                for peer in targets:
                    if setup.faults is None or not setup.faults.drops(setup.node_id, peer, t + 1):
                        pushes.create_task(self._push(peer, handover, deadline))
            log.info("%s: left the network at round %d; handed |x - %s| = %.3g to %s "
                     "(heard from %d of %d)", setup.node_id, t, alg.tracked_field,
                     float(torch.linalg.vector_norm(mass)), ", ".join(targets), len(heard),
                     len(targets),
                     extra={"event": "left", "node": setup.node_id, "round": t,
                            "neighbour": targets})
        else:
            log.warning("%s: left at round %d with no neighbour to hand its share to",
                        setup.node_id, t,
                        extra={"event": "left_alone", "node": setup.node_id, "round": t})
        await self.handshakes.stop()
        self.phase = Phase.LEFT
        await self.outputs.checkpoint(lambda: self.checkpoint(left=True))
        await self.outputs.final_model(self.state)

    async def _exchange(
        self, t: int, active: list[str], handovers: Sequence[str], message: RoundMessage,
        deadline: float,
    ) -> dict[str, RoundMessage]:
        """Push to and hear from the round's mixed neighbours (and any handover due); every
        push ends with the round (delivered, given up at the deadline, or cancelled with the
        exchange). Edge-rounds an injected fault drops are neither pushed nor waited for."""
        inbox = self.transport.inbox
        faults = self.setup.faults
        me = self.setup.node_id
        expected = [*active, *(j for j in handovers if j not in active)]
        if faults is not None:
            for peer in expected:
                if faults.drops(peer, me, t):
                    await inbox.forgo(t, peer)
        async with asyncio.TaskGroup() as pushes:
            for peer in active:
                if faults is None or not faults.drops(me, peer, t):
                    pushes.create_task(self._push(peer, message, deadline))
            for peer in active:
                # a neighbour already past round t (we restarted) no longer pushes it; one in
                # round t when this node restarted may have pushed it to the node's previous
                # process: pull its state
                seen = self.handshakes.peer_rounds.get(peer, -1)
                if seen > t or (seen == t and t == self._resumed_at):
                    await self._pull(peer, t, deadline)
            probe = None
            if math.isfinite(self.setup.round_deadline):
                probe = asyncio.create_task(self._probe(t, active, deadline))
            try:
                received = await inbox.wait(t, expected,
                                            max(0.0, deadline - time.monotonic()))
            finally:
                if probe is not None:
                    probe.cancel()
                    await asyncio.wait({probe})
        return received

    async def _probe(self, t: int, active: Sequence[str], deadline: float) -> None:
        """While the round waits, ask the neighbours whose state has not come whether they are
        there (a Hello, which changes nothing on their side): one that answers is alive (late,
        not gone: docs/faults.md), and one that has moved on past round ``t`` without this node
        is pulled from at once; one that does not answer shows as unreachable in ``status``."""
        inbox = self.transport.inbox
        faults = self.setup.faults
        me = self.setup.node_id
        delay = PROBE_AFTER
        while True:
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            for peer in active:
                if inbox.has(t, peer) or inbox.forgone(t, peer) or (
                        faults is not None and faults.drops(peer, me, t)):
                    continue
                try:
                    ident = await asyncio.wait_for(self.transport.hello(peer), PROBE_TIMEOUT)
                except (PeerUnavailable, HandshakeRefused, TimeoutError):
                    continue
                except TransportClosed:
                    return  # the node is shutting down
                except Exception:  # background work: log it, never let it end the round
                    log.exception("%s: asking %s whether it is there failed unexpectedly", me,
                                  peer,
                                  extra={"event": "probe_failed", "node": me, "neighbour": peer})
                    continue
                self._alive.add(peer)
                self.handshakes.peer_rounds[peer] = ident.round
                if ident.round > t:  # it went on without this node: take its state of round t
                    await self._pull(peer, t, deadline)
            delay = min(2 * delay, PROBE_MAX)

    async def _push(self, peer: str, message: RoundMessage, deadline: float) -> None:
        delay = 0.05
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning("%s: round %d state not delivered to %s by the deadline",
                            self.setup.node_id, message.round, peer,
                            extra={"event": "push_timeout", "node": self.setup.node_id,
                                   "round": message.round, "neighbour": peer})
                return
            try:
                await self.transport.push(peer, message, timeout=remaining)
                return
            except PeerUnavailable:
                pass
            except TransportClosed:
                return  # the node is shutting down
            except WireError as exc:
                if exc.reason in (Reason.ROUND_PASSED, Reason.ROUND_AHEAD, Reason.DUPLICATE):
                    self._alive.add(peer)  # late or ahead, not gone
                if exc.reason is Reason.ROUND_PASSED:
                    # the neighbour moved on without this node: take its state of the round
                    # (a one-sided use, undone once its header says so)
                    if message.kind is not Kind.HANDOVER and self.peers[peer].mixes_in(
                            message.round):  # (not: the edge was re-agreed to a later round)
                        await self._pull(peer, message.round, deadline)
                    return
                if exc.reason is Reason.DUPLICATE:
                    return  # it already has this state (it pulled it)
                if exc.reason in (Reason.ABSURD_STATE, Reason.STALE_STATE):
                    # never retried: the neighbour goes on without it, and so does this node
                    if message.kind is Kind.STATE or message.kind is Kind.FINAL:
                        self._offence(peer, message.round, exc.reason, mine=True)
                    return
                if exc.reason is Reason.QUARANTINED:
                    self._quarantine(peer)
                    return
                if exc.reason is not Reason.ROUND_AHEAD:
                    log.warning("%s: %s refused round %d: %s (%s): %s", self.setup.node_id,
                                peer, message.round, exc.code, exc.reason, exc.message,
                                extra={"event": "push_refused", "node": self.setup.node_id,
                                       "round": message.round, "neighbour": peer,
                                       "reason": exc.reason})
            except Exception:  # a transport failure nobody foresaw must not end the round
                log.exception("%s: push of round %d to %s failed unexpectedly; retrying",
                              self.setup.node_id, message.round, peer,
                              extra={"event": "push_failed", "node": self.setup.node_id,
                                     "round": message.round, "neighbour": peer})
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 1.0)

    async def _pull(self, peer: str, t: int, deadline: float) -> None:
        """Pull ``peer``'s round-``t`` state, only called when ``peer`` is past round ``t``: it
        no longer pushes that round, so the pull cannot race a push of it (if one did land,
        the inbox keeps the first and refuses the second as a duplicate: no harm). The pulled
        state passes the inbox's guard like a pushed one."""
        inbox = self.transport.inbox
        faults = self.setup.faults
        key = (t, peer)
        # here already, dropped, or on its way: a restarted node pulls a state and its push of
        # the round, refused ROUND_PASSED, asks for the same one
        if inbox.has(t, peer) or key in self._pulling or inbox.forgone(t, peer) or (
                faults is not None and faults.drops(peer, self.setup.node_id, t)):
            return
        self._pulling.add(key)
        try:
            message = await self.transport.pull(
                peer, t, timeout=max(0.0, min(deadline - time.monotonic(), DEFAULT_PULL_TIMEOUT)))
            await inbox.put(message)
            log.info("%s: pulled round %d state of %s", self.setup.node_id, t, peer,
                     extra={"event": "pulled", "node": self.setup.node_id, "round": t,
                            "neighbour": peer})
        except WireError as exc:
            if exc.reason is Reason.DUPLICATE:
                return  # its push of the state arrived while the pull was on its way
            level = logging.INFO if exc.reason is Reason.NOT_KEPT else logging.WARNING
            log.log(level, "%s: pull of round %d from %s failed: %s", self.setup.node_id, t,
                    peer, exc,
                    extra={"event": "pull_failed", "node": self.setup.node_id, "round": t,
                           "neighbour": peer})
        except (PeerUnavailable, TransportClosed) as exc:
            log.warning("%s: pull of round %d from %s failed: %s", self.setup.node_id, t, peer,
                        exc,
                        extra={"event": "pull_failed", "node": self.setup.node_id, "round": t,
                               "neighbour": peer})
        except Exception:  # a transport failure nobody foresaw must not end the round
            log.exception("%s: pull of round %d from %s failed unexpectedly",
                          self.setup.node_id, t, peer,
                          extra={"event": "pull_failed", "node": self.setup.node_id, "round": t,
                                 "neighbour": peer})
        finally:
            self._pulling.discard(key)
