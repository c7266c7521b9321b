"""Real multi-process clusters on 127.0.0.1 (ports from bind(0)): equivalence with the simulator,
status/metrics of live daemons, graceful stop, restart from a checkpoint, refused handshakes."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from dacflnode.cluster.launcher import free_ports, launch
from dacflnode.peers.generate import generate_cluster
from dacflnode.records.metrics_log import read_metrics
from dacflnode.sim.experiment import run_experiment
from dacflnode.transport.grpc_control import fetch_metrics, fetch_status
from tests.harness import preloaded
from tests.harness.cluster import ENV, HELLO_REFUSED, TINY, cluster, max_diff, start_node

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("algorithm", ["dacfl", "cdsgd"])
def test_launched_cluster_ends_with_the_simulators_models(tmp_path, algorithm):
    cfg = replace(TINY, algorithm=(algorithm,), nodes=4, rounds=3, topology="complete",
                  time_varying=1, engine="sequential")
    launched = launch(cfg, tmp_path / "cluster", round_deadline=60)
    simulated = run_experiment(cfg, tmp_path / "sim")
    for i in range(4):
        node = f"node-{i}"
        diff = max_diff(tmp_path / "cluster" / node / "final.safetensors",
                        tmp_path / "sim" / node / "final.safetensors")
        assert diff <= 1e-6, (node, diff)
        cluster_lines = read_metrics(tmp_path / "cluster" / node / "metrics.jsonl")
        sim_lines = read_metrics(tmp_path / "sim" / node / "metrics.jsonl")
        assert len(cluster_lines) == len(sim_lines) == 3
        # one line format: the same keys, and the same training figures
        assert [tuple(x) for x in cluster_lines] == [tuple(x) for x in sim_lines]
        for c, s in zip(cluster_lines, sim_lines, strict=True):
            assert c["samples"] == s["samples"] and c["neighbours_used"] == s["neighbours_used"]
            assert abs(c["consensus_residual"] - s["consensus_residual"]) <= 1e-5
    a, b = launched["algorithms"][algorithm], simulated["algorithms"][algorithm]
    assert a.keys() == b.keys() and a["rounds"] == b["rounds"] == [1, 2, 3]
    # equal models to 1e-6; a different thread count may flip an argmax tie on 200 samples
    assert a["avg_acc"] == pytest.approx(b["avg_acc"], abs=1e-2)


async def test_live_daemons_answer_status_and_metrics_and_stop_on_request(tmp_path):
    with cluster(tmp_path, 3, rounds=100_000, eval_every=5) as c:
        c.start()
        c.wait_for_round(0, 1, timeout=120)
        addr, auth = c.control_address(0), c.control_auth(0)
        cli = preloaded.run("status", "--peers", str(c.paths[0]), "--json", env=ENV, timeout=60)
        assert cli.returncode == 0, cli.stderr
        assert json.loads(cli.stdout)["node_id"] == "node-0"
        status = await fetch_status(addr, auth=auth)
        assert status.node_id == "node-0" and status.algorithm == "dacfl"
        assert status.rounds_total == 100_000 and status.round >= 1
        assert {n.node_id for n in status.neighbours} == {"node-1", "node-2"}
        assert all(n.connected and n.bytes_received > 0 for n in status.neighbours)
        prom = await fetch_metrics(addr, "prometheus", auth=auth)
        assert 'dacfl_round{node="node-0"}' in prom
        assert 'dacfl_peer_received_bytes_total{node="node-0",peer="node-1"}' in prom
        assert 'dacfl_peer_missed_rounds_total{node="node-0",peer="node-1"}' in prom
        assert 'dacfl_reanchored_total{node="node-0"} 0.0' in prom
        assert {n.state for n in status.neighbours} == {"active"}
        data = json.loads(await fetch_metrics(addr, "json", auth=auth))
        assert data["node_id"] == "node-0" and "last_round" in data
        assert data["neighbours"][0]["missed_rounds"] == 0 and data["reanchored"] == 0
        for path in c.paths:
            preloaded.run("stop", "--peers", str(path), env=ENV, timeout=60)
        assert c.wait(timeout=120) == [0, 0, 0], c.logs(range(3))
    for i in range(3):
        assert (tmp_path / f"node-{i}" / "checkpoint.safetensors").exists()


def test_sigterm_checkpoints_and_exits_zero_and_a_restart_finishes_the_run(tmp_path):
    # rounds enough that the signal, sent as node-0 ends round 2, finds the run unfinished
    with cluster(tmp_path, 3, rounds=12) as c:
        c.start()
        c.wait_for_round(0, 2, timeout=120)
        c.send(signal.SIGTERM)
        assert c.wait(timeout=60) == [0, 0, 0], c.logs(range(3))
        done = [len(c.metrics(i)) for i in range(3)]
        assert all((c.state_dir(i) / "checkpoint.safetensors").exists() for i in range(3))
        assert min(done) < 12
        c.start()  # resume from the checkpoints
        assert c.wait(timeout=120) == [0, 0, 0], c.logs(range(3))
        for i in range(3):
            rounds = [m["round"] for m in c.metrics(i)]
            assert rounds == list(range(1, 13)), rounds


def test_a_killed_node_restarted_from_its_checkpoint_rejoins_the_cluster(tmp_path):
    # killed at round 3: the rounds after it are run with the restarted node
    with cluster(tmp_path, 3, rounds=12) as c:
        c.start()
        c.wait_for_round(1, 3, timeout=120)
        c.kill(1)  # a crash: no checkpoint of the round in flight
        c.start(1)
        assert c.wait(timeout=120) == [0, 0, 0], c.logs(range(3))
        for i in range(3):
            rounds = [m["round"] for m in c.metrics(i)]
            assert rounds[-1] == 12 and sorted(set(rounds)) == list(range(1, 13))


def test_stop_drain_ends_the_node_with_exit_0_and_the_others_finish_without_it(tmp_path):
    # the stop command is a fork of the preloaded server: it lands at round 3, not seconds of
    # imports after that, and the run is far from over
    with cluster(tmp_path, 4, rounds=40, eval_every=20) as c:
        c.start()
        c.wait_for_round(0, 3, timeout=120)
        stop = preloaded.run("stop", "--drain", "--peers", str(c.paths[2]), env=ENV, timeout=60)
        assert stop.returncode == 0 and "leaves the network" in stop.stdout, stop.stderr
        assert c.wait([2], timeout=60) == [0]
        assert "left the network" in (tmp_path / "node-2" / "daemon.log").read_text()
        assert c.wait(timeout=180) == [0, 0, 0, 0], c.logs(range(4))
    result = preloaded.run("invariant", "--json", *(str(tmp_path / f"node-{i}") for i in range(4)),
                           env=ENV, timeout=60)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["left"] == ["node-2"] and report["nodes"] == ["node-0", "node-1", "node-3"]
    assert report["rounds"] == {"node-0": 40, "node-1": 40, "node-3": 40}
    assert report["unresolved"] == 0 and report["resolved_residual"] <= 1e-4


def test_a_neighbour_with_other_run_settings_is_refused(tmp_path):
    ports = free_ports(4)
    cfg = replace(TINY, nodes=2, rounds=2)
    paths = generate_cluster("complete", 2, cfg, tmp_path / "a", ports=ports[:2],
                             control_ports=ports[2:], state_root=tmp_path,
                             hello_timeout=HELLO_REFUSED)
    other = generate_cluster("complete", 2, replace(cfg, lr=0.5), tmp_path / "b",
                             ports=ports[:2], control_ports=ports[2:], state_root=tmp_path / "b",
                             hello_timeout=HELLO_REFUSED)
    procs = [start_node(paths[0]), start_node(other[1])]
    try:
        codes = [p.wait(timeout=60) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert codes == [1, 1]
    log = (tmp_path / "node-0" / "daemon.log").read_text()
    assert "different run settings" in log


def test_status_without_a_daemon_fails_with_a_clear_message():
    port = free_ports(1)[0]
    proc = preloaded.run("status", "--target", f"127.0.0.1:{port}", env=ENV, timeout=60)
    assert proc.returncode == 1
    assert "no dacflnode daemon answers" in proc.stderr


def test_final_model_loads_into_the_architecture(tmp_path):
    cfg = replace(TINY, nodes=3, rounds=1, topology="ring")
    launch(cfg, tmp_path)
    from dacflnode.learning.models import build_model

    model = build_model("tiny-cnn", (1, 8, 8), 10)
    model.load_state_dict(load_file(str(tmp_path / "node-0" / "final.safetensors")))
    assert model(torch.zeros(2, 1, 8, 8)).shape == (2, 10)


def test_a_killed_node_whose_checkpoint_was_damaged_resumes_from_the_previous_one(tmp_path):
    """One flipped float in the newest checkpoint of a killed node: the restarted node says
    so, resumes from checkpoint.prev.safetensors (a round further back) and the run ends with
    every node done and the invariant holding."""
    state = tmp_path / "node-1"
    with cluster(tmp_path, 3, rounds=12) as c:  # killed at round 3: rounds left to run
        c.start()
        c.wait_for_round(1, 3, timeout=120)
        c.kill(1)
        newest = state / "checkpoint.safetensors"
        data = bytearray(newest.read_bytes())
        data[-7] ^= 0x08  # a bit of the last tensor's bytes
        # written as a new file: killed inside a save, the node may leave the previous
        # checkpoint a hard link to the newest, which an in-place write would damage as well
        flipped = state / "flipped.tmp"
        flipped.write_bytes(bytes(data))
        os.replace(flipped, newest)
        c.start(1)
        assert c.wait(timeout=150) == [0, 0, 0], c.logs(range(3))
    log = (state / "daemon.log").read_text()
    assert "does not match its checksum" in log and "resuming from the previous checkpoint" in log
    assert (state / "checkpoint.damaged.safetensors").exists()
    assert "received already" not in log  # its pulls and refused pushes ask once per state
    result = preloaded.run("invariant", "--json", *(str(tmp_path / f"node-{i}") for i in range(3)),
                           env=ENV, timeout=60)
    report = json.loads(result.stdout)
    assert report["rounds"] == {"node-0": 12, "node-1": 12, "node-2": 12}
    assert result.returncode == 0 and report["holds"], report["verdict"]
