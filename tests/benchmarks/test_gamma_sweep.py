"""CHOCO consensus of benchmarks/gamma_sweep.py, the experiment behind each compressor's default
step: it keeps the network sum under every compressor, converges with the default steps, is plain
gossip without compression, and reports divergence."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from gamma_sweep import choco_consensus, gamma_sweep  # type: ignore[import-not-found]

from dacflnode.algorithms.compression import Compressor, make_compressor
from dacflnode.algorithms.graphs import ring
from dacflnode.algorithms.mixing import dense_random_matrix, metropolis_matrix

KINDS = ["fp16", "bf16", "int8", "topk:0.01", "topk:0.3", "randk:0.01", "randk:0.3", "randk:0.8"]


def compressor(spec: str) -> Compressor:
    made = make_compressor(spec)
    assert made is not None
    return made


def matrices() -> dict[str, torch.Tensor]:
    return {"ring": torch.from_numpy(metropolis_matrix(10, ring(10))),
            "dense": torch.from_numpy(dense_random_matrix(10, np.random.default_rng(0)))}


@pytest.mark.parametrize("spec", ["none", *KINDS])
@pytest.mark.parametrize("matrix", ["ring", "dense"])
def test_choco_consensus_preserves_the_network_sum_under_every_compressor(spec, matrix):
    x0 = torch.randn(10, 1_000, generator=torch.Generator().manual_seed(4)) + 3.0
    c = make_compressor(spec)
    gamma = 1.0 if c is None else c.default_gamma
    trace = choco_consensus(c, matrices()[matrix], x0, gamma, steps=12, seed=1)
    assert trace.sum_drift <= 1e-5
    assert len(trace.errors) == 12 and all(math.isfinite(e) for e in trace.errors)
    final_sum = trace.final.double().sum(dim=0)
    assert float((final_sum - x0.double().sum(dim=0)).abs().max()) <= 1e-5 * float(
        x0.double().abs().sum(dim=0).max())


@pytest.mark.parametrize(("spec", "steps", "reach"), [
    ("fp16", 40, 1e-2), ("bf16", 40, 1e-2), ("int8", 40, 1e-2),
    ("topk:0.01", 60, 0.7), ("topk:0.1", 60, 0.3), ("randk:0.01", 100, 0.92),
    ("randk:0.1", 60, 0.45),
])
def test_choco_consensus_converges_on_the_ring_with_the_default_step(spec, steps, reach):
    c = compressor(spec)
    x0 = torch.randn(10, 2_000, generator=torch.Generator().manual_seed(6))
    errors = choco_consensus(c, matrices()["ring"], x0, c.default_gamma, steps, seed=2).errors
    assert errors[-1] < reach
    assert errors[-1] < errors[steps // 2] < errors[0] <= 1.0 + 1e-6


def test_choco_consensus_without_compression_is_plain_gossip():
    w = matrices()["ring"]
    x0 = torch.randn(10, 50, generator=torch.Generator().manual_seed(0))
    trace = choco_consensus(None, w, x0, 1.0, steps=3)
    expected = x0.double()
    for _ in range(3):
        expected = w @ expected
    assert torch.allclose(trace.final.double(), expected, atol=1e-5)


def test_choco_consensus_reports_a_diverging_step_as_infinite_error():
    w = matrices()["ring"]
    x0 = torch.randn(10, 50, generator=torch.Generator().manual_seed(0))
    trace = choco_consensus(None, w, x0, 40.0, steps=30)
    assert trace.errors[-1] == math.inf and len(trace.errors) == 30


def test_gamma_sweep_reports_each_matrix_spec_and_step_and_marks_divergence():
    rows = gamma_sweep(["int8", "randk:0.1"], [0.5, 40.0], steps=30, dim=200)
    assert [(r.matrix, r.compression, r.gamma) for r in rows] == [
        (m, s, g) for m in ("ring", "dense") for s in ("int8", "randk:0.1") for g in (0.5, 40.0)]
    by_key = {(r.matrix, r.compression, r.gamma): r for r in rows}
    assert by_key[("ring", "int8", 0.5)].error_end < by_key[("ring", "int8", 0.5)].error_25 < 1
    assert by_key[("dense", "int8", 40.0)].error_end == math.inf
    assert by_key[("ring", "int8", 0.5)].sum_drift <= 1e-5
