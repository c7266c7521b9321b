import numpy as np
import pytest

from dacflnode.algorithms.consensus_demo import consensus_demo, fig3_inputs, fodac_step
from dacflnode.algorithms.mixing import dense_random_matrix


def test_fig3_inputs_follow_the_papers_formula():
    r = fig3_inputs("I")
    assert r.shape == (20, 10)
    # t = 2, i = 3: sin 2 + (1/2)^3 + 2 + 3
    assert r[1, 2] == pytest.approx(np.sin(2) + 0.125 + 5)
    assert np.allclose(fig3_inputs("I") - fig3_inputs("II"), np.arange(1, 11))


def test_fodac_step_preserves_the_sum_of_the_inputs():
    rng = np.random.default_rng(0)
    w = dense_random_matrix(10, rng)
    r = fig3_inputs("I")
    x = r[0].copy()
    for k in range(1, 20):
        x = fodac_step(w, x, r[k], r[k - 1])
        assert x.sum() == pytest.approx(r[k].sum())


@pytest.mark.parametrize("matrix", ["sparse", "dense", "uniform", "ring"])
def test_fodac_tracks_the_average_better_than_cdsgd_on_inputs_one(matrix):
    result = consensus_demo("I", matrix, seed=0)
    assert len(result.mae["fodac"]) == 20
    assert result.mae["fodac"][0] == pytest.approx(2.5)  # x_i(1) = r_i(1): |i - 5.5| mean
    assert max(result.mae["dpsgd"]) < 1e-12
    assert result.mae["fodac"][-1] < result.mae["fodac"][0]
    if matrix in ("sparse", "dense"):  # the paper's Fig. 3(a) finding
        assert result.mae["fodac"][-1] < result.mae["cdsgd"][-1]


def test_with_a_uniform_matrix_cdsgd_is_exact_and_fodac_lags_by_one_difference():
    result = consensus_demo("II", "uniform")
    assert max(result.mae["cdsgd"]) < 1e-12
    # x_i(t+1) = mean r(t) + r_i(t+1) - r_i(t): the error is |Δr_i - mean Δr|
    r = fig3_inputs("II")
    d = np.diff(r, axis=0)
    expected = np.abs(d - d.mean(axis=1, keepdims=True)).mean(axis=1)
    assert np.allclose(result.mae["fodac"][1:], expected, atol=1e-12)
