"""The daemon's side of the Control service, without servers: what stop, drain and the signals
ask of the runner, the checkpoint it serves, and the fault counters its status shows."""

from __future__ import annotations

import signal
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import Mock

import pytest
import yaml

from dacflnode.config import RunConfig, anchor_delay
from dacflnode.daemon.service import Daemon
from dacflnode.peers.file import PeersFile, load_peers
from dacflnode.peers.generate import generate_cluster
from dacflnode.protocol.runner import NodeRunner
from dacflnode.records.membership import PeerState, PeerTrack
from dacflnode.transport.base import Identity, Inbox, PeerStats
from dacflnode.transport.receiver import Receiver
from dacflnode.wire.errors import Reason, WireError
from tests.harness.cluster import TINY

RING = replace(TINY, nodes=3, rounds=2)


def peers_file(tmp_path: Path, **run: object) -> PeersFile:
    path = generate_cluster("ring", 3, RING, tmp_path / "peers", state_root=tmp_path)[0]
    data = yaml.safe_load(path.read_text())
    data["run"].update(run)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_peers(path)


def with_runner(daemon: Daemon, setup: object = None) -> Mock:
    """A stand-in runner with the public attributes a snapshot reads (``setup``: its setup;
    default: one naming the daemon's node, algorithm, rounds and neighbours, without data)."""
    pf = daemon.pf
    runner = Mock(spec=NodeRunner)
    runner.setup = setup or SimpleNamespace(
        node_id=pf.node.id, neighbours=pf.neighbour_ids(), rounds=pf.run.rounds,
        algorithm=SimpleNamespace(name=pf.run.algorithm[0]), data=None, schedule="sync",
        run_info={})
    runner.last, runner.copies, runner.started, runner.stopping = None, None, 0.0, False
    runner.waited_s, runner.async_node = 0.0, None
    daemon.runner = runner
    return runner


@pytest.mark.parametrize("drain_on_sigterm", [False, True])
def test_sigterm_drains_only_when_configured_and_sigint_always_stops(tmp_path, drain_on_sigterm):
    daemon = Daemon(peers_file(tmp_path, drain_on_sigterm=drain_on_sigterm))
    runner = with_runner(daemon)
    daemon.on_signal(signal.SIGTERM)
    assert runner.request_leave.called is drain_on_sigterm
    assert runner.request_stop.called is not drain_on_sigterm
    runner.reset_mock()
    daemon.on_signal(signal.SIGINT)
    runner.request_stop.assert_called_once_with()
    runner.request_leave.assert_not_called()


def test_a_drain_asked_before_the_runner_exists_is_kept(tmp_path):
    daemon = Daemon(peers_file(tmp_path))
    daemon.stop(drain=True)
    assert daemon._leave_early and not daemon._stop_early
    assert daemon.status().leaving
    runner = with_runner(daemon)
    daemon.stop(drain=True)
    runner.request_leave.assert_called_once_with()


async def test_the_checkpoint_served_is_the_state_directorys_file(tmp_path):
    pf = peers_file(tmp_path)
    daemon = Daemon(pf)
    assert await daemon.checkpoint_bytes() is None
    pf.node.state_dir.mkdir(parents=True, exist_ok=True)
    (pf.node.state_dir / "checkpoint.safetensors").write_bytes(b"0123")
    assert await daemon.checkpoint_bytes() == b"0123"


def test_status_shows_each_neighbours_track_and_the_refusals_it_caused(tmp_path):
    pf = peers_file(tmp_path)
    daemon = Daemon(pf)
    first, second = pf.neighbour_ids()
    runner = with_runner(daemon)
    runner.transport = Mock(stats={second: PeerStats(connected=False)})
    # the second is active, but its last call failed (it is stopped): shown as unreachable
    runner.peers = {first: PeerTrack(state=PeerState.GONE, missed=5, corrections=2),
                    second: PeerTrack()}
    runner.anchors, runner.reanchored, runner.leaving = {9, 7}, 1, False
    runner.alone_rounds = 3
    runner.quarantines = 0
    runner.round, runner.phase, runner.last_accuracy, runner.last_loss = 4, "training", 0.5, 1.0
    runner.residual.return_value = 0.25
    receiver = Receiver(Identity(pf.node.id, "m", "r"),
                        Inbox(senders=frozenset(pf.neighbour_ids()), current_round=lambda: 4),
                        {}, {})
    for reason in (Reason.ROUND_PASSED, Reason.DUPLICATE):
        receiver._refused("push", first, "peer", 3, WireError("X", "m", reason))
    daemon.receiver = receiver
    status = daemon.status()
    by_id = {n.node_id: n for n in status.neighbours}
    a, b = by_id[first], by_id[second]
    assert (a.state, a.missed_rounds, a.corrections, a.late_states, a.refused) == (
        "gone", 5, 2, 1, 2)
    assert (b.state, b.missed_rounds, b.late_states, b.refused) == ("unreachable", 0, 0, 0)
    assert status.anchors == [7, 9] and status.reanchored == 1 and not status.leaving
    assert status.alone_rounds == 3
    assert 'dacfl_rounds_alone_total{node="node-0"} 3.0' in daemon.metrics.prometheus()
    assert 'dacfl_peer_missed_rounds_total{node="node-0",peer="' + first + '"} 5.0' in \
        daemon.metrics.prometheus()


