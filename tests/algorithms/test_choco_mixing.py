"""CHOCO-Gossip's mix of a compressed run: it keeps the network sum whatever the public copies
are, and with exact copies and step 1 it is the paper's mix."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dacflnode.algorithms.graphs import ring
from dacflnode.algorithms.mixing import dense_random_matrix, metropolis_matrix
from dacflnode.algorithms.rounds import Mixing, NodeState, choco_sum, make_algorithm, weighted_sum


def ids_of(n):
    return [f"n{i}" for i in range(n)]


def rows(w):
    ids = ids_of(len(w))
    return ids, [{ids[j]: float(w[i, j]) for j in range(len(ids)) if w[i, j] != 0}
                 for i in range(len(ids))]


@settings(max_examples=30, deadline=None)
@given(n=st.integers(min_value=2, max_value=8), seed=st.integers(0, 10**6),
       gamma=st.floats(min_value=0.01, max_value=1.0), dense=st.booleans())
def test_choco_keeps_the_network_sum_whatever_the_copies(n, seed, gamma, dense):
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    w = dense_random_matrix(n, rng) if dense or n < 3 else metropolis_matrix(n, ring(n))
    ids, weights = rows(w)
    own = {j: torch.randn(64, generator=gen) for j in ids}
    # copies far from the states: the sum must not care
    copies = {j: torch.randn(64, generator=gen) * 10 for j in ids}
    mixed = [choco_sum(i, weights[k], own[i], copies, gamma) for k, i in enumerate(ids)]
    before = torch.stack(list(own.values())).double().sum(0)
    after = torch.stack(mixed).double().sum(0)
    assert torch.allclose(before, after, atol=1e-4)


def test_choco_with_exact_copies_and_step_one_is_the_weighted_average():
    w = metropolis_matrix(5, ring(5))
    ids, weights = rows(w)
    gen = torch.Generator().manual_seed(3)
    states = {j: torch.randn(1000, generator=gen) for j in ids}
    for k, i in enumerate(ids):
        choco = choco_sum(i, weights[k], states[i], states, 1.0)
        exact = weighted_sum(weights[k], {j: states[j] for j in weights[k]})
        assert torch.allclose(choco, exact, atol=1e-6)


def test_a_dacfl_round_under_choco_keeps_sum_x_equal_to_sum_tracked():
    n = 6
    w = metropolis_matrix(n, ring(n))
    ids, weights = rows(w)
    alg = make_algorithm("dacfl", mixing=Mixing("choco", gamma=0.3))
    gen = torch.Generator().manual_seed(0)
    states = [NodeState.initial(torch.randn(32, generator=gen)) for _ in ids]
    copies = {j: {"x": torch.randn(32, generator=gen), "omega": torch.randn(32, generator=gen)}
              for j in ids}
    for _ in range(4):
        new = []
        for k, i in enumerate(ids):
            prepared = alg.prepare(states[k], i, weights[k], {}, copies)
            trained = prepared.train_from + torch.randn(32, generator=gen)
            new.append(alg.complete(states[k], prepared, trained))
        states = new
        sum_x = torch.stack([s.x for s in states]).double().sum(0)
        sum_t = torch.stack([alg.tracked(s) for s in states]).double().sum(0)
        assert torch.allclose(sum_x, sum_t, atol=1e-4)


def test_choco_refuses_a_missing_copy_and_a_bad_step():
    with pytest.raises(KeyError, match="n1"):
        choco_sum("n0", {"n0": 0.5, "n1": 0.5}, torch.zeros(3), {"n0": torch.zeros(3)}, 0.5)
    with pytest.raises(ValueError, match="step"):
        Mixing("choco", gamma=0.0)
    alg = make_algorithm("dacfl", mixing=Mixing("choco", gamma=0.5))
    with pytest.raises(ValueError, match="public copies"):
        alg.prepare(NodeState.initial(torch.zeros(3)), "n0", {"n0": 1.0}, {})
