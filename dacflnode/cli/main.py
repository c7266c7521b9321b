"""The ``dacflnode`` command: a thin layer over the package; every command has ``--help``."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from dacflnode import __version__
from dacflnode.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])


def config_errors(func: F) -> F:
    """Turn a :class:`ConfigError` into a one-line message naming the option, and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ConfigError as exc:
            click.echo(f"error: {exc.field}: {exc.message}", err=True)
            sys.exit(2)

    return wrapper  # type: ignore[return-value]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="dacflnode")
def cli() -> None:
    """dacflnode: decentralized federated learning with dynamic average consensus (DACFL).

    \b
    Examples:
      dacflnode simulate --nodes 10 --rounds 20 --out runs/demo
      dacflnode consensus-demo --inputs I --matrix sparse
    """


def main(argv: list[str] | None = None) -> None:
    """Entry point. Usage errors print one line naming the option and exit with code 2."""
    from dacflnode.cli import (  # noqa: F401  (importing registers the commands)
        consensus_demo,
        daemon_cmds,
        launch,
        simulate,
        topology,
    )

    try:
        code = cli.main(args=argv, prog_name="dacflnode", standalone_mode=False)
    except click.UsageError as exc:
        hint = (
            f" (see: dacflnode {exc.ctx.command_path.split(' ', 1)[-1]} --help)"
            if (exc.ctx is not None and " " in exc.ctx.command_path)
            else " (see: dacflnode --help)"
        )
        click.echo(f"error: {exc.format_message()}{hint}", err=True)
        sys.exit(2)
    except click.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
