"""The simulator on each node's own data: per-node folders, unequal sizes in FedAvg's weights,
the held-out test fraction, and the batched engine with a test set per node."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dacflnode.assembly.data import own_node_data
from dacflnode.config import RunConfig
from dacflnode.errors import ConfigError
from dacflnode.records.metrics_log import read_metrics
from dacflnode.sim.experiment import run_experiment
from dacflnode.sim.simulator import Simulation
from tests.harness.owndata import CLASSES, MIX, write_csv_nodes, write_png_nodes

pytestmark = pytest.mark.slow

BASE = RunConfig(dataset="folder", classes=CLASSES, image_size=8, nodes=3, rounds=1,
                 topology="ring", device="cpu", model="tiny-cnn", lr=0.05)


def test_fedavg_weighs_each_node_by_its_real_number_of_samples(tmp_path):
    train, test = write_png_nodes(tmp_path / "data")
    cfg = replace(BASE, algorithm=("fedavg",), data_root=str(train), test_root=str(test))
    shares = [own_node_data(cfg.for_node(f"node-{i}"), None) for i in range(3)]
    sim = Simulation(cfg, "fedavg", None, None, own=shares)
    sizes = np.array([sum(m.values()) for m in MIX.values()], dtype=np.float64)
    np.testing.assert_allclose(sim.data_weights, sizes / sizes.sum())
    assert [s.info.size for s in shares] == sizes.tolist()


def test_without_a_test_root_each_node_evaluates_on_its_held_out_fraction(tmp_path):
    train, _ = write_png_nodes(tmp_path / "data")
    cfg = replace(BASE, data_root=str(train), holdout=0.25)
    summary = run_experiment(cfg, tmp_path / "sim")
    sizes = [sum(m.values()) for m in MIX.values()]
    held = [max(1, round(0.25 * n)) for n in sizes]
    assert summary["dataset"]["test_per_node"] == held
    assert summary["dataset"]["samples_per_node"] == [n - h for n, h in zip(sizes, held,
                                                                              strict=True)]
    line = read_metrics(tmp_path / "sim" / "node-0" / "metrics.jsonl")[-1]
    assert line["data_size"] == sizes[0] - held[0] and line["accuracy"] is not None


def test_the_batched_engine_evaluates_each_node_on_its_own_test_set(tmp_path):
    mix = {f"node-{i}": {"cat": 6, "dog": 6} for i in range(3)}  # equal sizes: batchable
    train, _ = write_png_nodes(tmp_path / "data", mix)
    # a test folder per node (T/<node-id>/<class>/), each of other classes and sizes
    tests, _ = write_png_nodes(tmp_path / "t", {"node-0": {"cat": 4}, "node-1": {"dog": 3},
                                                "node-2": {"cat": 2, "eel": 5}}, seed=7)
    runs = {}
    for engine in ("batched", "sequential"):
        cfg = replace(BASE, classes=("cat", "dog", "eel"), data_root=str(train), rounds=2,
                      test_root=str(tests), engine=engine, eval_every=1)
        runs[engine] = run_experiment(cfg, tmp_path / engine)["algorithms"]["dacfl"]
    assert runs["batched"]["engine"] == "batched"
    assert runs["batched"]["avg_acc"] == pytest.approx(runs["sequential"]["avg_acc"], abs=1e-6)


def test_nodes_whose_tables_have_other_features_are_refused_before_training(tmp_path):
    train, _ = write_csv_nodes(tmp_path / "data")
    csv = train / "node-2" / "data.csv"
    csv.write_text(csv.read_text().replace("f3", "g3", 1))
    cfg = replace(BASE, dataset="table", label_column="kind", model=None, data_root=str(train),
                  test_root=None)
    with pytest.raises(ConfigError) as err:
        run_experiment(cfg)
    assert "node-2 has feature names ['f0', 'f1', 'f2', 'g3']" in err.value.message


FACTORY = '''
from pathlib import Path

import torch


def device_data(data_root, seed):
    """This device's samples: as many as its folder's count.txt says, 4 features, 2 classes."""
    n = int((Path(data_root) / "count.txt").read_text())
    g = torch.Generator().manual_seed(seed + n)
    y = torch.arange(n) % 2
    x = torch.randn(n, 4, generator=g) + 3.0 * y[:, None]
    return (x, y), None
'''


def test_a_python_factory_gets_each_nodes_own_data_root(tmp_path, monkeypatch):
    (tmp_path / "mydevices.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    for i, n in enumerate((12, 30, 20)):
        (tmp_path / "roots" / f"node-{i}").mkdir(parents=True)
        (tmp_path / "roots" / f"node-{i}" / "count.txt").write_text(str(n))
    cfg = replace(BASE, dataset="python", classes=("even", "odd"), model=None,
                  data_factory="mydevices:device_data", data_root=str(tmp_path / "roots"),
                  holdout=0.25)
    summary = run_experiment(cfg, tmp_path / "sim")
    assert summary["dataset"]["samples_per_node"] == [9, 22, 15]  # 3/4 of 12, 30, 20 (rounded)
    assert summary["dataset"]["contract"]["input_shape"] == [4]
