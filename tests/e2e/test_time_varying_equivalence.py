"""The README's time-varying example, small: `launch` (real daemons over gRPC on 127.0.0.1) and
`simulate --engine sequential` on a random 3-regular graph whose edges change every round end
with the same models bit for bit, and the same curves, when both train with the same number of
PyTorch threads (``threads``); the thread count is the one thing the two must share beyond the
run file (a different count changes the order of float sums inside the layers)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch

from dacflnode.cluster.launcher import launch
from dacflnode.records.metrics_log import read_metrics
from dacflnode.sim.experiment import run_experiment
from tests.harness.cluster import TINY, max_diff

pytestmark = pytest.mark.slow


@pytest.fixture
def restore_torch_threads() -> Iterator[None]:
    """The simulator sets this process's thread count to the run's ``threads``; put it back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("restore_torch_threads")
def test_launch_equals_simulate_bit_for_bit_on_a_time_varying_graph_with_equal_threads(tmp_path):
    cfg = replace(TINY, nodes=6, rounds=3, topology="random-regular", degree=3,
                  time_varying=1, drop_prob=0.5, engine="sequential", threads=1)
    launched = launch(cfg, tmp_path / "cluster", round_deadline=60)
    simulated = run_experiment(cfg, tmp_path / "sim")
    used: dict[str, set[tuple[str, ...]]] = {}
    for i in range(6):
        node = f"node-{i}"
        assert max_diff(tmp_path / "cluster" / node / "final.safetensors",
                        tmp_path / "sim" / node / "final.safetensors") == 0.0, node
        cluster_lines = read_metrics(tmp_path / "cluster" / node / "metrics.jsonl")
        sim_lines = read_metrics(tmp_path / "sim" / node / "metrics.jsonl")
        for c, s in zip(cluster_lines, sim_lines, strict=True):
            for key in ("neighbours_used", "samples", "train_loss", "accuracy",
                        "consensus_residual"):
                assert c[key] == s[key], (node, c["round"], key)
            used.setdefault(node, set()).add(tuple(c["neighbours_used"]))
    assert any(len(sets) > 1 for sets in used.values())  # the active edges did change
    a, b = launched["algorithms"]["dacfl"], simulated["algorithms"]["dacfl"]
    assert a["avg_acc"] == b["avg_acc"] and a["var_acc"] == b["var_acc"]
