"""The command line end to end (in-process through click's runner, and one real subprocess): its
refusals and help texts unmarked, the runs it starts (simulations, a cluster, a child process)
slow."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dacflnode.cli.main import cli, main

SMALL = [
    "--dataset",
    "synthetic",
    "--nodes",
    "3",
    "--rounds",
    "2",
    "--model",
    "tiny-cnn",
    "--lr",
    "0.05",
    "--quiet",
]


def run(args):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


@pytest.mark.slow
def test_simulate_json_prints_the_summary(tmp_path):
    result = run(
        ["simulate", *SMALL, "--algorithm", "dacfl,cdsgd", "--json", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    for name in ("dacfl", "cdsgd"):
        algo = summary["algorithms"][name]
        assert len(algo["avg_acc"]) == 2 and len(algo["var_acc"]) == 2
        assert algo["final"]["avg_acc"] == algo["avg_acc"][-1]
    assert (tmp_path / "cdsgd" / "node-2" / "final.safetensors").exists()


@pytest.mark.slow
def test_simulate_prints_a_table_without_json():
    result = run(["simulate", *SMALL])
    assert result.exit_code == 0
    assert "dacfl" in result.stdout and "%" in result.stdout


@pytest.mark.slow
def test_yaml_config_is_read_and_flags_override_it(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("dataset: synthetic\nnodes: 5\nrounds: 1\nmodel: mlp\n")
    result = run(["simulate", "--config", str(cfg), "--nodes", "3", "--json", "--quiet"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["config"]["nodes"] == 3 and summary["config"]["model"] == "mlp"


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--topology", "star"], "--topology"),
        (["--nodes", "1"], "nodes"),
        (["--topology", "ring", "--nodes", "2"], "nodes"),
        (["--data-root", "/no/such/folder", "--dataset", "mnist"], "data_root"),
        (["--algorithm", "dacfl,magic"], "algorithm"),
        (["--gone-after", "0"], "gone_after"),
    ],
)
def test_bad_config_gets_one_line_naming_the_field_and_exit_code_2(args, field, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--dataset", "synthetic", "--rounds", "1", "--quiet", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err and err.startswith("error:")


def test_non_doubly_stochastic_custom_matrix_is_refused(tmp_path, capsys):
    path = tmp_path / "w.txt"
    path.write_text("0.5 0.5 0\n0.5 0.4 0.1\n0 0.1 0.8\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--dataset", "synthetic", "--nodes", "3", "--mixing-matrix", str(path)])
    assert exit_info.value.code == 2
    assert "mixing_matrix" in capsys.readouterr().err


def test_missing_data_root_for_mnist_names_data_root(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--dataset", "mnist", "--data-root", str(tmp_path), "--quiet"])
    assert exit_info.value.code == 2
    assert "data_root" in capsys.readouterr().err


def test_consensus_demo_json_has_the_documented_shape():
    result = run(["consensus-demo", "--inputs", "II", "--matrix", "ring", "--json"])
    data = json.loads(result.stdout)
    assert (data["inputs"], data["matrix"], data["nodes"], data["steps"]) == ("II", "ring", 10, 20)
    assert set(data["mae"]) == {"fodac", "cdsgd", "dpsgd"}
    assert all(len(v) == 20 for v in data["mae"].values())


@pytest.mark.slow
def test_consensus_demo_writes_a_plot(tmp_path):
    out = tmp_path / "fig3.png"
    result = run(["consensus-demo", "--plot", str(out)])
    assert result.exit_code == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_every_command_has_help_with_an_example():
    assert {"simulate", "start", "status", "certs", "topology", "launch"} <= set(cli.commands)
    for command in cli.commands:
        result = run([command, "--help"])
        assert result.exit_code == 0 and "Example" in result.output, command


def test_example_files_named_in_help_texts_exist():
    root = Path(__file__).resolve().parents[2]
    named = set()
    for name in cli.commands:
        help_text = run([name, "--help"]).output
        named.update(re.findall(r"examples/[\w./-]+\.\w+", help_text))
    assert named, "no help text names an example file"
    assert [f for f in sorted(named) if not (root / f).is_file()] == []


@pytest.mark.slow
def test_the_installed_entry_point_runs_as_a_subprocess():
    proc = subprocess.run(
        [sys.executable, "-m", "dacflnode", "consensus-demo", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["matrix"] == "sparse"


@pytest.mark.slow
def test_launch_runs_a_real_cluster_and_prints_the_summary(tmp_path):
    result = run(["launch", "--dataset", "synthetic", "--model", "mlp", "--nodes", "3",
                  "--rounds", "2", "--lr", "0.05", "--out", str(tmp_path), "--json", "--quiet"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["algorithms"]["dacfl"]["rounds"] == [1, 2]
    for i in range(3):
        assert (tmp_path / f"node-{i}" / "final.safetensors").exists()
        assert len((tmp_path / f"node-{i}" / "metrics.jsonl").read_text().splitlines()) == 2


def test_launch_refuses_a_topology_that_needs_a_global_view(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["launch", "--topology", "dense", "--out", "/tmp/never", "--dataset", "synthetic"])
    assert exit_info.value.code == 2
    assert "topology" in capsys.readouterr().err


def test_launch_keeps_the_topology_its_config_file_gives(tmp_path):
    from dacflnode.cli.launch import _file_sets

    flat, nested, without = (tmp_path / n for n in ("flat.yaml", "nested.yaml", "none.yaml"))
    flat.write_text("topology: random-regular\ndegree: 3\n")
    nested.write_text("run:\n  topology: complete\n")
    without.write_text("nodes: 4\n")
    assert _file_sets(str(flat), "topology") and _file_sets(str(nested), "topology")
    assert not _file_sets(str(without), "topology") and not _file_sets(None, "topology")


@pytest.mark.parametrize(
    ("nodes", "config", "topology"),
    [(None, None, "ring"), (2, None, "complete"), (None, "nodes: 2\n", "complete"),
     (None, "run:\n  nodes: 2\n", "complete"), (4, "nodes: 2\n", "ring")],
    ids=["declared default", "flag", "config file", "run section", "flag over file"],
)
def test_launch_runs_a_ring_only_on_as_many_nodes_as_a_ring_needs(tmp_path, nodes, config,
                                                                  topology):
    from dacflnode.cli.launch import _default_topology

    path = None
    if config is not None:
        path = tmp_path / "run.yaml"
        path.write_text(config)
    assert _default_topology({"nodes": nodes, "config_file": path}) == topology


@pytest.mark.slow
def test_simulate_with_clipped_mixing_reports_an_invariant_that_holds():
    args = ["simulate", *SMALL, "--rounds", "4", "--topology", "ring", "--algorithm",
            "dacfl,cdsgd", "--json"]
    exact = json.loads(run(args).stdout)
    result = run([*args, "--mixing", "clipped", "--clip-fraction", "0.005"])
    assert result.exit_code == 0, result.output
    clipped = json.loads(result.stdout)
    assert clipped["config"]["mixing"] == "clipped"
    assert exact["invariant"]["dacfl"]["final"] < 1e-6 and "cdsgd" not in exact["invariant"]
    inv = clipped["invariant"]["dacfl"]
    assert len(inv["rounds"]) == 4 and max(inv["rounds"]) < 1e-6 and inv["final"] < 1e-6
    # the radius is small enough to clip: the models differ from the exact mix's
    for name in ("dacfl", "cdsgd"):
        assert (clipped["algorithms"][name]["train_loss"]
                != exact["algorithms"][name]["train_loss"])
    table = run(["simulate", *SMALL, "--topology", "ring", "--mixing", "clipped"])
    assert "dacfl: invariant |Σx − Σtracked| / |Σtracked|" in table.stdout


def test_simulate_refuses_clipped_mixing_for_fedavg_and_says_what_to_do():
    result = CliRunner().invoke(cli, ["simulate", *SMALL, "--algorithm", "dacfl,fedavg",
                                      "--mixing", "clipped"])
    assert result.exit_code != 0
    assert "mixing: fedavg averages at a server" in result.output
    assert "mixing exact" in result.output
