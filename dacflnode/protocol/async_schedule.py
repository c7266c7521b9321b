"""Asynchronous DACFL (``schedule: async``): each node trains blocks at its own pace and mixes
with whichever neighbours answer, through pairwise exchanges (docs/algorithm.md,
"Asynchronous DACFL"; the math is :mod:`dacflnode.algorithms.pairwise`).

A node's loop (:meth:`AsyncNode.run`): for each of its ``rounds`` blocks, take ``ω`` as the
block's start, train (off the event loop), fold the block into ``x`` exactly once, record the
block (evaluation, metrics line, checkpoint), and ask every neighbour with no exchange in
flight for one, giving the answers a round trip (:data:`ANSWER_WAIT_S` at most) to come
before the next block trains, so it trains from the mixed model. It never waits for a
neighbour to train: a node answers its neighbours' exchanges (:meth:`AsyncNode.answer`, the
transport's ``on_exchange``) whenever they come, training or not, and an answer that takes
longer is applied whenever it comes.

Every change of the node's state (a block's start and fold, a snapshot asked with, a transfer
answered or applied) is one step under one lock, run where the node's mixing runs, and written
in that order to the node's journal (``exchanges.jsonl``), from which ``simulate --replay``
re-runs the same computation. No lock is held across a call to a neighbour.

Exactly once: an exchange has an id; the answering node applies it when it answers and keeps
its answer to each neighbour's latest exchange, so a retry of that id (the answer was lost)
gets the same answer, not a second transfer. The asking node keeps an unanswered exchange,
snapshot and all, and asks again with it until it is answered or refused; it asks a neighbour
nothing new meanwhile. A refusal (a snapshot too stale, a node that has finished) was not
applied: nothing to undo.

The end: a node that has trained its blocks (or spent ``max_duration``) asks nothing more once
its unanswered exchanges are answered, tells each neighbour so (``EXCHANGE_DONE``), keeps
answering, and ends when every neighbour has told it the same. Then no exchange is in flight
anywhere around it: every transfer is applied at both ends, and ``Σ x = Σ τ`` holds over the
nodes; the checkpoint names ``τ`` (``omega_prev``) as the field ``x`` tracks, so ``dacflnode
invariant`` checks exactly that sum.

Restarts and departures (the edges' transfer totals, a restarted node's reconciliation, a
leaving node's handover) are :mod:`dacflnode.protocol.async_membership`'s.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from dacflnode.algorithms import pairwise
from dacflnode.algorithms.edge_flows import EdgeFlows
from dacflnode.filemodes import LOG_MODE, open_text
from dacflnode.protocol.async_compression import EdgeCodec
from dacflnode.protocol.async_guard import ExchangeGuard
from dacflnode.protocol.async_membership import JOURNAL_FILE, Membership
from dacflnode.protocol.async_parts import Asked, BlockCounts, Host, Kept
from dacflnode.protocol.clock import now
from dacflnode.protocol.phase import Phase
from dacflnode.protocol.setup import RoundReport
from dacflnode.protocol.snapshot import refused_total
from dacflnode.records.checkpoint import Checkpoint
from dacflnode.transport.base import PeerUnavailable, TransportClosed
from dacflnode.wire.errors import Reason, WireError
from dacflnode.wire.message import Kind, RoundMessage

log = logging.getLogger(__name__)

__all__ = ["JOURNAL_FILE", "AsyncNode", "Host"]

#: Seconds one exchange call may take when the node has no finite round deadline.
EXCHANGE_TIMEOUT = 60.0
#: Seconds between two tries of an unanswered exchange or notice.
RETRY_S = 0.5
#: Seconds a node waits, before a block, for the answers to the exchanges it just asked for
#: (a round trip; a neighbour answers while it trains, so this never waits for training).
ANSWER_WAIT_S = 1.0
#: Seconds between two log lines of a node that waits at its end for its neighbours.
WAITING_LOG_S = 30.0

class AsyncNode:
    """The asynchronous schedule of one :class:`~dacflnode.protocol.runner.NodeRunner`."""

    def __init__(self, runner: Host, resume: Checkpoint | None = None) -> None:
        self.runner = runner
        self.setup = runner.setup
        self.me = runner.setup.node_id
        self.neighbours = sorted(runner.setup.neighbours)
        self._lock = asyncio.Lock()
        #: the unanswered exchange of each neighbour this node asked
        self.asked: dict[str, Asked] = {}
        #: each neighbour's latest exchange this node answered, and the answer
        self.answered: dict[str, RoundMessage] = {}
        #: neighbours that told this node they are done; ``self.finished``: this node ended
        self.done_peers: set[str] = set()
        self._done_changed = asyncio.Event()
        self.finished = False
        self.counts = BlockCounts()
        #: exchanges applied, by neighbour (status, Prometheus)
        self.per_edge: Counter[str] = Counter()
        #: the neighbours whose snapshots were too many blocks away (by their block count)
        self.stale: dict[str, int] = {}
        #: seconds the node waited with nothing to train (its neighbours finishing)
        self.waited_s = 0.0
        self._tasks: dict[str, asyncio.Task[None]] = {}
        #: the share of the training block's start that ``ω`` still holds (1: none of the
        #: block's exchanges applied yet; :func:`~dacflnode.algorithms.pairwise.fold`)
        self.kept = 1.0
        self.journal: list[dict[str, Any]] = []
        #: whether the node asks for no more exchanges (its end)
        self.done_asking = False
        #: the edges' totals, restarts and departures
        self.members = Membership(self, resume)
        self._resume, self._start_state = resume, runner.state
        compression = runner.setup.compression
        #: a compressed run's snapshot references and coding (references start at the initial
        #: model a fresh node holds; a restarted node has none)
        self.codec = None if compression is None else EdgeCodec(
            compression, self.me,
            None if self.members.restarted else pairwise.vectors_of(runner.state),
            self.neighbours)
        #: the node's model at its latest block start: what the guard measures against
        self._reference = pairwise.vectors_of(runner.state)
        #: the state guard and quarantine of the exchanges (``absurd_ratio``; None: off)
        self.guard = None if runner.setup.absurd_ratio is None else ExchangeGuard(
            self.me, lambda: self._reference)
        self.neighbours = [p for p in self.neighbours if p not in self.members.left]
        self._next_id = self.members.first_id
        #: the node's latest checkpoint (states and totals read under one lock), from which a
        #: simulated restart resumes, as a daemon resumes from the file
        self.saved: Checkpoint | None = None

    # ------------------------------------------------------------------ state changes
    async def step(self, entry: dict[str, Any], change: Callable[[], Any]) -> Any:
        """Run ``change`` (which reads and replaces the runner's state) as one step, where the
        node's mixing runs, and journal ``entry``: the steps apply in the journal's order."""
        loop = asyncio.get_running_loop()

        def step() -> Any:
            result = change()
            self._journal(entry)  # (its file append, too, off the event loop)
            return result

        async with self._lock:
            return await loop.run_in_executor(self.setup.executor, step)

    def _journal(self, entry: dict[str, Any]) -> None:
        self.journal.append(entry)
        folder = self.setup.state_dir
        if folder is not None:
            with open_text(folder / JOURNAL_FILE, LOG_MODE, append=True) as out:
                out.write(json.dumps(entry) + "\n")

    @property
    def degree(self) -> int:
        return max(1, len(self.neighbours))

    def _judge(self, peer: str, blocks: int, vectors: dict[str, torch.Tensor]) -> None:
        """Refuse ``peer``'s snapshot if the guard does (run in the answering step)."""
        if self.guard is not None:
            refusal = self.guard.snapshot(peer, blocks, vectors)
            if refusal is not None:
                raise refusal

    def _offence(self, peer: str, blocks: int, exc: WireError) -> None:
        """An exchange with ``peer`` was refused: count an absurd state against the edge, and
        drop an edge quarantined at either end."""
        if self.guard is None:
            return
        if exc.reason is Reason.QUARANTINED:
            self.guard.quarantine(peer)
        elif exc.reason is not Reason.ABSURD_STATE or not self.guard.offence(peer, blocks):
            return
        self.drop_neighbour(peer)

    def new_id(self) -> int:
        exchange_id = self._next_id
        self._next_id += 1
        return exchange_id

    def last_id(self) -> int:
        """The last exchange id this node asked with (its epoch's first, less one, if none)."""
        return self._next_id - 1

    def peer_done(self, peer: str) -> None:
        self.done_peers.add(peer)
        self._done_changed.set()

    def drop_neighbour(self, peer: str) -> None:
        """``peer`` left the network or its edge is quarantined: ask it nothing new and do
        not wait for it to be done. An exchange with it already in flight runs to its end (its
        answer may be applied at the other end already)."""
        if peer in self.neighbours:
            self.neighbours.remove(peer)
        self._done_changed.set()

    @property
    def flows(self) -> EdgeFlows:
        return self.members.flows

    def _too_stale(self, theirs: int, mine: int) -> bool:
        bound = self.setup.staleness
        return bound is not None and abs(theirs - mine) > bound

    def with_edges(self, checkpoint: Checkpoint) -> Checkpoint:
        """``checkpoint`` (the runner's) with what a restart of this node needs: the edges'
        totals, the epoch of its ids, and whether the run ended settled."""
        meta = {**checkpoint.meta, **self.members.meta(self.finished)}
        return replace(checkpoint, meta=meta, flows=self.flows.tensors(),
                       tracked_name="omega_prev")

    async def _capture(self) -> Checkpoint:
        """The node's checkpoint, its states and totals read in one step (one moment), marked
        in the journal (``saved``: a replay of a restart resumes from that point, as the node
        resumes from that checkpoint)."""
        runner = self.runner

        def capture() -> Checkpoint:
            self.saved = runner.checkpoint()
            return self.saved

        saved: Checkpoint = await self.step({"event": "saved", "blocks": runner.round}, capture)
        return saved

    def edge_state(self, peer: str) -> str | None:
        """How the edge to ``peer`` stands when it is not simply in use (``status``): ``left``,
        ``quarantined`` or ``reconciling`` (after a restart); ``None`` otherwise."""
        if peer in self.members.left:
            return "left"
        if self.guard is not None and peer in self.guard.quarantined:
            return "quarantined"
        if peer in self.members.unreconciled:
            return "reconciling"
        return None

    def ahead_of(self) -> list[str]:
        """The neighbours whose last exchange was refused as too stale while behind."""
        mine = self.runner.round
        return sorted(p for p, theirs in self.stale.items() if 0 <= theirs < mine)

    # ------------------------------------------------------------------ answering
    async def answer(self, request: RoundMessage) -> RoundMessage:
        """Answer a neighbour's exchange or notice (the transport's ``on_exchange``)."""
        peer = request.sender
        if request.kind is Kind.EXCHANGE_DONE:
            self.peer_done(peer)
            return RoundMessage(self.me, self.runner.round, self.degree, {},
                                kind=Kind.EXCHANGED, exchange_id=request.exchange_id)
        if request.kind is Kind.RECONCILE:
            return await self.members.answer_reconcile(request)
        if request.kind is Kind.HANDOVER:
            return await self.members.answer_handover(request)
        kept = self.answered.get(peer)
        if kept is not None and kept.exchange_id == request.exchange_id:
            return kept  # a retry: the same answer, applied once (even if leaving since)
        self.members.check(request)  # (again in the step, under the lock)
        if self.guard is not None:
            self.guard.refuse_quarantined(peer)
        if self.finished:
            raise WireError("FAILED_PRECONDITION", f"{self.me} has ended its run",
                            Reason.FINISHED)
        mine = self.runner.round
        if self._too_stale(request.round, mine):
            self.stale[peer] = request.round
            raise WireError("FAILED_PRECONDITION", f"snapshots {abs(request.round - mine)} "
                            f"blocks apart (staleness {self.setup.staleness})", Reason.STALE)
        weight = pairwise.exchange_weight(request.degree, self.degree)
        runner = self.runner
        snapshot = dict(request.tensors)

        def change() -> RoundMessage:
            kept = self.answered.get(peer)  # (a retry that overlapped the first try)
            if kept is not None and kept.exchange_id == request.exchange_id:
                raise Kept(kept)
            self.members.check(request)
            state, codec = runner.state, self.codec
            if codec is None:
                self._judge(peer, request.round, snapshot)
                c = wire = pairwise.transfer(weight, snapshot, pairwise.vectors_of(state))
            else:
                theirs = codec.decode_snapshot(peer, request.exchange_id, snapshot,
                                               request.copy_base, request.copy_next)
                self._judge(peer, request.round, theirs[1])
                exact = pairwise.transfer(weight, theirs[1], pairwise.vectors_of(state))
                wire, c = codec.encode_transfer(request.exchange_id, peer, exact)
                codec.keep(peer, theirs)
            runner.state = pairwise.answered(state, c)
            self.flows.added(peer, c, +1.0)
            self.kept = pairwise.kept_after(self.kept, weight)
            answer = RoundMessage(self.me, state.round, self.degree, wire,
                                  kind=Kind.EXCHANGED, exchange_id=request.exchange_id,
                                  weight=weight)
            self.answered[peer] = answer  # (in the step: a retry waiting for it sees it)
            return answer

        try:
            reply: RoundMessage = await self.step(
                {"event": "answer", "id": request.exchange_id, "peer": peer,
                 "blocks": mine, "peer_blocks": request.round, "weight": weight}, change)
        except Kept as retry:
            return retry.reply
        except WireError as exc:
            self._offence(peer, request.round, exc)
            raise
        self.stale.pop(peer, None)
        self.counts.add(peer, abs(request.round - mine))
        self.per_edge[peer] += 1
        return reply

    # ------------------------------------------------------------------ asking
    def timeout(self) -> float:
        deadline = self.setup.round_deadline
        return deadline if math.isfinite(deadline) else EXCHANGE_TIMEOUT

    async def _ask_once(self, peer: str) -> bool:
        """One try of this node's exchange with ``peer`` (a new one, or the unanswered one
        again); whether it is settled (answered or refused)."""
        runner = self.runner
        pending = self.asked.get(peer)
        if pending is None and peer not in self.neighbours:
            return True  # it left, or its edge is quarantined: nothing new
        if pending is None:
            exchange_id = self.new_id()

            def snap() -> RoundMessage:
                state = runner.state
                vectors = pairwise.vectors_of(state)
                if self.codec is None:
                    return RoundMessage(self.me, state.round, self.degree, vectors,
                                        kind=Kind.EXCHANGE, exchange_id=exchange_id)
                tensors, base, made = self.codec.encode_snapshot(peer, exchange_id, vectors)
                return RoundMessage(self.me, state.round, self.degree, tensors,
                                    kind=Kind.EXCHANGE, exchange_id=exchange_id,
                                    copy_base=base, copy_next=made)

            request: RoundMessage = await self.step(
                {"event": "ask", "id": exchange_id, "peer": peer, "blocks": runner.round},
                snap)
            if runner.faults.poisons and self.codec is None:  # a fault plan's misbehaving node
                request = runner.faults.sent_to(peer, request)
            pending = self.asked[peer] = Asked(exchange_id, request,
                                               self.members.reconciliations.get(peer, 0))
        try:
            reply = await runner.transport.exchange(peer, pending.request, self.timeout())
            c = dict(reply.tensors) if self.codec is None else self.codec.decode_transfer(
                pending.id, reply.tensors, runner.state.x.numel())
            if self.guard is not None:
                refusal = await asyncio.get_running_loop().run_in_executor(
                    self.setup.executor, self.guard.answer, peer, reply.round,
                    pairwise.vectors_of(runner.state), reply.weight, c)
                if refusal is not None:
                    raise refusal
        except PeerUnavailable:
            return False
        except WireError as exc:
            self.asked.pop(peer, None)  # refused: not applied anywhere
            if self.codec is not None:
                self.codec.refused(peer, exc.reason)
            self._offence(peer, pending.request.round, exc)
            if exc.reason is Reason.STALE:
                known = self.runner.transport.stats.get(peer)
                self.stale[peer] = -1 if known is None else known.last_round_received
            log.info("exchange %d with %s refused: %s (%s)", pending.id, peer, exc.message,
                     exc.reason, extra={"event": "exchange_refused", "node": self.me,
                                        "neighbour": peer, "reason": exc.reason})
            return True
        known = runner.transport.stats.get(peer)
        if known is not None:
            known.last_round_received = max(known.last_round_received, reply.round)

        def apply() -> None:
            if self.members.reconciliations.get(peer, 0) != pending.reconciled:
                # the neighbour restarted after it answered: it adopted this node's totals,
                # which hold no part of this exchange, so it applies at neither end
                entry["dropped"] = True
                return
            runner.state = pairwise.asked(runner.state, c)
            self.flows.added(peer, c, -1.0)
            if self.codec is not None:
                self.codec.answered(peer, pending.id)
            self.kept = pairwise.kept_after(self.kept, reply.weight)

        entry: dict[str, Any] = {"event": "apply", "id": pending.id, "peer": peer,
                                 "blocks": runner.round, "peer_blocks": reply.round,
                                 "weight": reply.weight}
        await self.step(entry, apply)
        self.asked.pop(peer, None)
        self.stale.pop(peer, None)
        self.counts.add(peer, abs(reply.round - pending.request.round))
        self.per_edge[peer] += 1
        return True

    async def _ask(self, peer: str, until_settled: bool) -> None:
        while not await self._ask_once(peer):
            if not until_settled:
                return
            await asyncio.sleep(RETRY_S)

    def _ask_all(self) -> None:
        """Ask every neighbour with nothing in flight for an exchange (in the background)."""
        for peer in self.neighbours:
            if peer in self.members.unreconciled:
                continue
            task = self._tasks.get(peer)
            if task is not None and not task.done():
                continue
            self._tasks[peer] = asyncio.create_task(self._ask(peer, until_settled=False),
                                                    name=f"{self.me}-ask-{peer}")

    async def _mix_now(self) -> None:
        """Ask every neighbour for an exchange and give the answers a moment to come (a
        round trip: a neighbour answers while it trains), so that the next block trains from
        the mixed model, as a synchronous round does. A neighbour that has not answered
        within :data:`ANSWER_WAIT_S` is not waited for: its exchange goes on in the
        background and is applied when its answer comes."""
        self._ask_all()
        pending = [task for task in self._tasks.values() if not task.done()]
        if pending:
            began = now()
            await asyncio.wait(pending, timeout=ANSWER_WAIT_S)
            self.waited_s += now() - began

    # ------------------------------------------------------------------ the loop
    async def run(self) -> bool:
        """Train the remaining blocks, then end settled (see the module docstring); False
        when the node left the network instead (``stop --drain``)."""
        runner, setup = self.runner, self.setup
        began = now()
        try:
            await self.members.reconcile()
            # what a restart now would resume from: the checkpoint this process started from,
            # or nothing (the initial model), as for a daemon
            self.saved = self._resume if self._resume is not None else replace(
                runner.checkpoint(), state=self._start_state, flows={})
            while runner.round < setup.rounds:
                if runner.leaving:
                    await self._leave()
                    return False
                await self._mix_now()
                if (setup.max_duration is not None
                        and now() - began >= setup.max_duration):
                    log.info("max_duration %gs reached after %d blocks", setup.max_duration,
                             runner.round, extra={"event": "max_duration", "node": self.me,
                                                  "round": runner.round})
                    break
                await self._block()
            await self._end()
            return True
        finally:
            for task in self._tasks.values():
                task.cancel()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
            await self.members.cancel()

    async def _block(self) -> None:
        runner, setup = self.runner, self.setup
        started = now()
        b = runner.round
        runner.phase = Phase.TRAINING
        def begin() -> torch.Tensor:
            self.kept = 1.0
            self._reference = pairwise.vectors_of(runner.state)
            return runner.state.omega

        start: torch.Tensor = await self.step({"event": "train", "block": b}, begin)
        trained = await setup.trainer.train(start, b)
        train_s = now() - started

        entry: dict[str, Any] = {"event": "fold", "block": b + 1}

        def fold() -> None:
            entry["kept"] = self.kept  # (read in the step: no exchange comes in between)
            runner.state = pairwise.fold(runner.state, start, trained.flat, self.kept)

        await self.step(entry, fold)
        done = runner.round
        accuracy = test_loss = None
        if done % setup.eval_every == 0 or done == setup.rounds:
            runner.phase = Phase.EVALUATING
            accuracy, test_loss = await setup.view.evaluate(done, runner.state.x, setup.trainer)
            runner.last_accuracy, runner.last_loss = accuracy, test_loss
        sent, received = runner.transport.traffic(done)
        counts, self.counts = self.counts, BlockCounts()
        report = RoundReport(
            round=done, used=tuple(sorted(counts.peers)), missing=(),
            train_loss=trained.loss, samples=trained.samples, accuracy=accuracy,
            test_loss=test_loss, residual=runner.residual(), exchange_s=0.0, train_s=train_s,
            seconds=now() - started, bytes_sent=sent, bytes_received=received,
            exchanges=counts.exchanges, staleness=counts.staleness)
        runner.last = report
        saved = await self._capture()
        await runner.outputs.round_done(report, runner.alone_rounds,
                                        refused_total(runner.peers.values()), lambda: saved,
                                        runner.on_round)

    async def _end(self) -> None:
        """Settle what was asked, tell every neighbour this node is done, answer until every
        neighbour is done too (then every transfer around it is applied at both ends)."""
        runner = self.runner
        runner.phase = Phase.CLOSING
        waited = now()
        for task in self._tasks.values():
            await asyncio.gather(task, return_exceptions=True)
        await self.members.reconciled()  # every edge exact again
        await asyncio.gather(*(self._ask(peer, until_settled=True)
                               for peer in list(self.asked)))
        self.done_asking = True
        await asyncio.gather(*(self._notify(peer) for peer in self.neighbours))
        while not self.done_peers >= set(self.neighbours):
            self._done_changed.clear()
            try:
                async with asyncio.timeout(WAITING_LOG_S):
                    await self._done_changed.wait()
            except TimeoutError:  # say who the node waits for (one may be down for good)
                log.warning("trained all blocks; waiting for %s to finish",
                            ", ".join(sorted(set(self.neighbours) - self.done_peers)),
                            extra={"event": "waiting_for_neighbours", "node": self.me,
                                   "round": runner.round})
        self.finished = True
        self.waited_s += now() - waited
        await self.step({"event": "settle"}, lambda: None)  # (the journal's end)

    async def _leave(self) -> None:
        """Drain (``stop --drain``): settle what was asked, refuse new exchanges, hand each
        neighbour this node's total of their edge (so ``Σ x = Σ τ`` holds over the nodes that
        stay), then end as a node that left."""
        runner = self.runner
        runner.phase = Phase.LEAVING
        for task in self._tasks.values():
            await asyncio.gather(task, return_exceptions=True)
        await self.members.reconciled()
        await asyncio.gather(*(self._ask(peer, until_settled=True)
                               for peer in list(self.asked)))
        self.done_asking = True
        await self.step({"event": "leaving", "blocks": runner.round},
                        lambda: setattr(self.members, "leaving", True))
        took = await self.members.hand_over(list(self.neighbours))
        log.info("left the network after %d blocks; handed each edge's share to %s",
                 runner.round, ", ".join(took) or "nobody",
                 extra={"event": "left", "node": self.me, "round": runner.round,
                        "neighbour": took})
        self.finished = True
        runner.phase = Phase.LEFT
        await runner.outputs.checkpoint(lambda: runner.checkpoint(left=True))
        await runner.outputs.final_model(runner.state)

    async def _notify(self, peer: str) -> None:
        """Tell ``peer`` this node is done (until it acknowledges, or has ended itself)."""
        notice = RoundMessage(self.me, self.runner.round, self.degree, {},
                              kind=Kind.EXCHANGE_DONE, exchange_id=0)
        while True:
            try:
                await self.runner.transport.exchange(peer, notice, self.timeout())
                return
            except WireError as exc:
                if exc.reason is Reason.FINISHED:
                    return
                log.warning("done notice to %s refused: %s", peer, exc.message,
                            extra={"event": "done_notice_refused", "node": self.me,
                                   "neighbour": peer})
                return
            except (PeerUnavailable, TransportClosed):
                await asyncio.sleep(RETRY_S)
