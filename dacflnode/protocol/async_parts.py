"""The small parts of the asynchronous schedule (:mod:`dacflnode.protocol.async_schedule`):
what it reads of its node, and its records of asked exchanges and of a block's exchanges."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from dacflnode.algorithms.rounds import NodeState
from dacflnode.protocol.fault_filter import FaultFilter
from dacflnode.protocol.outputs import Outputs
from dacflnode.protocol.phase import Phase
from dacflnode.protocol.setup import NodeSetup, RoundReport
from dacflnode.records.checkpoint import Checkpoint
from dacflnode.records.membership import PeerTrack
from dacflnode.transport.base import Transport
from dacflnode.wire.message import RoundMessage


class Host(Protocol):
    """What the schedule reads and changes of its node (the
    :class:`~dacflnode.protocol.runner.NodeRunner`)."""

    setup: NodeSetup
    state: NodeState
    phase: Phase
    transport: Transport
    outputs: Outputs
    last: RoundReport | None
    last_accuracy: float
    last_loss: float
    alone_rounds: int
    on_round: Callable[[RoundReport], None] | None
    faults: FaultFilter

    @property
    def round(self) -> int: ...
    @property
    def leaving(self) -> bool: ...
    @property
    def peers(self) -> dict[str, PeerTrack]: ...
    def residual(self) -> float: ...
    def checkpoint(self, left: bool = False) -> Checkpoint: ...


class Kept(Exception):
    """An exchange (or handover) answered already, found by a retry that waited for the first
    try's step: its kept answer, applied once; the step is not journaled."""

    def __init__(self, reply: RoundMessage) -> None:
        super().__init__(reply.exchange_id)
        self.reply = reply


@dataclass
class Asked:
    """An exchange this node asked for and has not seen answered."""

    id: int
    request: RoundMessage
    #: how many times the neighbour had reconciled with this node when it was asked
    reconciled: int = 0


@dataclass
class BlockCounts:
    """What the node's exchanges did since its last metrics line."""

    exchanges: int = 0
    staleness: int = 0
    peers: set[str] = field(default_factory=set)

    def add(self, peer: str, gap: int) -> None:
        self.exchanges += 1
        self.staleness = max(self.staleness, gap)
        self.peers.add(peer)
