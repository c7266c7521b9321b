"""``dacflnode launch`` on a folder that holds an earlier run: Ctrl-C says how to go on, the same
command resumes from the checkpoints, other settings are refused with ``--fresh`` named, and
``--fresh`` starts over; metrics.jsonl is never overwritten silently."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from dacflnode.algorithms.rounds import NodeState
from dacflnode.cli.main import cli
from dacflnode.cluster.launcher import free_ports, prepare_resume
from dacflnode.config import RunConfig
from dacflnode.errors import ConfigError
from dacflnode.peers.file import load_peers
from dacflnode.peers.generate import generate_cluster
from dacflnode.records.checkpoint import save_checkpoint
from dacflnode.records.metrics_log import read_metrics
from tests.harness import preloaded
from tests.harness.cluster import ENV
from tests.harness.polling import until_blocking

pytestmark = pytest.mark.slow

RUN = ["launch", "--dataset", "synthetic", "--model", "mlp", "--nodes", "2", "--lr", "0.05",
       "--synthetic-train", "300", "--synthetic-test", "60", "--quiet"]


def rounds_of(out: Path, node: str) -> list[int]:
    return [int(m["round"]) for m in read_metrics(out / node / "metrics.jsonl")]


def test_ctrl_c_says_how_to_resume_and_the_same_command_resumes(tmp_path):
    out = tmp_path / "run"
    # Ctrl-C as both nodes end round 3: 24 rounds leave the run far from over
    args = [*RUN, "--rounds", "24", "--out", str(out)]
    first = tmp_path / "first.out", tmp_path / "first.err"
    # its own group: Ctrl-C reaches all of it
    proc = preloaded.start(*args, env=ENV, stdout=first[0], stderr=first[1],
                           start_new_session=True)
    try:

        def at_round_3() -> bool:
            assert proc.poll() is None, first[1].read_text()
            return min(len(rounds_of(out, n)) for n in ("node-0", "node-1")) >= 3

        until_blocking(at_round_3, 180, interval=0.05, what="the cluster did not reach round 3")
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    stderr = first[1].read_text()
    assert proc.returncode == 130, stderr
    assert "interrupted: every node was stopped at a checkpoint" in stderr
    assert "dacfl: 2 of 2 node(s) checkpointed, at round" in stderr and " of 24" in stderr
    assert "to resume, run the same command again" in stderr and "add --fresh" in stderr
    assert "Aborted" not in stderr and "Traceback" not in stderr
    stopped = {n: rounds_of(out, n) for n in ("node-0", "node-1")}
    assert all(0 < len(r) < 24 for r in stopped.values()), stopped

    # its own group too: if it ever runs out of time, its daemons go with it
    second = tmp_path / "second.out", tmp_path / "second.err"
    again = preloaded.start(*args, "--json", env=ENV, stdout=second[0], stderr=second[1],
                            start_new_session=True)
    try:
        again.wait(timeout=600)
    finally:
        if again.poll() is None:
            os.killpg(again.pid, signal.SIGKILL)
            again.wait()
    assert again.returncode == 0, second[1].read_text()
    result = json.loads(second[0].read_text())
    assert result["algorithms"]["dacfl"]["rounds"] == list(range(1, 25))
    for node, before in stopped.items():
        assert rounds_of(out, node) == list(range(1, 25))  # each round once, none lost
        assert "resuming from round" in (out / node / "daemon.log").read_text()
        assert len(before) <= 24


def test_other_settings_are_refused_naming_fresh_and_fresh_starts_over(tmp_path):
    out = tmp_path / "run"
    first = CliRunner().invoke(cli, [*RUN, "--rounds", "2", "--out", str(out)])
    assert first.exit_code == 0, first.output
    metrics = (out / "node-0" / "metrics.jsonl").read_bytes()

    same = CliRunner().invoke(cli, [*RUN, "--rounds", "2", "--out", str(out), "--json"])
    assert same.exit_code == 0, same.output  # a finished run: resumed, nothing run again
    assert json.loads(same.stdout)["algorithms"]["dacfl"]["rounds"] == [1, 2]
    assert (out / "node-0" / "metrics.jsonl").read_bytes() == metrics

    other = [a if a != "0.05" else "0.2" for a in RUN]
    refused = CliRunner().invoke(cli, [*other, "--rounds", "2", "--out", str(out)])
    assert refused.exit_code == 2
    assert "error: --out: " in refused.output and "with other settings" in refused.output
    assert "--fresh" in refused.output
    assert (out / "node-0" / "metrics.jsonl").read_bytes() == metrics  # untouched

    fresh = CliRunner().invoke(cli, [*other, "--rounds", "2", "--out", str(out), "--fresh"])
    assert fresh.exit_code == 0, fresh.output
    lines = read_metrics(out / "node-0" / "metrics.jsonl")
    assert [m["round"] for m in lines] == [1, 2] and lines[0]["lr"] == 0.2  # the new lr


def test_a_node_with_results_but_no_checkpoint_is_refused_before_any_daemon_starts(tmp_path):
    out = tmp_path / "run"
    (out / "node-1").mkdir(parents=True)
    (out / "node-1" / "metrics.jsonl").write_text('{"round": 1}\n')
    refused = CliRunner().invoke(cli, [*RUN, "--rounds", "2", "--out", str(out)])
    assert refused.exit_code == 2
    assert "node-1 has metrics.jsonl but no checkpoint" in refused.output
    assert "--fresh" in refused.output
    assert not (out / "node-0").exists()  # nothing started
    assert (out / "node-1" / "metrics.jsonl").read_text() == '{"round": 1}\n'


def test_resuming_cuts_a_round_logged_after_the_last_checkpoint(tmp_path):
    cfg = RunConfig(dataset="synthetic", model="mlp", nodes=2, rounds=5)
    ports = free_ports(4)
    paths = generate_cluster("complete", 2, replace(cfg), tmp_path / "peers", ports=ports[:2],
                             control_ports=ports[2:], state_root=tmp_path)
    dirs = [tmp_path / p.stem for p in paths]
    for d, path in zip(dirs, paths, strict=True):
        d.mkdir(exist_ok=True)
        pf = load_peers(path)
        save_checkpoint(d, NodeState(2, torch.zeros(3), torch.zeros(3), torch.zeros(3)), {},
                        {"node": d.name, "run_fingerprint": pf.run_fingerprint()})
        (d / "metrics.jsonl").write_text("".join(json.dumps({"round": r}) + "\n"
                                                 for r in (1, 2, 3)))
    assert prepare_resume(dirs, {p.stem: p for p in paths}) == {"node-0": 2, "node-1": 2}
    assert [rounds_of(tmp_path, d.name) for d in dirs] == [[1, 2], [1, 2]]

    other = replace(cfg, lr=0.5)
    paths = generate_cluster("complete", 2, other, tmp_path / "peers2", ports=ports[:2],
                             control_ports=ports[2:], state_root=tmp_path)
    with pytest.raises(ConfigError, match=r"with other settings.*--fresh"):
        prepare_resume(dirs, {p.stem: p for p in paths})
