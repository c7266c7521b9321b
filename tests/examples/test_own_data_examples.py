"""The own-data examples: their run.yaml files parse with the names the docs promise, and the
table example's steps (make_wine_csv.py, data split, simulate) run end to end on scikit-learn's
bundled data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dacflnode.cli.main import cli
from dacflnode.config import load_yaml_config

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "own-data"


@pytest.mark.parametrize(("name", "dataset"), [("images", "folder"), ("tables", "table")])
def test_the_examples_run_files_parse_and_name_their_classes(name, dataset):
    cfg = load_yaml_config(EXAMPLES / name / "run.yaml")
    assert cfg.dataset == dataset and cfg.own_data and len(cfg.classes) >= 3
    assert (EXAMPLES / name / "README.md").is_file()


def test_the_images_example_trains_the_papers_cnn_at_the_papers_rate():
    cfg = load_yaml_config(EXAMPLES / "images" / "run.yaml")
    assert cfg.model is None and cfg.lr is None
    assert (cfg.channels, cfg.image_size) == (1, 28)


def test_the_table_example_runs_end_to_end(tmp_path):
    pytest.importorskip("sklearn")
    csv = tmp_path / "wine.csv"
    made = subprocess.run([sys.executable, str(EXAMPLES / "tables" / "make_wine_csv.py"),
                           str(csv), "--json"], check=True, capture_output=True, text=True,
                          timeout=120)
    wine = json.loads(made.stdout)
    assert wine["rows"] == 178 and len(wine["features"]) == 13
    # the classes the example's run.yaml names are the file's label values
    assert tuple(wine["classes"]) == load_yaml_config(EXAMPLES / "tables" / "run.yaml").classes
    runner = CliRunner()
    split = runner.invoke(cli, ["data", "split", str(csv), "--label-column", "cultivar",
                                "--format", "table", "--nodes", "3", "--partition", "dirichlet",
                                "--out", str(tmp_path / "devices")])
    assert split.exit_code == 0, split.output
    result = runner.invoke(cli, ["simulate", "--config", str(EXAMPLES / "tables" / "run.yaml"),
                                 "--data-root", str(tmp_path / "devices"), "--rounds", "3",
                                 "--json", "--quiet"])
    assert result.exit_code == 0, result.output
    summary = result.stdout.strip().splitlines()[-1]
    assert '"samples_per_node"' in summary and '"avg_acc"' in summary
