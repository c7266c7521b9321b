"""The simulator plays fault plans through the runners' own code: drops, cuts, leaves, crashes
and joins each end with every remaining node finishing and ``Σ x = Σ ω_prev`` exact again."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from dacflnode.cli.main import cli
from dacflnode.config import RunConfig
from dacflnode.errors import ConfigError
from dacflnode.learning.datasets import load_dataset
from dacflnode.learning.partition import partition
from dacflnode.protocol.faults import FaultPlan, parse_fault_plan
from dacflnode.records.metrics_log import read_metrics
from dacflnode.sim.experiment import run_experiment
from dacflnode.sim.round_records import SimulationResult
from dacflnode.sim.simulator import Simulation

pytestmark = pytest.mark.slow

IDS = [f"node-{i}" for i in range(5)]
RING = RunConfig(dataset="synthetic", nodes=5, rounds=14, model="tiny-cnn", lr=0.05,
                 batch_size=20, synthetic_train=400, synthetic_test=100, topology="ring",
                 engine="sequential", device="cpu")
#: a healthy run's residual is float32 rounding, about 1e-7 here
EXACT = 1e-6


async def simulate(events: list[dict[str, Any]], cfg: RunConfig = RING,
             out: Path | None = None, gone_after: int = 3,
             ) -> tuple[Simulation, SimulationResult]:
    plan = parse_fault_plan(events, ids=IDS[:cfg.nodes], rounds=cfg.rounds)
    data = load_dataset("synthetic", synthetic_train=cfg.synthetic_train,
                        synthetic_test=cfg.synthetic_test, seed=cfg.seed)
    parts = partition(data.train_y, cfg.nodes, cfg.partition, seed=cfg.seed)
    sim = Simulation(cfg, "dacfl", data, parts, out_dir=out, faults=plan, gone_after=gone_after)
    # a node waiting for a state that never comes would hang the test: fail it instead
    return sim, await asyncio.wait_for(sim.run_async(), 60)


def phases(sim: Simulation) -> dict[str, str]:
    return {r.setup.node_id: r.phase for r in sim.runners}


async def test_a_directed_drop_is_used_one_sidedly_then_undone(tmp_path):
    sim, result = await simulate([{"drop": ["node-0", "node-1"], "rounds": [3, 4]}], out=tmp_path)
    assert set(phases(sim).values()) == {"done"}
    lines = read_metrics(tmp_path / "node-1" / "metrics.jsonl")
    assert [line["neighbours_missing"] for line in lines[3:5]] == [["node-0"], ["node-0"]]
    assert "node-1" in read_metrics(tmp_path / "node-0" / "metrics.jsonl")[3]["neighbours_used"]
    by_round = {r.round: r.invariant or 0.0 for r in result.records}
    assert by_round[4] > 1e-4  # node-0 mixed node-1 alone: Σx is off until node-0 undoes it
    assert result.invariant is not None and result.invariant <= EXACT
    assert sim.runners[0].peers["node-1"].corrections == 2


async def test_a_stalled_node_misses_both_ways_and_the_invariant_stays_exact(tmp_path):
    sim, result = await simulate([{"drop": "node-2", "rounds": [5, 6]}], out=tmp_path)
    assert set(phases(sim).values()) == {"done"}
    line = read_metrics(tmp_path / "node-2" / "metrics.jsonl")[5]
    assert line["neighbours_missing"] == ["node-1", "node-3"]
    assert all(r.invariant is not None and r.invariant <= EXACT for r in result.records)


async def test_a_cut_edge_comes_back_when_it_heals(tmp_path):
    sim, result = await simulate([{"cut": ["node-1", "node-2"], "round": 2, "heal": 9}],
                                 out=tmp_path)
    assert set(phases(sim).values()) == {"done"}
    lines = read_metrics(tmp_path / "node-1" / "metrics.jsonl")
    assert "node-2" not in lines[4]["neighbours_used"]
    assert "node-2" in lines[-1]["neighbours_used"]
    assert result.invariant is not None and result.invariant <= EXACT


async def test_a_node_that_leaves_hands_its_share_on_and_the_rest_finish(tmp_path):
    sim, result = await simulate([{"leave": "node-3", "round": 4}], out=tmp_path)
    assert phases(sim) == {**dict.fromkeys(IDS, "done"), "node-3": "left"}
    assert [len(r.nodes) for r in result.records][-1] == 4
    assert result.invariant is not None and result.invariant <= EXACT
    assert "node-3" not in read_metrics(tmp_path / "node-2" / "metrics.jsonl")[-1][
        "neighbours_used"]


async def test_a_node_restarted_at_once_runs_every_round(tmp_path):
    sim, result = await simulate([{"crash": "node-2", "round": 4, "restart": 4}], out=tmp_path)
    assert set(phases(sim).values()) == {"done"}
    rounds = [line["round"] for line in read_metrics(tmp_path / "node-2" / "metrics.jsonl")]
    assert rounds == list(range(1, 15))
    assert result.invariant is not None and result.invariant <= EXACT


async def test_a_node_restarted_before_it_is_declared_gone_rejoins():
    sim, result = await simulate([{"crash": "node-2", "round": 4, "restart": 6}])
    assert set(phases(sim).values()) == {"done"}
    assert result.invariant is not None and result.invariant <= EXACT


async def test_a_node_restarted_after_it_was_declared_gone_rejoins_after_the_reanchor():
    sim, result = await simulate([{"crash": "node-2", "round": 3, "restart": 9}])
    assert set(phases(sim).values()) == {"done"}
    assert all(r.reanchored >= 1 for r in sim.runners if r.setup.node_id != "node-2")
    assert result.records[-1].nodes == IDS
    assert result.invariant is not None and result.invariant <= EXACT


async def test_a_node_gone_for_good_leaves_survivors_exact_after_the_reanchor():
    sim, result = await simulate([{"crash": "node-2", "round": 3}])
    survivors = {n: p for n, p in phases(sim).items() if n != "node-2"}
    assert set(survivors.values()) == {"done"} and phases(sim)["node-2"] != "done"
    assert all(r.reanchored >= 1 for r in sim.runners if r.setup.node_id != "node-2")
    by_round = {r.round: r.invariant or 0.0 for r in result.records}
    assert by_round[4] > 1e-4  # node-2's share of Σx left with it
    assert result.invariant is not None and result.invariant <= EXACT


async def test_a_late_joiner_joins_the_running_network_and_finishes():
    sim, result = await simulate([{"join": "node-4", "round": 3}])
    assert set(phases(sim).values()) == {"done"}
    assert result.records[0].nodes == IDS[:4] and result.records[-1].nodes == IDS
    assert result.invariant is not None and result.invariant <= EXACT


async def test_a_run_with_faults_is_deterministic():
    events = [{"drop": ["node-0", "node-1"], "rounds": [3, 4]},
              {"cut": ["node-3", "node-4"], "round": 5, "heal": 7}]
    a, _ = await simulate(events)
    b, _ = await simulate(events)
    for ra, rb in zip(a.runners, b.runners, strict=True):
        assert torch.equal(ra.state.x, rb.state.x)


@pytest.mark.parametrize(("change", "events", "field"), [
    ({"engine": "batched"}, [{"leave": "node-1", "round": 3}], "engine"),
    ({"topology": "dense"}, [{"join": "node-1", "round": 3}], "faults"),
    ({}, [{"drop": "node-7", "rounds": 3}], "faults[0].drop"),
])
async def test_node_events_the_simulation_cannot_play_are_refused(change, events, field):
    with pytest.raises(ConfigError) as info:
        await simulate(events, replace(RING, **change))
    assert info.value.field == field


async def test_drops_with_the_batched_engine_give_the_sequential_models():
    events = [{"drop": ["node-0", "node-1"], "rounds": [3, 4]}]
    seq, _ = await simulate(events)
    bat, _ = await simulate(events, replace(RING, engine="batched"))
    assert bat.engine.name == "batched"
    for a, b in zip(seq.runners, bat.runners, strict=True):
        assert torch.allclose(a.state.x, b.state.x, atol=1e-4)


def test_simulate_faults_reports_the_invariant_in_its_summary(tmp_path):
    plan = tmp_path / "faults.yaml"
    plan.write_text("faults:\n  - {drop: [node-0, node-1], rounds: [2, 2]}\n")
    args = ["simulate", "--dataset", "synthetic", "--nodes", "3", "--rounds", "4",
            "--topology", "ring", "--model", "tiny-cnn", "--synthetic-train", "300",
            "--synthetic-test", "60", "--faults", str(plan), "--quiet", "--json"]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    summary = json.loads(out.stdout)  # its warnings (a dropped state) go to stderr
    assert summary["faults"] == str(plan.absolute())
    inv = summary["invariant"]["dacfl"]
    assert len(inv["rounds"]) == 4 and inv["nodes"] == [3, 3, 3, 3]
    assert inv["rounds"][2] > 1e-4 and inv["final"] <= EXACT  # round 2 is the 3rd record


def test_simulate_refuses_a_plan_naming_another_node(tmp_path):
    plan = tmp_path / "faults.yaml"
    plan.write_text("- {crash: node-5, round: 1}\n")
    out = CliRunner().invoke(cli, ["simulate", "--dataset", "synthetic", "--nodes", "3",
                                   "--faults", str(plan), "--quiet"])
    assert out.exit_code == 2
    assert "faults[0].crash" in out.output and "no node 'node-5'" in out.output


def test_an_empty_plan_changes_nothing():
    cfg = replace(RING, rounds=3)
    plain = run_experiment(cfg)
    planned = run_experiment(cfg, faults=FaultPlan())
    assert planned["algorithms"]["dacfl"]["train_loss"] == plain["algorithms"]["dacfl"][
        "train_loss"]
    assert planned["invariant"]["dacfl"]["final"] <= EXACT


@pytest.mark.parametrize(("gone_after", "declared"), [(2, True), (4, False)])
async def test_gone_after_decides_whether_a_stall_makes_the_neighbours_reanchor(gone_after,
                                                                                declared):
    sim, result = await simulate([{"drop": "node-2", "rounds": [3, 5]}], gone_after=gone_after)
    assert set(phases(sim).values()) == {"done"}
    assert (sim.runners[1].reanchored > 0) is declared
    assert result.invariant is not None and result.invariant <= EXACT
