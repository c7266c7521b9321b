"""The ``dacflnode`` command: a thin layer over the package; every command has ``--help``.

Commands are plain ``click.command`` functions in their own modules; this module is the only one
that knows them all (:data:`COMMANDS`). Dependencies run one way: ``main`` loads the commands,
a command never imports ``main`` (an import contract in pyproject.toml checks it). A command's
module is imported when that command runs or shows its help, so ``dacflnode --help`` and
``dacflnode status`` load no more than they use.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import MutableMapping
from typing import Any

import click

from dacflnode import __version__

#: Every command: the module and attribute of its ``click.Command``, and its line in the
#: top-level ``--help`` (the command's own ``--help`` says the rest).
COMMANDS: dict[str, tuple[str, str, str]] = {
    "simulate": ("dacflnode.cli.simulate", "simulate",
                 "Run N nodes in one process and record the paper's metrics."),
    "launch": ("dacflnode.cli.launch", "launch",
               "Start a real local cluster: one `dacflnode start` process per node on 127.0.0.1."),
    "topology": ("dacflnode.cli.topology", "topology_cmd",
                 "Write the peers file of every node of a cluster whose graph is KIND."),
    "certs": ("dacflnode.cli.certs", "certs_cmd",
              "Write a CA and one certificate per node for mutual TLS."),
    "start": ("dacflnode.cli.daemon_cmds", "start",
              "Run this node, from its peers file, until its rounds are done."),
    "status": ("dacflnode.cli.daemon_cmds", "status",
               "Show a running node: round, phase, neighbours, last accuracy and loss."),
    "metrics": ("dacflnode.cli.daemon_cmds", "metrics",
                "Print a running node's metrics (JSON, or Prometheus text exposition)."),
    "stop": ("dacflnode.cli.daemon_cmds", "stop",
             "Ask a running node to stop gracefully (checkpoint, exit 0), or to leave."),
    "invariant": ("dacflnode.cli.invariant", "invariant_cmd",
                  "Check DACFL's consensus invariant over a set of nodes."),
    "report": ("dacflnode.cli.report", "report_cmd",
               "Plot and tabulate runs from their metrics.jsonl files."),
    "data": ("dacflnode.cli.data", "data_cmd",
             "Check a device's own data, or split a data set into per-device folders."),
    "consensus-demo": ("dacflnode.cli.consensus_demo", "consensus_demo_cmd",
                       "Track the average of 10 time-varying inputs with FODAC (paper Fig. 3)."),
}


class _Commands(click.Group):
    """The ``dacflnode`` group. It imports a command's module when the command is looked up
    (:meth:`get_command`), and its ``--help`` lists every command with its whole summary from
    :data:`COMMANDS` without importing any (click's default would import them all, and cut each
    summary to the width left of a line). :attr:`commands` loads them all."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loaded: dict[str, click.Command] = {}
        super().__init__(*args, **kwargs)

    @property
    def commands(self) -> MutableMapping[str, click.Command]:
        """Every command, loaded."""
        for name in COMMANDS:
            self._load(name)
        return self._loaded

    @commands.setter
    def commands(self, value: MutableMapping[str, click.Command]) -> None:
        self._loaded = dict(value)

    def _load(self, name: str) -> click.Command | None:
        if name not in self._loaded and name in COMMANDS:
            module, attribute, summary = COMMANDS[name]
            command = getattr(importlib.import_module(module), attribute)
            if not isinstance(command, click.Command) or command.name != name:
                raise TypeError(f"{module}.{attribute} is not the command {name!r}")
            if command.short_help is None:
                command.short_help = summary
            self._loaded[name] = command
        return self._loaded.get(name)

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        name = name or cmd.name
        if name is None:
            raise TypeError("Command has no name.")
        self._loaded[name] = cmd

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return self._load(cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(self._loaded))

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            if name in COMMANDS:
                rows.append((name, COMMANDS[name][2]))
            elif not self._loaded[name].hidden:
                rows.append((name, self._loaded[name].get_short_help_str(limit=10_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=_Commands,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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
