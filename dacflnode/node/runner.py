"""The round state machine of one node, over any :class:`~dacflnode.transport.base.Transport`.

Round ``t`` (the same algorithm code the simulator runs, :mod:`dacflnode.algorithms.rounds`):

1. *exchange* — push :meth:`Algorithm.outgoing` of the round-``t`` state, with this node's degree
   in round ``t``, to every neighbour active in round ``t``; wait for theirs (buffered by round in
   the :class:`~dacflnode.transport.base.Inbox`, so two rounds never mix);
2. *mix* — Metropolis–Hastings weights from this node's degree and the degrees the neighbours
   announced for round ``t``, then :meth:`Algorithm.prepare`;
3. *train* — local training in a worker thread, so the event loop keeps serving neighbours;
4. *complete* — :meth:`Algorithm.complete`, evaluation every few rounds (also in a thread),
   a metrics line and a checkpoint.

A neighbour that has not delivered by the round deadline is left out of that round's mix (its
weight goes to the node itself, the rule DESIGN.md §4 builds its fault repair on); the header of
the next round lists the neighbours that were used.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dacflnode.algorithms.mixing import metropolis_weights
from dacflnode.algorithms.rounds import Algorithm, NodeState
from dacflnode.learning.files import save_model
from dacflnode.learning.layout import StateLayout
from dacflnode.learning.train import LocalTrainer, evaluate
from dacflnode.node.checkpoint import save_checkpoint
from dacflnode.transport.base import HandshakeRefused, PeerUnavailable, Transport
from dacflnode.wire.codec import RoundMessage, WireError

log = logging.getLogger("dacflnode.node")

PHASES = ("starting", "waiting-for-peers", "exchanging", "training", "evaluating", "done",
          "stopping", "stopped", "failed")


class Stopped(Exception):
    """The node was asked to stop before the round could finish."""


@dataclass
class NodeSetup:
    """Everything a runner needs, already built (the daemon builds it from peers.yaml)."""

    node_id: str
    neighbours: Sequence[str]
    algorithm: Algorithm
    trainer: LocalTrainer
    layout: StateLayout
    test_x: torch.Tensor
    test_y: torch.Tensor
    rounds: int
    eval_every: int = 1
    round_deadline: float = 600.0
    hello_timeout: float = 3600.0
    active_neighbours: Callable[[int], Sequence[str]] | None = None
    state_dir: Path | None = None
    run_info: dict[str, Any] = field(default_factory=dict)


@dataclass
class RoundReport:
    round: int
    used: tuple[str, ...]
    missing: tuple[str, ...]
    train_loss: float
    accuracy: float | None
    test_loss: float | None
    residual: float
    exchange_s: float
    train_s: float
    seconds: float


class NodeRunner:
    """Runs the rounds of one node; :attr:`phase`, :attr:`state` and :attr:`last` describe it."""

    def __init__(self, setup: NodeSetup, transport: Transport, state: NodeState) -> None:
        self.setup = setup
        self.transport = transport
        self.state = state
        self.phase = "starting"
        self.last: RoundReport | None = None
        self.last_accuracy = math.nan
        self.last_loss = math.nan
        self.started = time.time()
        self._stop = asyncio.Event()
        self._used_prev: tuple[str, ...] = ()
        self._peer_rounds: dict[str, int] = {}
        self.on_round: Callable[[RoundReport], None] | None = None

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
        """Handshake, then every remaining round. Returns True when all rounds completed."""
        try:
            await self._until_stopped(self.wait_for_neighbours())
            while self.round < self.setup.rounds:
                await self.run_round(self.round)
            self.phase = "done"
            self._write_final()
            log.info("%s: all %d rounds done", self.setup.node_id, self.setup.rounds)
            return True
        except Stopped:
            self.phase = "stopped"
            log.info("%s: stopped at round %d", self.setup.node_id, self.round)
            return False

    async def _until_stopped(self, coro: Any) -> Any:
        """Await ``coro`` unless a stop request comes first (then cancel it, raise Stopped)."""
        task = asyncio.ensure_future(coro)
        stop = asyncio.ensure_future(self._stop.wait())
        done, _ = await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            stop.cancel()
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):  # abandoning it
            await task
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
                self._peer_rounds[peer] = getattr(ident, "round", 0)
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
        deadline = time.monotonic() + setup.round_deadline
        received = await self._until_stopped(self._exchange(t, active, message, deadline))
        missing = tuple(j for j in active if j not in received)
        if missing:
            log.warning("%s: round %d: no state from %s by the deadline; mixing without them",
                        setup.node_id, t, ", ".join(missing))
        self_w, row = metropolis_weights(len(active), {j: received[j].degree for j in received})
        weights = {setup.node_id: self_w, **row}
        inbox = {j: received[j].tensors for j in received}
        # mixing touches every parameter of every neighbour: off the event loop, like training
        prepared = await asyncio.to_thread(alg.prepare, self.state, setup.node_id, weights, inbox)
        exchange_s = time.perf_counter() - started

        self.phase = "training"
        t0 = time.perf_counter()
        result = await asyncio.to_thread(setup.trainer.train, prepared.train_from, t)
        train_s = time.perf_counter() - t0
        self.state = await asyncio.to_thread(alg.complete, self.state, prepared, result.flat)
        self._used_prev = tuple(sorted(received))
        self.transport.inbox.discard_before(self.state.round)

        accuracy = test_loss = None
        done = self.state.round
        if done % setup.eval_every == 0 or done == setup.rounds:
            self.phase = "evaluating"
            accuracy, test_loss = await asyncio.to_thread(
                evaluate, setup.trainer.model, alg.model(self.state), setup.test_x, setup.test_y,
                local=setup.trainer.local, device=setup.trainer.device,
            )
            self.last_accuracy, self.last_loss = accuracy, test_loss
        report = RoundReport(
            round=done, used=self._used_prev, missing=missing, train_loss=result.loss,
            accuracy=accuracy, test_loss=test_loss, residual=self.residual(),
            exchange_s=exchange_s, train_s=train_s, seconds=time.perf_counter() - started,
        )
        self.last = report
        await asyncio.to_thread(self._persist, report)
        if self.on_round is not None:
            self.on_round(report)
        return report

    async def _exchange(
        self, t: int, active: list[str], message: RoundMessage, deadline: float
    ) -> dict[str, RoundMessage]:
        inbox = self.transport.inbox
        pushes = [asyncio.ensure_future(self._push(j, message, deadline)) for j in active]
        for peer in active:  # a neighbour already past round t (we restarted): pull its state
            if self._peer_rounds.get(peer, 0) > t:
                await self._pull(peer, t)
        received = await inbox.wait(t, active, max(0.0, deadline - time.monotonic()))
        # every push ends by itself: delivered, or given up at the deadline
        await asyncio.gather(*pushes)
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
                if exc.code == "FAILED_PRECONDITION" and "already in round" in exc.message:
                    return  # the neighbour moved on; it has what it needs from us
                log.warning("%s: %s refused round %d: %s: %s", self.setup.node_id, peer,
                            message.round, exc.code, exc.message)
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 1.0)

    async def _pull(self, peer: str, t: int) -> None:
        pull = getattr(self.transport, "pull", None)
        if pull is None:
            return
        try:
            message = await pull(peer, t)
            await self.transport.inbox.put(message)
            log.info("%s: pulled round %d state of %s", self.setup.node_id, t, peer)
        except (PeerUnavailable, WireError, ValueError) as exc:
            log.warning("%s: pull of round %d from %s failed: %s", self.setup.node_id, t, peer,
                        exc)

    # ------------------------------------------------------------------ files
    def _persist(self, report: RoundReport) -> None:
        setup = self.setup
        if setup.state_dir is None:
            return
        line = {
            "round": report.round,
            "node": setup.node_id,
            "algorithm": setup.algorithm.name,
            "lr": setup.trainer.cfg.lr_at(report.round - 1),
            "train_loss": report.train_loss,
            "accuracy": report.accuracy,
            "test_loss": report.test_loss,
            "consensus_residual": report.residual,
            "neighbours_used": list(report.used),
            "neighbours_missing": list(report.missing),
            "exchange_s": round(report.exchange_s, 4),
            "train_s": round(report.train_s, 4),
            "seconds": round(report.seconds, 4),
        }
        with (setup.state_dir / "metrics.jsonl").open("a") as out:
            out.write(json.dumps(line) + "\n")
        save_checkpoint(setup.state_dir, self.state, setup.trainer.local, setup.run_info,
                        used=self._used_prev)

    def _write_final(self) -> None:
        if self.setup.state_dir is None:
            return
        save_model(self.setup.state_dir / "final.safetensors", self.setup.layout,
                   self.setup.algorithm.model(self.state), self.setup.trainer.local,
                   {"algorithm": self.setup.algorithm.name, "node": self.setup.node_id,
                    "round": str(self.state.round),
                    "fingerprint": self.setup.layout.fingerprint()})
