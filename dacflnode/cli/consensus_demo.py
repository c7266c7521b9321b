"""``dacflnode consensus-demo``: the paper's Fig. 3 experiment."""

from __future__ import annotations

import json

import click

from dacflnode.algorithms.names import DEMO_INPUTS, DEMO_MATRICES
from dacflnode.cli.errors import config_errors
from dacflnode.cli.options import choice_option


@click.command("consensus-demo")
@choice_option("--inputs", DEMO_INPUTS, "I",
               "I: r_i(t) = sin t + (1/t)^i + t + i;  II: the same without + i.")
@choice_option("--matrix", DEMO_MATRICES, "sparse",
               "Mixing matrix (ring = 10-node ring with Metropolis weights).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of random matrices.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Also write a PNG plot here.")
@config_errors
def consensus_demo_cmd(
    inputs: str, matrix: str, seed: int, as_json: bool, plot: str | None
) -> None:
    """Track the average of 10 time-varying inputs with FODAC, CDSGD and D-PSGD (paper Fig. 3).

    mae[k] is the mean over nodes of |estimate_i - mean_j r_j| at step t = k+1.

    \b
    Examples:
      dacflnode consensus-demo --inputs I --matrix sparse
      dacflnode consensus-demo --inputs II --matrix dense --json --plot fig3.png
    """
    from rich.console import Console
    from rich.table import Table

    from dacflnode.algorithms.consensus_demo import consensus_demo

    result = consensus_demo(inputs, matrix, seed)
    if plot:
        from dacflnode.sim.plots import plot_consensus_demo

        plot_consensus_demo(result.mae, plot, f"Inputs {inputs}, {matrix} matrix")
    if as_json:
        click.echo(json.dumps(result.to_json()))
        return
    table = Table(title=f"Mean absolute tracking error, Inputs {inputs}, {matrix} matrix")
    table.add_column("t", justify="right")
    for name in result.mae:
        table.add_column(name.upper(), justify="right")
    for k in range(result.steps):
        table.add_row(str(k + 1), *(f"{result.mae[n][k]:.4g}" for n in result.mae))
    Console().print(table)
    if plot:
        click.echo(f"plot written to {plot}")
