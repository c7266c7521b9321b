"""Clipped mixing (ClippedGossip with a shared radius): it keeps the network sum, equals the
exact mix when nothing is clipped, and bounds what one neighbour can do to a node."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dacflnode.algorithms.graphs import random_regular, ring
from dacflnode.algorithms.mixing import dense_random_matrix, metropolis_matrix
from dacflnode.algorithms.rounds import (
    Mixing,
    NodeState,
    clipped_sum,
    make_algorithm,
    weighted_sum,
)


def ids_of(n):
    return [f"n{i}" for i in range(n)]


def mix_all(w, vectors, radius):
    """Every node's clipped mix of its row of ``w``."""
    ids = ids_of(len(vectors))
    by_id = dict(zip(ids, vectors, strict=True))
    out = []
    for i, node in enumerate(ids):
        weights = {ids[j]: float(w[i, j]) for j in range(len(ids)) if w[i, j] != 0}
        out.append(clipped_sum(node, weights, {j: by_id[j] for j in weights}, radius))
    return out


def matrix(kind, n, rng):
    if kind == "ring" and n >= 3:
        return metropolis_matrix(n, ring(n))
    if kind == "regular" and n >= 4:
        return metropolis_matrix(n, random_regular(n, 3 if n % 2 == 0 else 2, rng))
    return dense_random_matrix(n, rng)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(min_value=2, max_value=9),
    seed=st.integers(min_value=0, max_value=10**6),
    radius=st.floats(min_value=1e-3, max_value=50.0),
    scale=st.floats(min_value=1e-2, max_value=1e3),
    kind=st.sampled_from(["dense", "ring", "regular"]),
)
def test_clipped_mixing_over_a_symmetric_doubly_stochastic_w_keeps_the_sum(
    n, seed, radius, scale, kind
):
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    w = matrix(kind, n, rng)
    vectors = [scale * torch.randn(40, generator=gen) for _ in range(n)]
    mixed = mix_all(w, vectors, radius)
    before = torch.stack(vectors).double().sum(0)
    after = torch.stack(mixed).double().sum(0)
    # float32 rounding of each node's result only: n roundings of at most |v| * 2^-24
    bound = n * float(torch.stack(mixed).abs().max()) * 2.0**-23 + 1e-12
    assert float((after - before).abs().max()) <= bound


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(min_value=2, max_value=9),
    seed=st.integers(min_value=0, max_value=10**6),
    kind=st.sampled_from(["dense", "ring", "regular"]),
)
def test_clipped_mixing_with_a_radius_above_every_difference_is_the_exact_mix_bit_for_bit(
    n, seed, kind
):
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    w = matrix(kind, n, rng)
    vectors = [torch.randn(300, generator=gen) for _ in range(n)]
    largest = max(float((a - b).norm()) for a in vectors for b in vectors)
    ids = ids_of(n)
    for i, got in enumerate(mix_all(w, vectors, largest * 1.01)):
        weights = {ids[j]: float(w[i, j]) for j in range(n) if w[i, j] != 0}
        exact = weighted_sum(weights, {j: vectors[ids.index(j)] for j in weights})
        assert torch.equal(got, exact)


@pytest.mark.slow
def test_the_two_ends_of_an_edge_clip_to_opposite_vectors():
    """``clip(v_j − v_i) = −clip(v_i − v_j)``, bit for bit, with one radius: 2 nodes."""
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(70_000, generator=gen), 5 * torch.randn(70_000, generator=gen)
    weights = {"a": 0.5, "b": 0.5}
    vectors = {"a": a, "b": b}
    ma = clipped_sum("a", weights, vectors, 1.0)
    mb = clipped_sum("b", weights, vectors, 1.0)
    step_a, step_b = ma.double() - a.double(), mb.double() - b.double()
    assert float(step_a.norm()) == pytest.approx(0.5, rel=1e-5)  # clipped to w · τ
    torch.testing.assert_close(step_a, -step_b, rtol=0, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(min_value=0, max_value=10**6),
    radius=st.floats(min_value=1e-2, max_value=10.0),
    attack=st.sampled_from(["scale", "flip", "huge", "nan"]),
    factor=st.floats(min_value=2.0, max_value=1e6),
)
def test_one_poisoned_neighbour_moves_a_node_by_at_most_its_weight_times_the_radius(
    seed, radius, attack, factor
):
    gen = torch.Generator().manual_seed(seed)
    ids = ["n0", "n1", "n2", "n3"]
    honest = {k: torch.randn(500, generator=gen) for k in ids}
    weights = {"n0": 0.4, "n1": 0.2, "n2": 0.25, "n3": 0.15}
    poison = {"scale": factor * honest["n3"], "flip": -factor * honest["n3"],
              "huge": torch.full((500,), 3e38), "nan": honest["n3"] * float("nan")}[attack]
    # without n3's pull: n3 sends n0's own vector, so its clipped difference is zero
    silent = clipped_sum("n0", weights, {**honest, "n3": honest["n0"]}, radius)
    attacked = clipped_sum("n0", weights, {**honest, "n3": poison}, radius)
    moved = float((attacked.double() - silent.double()).norm())
    assert math.isfinite(moved)
    assert moved <= weights["n3"] * radius * (1 + 1e-5) + 1e-5


