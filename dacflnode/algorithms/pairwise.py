"""Asynchronous DACFL on flat state vectors: the fold of a training block and the pairwise
transfer of an exchange (docs/algorithm.md, "Asynchronous DACFL").

A node's state is :class:`~dacflnode.algorithms.rounds.NodeState` read as

* ``omega``: its model ``ω_i``, which training moves and exchanges mix;
* ``omega_prev``: ``τ_i``, its model as of its last fold;
* ``x``: its FODAC estimate of the network-average model;
* ``round``: the training blocks it has folded.

**Fold** (after a block of local steps trained from ``ω_start`` to ``ω_trained``): the
block's step ``ω_trained − ω_start`` is added to ``ω`` (which exchanges may have moved while
it trained), then ``x += ω − τ`` and ``τ := ω``: every change of ``ω`` since the last fold is
folded into ``x`` exactly once. ``Σ x − Σ τ`` is unchanged by a fold.

**Exchange** of nodes ``i`` (who asks) and ``j`` (who answers), with weight ``w``: from the
two snapshots ``v_i`` (sent by ``i``) and ``v_j`` (``j``'s when it answers), ``j`` computes
``c = w (v_i − v_j)`` for each exchanged vector, adds it and answers with it; ``i`` subtracts
the same ``c``. ``Σ x`` and ``Σ ω`` are unchanged by an exchange, whatever happened at either
end between the snapshots. So ``Σ x = Σ τ`` holds at all times, with no global round.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from dacflnode.algorithms.rounds import NodeState

Tensor = torch.Tensor

#: The vectors an exchange mixes, in the order they travel.
EXCHANGED = ("omega", "x")


def metropolis_weight(degree_i: int, degree_j: int) -> float:
    """The Metropolis-Hastings weight of edge ``ij``: ``1 / (1 + max(d_i, d_j))``; both ends
    compute the same number."""
    if degree_i < 1 or degree_j < 1:
        raise ValueError(f"degrees must be >= 1, got {degree_i} and {degree_j}")
    return 1.0 / (1 + max(degree_i, degree_j))


def exchange_weight(degree_i: int, degree_j: int) -> float:
    """The weight of one exchange on edge ``ij``: half its Metropolis weight. Both ends ask,
    so an edge whose ends go at the same pace is mixed with its whole weight once per block,
    as in a synchronous round; and all a node's exchanges from one snapshot (it asks every
    neighbour at once, and every neighbour asks it) move it by at most ``d · w_ij < 1`` of
    the differences, so the mixing cannot overshoot. With the whole weight from both ends, a
    ring's mixing step has an eigenvalue of ``1 − 2 · (2/3) · 2 < −1``: it diverges."""
    return 0.5 * metropolis_weight(degree_i, degree_j)


def vectors_of(state: NodeState) -> dict[str, Tensor]:
    """The exchanged vectors of ``state`` (its snapshot as an exchange sends it)."""
    return {"omega": state.omega, "x": state.x}


def transfer(weight: float, asking: Mapping[str, Tensor],
             answering: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``c = w (v_asking − v_answering)`` per exchanged vector: what the answering end adds and
    the asking end subtracts. The difference is taken in the vectors' dtype, then scaled once
    (``fl(a − b) = −fl(b − a)`` exactly, so the two ends' changes are exact opposites)."""
    if not 0.0 < weight <= 0.5:  # (an exchange's is at most 0.25: exchange_weight)
        raise ValueError(f"an exchange's weight must be in (0, 0.5], got {weight}")
    missing = [name for name in EXCHANGED if name not in asking or name not in answering]
    if missing:
        raise KeyError(f"an exchange needs {', '.join(EXCHANGED)}; missing {missing}")
    return {name: (asking[name] - answering[name]).mul_(weight) for name in EXCHANGED}


def answered(state: NodeState, c: Mapping[str, Tensor]) -> NodeState:
    """The answering end's state after adding ``c``."""
    return NodeState(state.round, state.x + c["x"], state.omega + c["omega"], state.omega_prev)


def asked(state: NodeState, c: Mapping[str, Tensor]) -> NodeState:
    """The asking end's state after subtracting ``c``."""
    return NodeState(state.round, state.x - c["x"], state.omega - c["omega"], state.omega_prev)


def fold(state: NodeState, start: Tensor, trained: Tensor) -> NodeState:
    """Fold the block that trained ``start`` into ``trained``: ``ω += trained − start``, then
    ``x += ω − τ``, ``τ := ω``; one block more."""
    omega = state.omega + (trained - start)
    return NodeState(state.round + 1, state.x + (omega - state.omega_prev), omega, omega)


def settle(state: NodeState) -> NodeState:
    """Fold what exchanges moved ``ω`` by since the last fold, with no training: ``x += ω − τ``,
    ``τ := ω`` (at the end of a run, so that ``τ = ω`` and either FODAC tracked field holds
    ``Σ x``)."""
    return NodeState(state.round, state.x + (state.omega - state.omega_prev), state.omega,
                     state.omega)
