#!/usr/bin/env python3
"""One member poisons what it sends: how far the honest nodes end from the untouched run.

The measurement of issue 17 (docs/security.md, "A member that misbehaves"): in the simulator,
on synthetic data, node-2 of a 5-ring and of a 10-node random-regular graph (degree 3) sends its
states multiplied by 5, 50, 99 or −1 (a sign flip), once (round R/3) or every round from R/3 on
(a ``poison`` entry of the fault plan, docs/faults.md). Every node guards its inbox as a daemon
does (dacflnode/wire/state_guard.py). Per case it prints the honest nodes' final mean accuracy
against the untouched run of the same seeds, the edges quarantined, the invariant residual
``|Σx − Σω_prev| / |Σω_prev|`` over the nodes the honest ones still exchange with, and the
longest exchange phase of any honest round next to the untouched run's. The simulator has no
deadline: a round that waited for a refused state would never end, and the run would fail its
timeout instead; its exchange phases include waiting for the neighbours' training (all nodes
share one thread), so they are compared with the untouched run's, not with a deadline (the
daemon test tests/e2e/test_insider_cluster.py checks exchange times against a deadline).

The result's ``ratio`` is the worst gap, in accuracy points, between a poisoned run's honest
mean and the untouched run's (the baseline, measured in the same process); target ≤ 2.
``--quick``: 9 rounds and fewer samples (a few minutes on 2 cores).

Extension point: robust mixing (ClippedGossip) is a run setting of its own; when it exists,
a ``--mixing`` passthrough goes into :func:`config_for` (it does not on this branch).

    python benchmarks/bench_insider.py --quick
    python benchmarks/bench_insider.py --rounds 30 --json
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

from _common import add_standard_args, emit_result

from dacflnode.config import RunConfig
from dacflnode.sim.insider import Outcome, load, play

SCALES = (5.0, 50.0, 99.0, -1.0)
TOPOLOGIES = (("5-ring", {"nodes": 5, "topology": "ring"}),
              ("10-regular", {"nodes": 10, "topology": "random-regular", "degree": 3}))
MEMBER = "node-2"


def config_for(args: argparse.Namespace, topology: dict[str, Any]) -> RunConfig:
    base = RunConfig(dataset="synthetic", model="tiny-cnn", lr=args.lr, batch_size=20,
                     rounds=args.rounds, synthetic_train=args.samples * topology["nodes"],
                     synthetic_test=400, engine="sequential", device="cpu", seed=args.seed,
                     eval_every=args.rounds)  # the final accuracy is the one compared
    return replace(base, **topology)


def row(name: str, pattern: str, scale: float | None, out: Outcome,
        base: Outcome) -> dict[str, Any]:
    return {
        "topology": name, "pattern": pattern, "scale": scale,
        "honest_accuracy": round(out.mean_accuracy, 4),
        "untouched_accuracy": round(base.mean_accuracy, 4),
        "gap_points": round(100 * abs(out.mean_accuracy - base.mean_accuracy), 2),
        "quarantined": len(out.quarantined), "refused": out.refused,
        "invariant": out.invariant,
        "longest_exchange_s": round(out.longest_exchange_s, 4),
        "untouched_longest_exchange_s": round(base.longest_exchange_s, 4),
        "longest_round_s": round(out.longest_round_s, 4),
        "wall_s": round(out.wall_s, 2),
    }


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    first = max(1, args.rounds // 3)
    for name, topology in TOPOLOGIES:
        cfg = config_for(args, topology)
        data = load(cfg)
        base = play(cfg, [], data=data)
        rows.append(row(name, "none", None, base, base))
        for pattern, rounds in (("once", [first, first]), ("every", [first, cfg.rounds - 1])):
            for scale in SCALES:
                events = [{"poison": MEMBER, "rounds": rounds, "scale": scale}]
                rows.append(row(name, pattern, scale, play(cfg, events, data=data), base))
                if not args.json:
                    r = rows[-1]
                    print(f"{name:10s} {pattern:5s} x{scale:>5g}: honest accuracy "
                          f"{100 * r['honest_accuracy']:.2f}% (untouched "
                          f"{100 * r['untouched_accuracy']:.2f}%, gap {r['gap_points']:.2f} "
                          f"points), quarantined {r['quarantined']}, refused {r['refused']}, "
                          f"invariant {r['invariant']:.1e}, longest exchange "
                          f"{r['longest_exchange_s']:.2f} s (untouched "
                          f"{r['untouched_longest_exchange_s']:.2f} s)", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--samples", type=int, default=200, help="training samples per node")
    ap.add_argument("--seed", type=int, default=0)
    add_standard_args(ap)
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.samples = 9, 80
    rows = measure(args)
    attacked = [r for r in rows if r["pattern"] != "none"]
    worst = max(r["gap_points"] for r in attacked)
    worst_invariant = max((r["invariant"] or 0.0) for r in rows)
    longest = max(r["longest_exchange_s"] for r in rows)
    if not args.json:
        print(f"worst gap {worst:.2f} points over {len(attacked)} attacks; worst invariant "
              f"{worst_invariant:.1e}; longest exchange of an honest round {longest:.3f} s")
    emit_result("bench_insider", worst, 2.0, False, as_json=args.json, rounds=args.rounds,
                rows=rows, worst_invariant=worst_invariant, longest_exchange_s=longest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
