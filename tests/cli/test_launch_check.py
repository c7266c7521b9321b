"""``dacflnode launch`` checks every node's settings and own data before it writes or starts
anything: a bad node is one line naming it and exit code 2, with no daemon started and the
output folder as it was (absent, or an earlier run's files kept even with ``--fresh``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from dacflnode.cli.main import cli
from dacflnode.cluster import launcher
from dacflnode.config.dataset_defaults import DEFAULT_LR_TEXT, resolved_model
from dacflnode.peers.file import load_peers

HEADER = "alcohol,acidity,species\n"
ROWS = ["1.0,0.5,a\n", "0.2,1.5,b\n", "1.1,0.4,a\n", "0.1,1.6,b\n"]


def devices(root: Path, label: dict[int, str] | None = None) -> Path:
    """Three devices with a small CSV each; ``label``: a device's label column named otherwise."""
    for i in range(3):
        folder = root / f"node-{i}"
        folder.mkdir(parents=True)
        header = HEADER.replace("species", (label or {}).get(i, "species"))
        (folder / "data.csv").write_text(header + "".join(ROWS))
    return root


def launch(args: list[str], out: Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [
        "launch", "--nodes", "3", "--dataset", "table", "--classes", "a,b", "--rounds", "2",
        "--quiet", "--out", str(out), *args])
    return result.exit_code, result.output


@pytest.fixture
def no_daemons(monkeypatch):
    """Fail the test if launch starts a daemon."""
    started: list[Path] = []

    async def start(peers: Path, *args: object) -> None:
        started.append(peers)
        raise AssertionError(f"a daemon was started: {peers}")

    monkeypatch.setattr(launcher, "start_daemon", start)
    return started


def test_a_bad_label_column_on_one_node_is_one_line_naming_it_and_nothing_starts(
        tmp_path, no_daemons):
    data = devices(tmp_path / "devices", label={1: "kind"})
    out = tmp_path / "run"
    code, output = launch(["--label-column", "species", "--data-root", str(data)], out)
    assert code == 2
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith("error: node-1: label_column: ")
    assert str(data / "node-1" / "data.csv") in lines[0] and "'species'" in lines[0]
    assert no_daemons == [] and not out.exists()


def test_a_refused_launch_leaves_an_earlier_run_as_it_was_even_with_fresh(tmp_path, no_daemons):
    data = devices(tmp_path / "devices")
    out = tmp_path / "run"
    (out / "node-0").mkdir(parents=True)
    earlier = {out / "node-0" / "metrics.jsonl": '{"round": 1}\n', out / "notes.txt": "mine\n"}
    for path, text in earlier.items():
        path.write_text(text)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    code, output = launch(["--label-column", "species", "--classes", "a", "--data-root",
                           str(data), "--fresh"], out)
    assert code == 2
    assert output.startswith("error: node-0: classes: ") and "'b'" in output
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert all(path.read_text() == text for path, text in earlier.items())
    assert no_daemons == []


def test_nodes_whose_tables_have_other_features_are_refused_before_any_starts(
        tmp_path, no_daemons):
    data = devices(tmp_path / "devices")
    (data / "node-2" / "data.csv").write_text(
        "alcohol,sugar,species\n" + "".join(ROWS))
    out = tmp_path / "run"
    code, output = launch(["--label-column", "species", "--data-root", str(data)], out)
    assert code == 2
    assert output.startswith("error: data_root: node-2 has feature names ['alcohol', 'sugar']")
    assert no_daemons == [] and not out.exists()


def test_a_missing_node_folder_is_refused_before_the_run_folder_is_made(tmp_path, no_daemons):
    data = devices(tmp_path / "devices")
    out = tmp_path / "run"
    code, output = launch(["--label-column", "species", "--data-root", str(data),
                           "--nodes", "4"], out)
    assert code == 2
    assert "node-3 does not exist" in output and len(output.strip().splitlines()) == 1
    assert no_daemons == [] and not out.exists()


def test_checked_nodes_go_on_to_start_their_daemons(tmp_path, no_daemons):
    """Good data passes the check: the launch goes on to the daemons (here refused by the
    fixture, which proves the check let them start)."""
    data = devices(tmp_path / "devices")
    out = tmp_path / "run"
    code, output = launch(["--label-column", "species", "--data-root", str(data)], out)
    assert code != 0 and len(no_daemons) == 1, output
    assert no_daemons[0] == out / "peers" / "node-0.yaml"
    # a table run without lr trains its mlp at 0.05 (the paper's 0.001 barely moves it)
    run = load_peers(no_daemons[0]).run
    assert run.lr is None and run.learning_rate == 0.05
    assert resolved_model(run) == "mlp"
    assert "0.05 for table" in DEFAULT_LR_TEXT
