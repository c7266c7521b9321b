#!/usr/bin/env python3
"""Simulator training throughput against a bare single-model PyTorch loop, in the same run.

(a) bare: one ``fmnist-cnn`` trained with plain ``torch.optim.SGD`` on batches of 20 — no
    project code at all;
(b) the simulator's rounds (N ``NodeRunner`` s over the in-memory transport: exchange, mix,
    train, FODAC, bookkeeping for every node) with ``--engine batched``;
(c) the same with ``--engine sequential`` (one model per node, the daemon's code path).

Each is measured in samples per second of training; the ratios (b)/(a) and (c)/(a) are printed.
The target is ≥ 1.5x for 10 simulated nodes.

    python benchmarks/bench_simulator.py --nodes 10 --steps 30
    python benchmarks/bench_simulator.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import replace

import numpy as np
import torch
from torch import nn

from dacflnode.config import RunConfig
from dacflnode.learning.datasets import DEFAULT_FASHION_MNIST_ROOT, Dataset, load_dataset
from dacflnode.learning.models import build_model
from dacflnode.learning.partition import partition
from dacflnode.sim.simulator import RoundRecord, Simulation


def bare_loop(x: torch.Tensor, y: torch.Tensor, batch: int, steps: int, model_name: str) -> float:
    torch.manual_seed(0)
    model = build_model(model_name, tuple(x.shape[1:]), 10)  # type: ignore[arg-type]
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    perm = torch.randperm(len(y))
    for k in range(3):  # warm-up: allocator, kernels, the optimizer's first-step imports
        opt.zero_grad()
        loss_fn(model(x[perm[k * batch:][:batch]]), y[perm[k * batch:][:batch]]).backward()
        opt.step()
    started = time.perf_counter()
    for k in range(steps):
        idx = perm[(k * batch) % len(y):][:batch]
        opt.zero_grad()
        loss = loss_fn(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
    return steps * batch / (time.perf_counter() - started)


def simulator(cfg: RunConfig, engine: str, dataset: Dataset, parts: list[np.ndarray]
              ) -> tuple[float, str]:
    """Samples/s of the simulator's second round: N NodeRunners over the in-memory transport,
    from the moment the last node finished round 1 to the moment the last node finished round 2
    (the first round warms up; no evaluation and no files in between)."""
    sim = Simulation(replace(cfg, engine=engine, rounds=3, eval_every=1000), "dacfl", dataset,
                     parts)
    marks: dict[int, tuple[float, int]] = {}

    def progress(name: str, done: int, total: int, record: RoundRecord) -> None:
        marks[done] = (time.perf_counter(), record.samples)

    sim.run(progress)
    (first, _), (second, samples) = marks[1], marks[2]
    return samples / (second - first), sim.engine.name


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=10)
    ap.add_argument("--steps", type=int, default=30, help="mini-batches per node and round")
    ap.add_argument("--batch-size", type=int, default=20)
    ap.add_argument("--model", default="fmnist-cnn")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    real = (DEFAULT_FASHION_MNIST_ROOT / "train-images-idx3-ubyte.gz").exists()
    dataset = load_dataset("fashion-mnist" if real else "synthetic")
    if not real:
        print("Fashion-MNIST not installed: using synthetic data", file=sys.stderr)
    cfg = RunConfig(nodes=args.nodes, rounds=2, dataset=dataset.name, model=args.model,
                    local_steps=args.steps, batch_size=args.batch_size, topology="dense",
                    device="cpu", eval_samples=100)
    parts = partition(dataset.train_y, args.nodes, "iid", seed=0)
    total_steps = args.steps * args.nodes
    # the bare loop runs before and after the simulator (the allocator warms up over a run: the
    # first multi-megabyte gradient buffers are page-faulted in); the better of the two counts
    bare_first = bare_loop(dataset.train_x, dataset.train_y, args.batch_size, total_steps,
                           args.model)
    batched, _ = simulator(cfg, "batched", dataset, parts)
    sequential, _ = simulator(cfg, "sequential", dataset, parts)
    bare_last = bare_loop(dataset.train_x, dataset.train_y, args.batch_size, total_steps,
                          args.model)
    bare = max(bare_first, bare_last)
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "loadavg": [round(v, 2) for v in os.getloadavg()]},
        "dataset": dataset.name, "model": args.model, "nodes": args.nodes,
        "batch_size": args.batch_size, "steps_per_node": args.steps,
        "samples_per_s": {"bare_single_model": round(bare, 1),
                          "bare_runs": [round(bare_first, 1), round(bare_last, 1)],
                          "simulator_batched": round(batched, 1),
                          "simulator_sequential": round(sequential, 1)},
        "ratio_vs_bare": {"batched": round(batched / bare, 3),
                          "sequential": round(sequential / bare, 3)},
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{args.nodes} nodes x {args.steps} steps of batch {args.batch_size}, {args.model}, "
          f"{dataset.name}, {result['machine']['cpus']} CPUs, load {result['machine']['loadavg']}")
    print(f"{'':28}{'samples/s':>12}{'x bare':>9}")
    print(f"{'bare single-model loop':28}{bare:>12.0f}{1.0:>9.2f}")
    for name, value in (("simulator, batched", batched), ("simulator, sequential", sequential)):
        print(f"{name:28}{value:>12.0f}{value / bare:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
