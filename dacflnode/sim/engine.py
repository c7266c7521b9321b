"""How a simulation trains and evaluates its N virtual nodes: one
:class:`~dacflnode.node.training.NodeTrainer` per runner, behind one of two engines.

``sequential`` gives each runner its own :class:`~dacflnode.learning.train.LocalTrainer`, run by a
:class:`~dacflnode.node.training.ThreadedTrainer` on the event loop's thread
(:class:`OnLoopThread`): one training at a time, the exact training code of a daemon, so its
results match a deployment bit for bit. ``batched`` gives each runner a handle on one shared
:class:`~dacflnode.sim.batched.BatchedTrainer`: the handles gather the runners' calls of a round
(:class:`~dacflnode.sim.gather.RoundGather`) and train, or evaluate, all nodes at once as one
stacked model — mathematically identical, equal to float32 rounding, and several times faster
for small models. ``auto`` picks ``batched`` when the model and the partition allow it (a
built-in model, equal partition sizes).

With a :class:`RayTarget` (``simulate --ray``) either engine runs on the workers of a Ray cluster
instead (:mod:`dacflnode.sim.ray_engine`, the only module that imports Ray): each worker owns a
contiguous slice of the nodes, and the results equal the local engine's bit for bit (see there).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch
from torch import nn

from dacflnode.errors import ConfigError
from dacflnode.learning.train import LocalTrainer, TrainConfig, TrainResult, evaluate
from dacflnode.node.training import NodeTrainer, ThreadedTrainer
from dacflnode.sim.batched import BatchedTrainer, can_batch
from dacflnode.sim.gather import RoundGather

T = TypeVar("T")


@dataclass(frozen=True)
class NodeData:
    x: torch.Tensor
    y: torch.Tensor


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


class OnLoopThread(Executor):
    """Runs each job at once, on the calling thread: the event loop's.

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
                t.x, t.y, executor=OnLoopThread(),
            )
            for i, (node, d, t) in enumerate(zip(ids, data, own_tests, strict=True))
        }

    async def evaluate_one(self, model: torch.Tensor) -> tuple[float, float]:
        return await self.trainers[self._first].evaluate(model, 0)


class BatchedEngine(Engine):
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
        self.ids = list(ids)
        self.cfg = cfg
        self.test = test
        #: each node's own test set (own data), evaluated node by node; None: one shared set
        self.tests = list(tests) if tests is not None else None
        self.device = device
        self.template = copy.deepcopy(model)
        self.trainer = BatchedTrainer(model, [(d.x, d.y) for d in data], cfg, seed=seed,
                                      device=device)
        self.train_gather: RoundGather[torch.Tensor, TrainResult] = RoundGather(
            ids, self._train_all)
        self.evaluate_gather: RoundGather[torch.Tensor, tuple[float, float]] = RoundGather(
            ids, self._evaluate_all)
        self.trainers = {node: GatheredNode(self, node, i) for i, node in enumerate(ids)}

    def _stack(self, values: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return torch.stack([values[node] for node in self.ids])

    async def _train_all(
        self, round: int, starts: Mapping[str, torch.Tensor]
    ) -> dict[str, TrainResult]:
        results = self.trainer.train(self._stack(starts), round)  # on the loop thread
        return dict(zip(self.ids, results, strict=True))

    async def _evaluate_all(
        self, round: int, models: Mapping[str, torch.Tensor]
    ) -> dict[str, tuple[float, float]]:
        if self.tests is not None:  # a test set per node: one model at a time
            return {node: evaluate(self.template, models[node], t.x, t.y,
                                   local=self.trainer.local[i], device=self.device,
                                   precision=self.cfg.precision)
                    for i, (node, t) in enumerate(zip(self.ids, self.tests, strict=True))}
        results = self.trainer.evaluate(self._stack(models), self.test.x, self.test.y)
        return dict(zip(self.ids, results, strict=True))

    def local_buffers(self, index: int) -> dict[str, torch.Tensor]:
        return self.trainer.local[index]

    async def evaluate_one(self, model: torch.Tensor) -> tuple[float, float]:
        return evaluate(self.template, model, self.test.x, self.test.y,
                        local=self.trainer.local[0], device=self.device,
                        precision=self.cfg.precision)


class GatheringEngine(Protocol):
    """An engine whose runners' calls of a round are gathered into one call
    (:class:`BatchedEngine`, and the batched Ray engine)."""

    cfg: TrainConfig
    train_gather: RoundGather[torch.Tensor, TrainResult]
    evaluate_gather: RoundGather[torch.Tensor, tuple[float, float]]

    def local_buffers(self, index: int) -> dict[str, torch.Tensor]:
        """Node ``index``'s integer buffers (batch-norm step counters)."""
        ...


class GatheredNode:
    """One runner's view of a :class:`GatheringEngine`: its calls join the round's call."""

    def __init__(self, engine: GatheringEngine, node: str, index: int) -> None:
        self.engine = engine
        self.node = node
        self.index = index

    async def train(self, start: torch.Tensor, round: int) -> TrainResult:
        return await self.engine.train_gather.submit(round, self.node, start)

    async def evaluate(self, model: torch.Tensor, round: int) -> tuple[float, float]:
        return await self.engine.evaluate_gather.submit(round, self.node, model)

    def local_buffers(self) -> dict[str, torch.Tensor]:
        return self.engine.local_buffers(self.index)

    def lr_at(self, round: int) -> float:
        return self.engine.cfg.lr_at(round)


def make_engine(
    choice: str,
    ids: Sequence[str],
    model_factory: Callable[[], nn.Module],
    data: Sequence[NodeData],
    test: NodeData,
    cfg: TrainConfig,
    *,
    seed: int,
    device: torch.device,
    ray: RayTarget | None = None,
    tests: Sequence[NodeData] | None = None,
) -> Engine:
    """The engine ``choice`` (``auto``, ``batched`` or ``sequential``) for these nodes, local or,
    with ``ray``, on the workers of a Ray cluster. ``tests``: each node's own test set (nodes
    on their own data), instead of the one ``test`` set they all share."""
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
                "engine", "the batched engine needs equal data sizes on every node (partition"
                " sizes, or each node's own data); use sequential"
            )
    if ray is not None:
        if tests is not None:
            raise ConfigError(
                "ray", "--ray evaluates every node on one shared test set; nodes with test sets"
                " of their own train on the local engines (leave out --ray)")
        if device.type != "cpu":
            raise ConfigError(
                "device", f"--ray trains on the workers' CPUs, not {device}; use --device cpu"
            )
        try:
            from dacflnode.sim.ray_engine import RayEngine
        except ModuleNotFoundError as exc:
            if (exc.name or "").partition(".")[0] != "ray":
                raise
            raise ConfigError(
                "ray", f"Ray is not installed here ({exc}); pip install 'dacflnode[ray]'"
            ) from None
        return RayEngine(choice, ids, model, data, test, cfg, seed=seed, target=ray)
    if choice == "batched":
        return BatchedEngine(ids, model, data, test, cfg, seed=seed, device=device, tests=tests)
    return SequentialEngine(ids, model, data, test, cfg, seed=seed, device=device, tests=tests)
