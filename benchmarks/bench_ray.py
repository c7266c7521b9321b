#!/usr/bin/env python3
"""The simulator on Ray (``simulate --ray``): time per round with 1 and 2 Ray workers, against
the local engine, all in one process and run.

(a) local: the batched engine in this process (its nodes split over PyTorch's threads);
(b) Ray, 1 worker: the same run with every node on one Ray worker (one CPU);
(c) Ray, 2 workers: the nodes cut into two contiguous slices, one per worker.

10 nodes of ``fmnist-cnn`` on Fashion-MNIST (synthetic data where it is not installed), a few
local steps per round, a few rounds; the time per round is the median over the rounds between
the first (warm-up) and the last (evaluation). The ratio is (b)/(c): what the second worker
buys. ``vs_local`` is (a)/(c).

How it grows. A round on W workers costs about ``T_train · N / (N_1 · W) + T_move + T_fixed``:
the training of N/W nodes per worker, plus moving the start vectors out and the trained vectors
back (``2·N·P`` float32 through Ray's object store, ``transfer_s`` below measures one such round
trip), plus the driver's own work (exchange, mixing, bookkeeping of all N nodes: O(N·d·P) for
degree d, so a ring's is small and a dense topology's grows as N²·P; see
``benchmarks/profiles/ray.txt``). Training shrinks
with W while the transfer and the driver's share do not, so the speed-up approaches W when a
round's training is long against ``2·N·P`` floats (more local steps, bigger batches, a
compute-heavy model) and flattens when it is short. Workers beyond the cluster's cores only
queue: use workers ≈ cores (one CPU each).

    python benchmarks/bench_ray.py
    python benchmarks/bench_ray.py --quick --json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import ray
import torch
from _common import add_standard_args, emit_result, machine

from dacflnode.config import RunConfig
from dacflnode.learning.datasets import DEFAULT_FASHION_MNIST_ROOT, Dataset, load_dataset
from dacflnode.learning.partition import partition
from dacflnode.sim.engines.base import RayTarget
from dacflnode.sim.engines.ray import connect
from dacflnode.sim.simulator import RoundRecord, Simulation


def seconds_per_round(cfg: RunConfig, dataset: Dataset, parts: list[np.ndarray],
                      target: RayTarget | None) -> tuple[float, int, str]:
    """Median seconds of the rounds between the first and the last; the model's size P."""
    sim = Simulation(cfg, "dacfl", dataset, parts, ray=target)  # Ray workers start here
    marks: dict[int, float] = {}

    def progress(name: str, done: int, total: int, record: RoundRecord) -> None:
        marks[done] = time.perf_counter()

    sim.run(progress)
    rounds = [marks[r + 1] - marks[r] for r in range(1, cfg.rounds - 1)]
    return statistics.median(rounds), sim.layout.numel, sim.engine.name


def transfer_s(nodes: int, numel: int, repeats: int) -> float:
    """One round's traffic: ``[N, P]`` float32 to a Ray worker and ``[N, P]`` back (median)."""

    @ray.remote(num_cpus=1)
    def trained(flats: np.ndarray) -> np.ndarray:
        return np.array(flats)  # a worker's copy out of the store, sent back

    flats = np.random.default_rng(0).standard_normal((nodes, numel), dtype=np.float32)
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        back = ray.get(trained.remote(flats))
        np.array(back)  # the driver's copy out of the store
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=10)
    ap.add_argument("--steps", type=int, default=None,
                    help="local mini-batches per node and round (default 20; 5 with --quick)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds per run, the first and the last not timed (default 6; 3 with "
                         "--quick)")
    ap.add_argument("--batch-size", type=int, default=20)
    ap.add_argument("--model", default="fmnist-cnn")
    ap.add_argument("--topology", default="ring",
                    help="default ring; dense adds O(N²·P) work per round in the driver (every "
                         "node checks and mixes every other's state), which no worker shares")
    add_standard_args(ap)
    args = ap.parse_args()
    steps = args.steps or (5 if args.quick else 20)
    rounds = max(3, args.rounds or (3 if args.quick else 6))

    real = (DEFAULT_FASHION_MNIST_ROOT / "train-images-idx3-ubyte.gz").exists()
    dataset = load_dataset("fashion-mnist" if real else "synthetic")
    if not real:
        print("Fashion-MNIST not installed: using synthetic data", file=sys.stderr)
    model = args.model if real or args.model != "fmnist-cnn" else None
    cfg = RunConfig(nodes=args.nodes, rounds=rounds, dataset=dataset.name, model=model,
                    local_steps=steps, batch_size=args.batch_size, topology=args.topology,
                    device="cpu", engine="batched", eval_every=10_000, eval_samples=200)
    parts = partition(dataset.train_y, args.nodes, "iid", seed=0)
    connect(RayTarget("local", 2))  # one local Ray for every run below

    t_local, numel, local_name = seconds_per_round(cfg, dataset, parts, None)
    t_one, _, _ = seconds_per_round(cfg, dataset, parts, RayTarget("local", 1))
    t_two, _, _ = seconds_per_round(cfg, dataset, parts, RayTarget("local", 2))
    moved = transfer_s(args.nodes, numel, 2 if args.quick else 5)
    ray.shutdown()

    samples = args.nodes * steps * args.batch_size
    details = {
        "dataset": dataset.name, "model": cfg.model or "default", "nodes": args.nodes,
        "params": numel, "topology": args.topology, "steps_per_node": steps,
        "batch_size": args.batch_size,
        "rounds_timed": rounds - 2, "quick": args.quick, "torch_threads": torch.get_num_threads(),
        "seconds_per_round": {local_name: round(t_local, 3), "ray_1_worker": round(t_one, 3),
                              "ray_2_workers": round(t_two, 3)},
        "vs_local": round(t_local / t_two, 3),
        "transfer_s": round(moved, 3),
        "transfer_bytes_per_round": 2 * args.nodes * numel * 4,
        "transfer_share_2_workers": round(moved / t_two, 3),
    }
    if not args.json:
        m = machine()
        print(f"{args.nodes} nodes x {steps} steps of batch {args.batch_size} per round, "
              f"{details['model']}, {dataset.name}, {args.topology}, P = {numel:,}, "
              f"{m['cpus']} CPUs, "
              f"load {m['loadavg']}")
        print(f"{'engine':28}{'s/round':>10}{'samples/s':>12}")
        for label, t in ((f"local ({local_name})", t_local), ("Ray, 1 worker", t_one),
                         ("Ray, 2 workers", t_two)):
            print(f"{label:28}{t:>10.3f}{samples / t:>12.0f}")
        print(f"one round's transfer (2 x N x P float32 = "
              f"{details['transfer_bytes_per_round'] / 2**20:.0f} MiB) through Ray: "
              f"{moved:.3f} s, {100 * moved / t_two:.0f}% of a 2-worker round")
        print("A round on W workers ~ training/W + transfer(2·N·P floats) + the driver's share: "
              "the speed-up nears W as the local training per round grows against the transfer; "
              "use workers ~ cores.")
    emit_result("ray", t_one / t_two, 1.5, True, as_json=args.json, **details)
    return 0


if __name__ == "__main__":
    sys.exit(main())
