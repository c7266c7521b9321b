"""bench_scale's consensus-only rounds compute what a dense ``W`` computes, and keep Σx = Σω."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_scale  # type: ignore[import-not-found]

from dacflnode.algorithms.mixing import metropolis_matrix

NODES, PARAMS, ROUNDS = 6, 1000, 4


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
@pytest.mark.parametrize(("kind", "degree"), [("ring", 2), ("random-regular", 3)])
def test_project_and_baseline_rounds_equal_a_dense_float64_reference(kind, degree):
    edges = bench_scale.build_graph(kind, NODES, degree, seed=1)
    omega0 = bench_scale.initial_block(NODES, PARAMS, seed=1, block=0)
    w = metropolis_matrix(NODES, edges)
    ref_x, ref_prev = bench_scale.dense_reference(omega0, w, ROUNDS)

    states = bench_scale.project_rounds(omega0, bench_scale.node_weights(NODES, edges), ROUNDS)
    x = bench_scale.stack(states, "x")
    assert all(s.round == ROUNDS for s in states)
    torch.testing.assert_close(x.double(), ref_x, rtol=0, atol=2e-6)
    torch.testing.assert_close(bench_scale.stack(states, "omega_prev").double(), ref_prev,
                               rtol=0, atol=2e-6)
    assert not torch.allclose(x, omega0)  # the nodes' states did move
    assert bench_scale.invariant_residual(x, bench_scale.stack(states, "omega_prev")) < 1e-6

    w32 = torch.tensor(w, dtype=torch.float32)
    for matrix in (w32, w32.to_sparse_csr()):
        bx, bprev = bench_scale.baseline_rounds(omega0, matrix, ROUNDS)
        torch.testing.assert_close(bx.double(), ref_x, rtol=0, atol=2e-6)
        torch.testing.assert_close(bprev.double(), ref_prev, rtol=0, atol=2e-6)


def test_invariant_residual_sees_a_broken_sum():
    x = torch.ones(4, 10)
    assert bench_scale.invariant_residual(x, x) == 0.0
    broken = x.clone()
    broken[2, 3] += 0.5
    assert bench_scale.invariant_residual(broken, x) == pytest.approx(0.5 / 4)


def test_a_case_split_into_column_blocks_covers_every_parameter():
    # room for 400 columns of 6 nodes: 1000 parameters run as blocks of 400, 400 and 200
    r = bench_scale.run_case("ring", NODES, 2, PARAMS, rounds=2,
                             memory_bytes=bench_scale.BYTES_PER_NODE_COLUMN * NODES * 400,
                             seed=0)
    assert (r.blocks, r.block_cols) == (3, 400)
    assert r.invariant_residual < 1e-6
    assert r.max_abs_diff_vs_baseline < 1e-5
    assert r.rounds_per_s > 0 and r.baseline_rounds_per_s > 0
    assert r.ratio == pytest.approx(r.rounds_per_s / r.baseline_rounds_per_s)


def test_node_weights_are_the_metropolis_matrix_rows():
    edges = bench_scale.build_graph("random-regular", 8, 3, seed=2)
    rows = bench_scale.node_weights(8, edges)
    names = bench_scale.node_names(8)
    dense = np.zeros((8, 8))
    for i, row in enumerate(rows):
        for name, value in row.items():
            dense[i, names.index(name)] = value
    np.testing.assert_allclose(dense, metropolis_matrix(8, edges), rtol=0, atol=0)
