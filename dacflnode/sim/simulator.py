"""N virtual nodes in one process: N daemons' :class:`~dacflnode.protocol.runner.NodeRunner` s over
the in-memory transport, in one event loop.

Exchange, mixing, the round bookkeeping, the metrics lines and the final files are the runner's
own code, and each node is made by the daemon's builder (:mod:`dacflnode.assembly.build`: the
run's parts once, then each node's :class:`~dacflnode.protocol.setup.NodeSetup` and runner); the
simulator only injects the policies a global view allows (see :mod:`dacflnode.sim.global_view`)
and a trainer from the chosen engine (:mod:`dacflnode.sim.engines`):

* graph topologies: the daemon's Metropolis weights and active-edge rule, so ``launch`` and
  ``simulate --engine sequential`` produce the same models;
* matrix topologies (dense, sparse, uniform, custom): node ``i`` mixes with row ``i`` of ``W(t)``;
* FedAvg: every node mixes all nodes with data-size weights (the server average);
* D-PSGD and FedAvg are evaluated, and save, the network average (the god node).

No round has a deadline, no checkpoint is written per round, and the absurd-state guard is off
(every node is this process's own; the guard protects a daemon from the network, see
docs/security.md), unless the fault plan has a ``poison`` entry: then every node guards its inbox
as a daemon does, so the simulator plays a misbehaving member as a cluster would.

Faults (``simulate --faults FILE``, :mod:`dacflnode.protocol.faults`): every node's setup carries
the plan, and the runners themselves neither push nor wait for a dropped edge-round, so no deadline
is needed and a run with faults is as deterministic as one without. The simulator only plays the
node events: it cancels a crashing node's runner at the start of its crash round and, for a
restart, resumes a new runner from the crashed one's last completed round (in memory, as a
checkpoint would hold it) once the others reach the restart round; it asks a leaving node's
runner to drain; it starts a joining node late, as a joiner. With a plan, each round's record
carries the network-wide invariant residual ``|Σ x − Σ tracked| / |Σ tracked|`` over the nodes
that reported the round; the result always carries it over the nodes that finished the run.
Mixing, completion and training run on the event loop's thread
(:class:`~dacflnode.sim.engines.base.InlineExecutor`): there is no network to serve meanwhile, so a
thread hop per call would buy nothing (docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import torch

from dacflnode.algorithms import graphs
from dacflnode.algorithms.rounds import Algorithm, NodeState
from dacflnode.algorithms.topology import GRAPH_KINDS, MixingSchedule
from dacflnode.assembly import build
from dacflnode.assembly.data import NodeDataSet, class_counts, contract_difference_all
from dacflnode.config import DAEMON_DEFAULTS, RunConfig
from dacflnode.errors import ConfigError
from dacflnode.filemodes import make_dir
from dacflnode.learning.datasets import Dataset, eval_subset
from dacflnode.learning.models import build_model, default_model_for
from dacflnode.learning.names import node_ids
from dacflnode.learning.train import pick_device
from dacflnode.peers.run_graph import RunGraph
from dacflnode.protocol.faults import Crash, FaultPlan
from dacflnode.protocol.policies import Metropolis, MixingPolicy, ModelView, OwnModel
from dacflnode.protocol.runner import NodeRunner
from dacflnode.protocol.setup import NodeSetup, RoundReport
from dacflnode.protocol.training import NodeTrainer, PacedTrainer
from dacflnode.records.checkpoint import Checkpoint
from dacflnode.records.invariant import relative_residual
from dacflnode.records.metrics_log import METRICS_FILE, DataInfo
from dacflnode.sim.engines.base import Engine, InlineExecutor, NodeData, RayTarget
from dacflnode.sim.engines.registry import make_engine
from dacflnode.sim.global_view import MatrixRows, NetworkAverage
from dacflnode.sim.round_records import ProgressFn as ProgressFn
from dacflnode.sim.round_records import RoundRecord as RoundRecord
from dacflnode.sim.round_records import RoundRecords, SimulationResult
from dacflnode.sim.virtual_clock import run_virtual, virtual_now
from dacflnode.transport.base import Identity, Transport
from dacflnode.transport.memory import MemoryNetwork, MemoryTransport

#: The run fingerprint every simulated node announces (they all share one configuration).
SIMULATION_RUN = "simulation"


def graph_edges(cfg: RunConfig) -> list[tuple[str, str]] | None:
    """The edges of ``cfg``'s base graph by node id, which a fault plan's drops, cuts and
    poisons must name; ``None`` for a mixing-matrix topology, where any node may reach any
    other."""
    if cfg.topology not in GRAPH_KINDS:
        return None
    base = MixingSchedule(cfg.topology_spec()).base_edges()
    assert base is not None  # a graph kind always has a base graph
    ids = node_ids(cfg.nodes)
    return [(ids[i], ids[j]) for i, j in base]


class Simulation:
    """One algorithm on one data set and topology; :meth:`run` executes every round.

    ``faults``: a fault plan to play (checked against the run's node ids and rounds here).
    ``ray``: train on the workers of a Ray cluster (:mod:`dacflnode.sim.engines.ray`); they
    start here and stop when :meth:`run` ends.
    """

    def __init__(
        self,
        cfg: RunConfig,
        algorithm: str,
        dataset: Dataset | None,
        parts: Sequence[np.ndarray] | None,
        *,
        out_dir: Path | None = None,
        faults: FaultPlan | None = None,
        gone_after: int = DAEMON_DEFAULTS.gone_after,
        ray: RayTarget | None = None,
        own: Sequence[NodeDataSet] | None = None,
        slowdown: Mapping[str, float] | None = None,
        virtual_time: bool = False,
        round_deadline: float = math.inf,
    ) -> None:
        self.cfg = cfg
        #: play on the virtual clock, each node's training taking ``block_time`` × its
        #: slowdown (always under ``schedule: async``); ``round_deadline``: a synchronous
        #: round's deadline on that clock (``inf``: none, as without virtual time)
        self.virtual_time = virtual_time or cfg.schedule == "async"
        if not math.isinf(round_deadline) and not self.virtual_time:
            raise ConfigError("round_deadline", "a simulated round deadline needs the virtual "
                              "clock (--virtual-time): otherwise no node is ever late")
        self.round_deadline = round_deadline
        #: each node's slowdown factor (``--slowdown NODE=F``; a node not named: its
        #: ``slowdown`` setting)
        self.slowdown = dict(slowdown or {})
        #: consecutive missed rounds before a neighbour is declared gone (as a daemon's)
        self.gone_after = gone_after
        self.ids = node_ids(cfg.nodes)
        unknown = sorted(set(self.slowdown) - set(self.ids))
        if unknown:
            raise ConfigError("slowdown", f"no node {', '.join(unknown)} in this run "
                              f"(nodes {self.ids[0]} to {self.ids[-1]})")
        self.out_dir = out_dir
        self.faults = faults.check(self.ids, cfg.rounds, graph_edges(cfg)) if faults else None
        tests: list[NodeData] | None = None
        if own is not None:  # every node on its own data (simulate --data-root DIR)
            shares = list(own)
            _check_contracts(self.ids, shares)
            input_shape, num_classes = shares[0].input_shape, shares[0].num_classes
            model_name = shares[0].default_model
            node_data = [NodeData(s.train_x, s.train_y) for s in shares]
            tests = [NodeData(s.test_x, s.test_y) for s in shares]
            test_x, test_y = tests[0].x, tests[0].y
            if all(_same(t, tests[0]) for t in tests[1:]):
                tests = None  # one shared test folder: evaluated as one set (batched, Ray)
            self.data_info = [s.info for s in shares]
        else:
            if dataset is None or parts is None:
                raise ValueError("give a data set and its parts, or each node's own data")
            input_shape, num_classes = dataset.input_shape, dataset.num_classes
            model_name = cfg.model or default_model_for(dataset.name)
            test_x, test_y = eval_subset(dataset.test_x, dataset.test_y, cfg.eval_samples,
                                         cfg.seed)
            node_data = [
                NodeData(
                    dataset.train_x[torch.from_numpy(np.asarray(p))],
                    dataset.train_y[torch.from_numpy(np.asarray(p))],
                )
                for p in parts
            ]
            names = [str(i) for i in range(num_classes)]
            self.data_info = [DataInfo(int(d.y.numel()), int(test_y.numel()),
                                       class_counts(d.y, names)) for d in node_data]
        #: FedAvg's weights: each node's share of all training samples
        sizes = np.array([int(d.y.numel()) for d in node_data], dtype=np.float64)
        self.data_weights = sizes / sizes.sum()

        def factory() -> torch.nn.Module:
            torch.manual_seed(cfg.seed)
            return build_model(model_name, input_shape, num_classes)

        # the run's parts, made once: the layout, the initial model, the algorithm with a
        # daemon's mixing rule and the compression (docs/compression.md); every sender's own
        # decode serves its neighbours too (one process, the same tensors)
        self.parts = build.with_shared_decodes(build.run_parts(cfg, algorithm, factory()),
                                               len(self.ids))
        self.alg: Algorithm = self.parts.algorithm
        self.layout, self.initial = self.parts.layout, self.parts.initial
        engine = self._check_faults(cfg, ray)
        # Ray workers train on their own CPUs, whatever this machine has
        device = (torch.device("cpu") if ray is not None and cfg.device == "auto"
                  else pick_device(cfg.device))
        self.engine: Engine = make_engine(
            engine, self.ids, factory, node_data, NodeData(test_x, test_y),
            cfg.train_config(), seed=cfg.seed, device=device, ray=ray, tests=tests,
        )
        self.average: NetworkAverage | None = None
        if self.alg.global_model:
            weights = list(self.data_weights) if self.alg.name == "fedavg" else None
            self.average = NetworkAverage(self.ids, weights, self.engine.evaluate_one)
        self.runners: list[NodeRunner] = []

    @property
    def final_states(self) -> list[NodeState]:
        return [r.state for r in self.runners]

    def _check_faults(self, cfg: RunConfig, ray: RayTarget | None) -> str:
        """The engine to use: node events (crash, leave, join) stop and start single nodes, which
        the batched engine's all-nodes-at-once training cannot follow, nor can a global view
        (a mixing matrix, the god node) leave a node out; nor can it follow asynchronous nodes,
        each at its own block, nor synchronous rounds on the virtual clock (its training and
        evaluation wait for every node of the round: nobody would go on past a slow node's
        deadline)."""
        if self.virtual_time and cfg.schedule == "sync":
            if cfg.engine == "batched" or ray is not None:
                raise ConfigError("engine", "rounds on the virtual clock train each node on "
                                  "its own (a slow node is late for its neighbours alone), "
                                  "which the batched engine and --ray, all nodes of a round "
                                  "at once, never do; use sequential (or auto), without --ray")
            return self._check_node_events(cfg, "sequential")
        if cfg.schedule == "async":
            plan = self.faults
            if plan is not None and (
                    len(plan.crashes) + len(plan.leaves) + len(plan.joins) + len(plan.poisons)
                    != len(plan.events) or any(c.restart is None for c in plan.crashes)):
                raise ConfigError("faults", "under schedule async a fault plan may crash nodes "
                                  "that restart, make nodes leave or join, and poison "
                                  "snapshots (by block); its drops and cuts play rounds, "
                                  "which async has none of, and a crash for good would leave "
                                  "its neighbours waiting")
            if cfg.engine == "batched":
                raise ConfigError("engine", "the batched engine trains all nodes at once, "
                                  "which asynchronous nodes never do; use sequential (or auto)")
            return "sequential"
        return self._check_node_events(cfg, cfg.engine)

    def _check_node_events(self, cfg: RunConfig, engine: str) -> str:
        """``engine``, or the sequential one a fault plan's node events need (or an error
        where the run cannot have them)."""
        if self.faults is None or not self.faults.node_events:
            return engine
        event = type(self.faults.node_events[0]).__name__.lower()
        if self.alg.global_model:
            raise ConfigError("faults", f"a {event} event needs each node's own model; "
                              f"{self.alg.name} evaluates the network average")
        topology = cfg.topology_spec().topology
        if topology not in GRAPH_KINDS:
            raise ConfigError("faults", f"a {event} event needs a graph topology (Metropolis "
                              f"weights that follow the nodes), not '{topology}'")
        if cfg.engine == "batched":
            raise ConfigError("engine", f"the batched engine trains all nodes at once, which a "
                              f"{event} event does not allow; use sequential (or auto)")
        return "sequential"

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
        if schedule.spec.topology not in GRAPH_KINDS:
            rows = MatrixRows(self.ids, schedule.matrix)
            return rows, everyone, rows.active
        base = schedule.base_edges()
        assert base is not None
        adjacency = graphs.neighbours(n, base)
        neighbours = {self.ids[i]: [self.ids[j] for j in sorted(adjacency[i])]
                      for i in range(n)}
        if not self.cfg.time_varying:
            return Metropolis(), neighbours, None
        graph = RunGraph.of(self.ids, base, self.cfg.time_varying, self.cfg.seed,
                            self.cfg.drop_prob)  # a daemon's rule (PeersFile.active_neighbour_ids)

        def active(node: str) -> Callable[[int], list[str]]:
            return lambda t: graph.active_neighbours(node, t)

        return Metropolis(), neighbours, active

    def _view(self, node: str) -> ModelView:
        return OwnModel() if self.average is None else self.average.view(node)

    def _state_dir(self, node: str) -> Path | None:
        if self.out_dir is None:
            return None
        folder = self.out_dir / node
        make_dir(folder)
        for stale in (METRICS_FILE, "final.safetensors"):
            (folder / stale).unlink(missing_ok=True)
        return folder

    # ------------------------------------------------------------------ run
    def run(self, progress: ProgressFn | None = None) -> SimulationResult:
        """Every round of every node; returns per-round records (the files are in ``out_dir``).
        An asynchronous run plays on a virtual clock (:mod:`dacflnode.sim.virtual_clock`):
        its nodes' blocks take ``block_time`` × their slowdown and its exchanges the modelled
        links' time, none of it real; ``wall_s`` and the metrics lines' ``time`` are then
        virtual seconds from the run's start."""
        if self.virtual_time:
            return run_virtual(self.run_async(progress))
        return asyncio.run(self.run_async(progress))

    def slowdown_of(self, node: str) -> float:
        return self.slowdown.get(node, self.cfg.slowdown)

    async def run_async(self, progress: ProgressFn | None = None) -> SimulationResult:
        mixing, neighbours, active = self._topology()
        result = SimulationResult(self.alg.name, self.engine.name, 0.0)
        nodes = _Nodes(self, mixing, neighbours, active,
                       RoundRecords(self.ids, self.alg, self.cfg.rounds,
                                    self.faults is not None and self.cfg.schedule == "sync",
                                    result, progress))
        self.runners = []
        clock = asyncio.get_running_loop().time if self.virtual_time else (
            time.perf_counter)
        started = clock()
        try:
            async with asyncio.TaskGroup() as tasks:
                for node in self.ids:
                    tasks.create_task(nodes.play(node))
        except ExceptionGroup as failed:
            # a shared trainer hands its one error to every node: report it once, as itself
            raise _first_leaf(failed) from failed
        finally:
            await nodes.stop_all()
            self.engine.close()
        result.wall_s = clock() - started
        nodes.records.finish()
        self.runners = [nodes.runners[node] for node in self.ids if node in nodes.runners]
        result.invariant = self.invariant(r.state for r in self.finishers)
        return result

    @property
    def finishers(self) -> list[NodeRunner]:
        """The runners that completed every round (not those that left or crashed for good)."""
        return [r for r in self.runners if r.phase == "done"]

    def invariant(self, states: Iterable[NodeState]) -> float | None:
        """``|Σ x − Σ tracked| / |Σ tracked|`` over ``states`` (``None`` for an algorithm that
        tracks its own ``x``, or no states)."""
        name = "omega_prev" if self.cfg.schedule == "async" else self.alg.tracked_field
        if name == "x":
            return None
        sum_x: torch.Tensor | None = None
        sum_t: torch.Tensor | None = None
        for state in states:
            x, t = state.x.double(), getattr(state, name).double()
            sum_x = x if sum_x is None else sum_x + x
            sum_t = t if sum_t is None else sum_t + t
        if sum_x is None or sum_t is None:
            return None
        return relative_residual(sum_x, sum_t)


