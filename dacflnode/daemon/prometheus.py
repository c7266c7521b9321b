"""The node's Prometheus metrics and the HTTP endpoint that serves them; what ``dacflnode
status`` shows is plain data kept with the transport that serialises it
(:mod:`dacflnode.transport.control_types`), re-exported here.

One exposition, two ways to fetch it: ``GET http://<node.metrics>/metrics`` (what Prometheus
scrapes, :class:`~dacflnode.daemon.metrics_http.MetricsServer`, served from the node's event loop
with a connection cap and deadlines) and the Control service's ``dacflnode metrics --format
prometheus``. Both render the same :class:`NodeMetrics` registry after refreshing it from the
node's status, so they never disagree on a name, a type or a label.

The series (every one carries ``node``; the per-neighbour ones ``peer`` too) follow the
Prometheus conventions: base units in the name (``_seconds``, ``_bytes``, ``_ratio``), counters
end in ``_total``, durations are histograms. docs/operations.md lists them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dacflnode.daemon.metrics_http import METRICS_PATH, MetricsServer
from dacflnode.protocol.phase import Phase
from dacflnode.transport.control_types import NeighbourInfo, NodeStatus

__all__ = ["METRICS_PATH", "MetricsServer", "NeighbourInfo", "NodeMetrics", "NodeStatus"]


#: Per-neighbour counters: metric name (without ``_total``), help, :class:`NeighbourInfo` field.
PEER_COUNTERS = (
    ("dacfl_peer_received_bytes", "State bytes received from the neighbour (pushed or pulled)",
     "bytes_received"),
    ("dacfl_peer_sent_bytes", "State bytes sent to the neighbour", "bytes_sent"),
    ("dacfl_peer_received_messages",
     "Round states accepted from the neighbour (pushed or pulled)", "messages_received"),
    ("dacfl_peer_sent_messages", "Round states the neighbour accepted from this node",
     "messages_sent"),
    ("dacfl_peer_missed_rounds", "Rounds whose deadline passed without the neighbour's state",
     "missed_rounds"),
    ("dacfl_peer_late_states", "States of the neighbour refused because their round had passed",
     "late_states"),
    ("dacfl_peer_refused", "Calls of the neighbour refused, any reason", "refused"),
    ("dacfl_peer_corrections", "One-sided uses of the edge undone", "corrections"),
    ("dacfl_peer_refused_states", "States of the edge refused as absurd or stale (either end)",
     "refused_states"),
    ("dacfl_peer_exchanges", "Pairwise exchanges with the neighbour applied (schedule async)",
     "exchanges"),
)

#: Bucket bounds (seconds) of the duration histograms: a round of a small model on one core
#: takes well under a second, one of a real model on an edge device minutes.
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                    300.0, 600.0)


class _StatusCollector(Collector):
    """Every series read from the node's latest :class:`NodeStatus`, when scraped.

    The counts live where things happen (the transports' peer stats, the receiver, the Control
    service's token check, the runner's peer tracks); the status copies them, so the exposition
    is a counter whatever the node does between scrapes. A value not measured yet (NaN, e.g.
    the accuracy before the first evaluation) is left out rather than exposed as NaN.
    """

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.status: NodeStatus | None = None
        #: the mean mini-batch loss of the last round (the status does not carry it)
        self.train_loss = math.nan

    def collect(self) -> Iterator[Metric]:
        status = self.status  # one snapshot: the loop may replace it while this runs
        n = self.node_id
        yield from self._node_gauges(status)
        phase = GaugeMetricFamily("dacfl_phase", "1 for the phase the node is in, else 0",
                                  labels=["node", "phase"])
        current = status.phase if status is not None else Phase.STARTING.value
        phases = [p.value for p in Phase]
        for p in (*phases, *([current] if current not in phases else [])):
            phase.add_metric([n, p], 1.0 if p == current else 0.0)
        yield phase
        info = GaugeMetricFamily("dacfl_node_info", "The node's algorithm and device (always 1)",
                                 labels=["node", "algorithm", "device", "tls"])
        if status is not None:
            info.add_metric([n, status.algorithm, status.device, str(status.tls).lower()], 1.0)
        yield info
        refusals = CounterMetricFamily("dacfl_refusals", "Calls refused, by reason",
                                       labels=["node", "reason"])
        for reason, count in sorted((status.refusals if status else {}).items()):
            refusals.add_metric([n, reason], count)
        yield refusals
        handshakes = CounterMetricFamily(
            "dacfl_tls_handshake_failures", "TLS handshakes that failed, by reason (plaintext, "
            "unknown-ca, bad-certificate, no-certificate, other)", labels=["node", "reason"])
        for reason, count in sorted((status.tls_handshake_failures if status else {}).items()):
            handshakes.add_metric([n, reason], count)
        if handshakes.samples:  # a node without TLS (or not counting) has none
            yield handshakes
        neighbours = status.neighbours if status is not None else []
        for name, help_text, attr in PEER_COUNTERS:
            counter = CounterMetricFamily(name, help_text, labels=["node", "peer"])
            for nb in neighbours:
                counter.add_metric([n, nb.node_id], getattr(nb, attr))
            yield counter
        yield from self._peer_gauges(neighbours)
        reanchored = CounterMetricFamily("dacfl_reanchored", "Re-anchorings of the estimate",
                                         labels=["node"])
        reanchored.add_metric([n], status.reanchored if status else 0)
        yield reanchored
        alone = CounterMetricFamily("dacfl_rounds_alone",
                                    "Rounds mixed with no neighbour although the topology had "
                                    "some", labels=["node"])
        alone.add_metric([n], status.alone_rounds if status else 0)
        yield alone
        quarantined = CounterMetricFamily(
            "dacfl_peer_quarantines", "Quarantines of the edge to the neighbour (at most 1: a "
            "quarantined edge is not mixed again in the run)", labels=["node", "peer"])
        for nb in neighbours:
            quarantined.add_metric([n, nb.node_id], 1 if nb.state == "quarantined" else 0)
        yield quarantined
        yield from self._data_gauges(status)

    def _data_gauges(self, status: NodeStatus | None) -> Iterator[Metric]:
        """The device's data: its size, the samples per class, the files it skipped."""
        n = self.node_id
        size, per_class, skipped = _gauges(
            ("dacfl_data_samples", "Samples on this device, by split", "split"),
            ("dacfl_data_class_samples", "Training samples on this device per class", "class"),
            ("dacfl_data_skipped_files", "Undecodable data files left out (bad_files: skip)",
             None))
        if status is not None and status.data_size:
            size.add_metric([n, "train"], status.data_size)
            size.add_metric([n, "test"], status.test_size)
            for name, count in status.class_counts.items():
                per_class.add_metric([n, name], count)
            skipped.add_metric([n], status.skipped_files)
        yield from (size, per_class, skipped)

    def _node_gauges(self, status: NodeStatus | None) -> Iterator[Metric]:
        values: tuple[tuple[str, str, float], ...] = (
            ("dacfl_round", "Rounds completed", status.round if status else 0),
            ("dacfl_rounds_planned", "Rounds the run has (run.rounds)",
             status.rounds_total if status else math.nan),
            ("dacfl_test_accuracy_ratio", "Test accuracy of the node's model, 0 to 1",
             status.last_accuracy if status else math.nan),
            ("dacfl_test_loss", "Test loss of the node's model",
             status.last_loss if status else math.nan),
            ("dacfl_train_loss", "Mean mini-batch loss of the last round",
             self.train_loss),
            ("dacfl_consensus_residual", "||x_i - omega_i||: the node's distance to consensus",
             status.consensus_residual if status else math.nan),
            ("dacfl_waited_seconds", "Seconds waited for the neighbours (sync: the rounds' "
             "exchanges; async: the end)", status.waited_s if status else math.nan),
        )
        for name, help_text, value in values:
            family = GaugeMetricFamily(name, help_text, labels=["node"])
            if not math.isnan(value):
                family.add_metric([self.node_id], value)
            yield family

    def _peer_gauges(self, neighbours: Iterable[NeighbourInfo]) -> Iterator[Metric]:
        n = self.node_id
        connected, last_round, latency = _gauges(
            ("dacfl_peer_connected", "1 if the neighbour answered", "peer"),
            ("dacfl_peer_last_round", "Last round received from the neighbour (-1: none)",
             "peer"),
            ("dacfl_peer_push_latency_seconds", "Duration of the last push to the neighbour",
             "peer"))
        for nb in neighbours:
            connected.add_metric([n, nb.node_id], 1.0 if nb.connected else 0.0)
            last_round.add_metric([n, nb.node_id], nb.last_round_received)
            if not math.isnan(nb.latency_ms):
                latency.add_metric([n, nb.node_id], nb.latency_ms / 1000.0)
        yield from (connected, last_round, latency)


