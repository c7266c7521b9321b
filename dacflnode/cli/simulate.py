"""``dacflnode simulate``: N virtual nodes in one process."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from dacflnode.cli.errors import config_errors
from dacflnode.cli.options import (
    GroupedCommand,
    config_from_options,
    daemon_setting_option,
    daemon_settings,
    parse_slowdown,
    run_options,
    slowdown_option,
)

if TYPE_CHECKING:
    from dacflnode.sim.simulator import RoundRecord


@click.command(cls=GroupedCommand, option_groups={
    "out_dir": "output", "as_json": "output", "quiet": "output", "faults_file": "runtime",
    "gone_after": "runtime", "ray_address": "runtime", "ray_workers": "runtime",
    "slowdown": "runtime", "replay_dir": "output", "virtual_time": "runtime",
    "round_deadline": "runtime"})
@run_options
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    help="Write DIR/<node-id>/metrics.jsonl, final.safetensors and DIR/summary.json.",
)
@click.option("--faults", "faults_file", type=click.Path(dir_okay=False),
              help="Play the fault plan in FILE (drops, cuts, crashes, leaves, joins; see "
                   "examples/faults/README.md); the summary then reports the consensus "
                   "invariant per round.")
@daemon_setting_option("gone_after")
@click.option("--ray", "ray_address", metavar="ADDRESS|local",
              help="Train the nodes on the workers of a Ray cluster: its head's HOST:PORT "
                   "(`ray start --head`), or local to start Ray here. Results equal the local "
                   "engine's bit for bit (batched: that of --threads N for N workers; "
                   "docs/ray.md).")
@click.option("--ray-workers", type=click.IntRange(min=1), metavar="N",
              help="With --ray: the Ray workers (one CPU each) to spread the nodes over "
                   "[default: one per CPU of the cluster, at most one per node].")
@click.option("--replay", "replay_dir", type=click.Path(file_okay=False), metavar="RUN_DIR",
              help="Re-run the asynchronous cluster `launch --out RUN_DIR` ran, from its nodes' "
                   "journals (exchanges.jsonl), and print how far the replayed models are from "
                   "the daemons' (equal to float rounding with --threads 1 on both); the run's "
                   "settings come from RUN_DIR/summary.json.")
@click.option("--virtual-time", is_flag=True,
              help="Play synchronous rounds on the virtual clock of --schedule async too: each "
                   "node's training takes --block-time x its --slowdown, so the summary's "
                   "wall_s and the metrics lines' time say how long the run would take "
                   "(each node trains on its own there: the sequential engine).")
@click.option("--round-deadline", type=click.FloatRange(min=0, min_open=True),
              metavar="SECONDS",
              help="With --virtual-time: a synchronous round's deadline on the virtual clock "
                   "(a node not heard from by then is left out of the round, as a daemon's) "
                   "[default: none].")
@slowdown_option("its blocks take F × --block-time on the virtual clock of --schedule "
                 "async; synchronous rounds are not timed")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
@click.option("--quiet", is_flag=True, help="No progress display.")
@config_errors
def simulate(out_dir: str | None, faults_file: str | None, gone_after: int,
             ray_address: str | None, ray_workers: int | None, replay_dir: str | None,
             virtual_time: bool, round_deadline: float | None, slowdown: tuple[str, ...],
             as_json: bool, quiet: bool, **options: Any) -> None:
    """Run N nodes in one process with the daemon's round code and record the paper's metrics.

    \b
    Examples:
      dacflnode simulate --nodes 10 --rounds 100 --algorithm dacfl,cdsgd --out runs/fmnist
      dacflnode simulate --dataset synthetic --nodes 4 --rounds 5 --json
      dacflnode simulate --config examples/paper_fmnist.yaml --topology sparse
      dacflnode simulate --dataset synthetic --nodes 4 --topology ring --rounds 30 \\
          --faults examples/faults/stall_and_cut.yaml
      dacflnode simulate --topology random-regular --mixing clipped --clip-fraction 0.05
      dacflnode simulate --nodes 10 --rounds 100 --ray local --ray-workers 2
      dacflnode simulate --nodes 100 --rounds 100 --ray head.example:6379
      dacflnode simulate --schedule async --topology ring --nodes 5 --rounds 20 \\
          --slowdown node-0=4 --out runs/async   # accuracy against (virtual) time
      dacflnode simulate --replay runs/async-cluster   # a launch --schedule async run
      dacflnode simulate --config examples/own-data/images/run.yaml \\
          --data-root devices/ --test-root devices/test/ --out runs/own   # DIR/<node-id>/
    """
    from dacflnode import logs
    from dacflnode.errors import ConfigError
    from dacflnode.learning.names import node_ids
    from dacflnode.protocol.faults import load_fault_plan
    from dacflnode.sim.engines.base import RayTarget
    from dacflnode.sim.experiment import run_experiment
    from dacflnode.sim.simulator import graph_edges

    if replay_dir is not None:
        _replay(replay_dir, as_json)
        return
    if ray_workers is not None and ray_address is None:
        raise ConfigError("ray_workers", "needs --ray ADDRESS|local")
    logs.log_to_console(logging.getLogger("dacflnode"))
    ray = RayTarget(ray_address, ray_workers) if ray_address is not None else None
    gone_after = daemon_settings({"gone_after": gone_after}).gone_after
    cfg = config_from_options(options)
    faults = (load_fault_plan(faults_file, node_ids(cfg.nodes), cfg.rounds, graph_edges(cfg))
              if faults_file else None)
    console = Console(stderr=True)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeRemainingColumn(),
        console=console,
        disable=quiet,
    ) as bar:
        tasks = {name: bar.add_task(name, total=cfg.rounds, status="") for name in cfg.algorithm}

        def progress(name: str, done: int, total: int, record: RoundRecord) -> None:
            status = f"loss {record.mean_train_loss:.4f}"
            if record.avg_acc is not None:
                status += f"  acc {100 * record.avg_acc:.2f}%"
            bar.update(tasks[name], completed=done, status=status)

        summary = run_experiment(cfg, out_dir, progress, faults=faults, gone_after=gone_after,
                                 ray=ray, slowdown=parse_slowdown(slowdown),
                                 virtual_time=virtual_time,
                                 round_deadline=(math.inf if round_deadline is None
                                                 else round_deadline))
    if as_json:
        click.echo(json.dumps(summary))
        return
    table = Table(
        title=f"{cfg.dataset}, {cfg.nodes} nodes, {cfg.rounds} rounds, "
        f"{cfg.topology} topology, "
        + ("each node's own data" if cfg.own_data else cfg.partition)
    )
    for col in (
        "algorithm",
        "Average of Acc",
        "Var of Acc",
        "train loss",
        "residual ‖x−ω‖",
        "samples/s",
        "wall",
    ):
        table.add_column(col, justify="right")
    for name, result in summary["algorithms"].items():
        final = result["final"]
        table.add_row(
            name,
            f"{100 * final['avg_acc']:.2f}%",
            f"{1e4 * final['var_acc']:.3f} %²",
            f"{final['train_loss']:.4f}",
            f"{final['consensus_residual']:.4g}",
            f"{result['samples_per_s']:.0f}",
            f"{result['wall_s']:.1f}s",
        )
    Console().print(table)
    for name, inv in summary.get("invariant", {}).items():
        click.echo(invariant_line(name, inv))
    if out_dir:
        click.echo(
            f"results in {out_dir}/ (summary.json, <node-id>/metrics.jsonl, final.safetensors)"
        )


def invariant_line(name: str, invariant: Mapping[str, Any]) -> str:
    """The summary's line of one algorithm's invariant (``summary["invariant"][name]``): the
    residual over the nodes that finished and, where the simulator measured it after every round
    (a run with faults or clipped mixing), the largest of those."""
    line = (f"{name}: invariant |Σx − Σtracked| / |Σtracked| over the nodes that finished: "
            f"{invariant['final']:.3g}")
    measured = [r for r in invariant.get("rounds", []) if r is not None]
    if measured:
        line += f" (max over the {len(measured)} rounds measured: {max(measured):.3g})"
    return line


def _replay(run_dir: str, as_json: bool) -> None:
    from dacflnode.sim.replay import replay

    result = replay(run_dir)
    if as_json:
        click.echo(json.dumps(result))
        return
    steps = sum(result["steps"].values())
    click.echo(f"replayed {len(result['nodes'])} nodes' journals ({steps} steps) of {run_dir}: "
               f"max |Δ| against the daemons' last checkpoints {result['max_abs_diff']:.3g}")
