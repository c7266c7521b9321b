"""One round of each algorithm, for one node, on flat state vectors.

A round of node ``i`` in round ``t`` has three phases, so that a simulator can train all of its
nodes at once between them and a daemon can run training off its event loop:

1. :meth:`Algorithm.prepare` — given the round-``t`` messages of the node's neighbours and the
   mixing weights of round ``t``, mix, and say which vector local training starts from;
2. local training (not here: see :mod:`dacflnode.learning`);
3. :meth:`Algorithm.complete` — given the trained vector, produce the round-``t+1`` state.

The node's messages for round ``t`` are :meth:`Algorithm.outgoing` of its round-``t`` state.

Weighted sums are taken over node ids in sorted order (the node itself included), so that every
implementation that uses this module produces bit-identical results from identical inputs.

The algorithms (paper, Algorithms 1, 2 and 5; the full statement, the proof of the invariants
and which algorithms need a god node are in docs/algorithm.md):

* ``dacfl``: ``ω_i' = Σ_j w_ij ω_j``; ``ω_i^{t+1} = Train(ω_i')``;
  ``x_i^{t+1} = Σ_j w_ij x_j^t + (ω_i^t − ω_i^{t−1})`` with ``ω^{−1} = ω^0`` (the paper's lagged
  difference). Invariant: ``Σ_i x_i^{t+1} = Σ_i ω_i^t``. The node's model is ``x_i``.
  ``fresh`` variant: ``x_i^{t+1} = Σ_j w_ij x_j^t + (ω_i^{t+1} − ω_i^t)``, so
  ``Σ_i x_i^{t+1} = Σ_i ω_i^{t+1}``.
* ``cdsgd``: ``x_i^{t+1} = Σ_j w_ij x_j^t + (Train(x_i^t) − x_i^t)`` — the local update is taken
  at the node's own un-mixed model and its difference added to the mix. The model is ``x_i``.
* ``dpsgd``: the same update; the model is the network-wide average of the ``x`` (a "god node":
  simulation only, not decentralized).
* ``fedavg``: every node starts from the server average ``Σ_j p_j x_j`` (``p_j`` ∝ data size,
  passed in as the weights) and trains; the model is the next server average.

Every gossip mix is :func:`weighted_sum` (``mixing: exact``, the paper's) unless the run sets
``mixing: clipped``: then :func:`clipped_sum` (ClippedGossip) mixes, which bounds what one
neighbour can move a node per round (docs/algorithm.md, "Robust mixing").
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch

from dacflnode.algorithms.names import ALGORITHMS as ALGORITHMS
from dacflnode.algorithms.names import FODAC_VARIANTS as FODAC_VARIANTS
from dacflnode.algorithms.names import MIXINGS as MIXINGS

Tensor = torch.Tensor
Message = Mapping[str, Tensor]



@dataclass(frozen=True)
class NodeState:
    """The algorithm state of one node after ``round`` rounds.

    ``omega`` is ``ω_i^t`` (the node's latest trained model; DACFL only), ``omega_prev`` is
    ``ω_i^{t−1}``, and ``x`` is the node's model as the algorithm defines it: DACFL's FODAC
    estimate of the average model, or CDSGD's / D-PSGD's / FedAvg's iterate.
    """

    round: int
    x: Tensor
    omega: Tensor
    omega_prev: Tensor

    @classmethod
    def initial(cls, model0: Tensor) -> NodeState:
        """Round-0 state: ``x^0 = ω^0 = ω^{−1}`` = the common initial model."""
        return cls(0, model0.clone(), model0.clone(), model0.clone())


@dataclass(frozen=True)
class Prepared:
    """What :meth:`Algorithm.prepare` computed: the start of local training and the mixes."""

    train_from: Tensor
    mixed: dict[str, Tensor]


MIX_BLOCK = 1 << 15
"""Elements per column block of :func:`weighted_sum`: 256 KiB of float64 accumulator and as
much of widened term, which stay in a core's L2 cache."""


def weighted_sum(weights: Mapping[str, float], vectors: Mapping[str, Tensor]) -> Tensor:
    """``Σ_j weights[j] * vectors[j]`` over ``sorted(weights)``, accumulated in float64 and
    rounded once to the vectors' dtype.

    The fixed order makes the result bit-identical wherever it is computed. One rounding per
    mix instead of one per term keeps ``Σ x`` from drifting by float32 rounding: a healthy
    50-round network stayed within 1.3e-7 of ``Σ ω_prev`` instead of 7e-7 (docs/faults.md), for
    about 20 ms more per mix of ten 1.66 M-parameter vectors on one core.

    The sum runs over cache-sized column blocks (:data:`MIX_BLOCK` elements): each block's
    float64 accumulator stays in the L2 cache while every term is added to it, and each term is
    widened to float64 by a plain copy into a block buffer first, which is vectorised where
    ``add_`` of a float32 tensor into a float64 one is not. Same additions in the same order,
    so the result is bit-identical to one whole-vector pass, at less than half its time
    (``benchmarks/profiles/scale.txt``).
    """
    keys = sorted(weights)
    missing = [k for k in keys if k not in vectors]
    if missing:
        raise KeyError(f"no state from {', '.join(missing)} for this round")
    first = vectors[keys[0]]
    terms = [(vectors[k].reshape(-1), float(weights[k])) for k in keys]
    n = first.numel()
    out = torch.empty(n, dtype=first.dtype, device=first.device)
    width = min(MIX_BLOCK, n)
    acc = torch.empty(width, dtype=torch.float64, device=first.device)
    wide = torch.empty_like(acc)
    for start in range(0, n, MIX_BLOCK):
        stop = min(n, start + MIX_BLOCK)
        a, t = acc[: stop - start], wide[: stop - start]
        a.zero_()
        for vector, weight in terms:
            t.copy_(vector[start:stop])
            a.add_(t, alpha=weight)
        out[start:stop].copy_(a)
    return out.view(first.shape)


def clipped_sum(
    node: str,
    weights: Mapping[str, float],
    vectors: Mapping[str, Tensor],
    radius: float,
) -> Tensor:
    """ClippedGossip (He, Karimireddy & Jaggi 2022) with a radius every node shares:
    ``v_i + Σ_{j≠i} w_ij · clip(v_j − v_i, τ)`` with ``clip(d, τ) = d · min(1, τ/‖d‖)``,
    ``i = node``, ``τ = radius``, for weights that sum to 1 (a row of a mixing matrix).

    It is computed as :func:`weighted_sum` with the weights ``c_ij = w_ij · s_ij``,
    ``s_ij = min(1, τ/‖v_j − v_i‖)``, and ``c_ii = w_ii + Σ_{j≠i} w_ij (1 − s_ij)``: what
    clipping takes off an edge goes to the node's own state. With nothing clipped that is
    :func:`weighted_sum` bit for bit. Because ``‖v_j − v_i‖ = ‖v_i − v_j‖`` and ``τ`` is the
    same at both ends, ``s_ij = s_ji``: with a symmetric doubly stochastic ``W`` the matrix
    ``C`` is symmetric and doubly stochastic too, so ``Σ_i v_i`` is kept to float rounding and
    DACFL's ``Σ x = Σ ω`` still holds. One neighbour moves the node by at most ``w_ij · τ``
    per mix whatever it sends; a neighbour whose vector is not finite is left out (its weight
    goes to the node).

    The norms: ``v_j − v_i`` and its squares are taken in the vectors' dtype, column by column
    over the blocks of :func:`weighted_sum`, and each column sum is added up once in float64,
    in a fixed order. IEEE subtraction gives ``fl(a − b) = −fl(b − a)`` exactly, so both ends
    of an edge square the same numbers and get the same norm, bit for bit (with equal thread
    counts, as every sum here); a norm that overflows counts as not finite. The cost is that
    norm pass, which reads each neighbour's vector once more (and the node's own): on the
    paper's 1.66 M-parameter CNN with 3 neighbours a clipped mix took 44.1 ms against 27.8 ms
    for :func:`weighted_sum` (1.58x; ``benchmarks/bench_clipped.py --quick`` on 2 shared
    cores at load average 12.5; docs/algorithm.md, "Robust mixing").
    """
    if not radius > 0:
        raise ValueError(f"the clip radius must be > 0, got {radius}")
    keys = sorted(weights)
    missing = [k for k in keys if k not in vectors]
    if missing:
        raise KeyError(f"no state from {', '.join(missing)} for this round")
    if node not in weights:
        raise ValueError(f"weights must include the node itself ({node})")
    own = vectors[node].reshape(-1)
    others = [(k, vectors[k].reshape(-1)) for k in keys if k != node]
    n = own.numel()
    width = min(MIX_BLOCK, n)
    difference = torch.empty(width, dtype=own.dtype, device=own.device)
    # squares by column, summed once at the end: elementwise work on at most one block at a
    # time, under PyTorch's threshold for multithreading, so one fixed sequence of additions
    squares = [torch.zeros(width, dtype=own.dtype, device=own.device) for _ in others]
    for start in range(0, n, MIX_BLOCK):
        stop = min(n, start + MIX_BLOCK)
        d = difference[: stop - start]
        for (_, vector), square in zip(others, squares, strict=True):
            torch.sub(vector[start:stop], own[start:stop], out=d)
            square[: stop - start].addcmul_(d, d)
    half = (width + 1) // 2
    norms = []
    for square in squares:
        folded = square[:half].double()
        folded[: width - half].add_(square[half:])
        norms.append(math.sqrt(float(folded.sum())))
    coefficients: dict[str, float] = {}
    own_weight = float(weights[node])
    for (k, _), norm in zip(others, norms, strict=True):
        weight = float(weights[k])
        if not math.isfinite(norm):
            own_weight += weight  # a non-finite state moves nothing
            continue
        if norm <= radius:
            coefficients[k] = weight
        else:
            kept = weight * (radius / norm)
            coefficients[k] = kept
            own_weight += weight - kept
    coefficients[node] = own_weight
    return weighted_sum(coefficients, {k: vectors[k] for k in coefficients})


def choco_sum(
    node: str,
    weights: Mapping[str, float],
    own: Tensor,
    copies: Mapping[str, Tensor],
    gamma: float,
) -> Tensor:
    """CHOCO-Gossip's mix (Koloskova, Stich & Jaggi 2019): ``v_i + γ Σ_{j≠i} w_ij (v̂_j − v̂_i)``
    with ``i = node``, ``v_i = own`` and ``v̂ = copies`` (the public copies, ``copies[node]`` the
    node's own, every one as both ends of its edge hold it; docs/compression.md).

    With symmetric ``w_ij`` and both ends holding the same copies, the edge ``ij`` adds
    ``γ w_ij (v̂_j − v̂_i)`` at ``i`` and its opposite at ``j``: ``Σ_i v_i`` is kept whatever
    the copies are, so a compressor's error never biases DACFL's ``Σ x = Σ ω``. One
    :func:`weighted_sum` (float64 accumulation, one rounding) in a fixed order.
    """
    if node not in weights:
        raise ValueError(f"weights must include the node itself ({node})")
    others = sorted(j for j in weights if j != node)
    missing = [j for j in [node, *others] if j not in copies]
    if missing:
        raise KeyError(f"no public copy of {', '.join(missing)}")
    coefficients: dict[str, float] = {"a": 1.0,
                                      "b": -gamma * math.fsum(weights[j] for j in others)}
    vectors: dict[str, Tensor] = {"a": own, "b": copies[node]}
    for j in others:
        coefficients[f"c{j}"] = gamma * float(weights[j])
        vectors[f"c{j}"] = copies[j]
    return weighted_sum(coefficients, vectors)


#: The mixing of a compressed run (not a ``mixing`` setting: ``compression`` chooses it).
CHOCO = "choco"


@dataclass(frozen=True)
class Mixing:
    """How a node mixes each exchanged vector: ``exact`` (:func:`weighted_sum`, the paper's
    DACFL), ``clipped`` (:func:`clipped_sum` with ``radius``, the same at every node) or, in a
    compressed run, ``choco`` (:func:`choco_sum` of the public copies with step ``gamma``)."""

    rule: str = "exact"
    radius: float | None = None
    gamma: float | None = None

    def __post_init__(self) -> None:
        if self.rule not in (*MIXINGS, CHOCO):
            raise ValueError(f"unknown mixing '{self.rule}' (choose from {', '.join(MIXINGS)})")
        if self.rule == "clipped" and (self.radius is None or not self.radius > 0
                                       or not math.isfinite(self.radius)):
            raise ValueError(f"clipped mixing needs a finite radius > 0, got {self.radius}")
        if self.rule == CHOCO and (self.gamma is None or not 0 < self.gamma <= 1):
            raise ValueError(f"CHOCO mixing needs a step in (0, 1], got {self.gamma}")

    def mix(self, node: str, weights: Mapping[str, float],
            vectors: Mapping[str, Tensor]) -> Tensor:
        if self.rule == "exact":
            return weighted_sum(weights, vectors)
        if self.rule == CHOCO:
            raise ValueError("a compressed run mixes the public copies (choco_sum)")
        assert self.radius is not None
        return clipped_sum(node, weights, vectors, self.radius)


EXACT = Mixing()


class Algorithm(ABC):
    """Base class; see the module docstring for the update rules."""

    name: str = ""
    #: names of the state vectors a node sends to its neighbours each round
    exchanged: tuple[str, ...] = ("x",)
    #: the evaluated model is the network-wide average of ``x`` (needs a god node)
    global_model: bool = False
    #: runs on neighbour messages alone, so a daemon can run it (no god node)
    decentralized: bool = True
    #: how each exchanged vector is mixed (:data:`EXACT` unless the run sets ``mixing``)
    mixing: Mixing = EXACT

    def outgoing(self, state: NodeState) -> dict[str, Tensor]:
        return {name: getattr(state, name) for name in self.exchanged}

    def prepare(
        self,
        state: NodeState,
        node: str,
        weights: Mapping[str, float],
        inbox: Mapping[str, Message],
        copies: Mapping[str, Message] | None = None,
    ) -> Prepared:
        """Mix the round's state. ``weights`` covers the node itself and every neighbour used;
        ``inbox`` holds each neighbour's :meth:`outgoing` of the same round. A compressed run
        (mixing ``choco``) mixes the public ``copies`` instead: the node's own and those of the
        neighbours used, each after the round's update (``inbox`` is not read then)."""
        if node not in weights:
            raise ValueError(f"weights must include the node itself ({node})")
        own = self.outgoing(state)
        mixed: dict[str, Tensor] = {}
        if self.mixing.rule == CHOCO:
            if copies is None:
                raise ValueError("a compressed run mixes public copies: none were given")
            assert self.mixing.gamma is not None
            for name in self.exchanged:
                mixed[name] = choco_sum(node, weights, own[name],
                                        {j: copies[j][name] for j in weights if j in copies},
                                        self.mixing.gamma)
            return Prepared(self.train_start(state, mixed), mixed)
        missing = sorted(j for j in weights if j != node and j not in inbox)
        if missing:
            raise KeyError(f"no state from {', '.join(missing)} for round {state.round}")
        for name in self.exchanged:
            vectors = {j: (own[name] if j == node else inbox[j][name]) for j in weights}
            mixed[name] = self.mixing.mix(node, weights, vectors)
        return Prepared(self.train_start(state, mixed), mixed)

    @abstractmethod
    def train_start(self, state: NodeState, mixed: Mapping[str, Tensor]) -> Tensor:
        raise NotImplementedError

    @abstractmethod
    def complete(self, state: NodeState, prepared: Prepared, trained: Tensor) -> NodeState:
        raise NotImplementedError

    def model(self, state: NodeState) -> Tensor:
        """The node's own model (before any god-node averaging)."""
        return state.x

    #: the :class:`NodeState` field whose network sum ``Σ x`` equals (see :meth:`tracked`)
    tracked_field: str = "x"

    def tracked(self, state: NodeState) -> Tensor:
        """The vector whose network mean this node's model estimates: for DACFL the invariant
        ``Σ_i x_i = Σ_i tracked_i`` holds after every round (docs/algorithm.md); re-anchoring
        sets ``x := tracked`` (docs/faults.md). Other algorithms track their own ``x``."""
        return getattr(state, self.tracked_field)  # type: ignore[no-any-return]


class DACFL(Algorithm):
    name = "dacfl"
    exchanged = ("omega", "x")

    def __init__(self, variant: str = "lagged") -> None:
        if variant not in FODAC_VARIANTS:
            raise ValueError(f"FODAC variant must be one of {FODAC_VARIANTS}")
        self.variant = variant
        self.tracked_field = "omega_prev" if variant == "lagged" else "omega"

    def train_start(self, state: NodeState, mixed: Mapping[str, Tensor]) -> Tensor:
        return mixed["omega"]

    def complete(self, state: NodeState, prepared: Prepared, trained: Tensor) -> NodeState:
        if self.variant == "lagged":
            delta = state.omega - state.omega_prev
        else:
            delta = trained - state.omega
        x = prepared.mixed["x"] + delta
        return NodeState(state.round + 1, x, trained.clone(), state.omega)


class CDSGD(Algorithm):
    name = "cdsgd"

    def train_start(self, state: NodeState, mixed: Mapping[str, Tensor]) -> Tensor:
        return state.x

    def complete(self, state: NodeState, prepared: Prepared, trained: Tensor) -> NodeState:
        x = prepared.mixed["x"] + (trained - state.x)
        return replace(state, round=state.round + 1, x=x, omega=x, omega_prev=x)


class DPSGD(CDSGD):
    name = "dpsgd"
    global_model = True
    decentralized = False


class FedAvg(Algorithm):
    name = "fedavg"
    global_model = True
    decentralized = False

    def train_start(self, state: NodeState, mixed: Mapping[str, Tensor]) -> Tensor:
        return mixed["x"]

    def complete(self, state: NodeState, prepared: Prepared, trained: Tensor) -> NodeState:
        x = trained.clone()
        return replace(state, round=state.round + 1, x=x, omega=x, omega_prev=x)


def make_algorithm(
    name: str, fodac_variant: str = "lagged", mixing: Mixing = EXACT
) -> Algorithm:
    """The algorithm ``name``; ``mixing``: how it mixes (FedAvg's server average is never
    clipped: it has no neighbours, so asking for it is an error)."""
    alg: Algorithm
    if name == "dacfl":
        alg = DACFL(fodac_variant)
    elif name == "cdsgd":
        alg = CDSGD()
    elif name == "dpsgd":
        alg = DPSGD()
    elif name == "fedavg":
        if mixing.rule != "exact":
            raise ValueError("fedavg averages at a server and has no neighbour to clip;"
                             " use mixing exact for it")
        alg = FedAvg()
    else:
        raise ValueError(f"unknown algorithm '{name}' (choose from {', '.join(ALGORITHMS)})")
    if mixing != EXACT:
        alg.mixing = mixing
    return alg


def network_average(vectors: Sequence[Tensor], weights: Sequence[float] | None = None) -> Tensor:
    """``Σ_i p_i v_i`` with ``p`` uniform by default (the god node of D-PSGD and FedAvg)."""
    n = len(vectors)
    p = [1.0 / n] * n if weights is None else [float(w) for w in weights]
    return weighted_sum(
        {f"{i:08d}": p[i] for i in range(n)}, {f"{i:08d}": v for i, v in enumerate(vectors)}
    )
