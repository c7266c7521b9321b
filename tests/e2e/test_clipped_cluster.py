"""A real multi-process cluster with clipped mixing ends with the simulator's models, and its
checkpoints keep DACFL's invariant."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from dacflnode.cli.main import cli
from dacflnode.cluster.launcher import launch
from dacflnode.sim.experiment import run_experiment
from tests.harness.cluster import TINY, max_diff

pytestmark = pytest.mark.slow


def test_a_clipped_cluster_ends_with_the_clipped_simulators_models_and_its_invariant(tmp_path):
    cfg = replace(TINY, nodes=4, rounds=3, topology="ring", engine="sequential",
                  mixing="clipped", clip_fraction=0.005)
    launched = launch(cfg, tmp_path / "cluster", round_deadline=60)
    simulated = run_experiment(cfg, tmp_path / "sim")
    run_experiment(replace(cfg, mixing="exact"), tmp_path / "exact")
    clipped_away = 0.0
    for i in range(4):
        final = f"node-{i}/final.safetensors"
        diff = max_diff(tmp_path / "cluster" / final, tmp_path / "sim" / final)
        assert diff <= 1e-6, (final, diff)
        clipped_away = max(clipped_away,
                           max_diff(tmp_path / "sim" / final, tmp_path / "exact" / final))
    assert clipped_away > 1e-4  # the radius clipped: not the exact mix's models
    assert simulated["invariant"]["dacfl"]["final"] < 1e-6
    assert launched["algorithms"]["dacfl"]["rounds"] == [1, 2, 3]
    # the daemons' own checkpoints: Σ x = Σ ω_prev
    dirs = [str(tmp_path / "cluster" / f"node-{i}") for i in range(4)]
    checked = CliRunner().invoke(cli, ["invariant", "--json", *dirs], catch_exceptions=False)
    report = json.loads(checked.stdout)
    assert report["holds"] is True and report["resolved_residual"] < 1e-6, report
