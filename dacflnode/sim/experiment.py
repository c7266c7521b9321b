"""Run one or several algorithms on the same data, partition and topology; write the results.

Layout of ``out_dir``: one algorithm → ``out_dir/<node-id>/{metrics.jsonl,final.safetensors}``;
several → ``out_dir/<algorithm>/<node-id>/…``; always ``out_dir/summary.json``. The summary of
each algorithm is read back from the nodes' ``metrics.jsonl`` by
:func:`~dacflnode.records.metrics_log.summarize`, the function ``launch`` uses; without ``out_dir``
the files go to a temporary directory that is removed afterwards.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dacflnode import __version__
from dacflnode.assembly.data import cache_dir_in, own_node_data, scale_in_place
from dacflnode.config import DAEMON_DEFAULTS, RunConfig
from dacflnode.filemodes import LOG_MODE, make_dir, write_text
from dacflnode.learning.datasets import load_dataset
from dacflnode.learning.names import node_ids
from dacflnode.learning.partition import partition
from dacflnode.protocol.faults import FaultPlan
from dacflnode.protocol.scale_agreement import scale_of
from dacflnode.records.metrics_log import summarize
from dacflnode.sim.engines.base import RayTarget
from dacflnode.sim.simulator import ProgressFn, Simulation


def run_experiment(
    cfg: RunConfig, out_dir: str | Path | None = None, progress: ProgressFn | None = None,
    faults: FaultPlan | None = None,
    gone_after: int = DAEMON_DEFAULTS.gone_after,
    ray: RayTarget | None = None,
    slowdown: Mapping[str, float] | None = None,
    virtual_time: bool = False,
    round_deadline: float = math.inf,
) -> dict[str, Any]:
    """Run every algorithm of ``cfg``; return (and write) the summary.

    ``faults``: a fault plan every run plays. The summary's ``invariant`` has, per FODAC
    algorithm, the invariant residual of each round and over the nodes that finished (what
    ``dacflnode invariant DIR`` reports).
    ``gone_after``: missed rounds in a row before a neighbour is declared gone (as a daemon's
    ``run.gone_after``). ``ray``: train on the workers of a Ray cluster (``simulate --ray``).
    ``slowdown``: nodes slower than the others, by factor (``simulate --slowdown NODE=F``;
    in the summary's ``config.slowdown``). ``virtual_time``: play synchronous rounds on the
    virtual clock too (asynchronous runs always do), ``round_deadline`` their deadline there
    (``simulate --virtual-time --round-deadline S``)."""
    slow = dict(slowdown or {})
    cfg.validate()
    cfg.apply_threads()
    started = time.perf_counter()
    simulation, data_summary = simulations(cfg, out_dir, faults, gone_after, ray, slow,
                                           virtual_time, round_deadline)
    return _run_all(cfg, out_dir, progress, faults, simulation, data_summary, started, slow)


#: Makes the simulation of one algorithm writing into a folder (``None``: none).
SimulationFactory = Callable[[str, "Path | None"], Simulation]


def simulations(
    cfg: RunConfig, out_dir: str | Path | None, faults: FaultPlan | None = None,
    gone_after: int = DAEMON_DEFAULTS.gone_after, ray: RayTarget | None = None,
    slow: Mapping[str, float] | None = None, virtual_time: bool = False,
    round_deadline: float = math.inf,
) -> tuple[SimulationFactory, dict[str, Any]]:
    """The run's data, read once, and a factory of its simulations (one per algorithm);
    with the data's summary."""
    timing: dict[str, Any] = {"virtual_time": virtual_time, "round_deadline": round_deadline}
    if cfg.own_data:
        return _own_data(cfg, out_dir, faults, gone_after, ray, dict(slow or {}), timing)
    dataset = load_dataset(
        cfg.dataset,
        cfg.data_root,
        download=cfg.download,
        synthetic_train=cfg.synthetic_train,
        synthetic_test=cfg.synthetic_test,
        seed=cfg.seed,
    )
    parts = partition(
        dataset.train_y,
        cfg.nodes,
        cfg.partition,
        seed=cfg.seed,
        alpha=cfg.dirichlet_alpha,
        shards_per_node=cfg.shards_per_node,
    )
    data_summary = {
        "name": dataset.name,
        "train": int(dataset.train_y.numel()),
        "test": int(dataset.test_y.numel()),
        "samples_per_node": [len(p) for p in parts],
    }

    def simulation(name: str, folder: Path | None) -> Simulation:
        return Simulation(cfg, name, dataset, parts, out_dir=folder, faults=faults,
                          gone_after=gone_after, ray=ray, slowdown=slow, **timing)

    return simulation, data_summary


def _own_data(
    cfg: RunConfig, out_dir: str | Path | None, faults: FaultPlan | None, gone_after: int,
    ray: RayTarget | None, slow: dict[str, float], timing: dict[str, Any],
) -> tuple[SimulationFactory, dict[str, Any]]:
    """Every node on its own data: ``cfg.data_root``/<node-id> (and its test data), read
    once, decoded images cached in ``out_dir/<node-id>/data-cache``."""
    ids = node_ids(cfg.nodes)
    shares = []
    for node in ids:
        cache = cache_dir_in(Path(out_dir) / node) if out_dir is not None else None
        shares.append(own_node_data(cfg.for_node(node), cache))
    scale = None
    if shares[0].moments is not None:  # the scale the daemons agree on, added up directly
        scale = scale_of(shares[0].scaling, [s.moments for s in shares if s.moments])
        for share in shares:
            scale_in_place(share, scale)
    data_summary = {
        "name": cfg.dataset,
        "contract": json.loads(shares[0].contract),
        "train": sum(s.info.size for s in shares),
        "test": sum(s.info.test_size for s in shares),
        "samples_per_node": [s.info.size for s in shares],
        "test_per_node": [s.info.test_size for s in shares],
        "class_counts": {node: s.info.class_counts for node, s in zip(ids, shares, strict=True)},
    }
    if scale is not None:
        data_summary["feature_scale"] = scale.summary(shares[0].feature_names)

    def simulation(name: str, folder: Path | None) -> Simulation:
        return Simulation(cfg, name, None, None, out_dir=folder, faults=faults,
                          gone_after=gone_after, ray=ray, own=shares, slowdown=slow,
                          **timing)

    return simulation, data_summary


def _run_all(
    cfg: RunConfig, out_dir: str | Path | None, progress: ProgressFn | None,
    faults: FaultPlan | None, simulation: SimulationFactory,
    data_summary: dict[str, Any], started: float, slow: dict[str, float],
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="dacfl-sim-") as scratch:
        root = Path(out_dir) if out_dir is not None else Path(scratch)
        results: dict[str, Any] = {}
        invariant: dict[str, Any] = {}
        for name in cfg.algorithm:
            folder = root / name if len(cfg.algorithm) > 1 else root
            sim = simulation(name, folder)
            result = sim.run(progress)
            results[name] = summarize([folder / node for node in sim.ids], name, result.wall_s,
                                      engine=result.engine)
            if result.invariant is not None:
                invariant[name] = {"final": result.invariant,
                                   "rounds": [r.invariant for r in result.records],
                                   "nodes": [len(r.nodes) for r in result.records]}
    summary = {
        "version": __version__,
        "config": {**cfg.to_json(), "slowdown": slow or cfg.slowdown},
        "dataset": data_summary,
        "algorithms": results,
        "wall_s": round(time.perf_counter() - started, 3),
    }
    if faults is not None:
        summary["faults"] = str(faults.source) if faults.source is not None else "in code"
    summary["invariant"] = invariant  # what `dacflnode invariant DIR` reads
    if out_dir is not None:
        root = Path(out_dir)
        make_dir(root)
        write_text(root / "summary.json", json.dumps(summary, indent=2) + "\n", LOG_MODE)
    return summary
