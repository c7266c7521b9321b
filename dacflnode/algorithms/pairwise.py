"""Asynchronous DACFL on flat state vectors: the fold of a training block and the pairwise
transfer of an exchange (docs/algorithm.md, "Asynchronous DACFL").

A node's state is :class:`~dacflnode.algorithms.rounds.NodeState` read as

* ``omega``: its model ``ω_i``, which training moves and exchanges mix;
* ``omega_prev``: ``τ_i``, the signal its estimate tracks: the initial model plus every
  step the node's own training folded;
* ``x``: its FODAC estimate of the network-average model;
* ``round``: the training blocks it has folded.

**Fold** (after a block of local steps trained from ``ω_start`` to ``ω_trained``): the
block's step, scaled by the share of ``ω_start`` that ``ω`` still holds after the exchanges
that overlapped the block (:func:`fold`), is added to ``ω``, to ``x`` and to ``τ``.

**Exchange** of nodes ``i`` (who asks) and ``j`` (who answers), with weight ``w``: from the
two snapshots ``v_i`` (sent by ``i``) and ``v_j`` (``j``'s when it answers), ``j`` computes
``c = w (v_i − v_j)`` for each exchanged vector (``ω`` and ``x``), adds it and answers with
it; ``i`` subtracts the same ``c``, whatever happened at either end between the snapshots.

**Why the sums are exact.** A fold adds the same step to ``x`` and ``τ``; an exchange adds
opposite amounts at its two ends and does not move ``τ``. So once every exchange is applied at
both ends, ``Σ x = Σ τ``: the initial models plus every folded step, with no global round. An
exchange lost at one end (a node that restarted from a checkpoint) breaks exactly that sum,
which is why the checkpoints' invariant (``dacflnode invariant``) compares ``x`` with ``τ``
(``omega_prev``) under async. (``x`` and ``ω`` start equal and every step treats them alike,
so in this form they coincide: ``x`` is the node's model.)
This is FODAC (dynamic average consensus) of the signals ``τ_i``, whose sum is the sum of the
models; the paper's synchronous DACFL tracks ``ω_i`` itself, which includes its mixing. Here
the mixing of ``ω`` is left out of the tracked signal: it sums to zero, and folding it in as
well mixes ``x`` twice over, which after a slow node's long block overshot its estimate past
its neighbours' (measured: 11 % accuracy until it settled).
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
    """The answering end's state after adding ``c`` (``τ`` is not moved: module docstring)."""
    return NodeState(state.round, state.x + c["x"], state.omega + c["omega"], state.omega_prev)


def asked(state: NodeState, c: Mapping[str, Tensor]) -> NodeState:
    """The asking end's state after subtracting ``c``."""
    return NodeState(state.round, state.x - c["x"], state.omega - c["omega"], state.omega_prev)


def fold(state: NodeState, start: Tensor, trained: Tensor, kept: float = 1.0) -> NodeState:
    """Fold the block that trained ``start`` into ``trained``: its step
    ``s = kept · (trained − start)`` is added to ``ω``, to ``x`` and to ``τ``; one block more.

    ``kept`` is the share of ``start`` that ``ω`` still holds: every exchange applied while
    the block trained moved ``ω`` a fraction ``w`` of the way to a neighbour, leaving
    ``∏ (1 − w)`` of it (:func:`kept_after`). The step was computed for ``start``, so only that
    share of it is still the node's to take; the rest of ``ω`` now comes from neighbours that
    took their own steps. A block no exchange overlapped folds its whole step, as a
    synchronous round does; a slow node's long block, mixed many times meanwhile, folds a
    fraction, instead of adding an early, large step to a model that has moved on (measured:
    its whole first step from the initial model broke its model, and its neighbours', to
    11 % accuracy on Fashion-MNIST). Any ``kept`` keeps ``Σ x = Σ τ``: ``x`` and ``τ`` get the
    same change."""
    if not 0.0 <= kept <= 1.0:
        raise ValueError(f"kept must be in [0, 1], got {kept}")
    step = trained - start
    if kept != 1.0:
        step.mul_(kept)
    return NodeState(state.round + 1, state.x + step, state.omega + step,
                     state.omega_prev + step)


def kept_after(kept: float, weight: float) -> float:
    """The share of a block's start ``ω`` still holds after one more exchange of ``weight``."""
    return kept * (1.0 - weight)

