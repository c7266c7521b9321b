"""The round state machine of one node, over any :class:`~dacflnode.transport.base.Transport`.

Round ``t`` (the algorithm code of :mod:`dacflnode.algorithms.rounds`, see docs/algorithm.md):

1. *exchange* — push :meth:`Algorithm.outgoing` of the round-``t`` state, with this node's degree
   in round ``t``, to every neighbour active in round ``t``; wait for theirs (buffered by round in
   the :class:`~dacflnode.transport.base.Inbox`, so two rounds never mix);
2. *mix* — the :class:`~dacflnode.node.policies.MixingPolicy`'s weights (a daemon's:
   Metropolis–Hastings from the degrees the neighbours announced), then :meth:`Algorithm.prepare`;
3. *train* — the :class:`~dacflnode.node.training.NodeTrainer`, off the event loop, so the node
   keeps serving its neighbours;
4. *complete* — :meth:`Algorithm.complete`, evaluation every few rounds through the
   :class:`~dacflnode.node.policies.ModelView`, a metrics line and (optionally) a checkpoint.

A neighbour that has not delivered by the round deadline is left out of that round's mix (its
weight goes to the node itself; docs/faults.md says what that does to the consensus invariant);
the header of the next round lists the neighbours that were used.

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
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from dacflnode.algorithms.rounds import Algorithm, NodeState
from dacflnode.config import DAEMON_DEFAULTS
from dacflnode.learning.files import save_model
from dacflnode.learning.layout import StateLayout
from dacflnode.node.checkpoint import save_checkpoint
from dacflnode.node.metrics_log import METRICS_FILE, append_line
from dacflnode.node.policies import Metropolis, MixingPolicy, ModelView, OwnModel
from dacflnode.node.training import NodeTrainer
from dacflnode.transport.base import HandshakeRefused, PeerUnavailable, Transport
from dacflnode.wire.codec import RoundMessage
from dacflnode.wire.errors import Reason, WireError
from dacflnode.wire.state_guard import ABSURD_RATIO, DistanceGuard

log = logging.getLogger("dacflnode.node")

T = TypeVar("T")

PHASES = ("starting", "waiting-for-peers", "exchanging", "training", "evaluating", "done",
          "stopping", "stopped", "failed")


class Stopped(Exception):
    """The node was asked to stop before the round could finish."""


@dataclass
class NodeSetup:
    """Everything a runner needs, already built (the daemon builds it from peers.yaml, the
    simulator from its run settings).

    ``round_deadline`` may be ``math.inf``: wait for every neighbour, however long (a simulation
    without faults). ``checkpoints`` turns the per-round checkpoint off; ``metrics.jsonl`` and
    ``final.safetensors`` are written whenever ``state_dir`` is set. ``executor`` is where mixing
    and completion run: ``None`` (asyncio's default thread pool) keeps the event loop free to
    serve the neighbours; a process that has nothing else to serve may run them in place.
    """

    node_id: str
    neighbours: Sequence[str]
    algorithm: Algorithm
    trainer: NodeTrainer
    layout: StateLayout
    rounds: int
    eval_every: int = 1
    round_deadline: float = DAEMON_DEFAULTS.round_deadline
    hello_timeout: float = DAEMON_DEFAULTS.hello_timeout
    active_neighbours: Callable[[int], Sequence[str]] | None = None
    mixing: MixingPolicy = field(default_factory=Metropolis)
    view: ModelView = field(default_factory=OwnModel)
    state_dir: Path | None = None
    checkpoints: bool = True
    executor: Executor | None = None
    run_info: dict[str, str] = field(default_factory=dict)
    #: Refuse a neighbour's state farther than this many norms of the node's own (see
    #: :mod:`dacflnode.wire.state_guard`); ``None`` turns the guard off.
    absurd_ratio: float | None = ABSURD_RATIO


@dataclass
class RoundReport:
    round: int
    used: tuple[str, ...]
    missing: tuple[str, ...]
    train_loss: float
    samples: int
    accuracy: float | None
    test_loss: float | None
    residual: float
    exchange_s: float
    train_s: float
    seconds: float


class NodeRunner:
    """Runs the rounds of one node; :attr:`phase`, :attr:`state` and :attr:`last` describe it.

    ``used_prev`` names the neighbours whose state went into the round before ``state.round``
    (a node resumed from its checkpoint passes the checkpoint's list, so its first header says
    the same as it would have without the restart).
    """

    def __init__(
        self, setup: NodeSetup, transport: Transport, state: NodeState,
        used_prev: Sequence[str] = (),
    ) -> None:
        self.setup = setup
        self.transport = transport
        self.state = state
        self.phase = "starting"
        self.last: RoundReport | None = None
        self.last_accuracy = math.nan
        self.last_loss = math.nan
        self.started = time.time()
        self._stop = asyncio.Event()
        self._used_prev: tuple[str, ...] = tuple(sorted(used_prev))
        self._peer_rounds: dict[str, int] = {}
        self.on_round: Callable[[RoundReport], None] | None = None
        #: The node's latest outgoing state: what the guard measures neighbours' states against.
        self._reference: Mapping[str, torch.Tensor] = setup.algorithm.outgoing(state)
        if setup.absurd_ratio is not None:
            transport.inbox.guard = DistanceGuard(lambda: self._reference, setup.absurd_ratio)

    # ------------------------------------------------------------------ control
    @property
    def round(self) -> int:
        """Rounds completed = the round being worked on."""
        return self.state.round

    def request_stop(self) -> None:
        if not self._stop.is_set():
            log.info("%s: stop requested in round %d (%s)", self.setup.node_id, self.round,
                     self.phase)
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def residual(self) -> float:
        """``‖x_i − ω_i‖``: how far the node's estimate is from its own latest model."""
        return float(torch.linalg.vector_norm(self.state.x - self.state.omega))

    def active(self, t: int) -> list[str]:
        if self.setup.active_neighbours is None:
            return sorted(self.setup.neighbours)
        return sorted(self.setup.active_neighbours(t))

    # ------------------------------------------------------------------ run
    async def run(self) -> bool:
        """Handshake, then every remaining round. Returns True when all rounds completed,
        False when a stop request ended the run first."""
        try:
            await self._until_stopped(self.wait_for_neighbours())
            while self.round < self.setup.rounds:
                await self.run_round(self.round)
            self.phase = "done"
            await self._write_final()
            log.info("%s: all %d rounds done", self.setup.node_id, self.setup.rounds)
            return True
        except Stopped:
            self.phase = "stopped"
            log.info("%s: stopped at round %d", self.setup.node_id, self.round)
            return False

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
        """Handshake with every neighbour; they may start in any order, minutes apart."""
        self.phase = "waiting-for-peers"
        deadline = time.monotonic() + self.setup.hello_timeout
        pending = set(self.setup.neighbours)
        delay = 0.05
        while pending:
            for peer in sorted(pending):
                try:
                    ident = await self.transport.hello(peer)
                except PeerUnavailable:
                    continue
                except HandshakeRefused as exc:
                    raise RuntimeError(f"neighbour {peer} refused or was refused: {exc}") from exc
                pending.discard(peer)
                self._peer_rounds[peer] = ident.round
                log.info("%s: neighbour %s is up", self.setup.node_id, peer)
            if not pending:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"neighbours {', '.join(sorted(pending))} did not answer within "
                    f"{self.setup.hello_timeout:.0f}s"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def run_round(self, t: int) -> RoundReport:
        setup = self.setup
        alg = setup.algorithm
        started = time.perf_counter()
        self.phase = "exchanging"
        active = self.active(t)
        message = RoundMessage(setup.node_id, t, len(active), alg.outgoing(self.state),
                               self._used_prev)
        self._reference = message.tensors
        deadline = time.monotonic() + setup.round_deadline
        received = await self._until_stopped(self._exchange(t, active, message, deadline))
        missing = tuple(j for j in active if j not in received)
        if missing:
            log.warning("%s: round %d: no state from %s by the deadline; mixing without them",
                        setup.node_id, t, ", ".join(missing))
        weights = setup.mixing.weights(setup.node_id, t, len(active),
                                       {j: received[j].degree for j in received})
        inbox = {j: received[j].tensors for j in received}
        # mixing touches every parameter of every neighbour: off the event loop, like training
        loop = asyncio.get_running_loop()
        prepared = await loop.run_in_executor(setup.executor, alg.prepare, self.state,
                                              setup.node_id, weights, inbox)
        exchange_s = time.perf_counter() - started

        self.phase = "training"
        t0 = time.perf_counter()
        result = await setup.trainer.train(prepared.train_from, t)
        train_s = time.perf_counter() - t0
        self.state = await loop.run_in_executor(setup.executor, alg.complete, self.state,
                                                prepared, result.flat)
        self._used_prev = tuple(sorted(received))
        self.transport.inbox.discard_before(self.state.round)

        accuracy = test_loss = None
        done = self.state.round
        if done % setup.eval_every == 0 or done == setup.rounds:
            self.phase = "evaluating"
            accuracy, test_loss = await setup.view.evaluate(done, alg.model(self.state),
                                                            setup.trainer)
            self.last_accuracy, self.last_loss = accuracy, test_loss
        report = RoundReport(
            round=done, used=self._used_prev, missing=missing, train_loss=result.loss,
            samples=result.samples, accuracy=accuracy, test_loss=test_loss,
            residual=self.residual(), exchange_s=exchange_s, train_s=train_s,
            seconds=time.perf_counter() - started,
        )
        self.last = report
        if setup.state_dir is not None:
            await asyncio.to_thread(self._persist, report, setup.state_dir)
        if self.on_round is not None:
            self.on_round(report)
        return report

    async def _exchange(
        self, t: int, active: list[str], message: RoundMessage, deadline: float
    ) -> dict[str, RoundMessage]:
        """Push to and hear from the round's active neighbours; every push ends with the round
        (delivered, given up at the deadline, or cancelled with the exchange)."""
        inbox = self.transport.inbox
        async with asyncio.TaskGroup() as pushes:
            for peer in active:
                pushes.create_task(self._push(peer, message, deadline))
            for peer in active:  # a neighbour already past round t (we restarted): pull its state
                if self._peer_rounds.get(peer, 0) > t:
                    await self._pull(peer, t, deadline)
            received = await inbox.wait(t, active, max(0.0, deadline - time.monotonic()))
        return received

    async def _push(self, peer: str, message: RoundMessage, deadline: float) -> None:
        delay = 0.05
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning("%s: round %d state not delivered to %s by the deadline",
                            self.setup.node_id, message.round, peer)
                return
            try:
                await self.transport.push(peer, message, timeout=remaining)
                return
            except PeerUnavailable:
                pass
            except WireError as exc:
                if exc.reason in (Reason.ROUND_PASSED, Reason.DUPLICATE):
                    return  # the neighbour moved on, or already has this state (it pulled it)
                log.warning("%s: %s refused round %d: %s (%s): %s", self.setup.node_id, peer,
                            message.round, exc.code, exc.reason, exc.message)
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 1.0)

    async def _pull(self, peer: str, t: int, deadline: float) -> None:
        """Pull ``peer``'s round-``t`` state, only called when ``peer`` is past round ``t``: it
        no longer pushes that round, so the pull cannot race a push of it (if one did land,
        the inbox keeps the first and refuses the second as a duplicate: no harm). The pulled
        state passes the inbox's guard like a pushed one."""
        try:
            message = await self.transport.pull(
                peer, t, timeout=max(0.0, min(deadline - time.monotonic(), 30.0)))
            await self.transport.inbox.put(message)
            log.info("%s: pulled round %d state of %s", self.setup.node_id, t, peer)
        except (PeerUnavailable, WireError) as exc:
            log.warning("%s: pull of round %d from %s failed: %s", self.setup.node_id, t, peer,
                        exc)

    # ------------------------------------------------------------------ files
    def _persist(self, report: RoundReport, state_dir: Path) -> None:
        setup = self.setup
        append_line(state_dir / METRICS_FILE, {
            "round": report.round,
            "node": setup.node_id,
            "algorithm": setup.algorithm.name,
            "lr": setup.trainer.lr_at(report.round - 1),
            "train_loss": report.train_loss,
            "samples": report.samples,
            "accuracy": report.accuracy,
            "test_loss": report.test_loss,
            "consensus_residual": report.residual,
            "neighbours_used": list(report.used),
            "neighbours_missing": list(report.missing),
            "exchange_s": round(report.exchange_s, 4),
            "train_s": round(report.train_s, 4),
            "seconds": round(report.seconds, 4),
        })
        if setup.checkpoints:
            save_checkpoint(state_dir, self.state, setup.trainer.local_buffers(),
                            setup.run_info, used=self._used_prev)

    async def _write_final(self) -> None:
        setup = self.setup
        model = await setup.view.final(self.state.round, setup.algorithm.model(self.state))
        if setup.state_dir is None:
            return
        meta = {"algorithm": setup.algorithm.name, "node": setup.node_id,
                "round": str(self.state.round), "fingerprint": setup.layout.fingerprint()}
        await asyncio.to_thread(save_model, setup.state_dir / "final.safetensors", setup.layout,
                                model, setup.trainer.local_buffers(), meta)
