"""The network-wide invariant from checkpoints: raw and resolved residuals, pending corrections
decided across snapshots, reports of what could not be decided."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from dacflnode.algorithms.rounds import NodeState
from dacflnode.records.checkpoint import save_checkpoint
from dacflnode.records.invariant import (
    Snapshot,
    compute_invariant,
    node_folders,
    read_snapshots,
    relative_residual,
)

N = 6


def vec(seed: int) -> torch.Tensor:
    return torch.randn(N, generator=torch.Generator().manual_seed(seed))


def one_sided(used_by_b: frozenset[str] | None, with_b: bool = True) -> list[Snapshot]:
    """Nodes a and b of round 5 whose x summed to their tracked sum before round 4, when a
    mixed b's state with weight 1/3 and keeps the correction pending; b's log says
    ``used_by_b`` for round 4 (None: b's log has no entry for it)."""
    ta, tb = vec(1), vec(2)
    c = (tb - ta) / 3
    a = Snapshot("a", 5, ta + c, ta, pending={(4, "b"): c}, used_log={4: frozenset({"b"})})
    log = {} if used_by_b is None else {4: used_by_b}
    b = Snapshot("b", 5, tb.clone(), tb, used_log=log)
    return [a, b] if with_b else [a]


def test_a_network_that_keeps_its_sum_has_zero_residual():
    ta, tb, tc = vec(1), vec(2), vec(3)
    d = vec(4)  # mixing moved mass between a and b, the sum is unchanged
    report = compute_invariant([Snapshot("a", 3, ta + d, ta), Snapshot("b", 3, tb - d, tb),
                                Snapshot("c", 3, tc.clone(), tc)])
    assert report.raw_residual == pytest.approx(0.0, abs=1e-7)  # float32 inputs
    assert report.resolved_residual == report.raw_residual
    assert report.unresolved == () and report.warnings == ()
    assert report.rounds == {"a": 3, "b": 3, "c": 3} and not report.rounds_differ
    deviations = {n.node: n.deviation for n in report.nodes}
    assert deviations["a"] == pytest.approx(float(d.norm()), rel=1e-6)
    assert deviations["c"] == 0.0


def test_a_one_sided_use_the_peer_did_not_return_is_subtracted():
    report = compute_invariant(one_sided(used_by_b=frozenset()))
    assert report.raw_residual > 1e-2
    assert report.resolved_residual == pytest.approx(0.0, abs=1e-7)
    a = report.nodes[0]
    assert (a.node, a.pending, a.applied, a.dropped, a.unresolved) == ("a", 1, 1, 0, 0)
    assert report.unresolved == ()


def test_a_correction_is_dropped_when_the_peer_did_use_the_node():
    snaps = one_sided(used_by_b=frozenset({"a"}))
    report = compute_invariant(snaps)
    assert report.nodes[0].dropped == 1 and report.nodes[0].applied == 0
    assert report.resolved_residual == report.raw_residual > 1e-2


def test_a_correction_the_snapshots_cannot_decide_is_reported_and_not_subtracted():
    no_entry = compute_invariant(one_sided(used_by_b=None))
    assert no_entry.resolved_residual == no_entry.raw_residual > 1e-2
    assert len(no_entry.unresolved) == 1
    u = no_entry.unresolved[0]
    assert (u.node, u.round, u.peer) == ("a", 4, "b") and "no entry for round 4" in u.why
    assert any("could not be resolved" in w for w in no_entry.warnings)

    peer_missing = compute_invariant(one_sided(used_by_b=frozenset(), with_b=False))
    assert peer_missing.nodes[0].unresolved == 1
    assert "b is not among the snapshots" in peer_missing.unresolved[0].why


def test_snapshots_of_different_rounds_are_flagged_as_an_estimate():
    t = vec(1)
    report = compute_invariant([Snapshot("a", 3, t, t), Snapshot("b", 4, t, t)])
    assert report.rounds_differ
    assert any("different rounds (3 to 4)" in w for w in report.warnings)
    assert report.to_json()["rounds_differ"] is True


def test_checkpoints_of_different_runs_are_flagged():
    t = vec(1)
    report = compute_invariant([Snapshot("a", 3, t, t, run="r1"), Snapshot("b", 3, t, t,
                                                                            run="r2")])
    assert any("different runs" in w for w in report.warnings)


def test_nothing_or_mismatched_snapshots_are_refused():
    t = vec(1)
    with pytest.raises(ValueError, match="no snapshots"):
        compute_invariant([])
    with pytest.raises(ValueError, match="two snapshots of one node"):
        compute_invariant([Snapshot("a", 1, t, t), Snapshot("a", 1, t, t)])
    with pytest.raises(ValueError, match="differ in size"):
        compute_invariant([Snapshot("a", 1, t, t), Snapshot("b", 1, t[:3], t[:3])])
    with pytest.raises(ValueError, match="pending correction"):
        compute_invariant([Snapshot("a", 1, t, t, pending={(0, "b"): t[:2]})])


def test_the_residual_is_relative_to_the_tracked_sum():
    assert relative_residual(torch.tensor([3.0, 4.0]), torch.tensor([0.0, 0.0])) == math.inf
    assert relative_residual(torch.zeros(2), torch.zeros(2)) == 0.0
    assert relative_residual(torch.tensor([1.0, 1.0]), torch.tensor([2.0, 0.0])) == \
        pytest.approx(math.sqrt(2) / 2)


def test_the_json_report_carries_every_figure():
    data = compute_invariant(one_sided(used_by_b=None)).to_json()
    assert data["nodes"] == ["a", "b"] and data["unresolved"] == 1
    assert data["per_node"]["a"]["pending"] == 1 and data["per_node"]["a"]["tracked"] == \
        "omega_prev"
    assert data["unresolved_corrections"][0]["peer"] == "b"
    assert data["raw_residual"] == data["resolved_residual"] > 0


# ---------------------------------------------------------------- from checkpoint files


def write(state_dir: Path, node: str, round_: int, x: torch.Tensor, tracked: torch.Tensor, *,
          used_log: tuple[tuple[int, tuple[str, ...]], ...] = (),
          pending: dict[str, torch.Tensor] | None = None, left: bool = False,
          run: str = "run-1") -> Path:
    state_dir.mkdir(parents=True, exist_ok=True)
    state = NodeState(round_, x, tracked.clone(), tracked)
    return save_checkpoint(state_dir, state, {"bn.count": torch.tensor([3])},
                           {"node": node, "run_fingerprint": run}, used_log=used_log,
                           pending=pending, tracked="omega_prev", left=left)


def test_checkpoint_files_give_the_same_figures_as_their_snapshots(tmp_path):
    snaps = one_sided(used_by_b=frozenset())
    a, b = snaps
    write(tmp_path / "a", "a", 5, a.x, a.tracked, used_log=((4, ("b",)),),
          pending={"pending.4.b": a.pending[(4, "b")]})
    path_b = write(tmp_path / "b", "b", 5, b.x, b.tracked, used_log=((4, ()),))
    # a directory, and a checkpoint's bytes as the Control service sends them
    read, skipped = read_snapshots([("a", tmp_path / "a"), ("b", path_b.read_bytes())])
    assert skipped == []
    assert [s.node for s in read] == ["a", "b"] and read[0].pending.keys() == {(4, "b")}
    from_files, direct = compute_invariant(read), compute_invariant(snaps)
    assert from_files.nodes[0].applied == 1
    assert from_files.raw_residual == pytest.approx(direct.raw_residual, rel=1e-9)
    assert from_files.resolved_residual == pytest.approx(0.0, abs=1e-7)


def test_unreadable_sources_are_skipped_with_their_reason(tmp_path):
    t = vec(1)
    write(tmp_path / "a", "a", 2, t, t)
    (tmp_path / "junk.safetensors").write_bytes(b"not a checkpoint at all")
    (tmp_path / "empty").mkdir()
    read, skipped = read_snapshots([
        ("a", tmp_path / "a"), ("again", tmp_path / "a" / "checkpoint.safetensors"),
        ("empty", tmp_path / "empty"), ("junk", tmp_path / "junk.safetensors"),
        ("live", None), ("bytes", b"\x00" * 3)])
    assert [s.node for s in read] == ["a"]
    reasons = {s.source: s.reason for s in skipped}
    assert reasons.keys() == {"again", "empty", "junk", "live", "bytes"}
    assert "node a was read already" in reasons["again"]
    assert reasons["empty"] == reasons["live"] == "no checkpoint yet"


def test_a_node_that_left_is_not_summed_but_resolves_its_neighbours_corrections():
    ta, tb = vec(1), vec(2)
    c = (tb - ta) / 3
    a = Snapshot("a", 5, ta + c, ta, pending={(4, "b"): c})
    b = Snapshot("b", 5, vec(7), vec(8), used_log={4: frozenset()}, left=True)
    report = compute_invariant([a, b])
    assert report.left == ("b",) and [n.node for n in report.nodes] == ["a"]
    assert report.nodes[0].applied == 1
    assert report.resolved_residual == pytest.approx(0.0, abs=1e-7)
    with pytest.raises(ValueError, match="every node read has left"):
        compute_invariant([b])


def test_node_folders_are_the_folder_itself_or_the_node_folders_below_it(tmp_path):
    for node in ("node-1", "node-0"):
        (tmp_path / "run" / node).mkdir(parents=True)
        (tmp_path / "run" / node / "metrics.jsonl").write_text("")
    (tmp_path / "run" / "peers").mkdir()
    (tmp_path / "multi" / "cdsgd" / "node-0").mkdir(parents=True)
    (tmp_path / "multi" / "cdsgd" / "node-0" / "daemon.log").write_text("")
    (tmp_path / "empty").mkdir()
    assert node_folders(tmp_path / "run") == [tmp_path / "run" / "node-0",
                                              tmp_path / "run" / "node-1"]
    assert node_folders(tmp_path / "run" / "node-0") == [tmp_path / "run" / "node-0"]
    assert node_folders(tmp_path / "multi") == [tmp_path / "multi" / "cdsgd" / "node-0"]
    assert node_folders(tmp_path / "empty") == [tmp_path / "empty"]
