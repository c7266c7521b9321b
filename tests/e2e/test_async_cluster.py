"""A real multi-process cluster under ``schedule: async``: a slowed node sets only its own
pace, every block is trained, and the daemons' checkpoints keep ``Σ x = Σ τ``."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from dacflnode.cli.main import cli
from dacflnode.cluster.launcher import launch
from dacflnode.records.metrics_log import METRICS_FILE, read_metrics
from tests.harness.cluster import TINY

pytestmark = pytest.mark.slow


def test_an_async_cluster_with_a_slowed_node_ends_settled_with_its_invariant(tmp_path):
    cfg = replace(TINY, nodes=4, rounds=4, topology="ring", schedule="async", threads=1)
    launched = launch(cfg, tmp_path / "cluster", round_deadline=30,
                      slowdown={"node-0": 3.0})
    assert launched["config"]["schedule"] == "async"
    assert launched["config"]["slowdown"] == {"node-0": 3.0}
    dirs = [tmp_path / "cluster" / f"node-{i}" for i in range(4)]
    for d in dirs:
        lines = read_metrics(d / METRICS_FILE)
        assert [line["round"] for line in lines] == [1, 2, 3, 4]
        times = [line["time"] for line in lines]
        assert times == sorted(times)  # unix seconds, in the order written
        assert all(line["exchanges"] is not None for line in lines)
        journal = (d / "exchanges.jsonl").read_text().splitlines()
        events = [json.loads(raw)["event"] for raw in journal]
        assert events.count("fold") == 4 and events[-1] == "settle"
    # the slowed node paused after its training: its blocks took longer than the others'
    slow = read_metrics(dirs[0] / METRICS_FILE)
    fast = read_metrics(dirs[2] / METRICS_FILE)
    assert sum(x["seconds"] for x in slow) > sum(x["seconds"] for x in fast)
    checked = CliRunner().invoke(cli, ["invariant", "--json", *map(str, dirs)],
                                 catch_exceptions=False)
    report = json.loads(checked.stdout)
    assert report["holds"] is True and report["resolved_residual"] < 2e-6, report
    # the replay of the daemons' journals ends with their models
    replayed = CliRunner().invoke(cli, ["simulate", "--replay", str(tmp_path / "cluster"),
                                        "--json"], catch_exceptions=False)
    result = json.loads(replayed.stdout)
    assert result["blocks"] == dict.fromkeys(result["nodes"], 4)
    assert result["max_abs_diff"] <= 1e-6, result


@pytest.mark.parametrize("compression,tls", [("int8", False), ("topk:0.1", False),
                                             ("none", True)])
def test_compressed_and_tls_async_clusters_keep_the_invariant(tmp_path, compression, tls):
    """The same daemons with compressed exchanges (snapshot deltas and transfers over gRPC)
    and with mutual TLS: every block trained, and ``Σ x = Σ τ`` on the checkpoints."""
    cfg = replace(TINY, nodes=4, rounds=4, topology="ring", schedule="async", threads=1,
                  compression=compression)
    launch(cfg, tmp_path / "cluster", round_deadline=30, slowdown={"node-0": 2.0},
           tls_dir=tmp_path / "certs" if tls else None)
    dirs = [tmp_path / "cluster" / f"node-{i}" for i in range(4)]
    for d in dirs:
        lines = read_metrics(d / METRICS_FILE)
        assert [line["round"] for line in lines] == [1, 2, 3, 4]
        assert sum(line["exchanges"] for line in lines) >= 4  # mixed, not refused
        assert "refused" not in (d / "daemon.log").read_text()
    checked = CliRunner().invoke(cli, ["invariant", "--json", *map(str, dirs)],
                                 catch_exceptions=False)
    report = json.loads(checked.stdout)
    assert report["holds"] is True and report["resolved_residual"] < 2e-6, report
