"""The penguin tables example (examples/own-data/tables/penguins): make_devices.py splits the raw
Palmer penguins unevenly by island, keeping every cell as it is; its run.yaml parses with the
classes and categories the README names; the run it shows learns the species."""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import json
import runpy
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dacflnode.cli.main import cli
from dacflnode.config import load_yaml_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own-data" / "tables" / "penguins"
RUN = ["--config", str(EXAMPLE / "run.yaml"), "--dataset", "table", "--label-column", "species",
       "--missing", "drop"]


def read(path: Path) -> tuple[list[str], list[tuple[str, ...]]]:
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], [tuple(r) for r in rows[1:]]


def source_csv() -> Path:
    spec = importlib.util.find_spec("palmerpenguins")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "penguins.csv"


@pytest.fixture(scope="module")
def devices(tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    """The example's devices, written by make_devices.py (in this process: no package import),
    and the JSON it printed."""
    if importlib.util.find_spec("palmerpenguins") is None:
        pytest.skip("palmerpenguins is not installed (the dev extra installs it)")
    root = tmp_path_factory.mktemp("penguins") / "devices"
    argv = sys.argv
    sys.argv = [str(EXAMPLE / "make_devices.py"), str(root), "--json"]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(EXAMPLE / "make_devices.py"), run_name="__main__")
    finally:
        sys.argv = argv
    return root, json.loads(out.getvalue())


def test_the_devices_hold_every_raw_row_once_split_unevenly_by_island(devices):
    root, report = devices
    source_header, source = read(source_csv())
    parts = {name: read(root / name / "penguins.csv")
             for name in ("node-0", "node-1", "node-2", "test")}
    assert all(header == source_header for header, _ in parts.values())
    # every row once, every cell as the source writes it: NA and all
    assert Counter(row for _, rows in parts.values() for row in rows) == Counter(source)
    assert len(source) == 344
    # the missing cells are kept as NA, rows with no measurement at all included
    na = [row for _, rows in parts.values() for row in rows if "NA" in row]
    assert len(na) == 11 and sum(row.count("NA") == 5 for row in na) == 2
    assert sum(d["rows_with_na"] for d in report["devices"].values()) == len(
        [row for row in parts["node-0"][1] + parts["node-1"][1] + parts["node-2"][1]
         if "NA" in row])
    sizes = [len(parts[f"node-{i}"][1]) for i in range(3)]
    assert len(set(sizes)) == 3, sizes  # unequal
    assert sizes == [report["devices"][f"node-{i}"]["rows"] for i in range(3)]
    island = source_header.index("island")
    for i, home in enumerate(("Biscoe", "Dream", "Torgersen")):
        mix = Counter(row[island] for row in parts[f"node-{i}"][1])
        assert mix.most_common(1)[0][0] == home and len(mix) == 3, mix
        assert mix[home] >= 0.5 * sizes[i]
    assert 0.15 * len(source) <= len(parts["test"][1]) <= 0.25 * len(source)


def test_the_run_file_names_the_classes_and_categories_the_readme_shows():
    cfg = load_yaml_config(EXAMPLE / "run.yaml")
    assert cfg.classes == ("Adelie", "Chinstrap", "Gentoo") and cfg.nodes == 3
    assert dict(cfg.categories or {}) == {"island": ("Biscoe", "Dream", "Torgersen"),
                                          "sex": ("female", "male")}
    readme = (EXAMPLE / "README.md").read_text()
    for word in ("make_devices.py", "--label-column species", "--missing drop", "data check",
                 "launch", "simulate"):
        assert word in readme


@pytest.mark.slow
def test_ten_rounds_on_the_penguin_devices_learn_the_species(devices):
    root, _ = devices
    result = CliRunner().invoke(cli, ["simulate", *RUN, "--data-root", str(root), "--test-root",
                                      str(root / "test"), "--rounds", "10", "--json",
                                      "--quiet"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    final = summary["algorithms"]["dacfl"]["final"]
    assert final["round"] == 10 and final["avg_acc"] > 0.8, final
