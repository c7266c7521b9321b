"""Asynchronous runs in ``report``: the Average of Acc over wall-clock time (a step function
over the nodes' latest accuracies), the time to an accuracy, and the time axis of the figure."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pytest

from dacflnode.records.metrics_log import METRICS_FILE, MetricsLine, append_line
from dacflnode.sim.report import (
    accuracy_over_time,
    figures,
    find_runs,
    is_async,
    time_to_accuracy,
)

T0 = 1_800_000_000.0


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def line(node: str, r: int, accuracy: float | None, at: float, seconds: float,
         **kw: Any) -> MetricsLine:
    values: dict[str, Any] = {
        "round": r, "node": node, "algorithm": "dacfl", "lr": 0.05, "train_loss": 1.0,
        "samples": 10, "accuracy": accuracy, "test_loss": 1.0, "consensus_residual": 0.1,
        "neighbours_used": [], "neighbours_missing": [], "alone_rounds": 0,
        "refused_states": 0, "bytes_sent": 0, "bytes_received": 0, "exchange_s": 0.0,
        "train_s": seconds, "seconds": seconds, "data_size": 10, "class_counts": {"a": 10},
        "time": T0 + at, **kw}
    return MetricsLine(**values)


def write_run(folder: Path, nodes: Mapping[str, Sequence[tuple[float | None, float, float]]],
              config: dict[str, Any] | None = None, **kw: Any) -> Path:
    """``nodes[node]``: (accuracy, time since T0, seconds) of each of its lines."""
    for node, points in nodes.items():
        (folder / node).mkdir(parents=True)
        for r, (acc, at, seconds) in enumerate(points, start=1):
            append_line(folder / node / METRICS_FILE, line(node, r, acc, at, seconds, **kw))
    if config is not None:
        (folder / "summary.json").write_text(json.dumps({"config": config}))
    return folder


#: node-0 reports at 1 s and 3 s, node-1 at 2 s and 4 s; both began at T0 (time - seconds).
STAGGERED = {"node-0": [(0.2, 1.0, 1.0), (0.6, 3.0, 2.0)],
             "node-1": [(0.4, 2.0, 2.0), (0.8, 4.0, 2.0)]}


def test_accuracy_over_time_steps_with_each_nodes_latest_once_every_node_has_reported(
        tmp_path):
    (run,) = find_runs([write_run(tmp_path / "async", STAGGERED)])
    curve = accuracy_over_time(run)
    assert curve["time"] == [2.0, 3.0, 4.0]  # not at 1 s: node-1 had no accuracy yet
    assert curve["avg_acc"] == pytest.approx([0.3, 0.5, 0.7])
    assert curve["var_acc"] == pytest.approx([0.01, 0.01, 0.01])


def test_nodes_reporting_at_the_same_time_make_one_point(tmp_path):
    same = {"node-0": [(0.2, 1.0, 1.0), (0.4, 2.0, 1.0)],
            "node-1": [(0.4, 1.0, 1.0), (0.6, 2.0, 1.0)]}
    (run,) = find_runs([write_run(tmp_path / "sync", same)])
    curve = accuracy_over_time(run)
    assert curve["time"] == [1.0, 2.0]
    assert curve["avg_acc"] == pytest.approx([0.3, 0.5])


def test_time_to_accuracy_is_seconds_from_the_start_until_the_mean_first_reaches_it(tmp_path):
    (run,) = find_runs([write_run(tmp_path / "async", STAGGERED)])
    assert time_to_accuracy(run, 0.3) == 2.0
    assert time_to_accuracy(run, 0.5) == 3.0
    assert time_to_accuracy(run, 0.65) == 4.0
    assert time_to_accuracy(run, 0.9) is None


def test_lines_without_time_have_no_time_to_accuracy(tmp_path):
    folder = tmp_path / "old" / "node-0"
    folder.mkdir(parents=True)
    old = {k: v for k, v in asdict(line("node-0", 1, 0.5, 1.0, 1.0)).items() if k != "time"}
    (folder / METRICS_FILE).write_text(json.dumps(old) + "\n")
    (run,) = find_runs([tmp_path / "old"])
    assert accuracy_over_time(run)["time"] == [] and time_to_accuracy(run, 0.1) is None


def test_a_run_is_async_by_its_settings_else_by_its_lines_counting_exchanges(tmp_path):
    configured = write_run(tmp_path / "configured", STAGGERED, {"schedule": "async"})
    unset = write_run(tmp_path / "unset", STAGGERED, {"nodes": 2})
    bare = write_run(tmp_path / "bare", STAGGERED, exchanges=3, staleness=1)
    assert [is_async(r) for r in find_runs([configured, unset, bare])] == [True, False, True]


def test_sync_and_async_runs_compared_share_a_time_axis(tmp_path):
    tight = {"node-0": [(0.2, 1.0, 1.0), (0.6, 2.0, 1.0)],
             "node-1": [(0.2, 1.0, 1.0), (0.6, 2.0, 1.0)]}
    sync = write_run(tmp_path / "sync", tight, {"nodes": 2, "schedule": "sync"})
    run_async = write_run(tmp_path / "async", STAGGERED, {"nodes": 2, "schedule": "async"})
    fig = figures(find_runs([sync, run_async]))["accuracy"]
    for ax in fig.axes:
        assert ax.get_xlabel() == "time (s)"
    lines = {str(ln.get_label()): ln for ln in fig.axes[0].get_lines()}
    assert sorted(lines) == ["DACFL schedule=async", "DACFL schedule=sync"]
    assert np.asarray(lines["DACFL schedule=async"].get_xdata()).tolist() == [2.0, 3.0, 4.0]
    assert np.asarray(lines["DACFL schedule=sync"].get_xdata()).tolist() == [1.0, 2.0]
    assert all(ln.get_drawstyle() == "steps-post" for ln in lines.values())


def test_sync_runs_alone_stay_on_rounds(tmp_path):
    sync = write_run(tmp_path / "sync", STAGGERED, {"nodes": 2})
    (ax, _) = figures(find_runs([sync]))["accuracy"].axes
    assert ax.get_xlabel() == "round"
    assert np.asarray(ax.get_lines()[0].get_xdata()).tolist() == [1, 2]


def test_an_async_run_whose_lines_carry_no_time_falls_back_to_rounds(tmp_path):
    folder = tmp_path / "old"
    write_run(folder, STAGGERED, {"nodes": 2, "schedule": "async"})
    for node in STAGGERED:  # rewrite the lines as files written before they carried time
        path = folder / node / METRICS_FILE
        kept = [{k: v for k, v in json.loads(raw).items() if k != "time"}
                for raw in path.read_text().splitlines()]
        path.write_text("".join(json.dumps(x) + "\n" for x in kept))
    (ax, _) = figures(find_runs([folder]))["accuracy"].axes
    assert ax.get_xlabel() == "round"
