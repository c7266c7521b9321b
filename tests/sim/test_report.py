"""Which runs ``report`` finds below a folder, what it says about them, and the files it draws."""

import json
import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from dacflnode.records.metrics_log import METRICS_FILE, MetricsLine, append_line, summarize
from dacflnode.sim.report import (
    ReportError,
    build_report,
    figure_labels,
    find_runs,
    write_figures,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def line(node: str, r: int, algorithm: str = "dacfl", **kw: Any) -> MetricsLine:
    base: dict[str, Any] = {
        "round": r, "node": node, "algorithm": algorithm, "lr": 0.05, "train_loss": 2.0 / r,
        "samples": 100, "accuracy": 0.1 * r + 0.01 * int(node[-1]), "test_loss": 1.0,
        "consensus_residual": 1.0 / r, "neighbours_used": [], "neighbours_missing": [],
        "alone_rounds": 0, "refused_states": 0, "bytes_sent": 1000 * r, "bytes_received": 900,
        "exchange_s": 0.01, "train_s": 0.1,
        "seconds": 0.1 * r,
        "data_size": 30 + int(node[-1]), "class_counts": {"a": 10, "b": 20 + int(node[-1])},
        "time": 1_800_000_000.0 + 0.1 * r,
    }
    base.update(kw)
    return MetricsLine(**base)


def write_node(folder: Path, node: str, rounds: int, algorithm: str = "dacfl") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / METRICS_FILE).touch()
    for r in range(1, rounds + 1):
        append_line(folder / METRICS_FILE, line(node, r, algorithm))
    return folder


def test_a_launch_folder_is_one_run_labelled_by_its_name(tmp_path):
    dirs = [write_node(tmp_path / "cluster" / f"node-{i}", f"node-{i}", 3) for i in range(3)]
    (run,) = find_runs([tmp_path / "cluster"])
    assert (run.label, run.algorithm, list(run.lines)) == (
        "cluster", "dacfl", ["node-0", "node-1", "node-2"])
    assert list(run.node_dirs) == dirs


def test_node_ids_sort_numerically(tmp_path):
    for i in (10, 2, 1):
        write_node(tmp_path / f"node-{i}", f"node-{i}", 1)
    (run,) = find_runs([tmp_path])
    assert list(run.lines) == ["node-1", "node-2", "node-10"]


def test_a_simulate_folder_of_several_algorithms_is_one_run_each(tmp_path):
    for alg in ("dacfl", "cdsgd"):
        for i in range(2):
            write_node(tmp_path / "sim" / alg / f"node-{i}", f"node-{i}", 2, alg)
    runs = find_runs([tmp_path / "sim"])
    assert [(r.label, r.algorithm) for r in runs] == [("sim/cdsgd", "cdsgd"),
                                                      ("sim/dacfl", "dacfl")]


def test_state_directories_copied_off_devices_are_one_run(tmp_path):
    write_node(tmp_path / "states" / "pi-1", "node-0", 2)
    write_node(tmp_path / "states" / "pi-2" / "var" / "dacflnode", "node-1", 2)
    (run,) = find_runs([tmp_path / "states"])
    assert run.label == "states" and list(run.lines) == ["node-0", "node-1"]


def test_several_runs_of_one_algorithm_are_split_by_their_folder(tmp_path):
    for setting in ("iid", "shards"):
        for i in range(2):
            write_node(tmp_path / "paper" / setting / "dacfl" / f"node-{i}", f"node-{i}", 2)
    runs = find_runs([tmp_path / "paper"])
    assert [r.label for r in runs] == ["paper/iid/dacfl", "paper/shards/dacfl"]
    assert all(len(r.node_dirs) == 2 for r in runs)


def test_two_copies_of_a_node_in_one_folder_are_refused_with_what_to_do(tmp_path):
    write_node(tmp_path / "mixed" / "a", "node-0", 1)
    write_node(tmp_path / "mixed" / "b", "node-0", 1)
    with pytest.raises(ReportError, match=r"several runs of dacfl .*node-0.*each run's folder"):
        find_runs([tmp_path / "mixed"])


def test_a_node_without_lines_yet_belongs_to_its_siblings_run(tmp_path):
    write_node(tmp_path / "node-0", "node-0", 2)
    (tmp_path / "node-1").mkdir()
    (tmp_path / "node-1" / METRICS_FILE).write_text("")
    (run,) = find_runs([tmp_path])
    assert list(run.lines) == ["node-0", "node-1"]
    assert run.row()["rounds"] == 0 and run.row()["avg_acc"] is None


