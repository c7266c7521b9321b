"""``dacflnode start|status|metrics|stop``: run a node and query it.

The query commands reach the node's Control service with the address, token and CA that
:func:`~dacflnode.cli.control.control_endpoint` finds (``--token``, ``DACFLNODE_CONTROL_TOKEN``,
the peers file's ``node.control_token`` or the node's ``STATE_DIR/control.token``; TLS to a
control address that is not loopback: :mod:`dacflnode.cli.control`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click
from rich.console import Console, Group
from rich.table import Table

from dacflnode.cli.control import (
    DEFAULT_CONTROL,
    TOKEN_ENV,
    control_endpoint,
    fail,
    is_loopback_address,
)
from dacflnode.cli.errors import config_errors
from dacflnode.errors import ConfigError
from dacflnode.logs import LOG_FORMATS

if TYPE_CHECKING:
    from dacflnode.peers.file import PeersFile
    from dacflnode.transport.control_types import ControlAuth

T = TypeVar("T")

#: gRPC's fork support, off in a daemon unless the environment says otherwise. The only
#: processes a daemon forks decode an image folder (``dataset: folder``) and never call gRPC;
#: and while the node serves (its Control service runs from the start) gRPC skips its fork
#: handlers anyway, writing "fork_posix.cc:71 Other threads are currently calling into gRPC,
#: skipping fork() handlers" to stderr at each fork. gRPC reads it when it loads: ``start``
#: sets it before the daemon imports grpc.
GRPC_FORK_SUPPORT = ("GRPC_ENABLE_FORK_SUPPORT", "false")


@click.command()
@click.option("--peers", "peers_file", required=True, type=click.Path(dir_okay=False),
              help="This node's peers.yaml (see `dacflnode topology` to generate them).")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
@click.option("--log-format", default="text", show_default=True,
              type=click.Choice(LOG_FORMATS),
              help="Of stderr and STATE_DIR/daemon.log: text lines, or one JSON object per line "
                   "with time, level, logger, node, round, neighbour, event, reason, message, "
                   "traceback (null where not known; see dacflnode/logs/json_format.py).")
@click.option("--insecure", is_flag=True,
              help="Allow a non-loopback node.listen without node.tls (the same as "
                   "node.insecure: true): neighbours are then not authenticated.")
@click.option("--faults", "faults_file", type=click.Path(dir_okay=False),
              help="Inject the drop, cut and poison events of a fault plan (tests and "
                   "demonstrations; give every node the same FILE, see "
                   "examples/faults/README.md and docs/faults.md).")
@config_errors
def start(peers_file: str, log_level: str, log_format: str, insecure: bool,
          faults_file: str | None) -> None:
    """Run this node until its rounds are done (SIGINT, and SIGTERM unless
    run.drain_on_sigterm: checkpoint and exit 0; see `dacflnode stop --drain` to leave).

    It serves its neighbours, waits for them (they may start in any order), runs synchronized
    rounds and writes STATE_DIR/metrics.jsonl, checkpoint.safetensors and final.safetensors.

    Exit status: 0 done, stopped or left (and at once, "run complete", when started again
    after its last round); 1 a failure while running; 2 a setting or file to fix first (an
    address in use, unreadable TLS files, a damaged or foreign checkpoint), said in one line
    on stderr and in STATE_DIR/daemon.log (docs/operations.md).

    \b
    Example:
      dacflnode topology ring --nodes 3 --out cluster/ --dataset synthetic
      dacflnode start --peers cluster/node-0.yaml
      dacflnode start --peers cluster/node-1.yaml --log-format json
    """
    os.environ.setdefault(*GRPC_FORK_SUPPORT)
    from dacflnode.daemon.service import Daemon, setup_logging, watch_handshakes

    pf = load_for_start(peers_file, insecure)
    plan = None
    if faults_file:
        from dacflnode.protocol.faults import check_for_daemons, load_fault_plan

        plan = check_for_daemons(load_fault_plan(faults_file, pf.daemon.members or None,
                                                 pf.run.rounds, pf.daemon.edges or None),
                                 "`dacflnode start`")
    try:
        setup_logging(pf.node.state_dir, log_level, log_format, node=pf.node.id)
    except OSError as exc:  # before any log exists: stderr only
        raise ConfigError("node.state_dir", f"in {peers_file}: cannot write "
                          f"{exc.filename or pf.node.state_dir}: {exc.strerror or exc}: make it "
                          "a writable directory for the user the node runs as") from exc
    watch = watch_handshakes(pf.node.id) if pf.node.tls is not None else None
    code = asyncio.run(Daemon(pf, faults=plan, handshakes=watch).run())
    sys.exit(code)


def load_for_start(peers_file: str, insecure: bool) -> PeersFile:
    """The peers file, with ``node.insecure: true`` when ``--insecure`` is given (the check of
    exposed addresses at load then allows a plaintext non-loopback ``node.listen``)."""
    import yaml

    from dacflnode.peers.file import load_peers, parse_peers

    if not insecure:
        return load_peers(peers_file)
    try:
        data = yaml.safe_load(Path(peers_file).read_text())
    except (OSError, yaml.YAMLError):
        return load_peers(peers_file)  # reports what is wrong with the file
    node = data.get("node") if isinstance(data, dict) else None
    if isinstance(node, dict):
        if node.get("tls") is not None:
            raise click.UsageError(f"--insecure contradicts node.tls of {peers_file} (a TLS "
                                   "node refuses plaintext): drop one")
        node["insecure"] = True
    return parse_peers(data, peers_file)


def _no_daemon(target: str, auth: ControlAuth, exc: Exception, as_json: bool = False
               ) -> NoReturn:
    hint = "is it running? pass --target HOST:PORT or --peers FILE"
    if auth.ca is not None:
        hint += "; with TLS, check that it serves TLS and that its certificate names " + \
            repr(auth.server_name or target)
    elif not is_loopback_address(target):
        hint += ("; an exposed control port speaks TLS: pass --peers FILE, or --ca FILE and "
                 "--server-name NODE_ID")
    said = f"no dacflnode daemon answers at {target}"
    detail = str(exc).removeprefix(said).strip()  # the call's own words, said once
    if detail.startswith("(") and detail.endswith(")"):
        detail = detail[1:-1]
    fail(f"{said}{': ' + detail if detail else ''} ({hint})", as_json, target=target)


def _call(address: str, auth: ControlAuth,
          make: Callable[[], Coroutine[Any, Any, T]], as_json: bool = False) -> T:
    """Run one Control call; a missing daemon or a refused token is one clear line, exit 1
    (and, with ``as_json``, a JSON error object on stdout)."""
    from dacflnode.transport.errors import PeerUnavailable
    from dacflnode.transport.grpc_control import ControlUnauthenticated

    try:
        return asyncio.run(make())
    except PeerUnavailable as exc:
        _no_daemon(address, auth, exc, as_json)
    except ControlUnauthenticated as exc:
        if exc.token_sent:
            fail(f"{exc}: check --token, {TOKEN_ENV} or node.control_token of the peers file; "
                  "a token read from STATE_DIR/control.token is only good until the node "
                  "restarts: run the command again", as_json, target=address)
        fail(f"{exc}: pass --peers FILE (the node's peers file: run as the node's user, the "
              f"token is read from its STATE_DIR/control.token), or --token TOKEN or "
              f"{TOKEN_ENV}", as_json, target=address)


target_option = click.option("--target", help=f"Control address of the node [default: "
                             f"{DEFAULT_CONTROL}, or node.control of --peers].")
peers_option = click.option("--peers", "peers_file", type=click.Path(dir_okay=False),
                            help="Read the control address, token and CA from this peers.yaml "
                                 "(the token: node.control_token, else the node's "
                                 "STATE_DIR/control.token).")


def auth_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--token``, ``--ca`` and ``--server-name`` of the query commands."""
    for option in reversed((
        click.option("--token", default=None,
                     help=f"Control token [default: ${TOKEN_ENV}, or node.control_token of "
                          "--peers, or the node's STATE_DIR/control.token of --peers]."),
        click.option("--ca", type=click.Path(dir_okay=False), default=None,
                     help="CA certificate (PEM): reach the control address over TLS and verify "
                          "the node's certificate against it."),
        click.option("--server-name", default=None,
                     help="With --ca: the node id its certificate must carry [default: the "
                          "host of --target]."),
    )):
        func = option(func)
    return func


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else \
        format(value, spec)


