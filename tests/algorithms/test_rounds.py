"""Round steps on hand-checkable vectors, and the FODAC sum invariant."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dacflnode.algorithms.graphs import ring
from dacflnode.algorithms.mixing import dense_random_matrix, metropolis_matrix
from dacflnode.algorithms.rounds import (
    NodeState,
    make_algorithm,
    network_average,
    weighted_sum,
)

IDS = ["a", "b"]
W2 = np.array([[0.75, 0.25], [0.25, 0.75]])


def t(*values):
    return torch.tensor(values, dtype=torch.float32)


def run_round(alg, states, w, train):
    """One round for every node, exactly as the simulator and the daemon sequence it."""
    ids = [f"n{i}" for i in range(len(states))]
    messages = {ids[i]: alg.outgoing(s) for i, s in enumerate(states)}
    out = []
    for i, s in enumerate(states):
        weights = {ids[j]: float(w[i, j]) for j in range(len(states)) if w[i, j] != 0}
        inbox = {j: messages[j] for j in weights if j != ids[i]}
        prepared = alg.prepare(s, ids[i], weights, inbox)
        out.append(alg.complete(s, prepared, train(i, prepared.train_from)))
    return out


def test_dacfl_round_by_hand():
    alg = make_algorithm("dacfl")
    # round-1 state: ω^1, ω^0 and x^1 chosen by hand
    a = NodeState(1, x=t(1.0), omega=t(2.0), omega_prev=t(0.0))
    b = NodeState(1, x=t(3.0), omega=t(4.0), omega_prev=t(2.0))
    trained = {0: t(10.0), 1: t(20.0)}
    seen = {}

    def train(i, start):
        seen[i] = float(start)
        return trained[i]

    na, nb = run_round(alg, [a, b], W2, train)
    # training starts from the ω mix: 0.75*2 + 0.25*4 = 2.5 ; 0.25*2 + 0.75*4 = 3.5
    assert seen == {0: 2.5, 1: 3.5}
    # x^{2} = W x^1 + (ω^1 − ω^0): 0.75*1 + 0.25*3 + 2 = 3.5 ; 0.25*1 + 0.75*3 + 2 = 4.5
    assert float(na.x) == 3.5 and float(nb.x) == 4.5
    assert float(na.omega) == 10.0 and float(na.omega_prev) == 2.0
    assert na.round == nb.round == 2


def test_dacfl_fresh_variant_adds_the_new_difference():
    alg = make_algorithm("dacfl", "fresh")
    a = NodeState(1, x=t(1.0), omega=t(2.0), omega_prev=t(0.0))
    b = NodeState(1, x=t(3.0), omega=t(4.0), omega_prev=t(2.0))
    na, nb = run_round(alg, [a, b], W2, lambda i, s: s + 1.0)
    # x = W x + (trained − ω): 1.5 + (3.5 − 2) = 3.0 ; 2.5 + (4.5 − 4) = 3.0
    assert float(na.x) == 3.0 and float(nb.x) == 3.0


def test_cdsgd_trains_from_the_unmixed_model_and_adds_its_delta_to_the_mix():
    alg = make_algorithm("cdsgd")
    a = NodeState.initial(t(1.0))
    b = NodeState.initial(t(3.0))
    seen = {}

    def train(i, start):
        seen[i] = float(start)
        return start - 0.5  # a gradient step of -0.5

    na, nb = run_round(alg, [a, b], W2, train)
    assert seen == {0: 1.0, 1: 3.0}
    assert float(na.x) == pytest.approx(0.75 * 1 + 0.25 * 3 - 0.5)
    assert float(nb.x) == pytest.approx(0.25 * 1 + 0.75 * 3 - 0.5)
    assert alg.exchanged == ("x",)


def test_dpsgd_updates_like_cdsgd_but_is_evaluated_on_the_network_average():
    cd, dp = make_algorithm("cdsgd"), make_algorithm("dpsgd")
    states = [NodeState.initial(t(1.0)), NodeState.initial(t(3.0))]
    a = run_round(cd, states, W2, lambda i, s: s * 2)
    b = run_round(dp, states, W2, lambda i, s: s * 2)
    assert [float(s.x) for s in a] == [float(s.x) for s in b]
    assert dp.global_model and not cd.global_model
    assert float(network_average([s.x for s in b])) == pytest.approx(4.0)


def test_fedavg_trains_every_node_from_the_data_weighted_server_average():
    alg = make_algorithm("fedavg")
    states = [NodeState.initial(t(1.0)), NodeState.initial(t(4.0))]
    p = np.array([[1 / 3, 2 / 3], [1 / 3, 2 / 3]])  # node b holds twice the data
    seen = {}

    def train(i, start):
        seen[i] = float(start)
        return start + i

    new = run_round(alg, states, p, train)
    assert seen[0] == pytest.approx(3.0) and seen[1] == pytest.approx(3.0)
    assert [float(s.x) for s in new] == pytest.approx([3.0, 4.0])


def test_weighted_sum_is_independent_of_mapping_order():
    vecs = {"b": torch.randn(50), "a": torch.randn(50), "c": torch.randn(50)}
    w1 = {"a": 0.2, "b": 0.3, "c": 0.5}
    w2 = {"c": 0.5, "b": 0.3, "a": 0.2}
    assert torch.equal(weighted_sum(w1, vecs), weighted_sum(w2, dict(reversed(vecs.items()))))


def test_prepare_refuses_a_missing_neighbour_state():
    alg = make_algorithm("dacfl")
    s = NodeState.initial(t(1.0))
    with pytest.raises(KeyError, match="no state from b"):
        alg.prepare(s, "a", {"a": 0.5, "b": 0.5}, {})


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(min_value=2, max_value=8),
    rounds=st.integers(min_value=1, max_value=6),
    seed=st.integers(min_value=0, max_value=10**6),
    variant=st.sampled_from(["lagged", "fresh"]),
    time_varying=st.booleans(),
)
def test_fodac_keeps_the_sum_of_x_equal_to_the_sum_of_tracked_omegas(
    n, rounds, seed, variant, time_varying
):
    """Σ_i x_i^{t} = Σ_i ω_i^{t−1} (lagged) or Σ_i ω_i^{t} (fresh), whatever training does."""
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    alg = make_algorithm("dacfl", variant)
    # the paper starts every node from the same ω^0; the invariant holds for any start
    states = [
        NodeState.initial(torch.randn(16, generator=gen, dtype=torch.float32)) for _ in range(n)
    ]
    w = dense_random_matrix(n, rng)
    for _ in range(rounds):
        if time_varying:
            w = (
                dense_random_matrix(n, rng)
                if n < 3 or rng.random() < 0.5
                else metropolis_matrix(n, ring(n))
            )
        states = run_round(alg, states, w, lambda i, s: s + torch.randn(16, generator=gen))
        sum_x = torch.stack([s.x for s in states]).double().sum(0)
        sum_tracked = torch.stack([alg.tracked(s) for s in states]).double().sum(0)
        assert torch.allclose(sum_x, sum_tracked, atol=1e-4)
