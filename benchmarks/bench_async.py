"""Asynchronous DACFL against synchronized rounds, with one node slowed and without: real
daemons on this machine (``dacflnode launch``), time to a target accuracy.

Arms, each a cluster of its own on Fashion-MNIST (``--dataset`` to change):

* ``sync``: synchronized rounds, a round deadline long enough for every node (the paper's);
* ``sync-tight``: synchronized rounds with a tight deadline, today's answer to a slow node
  (its state misses the round; the one-sided-use repair keeps the sum exact): ``--tight``
  times the median round of the healthy synchronous arm (0.5 by default). The deadline bounds
  a round's wait for its neighbours' states, so it is tight only where it is shorter than the
  slow node's lag (its round less a healthy one): a deadline of 1.5 rounds, which the first
  figures used, never fires for a node whose round takes twice as long, and that arm is then
  the unbounded one again, with its timing noise. Each arm reports how many neighbour-rounds
  its nodes missed (``missed``), so whether the deadline fired is there to read;
* ``async``: ``schedule: async``.

Each arm runs twice: with node-0 slowed ``--factor`` times (``launch --slowdown node-0=F``: the
daemon pauses ``F - 1`` times each block's training; a cgroup CPU quota would slow its
exchanges too, which this machine's launch cannot place one process under) and with no slow
node. Measured from the nodes' metrics lines: the wall time from the run's first round until
the mean of the nodes' test accuracy (each node's latest) first reaches ``--target``, the
blocks (rounds) and exchanges per node, and ``dacflnode invariant`` on the checkpoints after
the run.

The result's ratio is the synchronous arm's time to the target over the asynchronous arm's,
with the slow node (target 2: async at least twice as fast); the details carry the others
(against the tight deadline: 1.3; without a slow node, async over sync: at least 0.9) and
every arm's figures. Each topology is one run set: ``--quick`` runs the 5-node ring only,
with short blocks; the full run adds the 10-node random-regular graph.

**The simulator's prediction.** After a set's daemons, the same three arms with the slow node
run in the simulator on its virtual clock (``simulate --virtual-time``), a block taking the
healthy synchronous arm's median round (``block_time``) and the tight arm's deadline the same
seconds. The slow node's blocks take ``1 + (F - 1) * train / round`` times as long there
(``simulated_factor``, from that arm's median training time): the daemon pauses after its
training only, not after its evaluation and exchanges. Each arm's virtual time to the target
gives the order the simulator predicts, and the result says whether it is the daemons' order
(``prediction.order_matches``), with both times per arm, the neighbour-rounds each
simulated arm missed (``simulated_missed``) and the arms it cannot tell apart
(``simulated_ties``: within 2 %). Each simulated node trains on its own (the
sequential engine), so a deadline there lets the others go on without the slow node as a
daemon's does. ``--no-predict`` skips it.

Time to 75 % is a crossing on a plateau at these settings (the mean accuracy hovers within a
point of 75 % for several rounds), so two arms within a few rounds of each other can swap on
timing noise alone; the order is telling where the arms differ by more than that.

    .venv/bin/python benchmarks/bench_async.py --quick --json
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from _common import add_standard_args, emit_result

from dacflnode.cluster.launcher import launch
from dacflnode.config import RunConfig
from dacflnode.records.metrics_log import METRICS_FILE, read_metrics
from dacflnode.sim.experiment import run_experiment
from dacflnode.sim.report import find_runs, time_to_accuracy

ARMS = ("sync", "sync-tight", "async")


def invariant_report(dirs: list[str]) -> dict[str, Any]:
    """``dacflnode invariant --json`` on the nodes' checkpoints, as a user runs it."""
    out = subprocess.run([sys.executable, "-m", "dacflnode", "invariant", "--json", *dirs],
                         capture_output=True, text=True, check=False)
    return dict(json.loads(out.stdout))


def base_config(args: argparse.Namespace, topology: str, nodes: int) -> RunConfig:
    return RunConfig(
        dataset=args.dataset, nodes=nodes, rounds=args.rounds, topology=topology, degree=3,
        local_steps=args.local_steps, lr=args.lr, eval_samples=args.eval_samples,
        seed=args.seed, threads=1, partition="iid", device=args.device)