#: The per-neighbour fault counters of a status, and their column titles.
FAULT_COLUMNS = (("missed_rounds", "missed rounds"), ("late_states", "late states"),
                 ("refused", "refused calls"), ("corrections", "one-sided uses undone"),
                 ("refused_states", "absurd or stale states"))


def _status_view(data: dict[str, Any]) -> Group:
    """What ``dacflnode status`` prints: the neighbours, and their fault counters when any is
    not zero (else one line says so)."""
    table = _status_table(data)
    faults = Table(title="faults per neighbour", title_justify="left")
    faults.add_column("neighbour", overflow="fold")
    for _, title in FAULT_COLUMNS:  # a narrow terminal wraps the titles, never cuts them
        faults.add_column(title, justify="right", overflow="fold")
    any_fault = False
    for nb in data["neighbours"]:
        counts = [int(nb.get(key, 0)) for key, _ in FAULT_COLUMNS]
        any_fault = any_fault or any(counts)
        faults.add_row(nb["node_id"], *map(str, counts))
    if any_fault:
        return Group(table, faults)
    table.caption = f"{table.caption}\nno missed, late or refused rounds"
    return Group(table)


def _status_console() -> Console:
    """The console ``status`` prints to: the terminal's width on a terminal; piped, as wide as
    the content needs (never cut at 80 columns)."""
    console = Console()
    return console if console.is_terminal else Console(width=400)


