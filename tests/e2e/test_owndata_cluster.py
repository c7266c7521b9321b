"""Real daemons on their own data: image folders and CSV tables per node, the simulator on the
same folders, and a node whose class list differs refused at the handshake."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
import yaml
from safetensors import safe_open

from dacflnode.cluster.launcher import free_ports, launch
from dacflnode.config import RunConfig
from dacflnode.learning.feature_scale import FeatureScale
from dacflnode.peers.generate import generate_cluster
from dacflnode.protocol.scale_agreement import SCALE_FILE
from dacflnode.records.checkpoint import CHECKPOINT
from dacflnode.records.metrics_log import read_metrics
from dacflnode.sim.experiment import run_experiment
from tests.harness import preloaded
from tests.harness.cluster import (
    ENV,
    HELLO_REFUSED,
    assert_one_line_failure,
    max_diff,
    run_nodes,
)
from tests.harness.owndata import CLASSES, MIX, write_csv_nodes, write_png_nodes

pytestmark = pytest.mark.slow

#: Own PNG folders of 8x8 images: the default model for one-channel images (fmnist-cnn) and the
#: default learning rate, no model setting.
FOLDERS = RunConfig(dataset="folder", classes=CLASSES, image_size=8, nodes=3, rounds=2,
                    topology="ring", device="cpu", engine="sequential")


def test_launch_on_own_folders_ends_with_the_simulators_models(tmp_path):
    train, test = write_png_nodes(tmp_path / "data")
    cfg = replace(FOLDERS, data_root=str(train), test_root=str(test))
    launched = launch(cfg, tmp_path / "cluster", round_deadline=60)
    simulated = run_experiment(cfg, tmp_path / "sim")
    for node, counts in MIX.items():
        diff = max_diff(tmp_path / "cluster" / node / "final.safetensors",
                        tmp_path / "sim" / node / "final.safetensors")
        assert diff <= 1e-6, (node, diff)
        cluster_lines = read_metrics(tmp_path / "cluster" / node / "metrics.jsonl")
        sim_lines = read_metrics(tmp_path / "sim" / node / "metrics.jsonl")
        assert [tuple(x) for x in cluster_lines] == [tuple(x) for x in sim_lines]
        expected = {c: counts.get(c, 0) for c in CLASSES}
        for c, s in zip(cluster_lines, sim_lines, strict=True):
            # every node trains one epoch of its own, unequal data: the real counts
            assert c["samples"] == s["samples"] == sum(counts.values())
            assert c["data_size"] == s["data_size"] == sum(counts.values())
            assert c["class_counts"] == s["class_counts"] == expected
    assert simulated["dataset"]["samples_per_node"] == [sum(m.values()) for m in MIX.values()]
    assert launched["algorithms"]["dacfl"]["rounds"] == [1, 2]
    # the decoded images are cached in each node's state folder
    assert any((tmp_path / "cluster" / "node-0").rglob("*.npy"))


def test_three_daemons_on_csv_tables_learn(tmp_path):
    train, test = write_csv_nodes(tmp_path / "data")
    cfg = RunConfig(dataset="table", classes=CLASSES, label_column="kind", nodes=3, rounds=6,
                    topology="ring", device="cpu", lr=0.1, batch_size=8,
                    data_root=str(train), test_root=str(test))
    summary = launch(cfg, tmp_path / "cluster", round_deadline=60)
    final = summary["algorithms"]["dacfl"]["final"]
    assert final["round"] == 6
    assert final["avg_acc"] >= 0.8, final  # three well-separated classes, chance is 1/3
    lines = read_metrics(tmp_path / "cluster" / "node-0" / "metrics.jsonl")
    assert lines[-1]["class_counts"] == {"cat": 14, "dog": 4, "eel": 0}


def test_daemons_on_tables_agree_on_one_feature_scale_and_end_with_the_simulators_models(
        tmp_path):
    train, test = write_csv_nodes(tmp_path / "data")
    cfg = RunConfig(dataset="table", classes=CLASSES, label_column="kind", nodes=3, rounds=2,
                    topology="ring", device="cpu", engine="sequential", data_root=str(train),
                    test_root=str(test))
    launch(cfg, tmp_path / "cluster", round_deadline=60)
    simulated = run_experiment(cfg, tmp_path / "sim")
    scales = set()
    for node in MIX:
        folder = tmp_path / "cluster" / node
        saved = (folder / SCALE_FILE).read_text()
        with safe_open(str(folder / CHECKPOINT), "pt") as checkpoint:
            assert checkpoint.metadata()["feature_scale"] == saved
        scales.add(saved)
        diff = max_diff(folder / "final.safetensors",
                        tmp_path / "sim" / node / "final.safetensors")
        assert diff <= 1e-6, (node, diff)
    (agreed,) = scales  # one scale, bit for bit, on every daemon
    scale = FeatureScale.from_json(agreed)
    assert scale.method == "standardize" and scale.columns == (0, 1, 2, 3)
    assert simulated["dataset"]["feature_scale"]["digest"] == scale.digest
    assert sum(scale.count) == 4 * sum(sum(m.values()) for m in MIX.values())


def test_a_daemon_with_another_class_list_is_refused_naming_the_difference(tmp_path):
    mix = {"node-0": {"cat": 4, "dog": 4}, "node-1": {"cat": 4, "dog": 4}}
    train, _ = write_png_nodes(tmp_path / "data", mix)
    ports = free_ports(4)
    cfg = replace(FOLDERS, nodes=2, rounds=1, data_root=str(train), topology="complete")
    paths = generate_cluster("complete", 2, cfg, tmp_path / "peers", ports=ports[:2],
                             control_ports=ports[2:], state_root=tmp_path, round_deadline=20,
                             hello_timeout=HELLO_REFUSED)
    other = yaml.safe_load(paths[1].read_text())
    other["run"]["classes"] = ["cat", "dog"]
    paths[1].write_text(yaml.safe_dump(other))
    codes, outputs = run_nodes(paths, tmp_path, timeout=120)
    assert codes == [1, 1], outputs
    # whichever node refuses names the other's class list and its own
    said = ("node-1 refuses node-0: node-0 has classes ['cat', 'dog', 'eel'], this run"
            " ['cat', 'dog']",
            "node-0 refuses node-1: node-1 has classes ['cat', 'dog'], this run"
            " ['cat', 'dog', 'eel']")
    for output in outputs:
        assert any(line in output for line in said), output


def test_a_corrupt_png_stops_launch_with_one_line_naming_it(tmp_path):
    train, test = write_png_nodes(tmp_path / "data")
    bad = train / "node-2" / "eel" / "000.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    proc = subprocess.run(
        [sys.executable, "-m", "dacflnode", "simulate", "--dataset", "folder", "--classes",
         ",".join(CLASSES), "--image-size", "8", "--nodes", "3", "--rounds", "1",
         "--topology", "ring", "--data-root", str(train), "--test-root", str(test), "--quiet"],
        capture_output=True, text=True, timeout=120, env=ENV)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "bad_files: skip" in lines[0], lines
    assert "Traceback" not in proc.stderr


def test_a_daemon_whose_folder_holds_a_corrupt_png_exits_2_with_one_line(tmp_path):
    train, _ = write_png_nodes(tmp_path, {"node-0": {"cat": 3, "dog": 2}})
    bad = train / "node-0" / "dog" / "001.png"
    bad.write_bytes(b"not a png at all")
    peers = train / "node-0.yaml"  # beside the data: the state folder is the data folder
    peers.write_text(yaml.safe_dump({
        "node": {"id": "node-0", "listen": f"127.0.0.1:{free_ports(1)[0]}",
                 "data_root": "node-0"},
        "neighbours": [{"id": "node-1", "address": "127.0.0.1:1"}],
        "run": {"dataset": "folder", "classes": list(CLASSES), "image_size": 8, "nodes": 2},
    }))
    proc = preloaded.run("start", "--peers", str(peers), env=ENV, timeout=120)
    assert_one_line_failure(proc, peers, str(bad), "bad_files: skip")


def test_bad_files_skip_leaves_the_corrupt_png_out_and_counts_it(tmp_path):
    train, test = write_png_nodes(tmp_path / "data")
    (train / "node-1" / "dog" / "000.png").write_bytes(b"garbage")
    cfg = replace(FOLDERS, data_root=str(train), test_root=str(test), rounds=1,
                  bad_files="skip", model="tiny-cnn")
    summary = run_experiment(cfg, tmp_path / "sim")
    sizes = [sum(m.values()) for m in MIX.values()]
    assert summary["dataset"]["samples_per_node"] == [sizes[0], sizes[1] - 1, sizes[2]]