def test_an_automatic_anchor_delay_follows_the_number_of_members(tmp_path):
    daemon = Daemon(peers_file(tmp_path / "a"))  # 3 members: at least 4
    assert anchor_delay(daemon.pf.daemon.anchor_delay, len(daemon.pf.daemon.members)) == 4
    assert anchor_delay(0, 9) == 9
    assert anchor_delay(7, 3) == 7


def test_a_daemon_on_its_own_folder_announces_its_contract_and_shows_its_data(tmp_path):
    import json

    from dacflnode.assembly.build import build_node
    from tests.harness.owndata import CLASSES, write_png_nodes

    mix = {"node-0": {"cat": 5, "eel": 3}, "node-1": {"dog": 4}}
    train, test = write_png_nodes(tmp_path / "data", mix)
    run = RunConfig(dataset="folder", classes=CLASSES, image_size=8, nodes=2, rounds=1,
                    data_root=str(train), test_root=str(test))
    path = generate_cluster("complete", 2, run, tmp_path / "peers", state_root=tmp_path)[0]
    pf = load_peers(path)
    assert pf.run.data_root == str(train / "node-0")
    built = build_node(pf)
    contract = json.loads(built.identity.data_contract)
    assert contract["classes"] == list(CLASSES) and contract["input_shape"] == [1, 8, 8]
    # the contract, not the data set's name, is what the run fingerprint hashes
    assert built.identity.run_fingerprint == pf.run_fingerprint(built.identity.data_contract)
    assert built.identity.run_fingerprint != pf.run_fingerprint()
    assert built.setup.data is not None
    assert built.setup.data.class_counts == {"cat": 5, "dog": 0, "eel": 3}
    assert built.setup.data.test_size == 6 * len(CLASSES)
    assert any((tmp_path / "node-0" / ".cache").rglob("*.npy"))  # decoded once, kept
    daemon = Daemon(pf)
    runner = with_runner(daemon, built.setup)
    runner.transport, runner.peers, runner.anchors = Mock(stats={}), {}, set()
    runner.reanchored = runner.alone_rounds = runner.quarantines = runner.round = 0
    runner.phase, runner.last_accuracy, runner.last_loss = "waiting-for-peers", 0.0, 0.0
    runner.residual.return_value, runner.leaving = 0.0, False
    status = daemon.status()
    assert (status.data_size, status.class_counts["eel"]) == (8, 3)
    assert list(status.class_counts) == ["cat", "dog", "eel"]  # the run's class order


def test_a_quarantined_neighbour_shows_in_status_json_and_prometheus(tmp_path):
    pf = peers_file(tmp_path)
    daemon = Daemon(pf)
    first, second = pf.neighbour_ids()
    runner = with_runner(daemon)
    runner.transport = Mock(stats={})
    runner.peers = {first: PeerTrack(state=PeerState.QUARANTINED, refused_states=2),
                    second: PeerTrack(refused_states=1)}
    runner.anchors, runner.reanchored, runner.leaving = set(), 1, False
    runner.alone_rounds, runner.quarantines = 0, 1
    runner.round, runner.phase, runner.last_accuracy, runner.last_loss = 4, "training", 0.5, 1.0
    runner.residual.return_value = 0.25
    status = daemon.status()
    by_id = {n.node_id: n for n in status.neighbours}
    assert (by_id[first].state, by_id[first].refused_states) == ("quarantined", 2)
    assert (status.quarantines, status.refused_states) == (1, 3)
    data = status.to_json()
    states = {nb["node_id"]: nb["state"] for nb in data["neighbours"]}
    assert data["quarantines"] == 1 and states[first] == "quarantined"
    text = daemon.metrics.prometheus()
    assert f'dacfl_peer_quarantines_total{{node="node-0",peer="{first}"}} 1.0' in text
    assert f'dacfl_peer_quarantines_total{{node="node-0",peer="{second}"}} 0.0' in text
    assert f'dacfl_peer_refused_states_total{{node="node-0",peer="{first}"}} 2.0' in text


def test_a_daemon_without_its_runner_yet_reports_a_starting_node(tmp_path):
    import math

    pf = peers_file(tmp_path)
    daemon = Daemon(pf)
    status = daemon.status()
    assert (status.phase, status.round, status.rounds_total, status.algorithm) == (
        "starting", 0, pf.run.rounds, pf.run.algorithm[0])
    assert math.isnan(status.last_accuracy) and math.isnan(status.consensus_residual)
    assert [(n.node_id, n.state, n.connected, n.last_round_received)
            for n in status.neighbours] == [(j, "", False, -1) for j in pf.neighbour_ids()]
    assert 'dacfl_phase{node="node-0",phase="starting"} 1.0' in daemon.metrics.prometheus()
    kind, text = daemon.metrics_text("json")
    assert kind == "application/json" and '"last_round": null' in text
