"""Command-line options generated from the settings' declarations (:mod:`dacflnode.config`).

Each run setting becomes one option of every command that starts or describes a run
(``simulate``, ``launch``, ``topology``): its flag, type, choices, help and shown default all
come from the one declaration, so the options cannot drift from the YAML keys. Run options
default to ``None`` ("not given") so that flags overlay a ``--config`` file; daemon options
(``--round-deadline``, ...) carry their declared default.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from dacflnode.config import DaemonSettings, RunConfig, config_from_mapping, load_yaml_config
from dacflnode.config.schema import Declared, fields_of

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def option_help(d: Declared) -> str:
    """The help text of ``d``'s option: the declared help, the choices of a list, the default."""
    text = d.setting.help
    if d.is_list and d.setting.choices:
        text += f" Choices: {', '.join(d.setting.choices)}."
    return f"{text} [default: {d.default_text}]"


def click_type(d: Declared) -> Any:
    """The click parameter type of ``d`` (a comma list stays a string until it is coerced)."""
    if d.setting.choices is not None and not d.is_list:
        return click.Choice(d.setting.choices)
    if d.is_list:
        return str
    return d.base


def run_option(d: Declared) -> Decorator:
    """The option of one run setting; ``None`` when not given."""
    if d.base is bool:
        return click.option(f"{d.flag}/--no-{d.flag[2:]}", d.name, default=None,
                            help=option_help(d))
    return click.option(d.flag, d.name, type=click_type(d), default=None,
                        metavar=d.setting.metavar, help=option_help(d))


def daemon_option(d: Declared) -> Decorator:
    """The option of one daemon setting, with its declared default shown."""
    return click.option(d.flag, d.name, type=click_type(d), default=d.default,
                        show_default=True, metavar=d.setting.metavar, help=d.setting.help)


def run_option_fields() -> tuple[Declared, ...]:
    """The run settings offered as command-line options, in declaration order."""
    return tuple(d for d in fields_of(RunConfig) if d.setting.cli)


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
    """``--config`` and one option per run setting."""
    options: list[Decorator] = [_CONFIG_OPTION, *map(run_option, run_option_fields())]
    for option in reversed(options):
        func = option(func)
    return func


def daemon_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """One option per daemon setting (``--round-deadline``, ``--hello-timeout``)."""
    for d in reversed(daemon_option_fields()):
        func = daemon_option(d)(func)
    return func


def config_from_options(options: dict[str, Any]) -> RunConfig:
    """YAML file (if any) overlaid with the flags the user gave."""
    config_file = options.pop("config_file", None)
    base = load_yaml_config(Path(config_file)) if config_file else RunConfig()
    given = {k: v for k, v in options.items() if v is not None}
    return config_from_mapping(given, base).validate()
