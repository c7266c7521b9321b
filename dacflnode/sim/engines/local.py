"""The engines that train in this process: ``sequential`` and ``batched``."""

from __future__ import annotations

import copy

import torch
from torch import nn

from dacflnode.learning.train import LocalTrainer, TrainConfig, TrainResult
from dacflnode.protocol.training import ThreadedTrainer
from dacflnode.sim.batched.trainer import BatchedTrainer
from dacflnode.sim.engines.base import Engine, GatheredEngine, InlineExecutor, NodeSet


class SequentialEngine(Engine):
    """A :class:`~dacflnode.learning.train.LocalTrainer` per node, all run on the loop's thread."""

    name = "sequential"

    def __init__(self, nodes: NodeSet, model: nn.Module, cfg: TrainConfig, *, seed: int,
                 device: torch.device) -> None:
        # on the loop thread: the nodes train one after the other, as many daemons on many
        # machines would each train alone, with the same intra-op threads
        self._first = nodes.ids[0]
        tests = nodes.tests if nodes.tests is not None else [nodes.test] * len(nodes.ids)
        self.trainers = {
            node: ThreadedTrainer(
                LocalTrainer(copy.deepcopy(model), d.x, d.y, cfg, seed=seed, node_index=i,
                             device=device),
                t.x, t.y, executor=InlineExecutor(),
            )
            for i, (node, d, t) in enumerate(zip(nodes.ids, nodes.data, tests, strict=True))
        }

    async def evaluate_one(self, model: torch.Tensor) -> tuple[float, float]:
        return await self.trainers[self._first].evaluate(model, 0)


class BatchedEngine(GatheredEngine):
    """One :class:`~dacflnode.sim.batched.trainer.BatchedTrainer` for all nodes, on the loop's
    thread (its groups of nodes on threads of their own)."""

    name = "batched"

    def __init__(self, nodes: NodeSet, model: nn.Module, cfg: TrainConfig, *, seed: int,
                 device: torch.device) -> None:
        super().__init__(nodes, model, cfg, device)
        self.trainer = BatchedTrainer(model, [(d.x, d.y) for d in nodes.data], cfg, seed=seed,
                                      device=device)

    async def train_stacked(self, flats: torch.Tensor, round_: int) -> list[TrainResult]:
        return self.trainer.train(flats, round_)  # on the loop thread

    async def evaluate_stacked(self, flats: torch.Tensor) -> list[tuple[float, float]]:
        return self.trainer.evaluate(flats, self.test.x, self.test.y)

    def local_buffers(self, index: int) -> dict[str, torch.Tensor]:
        return self.trainer.local[index]
