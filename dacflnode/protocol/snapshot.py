"""One reading of a node, :class:`NodeSnapshot`: what ``dacflnode status``, the Prometheus
exposition and ``dacflnode metrics`` show, taken at one moment.

:func:`snapshot_of` takes it from a :class:`~dacflnode.protocol.runner.NodeRunner` through the
runner's public attributes only (:class:`Observed` lists them, and mypy holds the runner to
them); before the runner exists (a daemon loading its data) the node has a snapshot too,
:meth:`NodeSnapshot.starting`, so a reader never has to ask whether there is a runner.

The totals a node reports over all its neighbours are computed here once: the payload bytes
moved (:func:`traffic_totals`) and the states refused as absurd or stale (:func:`refused_total`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

from dacflnode.protocol.phase import Phase
from dacflnode.records.membership import PeerState, PeerTrack
from dacflnode.transport.base import PeerStats

if TYPE_CHECKING:
    from dacflnode.protocol.copies import PublicCopies
    from dacflnode.protocol.setup import NodeSetup, RoundReport


def traffic_totals(stats: Iterable[PeerStats]) -> tuple[int, int]:
    """Payload bytes sent to and received from all neighbours, in that order."""
    sent = received = 0
    for s in stats:
        sent += s.bytes_sent
        received += s.bytes_received
    return sent, received


def refused_total(tracks: Iterable[PeerTrack]) -> int:
    """States refused as absurd or stale on all edges (by the node, or the node's by a
    neighbour)."""
    return sum(t.refused_states for t in tracks)


class _Stats(Protocol):
    @property
    def stats(self) -> Mapping[str, PeerStats]: ...


class _Async(Protocol):
    """What a snapshot reads of the asynchronous schedule (``schedule: async``)."""

    @property
    def per_edge(self) -> Mapping[str, int]: ...
    def ahead_of(self) -> list[str]: ...
    def edge_state(self, peer: str) -> str | None: ...


class Observed(Protocol):
    """What a snapshot reads of a runner: its public attributes, nothing else."""

    @property
    def phase(self) -> Phase | str: ...
    @property
    def round(self) -> int: ...
    @property
    def last(self) -> RoundReport | None: ...
    @property
    def last_accuracy(self) -> float: ...
    @property
    def last_loss(self) -> float: ...
    @property
    def started(self) -> float: ...
    @property
    def peers(self) -> Mapping[str, PeerTrack]: ...
    @property
    def anchors(self) -> Collection[int]: ...
    @property
    def reanchored(self) -> int: ...
    @property
    def quarantines(self) -> int: ...
    @property
    def alone_rounds(self) -> int: ...
    @property
    def leaving(self) -> bool: ...
    @property
    def stopping(self) -> bool: ...
    @property
    def transport(self) -> _Stats: ...
    @property
    def setup(self) -> NodeSetup: ...
    @property
    def copies(self) -> PublicCopies | None: ...
    @property
    def waited_s(self) -> float: ...
    @property
    def async_node(self) -> _Async | None: ...
    def residual(self) -> float: ...


@dataclass(frozen=True)
class PeerSnapshot:
    """One neighbour: the transport's counters and the node's track of it (the defaults: a
    neighbour not heard of yet)."""

    #: ``active``, ``absent``, ``gone``, ``left`` or ``quarantined``; empty: not known yet
    state: str = ""
    connected: bool = False
    last_round_received: int = -1
    bytes_received: int = 0
    bytes_sent: int = 0
    latency_ms: float = math.nan
    messages_received: int = 0
    messages_sent: int = 0
    missed: int = 0
    consecutive: int = 0
    late: int = 0
    corrections: int = 0
    refused_states: int = 0
    #: active, yet its last call failed, it was silent last round or the transport knows its
    #: end closed: it stopped, is restarting or is cut off (docs/faults.md)
    unreachable: bool = False
    #: schedule async: pairwise exchanges with it applied
    exchanges: int = 0


_NO_PEER = PeerSnapshot()


@dataclass(frozen=True)
class NodeSnapshot:
    """A node at one moment (NaN: not measured yet)."""

    node_id: str
    algorithm: str
    phase: str
    #: rounds completed (the round being worked on), and the rounds of the run
    round: int
    rounds: int
    #: the last round's report (``None`` before the first)
    last: RoundReport | None = None
    accuracy: float = math.nan
    loss: float = math.nan
    #: ``‖x − ω‖``
    residual: float = math.nan
    #: when the runner was made (``time.time()``; ``None``: not yet)
    started: float | None = None
    peers: Mapping[str, PeerSnapshot] = field(default_factory=lambda: MappingProxyType({}))
    #: rounds at which the node will re-anchor, in order
    anchors: tuple[int, ...] = ()
    reanchored: int = 0
    quarantines: int = 0
    alone_rounds: int = 0
    leaving: bool = False
    stopping: bool = False
    #: payload bytes moved with all neighbours since the start
    bytes_sent: int = 0
    bytes_received: int = 0
    #: states refused as absurd or stale, all edges
    refused_states: int = 0
    #: a compressed run's full copies pulled (``None``: an uncompressed run)
    copies_pulled: int | None = None
    #: the node's data: training and test samples, samples per class in the run's class
    #: order, undecodable files left out (0 and empty before the data is loaded)
    data_size: int = 0
    test_size: int = 0
    class_counts: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    skipped_files: int = 0
    #: ``sync`` or ``async``; seconds waited for the neighbours; under async the neighbours
    #: this node is too far ahead of to mix (``staleness``)
    schedule: str = "sync"
    waited_s: float = 0.0
    ahead_of: tuple[str, ...] = ()
    #: a table run's agreed feature scale, canonical JSON ("": none, or not agreed yet)
    feature_scale: str = ""

    @classmethod
    def starting(cls, node_id: str, algorithm: str, rounds: int, *, leaving: bool = False,
                 stopping: bool = False) -> NodeSnapshot:
        """A node whose runner does not exist yet: ``starting``, round 0, nothing measured;
        ``leaving``/``stopping``: a drain or a stop already asked for."""
        return cls(node_id, algorithm, Phase.STARTING.value, 0, rounds, leaving=leaving,
                   stopping=stopping)

    def peer(self, peer_id: str) -> PeerSnapshot:
        """``peer_id``'s reading (the defaults for a neighbour not heard of yet)."""
        return self.peers.get(peer_id, _NO_PEER)


