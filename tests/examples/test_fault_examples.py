"""The fault plans of examples/faults/ agree with the commands documented beside them: every
documented `simulate` / `launch` command passes its plan's check against the run's graph (the
run itself is replaced, the CLI's parsing and the plan's check are the real ones), and a graph
on which a plan's edge does not exist is a one-line error naming the plan's entry."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dacflnode.cli.launch import launch
from dacflnode.cli.main import cli
from dacflnode.cli.simulate import simulate

ROOT = Path(__file__).resolve().parents[2]
PLANS = sorted((ROOT / "examples" / "faults").glob("*.yaml"))
# where the plans' commands are written down
DOCUMENTS = [ROOT / "examples" / "faults" / "README.md", ROOT / "examples" / "README.md", *PLANS]
COMMAND = re.compile(r"dacflnode (simulate|launch) (.*--faults (examples/faults/\S+\.yaml).*)")


def documented_commands() -> list[tuple[str, list[str], str]]:
    """(command, its arguments, the plan) of every documented run of an example plan."""
    texts = [path.read_text() for path in DOCUMENTS]
    texts += [simulate.help or "", launch.help or ""]
    found = []
    for text in texts:
        lines = [re.sub(r"^\s*#\s?", "", line) for line in text.splitlines()]
        joined = re.sub(r"\\\s*\n\s*", " ", "\n".join(lines))
        for line in joined.splitlines():
            for match in COMMAND.finditer(line.replace("`", "\n")):
                args = shlex.split(match.group(2), comments=True)
                found.append((match.group(1), args, match.group(3)))
    return found


COMMANDS = documented_commands()


def test_every_example_plan_has_a_documented_command_and_the_cut_plan_both_kinds():
    documented = {plan for _, _, plan in COMMANDS}
    assert documented == {f"examples/faults/{p.name}" for p in PLANS}
    assert {cmd for cmd, _, plan in COMMANDS if plan.endswith("stall_and_cut.yaml")} == {
        "simulate", "launch"}


def run_documented(command: str, args: list[str], tmp_path: Path,
                   monkeypatch: pytest.MonkeyPatch) -> Any:
    """Invoke ``dacflnode COMMAND ARGS`` from the repository root with the run replaced."""
    import dacflnode.cluster.launcher
    import dacflnode.sim.experiment

    ran: list[str] = []

    def fake_experiment(*_: Any, **__: Any) -> dict[str, Any]:
        ran.append("simulate")
        return {}

    async def fake_cluster(*_: Any, **__: Any) -> dict[str, Any]:
        ran.append("launch")
        return {}

    monkeypatch.setattr(dacflnode.sim.experiment, "run_experiment", fake_experiment)
    monkeypatch.setattr(dacflnode.cluster.launcher, "run_cluster", fake_cluster)
    monkeypatch.chdir(ROOT)
    if "--out" in args:
        args[args.index("--out") + 1] = str(tmp_path / "out")
    result = CliRunner().invoke(cli, [command, *args, "--json", "--quiet"])
    return result, ran


@pytest.mark.parametrize(("command", "args", "plan"), COMMANDS,
                         ids=[f"{c}-{Path(p).stem}-{i}" for i, (c, _, p) in enumerate(COMMANDS)])
def test_each_documented_command_accepts_its_plan_on_its_graph(
        command, args, plan, tmp_path, monkeypatch):
    result, ran = run_documented(command, list(args), tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    assert ran  # the plan was accepted and the run would have started


@pytest.mark.parametrize("command", ["simulate", "launch"])
def test_the_stall_and_cut_plan_on_a_ring_of_5_is_one_line_naming_the_cut(
        command, tmp_path, monkeypatch):
    args = ["--dataset", "synthetic", "--nodes", "5", "--topology", "ring", "--rounds", "12",
            "--out", "runs/faults", "--faults", "examples/faults/stall_and_cut.yaml"]
    result, ran = run_documented(command, args, tmp_path, monkeypatch)
    assert result.exit_code == 2 and not ran
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: faults[2].cut: ")
    assert "node-0 -- node-3 is not an edge of this run's graph" in lines[0]
