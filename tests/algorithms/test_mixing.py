import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dacflnode.algorithms import graphs
from dacflnode.algorithms.mixing import (
    dense_random_matrix,
    graph_of,
    metropolis_matrix,
    metropolis_weights,
    sinkhorn_knopp,
    sparse_random_matrix,
    uniform_matrix,
    validate_mixing_matrix,
)
from dacflnode.errors import MixingMatrixError

sizes = st.integers(min_value=2, max_value=16)
seeds = st.integers(min_value=0, max_value=2**32 - 1)


def assert_symmetric_doubly_stochastic(w: np.ndarray) -> None:
    assert np.allclose(w, w.T, atol=1e-12)
    assert np.allclose(w.sum(axis=0), 1.0, atol=1e-9)
    assert np.allclose(w.sum(axis=1), 1.0, atol=1e-9)
    assert (w >= 0).all()
    validate_mixing_matrix(w)


@settings(max_examples=60, deadline=None)
@given(sizes, seeds)
def test_dense_random_matrix_is_symmetric_doubly_stochastic_with_no_zero(n, seed):
    w = dense_random_matrix(n, np.random.default_rng(seed))
    assert_symmetric_doubly_stochastic(w)
    assert (w > 0).all()


@settings(max_examples=60, deadline=None)
@given(sizes, seeds)
def test_sparse_random_matrix_is_doubly_stochastic_connected_and_half_zero(n, seed):
    w = sparse_random_matrix(n, np.random.default_rng(seed))
    assert_symmetric_doubly_stochastic(w)
    assert (np.diag(w) > 0).all()
    zeros = int((w == 0).sum())
    max_zeros = n * n - n - 2 * (n - 1)  # a spanning tree must stay
    assert zeros == min(max_zeros, 2 * (round(0.5 * n * n) // 2))


def test_sparse_matrix_in_the_papers_setting_has_exactly_half_zero_entries():
    w = sparse_random_matrix(10, np.random.default_rng(3))
    assert int((w == 0).sum()) == 50


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=3, max_value=14), seeds)
def test_metropolis_on_random_graphs_is_symmetric_doubly_stochastic(n, seed):
    rng = np.random.default_rng(seed)
    edges = graphs.erdos_renyi(n, 0.4, rng)
    w = metropolis_matrix(n, edges)
    assert_symmetric_doubly_stochastic(w)
    assert graph_of(w) == edges


def test_metropolis_weights_are_computed_from_local_degrees_only():
    self_w, row = metropolis_weights(2, {"a": 3, "b": 1})
    assert row == pytest.approx({"a": 0.25, "b": 1 / 3})
    assert self_w == pytest.approx(1 - 0.25 - 1 / 3)


def test_metropolis_weights_sum_to_exactly_one_in_float32():
    # the mix multiplies float32 states by float32 weights: a row that sums to 1 + 3e-8
    # there makes Σ x drift every round
    cases = [(2, {"a": 2, "b": 2}), (2, {"a": 3, "b": 1}), (4, dict.fromkeys("abcd", 6))]
    for own, others in cases:
        self_w, row = metropolis_weights(own, others)
        in_f32 = [np.float32(w) for w in [self_w, *row.values()]]
        assert all(float(w) == v for w, v in zip(in_f32, [self_w, *row.values()], strict=True))
        assert math.fsum(float(w) for w in in_f32) == 1.0


def test_uniform_matrix_entries_are_one_over_n():
    w = uniform_matrix(5)
    assert_symmetric_doubly_stochastic(w)
    assert np.all(w == 0.2)


def test_sinkhorn_knopp_scales_a_positive_symmetric_matrix():
    a = np.array([[1.0, 2.0, 0.0], [2.0, 1.0, 3.0], [0.0, 3.0, 1.0]])
    w = sinkhorn_knopp(a)
    assert_symmetric_doubly_stochastic(w)
    assert w[0, 2] == 0.0


def test_validate_names_the_row_that_does_not_sum_to_one():
    w = uniform_matrix(4)
    w[2, 2] += 0.1  # symmetric still; only row 2 and column 2 are off
    with pytest.raises(MixingMatrixError, match="row 2 sums to"):
        validate_mixing_matrix(w)


def test_validate_names_the_asymmetric_entry():
    w = np.array([[0.5, 0.3, 0.2], [0.2, 0.5, 0.3], [0.3, 0.2, 0.5]])
    with pytest.raises(MixingMatrixError, match=r"not symmetric: entry \(0, 1\)"):
        validate_mixing_matrix(w)


def test_validate_refuses_a_disconnected_graph():
    w = np.array([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    with pytest.raises(MixingMatrixError, match="not connected"):
        validate_mixing_matrix(w)


def test_validate_rejects_negative_entries():
    w = np.array([[1.2, -0.2], [-0.2, 1.2]])
    with pytest.raises(MixingMatrixError, match="negative"):
        validate_mixing_matrix(w)


def test_paper_algorithm_3_is_deterministic_for_a_seed():
    a = dense_random_matrix(10, np.random.default_rng(7))
    b = dense_random_matrix(10, np.random.default_rng(7))
    assert np.array_equal(a, b)
