"""The node's Prometheus exposition: per-neighbour fault counters and re-anchorings, read from
the latest status."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from dacflnode.daemon.prometheus import NeighbourInfo, NodeMetrics, NodeStatus


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_fault_counters_are_exposed_per_neighbour_as_counters():
    metrics = NodeMetrics("n0")
    metrics.update(NodeStatus(
        "n0", "dacfl", 5, 10, "training", reanchored=2, refusals={"round-passed": 3},
        neighbours=[NeighbourInfo("n1", "a:1", missed_rounds=4, late_states=3, refused=3,
                                  corrections=1, state="gone"),
                    NeighbourInfo("n2", "a:2")]))
    text = metrics.prometheus()
    got = samples(text)
    peer = (("node", "n0"), ("peer", "n1"))
    assert got[("dacfl_peer_missed_rounds_total", peer)] == 4
    assert got[("dacfl_peer_late_states_total", peer)] == 3
    assert got[("dacfl_peer_refused_total", peer)] == 3
    assert got[("dacfl_peer_corrections_total", peer)] == 1
    assert got[("dacfl_peer_missed_rounds_total", (("node", "n0"), ("peer", "n2")))] == 0
    assert got[("dacfl_reanchored_total", (("node", "n0"),))] == 2
    assert got[("dacfl_refusals_total", (("node", "n0"), ("reason", "round-passed")))] == 3
    assert "# TYPE dacfl_peer_missed_rounds_total counter" in text


def test_the_devices_data_is_exposed_by_split_and_class_and_survives_the_control_service():
    from dacflnode.transport.grpc_control import status_from_proto, status_to_proto

    status = NodeStatus("n0", "dacfl", 1, 10, "training", data_size=40, test_size=8,
                        class_counts={"cat": 30, "dog": 10, "eel": 0}, skipped_files=2)
    metrics = NodeMetrics("n0")
    metrics.update(status)
    got = samples(metrics.prometheus())
    assert got[("dacfl_data_samples", (("node", "n0"), ("split", "train")))] == 40
    assert got[("dacfl_data_samples", (("node", "n0"), ("split", "test")))] == 8
    assert got[("dacfl_data_class_samples", (("class", "eel"), ("node", "n0")))] == 0
    assert got[("dacfl_data_class_samples", (("class", "cat"), ("node", "n0")))] == 30
    assert got[("dacfl_data_skipped_files", (("node", "n0"),))] == 2
    back = status_from_proto(status_to_proto(status))
    assert (back.data_size, back.test_size, back.class_counts, back.skipped_files) == (
        40, 8, {"cat": 30, "dog": 10, "eel": 0}, 2)


def test_a_status_shows_the_devices_data_size_and_classes():
    from dacflnode.cli.daemon_cmds import _status_table

    status = NodeStatus("n0", "dacfl", 1, 10, "training", data_size=40, test_size=8,
                        class_counts={"cat": 30, "dog": 10}, skipped_files=2)
    caption = str(_status_table(status.to_json()).caption)
    assert "40 training samples, 8 test; per class: cat: 30, dog: 10" in caption
    assert "2 undecodable files skipped" in caption


def test_status_lists_the_classes_in_their_order_each_with_its_count():
    from dacflnode.cli.daemon_cmds import _status_table
    from dacflnode.transport.grpc_control import status_from_proto, status_to_proto

    counts = {"7": 1969, "2": 1962, "10": 5, "0": 3, "1": 1000}
    status = NodeStatus("n0", "dacfl", 1, 10, "training", data_size=4939, class_counts=counts)
    back = status_from_proto(status_to_proto(status))  # a map on the wire: no order kept
    caption = str(_status_table(back.to_json()).caption)
    assert "per class: 0: 3, 1: 1000, 2: 1962, 7: 1969, 10: 5\n" in caption + "\n"


def test_failed_tls_handshakes_survive_the_control_service_and_show_by_reason():
    from dacflnode.cli.daemon_cmds import _status_table
    from dacflnode.transport.grpc_control import status_from_proto, status_to_proto

    counts = {"plaintext": 3, "unknown-ca": 1, "bad-certificate": 0, "no-certificate": 2,
              "other": 0}
    status = NodeStatus("n0", "dacfl", 1, 10, "training", tls=True,
                        tls_handshake_failures=counts)
    back = status_from_proto(status_to_proto(status))
    assert back.tls_handshake_failures == counts
    assert back.to_json()["tls_handshake_failures"] == counts
    metrics = NodeMetrics("n0")
    metrics.update(back)
    got = samples(metrics.prometheus())
    for reason, count in counts.items():
        key = ("dacfl_tls_handshake_failures_total", (("node", "n0"), ("reason", reason)))
        assert got[key] == count
    caption = str(_status_table(back.to_json()).caption)
    assert "TLS handshakes failed: no-certificate 2, plaintext 3, unknown-ca 1" in caption


def test_a_node_without_failed_handshakes_shows_none():
    from dacflnode.cli.daemon_cmds import _status_table

    status = NodeStatus("n0", "dacfl", 1, 10, "training", tls=True,
                        tls_handshake_failures=dict.fromkeys(("plaintext", "other"), 0))
    assert "TLS handshakes" not in str(_status_table(status.to_json()).caption)


# ------------------------------------------------------------------------------ the snapshot
async def test_a_snapshot_reads_a_runner_and_totals_its_neighbours_counters():
    import asyncio

    from dacflnode.protocol.snapshot import snapshot_of
    from dacflnode.records.membership import PeerState
    from dacflnode.records.metrics_log import DataInfo
    from tests.harness.memory_network import FakeNetwork

    net = FakeNetwork([("a", "b"), ("b", "c")], rounds=2,
                      setup_extra={"data": DataInfo(40, 8, {"0": 30, "1": 10}, 1)})
    for node in net.ids:
        net.runner(node)
    before = snapshot_of(net.runners["b"])
    assert (before.phase, before.round, before.rounds, before.algorithm) == (
        "starting", 0, 2, "dacfl")
    assert before.last is None and before.bytes_sent == before.bytes_received == 0
    assert (before.data_size, before.test_size, dict(before.class_counts),
            before.skipped_files) == (40, 8, {"0": 30, "1": 10}, 1)
    assert await asyncio.wait_for(asyncio.gather(*await net.start()), 30) == [True] * 3
    b = net.runners["b"]
    b.peers["c"].refused_states = 2  # as a guard would have counted them
    snap = snapshot_of(b)
    stats = b.transport.stats
    assert (snap.phase, snap.round) == ("done", 2)
    assert snap.last is b.last and snap.last is not None and snap.last.round == 2
    assert snap.accuracy == b.last_accuracy and snap.residual == b.residual()
    assert snap.bytes_sent == stats["a"].bytes_sent + stats["c"].bytes_sent > 0
    assert snap.bytes_received == stats["a"].bytes_received + stats["c"].bytes_received > 0
    assert snap.refused_states == 2 and snap.copies_pulled is None
    assert list(snap.peers) == ["a", "c"]
    a = snap.peer("a")
    assert (a.state, a.connected, a.bytes_sent, a.messages_received) == (
        PeerState.ACTIVE, True, stats["a"].bytes_sent, stats["a"].messages_received)
    assert not a.unreachable
    assert snapshot_of(b, ready=lambda peer: peer != "a").peer("a").unreachable  # end closed
    assert snap.peer("nobody").state == "" and not snap.peer("nobody").unreachable


def test_the_starting_snapshot_is_a_node_with_nothing_measured():
    import math

    from dacflnode.protocol.snapshot import NodeSnapshot

    snap = NodeSnapshot.starting("n0", "dacfl", 10, leaving=True)
    assert (snap.phase, snap.round, snap.rounds, snap.leaving, snap.stopping) == (
        "starting", 0, 10, True, False)
    assert math.isnan(snap.accuracy) and math.isnan(snap.residual) and snap.last is None
    assert snap.peer("n1").last_round_received == -1 and not snap.peer("n1").connected


def test_the_agreed_feature_scale_survives_the_control_service_and_shows_in_status():
    from dacflnode.cli.daemon_cmds import _status_table
    from dacflnode.learning.feature_scale import FeatureScale
    from dacflnode.transport.grpc_control import status_from_proto, status_to_proto

    scale = FeatureScale("standardize", (0, 2), (90, 88), (1.5, -2.0), (0.5, 3.0),
                         (float("inf"),) * 2, (float("-inf"),) * 2)
    status = NodeStatus("n0", "dacfl", 1, 10, "training", feature_scale=scale.to_json())
    back = status_from_proto(status_to_proto(status))
    assert FeatureScale.from_json(back.feature_scale) == scale
    caption = str(_status_table(back.to_json()).caption)
    assert "feature scale: standardize over 2 features, agreed on 90 rows network-wide" in caption
