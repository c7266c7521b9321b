"""The node's Prometheus exposition: per-neighbour fault counters and re-anchorings, read from
the latest status."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from dacflnode.node.status import NeighbourInfo, NodeMetrics, NodeStatus


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
