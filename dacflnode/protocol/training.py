"""What a runner needs from local training, and the daemon's implementation of it.

A :class:`~dacflnode.protocol.runner.NodeRunner` never trains by itself: it hands the round's start
vector to a :class:`NodeTrainer` and awaits the result, so the same round code can run over one
model per process (the daemon), one model per virtual node trained one after the other, or all
virtual nodes trained at once as one stacked model (the simulator's engines, ``dacflnode.sim``).
Whatever trains, it must not block the event loop: the neighbours are served meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Protocol

import torch

from dacflnode.learning.train import LocalTrainer, TrainResult


class NodeTrainer(Protocol):
    """Local training and evaluation of one node, awaited by its runner."""

    async def train(self, start: torch.Tensor, round_: int) -> TrainResult:
        """Train from the flat vector ``start`` for round ``round_`` (0-based)."""
        ...

    async def evaluate(self, model: torch.Tensor, round_: int) -> tuple[float, float]:
        """``(accuracy, mean test loss)`` of the flat model ``model`` after ``round_`` rounds."""
        ...

    def local_buffers(self) -> dict[str, torch.Tensor]:
        """The node's own integer buffers (batch-norm step counters), for files."""
        ...

    def lr_at(self, round_: int) -> float:
        """The learning rate of round ``round_`` (0-based), for the metrics line."""
        ...


class ThreadedTrainer:
    """A :class:`~dacflnode.learning.train.LocalTrainer` run off the event loop.

    ``executor`` is where training and evaluation run: ``None`` means asyncio's default thread
    pool (the daemon, which must keep serving its neighbours meanwhile). The simulator's
    ``sequential`` engine passes one that runs each job in place, so its nodes train one at a
    time with the daemon's exact training code and get bit-identical results.
    """

    def __init__(
        self,
        trainer: LocalTrainer,
        test_x: torch.Tensor,
        test_y: torch.Tensor,
        *,
        executor: Executor | None = None,
    ) -> None:
        self.trainer = trainer
        self.test_x = test_x
        self.test_y = test_y
        self.executor = executor

    async def train(self, start: torch.Tensor, round_: int) -> TrainResult:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self.trainer.train, start, round_)

    async def evaluate(self, model: torch.Tensor, round_: int) -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self.trainer.evaluate, model,
                                          self.test_x, self.test_y)

    def local_buffers(self) -> dict[str, torch.Tensor]:
        return self.trainer.local

    def lr_at(self, round_: int) -> float:
        return self.trainer.cfg.lr_at(round_)


class PacedTrainer:
    """A :class:`NodeTrainer` that takes longer than its training does: after each round's
    training it waits ``pause(seconds the training took)`` more, serving its neighbours
    meanwhile. ``slowdown: F`` of a device that is slow on purpose (an experiment's slow
    node) pauses ``(F − 1)`` times the training's duration; the simulator's asynchronous runs
    give every node its modelled block time on a virtual clock this way."""

    def __init__(self, inner: NodeTrainer, pause: Callable[[float], float]) -> None:
        self.inner = inner
        self.pause = pause

    async def train(self, start: torch.Tensor, round_: int) -> TrainResult:
        began = time.perf_counter()
        result = await self.inner.train(start, round_)
        wait = self.pause(time.perf_counter() - began)
        if wait > 0:
            await asyncio.sleep(wait)
        return result

    async def evaluate(self, model: torch.Tensor, round_: int) -> tuple[float, float]:
        return await self.inner.evaluate(model, round_)

    def local_buffers(self) -> dict[str, torch.Tensor]:
        return self.inner.local_buffers()

    def lr_at(self, round_: int) -> float:
        return self.inner.lr_at(round_)


def slowed(inner: NodeTrainer, factor: float) -> NodeTrainer:
    """``inner``, ``factor`` times slower (``factor`` 1: ``inner`` itself)."""
    if factor <= 1.0:
        return inner
    return PacedTrainer(inner, lambda took: (factor - 1.0) * took)
