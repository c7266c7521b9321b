"""The names of the data sets, partitions and precisions, without the code that loads them, and
the names of a generated run's nodes (:func:`node_ids`).

Settings (:mod:`dacflnode.config`) and command-line options list these names as their choices;
keeping them here, free of torch and numpy, lets ``dacflnode --help`` and the settings schema
load without the numerical stack. The modules that implement each name import it from here.
"""

from __future__ import annotations

#: The built-in data sets (:mod:`dacflnode.learning.datasets`).
DATASETS = ("fashion-mnist", "mnist", "cifar10", "synthetic")
#: How a built-in training set is split over the nodes (:mod:`dacflnode.learning.partition`).
PARTITIONS = ("iid", "shards", "dirichlet")
#: Arithmetic of local training (:mod:`dacflnode.learning.train`).
PRECISIONS = ("fp32", "bf16")


def node_ids(n: int) -> list[str]:
    """The ids of the ``n`` nodes of a generated cluster, a simulation and a data split:
    ``node-0`` … (node ``i`` trains on data part ``i``, in ``DIR/node-i/`` for own data)."""
    return [f"node-{i}" for i in range(n)]
