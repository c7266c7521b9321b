"""The policies a simulated node gets because the simulator sees the whole network.

* :class:`MatrixRows` — node ``i`` mixes with row ``i`` of the round's matrix ``W(t)`` (the
  paper's dense and sparse constructions, a uniform or a custom matrix, FedAvg's data-size
  weights) and its active neighbours are the non-zeros of that row. Graph topologies do not use
  it: their nodes mix with the daemon's own Metropolis weights, so ``launch`` equals
  ``simulate --engine sequential``.
* :class:`NetworkAverage` — the god node of D-PSGD and FedAvg (docs/algorithm.md): every node is
  evaluated on, and saves, the (data-weighted) network average of the nodes' models; it is
  computed and evaluated once per round and handed to every node.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

import numpy as np
import torch

from dacflnode.algorithms.rounds import network_average
from dacflnode.protocol.training import NodeTrainer
from dacflnode.sim.gather import RoundGather


class MatrixRows:
    """Mixing weights and active neighbours from a mixing matrix per round (a
    :class:`~dacflnode.protocol.policies.MixingPolicy`)."""

    def __init__(self, ids: Sequence[str], matrix: Callable[[int], np.ndarray]) -> None:
        self.ids = list(ids)
        self.index = {node: i for i, node in enumerate(self.ids)}
        self.matrix = matrix

    def row(self, node: str, round_: int) -> dict[str, float]:
        """The non-zeros of ``node``'s row of ``W(round_)``, by node id (itself included)."""
        row = self.matrix(round_)[self.index[node]]
        return {self.ids[j]: float(w) for j, w in enumerate(row) if w != 0.0}

    def active(self, node: str) -> Callable[[int], list[str]]:
        """``node``'s active neighbours per round: the others with a non-zero weight."""
        return lambda t: sorted(j for j in self.row(node, t) if j != node)

    def weights(
        self, node: str, round_: int, own_degree: int, degrees: Mapping[str, int]
    ) -> dict[str, float]:
        row = self.row(node, round_)
        weights = {j: w for j, w in row.items() if j == node or j in degrees}
        # a neighbour that did not deliver: its weight stays with the node (docs/faults.md)
        weights[node] = weights.get(node, 0.0) + sum(
            w for j, w in row.items() if j != node and j not in degrees)
        return weights


class NetworkAverage:
    """The god node: gathers every node's model of a round, averages, evaluates once.

    ``weights`` are the averaging weights in the order of ``ids`` (``None``: uniform, D-PSGD;
    FedAvg passes the data sizes). ``evaluate_one`` evaluates one flat model.
    """

    def __init__(
        self,
        ids: Sequence[str],
        weights: Sequence[float] | None,
        evaluate_one: Callable[[torch.Tensor], Awaitable[tuple[float, float]]],
    ) -> None:
        self.ids = list(ids)
        self.weights = None if weights is None else [float(w) for w in weights]
        self._evaluate_one = evaluate_one
        self.evaluations: RoundGather[torch.Tensor, tuple[float, float]] = RoundGather(
            ids, self._evaluate_all)
        self.finals: RoundGather[torch.Tensor, torch.Tensor] = RoundGather(ids, self._final_all)

    def _average(self, models: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return network_average([models[node] for node in self.ids], self.weights)

    async def _evaluate_all(
        self, round_: int, models: Mapping[str, torch.Tensor]
    ) -> dict[str, tuple[float, float]]:
        result = await self._evaluate_one(self._average(models))
        return dict.fromkeys(self.ids, result)

    async def _final_all(
        self, round_: int, models: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        return dict.fromkeys(self.ids, self._average(models))

    def view(self, node: str) -> NodeView:
        return NodeView(self, node)


class NodeView:
    """One node's :class:`~dacflnode.protocol.policies.ModelView` onto a :class:`NetworkAverage`."""

    def __init__(self, average: NetworkAverage, node: str) -> None:
        self.average = average
        self.node = node

    async def evaluate(
        self, round_: int, model: torch.Tensor, trainer: NodeTrainer
    ) -> tuple[float, float]:
        return await self.average.evaluations.submit(round_, self.node, model)

    async def final(self, round_: int, model: torch.Tensor) -> torch.Tensor:
        return await self.average.finals.submit(round_, self.node, model)
