"""``dacflnode topology``: write the peers files of a whole cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import yaml

from dacflnode.cli.errors import config_errors
from dacflnode.cli.options import (
    GroupedCommand,
    cluster_options,
    config_from_options,
    out_dir_option,
    pop_daemon_settings,
)
from dacflnode.errors import ConfigError
from dacflnode.peers.addresses import CONTROL_PORT_OFFSET, METRICS_PORT_OFFSET


def _split(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]


def _ports(value: str | None, field: str) -> list[int] | None:
    items = _split(value)
    if items is None:
        return None
    try:
        return [int(item) for item in items]
    except ValueError:
        raise ConfigError(field, f"expected a comma list of port numbers, got {value!r}") from None


@click.command("topology", cls=GroupedCommand, option_groups={
    "out_dir": "output", "state_root": "output", "as_json": "output", "hosts": "network",
    "base_port": "network", "ports": "network", "control_base_port": "network",
    "control_ports": "network", "metrics_ports": "network", "metrics_host": "network",
    "listen_host": "network", "tls_dir": "network", "insecure": "network"})
@click.argument("graph", metavar="KIND")
@out_dir_option("Write DIR/<node-id>.yaml, one peers file per node.")
@click.option(
    "--hosts",
    default="127.0.0.1",
    show_default=True,
    help="Comma list of hosts; node i runs on host i mod len(hosts).",
)
@click.option(
    "--base-port",
    type=int,
    default=7000,
    show_default=True,
    help="Node i listens on port base-port + i.",
)
@click.option("--ports", help="Comma list of listen ports, one per node (instead of --base-port).")
@click.option(
    "--control-base-port",
    type=int,
    help="Node i's control port is this + i on 127.0.0.1. "
    f"[default: listen port + {CONTROL_PORT_OFFSET}]",
)
@click.option("--control-ports", help="Comma list of control ports, one per node.")
@click.option("--metrics-ports",
              help="Comma list of Prometheus /metrics ports, one per node (default: listen port"
                   f" + {METRICS_PORT_OFFSET}, or none when --control-ports is given).")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              help="Address the /metrics endpoints listen on (another host's scraper needs"
                   " 0.0.0.0 or the node's address; then every node requires one bearer"
                   " token, also written to OUT/metrics.token for the scraper).")
@click.option(
    "--listen-host",
    help="Address every node binds to, e.g. 0.0.0.0. [default: the node's host]",
)
@click.option(
    "--state-root",
    type=click.Path(file_okay=False),
    help="Node state goes in STATE_ROOT/<node-id>. [default: DIR/<node-id>]",
)
@click.option(
    "--tls",
    "tls_dir",
    type=click.Path(file_okay=False),
    help="Mutual TLS: create what is missing in TLS_DIR (CA, one certificate per node; see"
    " `dacflnode certs`) and write node.tls into every file.",
)
@click.option(
    "--insecure",
    is_flag=True,
    help="Write node.insecure: true, which lets a node listen on a non-loopback address"
    " without TLS (anyone who reaches it can push or pull models).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the nodes as a JSON list.")
@cluster_options(topology="KIND")
@config_errors
def topology_cmd(
    graph: str,
    out_dir: str,
    hosts: str,
    base_port: int,
    ports: str | None,
    control_base_port: int | None,
    control_ports: str | None,
    metrics_ports: str | None,
    metrics_host: str,
    listen_host: str | None,
    state_root: str | None,
    tls_dir: str | None,
    insecure: bool,
    round_deadline: float,
    hello_timeout: float,
    as_json: bool,
    **options: Any,
) -> None:
    """Write the peers.yaml of every node of a cluster whose graph is KIND.

    KIND is one of ring, complete, random-regular (--degree), erdos-renyi (--edge-prob) or
    edge-list (--edge-list FILE of 'i j' lines). The graph is the one `dacflnode simulate`
    draws for the same kind, --nodes and --seed. Nodes are node-0 ... node-{N-1}; node i holds
    data part i. The run options go into every file's run section (--algorithm: dacfl or
    cdsgd); --nodes is required unless --config sets it or KIND is edge-list.

    A node that listens on an address other hosts can reach needs --tls DIR (mutual TLS; the
    certificates are created in DIR when missing) or, knowingly, --insecure.

    \b
    Examples:
      dacflnode topology ring --nodes 4 --out cluster
      dacflnode topology random-regular --nodes 10 --degree 3 --seed 7 --out cluster
      dacflnode topology complete --nodes 6 --hosts 10.0.0.1,10.0.0.2 \\
          --listen-host 0.0.0.0 --tls certs --time-varying 10 --out cluster --json
      dacflnode topology edge-list --edge-list graph.txt --algorithm cdsgd --out cluster
      dacflnode topology ring --nodes 5 --mixing clipped --out cluster  # ClippedGossip
      dacflnode topology ring --nodes 3 --config examples/own-data/images/run.yaml \\
          --data-root /data/photos --test-root /data/test --out cluster  # node-i: DIR/node-i
    """
    from dacflnode.algorithms.graphs import read_edge_list
    from dacflnode.peers.file import parse_peers
    from dacflnode.peers.generate import check_graph, generate_cluster

    # daemon settings beyond the two deadlines (--gone-after, ...) go to every peers file
    daemon_settings = pop_daemon_settings(options)
    graph = check_graph(graph.strip().lower())
    given_topology = options.get("topology")
    if given_topology is not None and given_topology != graph:
        raise ConfigError("topology", f"--topology {given_topology} disagrees with KIND {graph}")
    options["topology"] = graph
    if options.get("nodes") is None and options.get("config_file") is None:
        if graph == "edge-list" and options.get("edge_list"):
            options["nodes"] = read_edge_list(options["edge_list"])[0]
        else:
            raise ConfigError("nodes", "give the number of nodes with --nodes N")
    cfg = config_from_options(options)
    paths = generate_cluster(
        graph,
        cfg.nodes,
        cfg,
        Path(out_dir),
        hosts=_split(hosts) or [],
        base_port=base_port,
        control_base_port=control_base_port,
        listen_host=listen_host,
        edge_list=cfg.edge_list,
        ports=_ports(ports, "ports"),
        control_ports=_ports(control_ports, "control_ports"),
        metrics_ports=_ports(metrics_ports, "metrics_ports"),
        metrics_host=metrics_host,
        state_root=Path(state_root) if state_root else None,
        round_deadline=round_deadline,
        hello_timeout=hello_timeout,
        daemon_settings=daemon_settings,
        tls_dir=Path(tls_dir) if tls_dir else None,
        insecure=insecure,
    )
    # generate_cluster checked every file; read them back without re-validating the run N times
    files = [parse_peers(yaml.safe_load(p.read_text()), p, check_run=False) for p in paths]
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "id": pf.node.id,
                        "path": str(pf.path),
                        "listen": pf.node.listen,
                        "control": pf.node.control,
                        "neighbours": pf.neighbour_ids(),
                        "tls": str(pf.node.tls.cert) if pf.node.tls else None,
                    }
                    for pf in files
                ]
            )
        )
        return
    width = max(len(pf.node.id) for pf in files)
    listen_width = max(len(pf.node.listen) for pf in files)
    for pf in files:
        click.echo(
            f"{pf.node.id:<{width}}  {pf.node.listen:<{listen_width}}"
            f"  -> {', '.join(pf.neighbour_ids())}"
        )
    fingerprint = ("completed by each node's data contract when it reads its data"
                   if files[0].run.own_data else files[0].run_fingerprint()[:12])
    click.echo(
        f"wrote {len(paths)} peers files to {paths[0].parent} (run fingerprint {fingerprint})",
        err=True,
    )
    if tls_dir:
        click.echo(f"TLS certificates in {Path(tls_dir).absolute()} (CA: ca.crt)", err=True)
    click.echo("control ports on 127.0.0.1: each node writes a new control token to its "
               "STATE_DIR/control.token (mode 0600) at every start; `dacflnode status --peers "
               "FILE`, run as the node's user, reads it", err=True)
