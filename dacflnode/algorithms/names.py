"""The names of the algorithms, mixings and topologies, without the code that runs them.

Settings (:mod:`dacflnode.config`) and command-line options list these names as their choices;
keeping them here, free of torch and numpy, lets ``dacflnode --help`` and the settings schema
load without the numerical stack. The modules that implement each name import it from here.
"""

from __future__ import annotations

#: Every algorithm the simulator runs (:mod:`dacflnode.algorithms.rounds`).
ALGORITHMS = ("dacfl", "cdsgd", "dpsgd", "fedavg")
#: The algorithms that need no central god node, the ones a daemon can run; a test checks them
#: against each algorithm's ``decentralized`` flag (:mod:`dacflnode.peers.algorithms`).
DAEMON_ALGORITHMS = ("dacfl", "cdsgd")
#: DACFL's tracking difference: the paper's lagged one or the fresh one.
FODAC_VARIANTS = ("lagged", "fresh")
#: How a node mixes its neighbours' states.
MIXINGS = ("exact", "clipped")
#: When nodes exchange: in synchronized rounds (the paper's) or asynchronously, each node at
#: its own pace through pairwise exchanges (docs/algorithm.md, "Asynchronous DACFL").
SCHEDULES = ("sync", "async")

#: Topologies given as a mixing matrix built with a global view (simulator only).
MATRIX_KINDS = ("dense", "sparse", "uniform", "custom")
#: Topologies given as a graph with Metropolis-Hastings weights (simulator and daemons).
GRAPH_KINDS = ("ring", "complete", "random-regular", "erdos-renyi", "edge-list")
TOPOLOGIES = MATRIX_KINDS + GRAPH_KINDS
#: The fewest nodes of a ring (two nodes have one edge: a complete graph).
RING_MIN_NODES = 3

#: The consensus demo's input signals and mixing matrices
#: (:mod:`dacflnode.algorithms.consensus_demo`).
DEMO_INPUTS = ("I", "II")
DEMO_MATRICES = ("sparse", "dense", "uniform", "ring")
