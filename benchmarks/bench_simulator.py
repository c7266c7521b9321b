#!/usr/bin/env python3
"""Simulator training throughput against a bare single-model fp32 PyTorch loop, in the same run.

(a) bare: one ``fmnist-cnn`` trained in float32 with plain ``torch.optim.SGD`` on batches of 20
    — no project code at all (the baseline of every ratio);
(b) the simulator's rounds (N ``NodeRunner`` s over the in-memory transport: exchange, mix,
    train, FODAC, bookkeeping for every node) with ``--engine batched`` at ``--precision``
    (default ``bf16``: on Fashion-MNIST it stays within the 0.5-point accuracy bound of fp32,
    see ``benchmarks/bench_precision.py``; pass ``--precision fp32`` where it does not);
(c) the batched engine in fp32, and the sequential engine (one model per node, the daemon's
    code path) in fp32 and at ``--precision``, for comparison.

Per step: samples per second of training (a round of ``--steps`` mini-batches per node, no
evaluation). Per round: the same round plus every node evaluating ``--eval-samples`` test
samples, from which the evaluation's share and a projected paper round (1 local epoch of 6,000
samples per node, the whole 10,000-sample test set) and 100 rounds are derived.

The ratio is (b) against (a); the target is >= 2.5 for 10 simulated nodes.

    python benchmarks/bench_simulator.py --nodes 10 --steps 100
    python benchmarks/bench_simulator.py --quick --json
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from _common import add_standard_args, emit_result, machine, timed_into
from torch import nn

from dacflnode.config import RunConfig
from dacflnode.learning.datasets import DEFAULT_FASHION_MNIST_ROOT, Dataset, load_dataset
from dacflnode.learning.models import build_model
from dacflnode.learning.partition import partition
from dacflnode.learning.train import PRECISIONS
from dacflnode.sim.simulator import RoundRecord, Simulation

#: A paper round: every node trains one epoch of its 6,000 samples and evaluates the test set.
PAPER_SAMPLES_PER_NODE = 6000
PAPER_TEST_SAMPLES = 10000


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


@dataclass
class Round:
    """The simulator's second round: its samples/s and seconds, and (batched engine) the seconds
    spent in the stacked trainer's training and evaluation calls."""

    samples_per_s: float
    seconds: float
    train_s: float | None
    eval_s: float | None


def simulator(cfg: RunConfig, dataset: Dataset, parts: list[np.ndarray], *, evaluate: bool
              ) -> Round:
    """The simulator's second round: N NodeRunners over the in-memory transport, from the moment
    the last node finished round 1 to the moment the last node finished round 2 (the first round
    warms up; no files). With ``evaluate`` every node evaluates its model on
    ``cfg.eval_samples`` test samples every round, else never."""
    run = replace(cfg, rounds=3, eval_every=1 if evaluate else 1000)
    sim = Simulation(run, "dacfl", dataset, parts)
    marks: dict[int, tuple[float, int]] = {}
    calls: dict[str, list[float]] = {"train": [], "evaluate": []}
    trainer = getattr(sim.engine, "trainer", None)  # the batched engine's stacked trainer
    if trainer is not None:
        for name in calls:
            setattr(trainer, name, timed_into(getattr(trainer, name), calls[name]))

    def progress(name: str, done: int, total: int, record: RoundRecord) -> None:
        marks[done] = (time.perf_counter(), record.samples)

    sim.run(progress)
    (first, _), (second, samples) = marks[1], marks[2]
    train_s = calls["train"][1] if len(calls["train"]) > 1 else None
    eval_s = calls["evaluate"][1] if len(calls["evaluate"]) > 1 else (0.0 if train_s else None)
    return Round(samples / (second - first), second - first, train_s, eval_s)


