"""``dacflnode report`` on a real (tiny) ``simulate`` run: figures, table and JSON."""

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dacflnode.cli.main import cli, main
from dacflnode.records.metrics_log import summarize

pytestmark = pytest.mark.slow

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ALGORITHMS = ("cdsgd", "dacfl")


def run(args):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory) -> Path:
    """Two algorithms, three nodes, three rounds on synthetic data (a few seconds)."""
    out: Path = tmp_path_factory.mktemp("report") / "quick"
    result = run(["simulate", "--dataset", "synthetic", "--nodes", "3", "--rounds", "3",
                  "--model", "tiny-cnn", "--lr", "0.05", "--synthetic-train", "300",
                  "--synthetic-test", "100", "--algorithm", ",".join(ALGORITHMS), "--quiet",
                  "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def expected(sim_run: Path, algorithm: str) -> dict[str, Any]:
    return summarize(sorted((sim_run / algorithm).glob("node-*")), algorithm, 0.0, engine="x")


def test_report_writes_png_and_svg_figures_of_a_simulate_run(sim_run, tmp_path):
    result = run(["report", str(sim_run), "--out", str(tmp_path / "fig")])
    assert result.exit_code == 0, result.output
    for name in ("accuracy", "nodes"):
        assert (tmp_path / "fig" / f"{name}.png").read_bytes()[:8] == PNG_SIGNATURE
        root = ET.parse(tmp_path / "fig" / f"{name}.svg").getroot()
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
    svg = (tmp_path / "fig" / "accuracy.svg").read_text()
    assert "DACFL" in svg and "CDSGD" in svg and "quick/" not in svg  # the paper's names
    assert "synthetic · 3 nodes · dense · i.i.d." in svg  # the setting, as the title


def test_report_json_matches_the_summary_of_the_run(sim_run, tmp_path):
    result = run(["report", str(sim_run), "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    written = json.loads((sim_run / "summary.json").read_text())["algorithms"]
    assert [r["label"] for r in report["runs"]] == [f"quick/{a}" for a in ALGORITHMS]
    for row in report["runs"]:
        s = expected(sim_run, row["algorithm"])
        assert (row["nodes"], row["rounds"], row["final_round"]) == (3, 3, 3)
        assert (row["avg_acc"], row["var_acc"]) == (s["final"]["avg_acc"], s["final"]["var_acc"])
        assert row["curve"]["avg_acc"] == s["avg_acc"] == written[row["algorithm"]]["avg_acc"]
        lines = [json.loads(x) for i in range(3)
                 for x in (sim_run / row["algorithm"] / f"node-{i}" / "metrics.jsonl")
                 .read_text().splitlines()]
        assert row["mean_round_s"] == pytest.approx(
            sum(x["seconds"] for x in lines) / len(lines), abs=1e-4)
    assert sorted(Path(f).name for f in report["files"]) == [
        "accuracy.png", "accuracy.svg", "nodes.png", "nodes.svg"]


def test_report_table_shows_the_summary_values(sim_run):
    result = run(["report", str(sim_run)])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.stdout.splitlines()}
    for alg in ALGORITHMS:
        s = expected(sim_run, alg)
        row = rows[f"quick/{alg}"].split()
        assert row[1:4] == [alg, "3", "3"]
        assert row[4] == f"{100 * s['final']['avg_acc']:.2f}%"
        assert row[5] == f"{1e4 * s['final']['var_acc']:.3f}"
    assert (sim_run / "report" / "accuracy.png").is_file()  # the default --out


def test_report_on_a_folder_without_metrics_says_what_to_give(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "no metrics.jsonl found under" in err and "`launch` or `simulate`" in err


def test_report_shows_each_nodes_data_size_accuracy_and_classes(sim_run):
    result = run(["report", str(sim_run / "dacfl")])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    start = lines.index("dacfl: data per node")
    header, *rows = lines[start + 1:start + 5]
    assert header.split()[:3] == ["node", "samples", "accuracy"]
    written = [json.loads(x) for x in
               (sim_run / "dacfl" / "node-1" / "metrics.jsonl").read_text().splitlines()]
    cells = rows[1].split()
    assert cells[:2] == ["node-1", str(written[-1]["data_size"])]
    assert cells[2] == f"{100 * written[-1]['accuracy']:.2f}%"
    assert cells[3:] == [f"{k}:{v}" for k, v in written[-1]["class_counts"].items()]