#: The phases of a node that has finished, as ``status`` last saw it.
FINISHED_PHASES = ("done", "left")


def _ended(last: dict[str, Any], address: str, peers_file: str | None, watched_since: float,
           as_json: bool) -> NoReturn:
    """``status --watch`` lost the node: a node that had finished, or whose final model was
    written while watching, is done (exit 0); anything else is an error (exit 1)."""
    node, done, total, phase = last["node_id"], last["round"], last["rounds_total"], last["phase"]
    finished = phase in FINISHED_PHASES or done >= total
    if not finished and peers_file:
        from dacflnode.peers.file import load_peers
        from dacflnode.records.checkpoint import FINAL_MODEL

        final = load_peers(peers_file).node.state_dir / FINAL_MODEL
        with contextlib.suppress(OSError):
            finished = final.stat().st_mtime >= watched_since
    if not finished:
        fail(f"{node} stopped answering at {address} in round {done}/{total} ({phase}): it was "
              "stopped, failed or is cut off; see its STATE_DIR/daemon.log", as_json,
              node_id=node, round=done, rounds_total=total, phase=phase)
    state = "left" if phase == "left" else "done"
    if as_json:
        click.echo(json.dumps({"node_id": node, "state": state, "round": done,
                               "rounds_total": total, "phase": phase}))
    else:
        what = "left the network" if state == "left" else f"finished its {total} rounds"
        click.echo(f"{node}: {state} ({what}; last seen in round {done}/{total}, {phase}; the "
                   "daemon has exited)")
    sys.exit(0)


