"""Generate the peers files of a whole cluster from one graph (``dacflnode topology``).

The graph is the one ``dacflnode simulate`` builds for the same topology, size and seed
(:meth:`MixingSchedule.base_edges`), node ``i`` is ``node-i`` and holds data part ``i``, and every
file carries the whole member list and edge list, so a time-varying run drops the same edges on
every node and in the simulator.

With ``tls_dir`` every node gets a certificate from that folder's CA (created when missing, see
:mod:`dacflnode.security.certs`) and ``node.tls`` naming it; ``insecure`` writes
``node.insecure: true`` instead, which a cluster listening on other hosts' addresses without TLS
needs.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from dacflnode.algorithms import graphs
from dacflnode.algorithms.topology import GRAPH_KINDS, MATRIX_KINDS, MixingSchedule, TopologySpec
from dacflnode.config import DAEMON_DEFAULTS, DaemonSettings, RunConfig, schema
from dacflnode.errors import ConfigError
from dacflnode.filemodes import LOG_MODE, SECRET_MODE, make_dir, write_text
from dacflnode.learning.names import node_ids
from dacflnode.peers.addresses import (
    CONTROL_HOST,
    CONTROL_PORT_OFFSET,
    METRICS_PORT_OFFSET,
    format_address,
    is_loopback,
)
from dacflnode.peers.algorithms import check_algorithm
from dacflnode.peers.file import parse_peers
from dacflnode.peers.model import Neighbour, NodeSection, PeersFile
from dacflnode.peers.yaml_form import dump_peers
from dacflnode.security.certs import tls_files, write_certs


def check_graph(topology: str) -> str:
    """``topology`` if it is a graph a cluster can be generated from (the ``KIND`` of
    ``dacflnode topology``), else a ConfigError."""
    if topology in GRAPH_KINDS:
        return topology
    if topology in MATRIX_KINDS:
        raise ConfigError(
            "kind",
            f"'{topology}' is a mixing-matrix topology, which needs a global view of the network;"
            f" a cluster needs a graph: {', '.join(GRAPH_KINDS)}",
        )
    raise ConfigError(
        "kind", f"unknown graph kind '{topology}' (choose from {', '.join(GRAPH_KINDS)})"
    )


def cluster_graph(
    topology: str, nodes: int, run: RunConfig, edge_list: str | None = None
) -> graphs.Edges:
    """The base graph the simulator builds for the graph ``topology`` with the run's seed and
    parameters."""
    check_graph(topology)
    if topology == "edge-list" and not edge_list:
        raise ConfigError("edge_list", "kind 'edge-list' needs an edge list file (--edge-list)")
    spec = TopologySpec(
        topology=topology,
        nodes=nodes,
        seed=run.seed,
        degree=run.degree,
        edge_prob=run.edge_prob,
        edge_list=edge_list if topology == "edge-list" else None,
    )
    edges = MixingSchedule(spec).base_edges()
    assert edges is not None  # a graph kind always has a base graph
    return edges


def _port_list(values: Sequence[int] | None, nodes: int, field: str) -> list[int] | None:
    if values is None:
        return None
    ports = [int(p) for p in values]
    if len(ports) != nodes:
        raise ConfigError(field, f"give one port per node: {nodes} nodes, {len(ports)} ports")
    return ports


def _check_port(port: int, field: str, what: str) -> int:
    if not 1 <= port <= 65535:
        raise ConfigError(field, f"{what} gets port {port}, outside 1..65535")
    return port


def _daemon_settings(
    round_deadline: float, hello_timeout: float, more: Mapping[str, Any] | None = None
) -> DaemonSettings:
    """The deadlines (and any other daemon settings given), checked as declared (the error
    names the option, not a file)."""
    daemon = schema.from_mapping(
        DaemonSettings,
        {"round_deadline": round_deadline, "hello_timeout": hello_timeout, **(more or {})},
    )
    schema.check(daemon)
    return daemon


def _absolute(value: str | None) -> str | None:
    return str(Path(value).expanduser().absolute()) if value else value


def _node_run(run: RunConfig, node: str) -> RunConfig:
    """The run settings of ``node``'s file: with own data, its own ``DIR/<node-id>`` data (and
    test) folder, which must exist (:meth:`RunConfig.for_node`)."""
    mine = run.for_node(node)
    if mine.own_data and mine.data_root is not None and not Path(mine.data_root).exists():
        raise ConfigError(
            "data_root",
            f"{mine.data_root} does not exist: give each node its data as"
            f" {run.data_root}/<node-id>/",
        )
    return mine


def peers_file_mode(pf: PeersFile) -> int:
    """The mode a peers file is written with: a file that holds a Control token is a secret
    (0600); the others hold addresses and settings (0640)."""
    return SECRET_MODE if pf.node.control_token else LOG_MODE


def generate_cluster(
    topology: str,
    nodes: int,
    run: RunConfig,
    out_dir: Path,
    *,
    hosts: Sequence[str] = ("127.0.0.1",),
    base_port: int = 7000,
    control_base_port: int | None = None,
    listen_host: str | None = None,
    edge_list: str | None = None,
    ports: Sequence[int] | None = None,
    control_ports: Sequence[int] | None = None,
    metrics_ports: Sequence[int] | None = None,
    metrics_host: str = CONTROL_HOST,
    state_root: Path | None = None,
    seed: int | None = None,
    round_deadline: float = DAEMON_DEFAULTS.round_deadline,
    hello_timeout: float = DAEMON_DEFAULTS.hello_timeout,
    daemon_settings: Mapping[str, Any] | None = None,
    tls_dir: Path | None = None,
    insecure: bool = False,
    slowdown: Mapping[str, float] | None = None,
) -> list[Path]:
    """Write ``out_dir/<node-id>.yaml`` for ``node-0 … node-{nodes-1}``; return their paths.

    Node ``i`` runs on ``hosts[i % len(hosts)]`` at port ``ports[i]`` (default
    ``base_port + i``) and listens on ``listen_host`` (default: that host) at that port; its
    control address is ``127.0.0.1`` at ``control_ports[i]``, ``control_base_port + i`` or the
    listen port + 1000. Its Prometheus endpoint (``node.metrics``) is ``metrics_host`` (default
    ``127.0.0.1``; another host must be asked for) at ``metrics_ports[i]``, or the control
    port + 1000 (by default the listen port + 2000) unless ``control_ports`` are given (ports
    picked one by one, e.g. free ones: then there is none without ``metrics_ports``) or that is
    above 65535. A ``metrics_host`` other hosts reach gets a bearer token (``node.metrics_token``,
    one for the whole cluster), also written to ``out_dir/metrics.token`` (mode 0600) for the
    scraper's ``credentials_file``. Its neighbours are its neighbours
    in the graph, reached at their host.

    The graph is drawn with ``run.seed``, as the simulator draws it; ``seed``, when given,
    replaces ``run.seed`` (for the graph and in the files alike, so that they stay consistent).
    ``daemon_settings``: further daemon settings by name (``gone_after``, ...) for every file.
    ``slowdown``: the ``run.slowdown`` of the nodes named (a node-local setting: an
    experiment's slow devices).
    Relative paths in ``run`` are made absolute. With own data (``folder``, ``table``,
    ``python``) ``run.data_root`` DIR is the folder of the nodes' data and node ``i``'s file
    names ``DIR/node-i`` (and ``run.test_root`` T: ``T/node-i`` when that exists, else T shared
    by all). Every file is checked as the daemon reads it
    before any is written; the certificates missing from ``tls_dir`` are written just before the
    peers files, whose ``node.tls`` names them by absolute path.
    """
    if seed is not None:
        run = dataclasses.replace(run, seed=int(seed))
    topology = check_graph(topology)
    if isinstance(nodes, bool) or nodes < 2:
        raise ConfigError("nodes", f"a cluster needs at least 2 nodes, got {nodes}")
    if len(run.algorithm) != 1:
        raise ConfigError(
            "algorithm", f"a cluster runs one algorithm, got {', '.join(run.algorithm) or 'none'}"
        )
    check_algorithm(run.algorithm[0])
    if tls_dir is not None and insecure:
        raise ConfigError("insecure", "contradicts --tls (a TLS node refuses plaintext): give one")
    host_list = [h.strip() for h in hosts if h.strip()]
    if not host_list:
        raise ConfigError("hosts", "name at least one host")
    edge_file = _absolute(edge_list or run.edge_list) if topology == "edge-list" else None
    edges = cluster_graph(topology, nodes, run, edge_file)

    ids = node_ids(nodes)
    listen_ports = _port_list(ports, nodes, "ports") or [base_port + i for i in range(nodes)]
    ctl_ports = _port_list(control_ports, nodes, "control_ports")
    met_ports = _port_list(metrics_ports, nodes, "metrics_ports")
    node_host = [host_list[i % len(host_list)] for i in range(nodes)]
    listen, control, metrics = [], [], []
    used: dict[tuple[str, int], str] = {}
    for i, node in enumerate(ids):
        port = _check_port(listen_ports[i], "ports" if ports else "base_port", node)
        if ctl_ports is not None:
            ctl = _check_port(ctl_ports[i], "control_ports", f"{node}'s control")
        elif control_base_port is not None:
            ctl = _check_port(control_base_port + i, "control_base_port", f"{node}'s control")
        else:
            ctl = _check_port(port + CONTROL_PORT_OFFSET, "base_port", f"{node}'s control")
        if met_ports is not None:
            met: int | None = _check_port(met_ports[i], "metrics_ports", f"{node}'s metrics")
        elif ctl_ports is None and ctl + METRICS_PORT_OFFSET - CONTROL_PORT_OFFSET <= 65535:
            met = ctl + METRICS_PORT_OFFSET - CONTROL_PORT_OFFSET  # 1000 above the control port
        else:
            met = None
        for p, what in ((port, "listen"), (ctl, "control"), (met, "metrics")):
            if p is None:
                continue
            key = (node_host[i], p)
            if key in used:
                raise ConfigError(
                    "ports" if ports or control_ports or metrics_ports else "base_port",
                    f"port {p} on {node_host[i]} is taken twice ({used[key]} and {node} {what})",
                )
            used[key] = f"{node} {what}"
        bind = listen_host or node_host[i]
        if tls_dir is None and not insecure and not is_loopback(bind):
            raise ConfigError(
                "tls",
                f"{node} listens on {bind}, which other hosts can reach: give a certificate"
                " folder (--tls DIR) for mutual TLS, or allow plaintext (--insecure)",
            )
        listen.append(format_address(bind, port))
        control.append(format_address(CONTROL_HOST, ctl))
        metrics.append(None if met is None else format_address(metrics_host, met))

    cfg = dataclasses.replace(
        run,
        nodes=nodes,
        topology=topology,
        edge_list=edge_file if topology == "edge-list" else _absolute(run.edge_list),
        data_root=_absolute(run.data_root),
        test_root=_absolute(run.test_root),
        mixing_matrix=_absolute(run.mixing_matrix),
    )
    slow = dict(slowdown or {})
    unknown = sorted(set(slow) - set(ids))
    if unknown:
        raise ConfigError("slowdown", f"no node {', '.join(unknown)} in this cluster "
                          f"(nodes {ids[0]} to {ids[-1]})")
    node_runs = [dataclasses.replace(_node_run(cfg, node), slowdown=slow.get(node, cfg.slowdown))
                 for node in ids]
    daemon = dataclasses.replace(
        _daemon_settings(round_deadline, hello_timeout, daemon_settings),
        members=tuple(ids),
        edges=tuple((ids[i], ids[j]) for i, j in edges),
    )
    adjacency = graphs.neighbours(nodes, edges)
    out = Path(out_dir).expanduser().absolute()
    root = Path(state_root).expanduser().absolute() if state_root is not None else out
    certs = Path(tls_dir).expanduser().absolute() if tls_dir is not None else None
    metrics_token = (secrets.token_urlsafe(32)
                     if any(m is not None for m in metrics) and not is_loopback(metrics_host)
                     else None)
    files: list[PeersFile] = []
    for i, node in enumerate(ids):
        path = out / f"{node}.yaml"
        files.append(
            PeersFile(
                path=path,
                node=NodeSection(
                    node,
                    listen[i],
                    control[i],
                    root / node,
                    i,
                    tls=tls_files(certs, node) if certs is not None else None,
                    insecure=insecure,
                    metrics=metrics[i],
                    metrics_token=metrics_token if metrics[i] is not None else None,
                ),
                neighbours=tuple(
                    Neighbour(ids[j], format_address(node_host[j], listen_ports[j]))
                    for j in adjacency[i]
                ),
                run=node_runs[i],
                daemon=daemon,
            )
        )
    # Check every file as the daemon will read it (the run settings once: they are shared).
    texts = [dump_peers(pf) for pf in files]
    for k, (pf, text) in enumerate(zip(files, texts, strict=True)):
        parse_peers(yaml.safe_load(text), pf.path, check_run=k == 0)
    if certs is not None:
        write_certs(certs, ids)
    make_dir(out)
    if metrics_token is not None:
        write_metrics_token(out / METRICS_TOKEN_FILE, metrics_token)
    for pf, text in zip(files, texts, strict=True):
        write_text(pf.path, text, peers_file_mode(pf))
    return [pf.path for pf in files]


#: Where :func:`generate_cluster` writes the cluster's metrics token for the scraper.
METRICS_TOKEN_FILE = "metrics.token"


def write_metrics_token(path: Path, token: str) -> None:
    """``token`` and a newline to ``path``, readable by this user only (mode 0600 whatever the
    umask; an existing file is replaced)."""
    write_text(path, token + "\n", SECRET_MODE)
