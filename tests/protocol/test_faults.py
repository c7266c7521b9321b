"""Fault plans: what each event drops, and how a bad plan file is reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from dacflnode.errors import ConfigError
from dacflnode.protocol.faults import (
    Crash,
    Cut,
    Drop,
    FaultPlan,
    Join,
    Leave,
    Poison,
    Stall,
    check_for_daemons,
    load_fault_plan,
    parse_fault_plan,
)

IDS = ["node-0", "node-1", "node-2", "node-3"]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "faults.yaml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str, **kw: object) -> ConfigError:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_fault_plan(path, **kw)  # type: ignore[arg-type]
    assert str(path) in info.value.message
    return info.value


def test_a_stalled_node_neither_sends_nor_receives_in_its_rounds_only():
    plan = FaultPlan([Stall("node-1", 3, 5)])
    for t in (3, 4, 5):
        assert plan.drops("node-1", "node-0", t) and plan.drops("node-2", "node-1", t)
        assert plan.down("node-1", t)
    for t in (2, 6):
        assert not plan.drops("node-1", "node-0", t) and not plan.drops("node-0", "node-1", t)
    assert not plan.drops("node-0", "node-2", 4)


def test_a_directed_drop_loses_one_direction_only():
    plan = FaultPlan([Drop("node-0", "node-1", 2, 2)])
    assert plan.drops("node-0", "node-1", 2)
    assert not plan.drops("node-1", "node-0", 2)
    assert not plan.drops("node-0", "node-1", 1) and not plan.drops("node-0", "node-1", 3)
    assert not plan.down("node-0", 2)


def test_a_cut_drops_both_directions_until_it_heals():
    plan = FaultPlan([Cut("node-1", "node-2", 4, 7), Cut("node-0", "node-3", 1)])
    assert [t for t in range(10) if plan.drops("node-2", "node-1", t)] == [4, 5, 6]
    assert [t for t in range(10) if plan.drops("node-1", "node-2", t)] == [4, 5, 6]
    assert all(plan.drops("node-3", "node-0", t) for t in range(1, 1000, 97))
    assert not plan.drops("node-1", "node-0", 5)


def test_a_crashed_node_is_down_until_it_restarts_and_a_gone_one_for_good():
    plan = FaultPlan([Crash("node-1", 3, 6), Crash("node-2", 5)])
    assert [t for t in range(9) if plan.down("node-1", t)] == [3, 4, 5]
    assert plan.drops("node-0", "node-1", 4) and plan.drops("node-1", "node-0", 4)
    assert plan.down("node-2", 5) and plan.down("node-2", 10_000) and not plan.down("node-2", 4)


def test_a_crash_restarted_at_once_drops_nothing():
    plan = FaultPlan([Crash("node-1", 3, 3)])
    assert not any(plan.down("node-1", t) for t in range(10))


def test_a_late_joiner_is_down_before_its_round_and_a_leaver_is_not_dropped():
    plan = FaultPlan([Join("node-3", 4), Leave("node-0", 2)])
    assert [t for t in range(8) if plan.down("node-3", t)] == [0, 1, 2, 3]
    assert not any(plan.drops("node-0", "node-1", t) for t in range(8))
    assert plan.join_round("node-3") == 4 and plan.join_round("node-0") is None
    assert plan.leave_round("node-0") == 2 and plan.leave_round("node-3") is None


def test_a_plan_file_reads_every_kind_of_event(tmp_path):
    path = write(tmp_path, """
faults:
  - {drop: node-2, rounds: [5, 7]}
  - {drop: [node-0, node-1], rounds: 3}
  - {cut: [node-1, node-2], round: 4, heal: 9}
  - {cut: [node-0, node-3], round: 2}
  - {crash: node-3, round: 6, restart: 10}
  - {crash: node-0, round: 8}
  - {leave: node-1, round: 12}
  - {join: node-2, round: 1}
