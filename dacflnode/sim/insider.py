"""One member of a simulated network poisons what it sends: how the honest nodes fare.

:func:`play` runs a :class:`~dacflnode.sim.simulator.Simulation` with a fault plan of
``poison`` entries (docs/faults.md) and reports what docs/security.md ("A member that
misbehaves") promises about it: the honest nodes' final accuracy, the invariant among them, the
edges quarantined, and the longest exchange of any round (a refusal must never make a round
wait). ``benchmarks/bench_insider.py`` and the simulator's tests share it, so the measured and
the tested attack are the same.

The invariant is taken over the nodes the honest ones still exchange with: when every neighbour
of the poisoning member quarantined it, over the honest nodes alone (its own bookkeeping is
not theirs); otherwise over every node (the member's own state is honest, it only lies in what
it sends, so ``Σ x = Σ tracked`` holds over the whole network).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dacflnode.config import RunConfig
from dacflnode.learning.datasets import Dataset, load_dataset
from dacflnode.learning.partition import partition
from dacflnode.protocol.faults import FaultPlan, parse_fault_plan
from dacflnode.records.membership import PeerState
from dacflnode.records.metrics_log import read_metrics
from dacflnode.sim.simulator import Simulation


@dataclass
class Outcome:
    """What one simulated run did to its honest nodes."""

    #: each honest node's final test accuracy (0 to 1)
    accuracy: dict[str, float]
    #: ``|Σ x − Σ tracked| / |Σ tracked|`` over the nodes the honest ones exchange with
    invariant: float | None
    #: the edges quarantined, as ``(node, peer)`` seen from the honest node
    quarantined: list[tuple[str, str]] = field(default_factory=list)
    #: states refused as absurd or stale by honest nodes
    refused: int = 0
    #: the longest exchange phase of any honest node's round, in seconds
    longest_exchange_s: float = 0.0
    #: the longest honest round, in seconds
    longest_round_s: float = 0.0
    wall_s: float = 0.0

    @property
    def mean_accuracy(self) -> float:
        return statistics.fmean(self.accuracy.values())


def load(cfg: RunConfig) -> tuple[Dataset, Sequence[Any]]:
    """The data set and partition of ``cfg`` (synthetic or downloaded as ``cfg`` says)."""
    data = load_dataset(cfg.dataset, cfg.data_root, download=cfg.download,
                        synthetic_train=cfg.synthetic_train,
                        synthetic_test=cfg.synthetic_test, seed=cfg.seed)
    parts = partition(data.train_y, cfg.nodes, cfg.partition, seed=cfg.seed,
                      alpha=cfg.dirichlet_alpha)
    return data, parts


def play(
    cfg: RunConfig, events: Sequence[Mapping[str, Any]], *, algorithm: str = "dacfl",
    gone_after: int = 3, data: tuple[Dataset, Sequence[Any]] | None = None,
    timeout: float = 600.0,
) -> Outcome:
    """Run ``cfg`` with the fault plan ``events`` (``[]``: the untouched run) and measure it.
    ``timeout``: a node that waited for a state that never comes would hang the run; it fails
    with :class:`TimeoutError` instead."""
    ids = [f"node-{i}" for i in range(cfg.nodes)]
    plan = parse_fault_plan(list(events), ids=ids, rounds=cfg.rounds) if events else None
    dataset, parts = data if data is not None else load(cfg)
    with tempfile.TemporaryDirectory(prefix="dacfl-insider-") as out:
        sim = Simulation(cfg, algorithm, dataset, parts, out_dir=Path(out),
                         faults=plan, gone_after=gone_after)
        result = asyncio.run(asyncio.wait_for(sim.run_async(), timeout))
        return _outcome(sim, plan, Path(out), result.wall_s)


def _outcome(sim: Simulation, plan: FaultPlan | None, out: Path, wall_s: float) -> Outcome:
    members = {p.node for p in plan.poisons} if plan is not None else set()
    honest = [r for r in sim.runners if r.setup.node_id not in members]
    accuracy = {r.setup.node_id: r.last_accuracy for r in honest}
    quarantined = [(r.setup.node_id, peer) for r in honest for peer, track in r.peers.items()
                   if track.state is PeerState.QUARANTINED]
    refused = sum(t.refused_states for r in honest for t in r.peers.values())
    cut_off = bool(members) and all(
        track.state is PeerState.QUARANTINED
        for r in honest for peer, track in r.peers.items() if peer in members)
    pool = honest if cut_off else sim.runners
    longest_exchange = longest_round = 0.0
    for r in honest:
        for line in read_metrics(out / r.setup.node_id / "metrics.jsonl"):
            longest_exchange = max(longest_exchange, float(line["exchange_s"]))
            longest_round = max(longest_round, float(line["seconds"]))
    return Outcome(accuracy, sim.invariant(r.state for r in pool), quarantined, refused,
                   longest_exchange, longest_round, wall_s)
