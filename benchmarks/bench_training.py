#!/usr/bin/env python3
"""Local-training throughput: N simulated nodes against one bare single-model PyTorch loop.

Measured in training samples per second, on the same data, the same mini-batch size and the
same machine (PyTorch's default thread settings):

(a) **bare**: one model (the ``fmnist-cnn`` architecture written out here as a plain
    ``nn.Sequential``) trained with ``torch.optim.SGD`` and cross-entropy on node 0's data,
    mini-batches drawn from a random permutation — no project code at all;
(b) **sequential**: N :class:`~dacflnode.learning.train.LocalTrainer` (one model per node,
    the daemon's code path), one round each, one after the other;
(c) **batched**: one :class:`~dacflnode.sim.batched.trainer.BatchedTrainer` training all N nodes
    together, one round at a time.

(b) and (c) train rounds of ``--samples-per-node / --batch-size`` steps per node from the same
start vectors, as the simulator does. Every measurement runs in a fresh child process (so that
nothing one of them sets up, e.g. the batched engine's ``malloc`` settings, affects the others),
and the three alternate ``--repeats`` times so that background load on the machine hits them
alike; each repeat measures for ``--seconds / --repeats`` seconds after a warm-up. Reported:
the median and the best repeat of each, and the ratios of the medians (the headline: a bare
loop's throughput alone varies by ±15 % from run to run on a shared VM) and of the bests.

``--single-thread`` runs everything with one intra-op thread (the batched engine with one
worker) and counts the process's CPU time instead of the wall clock: it compares how much work
each engine spends per sample, and is hardly disturbed by other load on the machine.

Data: synthetic 1×28×28 images of 10 classes (class prototypes plus noise), or, with
``--real``, Fashion-MNIST from ``--data-root`` (default: where Debian's package installs it).

The result's ``ratio`` is (c) / (a), medians: the batched engine against the bare loop, in the
same run ((b) / (a) when ``--engines`` leaves the batched engine out). Target ≥ 1.5, the
simulator's figure for 10 nodes (``bench_simulator.py`` measures the whole simulator, rounds
included). ``--quick``: one repeat of 3 s per engine, 100 samples per node.

    .venv/bin/python benchmarks/bench_training.py --nodes 10 --batch-size 20 --seconds 10
    .venv/bin/python benchmarks/bench_training.py --quick --json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F
from _common import add_standard_args, emit_result
from torch import nn

ENGINES = ("bare", "sequential", "batched")


def make_data(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    """``nodes * samples_per_node`` training samples, ``[n, C, H, W]`` float32 and int64."""
    total = args.nodes * args.samples_per_node
    if args.real:
        from dacflnode.learning.datasets import DEFAULT_FASHION_MNIST_ROOT, load_dataset

        root = args.data_root or DEFAULT_FASHION_MNIST_ROOT
        data = load_dataset("fashion-mnist", root)
        if total > len(data.train_y):
            raise SystemExit(f"need {total} samples, Fashion-MNIST has {len(data.train_y)}")
        return data.train_x[:total].contiguous(), data.train_y[:total].contiguous()
    gen = torch.Generator().manual_seed(0)
    protos = torch.randn(10, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (total,), generator=gen)
    x = protos[y] + 2.0 * torch.randn(total, 1, 28, 28, generator=gen)
    return x, y


def bare_model(channels: int, num_classes: int) -> nn.Module:
    """The fmnist-cnn architecture, spelled out without project code."""
    return nn.Sequential(
        nn.Conv2d(channels, 32, 5, padding=2),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 7 * 7, 512),
        nn.ReLU(),
        nn.Linear(512, num_classes),
    )


def timed(
    run_unit: Any, samples_per_unit: int, seconds: float, warmup: int, cpu_time: bool = False
) -> dict[str, Any]:
    """Call ``run_unit`` until ``seconds`` have passed (after ``warmup`` calls).

    With ``cpu_time``, the process's CPU time is counted instead of the wall clock.
    """
    clock = time.process_time if cpu_time else time.perf_counter
    for _ in range(warmup):
        run_unit()
    units = 0
    started = clock()
    while True:
        run_unit()
        units += 1
        elapsed = clock() - started
        if elapsed >= seconds:
            break
    return {"samples": units * samples_per_unit, "seconds": elapsed,
            "samples_per_s": units * samples_per_unit / elapsed}


def measure(engine: str, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement, in this process."""
    if args.single_thread:
        torch.set_num_threads(1)
    x, y = make_data(args)
    n, per = args.nodes, args.samples_per_node
    if engine == "bare":
        torch.manual_seed(0)
        model = bare_model(x.shape[1], 10)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr)
        model.train()
        xs, ys = x[:per], y[:per]

        def epoch() -> None:
            for idx in torch.randperm(per).split(args.batch_size):
                opt.zero_grad()
                loss = F.cross_entropy(model(xs[idx]), ys[idx])
                loss.backward()
                opt.step()

        return timed(epoch, per, args.seconds_each, warmup=1, cpu_time=args.single_thread)

    from dacflnode.learning.layout import StateLayout
    from dacflnode.learning.models import build_model
    from dacflnode.learning.train import LocalTrainer, TrainConfig
    from dacflnode.sim.batched.trainer import BatchedTrainer

    torch.manual_seed(0)
    model = build_model(args.model, tuple(x.shape[1:]), 10)  # type: ignore[arg-type]
    layout = StateLayout.from_module(model)
    start = layout.flatten_module(model)
    flats = start.unsqueeze(0).repeat(n, 1)
    cfg = TrainConfig(lr=args.lr, lr_decay=1.0, batch_size=args.batch_size)
    shares = [(x[i * per : (i + 1) * per], y[i * per : (i + 1) * per]) for i in range(n)]
    rounds = [0]
    if engine == "sequential":
        import copy

        trainers = [
            LocalTrainer(copy.deepcopy(model), xs, ys, cfg, seed=0, node_index=i)
            for i, (xs, ys) in enumerate(shares)
        ]

        def one_round() -> None:
            for i, t in enumerate(trainers):
                t.train(flats[i], rounds[0])
            rounds[0] += 1

        result = timed(one_round, n * per, args.seconds_each, warmup=1, cpu_time=args.single_thread)
    else:
        batched = BatchedTrainer(model, shares, cfg, seed=0)

        def one_round() -> None:
            batched.train(flats, rounds[0])
            rounds[0] += 1

        result = timed(one_round, n * per, args.seconds_each, warmup=1, cpu_time=args.single_thread)
        result["workers"] = batched.workers
    return result


