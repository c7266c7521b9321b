"""Command-line options generated from the settings' declarations (:mod:`dacflnode.config`).

Each run setting becomes one option of every command that starts or describes a run
(``simulate``, ``launch``, ``topology``): its flag, type, choices, help and shown default all
come from the one declaration, so the options cannot drift from the YAML keys. Run options
default to ``None`` ("not given") so that flags overlay a ``--config`` file; daemon options
(``--round-deadline``, ...) carry their declared default.

The cluster commands (``launch``, ``topology``) run daemons: they leave out the simulator's own
settings (``--engine``, ...) and offer the values a daemon runs (a setting's ``cluster_choices``).

``--help`` lists the options in sections (:class:`GroupedCommand`): a setting's section is its
declared ``group``; a command names the sections of its own options.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from dacflnode.config import DaemonSettings, RunConfig, config_from_mapping, load_yaml_config
from dacflnode.config.schema import (
    OPTION_GROUPS,
    Declared,
    check,
    field_of,
    fields_of,
    from_mapping,
)

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]

#: The title of each section of ``--help``, in :data:`~dacflnode.config.schema.OPTION_GROUPS`
#: order.
GROUP_TITLES: dict[str, str] = {
    "run": "Run",
    "data": "Data",
    "model": "Model",
    "training": "Training",
    "topology": "Topology and mixing",
    "evaluation": "Evaluation",
    "runtime": "Runtime",
    "network": "Network and security",
    "output": "Output",
}

class GroupedCommand(click.Command):
    """A command whose ``--help`` lists its options in sections, in ``OPTION_GROUPS`` order.

    An option's section is ``option_groups[name]`` (the command's own options) or else the
    declared ``group`` of the setting of that name; ``--help`` and anything unsorted close the
    list under "Other options".
    """

    def __init__(self, *args: Any, option_groups: Mapping[str, str] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.option_groups = dict(option_groups or {})
        unknown = sorted(set(self.option_groups.values()) - set(OPTION_GROUPS))
        if unknown:
            raise TypeError(f"unknown option groups {unknown} (choose from {OPTION_GROUPS})")

    def group_of(self, param: click.Parameter) -> str | None:
        """The section ``param`` is listed in; ``None``: "Other options"."""
        name = param.name or ""
        if name in self.option_groups:
            return self.option_groups[name]
        return _SETTING_GROUPS.get(name)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str | None, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                sections.setdefault(self.group_of(param), []).append(record)
        for key in (*OPTION_GROUPS, None):
            records = sections.get(key)
            if records:
                title = GROUP_TITLES[key] if key is not None else "Other options"
                with formatter.section(title):
                    formatter.write_dl(records)


#: The section of every option a command takes from here: ``--config`` and the settings (their
#: declared group).
_SETTING_GROUPS: dict[str, str] = {
    "config_file": "run",
    **{
        d.name: d.setting.group
        for cls in (RunConfig, DaemonSettings)
        for d in fields_of(cls)
        if d.setting.cli and d.setting.group is not None
    },
}


def option_help(d: Declared, cluster: bool = False,
                default_text: Mapping[str, str] | None = None) -> str:
    """The help text of ``d``'s option: the declared help, the choices of a list, the default;
    for a cluster command, the cluster's help and choices where the setting declares them."""
    text = d.setting.help
    if cluster and d.setting.cluster_help is not None:
        text = d.setting.cluster_help
    if d.is_list and d.setting.choices:
        text += f" Choices: {', '.join(choices_of(d, cluster))}."
    shown = (default_text or {}).get(d.name, d.default_text)
    return f"{text} [default: {shown}]"


def choices_of(d: Declared, cluster: bool = False) -> tuple[str, ...]:
    """The values ``d``'s option offers (``()`` when free)."""
    if cluster and d.setting.cluster_choices is not None:
        return d.setting.cluster_choices
    return d.setting.choices or ()


def click_type(d: Declared, cluster: bool = False) -> Any:
    """The click parameter type of ``d`` (a comma list stays a string until it is coerced)."""
    if d.setting.choices is not None and not d.is_list:
        return click.Choice(choices_of(d, cluster))
    if d.is_list:
        return str
    return d.base


def run_option(d: Declared, cluster: bool = False,
               default_text: Mapping[str, str] | None = None) -> Decorator:
    """The option of one run setting; ``None`` when not given."""
    text = option_help(d, cluster, default_text)
    if d.base is bool:
        return click.option(f"{d.flag}/--no-{d.flag[2:]}", d.name, default=None, help=text)
    return click.option(d.flag, d.name, type=click_type(d, cluster), default=None,
                        metavar=d.setting.metavar, help=text)


