"""N virtual nodes in one process: N daemons' :class:`~dacflnode.node.runner.NodeRunner` s over
the in-memory transport, in one event loop.

Exchange, mixing, the round bookkeeping, the metrics lines and the final files are the runner's
own code; the simulator only builds each node's :class:`~dacflnode.node.runner.NodeSetup` with
the policies a global view allows (see :mod:`dacflnode.sim.global_view`) and a trainer from the
chosen engine (:mod:`dacflnode.sim.engine`):

* graph topologies: the daemon's Metropolis weights and active-edge rule, so ``launch`` and
  ``simulate --engine sequential`` produce the same models;
* matrix topologies (dense, sparse, uniform, custom): node ``i`` mixes with row ``i`` of ``W(t)``;
* FedAvg: every node mixes all nodes with data-size weights (the server average);
* D-PSGD and FedAvg are evaluated, and save, the network average (the god node).

No round has a deadline (a simulation has no faults), no checkpoint is written per round, and
the absurd-state guard is off (every node is this process's own; the guard protects a daemon from
the network, see docs/security.md).
Mixing, completion and training run on the event loop's thread
(:class:`~dacflnode.sim.engine.OnLoopThread`): there is no network to serve meanwhile, so a
thread hop per call would buy nothing (docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from dacflnode.algorithms import graphs
from dacflnode.algorithms.rounds import Algorithm, NodeState, make_algorithm
from dacflnode.algorithms.topology import GRAPH_KINDS, MixingSchedule
from dacflnode.config import RunConfig
from dacflnode.learning.datasets import Dataset, eval_subset
from dacflnode.learning.layout import StateLayout
from dacflnode.learning.models import build_model, default_model_for
from dacflnode.learning.train import pick_device
from dacflnode.node.metrics_log import METRICS_FILE
from dacflnode.node.policies import Metropolis, MixingPolicy, ModelView, OwnModel
from dacflnode.node.runner import NodeRunner, NodeSetup, RoundReport
from dacflnode.sim.engine import Engine, NodeData, OnLoopThread, make_engine
from dacflnode.sim.global_view import MatrixRows, NetworkAverage
from dacflnode.transport.base import Identity, Inbox
from dacflnode.transport.memory import MemoryNetwork, MemoryTransport

#: The run fingerprint every simulated node announces (they all share one configuration).
SIMULATION_RUN = "simulation"


def node_ids(n: int) -> list[str]:
    return [f"node-{i}" for i in range(n)]


@dataclass
class RoundRecord:
    """One round of every node, for progress displays."""

    round: int  # rounds completed (1-based)
    train_loss: list[float]
    residual: list[float]
    samples: int
    accuracy: list[float] | None = None

    @property
    def avg_acc(self) -> float | None:
        return None if self.accuracy is None else float(np.mean(self.accuracy))

    @property
    def var_acc(self) -> float | None:
        return None if self.accuracy is None else float(np.var(self.accuracy))

    @property
    def mean_train_loss(self) -> float:
        return float(np.mean(self.train_loss))


ProgressFn = Callable[[str, int, int, RoundRecord], None]


@dataclass
class SimulationResult:
    algorithm: str
    engine: str
    wall_s: float
    records: list[RoundRecord] = field(default_factory=list)


class Simulation:
    """One algorithm on one data set and topology; :meth:`run` executes every round."""

    def __init__(
        self,
        cfg: RunConfig,
        algorithm: str,
        dataset: Dataset,
        parts: Sequence[np.ndarray],
        *,
        out_dir: Path | None = None,
    ) -> None:
        self.cfg = cfg
        self.alg: Algorithm = make_algorithm(algorithm, cfg.fodac_variant)
        self.ids = node_ids(cfg.nodes)
        self.out_dir = out_dir
        sizes = np.array([len(p) for p in parts], dtype=np.float64)
        self.data_weights = sizes / sizes.sum()
        model_name = cfg.model or default_model_for(dataset.name)

        def factory() -> torch.nn.Module:
            torch.manual_seed(cfg.seed)
            return build_model(model_name, dataset.input_shape, dataset.num_classes)

        model = factory()
        self.layout = StateLayout.from_module(model)
        self.initial = self.layout.flatten_module(model)
        test_x, test_y = eval_subset(dataset.test_x, dataset.test_y, cfg.eval_samples, cfg.seed)
        node_data = [
            NodeData(
                dataset.train_x[torch.from_numpy(np.asarray(p))],
                dataset.train_y[torch.from_numpy(np.asarray(p))],
            )
            for p in parts
        ]
        self.engine: Engine = make_engine(
            cfg.engine, self.ids, factory, node_data, NodeData(test_x, test_y),
            cfg.train_config(), seed=cfg.seed, device=pick_device(cfg.device),
        )
        self.average: NetworkAverage | None = None
        if self.alg.global_model:
            weights = list(self.data_weights) if self.alg.name == "fedavg" else None
            self.average = NetworkAverage(self.ids, weights, self.engine.evaluate_one)
        self.runners: list[NodeRunner] = []

    @property
    def final_states(self) -> list[NodeState]:
        return [r.state for r in self.runners]

    # ------------------------------------------------------------------ the nodes' policies
    def _topology(
        self,
    ) -> tuple[MixingPolicy, dict[str, list[str]], Callable[[str], Callable[[int], list[str]]]
               | None]:
        """The mixing policy, each node's neighbours and (if they vary) its active ones."""
        n = len(self.ids)
        everyone = {node: [j for j in self.ids if j != node] for node in self.ids}
        if self.alg.name == "fedavg":  # the server averages everyone by data size
            server = np.tile(self.data_weights, (n, 1))
            rows = MatrixRows(self.ids, lambda t: server)
            return rows, everyone, rows.active
        schedule = MixingSchedule(self.cfg.topology_spec())
        if schedule.spec.kind not in GRAPH_KINDS:
            rows = MatrixRows(self.ids, schedule.matrix)
            return rows, everyone, rows.active
        base = schedule.base_edges()
        assert base is not None
        adjacency = graphs.neighbours(n, base)
        neighbours = {self.ids[i]: [self.ids[j] for j in sorted(adjacency[i])]
                      for i in range(n)}
        if not self.cfg.time_varying:
            return Metropolis(), neighbours, None
        index = {node: i for i, node in enumerate(self.ids)}

        def active(node: str) -> Callable[[int], list[str]]:
            me = index[node]
            return lambda t: sorted(self.ids[j if i == me else i]
                                    for i, j in schedule.edges(t) if me in (i, j))

        return Metropolis(), neighbours, active

    def _view(self, node: str) -> ModelView:
        return OwnModel() if self.average is None else self.average.view(node)

    def _state_dir(self, node: str) -> Path | None:
        if self.out_dir is None:
            return None
        folder = self.out_dir / node
        folder.mkdir(parents=True, exist_ok=True)
        for stale in (METRICS_FILE, "final.safetensors"):
            (folder / stale).unlink(missing_ok=True)
        return folder

    # ------------------------------------------------------------------ run
    def run(self, progress: ProgressFn | None = None) -> SimulationResult:
        """Every round of every node; returns per-round records (the files are in ``out_dir``)."""
        return asyncio.run(self.run_async(progress))

    async def run_async(self, progress: ProgressFn | None = None) -> SimulationResult:
        cfg = self.cfg
        mixing, neighbours, active = self._topology()
        network = MemoryNetwork(copy=False)
        tensors = {name: (self.layout.numel,) for name in self.alg.exchanged}
        result = SimulationResult(self.alg.name, self.engine.name, 0.0)
        reports: dict[int, dict[str, RoundReport]] = {}

        def collect(node: str) -> Callable[[RoundReport], None]:
            def on_round(report: RoundReport) -> None:
                done = reports.setdefault(report.round, {})
                done[node] = report
                if len(done) < len(self.ids):
                    return
                rows = [done[j] for j in self.ids]
                accs = [r.accuracy for r in rows]
                record = RoundRecord(
                    round=report.round, train_loss=[r.train_loss for r in rows],
                    residual=[r.residual for r in rows], samples=sum(r.samples for r in rows),
                    accuracy=None if any(a is None for a in accs) else
                    [float(a) for a in accs if a is not None],
                )
                del reports[report.round]
                result.records.append(record)
                if progress is not None:
                    progress(self.alg.name, report.round, cfg.rounds, record)
            return on_round

        transports: list[MemoryTransport] = []
        by_id: dict[str, NodeRunner] = {}
        self.runners = []
        for node in self.ids:
            setup = NodeSetup(
                node_id=node, neighbours=neighbours[node], algorithm=self.alg,
                trainer=self.engine.trainers[node], layout=self.layout, rounds=cfg.rounds,
                eval_every=cfg.eval_every, round_deadline=float("inf"),
                active_neighbours=None if active is None else active(node), mixing=mixing,
                view=self._view(node), state_dir=self._state_dir(node), checkpoints=False,
                executor=OnLoopThread(), absurd_ratio=None,
            )
            inbox = Inbox(senders=neighbours[node],
                          current_round=_round_of(by_id, node))
            identity = Identity(node, self.layout.fingerprint(), SIMULATION_RUN)
            transport = MemoryTransport(network, identity, neighbours[node], inbox, tensors)
            runner = NodeRunner(setup, transport, NodeState.initial(self.initial))
            runner.on_round = collect(node)
            by_id[node] = runner
            transports.append(transport)
            self.runners.append(runner)
        started = time.perf_counter()
        for transport in transports:
            await transport.start()
        try:
            async with asyncio.TaskGroup() as nodes:
                for runner in self.runners:
                    nodes.create_task(runner.run())
        except ExceptionGroup as failed:
            # a shared trainer hands its one error to every node: report it once, as itself
            raise _first_leaf(failed) from failed
        finally:
            for transport in transports:
                await transport.stop()
        result.wall_s = time.perf_counter() - started
        return result


def _round_of(runners: Mapping[str, NodeRunner], node: str) -> Callable[[], int]:
    """The round ``node``'s runner is in (its inbox's window), once the runner exists."""
    return lambda: runners[node].round


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first