def run_child(engine: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [
        sys.executable, os.path.abspath(__file__), "--child", engine,
        "--nodes", str(args.nodes), "--batch-size", str(args.batch_size),
        "--samples-per-node", str(args.samples_per_node), "--model", args.model,
        "--lr", str(args.lr), "--seconds-each", str(args.seconds_each),
    ]
    if args.real:
        cmd.append("--real")
    if args.single_thread:
        cmd.append("--single-thread")
    if args.data_root:
        cmd += ["--data-root", args.data_root]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=None,
                        help="measuring time per engine, split over the repeats "
                        "(default 10; quick: 3)")
    parser.add_argument("--repeats", type=int, default=None, help="default 5 (quick: 1)")
    parser.add_argument("--samples-per-node", type=int, default=None,
                        help="default 400 (quick: 100)")
    parser.add_argument("--model", default="fmnist-cnn")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--real", action="store_true", help="use Fashion-MNIST")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument(
        "--single-thread", action="store_true",
        help="one intra-op thread everywhere (the batched engine: one worker) and CPU time "
        "instead of wall time: compares the engines' work per sample, undisturbed by other "
        "load on the machine",
    )
    add_standard_args(parser)
    parser.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--seconds-each", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.seconds is None:
        args.seconds = 3.0 if args.quick else 10.0
    if args.repeats is None:
        args.repeats = 1 if args.quick else 5
    if args.samples_per_node is None:
        args.samples_per_node = 100 if args.quick else 400

    if args.child:
        print(json.dumps(measure(args.child, args)))
        return

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if "bare" not in engines:
        engines.insert(0, "bare")
    args.seconds_each = args.seconds / args.repeats
    runs: dict[str, list[float]] = {e: [] for e in engines}
    extra: dict[str, Any] = {}
    load_before = loadavg()
    for rep in range(args.repeats):
        order = engines if rep % 2 == 0 else engines[::-1]
        for engine in order:
            result = run_child(engine, args)
            runs[engine].append(result["samples_per_s"])
            if "workers" in result:
                extra["batched_workers"] = result["workers"]
    best = {e: max(v) for e, v in runs.items()}
    median = {e: statistics.median(v) for e, v in runs.items()}
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "loadavg_before": load_before,
            "loadavg_after": loadavg(),
            "clock": "process CPU time, 1 thread" if args.single_thread else "wall time",
        },
        "setup": {
            "nodes": args.nodes, "batch_size": args.batch_size, "model": args.model,
            "samples_per_node": args.samples_per_node,
            "data": "fashion-mnist" if args.real else "synthetic 1x28x28",
            "seconds_per_engine": args.seconds, "repeats": args.repeats, **extra,
        },
        "samples_per_s": {
            e: {"median": median[e], "best": best[e], "all": v} for e, v in runs.items()
        },
        "ratio_to_bare": {e: median[e] / median["bare"] for e in engines},
        "ratio_to_bare_best": {e: best[e] / best["bare"] for e in engines},
    }
    subject = next((e for e in ("batched", "sequential") if e in engines), "bare")
    if args.json:
        emit_result("training", report["ratio_to_bare"][subject], 1.5, True, as_json=True,
                    subject=subject, **{k: v for k, v in report.items() if k != "machine"},
                    clock=report["machine"]["clock"],
                    loadavg_before=report["machine"]["loadavg_before"])
        return
    m = report["machine"]
    print(f"{args.model}, {args.nodes} nodes, batch {args.batch_size}, "
          f"{args.samples_per_node} samples/node, {report['setup']['data']}; "
          f"{m['cpus']} CPUs, torch {m['torch']}, {m['clock']}; "
          f"load average {m['loadavg_before']:.2f} -> {m['loadavg_after']:.2f}")
    labels = {"bare": "(a) bare single-model loop", "sequential": "(b) N LocalTrainers",
              "batched": "(c) BatchedTrainer"}
    print(f"{'':30s} {'samples/s':^17s} {'ratio to (a)':^19s}")
    print(f"{'engine':30s} {'median':>8s} {'best':>8s} {'median':>10s} {'best':>8s}")
    for e in engines:
        print(f"{labels[e]:30s} {median[e]:8.0f} {best[e]:8.0f} "
              f"{report['ratio_to_bare'][e]:9.2f}x {report['ratio_to_bare_best'][e]:7.2f}x")
    emit_result("training", report["ratio_to_bare"][subject], 1.5, True, as_json=False)


if __name__ == "__main__":
    main()
