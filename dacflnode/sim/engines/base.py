"""What every engine is, and the one base of the engines that gather a round's calls.

:class:`Engine` is what the simulator uses: a trainer per node id, the evaluation of one model (a
god node's network average), and ``close``. :class:`GatheredEngine` is the base of the engines
that train, or evaluate, all nodes of a round in one call (the local batched engine and the Ray
engines): it owns the gathering of the runners' calls, the stacking of their vectors into one
``[N, P]`` tensor, and every evaluation such an engine makes in this process.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn

from dacflnode.errors import ConfigError
from dacflnode.learning.train import TrainConfig, TrainResult, evaluate
from dacflnode.protocol.training import NodeTrainer
from dacflnode.sim.gather import RoundGather

T = TypeVar("T")


@dataclass(frozen=True)
class NodeData:
    x: torch.Tensor
    y: torch.Tensor


@dataclass(frozen=True)
class NodeSet:
    """The simulated nodes an engine trains: their ids, each one's training data, and what they
    are evaluated on: one shared ``test`` set or, with ``tests``, each node's own (nodes on
    their own data)."""

    ids: Sequence[str]
    data: Sequence[NodeData]
    test: NodeData
    tests: Sequence[NodeData] | None = None


@dataclass(frozen=True)
class RayTarget:
    """Where ``simulate --ray`` trains: a Ray cluster and how many workers (actors) to use.

    ``address`` is ``local`` (start a Ray instance in this process, with ``workers`` CPUs, or as
    many as the machine has) or a running cluster's ``HOST:PORT`` (``ray start --head``).
    ``workers``: ``None`` means one per CPU of the cluster; at most one per node either way.
    """

    address: str
    workers: int | None = None

    def __post_init__(self) -> None:
        if not self.address.strip():
            raise ConfigError("ray", "give a cluster address HOST:PORT, or local")
        if self.workers is not None and self.workers < 1:
            raise ConfigError("ray_workers", f"must be >= 1, got {self.workers}")


class InlineExecutor(Executor):
    """Runs each job at once, on the calling thread (in the simulator: the event loop's).

    Simulated nodes have no neighbours on the network to serve while one trains, so the
    engines train where the loop runs; a worker thread would only add a hand-off per call
    (``benchmarks/bench_train_thread.py`` measures what the thread itself costs training).
    """

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future


class Engine(ABC):
    """The trainers of all simulated nodes, by node id."""

    name = ""
    trainers: dict[str, NodeTrainer]

    @abstractmethod
    async def evaluate_one(self, model: torch.Tensor) -> tuple[float, float]:
        """Evaluate one model (a god node's network average) with the first node's buffers."""

    def close(self) -> None:
        """Release what the engine holds outside this process (a Ray engine's workers)."""
        return None


class GatheredEngine(Engine):
    """An engine whose runners' calls of a round are gathered into one call on all nodes.

    Each runner's trainer is a :class:`GatheredNode`; when every node has called, the round's
    vectors are stacked in the order of ``ids`` and handed to :meth:`train_stacked` or
    :meth:`evaluate_stacked`, which subclasses implement. Evaluations of one model at a time (a
    god node's network average; each node on its own test set) run here, in this process, with
    the template model, a node's buffers and the run's precision.

    Nodes with test sets of their own (``nodes.tests``) are evaluated node by node; otherwise
    every node is evaluated on the shared ``nodes.test``, stacked.
    """

    def __init__(self, nodes: NodeSet, model: nn.Module, cfg: TrainConfig, device: torch.device
                 ) -> None:
        self.ids = list(nodes.ids)
        self.cfg = cfg
        self.test = nodes.test
        self.tests = list(nodes.tests) if nodes.tests is not None else None
        self.device = device
        self.template = copy.deepcopy(model)
        self.train_gather: RoundGather[torch.Tensor, TrainResult] = RoundGather(
            self.ids, self._train_all)
        self.evaluate_gather: RoundGather[torch.Tensor, tuple[float, float]] = RoundGather(
            self.ids, self._evaluate_all)
        self.trainers = {node: GatheredNode(self, node, i) for i, node in enumerate(self.ids)}

    @abstractmethod
    async def train_stacked(self, flats: torch.Tensor, round_: int) -> list[TrainResult]:
        """Train every node from its row of ``flats`` ``[N, P]``; the results in node order."""

    @abstractmethod
    async def evaluate_stacked(self, flats: torch.Tensor) -> list[tuple[float, float]]:
        """``(accuracy, loss)`` of every row of ``flats`` ``[N, P]`` on the shared test set."""

    @abstractmethod
    def local_buffers(self, index: int) -> dict[str, torch.Tensor]:
        """Node ``index``'s integer buffers (batch-norm step counters)."""

    def _stack(self, values: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return torch.stack([values[node] for node in self.ids])

    async def _train_all(
        self, round_: int, starts: Mapping[str, torch.Tensor]
    ) -> dict[str, TrainResult]:
        results = await self.train_stacked(self._stack(starts), round_)
        return dict(zip(self.ids, results, strict=True))

    async def _evaluate_all(
        self, round_: int, models: Mapping[str, torch.Tensor]
    ) -> dict[str, tuple[float, float]]:
        if self.tests is not None:  # a test set per node: one model at a time
            return {node: self.evaluate_model(models[node], t, i)
                    for i, (node, t) in enumerate(zip(self.ids, self.tests, strict=True))}
        results = await self.evaluate_stacked(self._stack(models))
        return dict(zip(self.ids, results, strict=True))

    def evaluate_model(self, model: torch.Tensor, test: NodeData, index: int
                       ) -> tuple[float, float]:
        """``(accuracy, loss)`` of one flat model on ``test``, with node ``index``'s buffers."""
        return evaluate(self.template, model, test.x, test.y, local=self.local_buffers(index),
                        device=self.device, precision=self.cfg.precision)

    async def evaluate_one(self, model: torch.Tensor) -> tuple[float, float]:
        return self.evaluate_model(model, self.test, 0)


class GatheredNode:
    """One runner's view of a :class:`GatheredEngine`: its calls join the round's call."""

    def __init__(self, engine: GatheredEngine, node: str, index: int) -> None:
        self.engine = engine
        self.node = node
        self.index = index

    async def train(self, start: torch.Tensor, round_: int) -> TrainResult:
        return await self.engine.train_gather.submit(round_, self.node, start)

    async def evaluate(self, model: torch.Tensor, round_: int) -> tuple[float, float]:
        return await self.engine.evaluate_gather.submit(round_, self.node, model)

    def local_buffers(self) -> dict[str, torch.Tensor]:
        return self.engine.local_buffers(self.index)

    def lr_at(self, round_: int) -> float:
        return self.engine.cfg.lr_at(round_)
