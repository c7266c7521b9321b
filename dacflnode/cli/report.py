"""``dacflnode report``: figures and a table of finished (or running) runs; the work is
:mod:`dacflnode.sim.report`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click


@click.command("report")
@click.argument("run_dirs", nargs=-1, required=True, metavar="RUN_DIR...",
                type=click.Path(path_type=Path))
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for accuracy.{png,svg} and nodes.{png,svg}. [default: RUN_DIR/report "
                   "for one RUN_DIR, ./report for several]")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: a row per run (the table's values, and the Average/Var "
                   "of Acc per round) and the files written.")
def report_cmd(run_dirs: tuple[Path, ...], out_dir: Path | None, as_json: bool) -> None:
    """Plot and tabulate runs from their metrics.jsonl files: the Average of Acc and Var of Acc
    per round with the runs overlaid, each node's consensus residual and round time, and a table
    (rounds, final Average/Var of Acc, mean round seconds, nodes) per run.

    A RUN_DIR is the --out folder of `launch` or `simulate` (one run per algorithm in it), or
    any folder with metrics.jsonl files below it, such as the state directories copied off a
    cluster's devices. The table names runs by their folder; the figures give each run a colour
    of its own and name it by its algorithm and the settings (from summary.json) that differ
    between the runs, e.g. "DACFL schedule=async, compression=int8", or by its folder where
    none differ. Where a run is asynchronous (schedule async), every run's accuracy is drawn
    against the seconds since it started (the mean of each node's latest accuracy) instead of
    rounds. A running cluster can be reported on: a round counts once every node has written
    it.

    \b
    Examples:
      dacflnode simulate --dataset synthetic --nodes 4 --rounds 10 --out runs/quick
      dacflnode report runs/quick
      dacflnode report runs/iid runs/noniid --out figures/ --json
      scp -r pi-1:/var/lib/dacflnode states/pi-1; dacflnode report states
    """
    from dacflnode.sim.report import ReportError, build_report

    if out_dir is None:
        out_dir = run_dirs[0] / "report" if len(run_dirs) == 1 else Path("report")
        if len(run_dirs) == 1 and run_dirs[0].is_file():
            out_dir = run_dirs[0].parent / "report"
    try:
        result = build_report(run_dirs, out_dir)
    except ReportError as exc:
        raise click.UsageError(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(result))
        return
    _print(result["runs"])
    click.echo(f"figures: {', '.join(result['files'])}")


def _pct(value: float | None, scale: float, unit: str, fmt: str) -> str:
    return "—" if value is None else f"{scale * value:{fmt}}{unit}"


def size(value: float | None) -> str:
    """Payload bytes a node sent per round in the round log's units (decimal: 1 MB = 10^6
    bytes, 1 kB = 10^3 bytes, as :func:`dacflnode.daemon.round_log.size` writes them); MB with
    two decimals."""
    if value is None:
        return "—"
    return f"{value / 1e6:.2f} MB" if value >= 1e6 else f"{value / 1e3:.1f} kB"


def _print(rows: list[dict[str, Any]]) -> None:
    """A plain-text table (aligned columns, one line per run) that reads the same in a terminal,
    a pipe or a CI log."""
    header = ("run", "algorithm", "nodes", "rounds", "Average of Acc", "Var of Acc",
              "residual ‖x−ω‖", "mean round", "sent per round")
    lines = [header]
    for r in rows:
        at = "" if r["final_round"] in (None, r["rounds"]) else f" (round {r['final_round']})"
        lines.append((
            r["label"], r["algorithm"], str(r["nodes"]), str(r["rounds"]),
            _pct(r["avg_acc"], 100, "%", ".2f") + at,
            _pct(r["var_acc"], 1e4, " %²", ".3f"),
            _pct(r["consensus_residual"], 1, "", ".4g"),
            _pct(r["mean_round_s"], 1, " s", ".3f"),
            size(r.get("bytes_sent_per_round")),
        ))
    _table(lines, left=2)
    for r in rows:
        nodes = [n for n in r.get("per_node", []) if n.get("data_size") is not None]
        if not nodes:
            continue
        click.echo(f"{r['label']}: data per node")
        node_lines = [("node", "samples", "accuracy", "samples per class")]
        for n in nodes:
            counts = n.get("class_counts") or {}
            node_lines.append((n["node"], str(n["data_size"]),
                               _pct(n["accuracy"], 100, "%", ".2f"),
                               " ".join(f"{name}:{count}" for name, count in counts.items())))
        _table(node_lines, left=1, last_left=True)


def _table(lines: Sequence[tuple[str, ...]], left: int, last_left: bool = False) -> None:
    """Aligned columns: the first ``left`` (and with ``last_left`` the last) to the left."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    last = len(widths) - 1
    for line in lines:
        cells = [c.ljust(w) if i < left or (last_left and i == last) else c.rjust(w)
                 for i, (c, w) in enumerate(zip(line, widths, strict=True))]
        click.echo("  ".join(cells).rstrip())
