"""How a simulation trains and evaluates its N virtual nodes.

``sequential`` runs one :class:`~dacflnode.learning.train.LocalTrainer` per node, one after the
other — the exact code path a daemon takes, so its results match a deployment bit for bit.
``batched`` trains all nodes at once as one stacked model
(:class:`~dacflnode.learning.batched.BatchedTrainer`); mathematically identical, numerically equal
to float32 rounding, and several times faster for small models. ``auto`` picks ``batched`` when
the model and the partition allow it (a built-in model, equal partition sizes).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from dacflnode.errors import ConfigError
from dacflnode.learning.batched import BatchedTrainer, can_batch
from dacflnode.learning.train import LocalTrainer, TrainConfig, TrainResult, evaluate


@dataclass(frozen=True)
class NodeData:
    x: torch.Tensor
    y: torch.Tensor


class Engine(ABC):
    name = ""
    template: nn.Module
    test: NodeData
    device: torch.device

    @abstractmethod
    def train(self, starts: Sequence[torch.Tensor], round: int) -> list[TrainResult]:
        raise NotImplementedError

    @abstractmethod
    def evaluate(self, models: Sequence[torch.Tensor]) -> list[tuple[float, float]]:
        raise NotImplementedError

    def evaluate_one(self, model: torch.Tensor) -> tuple[float, float]:
        """Evaluate one model (a god node's average), with node 0's local buffers."""
        return evaluate(
            self.template,
            model,
            self.test.x,
            self.test.y,
            local=self.local_buffers(0),
            device=self.device,
        )

    @abstractmethod
    def local_buffers(self, node: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError


class SequentialEngine(Engine):
    name = "sequential"

    def __init__(
        self,
        model: nn.Module,
        data: Sequence[NodeData],
        test: NodeData,
        cfg: TrainConfig,
        *,
        seed: int,
        device: torch.device,
    ) -> None:
        self.trainers = [
            LocalTrainer(
                copy.deepcopy(model), d.x, d.y, cfg, seed=seed, node_index=i, device=device
            )
            for i, d in enumerate(data)
        ]
        self.test = test
        self.device = device
        self.template = self.trainers[0].model

    def train(self, starts: Sequence[torch.Tensor], round: int) -> list[TrainResult]:
        return [t.train(s, round) for t, s in zip(self.trainers, starts, strict=True)]

    def evaluate(self, models: Sequence[torch.Tensor]) -> list[tuple[float, float]]:
        out = []
        for trainer, flat in zip(self.trainers, models, strict=True):
            out.append(
                evaluate(
                    trainer.model,
                    flat,
                    self.test.x,
                    self.test.y,
                    local=trainer.local,
                    device=self.device,
                )
            )
        return out

    def local_buffers(self, node: int) -> dict[str, torch.Tensor]:
        return self.trainers[node].local


class BatchedEngine(Engine):
    name = "batched"

    def __init__(
        self,
        model: nn.Module,
        data: Sequence[NodeData],
        test: NodeData,
        cfg: TrainConfig,
        *,
        seed: int,
        device: torch.device,
    ) -> None:
        self.trainer = BatchedTrainer(
            model, [(d.x, d.y) for d in data], cfg, seed=seed, device=device
        )
        self.test = test
        self.device = device
        self.template = copy.deepcopy(model)

    def train(self, starts: Sequence[torch.Tensor], round: int) -> list[TrainResult]:
        return self.trainer.train(torch.stack(list(starts)), round)

    def evaluate(self, models: Sequence[torch.Tensor]) -> list[tuple[float, float]]:
        return self.trainer.evaluate(torch.stack(list(models)), self.test.x, self.test.y)

    def local_buffers(self, node: int) -> dict[str, torch.Tensor]:
        return self.trainer.local[node]


def make_engine(
    choice: str,
    model_factory: Callable[[], nn.Module],
    data: Sequence[NodeData],
    test: NodeData,
    cfg: TrainConfig,
    *,
    seed: int,
    device: torch.device,
) -> Engine:
    model = model_factory()
    equal = len({int(d.y.numel()) for d in data}) == 1
    if choice == "auto":
        choice = "batched" if can_batch(model) and equal else "sequential"
    if choice == "batched":
        if not can_batch(model):
            raise ConfigError(
                "engine", "the batched engine supports the built-in models only; use sequential"
            )
        if not equal:
            raise ConfigError(
                "engine", "the batched engine needs equal partition sizes; use sequential"
            )
        return BatchedEngine(model, data, test, cfg, seed=seed, device=device)
    return SequentialEngine(model, data, test, cfg, seed=seed, device=device)
