"""The round state machine of one node, over any :class:`~dacflnode.transport.base.Transport`.

A :class:`NodeRunner` holds the node's state and its components, and runs its rounds in the
order a schedule gives (:class:`~dacflnode.protocol.schedule.SyncSchedule`). Round ``t``
(docs/algorithm.md; the algorithm code is :mod:`dacflnode.algorithms.rounds`):

1. *exchange* — re-anchor when due; the node's message of the round from its
   :class:`~dacflnode.protocol.copybook.CopyBook` (a full state, or a compressed update of its
   public copy); the :class:`~dacflnode.protocol.exchange.Exchange` pushes it to every neighbour
   mixed in round ``t`` and hears theirs (buffered by round in the
   :class:`~dacflnode.transport.base.Inbox`, so two rounds never mix); the copy book says whose
   can be mixed; the :class:`~dacflnode.protocol.edges.EdgeBook` absorbs what the headers settle;
2. *mix* — the :class:`~dacflnode.protocol.mix.Mixer`: missing neighbours counted, the
   :class:`~dacflnode.protocol.policies.MixingPolicy`'s weights, :meth:`Algorithm.prepare`, the
   uses recorded in the ledger;
3. *train* — the :class:`~dacflnode.protocol.training.NodeTrainer`, off the event loop, so the
   node keeps serving its neighbours;
4. *complete* — :meth:`Algorithm.complete` (FODAC's update) and the fold of what step 1
   settled; the inbox drops the older rounds;
5. *record* — evaluation every few rounds through the
   :class:`~dacflnode.protocol.policies.ModelView`, the round's report with the round's traffic,
   a metrics line and (optionally) a checkpoint (:mod:`dacflnode.protocol.outputs`).

Faults (docs/faults.md): a neighbour that has not delivered by the round deadline is left out
of that round's mix (its weight goes to the node itself); every header lists the neighbours
mixed in the node's last few rounds, so an edge used on one end only is undone exactly by the
node that used it. A neighbour silent for ``gone_after`` rounds is declared gone (one that
shows it is alive is late, not gone), and all nodes re-anchor at an agreed round. Refused
states are offences counted by the :class:`~dacflnode.protocol.quarantine.Quarantine`. A node
that drains out (:meth:`NodeRunner.request_leave`) hands its share of ``Σ x`` to its
neighbours; a node far behind its neighbours joins at an agreed round from a neighbour's model,
keeping its own mass when it restarted from its checkpoint (:mod:`dacflnode.protocol.joining`,
which also holds the handshakes). After the last round every node runs ``anchor_delay`` more
exchanges, without mixing, to settle the last one-sided uses and apply the anchors proposed
near the end. An injected fault plan is consulted by one
:class:`~dacflnode.protocol.fault_filter.FaultFilter`, which the exchange and the handshakes
share.

The runner builds the node's :class:`~dacflnode.transport.base.Inbox` with what the inbox asks
of the node (its round, the guard, the answer to a join, the quarantine's judgement of a
refused state, the fault filter's poison and the copy book's copies), and makes its transport
from it (the function it is given).

Task lifetimes are structured: the pushes of a round run in a task group that ends with the
exchange (delivered, given up at the deadline, or cancelled when the round is abandoned); a stop
request abandons the exchange without leaving anything running; cancelling
:meth:`NodeRunner.run` cancels everything it started and the cancellation reaches the caller.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Collection, Coroutine
from typing import Any, TypeVar

import torch

from dacflnode.algorithms.rounds import NodeState
from dacflnode.protocol.async_schedule import AsyncNode
from dacflnode.protocol.clock import now
from dacflnode.protocol.copies import PublicCopies
from dacflnode.protocol.copybook import make_copy_book
from dacflnode.protocol.edges import Absorbed, EdgeBook
from dacflnode.protocol.exchange import Exchange
from dacflnode.protocol.fault_filter import FaultFilter
from dacflnode.protocol.joining import Handshakes
from dacflnode.protocol.ledger import Ledger
from dacflnode.protocol.mix import Mixer
from dacflnode.protocol.outputs import Outputs
from dacflnode.protocol.phase import Phase
from dacflnode.protocol.quarantine import Quarantine
from dacflnode.protocol.schedule import RoundWork, SyncSchedule
from dacflnode.protocol.setup import NodeSetup, RoundReport
from dacflnode.protocol.snapshot import refused_total
from dacflnode.records.checkpoint import FINAL_MODEL, Checkpoint
from dacflnode.records.membership import PeerTrack
from dacflnode.records.persist import PersistError
from dacflnode.transport.base import Inbox, Transport
from dacflnode.wire.message import Kind, RoundMessage

log = logging.getLogger(__name__)

T = TypeVar("T")


class Stopped(Exception):
    """The node was asked to stop before the round could finish."""


class NodeFailed(RuntimeError):
    """The node cannot go on (its files cannot be written); the message says what to do."""


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
        #: rounds in which the node mixed no neighbour although the topology had some
        self.alone_rounds = 0
        self._waited = 0.0
        #: whether the node restarts from a checkpoint
        self._restarted = resume is not None
        self.on_round: Callable[[RoundReport], None] | None = None
        self.schedule = SyncSchedule()
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
        self.faults = FaultFilter(setup.node_id, setup.faults)
        self.quarantine = Quarantine(setup.node_id, self.edges, lambda: self.round)
        self.book = make_copy_book(setup, state, lambda: self.transport, lambda: self.round,
                                   shared=resume is None)
        inbox = Inbox(senders=setup.neighbours, current_round=lambda: self.round,
                      guard=self.book.guard, barred=set(self.edges.quarantined),
                      on_refused=self.quarantine.judge,
                      on_join=lambda peer, proposed: self.handshakes.on_join(peer, proposed),
                      outgoing=self.faults.sent_to if self.faults.poisons else None,
                      copy_of=self.book.copy_of)
        self.transport = make_transport(inbox)
        self.handshakes = Handshakes(setup, self.transport, self.edges, lambda: self.round,
                                     self.faults)
        self.exchanger = Exchange(setup.node_id, self.transport, self.faults, self.quarantine,
                                  self.edges, self.handshakes.peer_rounds,
                                  resumed_at=state.round if resume is not None else -1)
        self.mixer = Mixer(setup, self.edges, self.book)
        #: the asynchronous schedule (``schedule: async``), answering exchanges from the start
        self.async_node = AsyncNode(self, resume) if setup.schedule == "async" else None
        if self.async_node is not None:
            inbox.on_exchange = self.async_node.answer

    # ------------------------------------------------------------------ what others read
    @property
    def round(self) -> int:
        """Rounds completed = the round being worked on."""
        return self.state.round

    @property
    def copies(self) -> PublicCopies | None:
        """A compressed run's public copies (docs/compression.md)."""
        return self.book.copies

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
    def quarantines(self) -> int:
        """Edges quarantined in this run (kept across restarts, in the checkpoint)."""
        return self.quarantine.count

    @property
    def waited_s(self) -> float:
        """Seconds waited for the neighbours: the rounds' exchanges (sync), the end (async)."""
        return self.async_node.waited_s if self.async_node is not None else self._waited

    @property
    def leaving(self) -> bool:
        return self._leave.is_set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def request_stop(self) -> None:
        self._request(self._stop, "stop")

    def request_leave(self) -> None:
        """Drain: finish the round in progress, then leave the network (docs/faults.md)."""
        self._request(self._leave, "leave")

    def _request(self, flag: asyncio.Event, what: str) -> None:
        """Set ``flag``, logging the first request (``stop`` or ``leave``)."""
        if not flag.is_set():
            log.info("%s requested in round %d (%s)", what, self.round, self.phase,
                     extra={"event": f"{what}_requested", "node": self.setup.node_id,
                            "round": self.round})
        flag.set()

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
        checkpoint = Checkpoint(
            self.state, dict(self.setup.trainer.local_buffers()),
            {**self.setup.run_info, "round": str(self.round)}, fields["used_log"],
            fields["pending"], tuple(fields["anchors"]), fields["peers"],
            self.setup.algorithm.tracked_field, left)
        return checkpoint if self.async_node is None else self.async_node.with_edges(checkpoint)

    # ------------------------------------------------------------------ run
    async def run(self) -> bool:
        """Handshake (joining if the network is ahead), then every remaining round and the
        closing exchange. Returns True when all rounds completed, False when a stop request
        ended the run first or the node left the network."""
        try:
            try:
                await self._until_stopped(self.wait_for_neighbours())
                if self.async_node is not None:
                    if not await self._until_stopped(self.async_node.run()):
                        return False  # it left the network
                else:
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
            log.info("all %d rounds done", self.setup.rounds,
                     extra={"event": "rounds_done", "node": self.setup.node_id,
                            "round": self.setup.rounds})
            return True
        except Stopped:
            self.phase = Phase.STOPPED
            log.info("stopped at round %d", self.round,
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
        if self.round < setup.rounds or (self.async_node is not None
                                         and not self.async_node.members.was_settled):
            return False
        self.phase = Phase.DONE
        await self.outputs.repair_final_model(self.state)
        log.info("run complete: %d/%d rounds; final model %s", self.round,
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
        if self.setup.scale is not None:  # a table run's feature scale (docs/data.md)
            self.phase = Phase.AGREEING
            await self.handshakes.agree_scale(self.setup.scale)

    async def _join_if_behind(self) -> None:
        """Join at an agreed round, from a neighbour's model, when the network is ahead
        (:mod:`dacflnode.protocol.joining`)."""
        ahead = self.handshakes.behind(self.round)
        if ahead is None:
            return  # at most one round behind: pull what was missed (see the exchange)
        self.phase = Phase.JOINING
        self.state = await self.handshakes.joined_state(self.state, ahead, self.copies,
                                                        self._restarted)
        self.book.joined(self.state)
        await self.handshakes.agree_join(ahead, self.round)

    async def run_round(self, t: int) -> RoundReport:
        """Round ``t``, in the order of the node's schedule."""
        return await self.schedule.round(self, t)

    # ------------------------------------------------------------------ the steps
    async def exchange(self, t: int, kind: Kind = Kind.STATE,
                       skip: Collection[str] = ()) -> RoundWork:
        """Step 1, round ``t``'s exchange (a round's, or a closing one of ``kind``): re-anchor
        when due, push the node's message to the round's mixed neighbours (but ``skip``), hear
        theirs and any handover due, see whose can be mixed and absorb what the messages
        settle."""
        setup = self.setup
        started = now()
        if kind is Kind.STATE:
            self.handshakes.greet_the_missing()
            self.phase = Phase.EXCHANGING
        since = now()
        self._reanchor_if_due(t)
        active = [j for j in self.mixing(t) if j not in skip]
        handovers = self.edges.handovers_due(t)
        used_log, anchors = self.edges.header(t)
        message = await self.book.message(t, len(active), kind, self.state, used_log, anchors)
        deadline = now() + setup.round_deadline
        exchanged = await self._until_stopped(self.exchanger.run(
            t, active, handovers, message, deadline, math.isfinite(setup.round_deadline),
            since))
        # a closing exchange mixes nothing: no full copy is pulled
        usable = await self._until_stopped(self.book.usable(
            t, exchanged.received, deadline, pull=kind is Kind.STATE))
        for peer, round_, reason in usable.refused:
            if self.quarantine.offence(peer, round_, reason, mine=False):
                self.transport.inbox.bar(peer)
        return RoundWork(t, kind, started, active, handovers, message, exchanged,
                         usable.senders, self.edges.absorb(t, exchanged.received))

    async def mix(self, work: RoundWork) -> None:
        """Step 2: settle who took part in the round, then mix."""
        t, received = work.round, work.exchanged.received
        mixed, work.missing = self.mixer.missing(t, work.active, received, work.usable,
                                                 work.absorbed)
        work.used = tuple(sorted(mixed))
        alive = work.exchanged.alive(work.missing, self.transport.inbox.heard, self.faults)
        refused = [j for j in work.missing if self.quarantine.was_refused(t, j)]
        self.mixer.settle(t, mixed, work.missing, work.handovers, received, alive, refused)
        if not mixed and self.active(t):
            self.alone_rounds += 1
        self.quarantine.forget_through(t)
        work.prepared = await self.mixer.mix(t, self.state, work.active, mixed, work.message)
        work.exchange_s = now() - work.started
        self._waited += work.exchange_s

    async def train(self, work: RoundWork) -> None:
        """Step 3: train from the mixed state (the trainer never blocks the event loop)."""
        assert work.prepared is not None
        self.phase = Phase.TRAINING
        t0 = now()
        work.trained = await self.setup.trainer.train(work.prepared.train_from, work.round)
        work.train_s = now() - t0

    async def complete(self, work: RoundWork) -> None:
        """Step 4: FODAC's update (:meth:`Algorithm.complete`), then the fold of what the
        round's messages settled; the inbox drops the older rounds."""
        assert work.prepared is not None and work.trained is not None
        setup = self.setup
        loop = asyncio.get_running_loop()
        self.state = await loop.run_in_executor(setup.executor, setup.algorithm.complete,
                                                self.state, work.prepared, work.trained.flat)
        if work.absorbed.terms:
            await loop.run_in_executor(setup.executor, self._apply, work.absorbed)
        self.transport.inbox.discard_before(self.state.round)

    async def record(self, work: RoundWork) -> RoundReport:
        """Step 5: evaluate when due, report the round (with its traffic: the bytes moved for
        it), write its metrics line and checkpoint."""
        assert work.trained is not None
        setup = self.setup
        accuracy = test_loss = None
        done = self.state.round
        if done % setup.eval_every == 0 or done == setup.rounds:
            self.phase = Phase.EVALUATING
            accuracy, test_loss = await setup.view.evaluate(
                done, setup.algorithm.model(self.state), setup.trainer)
            self.last_accuracy, self.last_loss = accuracy, test_loss
        sent, received = self.transport.traffic(work.round)
        report = RoundReport(
            round=done, used=work.used, missing=work.missing, train_loss=work.trained.loss,
            samples=work.trained.samples, accuracy=accuracy, test_loss=test_loss,
            residual=self.residual(), exchange_s=work.exchange_s, train_s=work.train_s,
            seconds=now() - work.started, bytes_sent=sent, bytes_received=received,
        )
        self.last = report
        await self.outputs.round_done(report, self.alone_rounds,
                                      refused_total(self.peers.values()), self.checkpoint,
                                      self.on_round)
        return report

    async def fold(self, work: RoundWork) -> list[str]:
        """A closing exchange's end: fold what its messages settled into ``x`` (no mixing);
        returns the neighbours heard from."""
        t, received = work.round, work.exchanged.received
        if work.absorbed.terms:
            await asyncio.get_running_loop().run_in_executor(self.setup.executor, self._apply,
                                                             work.absorbed)
        missing = [j for j in work.active if j not in received]
        if missing:
            log.warning("round %d: no closing state from %s", t,
                        ", ".join(missing),
                        extra={"event": "closing_state_missing", "node": self.setup.node_id,
                               "round": t, "neighbour": missing})
        self.edges.record_round(t, (), {}, {}, None)
        self.transport.inbox.discard_before(t + 1)
        return [j for j in work.active if j in received]

    def _reanchor_if_due(self, t: int) -> None:
        if not self.edges.anchor_due(t):
            return
        alg = self.setup.algorithm
        tracked = alg.tracked(self.state)
        bias = float(torch.linalg.vector_norm(self.state.x - tracked))
        self._set_x(tracked.clone())
        self.edges.anchored(t)
        log.info("re-anchored at round %d (x := %s; |x - %s| was %.3g)", t, alg.tracked_field,
                 alg.tracked_field, bias,
                 extra={"event": "reanchored", "node": self.setup.node_id, "round": t})

    def _set_x(self, x: torch.Tensor) -> None:
        state = self.state
        if state.omega is state.x:  # one vector in all three fields (CDSGD and the like)
            self.state = NodeState(state.round, x, x, x)
        else:
            self.state = NodeState(state.round, x, state.omega, state.omega_prev)

    def _set_round(self, round_: int) -> None:
        state = self.state
        self.state = NodeState(round_, state.x, state.omega, state.omega_prev)

    def _apply(self, absorbed: Absorbed) -> None:
        """Add what the round's messages settled to ``x`` (a pass over the state per term:
        call it off the event loop)."""
        adjust = absorbed.adjust
        if adjust is not None:
            self._set_x(self.state.x + adjust)

    # ------------------------------------------------------------------ the end
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
                heard = await self.schedule.closing(self, self.round, Kind.FINAL, skip=silent)
                silent |= {j for j in self.mixing(self.round) if j not in heard}
                self._set_round(self.round + 1)
            self._reanchor_if_due(last)
        finally:
            self._set_round(end)  # stopped or not: its round is R
        if len(self.edges.ledger):
            log.warning("%d one-sided uses left unsettled at the end (a neighbour did not "
                        "answer the closing exchanges); dacflnode invariant settles them from "
                        "its checkpoint", len(self.edges.ledger),
                        extra={"event": "unsettled_at_end", "node": self.setup.node_id})

    async def _leave_network(self) -> None:
        """Drain: a LEAVING exchange (neighbours stop mixing this node, and its ledger is
        settled), then a HANDOVER of ``(x − tracked) / m`` to each of its ``m`` neighbours, so
        that ``Σ x = Σ tracked`` stays exact among the nodes that remain."""
        setup = self.setup
        alg = setup.algorithm
        self.phase = Phase.LEAVING
        t = self.round
        heard = await self.schedule.closing(self, t, Kind.LEAVING)
        targets = self.mixing(t)
        unsettled = len(self.edges.ledger)
        anchors: tuple[int, ...] = self.edges.header(t + 1)[1]
        if unsettled:  # the neighbours that did not answer cannot settle: ask for a re-anchor
            anchors = tuple(sorted({*anchors, self.edges.propose_anchor(t)}))
            log.warning("%d one-sided uses unsettled at leave; re-anchor proposed", unsettled,
                        extra={"event": "unsettled_at_leave", "node": setup.node_id})
        if targets:
            mass = self.state.x - alg.tracked(self.state)
            share = mass / len(targets)
            tensors = {name: share if name == "x" else torch.zeros_like(share)
                       for name in alg.exchanged}
            handover = RoundMessage(setup.node_id, t + 1, len(targets), tensors,
                                    ((t, ()),), Kind.HANDOVER, anchors)
            await self.exchanger.push_all(targets, handover, now() + setup.round_deadline)
            log.info("left the network at round %d; handed |x - %s| = %.3g to %s "
                     "(heard from %d of %d)", t, alg.tracked_field,
                     float(torch.linalg.vector_norm(mass)), ", ".join(targets), len(heard),
                     len(targets),
                     extra={"event": "left", "node": setup.node_id, "round": t,
                            "neighbour": targets})
        else:
            log.warning("left at round %d with no neighbour to hand its share to", t,
                        extra={"event": "left_alone", "node": setup.node_id, "round": t})
        await self.handshakes.stop()
        self.phase = Phase.LEFT
        await self.outputs.checkpoint(lambda: self.checkpoint(left=True))
        await self.outputs.final_model(self.state)