def _class_order(name: str) -> tuple[int, int, str]:
    """Classes in their order: numbered ones by number (``2`` before ``10``), named ones by
    name (the Control service carries the counts as a map, which keeps no order)."""
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def _status_table(data: dict[str, Any]) -> Table:
    table = Table(title=f"{data['node_id']}  {data['algorithm']}  round {data['round']}/"
                        f"{data['rounds_total']}  {data['phase']}", title_justify="left")
    for col in ("neighbour", "address", "state", "last round", "received", "sent", "latency"):
        # a narrow terminal folds the ids and addresses onto more lines: nothing is cut
        wide = col in ("neighbour", "address")
        table.add_column(col, overflow="fold", no_wrap=not wide)
    for nb in data["neighbours"]:
        state = nb.get("state") or "—"
        table.add_row(nb["node_id"], nb["address"],
                      state if nb["connected"] or state == "unreachable"
                      else f"{state}, not connected",
                      str(nb["last_round_received"]), f"{nb['bytes_received'] / 1e6:.1f} MB",
                      f"{nb['bytes_sent'] / 1e6:.1f} MB", _fmt(nb["latency_ms"], ".1f") + " ms")
    acc = data["last_accuracy"]
    table.caption = (f"accuracy {_fmt(None if acc is None else 100 * acc, '.2f')}%  "
                     f"loss {_fmt(data['last_loss'], '.4f')}  "
                     f"residual ‖x−ω‖ {_fmt(data['consensus_residual'], '.4g')}  "
                     f"device {data['device']}  up {data['uptime_s']:.0f}s  "
                     + ("neighbours authenticated by mutual TLS" if data.get("tls") else
                        "neighbours NOT authenticated (no TLS)"))
    if data.get("data_size"):
        counts = data.get("class_counts") or {}
        table.caption += (f"\ndata: {data['data_size']} training samples, "
                          f"{data.get('test_size', 0)} test; per class: "
                          + ", ".join(f"{name}: {counts[name]}"
                                      for name in sorted(counts, key=_class_order)))
        if data.get("skipped_files"):
            table.caption += f"; {data['skipped_files']} undecodable files skipped"
    if data.get("feature_scale"):
        agreed = json.loads(data["feature_scale"])
        rows = max(agreed["count"], default=0)
        table.caption += (f"\nfeature scale: {agreed['method']} over "
                          f"{len(agreed['columns'])} features, agreed on {rows} rows "
                          "network-wide")
    if data.get("leaving"):
        table.caption += "\nleaving the network (drain requested)"
    anchors = data.get("anchors") or []
    if anchors or data.get("reanchored"):
        table.caption += (f"\nre-anchored {data.get('reanchored', 0)} time(s)"
                          + (f"; next at round {', '.join(map(str, anchors))}" if anchors
                             else ""))
    if data.get("quarantines"):
        quarantined = [nb["node_id"] for nb in data["neighbours"]
                       if nb.get("state") == "quarantined"]
        table.caption += (f"\nquarantined {', '.join(quarantined)} after repeated absurd or "
                          "stale states (not mixed again in this run)")
    if data.get("alone_rounds"):
        table.caption += f"\nmixed with no neighbour in {data['alone_rounds']} round(s)"
    if data.get("schedule") == "async":
        exchanged = ", ".join(f"{nb['node_id']} {nb.get('exchanges', 0)}"
                              for nb in data["neighbours"])
        table.caption += (f"\nasynchronous: block {data['round']}/{data['rounds_total']}; "
                          f"exchanges {exchanged}; waited {data.get('waited_s', 0):.1f}s")
        if data.get("ahead_of"):
            table.caption += (f"\nahead of {', '.join(data['ahead_of'])} by more than the "
                              "staleness bound: not mixed until they catch up")
    failures = {k: v for k, v in (data.get("tls_handshake_failures") or {}).items() if v}
    if failures:
        table.caption += "\nTLS handshakes failed: " + ", ".join(
            f"{reason} {count}" for reason, count in sorted(failures.items()))
    refusals = data.get("refusals") or {}
    if refusals:
        table.caption += "\nrefused: " + ", ".join(
            f"{reason} {count}" for reason, count in sorted(refusals.items()))
    return table


