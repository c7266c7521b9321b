"""One fault plan, two runs: a real cluster (``launch --faults``, one daemon process per node)
and the simulator (``simulate --faults``) drop the same edge-rounds through the same runner
code, so they end with the same models; node events, which daemons cannot play, are refused
before any daemon starts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dacflnode.cluster.launcher import free_ports, launch
from dacflnode.errors import ConfigError
from dacflnode.peers.generate import generate_cluster
from dacflnode.protocol.faults import load_fault_plan
from dacflnode.records.metrics_log import read_metrics
from dacflnode.sim.experiment import run_experiment
from tests.harness import preloaded
from tests.harness.cluster import ENV, TINY, max_diff

pytestmark = pytest.mark.slow


def test_a_cluster_with_an_injected_drop_ends_with_the_simulators_models(tmp_path):
    plan = tmp_path / "faults.yaml"
    plan.write_text("faults:\n  - {drop: [node-0, node-1], rounds: [3, 3]}\n")
    cfg = replace(TINY, algorithm=("dacfl",), nodes=4, rounds=6, topology="ring",
                  engine="sequential")
    launched = launch(cfg, tmp_path / "cluster", round_deadline=60, faults=plan)
    simulated = run_experiment(cfg, tmp_path / "sim", faults=load_fault_plan(plan))
    assert launched["faults"] == str((tmp_path / "cluster" / "faults.yaml").absolute())
    for i in range(4):
        node = f"node-{i}"
        cluster_lines = read_metrics(tmp_path / "cluster" / node / "metrics.jsonl")
        sim_lines = read_metrics(tmp_path / "sim" / node / "metrics.jsonl")
        assert [c["neighbours_missing"] for c in cluster_lines] == [
            s["neighbours_missing"] for s in sim_lines]
        diff = max_diff(tmp_path / "cluster" / node / "final.safetensors",
                        tmp_path / "sim" / node / "final.safetensors")
        assert diff <= 1e-6, (node, diff)
    # the drop was played: node-1 mixed round 3 without node-0, node-0 used node-1 alone
    node1 = read_metrics(tmp_path / "cluster" / "node-1" / "metrics.jsonl")
    assert node1[3]["neighbours_missing"] == ["node-0"]
    node0 = read_metrics(tmp_path / "cluster" / "node-0" / "metrics.jsonl")
    assert "node-1" in node0[3]["neighbours_used"]
    # and undone: the simulated network, which has the cluster's models, ends exact
    assert simulated["invariant"]["dacfl"]["rounds"][3] > 1e-4
    assert simulated["invariant"]["dacfl"]["final"] <= 1e-6


@pytest.mark.parametrize("event", ["{crash: node-1, round: 2}", "{leave: node-2, round: 2}",
                                   "{join: node-0, round: 2}"])
def test_launch_refuses_node_events_before_starting_a_daemon(tmp_path, event):
    plan = tmp_path / "faults.yaml"
    plan.write_text(f"- {{drop: node-1, rounds: 1}}\n- {event}\n")
    cfg = replace(TINY, nodes=3, rounds=3, topology="ring")
    with pytest.raises(ConfigError) as info:
        launch(cfg, tmp_path / "cluster", faults=plan)
    assert info.value.field.startswith("faults[1].")
    assert "simulate --faults" in info.value.message
    assert not (tmp_path / "cluster" / "node-0").exists()


def test_start_refuses_a_plan_with_a_node_event_or_an_unknown_node(tmp_path):
    ports = free_ports(4)
    cfg = replace(TINY, nodes=2, rounds=2)
    paths = generate_cluster("complete", 2, cfg, tmp_path / "peers", ports=ports[:2],
                             control_ports=ports[2:], state_root=tmp_path)
    for text, words in (("- {leave: node-1, round: 1}\n", "stop --drain"),
                        ("- {drop: node-7, rounds: 1}\n", "no node 'node-7'")):
        plan = tmp_path / "faults.yaml"
        plan.write_text(text)
        proc = preloaded.run("start", "--peers", str(paths[0]), "--faults", str(plan), env=ENV,
                             timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert words in proc.stderr and str(plan) in proc.stderr



def test_start_refuses_a_cut_of_a_pair_that_is_no_edge_of_its_peers_files_graph(tmp_path):
    ports = free_ports(8)
    cfg = replace(TINY, nodes=4, rounds=3)
    paths = generate_cluster("ring", 4, cfg, tmp_path / "peers", ports=ports[:4],
                             control_ports=ports[4:], state_root=tmp_path)
    plan = tmp_path / "faults.yaml"
    plan.write_text("- {cut: [node-0, node-1], round: 1}\n- {cut: [node-0, node-2], round: 1}\n")
    proc = preloaded.run("start", "--peers", str(paths[0]), "--faults", str(plan), env=ENV,
                         timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: faults[1].cut: "), proc.stderr
    assert str(plan) in lines[0]
    assert "node-0 -- node-2 is not an edge of this run's graph" in lines[0]
    assert not (tmp_path / "node-0" / "metrics.jsonl").exists()
