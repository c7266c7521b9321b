#!/usr/bin/env python3
"""Local training on the thread that first ran PyTorch against training in worker threads.

A daemon trains in a worker thread (its event loop must keep serving neighbours); the simulator
trains on its loop's thread (``InlineExecutor``, docs/architecture.md). This measures what the
thread costs: one ``LocalTrainer.train`` call (``fmnist-cnn``, ``--steps`` mini-batches of 20)
timed (a) on the main thread, (b) on one dedicated worker thread, (c) on three worker threads
in turn, (d) through ``asyncio.to_thread`` as the daemon calls it. The four alternate, so load
on the machine hits them alike; medians are reported, with ratios to (a).

The result's ``ratio`` is (d) / (a), the daemon's way against the main thread in the same run;
target ≤ 1.05 (the thread may cost at most the 5 % the whole daemon round is allowed).
``--quick``: 3 repeats of 10 steps.

    python benchmarks/bench_train_thread.py --repeats 6
    python benchmarks/bench_train_thread.py --quick --json
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch
from _common import add_standard_args, emit_result

from dacflnode.learning.datasets import DEFAULT_FASHION_MNIST_ROOT, load_dataset
from dacflnode.learning.layout import StateLayout
from dacflnode.learning.models import build_model
from dacflnode.learning.train import LocalTrainer, TrainConfig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=6)
    add_standard_args(ap)
    args = ap.parse_args()
    if args.quick:
        args.steps, args.repeats = 10, 3
    real = (DEFAULT_FASHION_MNIST_ROOT / "train-images-idx3-ubyte.gz").exists()
    data = load_dataset("fashion-mnist" if real else "synthetic")
    torch.manual_seed(0)
    model = build_model("fmnist-cnn", data.input_shape, data.num_classes)
    start = StateLayout.from_module(model).flatten_module(model)
    trainer = LocalTrainer(model, data.train_x[:4000], data.train_y[:4000],
                           TrainConfig(local_steps=args.steps), seed=0, node_index=0)

    def once() -> float:
        t0 = time.perf_counter()
        trainer.train(start, 0)
        return time.perf_counter() - t0

    async def via_to_thread() -> float:
        t0 = time.perf_counter()
        await asyncio.to_thread(trainer.train, start, 0)
        return time.perf_counter() - t0

    once()  # warm-up: allocator, kernels
    one = ThreadPoolExecutor(1)
    three = [ThreadPoolExecutor(1) for _ in range(3)]
    times: dict[str, list[float]] = {"main": [], "one_worker": [], "three_workers": [],
                                     "to_thread": []}
    for k in range(args.repeats):
        times["main"].append(once())
        times["one_worker"].append(one.submit(once).result())
        times["three_workers"].append(three[k % 3].submit(once).result())
        times["to_thread"].append(asyncio.run(via_to_thread()))
    median = {k: statistics.median(v) for k, v in times.items()}
    details = {
        "dataset": data.name, "steps": args.steps, "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "seconds_median": {k: round(v, 4) for k, v in median.items()},
        "ratios_to_main": {k: round(v / median["main"], 3) for k, v in median.items()},
    }
    if not args.json:
        print(f"fmnist-cnn, {args.steps} steps of batch 20, {details['threads']} threads, "
              f"{args.repeats} repeats")
        for k, v in median.items():
            print(f"{k:16} {v:8.3f} s  {v / median['main']:6.2f}x")
    emit_result("train_thread", median["to_thread"] / median["main"], 1.05, False,
                as_json=args.json, **details)
    return 0


if __name__ == "__main__":
    sys.exit(main())