def snapshot_of(runner: Observed, ready: Callable[[str], bool | None] | None = None
                ) -> NodeSnapshot:
    """``runner`` now. ``ready``: whether the transport's channel to a neighbour is connected
    (``False``: its end closed; ``None``: not known), where the transport can tell."""
    setup = runner.setup
    stats = runner.transport.stats
    tracks = runner.peers
    peers: dict[str, PeerSnapshot] = {}
    for j in (*setup.neighbours, *stats, *tracks):
        if j in peers:
            continue
        counted, track = stats.get(j), tracks.get(j)
        s, t = counted or PeerStats(), track or PeerTrack()
        state = "" if track is None else track.state.value
        if runner.async_node is not None:
            state = runner.async_node.edge_state(j) or state
        peers[j] = PeerSnapshot(
            state=state, connected=s.connected, last_round_received=s.last_round_received,
            bytes_received=s.bytes_received, bytes_sent=s.bytes_sent, latency_ms=s.latency_ms,
            messages_received=s.messages_received, messages_sent=s.messages_sent,
            missed=t.missed, consecutive=t.consecutive, late=t.late, corrections=t.corrections,
            refused_states=t.refused_states,
            exchanges=0 if runner.async_node is None else runner.async_node.per_edge.get(j, 0),
            unreachable=state == PeerState.ACTIVE and counted is not None and (
                not s.connected or t.consecutive > 0
                or (ready is not None and ready(j) is False)))
    sent, received = traffic_totals(stats.values())
    data = setup.data
    schedule = runner.async_node
    copies = runner.copies
    return NodeSnapshot(
        node_id=setup.node_id, algorithm=setup.algorithm.name, phase=str(runner.phase),
        round=runner.round, rounds=setup.rounds, last=runner.last,
        accuracy=runner.last_accuracy, loss=runner.last_loss, residual=runner.residual(),
        started=runner.started, peers=MappingProxyType(peers),
        anchors=tuple(sorted(runner.anchors)), reanchored=runner.reanchored,
        quarantines=runner.quarantines, alone_rounds=runner.alone_rounds,
        leaving=runner.leaving, stopping=runner.stopping, bytes_sent=sent,
        bytes_received=received, refused_states=refused_total(tracks.values()),
        copies_pulled=None if copies is None else copies.pulled,
        data_size=0 if data is None else data.size,
        test_size=0 if data is None else data.test_size,
        class_counts=MappingProxyType({} if data is None else dict(data.class_counts)),
        skipped_files=0 if data is None else data.skipped,
        schedule=setup.schedule, waited_s=runner.waited_s,
        ahead_of=() if schedule is None else tuple(schedule.ahead_of()),
        feature_scale=setup.run_info.get("feature_scale", ""),
    )
