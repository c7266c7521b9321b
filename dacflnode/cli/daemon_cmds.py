"""``dacflnode start|status|metrics|stop``: run a node and query it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sys
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.table import Table

from dacflnode.cli.errors import config_errors

DEFAULT_CONTROL = "127.0.0.1:8000"


@click.command()
@click.option("--peers", "peers_file", required=True, type=click.Path(dir_okay=False),
              help="This node's peers.yaml (see `dacflnode topology` to generate them).")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
@config_errors
def start(peers_file: str, log_level: str) -> None:
    """Run this node until its rounds are done (SIGTERM/SIGINT: checkpoint and exit 0).

    It serves its neighbours, waits for them (they may start in any order), runs synchronized
    rounds and writes STATE_DIR/metrics.jsonl, checkpoint.safetensors and final.safetensors.

    \b
    Example:
      dacflnode topology ring --nodes 3 --out cluster/ --dataset synthetic
      dacflnode start --peers cluster/node-0.yaml
    """
    from dacflnode.node.daemon import Daemon, setup_logging
    from dacflnode.node.peers import load_peers

    pf = load_peers(peers_file)
    setup_logging(pf.node.state_dir, log_level)
    code = asyncio.run(Daemon(pf).run())
    sys.exit(code)


def _target(target: str | None, peers_file: str | None) -> str:
    if target:
        return target
    if peers_file:
        from dacflnode.node.peers import load_peers

        return load_peers(peers_file).node.control
    return DEFAULT_CONTROL


def _no_daemon(target: str) -> NoReturn:
    click.echo(f"error: no dacflnode daemon answers at {target} "
               "(is it running? pass --target HOST:PORT or --peers FILE)", err=True)
    sys.exit(1)


target_option = click.option("--target", help=f"Control address of the node [default: "
                             f"{DEFAULT_CONTROL}, or node.control of --peers].")
peers_option = click.option("--peers", "peers_file", type=click.Path(dir_okay=False),
                            help="Read the control address from this peers.yaml.")


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else \
        format(value, spec)


def _status_table(data: dict[str, Any]) -> Table:
    table = Table(title=f"{data['node_id']}  {data['algorithm']}  round {data['round']}/"
                        f"{data['rounds_total']}  {data['phase']}", title_justify="left")
    for col in ("neighbour", "address", "connected", "last round", "received", "sent",
                "latency"):
        table.add_column(col)
    for nb in data["neighbours"]:
        table.add_row(nb["node_id"], nb["address"], "yes" if nb["connected"] else "no",
                      str(nb["last_round_received"]), f"{nb['bytes_received'] / 1e6:.1f} MB",
                      f"{nb['bytes_sent'] / 1e6:.1f} MB", _fmt(nb["latency_ms"], ".1f") + " ms")
    acc = data["last_accuracy"]
    table.caption = (f"accuracy {_fmt(None if acc is None else 100 * acc, '.2f')}%  "
                     f"loss {_fmt(data['last_loss'], '.4f')}  "
                     f"residual ‖x−ω‖ {_fmt(data['consensus_residual'], '.4g')}  "
                     f"device {data['device']}  up {data['uptime_s']:.0f}s")
    return table


@click.command()
@target_option
@peers_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.option("--watch", is_flag=True, help="Refresh until interrupted.")
@click.option("--interval", type=float, default=2.0, show_default=True, help="--watch period.")
@config_errors
def status(target: str | None, peers_file: str | None, as_json: bool, watch: bool,
           interval: float) -> None:
    """Show a running node: round, phase, neighbours, last accuracy and loss.

    \b
    Examples:
      dacflnode status --target 127.0.0.1:8000
      dacflnode status --peers cluster/node-0.yaml --watch
      dacflnode status --json
    """
    from dacflnode.transport.base import PeerUnavailable
    from dacflnode.transport.grpc_control import fetch_status

    addr = _target(target, peers_file)
    console = Console()

    async def show() -> None:
        while True:
            try:
                data = (await fetch_status(addr)).to_json()
            except PeerUnavailable:
                _no_daemon(addr)
            if as_json:
                click.echo(json.dumps(data))
            else:
                if watch:
                    console.clear()
                console.print(_status_table(data))
            if not watch:
                return
            await asyncio.sleep(interval)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(show())


@click.command()
@target_option
@peers_option
@click.option("--format", "fmt", type=click.Choice(["json", "prometheus"]), default="json",
              show_default=True)
@config_errors
def metrics(target: str | None, peers_file: str | None, fmt: str) -> None:
    """Print a running node's metrics (JSON, or Prometheus text exposition).

    \b
    Examples:
      dacflnode metrics --target 127.0.0.1:8000
      dacflnode metrics --peers cluster/node-0.yaml --format prometheus
    """
    from dacflnode.transport.base import PeerUnavailable
    from dacflnode.transport.grpc_control import fetch_metrics

    addr = _target(target, peers_file)
    try:
        click.echo(asyncio.run(fetch_metrics(addr, fmt)).rstrip("\n"))
    except PeerUnavailable:
        _no_daemon(addr)


@click.command()
@target_option
@peers_option
@config_errors
def stop(target: str | None, peers_file: str | None) -> None:
    """Ask a running node to stop gracefully (checkpoint, exit 0).

    \b
    Example:
      dacflnode stop --peers cluster/node-0.yaml
    """
    from dacflnode.transport.base import PeerUnavailable
    from dacflnode.transport.grpc_control import request_stop

    addr = _target(target, peers_file)
    try:
        asyncio.run(request_stop(addr))
    except PeerUnavailable:
        _no_daemon(addr)
    click.echo(f"stop requested at {addr}")
