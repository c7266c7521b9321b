"""What ``--help`` shows: options in sections, the truth for the cluster commands, whole
command summaries."""

import click
import pytest
from click.testing import CliRunner

from dacflnode.algorithms.names import DAEMON_ALGORITHMS, GRAPH_KINDS, MATRIX_KINDS
from dacflnode.cli.main import COMMANDS, cli
from dacflnode.cli.options import GROUP_TITLES, GroupedCommand
from dacflnode.config import schema

RUN_COMMANDS = ("simulate", "launch", "topology")
CLUSTER_COMMANDS = ("launch", "topology")


def _command(name: str) -> click.Command:
    command = cli.get_command(click.Context(cli), name)
    assert command is not None
    return command


def _help(args: list[str], width: int = 100) -> str:
    result = CliRunner().invoke(cli, args, terminal_width=width)
    assert result.exit_code == 0, result.output
    return result.output


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_the_section_titles_follow_the_declared_groups():
    assert tuple(GROUP_TITLES) == schema.OPTION_GROUPS


@pytest.mark.parametrize("name", RUN_COMMANDS)
def test_every_option_of_a_run_command_is_in_a_section(name):
    command = _command(name)
    assert isinstance(command, GroupedCommand)
    ungrouped = [p.name for p in command.params
                 if isinstance(p, click.Option) and command.group_of(p) is None]
    assert ungrouped == []


@pytest.mark.parametrize("name", RUN_COMMANDS)
def test_help_lists_the_sections_in_order_each_with_its_options(name):
    text = _help([name, "--help"])
    titles = [t for t in GROUP_TITLES.values() if f"\n{t}:\n" in text]
    assert titles[:4] == ["Run", "Data", "Model", "Training"]
    positions = [text.index(f"\n{t}:\n") for t in titles]
    assert positions == sorted(positions)
    sections = text[text.index("\nRun:\n"):]  # the examples above name options too
    assert sections.index("--algorithm") < sections.index("\nData:\n")
    assert sections.index("\nData:\n") < sections.index("--dataset") < sections.index("\nModel:\n")
    assert sections.index("\nOutput:\n") < sections.index("--json")
    assert text.rstrip().endswith("Show this message and exit.")


def test_a_command_line_setting_without_a_section_is_refused_where_it_is_declared():
    with pytest.raises(TypeError, match="needs group="):
        schema.setting(1, help="n", scope=schema.Scope.RUN)
    with pytest.raises(TypeError, match="needs group="):
        schema.setting(1, help="n", scope=schema.Scope.RUN, group="misc")
    schema.setting(1, help="n", scope=schema.Scope.RUN, cli=False)  # not an option: no section


@pytest.mark.parametrize("name", CLUSTER_COMMANDS)
def test_cluster_commands_offer_only_what_a_daemon_runs(name):
    options = {p.name: p for p in _command(name).params if isinstance(p, click.Option)}
    assert isinstance(options["topology"].type, click.Choice)
    assert tuple(options["topology"].type.choices) == GRAPH_KINDS
    text = _flat(_help([name, "--help"], width=200))
    assert f"Choices: {', '.join(DAEMON_ALGORITHMS)}." in text
    for simulation_only in ("dpsgd", "fedavg"):
        assert f"{simulation_only}," not in text and f", {simulation_only}" not in text
    for matrix_kind in MATRIX_KINDS:
        assert f"|{matrix_kind}" not in text and f"[{matrix_kind}|" not in text
    # the simulator's engines and matrix settings are not a daemon's
    for flag in ("--engine", "--zero-fraction", "--mixing-matrix"):
        assert flag not in text


def test_launch_help_says_the_topology_launch_uses_when_none_is_given():
    text = _flat(_help(["launch", "--help"], width=200))
    topology = text[text.index("--topology"):text.index("--degree")]
    assert "[default: dense]" not in topology
    assert "[default: ring; complete for 2 nodes]" in topology
    assert "ring when not given" in text


def test_simulate_keeps_every_algorithm_topology_and_its_engine():
    text = _flat(_help(["simulate", "--help"], width=200))
    assert "Choices: dacfl, cdsgd, dpsgd, fedavg." in text
    assert "[dense|sparse|uniform|custom|ring|" in text and "[default: dense]" in text
    assert "--engine [auto|batched|sequential]" in text


@pytest.mark.parametrize("width", [80, 100])
def test_the_command_list_shows_every_summary_whole(width):
    text = _help(["--help"], width=width)
    listing = text[text.index("\nCommands:\n"):]
    assert "..." not in listing
    assert set(COMMANDS) == set(cli.commands)
    for name, (_, _, summary) in COMMANDS.items():
        assert summary in _flat(listing), name


def test_each_listed_command_loads_as_the_command_of_its_name():
    for name in COMMANDS:
        command = _command(name)
        assert command.name == name
        assert command.short_help is not None  # `dacflnode NAME --help` reads the same line
