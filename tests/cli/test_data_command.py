"""``dacflnode data check`` and ``data split``: reports, --json, exit codes."""

import json

import yaml
from click.testing import CliRunner

from dacflnode.cli.main import cli
from tests.harness.owndata import corrupt, write_csv, write_images


def run(args):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def test_check_reports_shape_classes_and_histogram_as_json(tmp_path):
    write_images(tmp_path / "d", {"cat": 3, "dog": 2})
    result = run(["data", "check", str(tmp_path / "d"), "--classes", "dog,cat,bird",
                  "--holdout", "0.2", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["classes"] == ["dog", "cat", "bird"]
    assert report["input_shape"] == [1, 8, 8]
    assert report["train_size"] + report["test_size"] == 5 and report["test_size"] == 1
    assert sum(report["histogram"].values()) == 4
    assert report["missing_classes"] == ["bird"] and report["histogram"]["bird"] == 0
    assert report["problems"] == [] and report["classes_from"] == "settings"


def test_check_reads_the_settings_of_a_run_config(tmp_path):
    write_images(tmp_path / "d", {"a": 2}, size=12)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"dataset": "folder", "classes": ["a", "b"],
                                      "image_size": 6, "channels": 3}))
    result = run(["data", "check", str(tmp_path / "d"), "--config", str(config), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["input_shape"] == [3, 6, 6] and report["classes"] == ["a", "b"]


def test_check_prints_a_table_of_counts_with_the_holdout_a_node_uses(tmp_path):
    write_images(tmp_path / "d", {"a": 4, "b": 1})
    result = run(["data", "check", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    # no --config: the run's default holdout (0.2) holds one of the five images out
    assert "4 training samples" in result.stdout and "1 test samples" in result.stdout
    assert "from the data" in result.stdout
    lines = [line.split() for line in result.stdout.splitlines()]
    assert ["a", "3", "1"] in lines or ["a", "4", "0"] in lines


def test_check_lists_every_unreadable_file_and_exits_1(tmp_path):
    write_images(tmp_path / "d", {"a": 2})
    corrupt(tmp_path / "d" / "a" / "broken.png")
    result = run(["data", "check", str(tmp_path / "d"), "--json"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["skipped"] == 1 and report["problems"][0].startswith("a/broken.png")


def test_check_refuses_a_class_folder_not_in_classes_with_one_line_and_exit_2(tmp_path):
    write_images(tmp_path / "d", {"a": 1, "stray": 1})
    result = run(["data", "check", str(tmp_path / "d"), "--classes", "a"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: classes:") and "stray" in lines[0]


def test_check_a_table_names_its_features(tmp_path):
    path = write_csv(tmp_path / "t.csv", ["w", "h", "kind"], [[1, 2, "x"], [3, 4, "y"]])
    result = run(["data", "check", str(path), "--label-column", "kind", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["kind"] == "table" and report["feature_names"] == ["w", "h"]
    assert report["classes"] == ["x", "y"]
    text = run(["data", "check", str(path), "--label-column", "kind"])
    assert any(line.split() == ["w", "numeric", "1", "..", "3", "0"]
               for line in text.stdout.splitlines())


def test_split_writes_node_folders_and_reports_them_as_json(tmp_path):
    write_images(tmp_path / "src", {"a": 4, "b": 4})
    out = tmp_path / "out"
    result = run(["data", "split", str(tmp_path / "src"), "--nodes", "2", "--partition",
                  "shards", "--shards-per-node", "1", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [n["id"] for n in report["nodes"]] == ["node-0", "node-1"]
    assert sorted(n["samples"] for n in report["nodes"]) == [4, 4]
    # one label shard per node: each node holds one class
    assert all(sum(1 for v in n["histogram"].values() if v) == 1 for n in report["nodes"])
    assert (out / "run-data.yaml").exists()
    for node in ("node-0", "node-1"):
        assert len(list((out / node).rglob("*.png"))) == 4


def test_split_into_a_non_empty_folder_is_refused_with_exit_2(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("")
    result = run(["data", "split", "synthetic", "--nodes", "2", "--format", "table", "--out",
                  str(tmp_path / "out")])
    assert result.exit_code == 2 and "error: out:" in result.stderr


def test_data_commands_have_help_with_examples():
    for args in (["data", "--help"], ["data", "check", "--help"], ["data", "split", "--help"]):
        result = run(args)
        assert result.exit_code == 0 and "Examples:" in result.stdout
