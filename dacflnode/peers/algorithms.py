"""Which algorithms a daemon can run.

An algorithm that needs a network-wide average each round (a central "god node": D-PSGD,
FedAvg) says so with ``decentralized = False`` (:mod:`dacflnode.algorithms.rounds`); the
simulator provides that average, a daemon cannot. The list of the others is kept torch-free in
:mod:`dacflnode.algorithms.names` (so reading a peers file loads no torch); a test checks it
against each algorithm's ``decentralized``.
"""

from __future__ import annotations

from collections.abc import Callable

from dacflnode.algorithms.names import ALGORITHMS, DAEMON_ALGORITHMS
from dacflnode.errors import ConfigError

__all__ = ["DAEMON_ALGORITHMS", "SIMULATION_ONLY", "check_algorithm"]

#: Algorithms only the simulator can run.
SIMULATION_ONLY = tuple(n for n in ALGORITHMS if n not in DAEMON_ALGORITHMS)


def check_algorithm(name: str, error: Callable[[str], ConfigError] | None = None) -> str:
    """``name`` if a daemon can run it, else a ConfigError (field ``algorithm``, or whatever
    ``error`` builds from the message)."""

    def fail(message: str) -> ConfigError:
        return error(message) if error is not None else ConfigError("algorithm", message)

    if name in SIMULATION_ONLY:
        raise fail(
            f"'{name}' is simulation-only (it needs a central god node); a daemon runs"
            f" {' or '.join(DAEMON_ALGORITHMS)}"
        )
    if name not in DAEMON_ALGORITHMS:
        raise fail(f"unknown algorithm '{name}' (choose from {', '.join(DAEMON_ALGORITHMS)})")
    return name