def test_folders_of_the_same_name_are_labelled_by_their_path(tmp_path):
    for parent in ("a", "b"):
        write_node(tmp_path / parent / "out" / "node-0", "node-0", 1)
    runs = find_runs([tmp_path / "a" / "out", tmp_path / "b" / "out"])
    assert [r.label for r in runs] == [str(tmp_path / "a" / "out"), str(tmp_path / "b" / "out")]


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing", "does not exist"),
    (lambda p: p, f"no {METRICS_FILE} found under"),
])
def test_a_folder_without_metrics_names_what_to_give(tmp_path, make, message):
    with pytest.raises(ReportError, match=message) as info:
        find_runs([make(tmp_path)])
    assert "launch" in str(info.value) and "simulate" in str(info.value)


def test_a_running_cluster_counts_the_rounds_every_node_has_written(tmp_path):
    dirs = [write_node(tmp_path / "node-0", "node-0", 5),
            write_node(tmp_path / "node-1", "node-1", 3)]
    (run,) = find_runs([tmp_path])
    row = run.row()
    expected = summarize(dirs, "dacfl", 0.0, engine="x")
    assert row["rounds"] == 3 and row["final_round"] == 3
    assert (row["avg_acc"], row["var_acc"]) == (expected["final"]["avg_acc"],
                                                expected["final"]["var_acc"])
    assert row["curve"]["avg_acc"] == expected["avg_acc"]
    assert row["mean_round_s"] == pytest.approx(0.2)  # rounds 1-3 of both nodes: 0.1, 0.2, 0.3


@pytest.mark.slow
def test_figures_are_valid_png_and_svg_with_a_line_per_run(tmp_path):
    for name in ("first", "second"):
        for i in range(2):
            write_node(tmp_path / name / f"node-{i}", f"node-{i}", 3)
    report = build_report([tmp_path / "first", tmp_path / "second"], tmp_path / "out")
    files = [Path(f) for f in report["files"]]
    assert sorted(f.name for f in files) == ["accuracy.png", "accuracy.svg", "nodes.png",
                                             "nodes.svg"]
    for f in files:
        if f.suffix == ".png":
            assert f.read_bytes()[:8] == PNG_SIGNATURE
        else:
            assert ET.parse(f).getroot().tag == "{http://www.w3.org/2000/svg}svg"
    text = (tmp_path / "out" / "accuracy.svg").read_text()
    assert "first" in text and "second" in text and "Var of Acc" in text
    assert "consensus residual" in (tmp_path / "out" / "nodes.svg").read_text()


@pytest.mark.slow
def test_figures_are_drawn_for_runs_without_accuracy_or_residual(tmp_path):
    folder = tmp_path / "node-0"
    folder.mkdir()
    for r in (1, 2):
        append_line(folder / METRICS_FILE, line("node-0", r, accuracy=None,
                                                consensus_residual=float("nan")))
    runs = find_runs([tmp_path])
    assert runs[0].row()["consensus_residual"] is None
    assert all(p.stat().st_size > 0 for p in write_figures(runs, tmp_path / "out"))


def test_a_run_row_carries_each_nodes_data_and_latest_accuracy(tmp_path):
    for i in range(2):
        write_node(tmp_path / "cluster" / f"node-{i}", f"node-{i}", 3)
    (run,) = find_runs([tmp_path / "cluster"])
    assert run.row()["per_node"] == [
        {"node": "node-0", "data_size": 30, "class_counts": {"a": 10, "b": 20},
         "accuracy": pytest.approx(0.3)},
        {"node": "node-1", "data_size": 31, "class_counts": {"a": 10, "b": 21},
         "accuracy": pytest.approx(0.31)},
    ]


def test_lines_written_before_they_carried_the_data_report_none(tmp_path):
    folder = tmp_path / "old" / "node-0"
    folder.mkdir(parents=True)
    old = {k: v for k, v in asdict(line("node-0", 1)).items()
           if k not in ("data_size", "class_counts")}
    (folder / METRICS_FILE).write_text(json.dumps(old) + "\n")
    (run,) = find_runs([tmp_path / "old"])
    assert run.row()["per_node"][0]["data_size"] is None


def write_run(folder: Path, config: dict[str, Any] | None, nodes: int = 2, rounds: int = 2,
              algorithm: str = "dacfl") -> Path:
    """A run folder: its nodes' metrics and, with ``config``, the summary.json `simulate`
    writes."""
    for i in range(nodes):
        write_node(folder / f"node-{i}", f"node-{i}", rounds, algorithm)
    if config is not None:
        (folder / "summary.json").write_text(json.dumps({"config": {"nodes": nodes, **config}}))
    return folder