class _Nodes:
    """The nodes of one run: their transports and runners, and the fault plan's node events.

    Playing a node (:meth:`play`) starts its runner, with the others or, for a joiner, when they
    reach its join round; a crash cancels the runner at the start of its round (the transport
    goes down with it) and, with a restart, a new runner resumes from the crashed one's last
    completed round once the others reach the restart round; a leave asks the runner to drain
    once it has completed the rounds before it. Everything else is the runner's own code.
    """

    def __init__(
        self, sim: Simulation, mixing: MixingPolicy, neighbours: dict[str, list[str]],
        active: Callable[[str], Callable[[int], list[str]]] | None, records: RoundRecords,
    ) -> None:
        self.sim = sim
        self.plan = sim.faults
        self.mixing = mixing
        self.neighbours = neighbours
        self.active = active
        self.records = records
        self.network = MemoryNetwork(copy=False, link_delay=_link_delay(sim.cfg))
        #: a launched daemon's defaults, but no round deadline (every node is this process's
        #: own: none can be late), and the run's ids as its members
        self.waits = replace(DAEMON_DEFAULTS, round_deadline=sim.round_deadline,
                             gone_after=sim.gone_after, members=tuple(sim.ids))
        #: each node's latest runner
        self.runners: dict[str, NodeRunner] = {}
        #: the nodes running now (``None``: about to start with the others)
        self.running: dict[str, NodeRunner | None] = {
            node: None for node in sim.ids
            if self.plan is None or self.plan.join_round(node) is None}
        self.transports: dict[str, Transport] = {}
        self._state_dirs: dict[str, Path | None] = {}
        self._changed = asyncio.Event()
        #: the last round each node reported
        self._reported: dict[str, int] = {}
        records.may_report = self._may_report

    # ------------------------------------------------------------------ progress
    def _bump(self) -> None:
        """Wake whoever waits for the nodes' rounds to move on."""
        self._changed.set()
        self._changed = asyncio.Event()

    def _may_report(self, node: str, round_: int) -> bool:
        """Whether ``node`` is running (or about to) and has reported no round from ``round_``
        on: it may still report ``round_`` (one that joins or resumes later in the run reports
        a later round first)."""
        return node in self.running and self._reported.get(node, 0) < round_

    def _others_reached(self, node: str, round_: int) -> bool:
        return all(r is not None and r.round >= round_
                   for other, r in self.running.items() if other != node)

    async def _until_others_reach(self, node: str, round_: int) -> None:
        while not self._others_reached(node, round_):
            await self._changed.wait()

    # ------------------------------------------------------------------ one node
    def _setup(self, node: str, join: bool) -> NodeSetup:
        """A daemon's setup, but for what one process of nodes changes: no round deadline, no
        per-round checkpoint, mixing and completion in place, the guard only against a fault
        plan's poison, and the global view's mixing and model view."""
        sim, plan = self.sim, self.plan
        if node not in self._state_dirs:
            self._state_dirs[node] = sim._state_dir(node)
        trainer: NodeTrainer = sim.engine.trainers[node]
        if sim.virtual_time:  # a block takes its modelled time, on the virtual clock
            block = sim.cfg.block_time * sim.slowdown_of(node)
            trainer = PacedTrainer(trainer, lambda _took: block)
        setup = build.node_setup(
            sim.cfg, sim.parts, self.waits, node, self.neighbours[node],
            trainer=trainer, data=sim.data_info[sim.ids.index(node)],
            active_neighbours=None if self.active is None else self.active(node),
            mixing=self.mixing, view=sim._view(node), executor=InlineExecutor(),
            state_dir=self._state_dirs[node], checkpoints=False,
            guard=plan is not None and bool(plan.poisons), faults=plan, join=join)
        if sim.virtual_time:
            setup.clock = virtual_now
        return setup

    def _runner(self, node: str, state: NodeState, resume: Checkpoint | None,
                join: bool) -> NodeRunner:
        identity = Identity(node, self.sim.layout.fingerprint(), SIMULATION_RUN)
        transport = partial(MemoryTransport, self.network, identity, self.neighbours[node],
                            tensors=self.sim.parts.tensors, compressed=self.sim.parts.compressed)
        runner = build.build_runner(self._setup(node, join), transport, state, resume=resume)
        self.runners[node] = runner
        self.transports[node] = runner.transport
        return runner

    async def play(self, node: str) -> None:
        """Run ``node`` from its start (or join) to its end, through the plan's crashes,
        restarts and leave."""
        plan = self.plan
        join = plan.join_round(node) if plan is not None else None
        leave = plan.leave_round(node) if plan is not None else None
        crashes = plan.crashes_of(node) if plan is not None else []
        if join is not None:
            await self._until_others_reach(node, join)
        state = NodeState.initial(self.sim.initial)
        resume: Checkpoint | None = None
        while True:
            crash = crashes.pop(0) if crashes else None
            runner = self._runner(node, state, resume, join is not None and resume is None)
            if crash is None or runner.round < crash.round:
                self.running[node] = runner
                await self.transports[node].start()
                if leave is not None and runner.round >= leave:
                    runner.request_leave()
                if not await self._run(node, runner, crash, leave) or crash is None:
                    return  # finished, left, or stopped
            # crashed at the start of round crash.round: down until the others reach restart
            self.running.pop(node, None)
            await self.transports[node].stop()
            self.records.flush()
            self._bump()
            if crash.restart is None:
                return
            await self._until_others_reach(node, crash.restart)
            state, resume = runner.state, runner.checkpoint()
            if runner.async_node is not None:  # its last checkpoint, as a daemon's file holds
                resume = runner.async_node.saved
                assert resume is not None, "an asynchronous node checkpoints when it starts"
                state = resume.state

    async def _run(self, node: str, runner: NodeRunner, crash: Crash | None,
                   leave: int | None) -> bool:
        """Run ``runner`` to its end (False) or until ``crash`` (True)."""
        task = asyncio.create_task(runner.run(), name=f"{node}-runner")
        crashed = False

        def on_round(report: RoundReport) -> None:
            nonlocal crashed
            self._reported[node] = report.round
            self.records.add(node, report, runner.state)
            if crash is not None and runner.round >= crash.round and not crashed:
                crashed = True
                if runner.async_node is None:
                    task.cancel()  # lands at the runner's next await: the start of crash.round
                else:  # half-way through its next block, as a kill -9 lands: what it did
                    # since this block's checkpoint is lost (its restart resumes from that)
                    asyncio.get_running_loop().call_later(
                        self.sim.cfg.block_time * self.sim.slowdown_of(node) / 2, task.cancel)
            elif leave is not None and runner.round >= leave and not runner.leaving:
                runner.request_leave()
            self._bump()

        runner.on_round = on_round
        try:
            await asyncio.wait({task})
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait({task})
        if crashed and task.cancelled():
            return True
        task.result()  # its error, if it failed
        self.running.pop(node, None)
        self.records.flush()
        self._bump()
        return False

    async def stop_all(self) -> None:
        for transport in self.transports.values():
            await transport.stop()


def _link_delay(cfg: RunConfig) -> Callable[[int], float] | None:
    """The modelled time of a message of so many payload bytes over one link (asynchronous
    runs: ``link_latency`` plus the bytes at ``link_mbps``); ``None``: none."""
    if cfg.schedule != "async" or (cfg.link_latency == 0 and cfg.link_mbps is None):
        return None
    latency, mbps = cfg.link_latency, cfg.link_mbps
    return lambda nbytes: latency + (0.0 if mbps is None else 8 * nbytes / (mbps * 1e6))


def _same(a: NodeData, b: NodeData) -> bool:
    return a.y.shape == b.y.shape and torch.equal(a.y, b.y) and torch.equal(a.x, b.x)


def _check_contracts(ids: Sequence[str], shares: Sequence[NodeDataSet]) -> None:
    """Every node's data contract must be the first node's (a table's feature names come from
    its files): a ConfigError naming what differs, as a daemon's handshake would refuse it."""
    why = contract_difference_all(ids, [s.contract for s in shares])
    if why is not None:
        raise ConfigError("data_root", why)


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first