def run_arm(cfg: RunConfig, arm: str, slow: bool, factor: float, deadline: float,
            root: Path) -> dict[str, Any]:
    folder = root / f"{cfg.topology}-{arm}-{'slow' if slow else 'even'}"
    run = replace(cfg, schedule="async" if arm == "async" else "sync")
    began = time.perf_counter()
    launch(run, folder, round_deadline=deadline, fresh=True,
           slowdown={"node-0": factor} if slow else None)
    wall = time.perf_counter() - began
    (found,) = find_runs([folder])
    nodes = [folder / f"node-{i}" for i in range(cfg.nodes)]
    lines = {d.name: read_metrics(d / METRICS_FILE) for d in nodes}
    checked = invariant_report([str(d) for d in nodes])
    every = [line for ls in lines.values() for line in ls]
    return {
        "arm": arm, "slow": slow, "deadline_s": deadline, "wall_s": round(wall, 2),
        "missed": sum(len(line["neighbours_missing"] or ()) for line in every),
        "time_to_target_s": time_to_accuracy(found, ARGS.target),
        "final_acc": statistics.fmean(ls[-1]["accuracy"] for ls in lines.values()
                                      if ls and ls[-1]["accuracy"] is not None),
        "blocks": {n: len(ls) for n, ls in lines.items()},
        "exchanges": {n: sum(line.get("exchanges") or 0 for line in ls)
                      for n, ls in lines.items()},
        "median_round_s": statistics.median(line["seconds"] for line in every),
        "median_train_s": statistics.median(line["train_s"] for line in every),
        "p90_exchange_s": statistics.quantiles([line["exchange_s"] for line in every],
                                               n=10)[-1],
        "invariant": checked["resolved_residual"],
        "invariant_holds": checked["holds"],
        "folder": str(folder),
    }


def run_set(args: argparse.Namespace, topology: str, nodes: int,
            root: Path) -> list[dict[str, Any]]:
    cfg = base_config(args, topology, nodes)
    rows: list[dict[str, Any]] = []
    even_sync = run_arm(cfg, "sync", False, args.factor, 600.0, root)
    rows.append(even_sync)
    print(f"{topology}: sync       even: to {args.target:.0%} in "
          f"{even_sync['time_to_target_s']} s (wall {even_sync['wall_s']} s, acc "
          f"{even_sync['final_acc']:.3f}, invariant {even_sync['invariant']:.2g})",
          file=sys.stderr, flush=True)
    tight = round(args.tight * even_sync["median_round_s"], 3)
    for arm, slow in (("sync-tight", False), ("async", False), ("sync", True),
                      ("sync-tight", True), ("async", True)):
        deadline = tight if arm == "sync-tight" else 600.0
        rows.append(run_arm(cfg, arm, slow, args.factor, deadline, root))
        print(f"{topology}: {arm:10s} {'slow' if slow else 'even'}: to {args.target:.0%} in "
              f"{rows[-1]['time_to_target_s']} s (wall {rows[-1]['wall_s']} s, acc "
              f"{rows[-1]['final_acc']:.3f}, missed {rows[-1]['missed']}, invariant "
              f"{rows[-1]['invariant']:.2g})",
              file=sys.stderr, flush=True)
    for row in rows:
        row["topology"] = topology
    return rows


def predict(args: argparse.Namespace, topology: str, nodes: int, rows: list[dict[str, Any]],
            root: Path) -> dict[str, Any]:
    """The simulator's time to the target of each arm with the slow node (virtual seconds), the
    order it predicts and whether it is the daemons' (see the module docstring)."""
    even_sync = next(r for r in rows if (r["arm"], r["slow"]) == ("sync", False))
    block = even_sync["median_round_s"]
    # the daemon pauses (F - 1) times its training only, so its slow round is
    # train * F + the rest: F' = 1 + (F - 1) * train / round of the simulator's whole block
    share = min(1.0, even_sync["median_train_s"] / block)
    factor = 1.0 + (args.factor - 1.0) * share
    tight = next(r["deadline_s"] for r in rows if r["arm"] == "sync-tight")
    # (more threads than a daemon's: only the virtual clock's times matter here)
    cfg = replace(base_config(args, topology, nodes), block_time=block, threads=4)
    predicted: dict[str, float | None] = {}
    missed: dict[str, int] = {}
    for arm in ARMS:
        folder = root / f"{topology}-{arm}-slow-simulated"
        run_experiment(replace(cfg, schedule="async" if arm == "async" else "sync"), folder,
                       slowdown={"node-0": factor}, virtual_time=True,
                       round_deadline=tight if arm == "sync-tight" else float("inf"))
        (found,) = find_runs([folder])
        predicted[arm] = time_to_accuracy(found, args.target)
        missed[arm] = sum(len(line["neighbours_missing"] or ()) for ls in found.lines.values()
                          for line in ls)
    measured = {r["arm"]: r["time_to_target_s"] for r in rows if r["slow"]}

    def order(times: dict[str, float | None]) -> list[str]:
        return sorted(ARMS, key=lambda a: (times[a] is None, times[a] or 0.0))

    def ties(times: dict[str, float | None]) -> list[list[str]]:
        """Pairs of arms within 2 % of each other: no order between them to predict (a
        deadline that never fires makes the tight arm the unbounded one, to the bit)."""
        return [[a, b] for a, b in itertools.combinations(ARMS, 2)
                if (ta := times[a]) is not None and (tb := times[b]) is not None
                and abs(ta - tb) <= 0.02 * max(ta, tb)]

    return {"block_time_s": block, "deadline_s": tight, "train_share": round(share, 4),
            "simulated_factor": round(factor, 4), "simulated_s": predicted,
            "simulated_missed": missed,
            "measured_s": measured, "predicted_order": order(predicted),
            "measured_order": order(measured), "simulated_ties": ties(predicted),
            "order_matches": (None if None in (*predicted.values(), *measured.values())
                              else order(predicted) == order(measured))}


