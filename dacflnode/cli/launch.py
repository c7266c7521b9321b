"""``dacflnode launch``: N real daemons on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import click
import yaml

from dacflnode.algorithms.names import RING_MIN_NODES
from dacflnode.cli.errors import config_errors
from dacflnode.cli.options import (
    GroupedCommand,
    cluster_options,
    config_from_options,
    out_dir_option,
    parse_slowdown,
    pop_daemon_settings,
    slowdown_option,
)
from dacflnode.config import RunConfig, load_yaml_config


@click.command(cls=GroupedCommand, option_groups={
    "out_dir": "output", "as_json": "output", "quiet": "output", "tls_dir": "network",
    "faults_file": "runtime", "fresh": "output", "slowdown": "runtime"})
@cluster_options(topology="ring; complete for 2 nodes")
@out_dir_option("DIR/<node-id>/ gets metrics.jsonl, final.safetensors, daemon.log.")
@click.option("--tls", "tls_dir", type=click.Path(file_okay=False),
              help="Mutual TLS between the nodes, with the certificates in TLS_DIR (created "
                   "when missing, as `dacflnode certs` does).")
@click.option("--faults", "faults_file", type=click.Path(dir_okay=False),
              help="Have every node play the drop and cut events of the fault plan in FILE "
                   "(copied to DIR/faults.yaml); `simulate --faults FILE` gives the same models. "
                   "Crash, leave and join events are refused: on real daemons, kill -9 a node, "
                   "`dacflnode stop --drain` it, or start it later.")
@click.option("--fresh", is_flag=True,
              help="Start over in DIR: delete what an earlier run left there (each node's "
                   "metrics.jsonl, checkpoints, final model and logs, and summary.json). "
                   "Without it, an earlier run is resumed from its checkpoints, or refused "
                   "when it cannot be.")
@slowdown_option("its daemon pauses (F - 1) times each round's training time after it")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
@click.option("--quiet", is_flag=True, help="No progress display.")
@config_errors
def launch(out_dir: str, round_deadline: float, hello_timeout: float, tls_dir: str | None,
           faults_file: str | None, fresh: bool, slowdown: tuple[str, ...], as_json: bool,
           quiet: bool, **options: Any) -> None:
    """Start a real local cluster: one `dacflnode start` process per node on 127.0.0.1.

    Takes the run options of `simulate` that daemons use (graph topologies only, ring when not
    given; the algorithms dacfl and cdsgd, each as a cluster of its own) and leaves the same
    files. Ctrl-C stops every node gracefully, each at a checkpoint: the same command again
    resumes the run from there (a finished run just prints its summary). An earlier run in DIR
    with other settings is refused: give its options, or --fresh to start over. Every node's
    settings and own data (--data-root) are checked first, as its daemon reads them: a bad one
    is one line naming the node, exit 2, with nothing started and DIR as it was.

    \b
    Examples:
      dacflnode launch --nodes 4 --rounds 5 --out runs/cluster
      dacflnode launch --nodes 4 --rounds 5 --out runs/cluster --fresh   # start over
      dacflnode launch --nodes 3 --dataset synthetic --rounds 3 --out runs/tiny --json
      dacflnode launch --nodes 3 --rounds 3 --tls runs/certs --out runs/tls
      dacflnode launch --nodes 5 --rounds 10 --schedule async --slowdown node-0=4 \\
          --out runs/async   # the slow node sets only its own pace
      dacflnode launch --nodes 4 --topology ring --rounds 12 --dataset synthetic \\
          --out runs/faults --faults examples/faults/stall_and_cut.yaml
      dacflnode launch --config examples/own-data/tables/run.yaml \\
          --data-root runs/wine-devices --out runs/wine   # each node on DIR/<node-id>/
    """
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from dacflnode.cluster.launcher import launch as run_launch

    # daemon settings beyond the two deadlines (--gone-after, ...) go to every peers file
    daemon_settings = pop_daemon_settings(options)
    if options.get("topology") is None and not _file_sets(options.get("config_file"),
                                                          "topology"):
        options["topology"] = _default_topology(options)
    cfg = config_from_options(options)
    console = Console(stderr=True)
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[status]}"), TimeRemainingColumn(), console=console,
                   disable=quiet)
    tasks = {n: bar.add_task(f"{n} x{cfg.nodes}", total=cfg.rounds, status="starting")
             for n in cfg.algorithm}

    def progress(name: str, done: int, total: int, acc: float | None) -> None:
        status = "" if acc is None else f"acc {100 * acc:.2f}%"
        bar.update(tasks[name], completed=done, status=status)

    # the bar shows once every node's settings and data are checked: a refused run prints
    # its one line and nothing else
    checked: list[bool] = []

    def show() -> None:
        checked.append(True)
        shown.enter_context(bar)

    with contextlib.ExitStack() as shown:
        try:
            summary = run_launch(cfg, out_dir, progress, round_deadline=round_deadline,
                                 hello_timeout=hello_timeout,
                                 tls_dir=Path(tls_dir) if tls_dir else None,
                                 faults=faults_file, daemon_settings=daemon_settings,
                                 fresh=fresh, slowdown=parse_slowdown(slowdown),
                                 checked=show)
        except RuntimeError as exc:
            bar.stop()
            click.echo(f"error: {exc}", err=True)
            raise SystemExit(1) from exc
        except KeyboardInterrupt:
            if not checked:
                click.echo("interrupted: no node was started", err=True)
                raise SystemExit(130) from None
            bar.stop()
            _interrupted(Path(out_dir), cfg.nodes, cfg.rounds, cfg.algorithm)
            raise SystemExit(130) from None
    if as_json:
        click.echo(json.dumps(summary))
        return
    for name, result in summary["algorithms"].items():
        final = result["final"]
        click.echo(f"{name}: {cfg.nodes} nodes, round {final['round']}: Average of Acc "
                   f"{100 * final['avg_acc']:.2f}%, Var of Acc {1e4 * final['var_acc']:.3f} %², "
                   f"{result['wall_s']:.1f}s")
    click.echo(f"results in {out_dir}/ (<node-id>/metrics.jsonl, final.safetensors, daemon.log)")


def _interrupted(root: Path, nodes: int, rounds: int, algorithms: tuple[str, ...]) -> None:
    """After Ctrl-C: where each algorithm's nodes stopped, and how to go on."""
    from dacflnode.cluster.launcher import checkpointed_rounds

    click.echo("interrupted: every node was stopped at a checkpoint", err=True)
    for name, reached in checkpointed_rounds(root, nodes, algorithms).items():
        if not reached:
            click.echo(f"  {name}: not started (no checkpoint)", err=True)
            continue
        low, high = min(reached.values()), max(reached.values())
        at = f"round {low}" if low == high else f"rounds {low} to {high}"
        click.echo(f"  {name}: {len(reached)} of {nodes} node(s) checkpointed, at {at} of "
                   f"{rounds}", err=True)
    click.echo(f"to resume, run the same command again (the nodes go on from their "
               f"checkpoints in {root}/); to start over, add --fresh", err=True)


def _default_topology(options: dict[str, Any]) -> str:
    """ring, or complete for fewer nodes than a ring needs; the nodes as the run will have
    them: ``--nodes``, else the ``--config`` file's, else the declared default."""
    nodes = options.get("nodes")
    if nodes is None:
        config_file = options.get("config_file")
        nodes = (load_yaml_config(Path(config_file)) if config_file else RunConfig()).nodes
    return "ring" if nodes >= RING_MIN_NODES else "complete"


def _file_sets(config_file: str | None, key: str) -> bool:
    """Whether the YAML run configuration ``config_file`` gives ``key`` (at its top level or in
    its ``run:`` section); the file has been read and checked by ``config_from_options``."""
    if not config_file:
        return False
    data = yaml.safe_load(Path(config_file).read_text()) or {}
    if isinstance(data.get("run"), dict) and len(data) == 1:
        data = data["run"]
    return key in data