def test_exact_mixing_is_the_default_and_bit_identical_to_weighted_sum():
    alg = make_algorithm("dacfl")
    assert alg.mixing == Mixing()
    gen = torch.Generator().manual_seed(0)
    state = NodeState.initial(torch.randn(100, generator=gen))
    other = {"omega": torch.randn(100, generator=gen), "x": torch.randn(100, generator=gen)}
    weights = {"a": 0.6, "b": 0.4}
    prepared = alg.prepare(state, "a", weights, {"b": other})
    assert torch.equal(prepared.mixed["x"],
                       weighted_sum(weights, {"a": state.x, "b": other["x"]}))


def test_clipped_mixing_refuses_fedavg_and_a_radius_that_is_not_positive():
    with pytest.raises(ValueError, match="fedavg"):
        make_algorithm("fedavg", mixing=Mixing("clipped", 1.0))
    for radius in (None, 0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="radius"):
            Mixing("clipped", radius)
    with pytest.raises(ValueError, match="choose from exact, clipped"):
        Mixing("median")


# ------------------------------------------------------------------ a ring under attack
def attacked_ring(mixing, attack, rounds=30, n=6, dim=50):
    """DACFL on a ring of ``n`` vectors (no data): honest training pulls ω towards a common
    target; node ``n0`` trains honestly but sends ``attack`` of its vectors every round.
    Returns the largest distance of an honest node's model ``x`` from the target."""
    gen = torch.Generator().manual_seed(1)
    ids = ids_of(n)
    alg = make_algorithm("dacfl", mixing=mixing)
    target = torch.randn(dim, generator=gen)
    goals = {k: target + 0.1 * torch.randn(dim, generator=gen) for k in ids}
    w = metropolis_matrix(n, ring(n))
    states = {k: NodeState.initial(torch.zeros(dim)) for k in ids}
    worst = 0.0
    for _ in range(rounds):
        messages = {k: alg.outgoing(s) for k, s in states.items()}
        messages["n0"] = {name: attack(v) for name, v in messages["n0"].items()}
        new = {}
        for i, k in enumerate(ids):
            weights = {ids[j]: float(w[i, j]) for j in range(n) if w[i, j] != 0}
            inbox = {j: messages[j] for j in weights if j != k}
            prepared = alg.prepare(states[k], k, weights, inbox)
            start = prepared.train_from
            new[k] = alg.complete(states[k], prepared, start + 0.3 * (goals[k] - start))
        states = new
        worst = max(float((states[k].x - target).norm()) for k in ids[1:])
    return worst


RADIUS, ROUNDS = 0.3, 30
#: what the poison can add to the honest nodes' x in ROUNDS rounds: ``w · τ`` per round into
#: each of n0's two neighbours (Metropolis weight 1/3 on a ring)
DRIFT = ROUNDS * 2 * RADIUS / 3


@pytest.mark.parametrize("attack", [lambda v: 50 * v, lambda v: 5 * v, lambda v: -50 * v],
                         ids=["50x", "5x", "sign-flipped-50x"])
def test_a_ring_under_a_scaling_neighbour_stays_bounded_with_clipping_and_diverges_without(
    attack,
):
    honest = attacked_ring(Mixing(), lambda v: v, rounds=ROUNDS)
    exact = attacked_ring(Mixing(), attack, rounds=ROUNDS)
    clipped = attacked_ring(Mixing("clipped", RADIUS), attack, rounds=ROUNDS)
    assert honest < 0.5
    assert clipped < honest + DRIFT
    assert exact > 1e4 * clipped  # 5x: 3.6e5, 50x: 1.6e17 from a target of norm 7


def test_a_ring_under_a_sign_flipping_neighbour_stays_near_the_target_only_with_clipping():
    honest = attacked_ring(Mixing(), lambda v: v, rounds=ROUNDS)
    exact = attacked_ring(Mixing(), lambda v: -v, rounds=ROUNDS)
    clipped = attacked_ring(Mixing("clipped", RADIUS), lambda v: -v, rounds=ROUNDS)
    assert clipped < honest + DRIFT
    assert exact > 4 * clipped  # pulled to the opposite of the target: 7.4 vs 1.3


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(min_value=2, max_value=8),
    rounds=st.integers(min_value=1, max_value=6),
    seed=st.integers(min_value=0, max_value=10**6),
    variant=st.sampled_from(["lagged", "fresh"]),
    radius=st.floats(min_value=0.05, max_value=5.0),
)
def test_dacfl_with_clipped_mixing_keeps_the_sum_of_x_equal_to_the_sum_of_tracked_omegas(
    n, rounds, seed, variant, radius
):
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    alg = make_algorithm("dacfl", variant, Mixing("clipped", radius))
    ids = ids_of(n)
    states = [NodeState.initial(torch.randn(16, generator=gen)) for _ in range(n)]
    for _ in range(rounds):
        w = matrix(["dense", "ring", "regular"][int(rng.integers(3))], n, rng)
        messages = {ids[i]: alg.outgoing(s) for i, s in enumerate(states)}
        new = []
        for i, s in enumerate(states):
            weights = {ids[j]: float(w[i, j]) for j in range(n) if w[i, j] != 0}
            inbox = {j: messages[j] for j in weights if j != ids[i]}
            prepared = alg.prepare(s, ids[i], weights, inbox)
            trained = prepared.train_from + 3 * torch.randn(16, generator=gen)
            new.append(alg.complete(s, prepared, trained))
        states = new
        sum_x = torch.stack([s.x for s in states]).double().sum(0)
        sum_tracked = torch.stack([alg.tracked(s) for s in states]).double().sum(0)
        assert torch.allclose(sum_x, sum_tracked, atol=1e-4)
