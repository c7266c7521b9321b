"""The node's Prometheus metrics; what ``dacflnode status`` shows is plain data kept with the
transport that serialises it (:mod:`dacflnode.transport.control_types`), re-exported here."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from dacflnode.transport.control_types import NeighbourInfo, NodeStatus

__all__ = ["NeighbourInfo", "NodeMetrics", "NodeStatus"]


class _RefusalCounter(Collector):
    """``dacfl_refusals_total{node, reason}``: the node's refusal counts, read when scraped.

    The counts live where the refusals happen (the transport's receiver, the Control service's
    token check); the status copies them, so the exposition is a counter whatever the node
    does between scrapes.
    """

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.counts: dict[str, int] = {}

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("dacfl_refusals", "Calls refused, by reason",
                                     labels=["node", "reason"])
        for reason, count in sorted(self.counts.items()):
            family.add_metric([self.node_id, reason], count)
        yield family


class NodeMetrics:
    """The node's Prometheus metrics (its own registry: several nodes may share a process)."""

    def __init__(self, node_id: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["node"]
        self.node_id = node_id
        self.round = Gauge("dacfl_round", "Rounds completed", labels, registry=self.registry)
        self.accuracy = Gauge("dacfl_test_accuracy", "Test accuracy of the node's model",
                              labels, registry=self.registry)
        self.test_loss = Gauge("dacfl_test_loss", "Test loss of the node's model", labels,
                               registry=self.registry)
        self.train_loss = Gauge("dacfl_train_loss", "Mean mini-batch loss of the last round",
                                labels, registry=self.registry)
        self.residual = Gauge("dacfl_consensus_residual", "||x_i - omega_i||", labels,
                              registry=self.registry)
        self.round_seconds = Histogram("dacfl_round_seconds", "Wall time of a round", labels,
                                       registry=self.registry,
                                       buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600))
        self.exchange_seconds = Gauge("dacfl_exchange_seconds",
                                      "Time spent exchanging state in the last round", labels,
                                      registry=self.registry)
        self.train_seconds = Gauge("dacfl_train_seconds", "Local training time, last round",
                                   labels, registry=self.registry)
        peer = ["node", "peer"]
        self.peer_bytes_received = Gauge("dacfl_peer_bytes_received", "Bytes received", peer,
                                         registry=self.registry)
        self.peer_bytes_sent = Gauge("dacfl_peer_bytes_sent", "Bytes sent", peer,
                                     registry=self.registry)
        self.peer_connected = Gauge("dacfl_peer_connected", "1 if the neighbour answered", peer,
                                    registry=self.registry)
        self.peer_last_round = Gauge("dacfl_peer_last_round", "Last round received", peer,
                                     registry=self.registry)
        self.refusals = _RefusalCounter(node_id)
        self.registry.register(self.refusals)

    def update(self, status: NodeStatus) -> None:
        n = self.node_id
        self.refusals.counts = dict(status.refusals)
        self.round.labels(n).set(status.round)
        self.accuracy.labels(n).set(status.last_accuracy)
        self.test_loss.labels(n).set(status.last_loss)
        self.residual.labels(n).set(status.consensus_residual)
        for nb in status.neighbours:
            self.peer_bytes_received.labels(n, nb.node_id).set(nb.bytes_received)
            self.peer_bytes_sent.labels(n, nb.node_id).set(nb.bytes_sent)
            self.peer_connected.labels(n, nb.node_id).set(1 if nb.connected else 0)
            self.peer_last_round.labels(n, nb.node_id).set(nb.last_round_received)

    def observe_round(self, seconds: float, exchange_s: float, train_s: float,
                      train_loss: float) -> None:
        n = self.node_id
        self.round_seconds.labels(n).observe(seconds)
        self.exchange_seconds.labels(n).set(exchange_s)
        self.train_seconds.labels(n).set(train_s)
        self.train_loss.labels(n).set(train_loss)

    def prometheus(self) -> str:
        return generate_latest(self.registry).decode()