def labels_of(*folders: Path) -> dict[str, str]:
    return figure_labels(find_runs(folders))[1]


def test_runs_are_labelled_by_the_settings_that_differ_preferred_ones_first(tmp_path):
    base = {"dataset": "synthetic", "topology": "ring", "lr": 0.05, "seed": 0}
    a = write_run(tmp_path / "a", {**base, "compression": "int8", "lr": 0.1})
    b = write_run(tmp_path / "b", {**base, "schedule": "async", "staleness": 2})
    assert labels_of(a, b) == {"a": "DACFL schedule=sync, compression=int8, lr=0.1",
                               "b": "DACFL schedule=async, compression=none, lr=0.05"}


def test_a_missing_schedule_is_sync_and_a_missing_slowdown_none(tmp_path):
    sync = write_run(tmp_path / "sync", {"topology": "ring"})
    slow = write_run(tmp_path / "slow", {"topology": "ring", "schedule": "async",
                                         "slowdown": {"node-0": 4.0}})
    assert labels_of(sync, slow) == {"sync": "DACFL schedule=sync, slowdown=none",
                                     "slow": "DACFL schedule=async, slowdown=node-0×4"}
    unslowed = write_run(tmp_path / "unslowed", {"topology": "ring", "slowdown": 1.0})
    assert labels_of(sync, unslowed) == {"sync": "DACFL (sync)", "unslowed": "DACFL (unslowed)"}


def test_launched_arms_that_differ_in_their_round_deadline_are_named_by_it(tmp_path):
    loose = write_run(tmp_path / "loose", {"topology": "ring", "round_deadline": 600.0})
    tight = write_run(tmp_path / "tight", {"topology": "ring", "round_deadline": 1.567})
    assert labels_of(loose, tight) == {"loose": "DACFL round_deadline=600",
                                       "tight": "DACFL round_deadline=1.567"}


def test_bookkeeping_and_settings_that_cannot_change_a_run_are_not_named(tmp_path):
    a = write_run(tmp_path / "a", {"partition": "iid", "dirichlet_alpha": 0.1,
                                   "data_root": "/x", "threads": 2})
    b = write_run(tmp_path / "b", {"partition": "iid", "dirichlet_alpha": 0.9,
                                   "data_root": "/y", "threads": 4})
    assert labels_of(a, b) == {"a": "DACFL (a)", "b": "DACFL (b)"}  # nothing differs: folders


def test_runs_without_settings_are_told_apart_by_node_count_else_their_folder(tmp_path):
    small = write_run(tmp_path / "small", None, nodes=2)
    large = write_run(tmp_path / "large", None, nodes=3)
    twin = write_run(tmp_path / "twin", None, nodes=3)
    assert labels_of(small, large) == {"small": "DACFL nodes=2", "large": "DACFL nodes=3"}
    assert labels_of(large, twin) == {"large": "DACFL (large)", "twin": "DACFL (twin)"}


def test_runs_of_several_algorithms_are_named_by_algorithm_only_where_nothing_else_differs(
        tmp_path):
    for alg in ("dacfl", "cdsgd"):
        for i in range(2):
            write_node(tmp_path / "sim" / alg / f"node-{i}", f"node-{i}", 2, alg)
    (tmp_path / "sim" / "summary.json").write_text(json.dumps({"config": {"nodes": 2}}))
    assert labels_of(tmp_path / "sim") == {"sim/cdsgd": "CDSGD", "sim/dacfl": "DACFL"}


def test_a_cluster_built_by_hand_is_titled_by_its_folder_algorithm_and_nodes(tmp_path):
    title, labels = figure_labels(find_runs([write_run(tmp_path / "pi-cluster", None, 3)]))
    assert (title, labels) == ("pi-cluster · DACFL · 3 nodes", {"pi-cluster": "DACFL"})


def test_an_asynchronous_setting_shared_by_all_runs_is_in_the_title(tmp_path):
    a = write_run(tmp_path / "a", {"schedule": "async", "staleness": 2, "compression": "int8"})
    b = write_run(tmp_path / "b", {"schedule": "async", "staleness": 2, "compression": "none"})
    title, labels = figure_labels(find_runs([a, b]))
    assert title == "2 nodes · asynchronous, staleness ≤ 2"
    assert labels == {"a": "DACFL compression=int8", "b": "DACFL compression=none"}
