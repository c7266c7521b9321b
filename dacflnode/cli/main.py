"""The ``dacflnode`` command: a thin layer over the package; every command has ``--help``.

Commands are plain ``click.command`` functions in their own modules; this module is the only one
that knows them all and adds them to the group. Dependencies run one way: ``main`` imports the
commands, a command never imports ``main`` (an import contract in pyproject.toml checks it).
"""

from __future__ import annotations

import sys

import click

from dacflnode import __version__
from dacflnode.cli.certs import certs_cmd
from dacflnode.cli.consensus_demo import consensus_demo_cmd
from dacflnode.cli.daemon_cmds import metrics, start, status, stop
from dacflnode.cli.data import data_cmd
from dacflnode.cli.invariant import invariant_cmd
from dacflnode.cli.launch import launch
from dacflnode.cli.report import report_cmd
from dacflnode.cli.simulate import simulate
from dacflnode.cli.topology import topology_cmd


class _Commands(click.Group):
    """The ``dacflnode`` group: its ``--help`` lists each command with its whole summary
    (click's default cuts it to the width left of a line, ending in ``...``)."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=10_000)))
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


#: What each command does, in one line of the top-level ``--help`` (the command's own
#: ``--help`` says the rest).
SUMMARIES = {
    "simulate": "Run N nodes in one process and record the paper's metrics.",
    "launch": "Start a real local cluster: one `dacflnode start` process per node on 127.0.0.1.",
    "topology": "Write the peers file of every node of a cluster whose graph is KIND.",
    "certs": "Write a CA and one certificate per node for mutual TLS.",
    "start": "Run this node, from its peers file, until its rounds are done.",
    "status": "Show a running node: round, phase, neighbours, last accuracy and loss.",
    "metrics": "Print a running node's metrics (JSON, or Prometheus text exposition).",
    "stop": "Ask a running node to stop gracefully (checkpoint, exit 0), or to leave.",
    "invariant": "Check DACFL's consensus invariant over a set of nodes.",
    "report": "Plot and tabulate runs from their metrics.jsonl files.",
    "data": "Check a device's own data, or split a data set into per-device folders.",
    "consensus-demo": "Track the average of 10 time-varying inputs with FODAC (paper Fig. 3).",
}

for _command in (
    simulate,
    launch,
    topology_cmd,
    certs_cmd,
    start,
    status,
    metrics,
    stop,
    invariant_cmd,
    report_cmd,
    data_cmd,
    consensus_demo_cmd,
):
    if _command.short_help is None and _command.name in SUMMARIES:
        _command.short_help = SUMMARIES[_command.name]
    cli.add_command(_command)


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
