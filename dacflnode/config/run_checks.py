"""The checks of a run's settings that span several of them (:func:`check_run`, which
:meth:`RunConfig.validate <dacflnode.config.run.RunConfig.validate>` runs): algorithms that
cannot go together, compression with the mixing, what own data needs, the data and matrix files,
and the graph and matrix of round 0. A single setting's choices and bounds are declared with it
(:func:`dacflnode.config.schema.check`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from dacflnode.algorithms.compression_spec import parse_compression
from dacflnode.config import schema
from dacflnode.config.own_data import OwnDataSettings, check_own_data
from dacflnode.errors import ConfigError

if TYPE_CHECKING:
    from dacflnode.algorithms.topology import TopologySpec

__all__ = ["check_run"]


class CheckedSettings(OwnDataSettings, Protocol):
    """The settings of a :class:`~dacflnode.config.run.RunConfig` that these checks read (a
    protocol, so that this module, which ``run.py`` imports, imports nothing of it)."""

    @property
    def algorithm(self) -> tuple[str, ...]: ...
    @property
    def mixing(self) -> str: ...
    @property
    def compression(self) -> str: ...
    @property
    def own_data(self) -> bool: ...
    @property
    def data_root(self) -> str | None: ...
    @property
    def download(self) -> bool: ...
    @property
    def mixing_matrix(self) -> str | None: ...
    @property
    def schedule(self) -> str: ...
    @property
    def topology(self) -> str: ...
    @property
    def time_varying(self) -> int: ...
    def topology_spec(self) -> TopologySpec: ...


def check_run(run: CheckedSettings) -> None:
    """The declared checks (choices, bounds), then the ones that span several settings; a
    :class:`ConfigError` naming the setting for the first problem."""
    if not run.algorithm:
        raise ConfigError("algorithm", "name at least one algorithm")
    schema.check(run)
    if len(set(run.algorithm)) != len(run.algorithm):
        raise ConfigError("algorithm", "an algorithm is named twice")
    if run.mixing == "clipped" and "fedavg" in run.algorithm:
        raise ConfigError(
            "mixing",
            "fedavg averages at a server and has no neighbour to clip: run it with"
            " mixing exact, apart from the gossip algorithms",
        )
    try:
        spec = parse_compression(run.compression)
    except ValueError as exc:
        raise ConfigError("compression", str(exc)) from None
    if spec.compressed and run.mixing != "exact":
        raise ConfigError(
            "compression",
            f"a compressed run mixes with CHOCO-Gossip, not mixing {run.mixing}: use one"
            " of them",
        )
    if spec.compressed and "fedavg" in run.algorithm:
        raise ConfigError(
            "compression",
            "fedavg averages at a server and has no gossip to compress: run it with"
            " compression none, apart from the gossip algorithms",
        )
    if run.schedule == "async":
        _check_async(run)
    if run.own_data:
        check_own_data(run)
    elif run.data_root is not None and not Path(run.data_root).is_dir() and not run.download:
        raise ConfigError("data_root", f"{run.data_root} is not a directory")
    if run.mixing_matrix is not None and not Path(run.mixing_matrix).is_file():
        raise ConfigError("mixing_matrix", f"{run.mixing_matrix} is not a file")
    if "fedavg" not in run.algorithm or len(run.algorithm) > 1:
        from dacflnode.algorithms.topology import MixingSchedule

        MixingSchedule(run.topology_spec())  # builds round 0: graph and matrix checks


def _check_async(run: CheckedSettings) -> None:
    """What the asynchronous schedule runs (docs/algorithm.md, "Asynchronous DACFL"): DACFL
    on a static graph, mixing exactly (states full or compressed). Each refusal says why."""
    from dacflnode.algorithms.names import GRAPH_KINDS

    others = [a for a in run.algorithm if a != "dacfl"]
    if others:
        raise ConfigError("schedule", f"schedule async runs dacfl (its FODAC estimate keeps the"
                          f" pairwise exchanges' sum exact), not {', '.join(others)}")
    if run.topology not in GRAPH_KINDS:
        raise ConfigError("schedule", f"schedule async needs a graph topology (pairwise"
                          f" Metropolis weights each edge agrees on), not {run.topology}: e.g."
                          " --topology ring")
    if run.time_varying:
        raise ConfigError("schedule", "schedule async mixes whichever neighbours answer, so"
                          " it has no rounds to vary the graph by: set time_varying 0")
    if run.mixing != "exact":
        raise ConfigError("schedule", f"schedule async mixes exactly: mixing {run.mixing} "
                          "clips per round, and an exchange has no round")