""")
    plan = load_fault_plan(path, IDS, rounds=20)
    assert plan.events == (
        Stall("node-2", 5, 7), Drop("node-0", "node-1", 3, 3), Cut("node-1", "node-2", 4, 9),
        Cut("node-0", "node-3", 2, None), Crash("node-3", 6, 10), Crash("node-0", 8, None),
        Leave("node-1", 12), Join("node-2", 1),
    )
    assert plan.source == path and plan.crashes_of("node-3") == [Crash("node-3", 6, 10)]


def test_a_bare_list_and_an_empty_file_are_plans_too(tmp_path):
    plan = load_fault_plan(write(tmp_path, "- {drop: [a, b], rounds: [1, 2]}\n"))
    assert plan.events == (Drop("a", "b", 1, 2),)
    empty = load_fault_plan(write(tmp_path, ""))
    assert not empty and empty.drops("a", "b", 0) is False


@pytest.mark.parametrize(("text", "field", "words"), [
    ("- {drop: nod-1, rounds: [1, 2]}", "faults[0].drop", "did you mean 'node-1'"),
    ("- {drop: [node-0, node-7], rounds: 1}", "faults[0].drop[1]", "no node 'node-7'"),
    ("- {drop: node-1, rounds: [4, 2]}", "faults[0].rounds", "comes before the first"),
    ("- {drop: node-1, rounds: [1, 2, 3]}", "faults[0].rounds", "[first, last]"),
    ("- {drop: node-1}", "faults[0].rounds", "needs it"),
    ("- {drop: node-1, rounds: -1}", "faults[0].rounds", ">= 0"),
    ("- {drop: [node-1, node-1], rounds: 1}", "faults[0].drop", "twice"),
    ("- {cut: [node-1, node-2], round: 4, heal: 4}", "faults[0].heal", "after round 4"),
    ("- {cut: node-1, round: 4}", "faults[0].cut", "two node ids"),
    ("- {crash: node-1, round: 5, restart: 3}", "faults[0].restart", "not come before"),
    ("- {crash: node-1, round: 5, rounds: 3}", "faults[0].rounds", "unknown key"),
    ("- {crash: node-1, leave: node-2, round: 5}", "faults[0]", "exactly one"),
    ("- {stall: node-1, round: 5}", "faults[0]", "found none"),
    ("- {leave: node-1, round: true}", "faults[0].round", "round number"),
    ("- {join: node-1, round: 0}", "faults[0].round", "starts with the others"),
    ("- {join: node-1, round: 30}", "faults[0].round", "never comes"),
    ("- {poison: node-1, rounds: [3, 3]}", "faults[0].scale", "needs it"),
    ("- {poison: node-1, rounds: [3, 3], scale: 1}", "faults[0].scale", "other than 1"),
    ("- {poison: node-1, rounds: [3, 3], scale: .nan}", "faults[0].scale", "finite"),
    ("- {poison: node-1, rounds: [3, 3], scale: big}", "faults[0].scale", "number"),
    ("- {poison: node-1, rounds: [5, 3], scale: 5}", "faults[0].rounds", "before the first"),
    ("- {poison: node-1, rounds: 3, scale: 5, to: [node-9]}", "faults[0].to[0]", "no node"),
    ("- {poison: node-1, rounds: 3, scale: 5, to: [node-1]}", "faults[0].to", "itself"),
    ("- {poison: node-1, rounds: 3, scale: 5, round: 4}", "faults[0].round", "unknown key"),
    ("- [drop, node-1]", "faults[0]", "expected a mapping"),
    ("faults: {drop: node-1}", "faults", "list of events"),
    ("fault: []", "fault", "unknown key"),
    ("- {join: node-1, round: 2}\n- {join: node-1, round: 3}", "faults[1]", "joins twice"),
    ("- {join: node-1, round: 5}\n- {leave: node-1, round: 5}", "faults[1].round", "not after"),
    ("- {join: node-1, round: 5}\n- {crash: node-1, round: 3, restart: 6}", "faults[1].round",
     "before it runs"),
    ("- {crash: node-1, round: 2, restart: 6}\n- {crash: node-1, round: 4, restart: 8}",
     "faults[1].round", "before it runs"),
    ("- {crash: node-1, round: 2}\n- {crash: node-1, round: 4, restart: 8}", "faults[1]",
     "for good"),
    ("- {crash: node-1, round: 2}\n- {leave: node-1, round: 8}", "faults[0].restart",
     "cannot leave"),
    ("- {leave: node-1, round: 3}\n- {crash: node-1, round: 4, restart: 8}", "faults[1].round",
     "after it leaves"),
])
def test_a_bad_event_is_reported_with_its_file_and_dotted_key(tmp_path, text, field, words):
    err = error_of(tmp_path, text + "\n", ids=IDS, rounds=20)
    assert err.field == field
    assert words in err.message


def test_an_unreadable_or_malformed_file_is_a_faults_error(tmp_path):
    with pytest.raises(ConfigError) as missing:
        load_fault_plan(tmp_path / "nope.yaml")
    assert missing.value.field == "faults" and "cannot read" in missing.value.message
    err = error_of(tmp_path, "- {drop: [a, b\n")
    assert err.field == "faults" and "not valid YAML" in err.message


def test_a_plan_built_in_code_is_checked_the_same_way():
    with pytest.raises(ConfigError) as info:
        FaultPlan([Drop("node-0", "node-5", 1, 1)]).check(IDS)
    assert info.value.field == "faults[0].drop[1]"
    assert parse_fault_plan([{"cut": ["node-0", "node-1"], "round": 1}], ids=IDS).events == (
        Cut("node-0", "node-1", 1, None),)


def test_daemons_take_drops_and_cuts_and_refuse_node_events_with_a_hint(tmp_path):
    ok = FaultPlan([Stall("a", 1, 2), Drop("a", "b", 3, 3), Cut("a", "b", 4, 5)])
    assert check_for_daemons(ok) is ok
    path = write(tmp_path, "- {drop: a, rounds: 1}\n- {leave: b, round: 3}\n")
    with pytest.raises(ConfigError) as info:
        check_for_daemons(load_fault_plan(path))
    assert info.value.field == "faults[1].leave"
    assert "stop --drain" in info.value.message and str(path) in info.value.message


def test_a_poison_entry_scales_what_its_member_sends_in_its_rounds_to_its_targets():
    plan = parse_fault_plan([{"poison": "node-2", "rounds": [10, 12], "scale": 5.0},
                             {"poison": "node-1", "rounds": 4, "scale": -1, "to": ["node-0"]}],
                            ids=IDS, rounds=20)
    assert plan.events[1] == Poison("node-1", 4, 4, -1.0, ("node-0",))
    assert [plan.poison("node-2", "node-1", r) for r in (9, 10, 12, 13)] == [None, 5.0, 5.0,
                                                                              None]
    assert plan.poison("node-1", "node-0", 4) == -1.0
    assert plan.poison("node-1", "node-2", 4) is None  # not one of its targets
    assert plan.poison("node-1", "node-2", 5) is None and not plan.drops("node-2", "node-1", 10)
    assert check_for_daemons(plan) is plan  # daemons play it: it is what a member sends


RING4 = [("node-0", "node-1"), ("node-1", "node-2"), ("node-2", "node-3"), ("node-3", "node-0")]
RING5 = [(f"node-{i}", f"node-{(i + 1) % 5}") for i in range(5)]


@pytest.mark.parametrize(("entry", "field", "neighbours"), [
    ("{cut: [node-0, node-2], round: 3}", "faults[1].cut", "node-0's neighbours: node-1, node-3"),
    ("{drop: [node-3, node-1], rounds: 3}", "faults[1].drop",
     "node-3's neighbours: node-0, node-2"),
    ("{poison: node-0, rounds: 3, scale: -1, to: [node-1, node-2]}", "faults[1].to[1]",
     "node-0's neighbours: node-1, node-3"),
])
def test_an_edge_event_on_a_pair_that_is_no_edge_names_the_entry_and_the_neighbours(
        tmp_path, entry, field, neighbours):
    path = write(tmp_path, f"faults:\n  - {{drop: node-1, rounds: 2}}\n  - {entry}\n")
    with pytest.raises(ConfigError) as info:
        load_fault_plan(path, IDS, 10, RING4)
    message = str(info.value)
    assert info.value.field == field
    assert str(path) in message and "\n" not in message
    assert "is not an edge of this run's graph" in message and neighbours in message


def test_edge_events_on_edges_pass_in_either_direction_and_without_a_graph_anything_goes(
        tmp_path):
    text = ("faults:\n  - {cut: [node-0, node-3], round: 7, heal: 11}\n"
            "  - {drop: [node-1, node-0], rounds: 3}\n"
            "  - {poison: node-2, rounds: 1, scale: 5.0, to: [node-1, node-3]}\n")
    path = write(tmp_path, text)
    assert len(load_fault_plan(path, IDS, 12, RING4).events) == 3
    assert len(load_fault_plan(path, IDS, 12).events) == 3  # a matrix topology: no graph


def test_a_cut_that_is_an_edge_on_a_ring_of_4_is_refused_on_a_ring_of_5():
    plan = FaultPlan([Cut("node-0", "node-3", 7, 11)])
    assert plan.check(IDS, 12, RING4) is plan
    with pytest.raises(ConfigError, match=r"node-0 -- node-3 is not an edge .*node-1, node-4"):
        plan.check([f"node-{i}" for i in range(5)], 12, RING5)
