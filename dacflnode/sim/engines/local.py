"""The engines that train in this process: ``sequential`` and ``batched``."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from dacflnode.learning.train import LocalTrainer, TrainConfig, TrainResult
from dacflnode.node.training import ThreadedTrainer
from dacflnode.sim.batched.trainer import BatchedTrainer
from dacflnode.sim.engines.base import Engine, GatheredEngine, InlineExecutor, NodeData


class SequentialEngine(Engine):
    name = "sequential"

    def __init__(
        self,
        ids: Sequence[str],
        model: nn.Module,
        data: Sequence[NodeData],
        test: NodeData,
        cfg: TrainConfig,
        *,
        seed: int,
        device: torch.device,
        tests: Sequence[NodeData] | None = None,
    ) -> None:
        # on the loop thread: the nodes train one after the other, as many daemons on many
        # machines would each train alone, with the same intra-op threads
        self._first = ids[0]
        own_tests = list(tests) if tests is not None else [test] * len(ids)
        self.trainers = {
            node: ThreadedTrainer(
                LocalTrainer(copy.deepcopy(model), d.x, d.y, cfg, seed=seed, node_index=i,
                             device=device),
                t.x, t.y, executor=InlineExecutor(),
            )
            for i, (node, d, t) in enumerate(zip(ids, data, own_tests, strict=True))
        }

    async def evaluate_one(self, model: torch.Tensor) -> tuple[float, float]:
        return await self.trainers[self._first].evaluate(model, 0)


class BatchedEngine(GatheredEngine):
    name = "batched"

    def __init__(
        self,
        ids: Sequence[str],
        model: nn.Module,
        data: Sequence[NodeData],
        test: NodeData,
        cfg: TrainConfig,
        *,
        seed: int,
        device: torch.device,
        tests: Sequence[NodeData] | None = None,
    ) -> None:
        super().__init__(ids, model, test, cfg, device=device, tests=tests)
        self.trainer = BatchedTrainer(model, [(d.x, d.y) for d in data], cfg, seed=seed,
                                      device=device)

    async def train_stacked(self, flats: torch.Tensor, round_: int) -> list[TrainResult]:
        return self.trainer.train(flats, round_)  # on the loop thread

    async def evaluate_stacked(self, flats: torch.Tensor) -> list[tuple[float, float]]:
        return self.trainer.evaluate(flats, self.test.x, self.test.y)

    def local_buffers(self, index: int) -> dict[str, torch.Tensor]:
        return self.trainer.local[index]