def write_profile(path: str, cfg: RunConfig, dataset: Dataset, parts: list[np.ndarray],
                  command: str) -> None:
    """Profile one round of the batched trainer per precision (after a warm-up round): every
    node's ``cfg.local_steps`` steps, then every node evaluating ``cfg.eval_samples`` test
    samples; write the top operators by self CPU time (summed over the worker threads)."""
    from torch.profiler import ProfilerActivity, profile

    from dacflnode.learning.layout import StateLayout
    from dacflnode.sim.batched.trainer import BatchedTrainer

    torch.manual_seed(0)
    model = build_model(cfg.model or "fmnist-cnn", dataset.input_shape, dataset.num_classes)
    start = StateLayout.from_module(model).flatten_module(model).expand(cfg.nodes, -1).clone()
    node_data = [(dataset.train_x[torch.from_numpy(p)], dataset.train_y[torch.from_numpy(p)])
                 for p in parts]
    test_x, test_y = dataset.test_x[:cfg.eval_samples], dataset.test_y[:cfg.eval_samples]
    lines = [f"# {command}", f"# machine: {machine()}",
             f"# {cfg.nodes} nodes, {cfg.model}, batch {cfg.batch_size}, {cfg.local_steps} steps "
             f"per node, then {cfg.eval_samples} test samples per node; torch.profiler, CPU"]
    for precision in PRECISIONS:
        trainer = BatchedTrainer(copy.deepcopy(model), node_data,
                                 replace(cfg, precision=precision).train_config(), seed=0)
        trainer.train(start, 0)  # warm-up
        trainer.evaluate(start, test_x, test_y)
        started = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            trainer.train(start, 1)
            trained = time.perf_counter()
            trainer.evaluate(start, test_x, test_y)
        done = time.perf_counter()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18,
                                          max_name_column_width=40)
        lines += ["", f"## {precision}: round {done - started:.2f} s wall under the profiler "
                  f"(training {trained - started:.2f} s, evaluation {done - trained:.2f} s), "
                  f"load average {[round(v, 2) for v in os.getloadavg()]}", table]
    Path(path).write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=10)
    ap.add_argument("--steps", type=int, default=None,
                    help="mini-batches per node and round (default 100, a third of a paper round; "
                         "10 with --quick)")
    ap.add_argument("--batch-size", type=int, default=20)
    ap.add_argument("--model", default="fmnist-cnn")
    ap.add_argument("--precision", choices=PRECISIONS, default="bf16",
                    help="precision of the measured engine (default bf16, the fastest that "
                         "meets the accuracy bound)")
    ap.add_argument("--eval-samples", type=int, default=None,
                    help="test samples every node evaluates in the per-round figure (default "
                         "2000; 300 with --quick)")
    ap.add_argument("--profile", metavar="FILE",
                    help="instead of the figures: profile one batched round (training plus "
                         "evaluation) in fp32 and in bf16 with torch.profiler and write the "
                         "top operators by self CPU time to FILE")
    add_standard_args(ap)
    args = ap.parse_args()
    steps = args.steps or (10 if args.quick else 100)
    eval_samples = args.eval_samples or (300 if args.quick else 2000)

    real = (DEFAULT_FASHION_MNIST_ROOT / "train-images-idx3-ubyte.gz").exists()
    dataset = load_dataset("fashion-mnist" if real else "synthetic")
    if not real:
        print("Fashion-MNIST not installed: using synthetic data", file=sys.stderr)
    cfg = RunConfig(nodes=args.nodes, rounds=2, dataset=dataset.name, model=args.model,
                    local_steps=steps, batch_size=args.batch_size, topology="dense",
                    device="cpu", eval_samples=eval_samples)
    parts = partition(dataset.train_y, args.nodes, "iid", seed=0)
    if args.profile:
        write_profile(args.profile, cfg, dataset, parts, " ".join(sys.argv))
        return 0
    total_steps = steps * args.nodes
    # the bare loop runs before and after the simulator (the allocator warms up over a run: the
    # first multi-megabyte gradient buffers are page-faulted in); the better of the two counts
    bare_first = bare_loop(dataset.train_x, dataset.train_y, args.batch_size, total_steps,
                           args.model)
    precisions = [args.precision] + [p for p in PRECISIONS if p != args.precision]
    step_rate: dict[str, float] = {}  # f"{engine}_{precision}" -> samples/s, no evaluation
    rounds: dict[str, Round] = {}  # the batched engine's round with evaluation
    for engine in ("batched", "sequential"):
        for precision in precisions:
            key = f"{engine}_{precision}"
            run = replace(cfg, engine=engine, precision=precision)
            step_rate[key] = simulator(run, dataset, parts, evaluate=False).samples_per_s
            if engine == "batched":
                rounds[key] = simulator(run, dataset, parts, evaluate=True)
    bare_last = bare_loop(dataset.train_x, dataset.train_y, args.batch_size, total_steps,
                          args.model)
    bare = max(bare_first, bare_last)

    subject = f"batched_{args.precision}"
    # a paper round: the training and evaluation calls scaled to 300 steps and 10,000 test
    # samples per node, plus the rest of the round (exchange, mixing, FODAC) as measured
    projected: dict[str, dict[str, float]] = {}
    for key, r in rounds.items():
        assert r.train_s is not None and r.eval_s is not None
        fixed = max(0.0, r.seconds - r.train_s - r.eval_s)
        train = r.train_s * PAPER_SAMPLES_PER_NODE / (steps * args.batch_size)
        paper_round = train + r.eval_s * PAPER_TEST_SAMPLES / eval_samples + fixed
        projected[key] = {"round_s": round(r.seconds, 3), "train_s": round(r.train_s, 3),
                          "eval_s": round(r.eval_s, 3), "rest_s": round(fixed, 3),
                          "paper_round_s": round(paper_round, 2),
                          "paper_round_train_samples_per_s": round(
                              PAPER_SAMPLES_PER_NODE * args.nodes / (train + fixed), 1),
                          "paper_100_rounds_min": round(paper_round * 100 / 60, 1)}
    details = {
        "dataset": dataset.name, "model": args.model, "nodes": args.nodes,
        "batch_size": args.batch_size, "steps_per_node": steps, "precision": args.precision,
        "eval_samples": eval_samples, "quick": args.quick,
        "samples_per_s": {"bare_fp32_single_model": round(bare, 1),
                          "bare_runs": [round(bare_first, 1), round(bare_last, 1)],
                          **{f"simulator_{k}": round(v, 1) for k, v in step_rate.items()}},
        "ratio_vs_bare_fp32": {k: round(v / bare, 3) for k, v in step_rate.items()},
        "bf16_vs_fp32_per_step": {
            e: round(step_rate[f"{e}_bf16"] / step_rate[f"{e}_fp32"], 3)
            for e in ("batched", "sequential")},
        "bf16_vs_fp32_per_round": round(rounds["batched_fp32"].seconds
                                        / rounds["batched_bf16"].seconds, 3),
        "bf16_vs_fp32_per_paper_round": round(projected["batched_fp32"]["paper_round_s"]
                                              / projected["batched_bf16"]["paper_round_s"], 3),
        "per_round": projected,
    }
    if not args.json:
        m = machine()
        print(f"{args.nodes} nodes x {steps} steps of batch {args.batch_size}, {args.model}, "
              f"{dataset.name}, {m['cpus']} CPUs, load {m['loadavg']}")
        print(f"{'per step':30}{'samples/s':>12}{'x bare fp32':>13}")
        print(f"{'bare single-model loop, fp32':30}{bare:>12.0f}{1.0:>13.2f}")
        for key, value in step_rate.items():
            print(f"{'simulator, ' + key.replace('_', ', '):30}{value:>12.0f}{value / bare:>13.2f}")
        print(f"per round ({steps} steps + {eval_samples} test samples per node):")
        for key, p in projected.items():
            print(f"  {key:13} {p['round_s']:6.2f} s (train {p['train_s']:.2f}, evaluate "
                  f"{p['eval_s']:.2f}, rest {p['rest_s']:.2f}); projected paper round "
                  f"{p['paper_round_s']:.1f} s ({p['paper_round_train_samples_per_s']:.0f} "
                  f"training samples/s, {p['paper_round_train_samples_per_s'] / bare:.2f}x "
                  f"bare), 100 rounds {p['paper_100_rounds_min']:.0f} min")
    emit_result("simulator", step_rate[subject] / bare, 2.5, True, as_json=args.json, **details)
    return 0


if __name__ == "__main__":
    sys.exit(main())