def daemon_option(d: Declared) -> Decorator:
    """The option of one daemon setting, with its declared default shown."""
    return click.option(d.flag, d.name, type=click_type(d), default=d.default,
                        show_default=True, metavar=d.setting.metavar, help=d.setting.help)


def run_option_fields(cluster: bool = False) -> tuple[Declared, ...]:
    """The run settings offered as command-line options, in declaration order (a cluster
    command: without the simulator's own)."""
    return tuple(d for d in fields_of(RunConfig)
                 if d.setting.cli and not (cluster and d.setting.simulator_only))


def daemon_option_fields() -> tuple[Declared, ...]:
    """The daemon settings offered as command-line options, in declaration order."""
    return tuple(d for d in fields_of(DaemonSettings) if d.setting.cli)


_CONFIG_OPTION: Decorator = click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    help="YAML file of run options (flags override it).",
)


def run_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--config`` and one option per run setting (the simulator's)."""
    options: list[Decorator] = [_CONFIG_OPTION, *map(run_option, run_option_fields())]
    for option in reversed(options):
        func = option(func)
    return func


def cluster_options(**default_text: str) -> Decorator:
    """The options of a command that runs daemons: ``--config`` and one option per run setting
    a daemon uses, with the values a daemon runs (``default_text``, by setting name, says what
    the command uses when not given), then one per daemon setting (``--round-deadline``,
    ``--hello-timeout``, ...; see :func:`pop_daemon_settings`)."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        options = [_CONFIG_OPTION, *(run_option(d, True, default_text)
                                     for d in run_option_fields(cluster=True)),
                   *map(daemon_option, daemon_option_fields())]
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


def daemon_setting_option(name: str) -> Decorator:
    """The option of the daemon setting ``name`` alone, for a command that plays that part
    of a daemon (``simulate --gone-after``); check its value with :func:`daemon_settings`."""
    return daemon_option(field_of(DaemonSettings, name))


def daemon_settings(values: Mapping[str, Any]) -> DaemonSettings:
    """The daemon settings ``values`` (by name) over the defaults, checked as a peers file's
    are (:class:`~dacflnode.errors.ConfigError` naming the setting)."""
    settings = from_mapping(DaemonSettings, values)
    check(settings)
    return settings


def pop_daemon_settings(options: dict[str, Any]) -> dict[str, Any]:
    """The daemon settings among a cluster command's ``options``, taken out of them (they go
    to every peers file, beside the run settings)."""
    return {d.name: options.pop(d.name) for d in daemon_option_fields() if d.name in options}


def parse_slowdown(values: Sequence[str]) -> dict[str, float]:
    """``NODE=F`` pairs (``--slowdown``) as ``{node: F}``; a ConfigError naming the bad one."""
    from dacflnode.errors import ConfigError

    out: dict[str, float] = {}
    for value in values:
        node, sep, factor = value.partition("=")
        try:
            number = float(factor)
        except ValueError:
            number = float("nan")
        if not sep or not node.strip() or not number >= 1.0 or number == float("inf"):
            raise ConfigError("slowdown", f"{value!r}: give NODE=F with F >= 1, e.g. "
                              "--slowdown node-0=4")
        out[node.strip()] = number
    return out


def slowdown_option(where: str) -> Decorator:
    """``--slowdown NODE=F`` (repeatable): the nodes that train F times slower; ``where``: how
    the command makes them slow."""
    return click.option("--slowdown", "slowdown", multiple=True, metavar="NODE=F",
                        help=f"Make NODE train F times slower than it can ({where}); "
                             "repeatable. Under --schedule async the others go on at their "
                             "own pace.")


def out_dir_option(text: str) -> Decorator:
    """``--out DIR`` (``out_dir``, required): the folder a command writes into; ``text``: its
    help."""
    return click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
                        help=text)


def choice_option(flag: str, choices: Sequence[str], default: str, text: str) -> Decorator:
    """``flag`` taking one of ``choices``, ``default`` when not given (shown in ``--help``);
    ``text``: its help."""
    return click.option(flag, type=click.Choice(choices), default=default, show_default=True,
                        help=text)


def config_from_options(options: dict[str, Any]) -> RunConfig:
    """YAML file (if any) overlaid with the flags the user gave."""
    config_file = options.pop("config_file", None)
    base = load_yaml_config(Path(config_file)) if config_file else RunConfig()
    given = {k: v for k, v in options.items() if v is not None}
    return config_from_mapping(given, base).validate()
