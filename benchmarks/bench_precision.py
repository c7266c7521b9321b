#!/usr/bin/env python3
"""bf16 against fp32 on the paper's Fashion-MNIST setting: accuracy per round, and wall time.

Runs the simulator twice with the same seeds, ``--precision fp32`` then ``--precision bf16``,
in the paper's setting: 10 nodes, dense topology, i.i.d. partition, batch 20, 1 local epoch,
lr 0.001 with decay 0.995, seed 0, DACFL (``--algorithm`` picks another), batched engine. It
prints the average test accuracy over the nodes ("Average of Acc") of every round for both, the
largest per-round difference in points (the bound is 0.5 point), the wall time of each run and
its projection to 100 rounds.

The ratio is fp32 time / bf16 time (the projected 100-round times, which a full run measures
as the sum of its rounds). Its target is the speed-up that brings one paper setting
(100 rounds) to 30 minutes, computed from the fp32 time measured in the same run:
``target = projected fp32 100-round time / 1800 s`` (at least 1).

``--quick`` runs rounds of 1/20 of a paper round (15 local steps per node, 500 test samples) and
scales the time of their training and evaluation calls by 20 for the projections (the rest of
a round, exchange and mixing, is counted once): a smoke test; only a full run gives the
figures.

    python benchmarks/bench_precision.py --rounds 100          # the long run (about an hour)
    python benchmarks/bench_precision.py --quick --json
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from _common import add_standard_args, emit_result, machine, timed_into

from dacflnode.config import RunConfig
from dacflnode.learning.datasets import DEFAULT_FASHION_MNIST_ROOT, load_dataset
from dacflnode.learning.partition import partition
from dacflnode.sim.simulator import RoundRecord, Simulation

ACCURACY_BOUND_POINTS = 0.5
BUDGET_S = 30 * 60  # one paper setting (100 rounds) in at most 30 minutes
PAPER_ROUNDS = 100
QUICK_STEPS, QUICK_TEST, QUICK_SCALE = 15, 500, 20  # 1/20 of 300 steps and 10,000 test samples


def run_once(cfg: RunConfig, algorithm: str, dataset: Any, parts: Any
             ) -> tuple[list[float], list[float], float, float]:
    """Per-round average accuracy, per-round wall seconds, the whole run's wall seconds, and the
    seconds spent in the stacked trainer's training and evaluation calls (batched engine; the
    rest of a round is exchange, mixing and bookkeeping)."""
    sim = Simulation(cfg, algorithm, dataset, parts)
    calls: dict[str, list[float]] = {"train": [], "evaluate": []}
    trainer = getattr(sim.engine, "trainer", None)
    if trainer is not None:
        for name in calls:
            setattr(trainer, name, timed_into(getattr(trainer, name), calls[name]))
    marks: list[float] = []
    accs: list[float] = []

    def progress(name: str, done: int, total: int, record: RoundRecord) -> None:
        marks.append(time.perf_counter())
        accs.append(float("nan") if record.avg_acc is None else record.avg_acc)

    started = time.perf_counter()
    sim.run(progress)
    wall = time.perf_counter() - started
    rounds = [b - a for a, b in zip([started, *marks[:-1]], marks, strict=True)]
    return accs, rounds, wall, sum(calls["train"]) + sum(calls["evaluate"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds of each run (default 10; 3 with --quick)")
    ap.add_argument("--algorithm", default="dacfl")
    ap.add_argument("--engine", default="batched", choices=["batched", "sequential"])
    ap.add_argument("--threads", type=int, default=None, help="PyTorch threads (default: its)")
    add_standard_args(ap)
    args = ap.parse_args()
    rounds = args.rounds or (3 if args.quick else 10)

    if not (DEFAULT_FASHION_MNIST_ROOT / "train-images-idx3-ubyte.gz").exists():
        print(f"Fashion-MNIST is not installed in {DEFAULT_FASHION_MNIST_ROOT}", file=sys.stderr)
        return 2
    dataset = load_dataset("fashion-mnist")
    base = RunConfig(nodes=10, rounds=rounds, dataset="fashion-mnist", topology="dense",
                     partition="iid", batch_size=20, local_epochs=1, lr=0.001, lr_decay=0.995,
                     seed=0, device="cpu", engine=args.engine, threads=args.threads,
                     algorithm=(args.algorithm,))
    scale = 1
    if args.quick:
        base = RunConfig(**{**base.__dict__, "local_steps": QUICK_STEPS,
                            "eval_samples": QUICK_TEST})
        scale = QUICK_SCALE
    base.validate()
    base.apply_threads()
    parts = partition(dataset.train_y, base.nodes, base.partition, seed=base.seed)

    acc: dict[str, list[float]] = {}
    per_round: dict[str, list[float]] = {}
    wall: dict[str, float] = {}
    work: dict[str, float] = {}  # seconds in training and evaluation calls (batched engine)
    for precision in ("fp32", "bf16"):
        cfg = RunConfig(**{**base.__dict__, "precision": precision})
        acc[precision], per_round[precision], wall[precision], work[precision] = run_once(
            cfg, args.algorithm, dataset, parts)

    gaps = [abs(a - b) * 100 for a, b in zip(acc["fp32"], acc["bf16"], strict=True)]
    max_gap = max(gaps)
    # scale the training and evaluation calls (1 with a full run), not the rest of a round
    projected = {p: (work[p] * scale + sum(per_round[p]) - work[p]) / rounds * PAPER_ROUNDS
                 for p in wall}
    target = round(max(1.0, projected["fp32"] / BUDGET_S), 3)
    ratio = projected["fp32"] / projected["bf16"]  # a full run: the sum of its round times
    if not args.json:
        m = machine()
        print(f"{args.algorithm}, Fashion-MNIST, 10 nodes, dense, iid, batch 20, "
              f"{'15 steps (quick)' if args.quick else '1 local epoch'}, {rounds} rounds, "
              f"{args.engine} engine; {m['cpus']} CPUs, load {m['loadavg']}")
        print(f"{'round':>5} {'fp32 acc %':>11} {'bf16 acc %':>11} {'|diff| pt':>10}"
              f" {'fp32 s':>8} {'bf16 s':>8}")
        for r in range(rounds):
            print(f"{r + 1:>5} {acc['fp32'][r] * 100:>11.2f} {acc['bf16'][r] * 100:>11.2f} "
                  f"{gaps[r]:>10.2f} {per_round['fp32'][r]:>8.2f} {per_round['bf16'][r]:>8.2f}")
        print(f"max |accuracy difference| {max_gap:.2f} point (bound {ACCURACY_BOUND_POINTS})")
        for p in ("fp32", "bf16"):
            print(f"{p}: {wall[p]:.1f} s for {rounds} rounds; projected {PAPER_ROUNDS} paper "
                  f"rounds {projected[p] / 60:.1f} min")
        print(f"speed-up needed for {PAPER_ROUNDS} rounds in {BUDGET_S // 60} min: {target}x")
    emit_result(
        "precision", ratio, target, True, as_json=args.json,
        accuracy_gap_points=round(max_gap, 3),
        final_accuracy_gap_points=round(gaps[-1], 3),
        accuracy_bound_points=ACCURACY_BOUND_POINTS,
        accuracy_within_bound=max_gap <= ACCURACY_BOUND_POINTS,
        target_rule="projected fp32 100-round time / 1800 s, from this run's fp32 time",
        algorithm=args.algorithm, engine=args.engine, rounds=rounds, quick=args.quick,
        avg_acc={p: [round(a, 4) for a in acc[p]] for p in acc},
        round_s={p: [round(s, 2) for s in per_round[p]] for p in per_round},
        wall_s={p: round(w, 1) for p, w in wall.items()},
        projected_100_rounds_min={p: round(v / 60, 1) for p, v in projected.items()},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
