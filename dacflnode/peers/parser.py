"""Checking a peers file: :class:`PeersParser` turns its parsed YAML into a
:class:`~dacflnode.peers.model.PeersFile`, section by section (``node:``, ``neighbours:``,
``run:``), then across them.

What it checks, and the file's format, are described in :mod:`dacflnode.peers.file`, which
reads the file and calls it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dacflnode.algorithms import graphs
from dacflnode.algorithms.topology import TOPOLOGIES
from dacflnode.config import schema
from dacflnode.config.daemon import DaemonSettings
from dacflnode.config.node import NODE_DATA_KEYS, NodeSettings, TlsSettings
from dacflnode.config.reader import FileErrors, describe
from dacflnode.config.run import RunConfig, config_from_mapping
from dacflnode.errors import ConfigError, MixingMatrixError
from dacflnode.peers.addresses import (
    CONTROL_HOST,
    CONTROL_PORT_OFFSET,
    format_address,
    is_loopback,
    parse_address,
)
from dacflnode.peers.algorithms import DAEMON_ALGORITHMS, check_algorithm
from dacflnode.peers.model import Neighbour, NodeSection, PeersFile
from dacflnode.peers.tokens import TOKEN_MIN, TOKEN_RE
from dacflnode.security.certs import NODE_ID_RE, check_node_id
from dacflnode.security.tls import TlsFiles

__all__ = ["PeersParser"]

_TOP_KEYS = ("node", "neighbours", "run")
_NODE_KEYS = (*schema.names_of(NodeSettings), *NODE_DATA_KEYS)

_TLS_KEYS = schema.names_of(TlsSettings)
_NEIGHBOUR_KEYS = ("id", "address")
_DAEMON_KEYS = schema.names_of(DaemonSettings)
_RUN_KEYS = schema.names_of(RunConfig)
_PATH_KEYS = ("data_root", "test_root", "edge_list", "mixing_matrix")


class PeersParser:
    """Checks the parsed YAML of one peers file, section by section; every problem is a
    :class:`ConfigError` whose field is the dotted key and whose message names the file."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self.base = file.parent
        self.errors = FileErrors(file)
        self.err = self.errors.error

    # ------------------------------------------------------------------ generic helpers
    def mapping(
        self, value: Any, where: str, allowed: Iterable[str], prefix: str = ""
    ) -> dict[str, Any]:
        """``value`` as a dict with snake_case keys, rejecting unknown and repeated keys."""
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise self.err(where, f"expected a mapping, got {describe(value)}")
        return self.errors.keys(value, where, allowed, prefix)

    def ident(self, value: Any, field: str) -> str:
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise self.err(field, f"expected a node id, got {describe(value)}")
        text = str(value).strip()
        if not NODE_ID_RE.fullmatch(text):
            raise self.err(
                field,
                f"node ids are 1-128 letters, digits, '.', '_' or '-' (starting with a letter or"
                f" digit), got {value!r}",
            )
        return text

    def path(self, value: Any, field: str) -> Path:
        if not isinstance(value, str) or not value.strip():
            raise self.err(field, f"expected a path, got {value!r}")
        return Path(os.path.normpath(self.base / Path(value.strip()).expanduser()))

    def listing(self, value: Any, field: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.err(field, f"expected a list, got {describe(value)}")
        return value

    # ------------------------------------------------------------------ sections
    def parse(self, data: Any, check_run: bool) -> PeersFile:
        if not isinstance(data, Mapping):
            raise self.err("peers", "expected a mapping with the sections node, neighbours and run")
        top = self.mapping(data, "peers", _TOP_KEYS)
        for key in ("node", "neighbours"):
            if top.get(key) is None:
                raise self.err(key, "required section is missing")
        node_raw = self.mapping(top["node"], "node", _NODE_KEYS, "node.")
        node_id = self.node_id(node_raw)
        neighbours = self.neighbours(top["neighbours"], node_id)
        run, daemon = self.run(self.with_node_data(top.get("run"), node_raw), check_run)
        node = self.node(node_raw, node_id, run, daemon)
        if node.tls is not None:
            self.tls_ids(node_id, neighbours)
        self.cross_check(node, neighbours, run, daemon)
        return PeersFile(self.file, node, neighbours, run, daemon)

    def with_node_data(self, run_value: Any, node_raw: dict[str, Any]) -> Any:
        """``run:`` with the data keys of ``node:`` (data_root, test_root, bad_files) added;
        a key given in both sections is refused."""
        given = {k: node_raw.pop(k) for k in NODE_DATA_KEYS if k in node_raw}
        if not given:
            return run_value
        if run_value is None:
            run_value = {}
        if not isinstance(run_value, Mapping):
            return run_value  # self.run names the problem
        merged = dict(run_value)
        for key, value in given.items():
            if key in merged or key.replace("_", "-") in merged:
                raise self.err(f"node.{key}", f"is given under run: too; keep one {key}")
            merged[key] = value
        return merged

    def node_id(self, raw: dict[str, Any]) -> str:
        if raw.get("id") is None:
            raise self.err("node.id", "required: this node's id")
        return self.ident(raw["id"], "node.id")

    def node_settings(self, raw: dict[str, Any], node_id: str) -> NodeSettings:
        """The ``node:`` keys as declared (:class:`NodeSettings`), each of its type; an empty
        key is not given."""
        values = {k: v for k, v in raw.items() if v is not None}
        values["id"] = node_id
        if "tls" in values:
            values["tls"] = self.mapping(values["tls"], "node.tls", _TLS_KEYS, "node.tls.")
        try:
            settings = schema.from_mapping(NodeSettings, values, exact=True)
            schema.check(settings)
        except ConfigError as exc:
            raise self.err(f"node.{exc.field}", exc.message) from None
        return settings

    def node(
        self, raw: dict[str, Any], node_id: str, run: RunConfig, daemon: DaemonSettings
    ) -> NodeSection:
        given = self.node_settings(raw, node_id)
        if given.listen is None:
            raise self.err("node.listen", "required: the host:port neighbours connect to")
        host, port = parse_address(given.listen, "node.listen", self.file)
        listen = format_address(host, port)
        if given.control is not None:
            control = format_address(*parse_address(given.control, "node.control", self.file))
        else:
            control_port = port + CONTROL_PORT_OFFSET if port else 0
            if control_port > 65535:
                raise self.err(
                    "node.control",
                    f"the default control port (listen port {port} + {CONTROL_PORT_OFFSET}) is"
                    " above 65535: set node.control",
                )
            control = format_address(CONTROL_HOST, control_port)
        if port and control == listen:
            raise self.err("node.control", f"is the listen address {listen}")
        metrics = self.metrics(given.metrics, listen, control)
        health = self.extra_address(given.health, "node.health",
                                    {"node.listen": listen, "node.control": control,
                                     "node.metrics": metrics})
        state_dir = (
            self.path(given.state_dir, "node.state_dir")
            if given.state_dir is not None
            else self.base / node_id
        )
        if given.share is not None:
            share = given.share
        elif daemon.members:
            share = daemon.members.index(node_id)
        elif run.own_data:
            share = 0  # own data is not cut from a shared set: the share is unused
        else:
            raise self.err(
                "node.share", "required when run.members is not given (this node's data part)"
            )
        if share >= run.nodes:
            raise self.err("node.share", f"must be < run.nodes = {run.nodes}, got {share}")
        tls = self.tls(given.tls)
        token = self.token(given.control_token)
        self.exposure(host, control, tls, given.insecure, token)
        metrics_token, metrics_token_file = self.metrics_token(given)
        self.metrics_exposure(metrics, metrics_token, metrics_token_file)
        return NodeSection(
            node_id, listen, control, state_dir, share, tls, given.insecure, token, metrics,
            health, metrics_token, metrics_token_file,
        )

    def metrics_token(self, given: NodeSettings) -> tuple[str | None, Path | None]:
        """``node.metrics_token`` or ``node.metrics_token_file`` (one of them); the value is
        never echoed. The file is read when the daemon starts (:func:`read_metrics_token`), as
        the TLS files are, so that a peers file can be checked away from the node's host."""
        value, file_value = given.metrics_token, given.metrics_token_file
        if value is not None and file_value is not None:
            raise self.err("node.metrics_token_file", "contradicts node.metrics_token: keep one")
        if file_value is None:
            return self.token(value, "node.metrics_token"), None
        return None, self.path(file_value, "node.metrics_token_file")

    def metrics_exposure(self, metrics: str | None, token: str | None,
                         token_file: Path | None) -> None:
        """Refuse a metrics port that other hosts reach without a bearer token."""
        if metrics is None or token is not None or token_file is not None:
            return
        host = parse_address(metrics, "node.metrics", self.file)[0]
        if is_loopback(host):
            return
        raise self.err(
            "node.metrics_token",
            f"required: node.metrics {metrics} is reachable from other hosts, and the metrics"
            " name the node, its neighbours and its traffic: set node.metrics_token (or"
            " node.metrics_token_file) and give Prometheus the same token (scrape config"
            " authorization: credentials_file, see docs/operations.md), or keep node.metrics"
            " on 127.0.0.1",
        )

    def metrics(self, value: Any, listen: str, control: str) -> str | None:
        """``node.metrics``: absent, or a ``host:port`` other than the peer and control ones."""
        return self.extra_address(value, "node.metrics",
                                  {"node.listen": listen, "node.control": control})

    def extra_address(self, value: Any, field: str, others: dict[str, str | None]) -> str | None:
        """An optional ``host:port`` (``field``) that must differ from the ``others``."""
        if value is None:
            return None
        host, port = parse_address(value, field, self.file)
        address = format_address(host, port)
        for key, other in others.items():
            if port and address == other:
                raise self.err(field, f"is the {key} address {other}: use another port")
        return address

    def tls(self, given: TlsSettings | None) -> TlsFiles | None:
        if given is None:
            return None
        for key in _TLS_KEYS:
            if getattr(given, key) is None:
                raise self.err(f"node.tls.{key}", "required: node.tls names a ca, cert and key")
        return TlsFiles(*(self.path(getattr(given, key), f"node.tls.{key}") for key in _TLS_KEYS))

    def tls_ids(self, node_id: str, neighbours: tuple[Neighbour, ...]) -> None:
        """Every id must be a DNS name: TLS clients check the neighbour's certificate for it."""
        wheres = ["node.id", *(f"neighbours[{k}].id" for k in range(len(neighbours)))]
        for where, nid in zip(wheres, [node_id, *(n.id for n in neighbours)], strict=True):
            try:
                check_node_id(nid, where)
            except ConfigError as exc:
                raise self.err(where, exc.message) from None

    def token(self, value: str | None, field: str = "node.control_token") -> str | None:
        if value is None:
            return None
        # never echo the value: it is a secret
        if not TOKEN_RE.fullmatch(value):
            raise self.err(
                field,
                f"use at least {TOKEN_MIN} printable ASCII characters without spaces"
                f" (got {len(value)} characters)",
            )
        return value

    def exposure(
        self,
        listen_host: str,
        control: str,
        tls: TlsFiles | None,
        insecure: bool,
        token: str | None,
    ) -> None:
        """Refuse a peer or control port that others can reach without the protection it needs."""
        if tls is not None and insecure:
            raise self.err(
                "node.insecure", "contradicts node.tls (a TLS node refuses plaintext): drop one"
            )
        if tls is None and not insecure and not is_loopback(listen_host):
            raise self.err(
                "node.listen",
                f"{listen_host} is reachable from other hosts, and without TLS anyone who reaches"
                " it can push or pull models: set node.tls (see: dacflnode certs) or, to accept"
                " that, node.insecure: true",
            )
        control_host = parse_address(control, "node.control", self.file)[0]
        if is_loopback(control_host):
            return
        if tls is None:
            raise self.err(
                "node.control",
                f"{control_host} is reachable from other hosts: an exposed control service needs"
                " node.tls and node.control_token (or keep it on 127.0.0.1)",
            )
        if token is None:
            raise self.err(
                "node.control_token",
                f"required: node.control {control} is reachable from other hosts",
            )

    def neighbours(self, value: Any, node_id: str) -> tuple[Neighbour, ...]:
        items = self.listing(value, "neighbours")
        if not items:
            raise self.err("neighbours", "list at least one neighbour")
        out: list[Neighbour] = []
        seen_ids: dict[str, int] = {}
        seen_addresses: dict[str, int] = {}
        for k, item in enumerate(items):
            where = f"neighbours[{k}]"
            raw = self.mapping(item, where, _NEIGHBOUR_KEYS, f"{where}.")
            for key in _NEIGHBOUR_KEYS:
                if raw.get(key) is None:
                    raise self.err(f"{where}.{key}", "required")
            nid = self.ident(raw["id"], f"{where}.id")
            if nid == node_id:
                raise self.err(f"{where}.id", f"'{nid}' is this node's own id")
            if nid in seen_ids:
                raise self.err(
                    f"{where}.id", f"duplicate neighbour '{nid}' (also neighbours[{seen_ids[nid]}])"
                )
            host, port = parse_address(raw["address"], f"{where}.address", self.file)
            if port == 0:
                raise self.err(f"{where}.address", "port 0 cannot be connected to")
            address = format_address(host, port)
            if address in seen_addresses:
                raise self.err(
                    f"{where}.address",
                    f"{address} is also the address of neighbours[{seen_addresses[address]}]",
                )
            seen_ids[nid] = k
            seen_addresses[address] = k
            out.append(Neighbour(nid, address))
        return tuple(out)

    def run(self, value: Any, check_run: bool) -> tuple[RunConfig, DaemonSettings]:
        raw = self.mapping(value, "run", _RUN_KEYS + _DAEMON_KEYS, "run.")
        daemon_raw = {k: raw.pop(k) for k in _DAEMON_KEYS if k in raw}
        members = self.members(daemon_raw.pop("members", None))
        if members and raw.get("nodes") is None:
            raw["nodes"] = len(members)
        for key in _PATH_KEYS:
            if isinstance(raw.get(key), str):
                raw[key] = str(self.path(raw[key], f"run.{key}"))
        try:
            run = config_from_mapping(raw)
        except ConfigError as exc:
            raise self.err(f"run.{exc.field}", exc.message) from None
        if len(run.algorithm) != 1:
            raise self.err(
                "run.algorithm",
                f"a daemon runs one algorithm ({' or '.join(DAEMON_ALGORITHMS)}), got"
                f" {', '.join(run.algorithm) or 'none'}",
            )
        check_algorithm(run.algorithm[0], lambda msg: self.err("run.algorithm", msg))
        try:
            schema.check(run)
        except ConfigError as exc:
            raise self.err(f"run.{exc.field}", exc.message) from None
        if members and run.nodes != len(members):
            raise self.err(
                "run.nodes", f"is {run.nodes} but run.members lists {len(members)} nodes"
            )
        edges = self.edges(daemon_raw.pop("edges", None), members)
        if run.time_varying > 0:
            for key, given in (("members", members), ("edges", edges)):
                if not given:
                    raise self.err(
                        f"run.{key}",
                        f"required when run.time_varying > 0 (got {run.time_varying}): every"
                        " node draws each round's graph from the whole member list and edges",
                    )
        if check_run:
            self.validate_run(run, bool(edges))
        try:
            daemon = schema.from_mapping(DaemonSettings, daemon_raw)
            schema.check(daemon)
        except ConfigError as exc:
            raise self.err(f"run.{exc.field}", exc.message) from None
        return run, dataclasses.replace(daemon, members=members, edges=edges)

    def validate_run(self, run: RunConfig, have_edges: bool) -> None:
        # With explicit edges the graph is the edges: topology and its files are only a record
        # of how they were drawn, and need not exist on this host (a graph kind stands in for
        # them, which the asynchronous schedule requires; no file is read for complete).
        stand_in = "complete" if run.schedule == "async" else "uniform"
        check = (
            dataclasses.replace(
                run,
                topology=stand_in if run.topology in TOPOLOGIES else run.topology,
                edge_list=None,
                mixing_matrix=None,
            )
            if have_edges
            else run
        )
        try:
            check.validate()
        except ConfigError as exc:
            raise self.err(f"run.{exc.field}", exc.message) from None
        except MixingMatrixError as exc:
            raise self.err("run.topology", str(exc)) from None

    def members(self, value: Any) -> tuple[str, ...]:
        if value is None:
            return ()
        items = self.listing(value, "run.members")
        out: list[str] = []
        for k, item in enumerate(items):
            mid = self.ident(item, f"run.members[{k}]")
            if mid in out:
                raise self.err(
                    f"run.members[{k}]", f"'{mid}' is listed twice (also at {out.index(mid)})"
                )
            out.append(mid)
        if len(out) < 2:
            raise self.err("run.members", f"a network needs at least 2 nodes, got {len(out)}")
        return tuple(out)

    def edges(self, value: Any, members: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
        if value is None:
            return ()
        items = self.listing(value, "run.edges")
        if not members:
            raise self.err("run.edges", "needs run.members (the ids the edges connect)")
        if not items:
            raise self.err("run.edges", "the graph has no edges")
        index = {m: i for i, m in enumerate(members)}
        pairs: set[tuple[int, int]] = set()
        for k, item in enumerate(items):
            where = f"run.edges[{k}]"
            if not isinstance(item, list | tuple) or len(item) != 2:
                raise self.err(where, f"expected a pair [id, id], got {item!r}")
            a, b = (self.ident(v, where) for v in item)
            for end in (a, b):
                if end not in index:
                    raise self.err(where, f"'{end}' is not in run.members")
            if a == b:
                raise self.err(where, f"[{a}, {b}] is a self loop")
            i, j = index[a], index[b]
            pairs.add((min(i, j), max(i, j)))
        edges = tuple(sorted(pairs))
        if not graphs.is_connected(len(members), edges):
            raise self.err("run.edges", "the graph is not connected")
        return tuple((members[i], members[j]) for i, j in edges)

    def cross_check(
        self,
        node: NodeSection,
        neighbours: tuple[Neighbour, ...],
        run: RunConfig,
        daemon: DaemonSettings,
    ) -> None:
        ids = [n.id for n in neighbours]
        if len(ids) > run.nodes - 1:
            raise self.err("neighbours", f"{len(ids)} neighbours but run.nodes = {run.nodes}")
        if not daemon.members:
            return
        if node.id not in daemon.members:
            raise self.err("node.id", f"'{node.id}' is not in run.members")
        for k, nid in enumerate(ids):
            if nid not in daemon.members:
                raise self.err(f"neighbours[{k}].id", f"'{nid}' is not in run.members")
        if daemon.edges:
            adjacent = sorted(
                b if a == node.id else a for a, b in daemon.edges if node.id in (a, b)
            )
            if adjacent != sorted(ids):
                raise self.err(
                    "run.edges",
                    f"give {node.id} the neighbours [{', '.join(adjacent)}] but the neighbours"
                    f" section lists [{', '.join(sorted(ids))}]",
                )
