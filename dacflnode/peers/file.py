"""The daemon's ``peers.yaml``: who this node is, who its neighbours are, and the run it joins.

.. code-block:: yaml

    node:
      id: node-0                     # required
      listen: 0.0.0.0:7000           # required: the peer (Neighbor service) address
      control: 127.0.0.1:8000        # default: 127.0.0.1:<listen port + 1000>
      metrics: 127.0.0.1:9000        # Prometheus /metrics over HTTP; default: not served
      health: 0.0.0.0:7100           # plaintext grpc.health.v1 only (probes); default: none
      state_dir: ./node-0            # default: <folder of this file>/<node id>
      share: 0                       # data partition index; default: index of node.id in members
      data_root: /data/train         # this device's own data (or under run:; see docs/data.md)
      test_root: /data/test          # its test data; default: run.holdout of data_root
      bad_files: fail                # or skip: undecodable images are counted and left out
      tls:                           # mutual TLS with the neighbours (see: dacflnode certs)
        {ca: certs/ca.crt, cert: certs/node-0.crt, key: certs/node-0.key}
      insecure: false                # true: allow plaintext on a non-loopback node.listen
      control_token: ...             # required with a non-loopback node.control; default: a
                                     # new token in STATE_DIR/control.token at every start
      metrics_token: ...             # required with a non-loopback node.metrics (or:)
      metrics_token_file: token.txt  # a file holding it (not readable by others)
    neighbours:                      # required, non-empty
      - {id: node-1, address: 127.0.0.1:7001}
    run:                             # optional: every RunConfig and DaemonSettings key
      algorithm: dacfl               # one of dacfl, cdsgd
      round_deadline: 600            # seconds to wait for the neighbours' state each round
      members: [node-0, node-1]      # every node id in partition order
      edges: [[node-0, node-1]]      # the whole graph

Every ``run:`` key, its default and whether it must match across the run, and every ``node:``
key (:class:`~dacflnode.config.node.NodeSettings`), are listed in ``docs/configuration.md``.
Relative paths (``node.state_dir``, ``run.data_root``, ``run.edge_list``,
``run.mixing_matrix``) are relative to the folder of the peers file. Keys may be spelled in
``kebab-case`` too.

Every problem is a :class:`~dacflnode.errors.ConfigError` whose ``field`` is the dotted key
(``node.listen``, ``neighbours[1].address``, ``run.algorithm``, ...) and whose message names the
file.

When ``run.members`` and ``run.edges`` are given, the graph is the edges, indexed by the order of
the members: node ``members[i]`` is node ``i`` of the simulator, so a time-varying run
(``run.time_varying > 0``) drops the same edges in the same rounds as ``dacflnode simulate`` does
(:class:`~dacflnode.peers.run_graph.RunGraph`). ``run.topology`` and its parameters then
only record how the edges were drawn.

Exposure is checked at load (``docs/security.md``): a ``node.listen`` reachable from other hosts
(anything but 127.0.0.0/8, ``::1`` and ``localhost``; ``0.0.0.0`` and ``::`` included) needs
``node.tls`` or an explicit ``node.insecure: true``, and a ``node.control`` reachable from other
hosts needs both ``node.tls`` and a ``node.control_token``. ``node.metrics`` has no default
(``dacflnode topology`` writes ``127.0.0.1:<listen port + 2000>``); on loopback it serves the
metrics to anyone on the host, and an address other hosts reach needs ``node.metrics_token``
(or ``node.metrics_token_file``, a file holding it that other users cannot read): every request
must then carry ``Authorization: Bearer <token>``, over HTTPS when ``node.tls`` is set.

This module reads the file; :mod:`dacflnode.peers.parser` checks it, into the
:class:`~dacflnode.peers.model.PeersFile` of :mod:`dacflnode.peers.model`. Addresses are parsed
in :mod:`dacflnode.peers.addresses`, tokens in :mod:`dacflnode.peers.tokens`, the algorithm
policy lives in :mod:`dacflnode.peers.algorithms`, and :mod:`dacflnode.peers.yaml_form` writes
the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dacflnode.config.daemon import DaemonSettings
from dacflnode.config.reader import read_yaml
from dacflnode.peers.model import Neighbour, NodeSection, PeersFile
from dacflnode.peers.parser import PeersParser
from dacflnode.peers.tokens import read_metrics_token

__all__ = [
    "DaemonSettings",
    "Neighbour",
    "NodeSection",
    "PeersFile",
    "load_peers",
    "parse_peers",
    "read_metrics_token",
]


def load_peers(path: str | Path) -> PeersFile:
    """Read and check a peers file (see the module docstring)."""
    file, data = read_yaml(path, "peers")
    return parse_peers(data, file)


def parse_peers(data: Any, path: str | Path, *, check_run: bool = True) -> PeersFile:
    """Check the parsed YAML ``data`` of the peers file at ``path`` (which need not exist).

    ``check_run=False`` skips :meth:`RunConfig.validate` (the caller has run it already).
    """
    return PeersParser(Path(path).expanduser().absolute()).parse(data, check_run)
