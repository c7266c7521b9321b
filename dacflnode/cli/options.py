"""Run options shared by every command that starts training (simulate, and later launch)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from dacflnode.algorithms.topology import TOPOLOGIES
from dacflnode.config import ENGINES, RunConfig, config_from_mapping, load_yaml_config
from dacflnode.learning.datasets import DATASETS
from dacflnode.learning.partition import PARTITIONS

_RUN_OPTIONS: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
    click.option(
        "--config",
        "config_file",
        type=click.Path(dir_okay=False),
        help="YAML file of run options (flags override it).",
    ),
    click.option("--algorithm", help="Comma list of dacfl, cdsgd, dpsgd, fedavg. [default: dacfl]"),
    click.option("--nodes", type=int, help="Number of nodes. [default: 10]"),
    click.option("--rounds", type=int, help="Communication rounds. [default: 100]"),
    click.option("--dataset", type=click.Choice(DATASETS), help="[default: fashion-mnist]"),
    click.option(
        "--data-root",
        help="Folder holding the data set files "
        "(Fashion-MNIST: /usr/share/datasets/fashion-mnist by default).",
    ),
    click.option(
        "--download/--no-download",
        default=None,
        help="Let torchvision download the data set if it is missing.",
    ),
    click.option("--partition", type=click.Choice(PARTITIONS), help="[default: iid]"),
    click.option("--dirichlet-alpha", type=float, help="Concentration for --partition dirichlet."),
    click.option(
        "--model",
        help="fmnist-cnn, cifar-cnn, mlp, tiny-cnn or package.module:Class [default: per data set]",
    ),
    click.option("--topology", type=click.Choice(TOPOLOGIES), help="[default: dense]"),
    click.option("--degree", type=int, help="Degree of --topology random-regular."),
    click.option("--edge-prob", type=float, help="Edge probability of --topology erdos-renyi."),
    click.option("--edge-list", help="File of 'i j' lines for --topology edge-list."),
    click.option("--mixing-matrix", help="File holding a custom mixing matrix (topology custom)."),
    click.option(
        "--time-varying",
        type=int,
        metavar="K",
        help="Rebuild the topology every K rounds (0 = static). [default: 0]",
    ),
    click.option("--lr", type=float, help="Learning rate [default: 0.001; 0.005 for cifar10]."),
    click.option("--lr-decay", type=float, help="Per-round learning-rate decay. [default: 0.995]"),
    click.option("--momentum", type=float, help="SGD momentum. [default: 0]"),
    click.option("--batch-size", type=int, help="[default: 20]"),
    click.option("--local-epochs", type=int, help="[default: 1]"),
    click.option("--local-steps", type=int, help="Mini-batches per round (overrides epochs)."),
    click.option(
        "--fodac-variant",
        type=click.Choice(["lagged", "fresh"]),
        help="DACFL tracking: the paper's lagged difference or the fresh one.",
    ),
    click.option("--seed", type=int, help="[default: 0]"),
    click.option("--eval-every", type=int, help="Evaluate every N rounds. [default: 1]"),
    click.option("--eval-samples", type=int, help="Evaluate on a fixed subset of the test set."),
    click.option("--device", help="auto, cpu, cuda, cuda:N or mps. [default: auto]"),
    click.option("--threads", type=int, help="PyTorch CPU threads per process (bit-identical "
                 "results need equal counts). [default: PyTorch's]"),
    click.option(
        "--engine",
        type=click.Choice(ENGINES),
        help="How the simulator trains its nodes. [default: auto]",
    ),
]


def run_options(func: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(_RUN_OPTIONS):
        func = option(func)
    return func


def config_from_options(options: dict[str, Any]) -> RunConfig:
    """YAML file (if any) overlaid with the flags the user gave."""
    config_file = options.pop("config_file", None)
    base = load_yaml_config(Path(config_file)) if config_file else RunConfig()
    given = {k: v for k, v in options.items() if v is not None}
    return config_from_mapping(given, base).validate()
