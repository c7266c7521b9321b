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
    assert "40 training samples, 8 test; per class: cat 30, dog 10" in caption
    assert "2 undecodable files skipped" in caption


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
