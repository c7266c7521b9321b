"""``dacflnode data check`` and ``data split`` on tables: the column profile, the categories
block, the settings suggested as flags or YAML, and one-line refusals with exit code 2."""

import json

import yaml
from click.testing import CliRunner

from dacflnode.cli.main import cli
from tests.harness.owndata import write_csv

HEADER = ["w", "colour", "h", "kind"]
ROWS = [[1, "red", 2, "x"], [3, "blue", "NA", "y"], [2, "red", 5, "x"], [4, "", 1, "y"],
        [5, "green", 2, "x"]]


def run(args):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def test_check_profiles_each_column_and_prints_a_categories_block(tmp_path):
    path = write_csv(tmp_path / "t.csv", HEADER, ROWS)
    result = run(["data", "check", str(path), "--label-column", "kind", "--missing", "mean"])
    lines = result.stdout.splitlines()
    assert ["w", "numeric", "1", "..", "5", "0"] in [line.split() for line in lines]
    assert ["h", "numeric", "1", "..", "5", "1"] in [line.split() for line in lines]
    assert any(line.split()[:2] == ["colour", "categorical"] and "blue, green, red" in line
               and line.split()[-1] == "1" for line in lines)
    at = lines.index("categories has no flag (a mapping); add to the run file:")
    block = yaml.safe_load("\n".join(lines[at + 1:at + 3]))
    assert block == {"categories": {"colour": ["blue", "green", "red"]}}
    # a node would refuse the unlisted text column: a problem, exit code 1
    assert result.exit_code == 1 and "'colour' is text" in result.stderr


def test_check_as_json_holds_the_columns_and_the_categories(tmp_path):
    path = write_csv(tmp_path / "t.csv", HEADER, ROWS)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"dataset": "table", "label_column": "kind",
                                      "classes": ["x", "y"], "missing": "drop",
                                      "categories": {"colour": ["red", "blue", "green"]}}))
    result = run(["data", "check", str(path), "--config", str(config), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    columns = {c["name"]: c for c in report["columns"]}
    assert columns["w"] == {"name": "w", "type": "numeric", "min": 1, "max": 5, "missing": 0}
    assert columns["colour"]["type"] == "categorical" and columns["colour"]["missing"] == 1
    assert columns["colour"]["categories"] == ["blue", "green", "red"]
    assert columns["kind"]["type"] == "label"
    assert report["categories"] == {"colour": ["red", "blue", "green"]}
    assert report["dropped"] == 2 and report["train_size"] + report["test_size"] == 3
    assert report["feature_names"][1:4] == ["colour=red", "colour=blue", "colour=green"]
    assert report["numeric_features"] == [0, 4]


def test_check_reports_missing_cells_under_fail_as_a_problem(tmp_path):
    path = write_csv(tmp_path / "t.csv", ["w", "kind"], [[1, "x"], ["", "x"], [3, "y"]])
    result = run(["data", "check", str(path), "--label-column", "kind", "--json"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert any("missing: fail" in p for p in report["problems"]) and report["dropped"] == 1


def test_classes_are_suggested_as_a_flag_or_as_yaml(tmp_path):
    path = write_csv(tmp_path / "t.csv", ["w", "kind"], [[1, "x"], [2, "y"], [3, "x"]])
    flags = run(["data", "check", str(path), "--label-column", "kind"])
    assert "--classes x,y" in flags.stdout
    config = tmp_path / "run.yaml"
    config.write_text("label_column: kind\n")
    from_file = run(["data", "check", str(path), "--config", str(config)])
    assert "add to the run file: classes: [x, y]" in from_file.stdout
    assert "--classes" not in from_file.stdout


def test_a_missing_or_unset_label_column_is_one_line_and_exit_2(tmp_path):
    names = [f"c{i}" for i in range(14)]
    path = write_csv(tmp_path / "d" / "t.csv", names, [list(range(14))])
    for args in (["--label-column", "cultivar"], []):
        result = run(["data", "check", str(tmp_path / "d"), *args])
        assert result.exit_code == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: label_column:")
        assert str(path) in lines[0] and "c0, c1" in lines[0] and "… and 4 more" in lines[0]
    split = run(["data", "split", str(path), "--nodes", "2", "--format", "table", "--out",
                 str(tmp_path / "out")])
    assert split.exit_code == 2
    lines = split.stderr.strip().splitlines()
    assert len(lines) == 1 and "label_column" in lines[0] and str(path) in lines[0]


def test_split_keeps_a_tables_text_columns(tmp_path):
    path = write_csv(tmp_path / "t.csv", HEADER, ROWS)
    out = tmp_path / "out"
    result = run(["data", "split", str(path), "--label-column", "kind", "--nodes", "2",
                  "--format", "table", "--out", str(out)])
    assert result.exit_code == 0, result.output
    header = (out / "node-0" / "data.csv").read_text().splitlines()[0]
    assert header.replace('"', "").split(",") == HEADER
