"""How every command reports a bad setting: one line naming it, and exit code 2.

It lives apart from :mod:`dacflnode.cli.main` so that command modules need not import the module
that assembles them: the group in ``main`` imports the commands, never the other way round.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import click

from dacflnode.errors import ConfigError

P = ParamSpec("P")
R = TypeVar("R")


def config_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn a :class:`ConfigError` into a one-line message naming the option, and exit code 2.

    The same exit code as click's own usage errors, so scripts can tell a refused setting from a
    failed run.
    """

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except ConfigError as exc:
            click.echo(f"error: {exc.field}: {exc.message}", err=True)
            sys.exit(2)

    return wrapper
