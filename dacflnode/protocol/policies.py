"""The two decisions of a round that depend on where a node runs, as small injectable policies.

* :class:`MixingPolicy` — the weights a node mixes its neighbours' states with. A daemon knows
  only its own degree and the degrees its neighbours announce, so its policy is
  :class:`Metropolis` (docs/algorithm.md); a simulator with a global view may hand each node its
  row of a mixing matrix instead.
* :class:`ModelView` — which model a node is evaluated on and writes as its final model. A
  decentralized node has only its own (:class:`OwnModel`); D-PSGD and FedAvg are defined on the
  network average, which only a simulator can compute.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import torch

from dacflnode.algorithms.mixing import metropolis_weights
from dacflnode.protocol.training import NodeTrainer


class MixingPolicy(Protocol):
    """Mixing weights of one node in one round."""

    def weights(
        self, node: str, round_: int, own_degree: int, degrees: Mapping[str, int]
    ) -> dict[str, float]:
        """Weights over ``node`` itself and the neighbours in ``degrees``: those whose round
        ``round_`` state arrived, with the degree each announced. A neighbour that was active but
        did not deliver is absent; its weight must go to ``node`` so the row still sums to one."""
        ...


class Metropolis:
    """Metropolis–Hastings weights from the announced degrees: what a daemon computes alone."""

    def weights(
        self, node: str, round_: int, own_degree: int, degrees: Mapping[str, int]
    ) -> dict[str, float]:
        self_weight, row = metropolis_weights(own_degree, degrees)
        return {node: self_weight, **row}


class ModelView(Protocol):
    """The model a node is evaluated on and saved as, given its own model."""

    async def evaluate(
        self, round_: int, model: torch.Tensor, trainer: NodeTrainer
    ) -> tuple[float, float]:
        """``(accuracy, test loss)`` after ``round_`` rounds; ``model`` is the node's own."""
        ...

    async def final(self, round_: int, model: torch.Tensor) -> torch.Tensor:
        """The model written to ``final.safetensors`` after the last round."""
        ...


class OwnModel:
    """A node is evaluated on, and saves, its own model."""

    async def evaluate(
        self, round_: int, model: torch.Tensor, trainer: NodeTrainer
    ) -> tuple[float, float]:
        return await trainer.evaluate(model, round_)

    async def final(self, round_: int, model: torch.Tensor) -> torch.Tensor:
        return model
