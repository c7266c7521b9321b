"""``dacflnode invariant``: the network-wide consensus residual from the nodes' checkpoints (files
on disk, or fetched from running nodes); the computation is :mod:`dacflnode.records.invariant`."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from dacflnode.cli.control import TOKEN_ENV, control_endpoint
from dacflnode.cli.errors import config_errors

if TYPE_CHECKING:
    from dacflnode.records.invariant import InvariantReport, Skipped


@click.command("invariant")
@click.argument("paths", nargs=-1, type=click.Path(exists=True, path_type=Path))
@click.option("--peers", "peers_files", multiple=True,
              type=click.Path(exists=True, dir_okay=False),
              help="A node's peers.yaml: read its node.state_dir (or, with --live, ask the node). "
                   "Repeatable; PATHS that are not directories or .safetensors files are read as "
                   "peers files too.")
@click.option("--live", is_flag=True,
              help="Fetch each node's latest checkpoint from the running node through its "
                   "control service (needs peers files), instead of reading its state directory.")
@click.option("--token", default=None,
              help=f"Control token for --live [default: ${TOKEN_ENV}, or node.control_token of "
                   "each peers file, or the node's STATE_DIR/control.token].")
@click.option("--tolerance", type=click.FloatRange(min=0.0), default=2e-6, show_default=True,
              help="The invariant holds when the resolved residual is at most this.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@config_errors
def invariant_cmd(paths: tuple[Path, ...], peers_files: tuple[str, ...], live: bool,
                  token: str | None, tolerance: float, as_json: bool) -> None:
    """Check DACFL's consensus invariant over a set of nodes: the relative residual
    |Σx − Σtracked| / |Σtracked| of their estimates x and the models they track.

    PATHS are state directories (their checkpoint.safetensors is read), run folders (`launch
    --out DIR`: every node's folder in DIR), checkpoint files, or peers files. The raw
    residual is what the checkpoints hold; the resolved one first undoes the one-sided edge
    uses the checkpoints can decide (docs/faults.md). Nodes at different rounds (a running
    network) give an estimate only, and the output says so.

    The output folder of `dacflnode simulate --out DIR` (or its node folders), which holds no
    checkpoints, is judged from what the simulator wrote in DIR/summary.json: the residual over
    the nodes that finished, per algorithm that keeps the invariant.

    The verdict, "holds: R ≤ TOLERANCE" or "BROKEN: ..." with every reason, is the last line
    (and "verdict"/"holds" in --json). Exit status 0 when it holds; 1 when it does not: the
    resolved residual is above --tolerance, a pending correction is left unresolved, or a
    given source gave no checkpoint (unreadable, damaged, none yet, node not answering).

    \b
    Examples:
      dacflnode invariant runs/cluster           # a launch output folder
      dacflnode invariant runs/cluster/node-*
      dacflnode invariant runs/sim              # a simulator's output folder
      dacflnode invariant --live cluster/*.yaml
      dacflnode invariant --peers cluster/node-0.yaml --peers cluster/node-1.yaml --json
    """
    from dacflnode.records.invariant import (
        compute_invariant,
        node_folders,
        read_snapshots,
        verdict,
    )

    state_sources: list[tuple[str, Path | bytes | None]] = []
    peers = list(peers_files)
    for path in paths:
        if path.is_dir() or path.suffix == ".safetensors":
            state_sources.append((str(path), path))
        else:
            peers.append(str(path))
    if not state_sources and not peers:
        raise click.UsageError("give state directories, checkpoint files or peers files")
    if live and state_sources:
        raise click.UsageError("--live asks running nodes: give peers files, not "
                               f"{state_sources[0][0]}")
    if not live and not peers and state_sources:
        _simulator_output([Path(source) for _, source in state_sources
                           if isinstance(source, Path)], tolerance, as_json)
    # a run's folder (launch --out DIR) stands for the node folders below it
    state_sources = [(str(folder), folder) if folder != source else (label, source)
                     for label, source in state_sources
                     for folder in (node_folders(source) if isinstance(source, Path)
                                    and source.is_dir() else [source])]
    skipped: list[Skipped] = []
    if live:
        fetched, skipped = _fetch_live(peers, token)
        state_sources.extend(fetched)
    else:
        from dacflnode.peers.file import load_peers

        for peers_file in peers:
            state_sources.append((peers_file, load_peers(peers_file).node.state_dir))
    snapshots, unreadable = read_snapshots(state_sources)
    skipped.extend(unreadable)
    if not snapshots:
        click.echo("error: no checkpoint could be read:", err=True)
        for s in skipped:
            click.echo(f"  {s.source}: {s.reason}", err=True)
        if as_json:
            click.echo(json.dumps({"verdict": verdict(None, skipped, tolerance).text,
                                   "holds": False, "skipped": _skipped_json(skipped)}))
        sys.exit(1)
    try:
        report = compute_invariant(snapshots)
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    judged = verdict(report, skipped, tolerance)
    if as_json:
        click.echo(json.dumps({**report.to_json(), "skipped": _skipped_json(skipped),
                               "tolerance": tolerance, "holds": judged.holds,
                               "verdict": judged.text}))
    else:
        _print(report, skipped)
        click.echo(judged.text)
    sys.exit(0 if judged.holds else 1)


def _simulator_output(paths: list[Path], tolerance: float, as_json: bool) -> None:
    """Where every path is a folder of one simulator output without checkpoints (the simulator
    writes none): report the invariant of its summary, the verdict, and exit. Otherwise
    return, and the checkpoints are read."""
    from dacflnode.records.checkpoint import CHECKPOINT
    from dacflnode.records.invariant import (
        read_simulator_invariant,
        simulator_summary,
        simulator_verdict,
    )

    if any(not p.is_dir() or (p / CHECKPOINT).exists() for p in paths):
        return
    summaries = {simulator_summary(p) for p in paths}
    if None in summaries:
        return
    if len(summaries) > 1:
        raise click.UsageError("these folders belong to different simulator outputs: "
                               f"{', '.join(sorted(str(s) for s in summaries))}; give one")
    (summary,) = summaries
    assert summary is not None
    try:
        found = read_simulator_invariant(summary)
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        if as_json:
            click.echo(json.dumps({"error": str(exc), "holds": False,
                                   "verdict": f"BROKEN: {exc}"}))
        sys.exit(1)
    judged = simulator_verdict(found, tolerance)
    if as_json:
        click.echo(json.dumps({**found.to_json(), "tolerance": tolerance,
                               "holds": judged.holds, "verdict": judged.text}))
    else:
        click.echo(f"simulator output {summary.parent} (from {summary.name}; the simulator "
                   "writes no checkpoints)")
        for name, residual in found.residuals.items():
            over = found.nodes.get(name)
            where = "" if over is None else f" over the {over} node(s) that finished"
            value = "—" if residual is None else format(residual, ".3g")
            click.echo(f"{name}: residual |Σx − Σtracked| / |Σtracked|{where}: {value}")
        for name in found.untracked:
            click.echo(f"{name}: tracks its own x, no invariant to check")
        click.echo(judged.text)
    sys.exit(0 if judged.holds else 1)


def _skipped_json(skipped: list[Skipped]) -> list[dict[str, str]]:
    return [{"source": s.source, "reason": s.reason} for s in skipped]


def _fetch_live(peers_files: list[str], token: str | None
                ) -> tuple[list[tuple[str, Path | bytes | None]], list[Skipped]]:
    """Each node's checkpoint bytes (``None``: it has none yet), fetched concurrently; the nodes
    that did not answer, or refused the token, are skipped."""
    from dacflnode.records.invariant import Skipped
    from dacflnode.transport.errors import PeerUnavailable
    from dacflnode.transport.grpc_control import (
        ControlCallFailed,
        ControlUnauthenticated,
        fetch_checkpoint,
    )

    targets = [(f, *control_endpoint(None, f, token, None, None)) for f in peers_files]

    async def fetch_all() -> list[bytes | BaseException | None]:
        return await asyncio.gather(*(fetch_checkpoint(address, auth=auth)
                                      for _, address, auth in targets), return_exceptions=True)

    sources: list[tuple[str, Path | bytes | None]] = []
    skipped: list[Skipped] = []
    for (peers_file, address, _), result in zip(targets, asyncio.run(fetch_all()), strict=True):
        label = f"{peers_file} ({address})"
        if isinstance(result, PeerUnavailable | ControlUnauthenticated | ControlCallFailed):
            skipped.append(Skipped(label, str(result)))
        elif isinstance(result, BaseException):
            raise result
        else:
            sources.append((label, result))
    return sources, skipped


def _num(value: float) -> str:
    return "—" if math.isnan(value) else format(value, ".3g")


def _print(report: InvariantReport, skipped: list[Skipped]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"consensus invariant over {len(report.nodes)} node(s)",
                  title_justify="left")
    for col in ("node", "round", "tracks", "|x − tracked|", "pending", "undone", "not needed",
                "unresolved"):
        table.add_column(col)
    for n in report.nodes:
        table.add_row(n.node, str(n.round), n.tracked, _num(n.deviation), str(n.pending),
                      str(n.applied), str(n.dropped), str(n.unresolved))
    console = Console()
    console.print(table)
    click.echo(f"residual |Σx − Σtracked| / |Σtracked|: raw {_num(report.raw_residual)}, "
               f"resolved {_num(report.resolved_residual)} "
               f"({len(report.unresolved)} unresolved correction(s))")
    if report.left:
        click.echo(f"left the network, not summed: {', '.join(report.left)}")
    for w in report.warnings:
        click.echo(f"warning: {w}")
    for s in skipped:
        click.echo(f"skipped {s.source}: {s.reason}")
