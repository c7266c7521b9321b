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