@click.command()
@target_option
@peers_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.option("--watch", is_flag=True, help="Refresh until interrupted.")
@click.option("--interval", type=float, default=2.0, show_default=True, help="--watch period.")
@auth_options
@config_errors
def status(target: str | None, peers_file: str | None, as_json: bool, watch: bool,
           interval: float, token: str | None, ca: str | None, server_name: str | None) -> None:
    """Show a running node: round, phase, neighbours, last accuracy and loss.

    Per neighbour: its state (active, unreachable, absent, gone, left, quarantined), rounds it
    missed, its states that came too late, its calls refused, and one-sided uses of the edge
    that were undone.

    With --watch, a node that finishes its rounds (and exits) ends the watch with its last
    status and "done", exit 0; one that stops answering before that, exit 1. With --json,
    errors are JSON too ({"error": ...} on stdout, exit 1).

    The node's user needs nothing but --peers: the token is read from the node's
    STATE_DIR/control.token (or node.control_token). Other users get nothing.

    \b
    Examples:
      dacflnode status --peers cluster/node-0.yaml
      dacflnode status --peers cluster/node-0.yaml --watch
      dacflnode status --target 127.0.0.1:8000 --token "$(cat cluster/node-0/control.token)"
    """
    import time

    from dacflnode.transport.errors import PeerUnavailable
    from dacflnode.transport.grpc_control import fetch_status

    addr, auth = control_endpoint(target, peers_file, token, ca, server_name, as_json)
    console = _status_console()
    since = time.time()

    async def show() -> dict[str, Any] | None:
        """Print the status (until interrupted, with --watch); the last status seen when the
        node stopped answering after it had answered."""
        last: dict[str, Any] | None = None
        while True:
            try:
                data = (await fetch_status(addr, auth=auth)).to_json()
            except PeerUnavailable:
                if last is None:
                    raise
                return last
            if as_json:
                click.echo(json.dumps(data))
            else:
                if watch:
                    console.clear()
                console.print(_status_view(data))
            if not watch:
                return None
            last = data
            await asyncio.sleep(interval)

    ended = None
    with contextlib.suppress(KeyboardInterrupt):
        ended = _call(addr, auth, show, as_json)
    if ended is not None:
        _ended(ended, addr, peers_file, since, as_json)


@click.command()
@target_option
@peers_option
@click.option("--format", "fmt", type=click.Choice(["json", "prometheus"]), default="json",
              show_default=True)
@auth_options
@config_errors
def metrics(target: str | None, peers_file: str | None, fmt: str, token: str | None,
            ca: str | None, server_name: str | None) -> None:
    """Print a running node's metrics (JSON, or Prometheus text exposition).

    --format prometheus prints what the node serves to Prometheus at
    http://<node.metrics>/metrics (the peers file's node.metrics key; `dacflnode topology`
    sets it). Point Prometheus at that endpoint: see docs/operations.md.

    \b
    Examples:
      dacflnode metrics --peers cluster/node-0.yaml
      dacflnode metrics --peers cluster/node-0.yaml --format prometheus
      curl -s http://127.0.0.1:9000/metrics
    """
    from dacflnode.transport.grpc_control import fetch_metrics

    addr, auth = control_endpoint(target, peers_file, token, ca, server_name)
    click.echo(_call(addr, auth, lambda: fetch_metrics(addr, fmt, auth=auth),
                     as_json=fmt == "json").rstrip("\n"))


@click.command()
@target_option
@peers_option
@click.option("--drain", is_flag=True,
              help="Leave the network for good: the node finishes its round, hands its share of "
                   "the consensus to its neighbours, tells them it left, and exits (they go on "
                   "without waiting for it).")
@auth_options
@config_errors
def stop(target: str | None, peers_file: str | None, drain: bool, token: str | None,
         ca: str | None, server_name: str | None) -> None:
    """Ask a running node to stop gracefully (checkpoint, exit 0).

    Without --drain the node stops where it is and can resume from its checkpoint; its
    neighbours wait for it each round until they declare it gone. With --drain it hands over
    its share of the consensus and leaves the network (docs/faults.md).

    \b
    Examples:
      dacflnode stop --peers cluster/node-0.yaml
      dacflnode stop --drain --peers cluster/node-2.yaml
    """
    from dacflnode.transport.grpc_control import request_stop

    addr, auth = control_endpoint(target, peers_file, token, ca, server_name)
    _call(addr, auth, lambda: request_stop(addr, auth=auth, drain=drain))
    click.echo(f"{'drain' if drain else 'stop'} requested at {addr}" + (
        ": the node hands over its share and leaves the network" if drain else ""))
