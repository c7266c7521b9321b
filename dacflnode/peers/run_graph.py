"""A run's graph by node id: who the nodes are, and whom each exchanges with in a round.

One definition for the daemon (:class:`~dacflnode.peers.model.PeersFile`) and the simulator
(:mod:`dacflnode.sim.simulator`), so that ``launch`` and ``simulate`` drop the same edges in the
same rounds:

* node ``i`` of a generated or simulated run is ``node-i``
  (:func:`~dacflnode.learning.names.node_ids`, which ``dacflnode data split`` names its folders
  with too);
* in a time-varying run (``time_varying = k > 0``) a node exchanges in round ``t`` with its
  neighbours over the edges :func:`~dacflnode.algorithms.topology.active_edges` keeps in epoch
  ``t // k``, in id order (:meth:`RunGraph.active_neighbours`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dacflnode.algorithms import graphs
from dacflnode.algorithms.topology import active_edges


@dataclass(frozen=True)
class RunGraph:
    """The base graph ``base`` (index pairs over ``members``) and how it varies: rebuilt every
    ``time_varying`` rounds (0: static) from ``seed``, each edge dropped with ``drop_prob``."""

    members: tuple[str, ...]
    base: graphs.Edges
    time_varying: int
    seed: int
    drop_prob: float

    @classmethod
    def of(cls, members: Sequence[str], base: graphs.Edges, time_varying: int, seed: int,
           drop_prob: float) -> RunGraph:
        return cls(tuple(members), base, time_varying, seed, drop_prob)

    def edges(self, t: int) -> graphs.Edges:
        """The edges active in round ``t``."""
        if self.time_varying <= 0:
            return self.base
        return active_edges(len(self.members), self.base, self.seed, t // self.time_varying,
                            self.drop_prob)

    def active_neighbours(self, node: str, t: int) -> list[str]:
        """The ids ``node`` exchanges with in round ``t``, sorted."""
        me = self.members.index(node)
        return sorted(self.members[j if i == me else i] for i, j in self.edges(t) if me in (i, j))
