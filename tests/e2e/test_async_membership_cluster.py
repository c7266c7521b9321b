"""Nodes coming and going under ``schedule: async``, on real daemons (docs/algorithm.md,
"A restart", "Leaving"): a node killed with ``kill -9`` in the middle of a block, and started
again from its last checkpoint, reconciles its edges with its neighbours and trains the blocks
it has left; a node drained with ``stop --drain`` hands each neighbour its share of their edge
and exits 0. Either way the daemons' checkpoints keep ``Σ x = Σ τ`` to 2e-6 over the nodes
that stay, as the healthy run's do."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from dacflnode.cli.main import cli
from dacflnode.peers.file import load_peers
from dacflnode.transport.grpc_control import request_stop
from tests.harness.cluster import Cluster, cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROUNDS = 10


def slow_down(c: Cluster, i: int, factor: float) -> None:
    """Node ``i`` trains ``factor`` times slower (its own ``run.slowdown``, not fingerprinted)."""
    data = yaml.safe_load(c.paths[i].read_text())
    data["run"]["slowdown"] = factor
    c.paths[i].write_text(yaml.safe_dump(data, sort_keys=False))


def journal(c: Cluster, i: int) -> list[dict[str, object]]:
    lines = (c.state_dir(i) / "exchanges.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def invariant(c: Cluster) -> dict[str, Any]:
    checked = CliRunner().invoke(
        cli, ["invariant", "--json", *(str(c.state_dir(i)) for i in range(len(c.ids)))],
        catch_exceptions=False)
    report: dict[str, Any] = json.loads(checked.stdout)
    return report


def test_a_killed_async_daemon_restarts_reconciles_its_edges_and_the_sum_stays_exact(tmp_path):
    with cluster(tmp_path, 4, ROUNDS, schedule="async", threads=1, eval_every=5) as c:
        # node-1's blocks take long enough to kill it inside one, its neighbours' do not
        slow_down(c, 1, 40.0)
        c.start(0, 1, 2, 3)
        c.wait_for_round(1, 3)
        c.kill(1)
        before = [e["event"] for e in journal(c, 1)]
        c.start(1)
        assert c.wait() == [0] * 4, c.logs(range(4))
        c.assert_finished([0, 2, 3])
        rounds = [int(m["round"]) for m in c.metrics(1)]
        assert rounds[-1] == ROUNDS and sorted(set(rounds)) == list(range(1, ROUNDS + 1))
        after = journal(c, 1)[len(before):]
        assert after[0]["event"] == "restart" and after[0]["epoch"] == 1
        adopted = sorted(str(e["peer"]) for e in after if e["event"] == "adopt")
        assert adopted == ["node-0", "node-2"]
        for i in (0, 2):  # each neighbour answered the reconciliation, and refuses old ids
            assert any(e["event"] == "reconcile" and e["peer"] == "node-1"
                       and e["floor"] == 1 << 32 for e in journal(c, i))
        report = invariant(c)
        assert report["holds"] is True and report["resolved_residual"] < 2e-6, report
        # the journals, the lost process's steps included, replay to the daemons' models
        assert replayed(c)["max_abs_diff"] <= 1e-6


def replayed(c: Cluster) -> dict[str, Any]:
    """``simulate --replay`` of the cluster, as a user runs it (its run settings written as
    ``launch`` writes them)."""
    run = load_peers(c.paths[0]).run
    (c.root / "summary.json").write_text(json.dumps({"config": run.to_json()}))
    out = subprocess.run([sys.executable, "-m", "dacflnode", "simulate", "--replay",
                          str(c.root), "--json"], capture_output=True, text=True, check=True,
                         timeout=120)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


async def test_a_drained_async_daemon_hands_its_edges_over_and_the_others_finish_exact(
        tmp_path):
    with cluster(tmp_path, 4, ROUNDS, schedule="async", threads=1, eval_every=5) as c:
        slow_down(c, 2, 40.0)
        c.start(0, 1, 2, 3)
        c.wait_for_round(2, 2)
        assert await request_stop(c.control_address(2), auth=c.control_auth(2), drain=True)
        assert c.wait() == [0] * 4, c.logs(range(4))
        c.assert_finished([0, 1, 3])
        events = journal(c, 2)
        handed = sorted(str(e["peer"]) for e in events if e["event"] == "handover")
        assert handed == ["node-1", "node-3"]
        for i in (1, 3):
            assert [e["peer"] for e in journal(c, i) if e["event"] == "handed"] == ["node-2"]
        report = invariant(c)
        assert report["holds"] is True and report["resolved_residual"] < 2e-6, report
        assert report["left"] == ["node-2"] and "node-2" not in report["nodes"], report
        assert replayed(c)["max_abs_diff"] <= 1e-6


async def test_a_stopped_async_daemon_started_again_and_a_late_one_end_exact(tmp_path):
    """``dacflnode stop`` (no drain) of a node mid-run, and its start again from its
    checkpoint; and a node whose daemon starts only once the others are blocks in: every node
    trains all its blocks and the checkpoints keep ``Σ x = Σ τ``."""
    # (a daemon waits hello_timeout for its neighbours at its start, then goes on without
    # those that are not up: they join when they come)
    with cluster(tmp_path, 4, ROUNDS, schedule="async", threads=1, eval_every=5,
                 hello_timeout=3.0) as c:
        slow_down(c, 1, 40.0)
        c.start(0, 1, 2)
        c.wait_for_round(0, 3)
        c.start(3)  # late: its neighbours are blocks ahead and wait for it at their end
        c.wait_for_round(1, 2)
        assert await request_stop(c.control_address(1), auth=c.control_auth(1))
        assert c.wait([1], timeout=60) == [0]
        stopped_at = c.done(1)
        c.start(1)
        assert c.wait() == [0] * 4, c.logs(range(4))
        c.assert_finished([0, 2, 3])
        rounds = [int(m["round"]) for m in c.metrics(1)]
        assert rounds[-1] == ROUNDS and stopped_at < ROUNDS
        assert any(e["event"] == "restart" for e in journal(c, 1))
        report = invariant(c)
        assert report["holds"] is True and report["resolved_residual"] < 2e-6, report
