"""What the Control service carries (``dacflnode status`` and ``dacflnode metrics``), as plain
data: no grpc, no node internals.

These classes live with the transport, which serialises them, so that the transport never has to
import the node; the node fills them in.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class NeighbourInfo:
    """One neighbour as ``dacflnode status`` shows it."""

    node_id: str
    address: str
    connected: bool = False
    last_round_received: int = -1
    bytes_received: int = 0
    bytes_sent: int = 0
    latency_ms: float = math.nan
    #: ``active``, ``absent`` (not up at start, or not joined yet), ``gone`` (declared after
    #: ``run.gone_after`` missed rounds), ``left`` (it drained out) or ``quarantined`` (its
    #: states were refused as absurd or stale repeatedly); empty: not known yet.
    state: str = ""
    #: Rounds whose deadline passed without its state.
    missed_rounds: int = 0
    #: Its states that arrived after this node had left their round (refused as passed).
    late_states: int = 0
    #: Its calls this node refused, for any reason.
    refused: int = 0
    #: One-sided uses of the edge by this node that were undone (docs/faults.md).
    corrections: int = 0
    #: States of the edge refused as absurd or stale, by this node or this node's by it.
    refused_states: int = 0
    #: Round states accepted from it (pushed or pulled), and pushes of this node it accepted.
    messages_received: int = 0
    messages_sent: int = 0
    #: schedule async: the pairwise exchanges with it applied (asked or answered).
    exchanges: int = 0


@dataclass
class NodeStatus:
    """A node's state as ``dacflnode status`` shows it (NaN: not measured yet)."""

    node_id: str
    algorithm: str
    round: int
    rounds_total: int
    phase: str
    neighbours: list[NeighbourInfo] = field(default_factory=list)
    last_accuracy: float = math.nan
    last_loss: float = math.nan
    consensus_residual: float = math.nan
    device: str = ""
    uptime_s: float = 0.0
    listen_address: str = ""
    #: Whether neighbours are authenticated by mutual TLS (``node.tls``); False: anyone who
    #: reaches the listen address can speak for any neighbour.
    tls: bool = False
    #: Calls refused since the node started, by reason (the wire's reason names, e.g.
    #: ``non-finite`` or ``absurd-state``; ``control-token`` for Control calls without their
    #: token).
    refusals: dict[str, int] = field(default_factory=dict)
    #: Rounds at the start of which the node will re-anchor its estimate (docs/faults.md).
    anchors: list[int] = field(default_factory=list)
    #: Re-anchorings done since the node started.
    reanchored: int = 0
    #: Whether the node was asked to leave the network (``dacflnode stop --drain``).
    leaving: bool = False
    #: Training samples on this device, and those it evaluates on.
    data_size: int = 0
    test_size: int = 0
    #: Training samples per class, by class name.
    class_counts: dict[str, int] = field(default_factory=dict)
    #: Files of its data folder that could not be decoded and were left out (bad_files: skip).
    skipped_files: int = 0
    #: Rounds since the node started in which it mixed no neighbour although the topology had
    #: some (0 for a healthy node, also next to a stalled one: docs/faults.md).
    alone_rounds: int = 0
    #: Failed TLS handshakes on this node's connections since it started, by reason
    #: (``plaintext``, ``unknown-ca``, ``bad-certificate``, ``no-certificate``, ``other``;
    #: empty without TLS or when they cannot be seen: docs/security.md "Failed handshakes").
    tls_handshake_failures: dict[str, int] = field(default_factory=dict)
    #: Edges this node quarantined since it started, and the states it refused (or had refused)
    #: as absurd or stale, all edges together (docs/faults.md, docs/security.md).
    quarantines: int = 0
    refused_states: int = 0
    #: ``sync`` or ``async`` (docs/algorithm.md); under async ``round`` counts training blocks.
    schedule: str = "sync"
    #: Seconds the node waited for its neighbours: sync, the rounds' exchanges; async, the
    #: end (its blocks done, its neighbours not yet).
    waited_s: float = 0.0
    #: schedule async: the neighbours whose exchanges were refused for staleness while this
    #: node was ahead of them by more than ``staleness`` blocks.
    ahead_of: list[str] = field(default_factory=list)
    #: a table run's agreed feature scale (canonical JSON, docs/data.md); "": none
    feature_scale: str = ""

    def to_json(self) -> dict[str, Any]:
        """The status as JSON-ready data, NaN written as ``None`` (JSON has no NaN)."""

        def clean(v: Any) -> Any:
            if isinstance(v, float) and math.isnan(v):
                return None
            if isinstance(v, list):
                return [clean(x) for x in v]
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            return v

        return dict(clean(asdict(self)))


@dataclass(frozen=True)
class ControlAuth:
    """How a client reaches a Control service that is not plain loopback.

    ``token``: sent as ``authorization: Bearer <token>`` on every call (``node.control_token``).
    ``ca``: PEM of the CA that signed the node's certificate; given, the call goes over TLS and
    the server's certificate must carry ``server_name`` (the node id; None: the host of the
    address). The client presents no certificate: the token is its credential.
    """

    token: str | None = None
    ca: bytes | None = None
    server_name: str | None = None

    def __repr__(self) -> str:  # never print a token
        return (f"ControlAuth(token={'<hidden>' if self.token else None}, "
                f"ca={'...' if self.ca else None}, server_name={self.server_name!r})")
