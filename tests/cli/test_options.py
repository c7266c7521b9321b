"""The options of simulate, launch and topology are generated from the settings' declarations."""

import click
import pytest
from click.testing import CliRunner

from dacflnode.cli.main import cli, main
from dacflnode.config import DAEMON_DEFAULTS, DaemonSettings, RunConfig, schema

#: Options of each command that are not settings (where output goes, how it is printed, ...).
OWN_OPTIONS = {
    "simulate": {"config_file", "out_dir", "as_json", "quiet", "faults_file", "gone_after",
                 "ray_address", "ray_workers", "slowdown", "replay_dir", "virtual_time",
                 "round_deadline"},
    "launch": {"config_file", "out_dir", "as_json", "quiet", "tls_dir", "faults_file", "fresh",
               "slowdown"},
    "topology": {
        "config_file", "out_dir", "as_json", "hosts", "base_port", "ports",
        "control_base_port", "control_ports", "metrics_ports", "metrics_host", "listen_host",
        "state_root", "tls_dir", "insecure",
    },
}
DAEMON_COMMANDS = ("launch", "topology")


@pytest.fixture(autouse=True)
def _commands():
    from dacflnode.cli import launch, simulate, topology  # noqa: F401


def _command(name: str) -> click.Command:
    command = cli.get_command(click.Context(cli), name)
    assert command is not None
    return command


def _options(name: str) -> dict[str, click.Option]:
    return {p.name: p for p in _command(name).params if isinstance(p, click.Option)}


def _offered(name: str) -> list[schema.Declared]:
    """The run settings command ``name`` offers: a cluster command leaves out the simulator's."""
    return [d for d in schema.fields_of(RunConfig) if d.setting.cli
            and not (name in DAEMON_COMMANDS and d.setting.simulator_only)]


@pytest.mark.parametrize("name", sorted(OWN_OPTIONS))
def test_every_run_setting_is_an_option_and_every_other_option_is_the_commands_own(name):
    options = _options(name)
    settings = {d.name for d in _offered(name)}
    daemon = {d.name for d in schema.fields_of(DaemonSettings) if d.setting.cli}
    expected = settings | (daemon if name in DAEMON_COMMANDS else set()) | OWN_OPTIONS[name]
    assert set(options) == expected


@pytest.mark.parametrize("name", sorted(OWN_OPTIONS))
def test_each_option_has_the_declared_flag_type_choices_and_help(name):
    options = _options(name)
    cluster = name in DAEMON_COMMANDS
    for d in _offered(name):
        opt = options[d.name]
        assert d.flag in opt.opts
        assert opt.default is None  # not given: a --config file or the declared default applies
        declared_help = d.setting.cluster_help if cluster and d.setting.cluster_help else (
            d.setting.help)
        assert opt.help is not None and declared_help in opt.help
        if d.name != "topology" or not cluster:  # a cluster command says its own default
            assert f"[default: {d.default_text}]" in opt.help
        choices = (d.setting.cluster_choices if cluster and d.setting.cluster_choices
                   else d.setting.choices)
        if d.setting.choices is not None and not d.is_list:
            assert isinstance(opt.type, click.Choice)
            assert tuple(opt.type.choices) == choices
        elif d.base is bool:
            assert opt.secondary_opts == [f"--no-{d.flag[2:]}"]
        elif not d.is_list:
            assert opt.type.name == {int: "integer", float: "float", str: "text"}[d.base]


@pytest.mark.parametrize("name", DAEMON_COMMANDS)
def test_daemon_options_carry_the_declared_defaults(name):
    options = _options(name)
    assert options["round_deadline"].default == DAEMON_DEFAULTS.round_deadline
    assert options["hello_timeout"].default == DAEMON_DEFAULTS.hello_timeout
    assert options["round_deadline"].show_default


def test_help_shows_the_declared_defaults():
    result = CliRunner().invoke(cli, ["simulate", "--help"], terminal_width=200)
    text = " ".join(result.output.split())
    assert ("Communication rounds; under schedule async, each node's training blocks."
            " [default: 100]") in text
    assert "--shards-per-node" in text
    assert "[default: 0.001; 0.005 for cifar10; 0.05 for synthetic; 0.05 for table]" in text


def test_a_bad_config_file_gets_one_line_with_the_dotted_key_and_the_file(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("run:\n  dataset: synthetic\n  lr_decay: 3\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--config", str(path), "--quiet"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: lr_decay: must be <= 1")
    path.write_text("run:\n  rounds: many\n")
    with pytest.raises(SystemExit):
        main(["simulate", "--config", str(path), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert err == f"error: run.rounds: in {path}: expected an integer, got 'many'"


def test_a_bad_deadline_names_the_option(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["topology", "ring", "--nodes", "3", "--round-deadline", "0", "--out",
              str(tmp_path)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == "error: round_deadline: must be > 0, got 0.0"
    assert not list(tmp_path.glob("*.yaml"))
