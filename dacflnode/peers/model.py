"""What a checked peers file says: this node (:class:`NodeSection`), its neighbours
(:class:`Neighbour`), the run's settings, and the graph they imply (:class:`PeersFile`).

:mod:`dacflnode.peers.file` reads and checks the file (its format is described there) and makes
these; nothing here reads a file.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dacflnode.algorithms import graphs
from dacflnode.config.daemon import DaemonSettings
from dacflnode.config.fingerprint import fingerprint_data, run_fingerprint
from dacflnode.config.run import RunConfig
from dacflnode.peers.run_graph import RunGraph
from dacflnode.security.tls import TlsFiles

__all__ = ["Neighbour", "NodeSection", "PeersFile"]


@dataclass(frozen=True)
class Neighbour:
    """A neighbour of the ``neighbours:`` section: its node id and peer address."""

    id: str
    address: str


@dataclass(frozen=True)
class NodeSection:
    """The ``node:`` section, checked: addresses normalised, paths absolute, defaults set."""

    id: str
    listen: str
    control: str
    state_dir: Path
    share: int
    #: mutual TLS with the neighbours (None: plaintext)
    tls: TlsFiles | None = None
    #: plaintext on a non-loopback ``listen`` was asked for explicitly
    insecure: bool = False
    #: the secret a control client must present; kept out of repr (and so out of logs)
    control_token: str | None = dataclasses.field(default=None, repr=False)
    #: ``host:port`` of the Prometheus endpoint (``/metrics`` over HTTP); None: not served
    metrics: str | None = None
    #: ``host:port`` of a plaintext gRPC port serving only ``grpc.health.v1`` (for probes that
    #: cannot present a client certificate, such as Kubernetes' native gRPC probes); None: none
    health: str | None = None
    #: the bearer token a scraper of ``node.metrics`` must present, when the peers file holds
    #: it; kept out of repr (and so out of logs)
    metrics_token: str | None = dataclasses.field(default=None, repr=False)
    #: a file holding that token instead (a Kubernetes Secret, say), read when the daemon
    #: starts (:func:`read_metrics_token`)
    metrics_token_file: Path | None = None


@dataclass(frozen=True)
class PeersFile:
    path: Path
    node: NodeSection
    neighbours: tuple[Neighbour, ...]
    run: RunConfig
    daemon: DaemonSettings

    def neighbour_ids(self) -> list[str]:
        """The neighbours' ids, in file order."""
        return [n.id for n in self.neighbours]

    def base_edges(self) -> graphs.Edges | None:
        """``run.edges`` as index pairs over ``run.members`` (None when no edges are given)."""
        if not self.daemon.edges:
            return None
        index = {m: i for i, m in enumerate(self.daemon.members)}
        return graphs.normalize_edges(
            len(self.daemon.members), ((index[a], index[b]) for a, b in self.daemon.edges)
        )

    def run_graph(self) -> RunGraph | None:
        """``run.members`` and ``run.edges`` as the run's graph (None when no edges are given)."""
        base = self.base_edges()
        if base is None:
            return None
        return RunGraph.of(self.daemon.members, base, self.run.time_varying, self.run.seed,
                           self.run.drop_prob)

    def active_neighbour_ids(self, t: int) -> list[str]:
        """The neighbours this node exchanges with in round ``t``, sorted.

        All of them for a static run; for ``run.time_varying = k > 0`` the ones the run's graph
        keeps in round ``t`` (:meth:`RunGraph.active_neighbours`, the simulator's rule too).
        """
        graph = self.run_graph()
        if self.run.time_varying <= 0 or graph is None:
            return sorted(self.neighbour_ids())
        return graph.active_neighbours(self.node.id, t)

    def run_fingerprint(self, contract: str | None = None) -> str:
        """SHA-256 (hex) of the settings every node of a run must share.

        Which settings those are is declared with each setting (its scope, and when it is
        relevant): see :mod:`dacflnode.config.fingerprint` and ``docs/configuration.md``.
        ``contract``: the data contract of own data (JSON), which replaces the data set's name.
        """
        return run_fingerprint(self.run, self.daemon, contract)

    def fingerprint_data(self, contract: str | None = None) -> dict[str, Any]:
        """What :meth:`run_fingerprint` hashes."""
        return fingerprint_data(self.run, self.daemon, contract)