def _gauges(*specs: tuple[str, str, str | None]) -> list[GaugeMetricFamily]:
    """Empty gauges from ``(name, help, label)``: each labelled ``node``, and ``label`` when it
    is not ``None``."""
    return [GaugeMetricFamily(name, help_text,
                              labels=["node"] if label is None else ["node", label])
            for name, help_text, label in specs]


class NodeMetrics:
    """The node's Prometheus metrics, in a registry of its own (several nodes may share a
    process; the global registry is left alone), with the process and Python collectors."""

    def __init__(self, node_id: str, *, process: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.node_id = node_id
        self.status = _StatusCollector(node_id)
        self.registry.register(self.status)
        labels = ["node"]
        self.round_seconds = Histogram(
            "dacfl_round_seconds", "Wall time of a round: exchange, training, evaluation",
            labels, registry=self.registry, buckets=DURATION_BUCKETS)
        self.exchange_seconds = Histogram(
            "dacfl_exchange_seconds", "Time a round spent exchanging states with the neighbours",
            labels, registry=self.registry, buckets=DURATION_BUCKETS)
        self.train_seconds = Histogram(
            "dacfl_train_seconds", "Time a round spent in local training", labels,
            registry=self.registry, buckets=DURATION_BUCKETS)
        for histogram in (self.round_seconds, self.exchange_seconds, self.train_seconds):
            histogram.labels(node_id)  # exposed (empty) from the start, not from the first round
        if process:
            ProcessCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)
            GCCollector(registry=self.registry)

    def update(self, status: NodeStatus) -> None:
        """Take ``status`` as what the next scrape shows."""
        self.status.status = status

    def observe_round(self, seconds: float, exchange_s: float, train_s: float,
                      train_loss: float) -> None:
        """Record one finished round's durations and training loss."""
        n = self.node_id
        self.round_seconds.labels(n).observe(seconds)
        self.exchange_seconds.labels(n).observe(exchange_s)
        self.train_seconds.labels(n).observe(train_s)
        self.status.train_loss = train_loss

    def prometheus(self) -> str:
        """The text exposition (format 0.0.4), as the Control service returns it."""
        return generate_latest(self.registry).decode()