def ratio(rows: list[dict[str, Any]], a: tuple[str, bool],
          b: tuple[str, bool]) -> float | None:
    """time(a) / time(b) (how many times sooner b reaches the target), or None."""
    pick = {(r["arm"], r["slow"]): r["time_to_target_s"] for r in rows}
    ta, tb = pick.get(a), pick.get(b)
    return None if ta is None or tb is None or tb <= 0 else ta / tb


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_standard_args(parser)
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--rounds", type=int, default=None,
                        help="blocks per node (default 30; 20 with --quick)")
    parser.add_argument("--local-steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--eval-samples", type=int, default=500)
    parser.add_argument("--factor", type=float, default=4.0, help="the slow node's slowdown")
    parser.add_argument("--target", type=float, default=None,
                        help="the mean accuracy to reach (default 0.75)")
    parser.add_argument("--tight", type=float, default=0.5,
                        help="the tight arm's round deadline, in healthy synchronous rounds "
                             "(its median)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto",
                        help="where the daemons train (auto, cpu, cuda, mps)")
    parser.add_argument("--sets", default=None,
                        help="comma list of the run sets to run: ring (5 nodes), "
                             "random-regular (10 nodes, degree 3) [default: ring with --quick, "
                             "both without]")
    parser.add_argument("--out", type=Path, default=None,
                        help="keep the runs' folders here (default: a temporary folder)")
    parser.add_argument("--no-predict", action="store_true",
                        help="skip the simulator's prediction of the arms' order")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (20 if args.quick else 30)
    args.target = args.target or 0.75
    return args


ARGS: argparse.Namespace


def main(argv: list[str] | None = None) -> int:
    global ARGS
    ARGS = args = parse(argv)
    nodes_of = {"ring": 5, "random-regular": 10}
    names = (args.sets.split(",") if args.sets else
             ["ring"] if args.quick else ["ring", "random-regular"])
    unknown = [n for n in names if n not in nodes_of]
    if unknown:
        raise SystemExit(f"--sets: unknown {unknown}; choose from {sorted(nodes_of)}")
    sets = [(name, nodes_of[name]) for name in names]
    rows: list[dict[str, Any]] = []
    predictions: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-async-") as scratch:
        root = args.out or Path(scratch)
        for topology, nodes in sets:
            mine = run_set(args, topology, nodes, root)
            rows += mine
            if not args.no_predict:
                predictions[topology] = predict(args, topology, nodes, mine, root)
                print(f"{topology}: the simulator predicts {predictions[topology]}",
                      file=sys.stderr, flush=True)
    versus: dict[str, Any] = {}
    for topology in dict.fromkeys(r["topology"] for r in rows):
        mine = [r for r in rows if r["topology"] == topology]
        versus[topology] = {
            "async_vs_sync_slow": ratio(mine, ("sync", True), ("async", True)),
            "async_vs_tight_slow": ratio(mine, ("sync-tight", True), ("async", True)),
            "async_vs_sync_even": ratio(mine, ("sync", False), ("async", False)),
            "prediction": predictions.get(topology),
        }
    headline = versus[sets[0][0]]["async_vs_sync_slow"] or 0.0
    if not args.json:
        print(json.dumps(versus, indent=2))
    emit_result("async_time_to_accuracy_vs_sync_with_a_slow_node", headline, 2.0, True,
                as_json=args.json, target_accuracy=args.target, factor=args.factor,
                versus=versus, arms=rows if args.json else len(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
