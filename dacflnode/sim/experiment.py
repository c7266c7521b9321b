"""Run one or several algorithms on the same data, partition and topology; write the results.

Layout of ``out_dir``: one algorithm → ``out_dir/<node-id>/{metrics.jsonl,final.safetensors}``;
several → ``out_dir/<algorithm>/<node-id>/…``; always ``out_dir/summary.json``. The summary of
each algorithm is read back from the nodes' ``metrics.jsonl`` by
:func:`~dacflnode.node.metrics_log.summarize`, the function ``launch`` uses; without ``out_dir``
the files go to a temporary directory that is removed afterwards.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from dacflnode import __version__
from dacflnode.config import DAEMON_DEFAULTS, RunConfig
from dacflnode.learning.datasets import load_dataset
from dacflnode.learning.partition import partition
from dacflnode.node.faults import FaultPlan
from dacflnode.node.metrics_log import summarize
from dacflnode.sim.engine import RayTarget
from dacflnode.sim.simulator import ProgressFn, Simulation


def run_experiment(
    cfg: RunConfig, out_dir: str | Path | None = None, progress: ProgressFn | None = None,
    faults: FaultPlan | None = None,
    gone_after: int = DAEMON_DEFAULTS.gone_after,
    ray: RayTarget | None = None,
) -> dict[str, Any]:
    """Run every algorithm of ``cfg``; return (and write) the summary.

    ``faults``: a fault plan every run plays; the summary then has ``invariant``: per FODAC
    algorithm, the invariant residual of each round and over the nodes that finished.
    ``gone_after``: missed rounds in a row before a neighbour is declared gone (as a daemon's
    ``run.gone_after``). ``ray``: train on the workers of a Ray cluster (``simulate --ray``)."""
    cfg.validate()
    cfg.apply_threads()
    started = time.perf_counter()
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
    with tempfile.TemporaryDirectory(prefix="dacfl-sim-") as scratch:
        root = Path(out_dir) if out_dir is not None else Path(scratch)
        results: dict[str, Any] = {}
        invariant: dict[str, Any] = {}
        for name in cfg.algorithm:
            folder = root / name if len(cfg.algorithm) > 1 else root
            sim = Simulation(cfg, name, dataset, parts, out_dir=folder, faults=faults,
                             gone_after=gone_after, ray=ray)
            result = sim.run(progress)
            results[name] = summarize([folder / node for node in sim.ids], name, result.wall_s,
                                      engine=result.engine)
            if faults is not None and result.invariant is not None:
                invariant[name] = {"final": result.invariant,
                                   "rounds": [r.invariant for r in result.records],
                                   "nodes": [len(r.nodes) for r in result.records]}
    summary = {
        "version": __version__,
        "config": cfg.to_json(),
        "dataset": {
            "name": dataset.name,
            "train": int(dataset.train_y.numel()),
            "test": int(dataset.test_y.numel()),
            "samples_per_node": [len(p) for p in parts],
        },
        "algorithms": results,
        "wall_s": round(time.perf_counter() - started, 3),
    }
    if faults is not None:
        summary["faults"] = str(faults.source) if faults.source is not None else "in code"
        summary["invariant"] = invariant
    if out_dir is not None:
        root = Path(out_dir)
        root.mkdir(parents=True, exist_ok=True)
        (root / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
