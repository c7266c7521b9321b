"""The experiment behind the default consensus step γ of each compressor (docs/compression.md,
"Choosing γ"): CHOCO-Gossip consensus alone, all nodes in one process, for every compressor and
step on a ring and on the paper's dense random matrix.

:func:`choco_consensus` runs CHOCO (Koloskova, Stich, Jaggi 2019, Algorithm 1) with the node's
own compressors (:mod:`dacflnode.algorithms.compression`); :func:`gamma_sweep` runs it over a
grid and returns one :class:`SweepRow` per matrix, compression and γ. The node runs none of this:
its defaults (``topk_gamma``, ``randk_gamma``, ``Compressor.default_gamma``) are what this
experiment chose.

    .venv/bin/python benchmarks/gamma_sweep.py            # the table of docs/compression.md
    .venv/bin/python benchmarks/gamma_sweep.py --quick    # a smaller grid, in seconds

The result (``--json``) is the largest relative drift of the network sum over the runs that
converged (error below 1 at the end), which CHOCO keeps to float32 rounding whatever the
compressor does (target ≤ 1e-5).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, dataclass

import numpy as np
import torch
from _common import add_standard_args, emit_result

from dacflnode.algorithms.compression import Compressor, make_compressor, stable_seed
from dacflnode.algorithms.graphs import ring
from dacflnode.algorithms.mixing import dense_random_matrix, metropolis_matrix

#: The compressions of the docs' table.
SPECS = ["none", "fp16", "bf16", "int8", "topk:0.01", "topk:0.05", "topk:0.1", "randk:0.01",
         "randk:0.05", "randk:0.1"]
#: The steps of the docs' table.
GAMMAS = [0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0]


#: A consensus error above this counts as diverged: :func:`choco_consensus` stops there.
DIVERGED = 1e3


@dataclass(frozen=True)
class ConsensusTrace:
    """What :func:`choco_consensus` measured: ``errors[t]`` is ``‖x_t − x̄‖ / ‖x_0 − x̄‖``
    after step ``t + 1``; ``sum_drift`` the largest ``max_k |Σ_i x_t[i, k] − Σ_i x_0[i, k]|``
    over the steps, relative to ``max_k Σ_i |x_0[i, k]|``; ``final`` the states ``x``."""

    errors: list[float]
    sum_drift: float
    final: torch.Tensor


def choco_consensus(
    compressor: Compressor | None,
    w: torch.Tensor,
    x0: torch.Tensor,
    gamma: float,
    steps: int,
    seed: int = 0,
) -> ConsensusTrace:
    """CHOCO-Gossip (Koloskova, Stich, Jaggi 2019, Algorithm 1) over a symmetric doubly
    stochastic ``w`` (n×n) from the float32 states ``x0`` (n×d), all nodes in one process.

    Each step, every node ``i`` sends ``q_i = Q(x_i − x̂_i)`` (encoded with the seed
    ``stable_seed(seed, i, t, "x")``); every holder of a copy ``x̂_i`` adds the decoded ``q_i``
    (one decode: the bits are the same at every end); then
    ``x_i += γ Σ_{j≠i} w_ij (x̂_j − x̂_i)``. A run whose error exceeds :data:`DIVERGED` stops
    there, its remaining errors ``inf``. With a symmetric ``w`` the increments cancel in
    ``Σ_i x_i`` whatever ``Q`` did, so the sum changes only by float32 rounding.
    ``compressor=None`` sends ``q_i = x_i − x̂_i`` exactly (plain gossip for ``γ = 1``)."""
    if w.dim() != 2 or w.shape[0] != w.shape[1] or x0.dim() != 2 or x0.shape[0] != w.shape[0]:
        raise ValueError("choco_consensus needs w of shape (n, n) and x0 of shape (n, d)")
    nodes, dim = x0.shape
    off = w.to(torch.float32).clone()
    off.fill_diagonal_(0.0)
    row = off.sum(dim=1, keepdim=True)
    x = x0.to(torch.float32).clone()
    copies = torch.zeros_like(x)
    start_sum = x.double().sum(dim=0)
    sum_scale = float(x.double().abs().sum(dim=0).max()) or 1.0
    mean = x.double().mean(dim=0).float()
    start_error = float(torch.linalg.vector_norm(x - mean)) or 1.0
    errors: list[float] = []
    drift = 0.0
    for step in range(steps):
        for i in range(nodes):
            delta = x[i] - copies[i]
            if compressor is None:
                copies[i] += delta
            else:
                node_seed = stable_seed(seed, i, step, "x")
                sent = compressor.encode(delta, node_seed)
                copies[i] += compressor.decode(sent, dim, node_seed)
        x += gamma * (off @ copies - row * copies)
        error = float(torch.linalg.vector_norm(x - mean)) / start_error
        if not error < DIVERGED:
            errors.extend([math.inf] * (steps - step))
            break
        errors.append(error)
        drift = max(drift, float((x.double().sum(dim=0) - start_sum).abs().max()) / sum_scale)
    return ConsensusTrace(errors, drift, x)


@dataclass(frozen=True)
class SweepRow:
    """One run of :func:`gamma_sweep`: the consensus error after 25 steps and at the end
    (``inf`` when it diverged) and the largest relative drift of the network sum."""

    matrix: str
    compression: str
    gamma: float
    error_25: float
    error_end: float
    sum_drift: float


def gamma_sweep(
    specs: list[str],
    gammas: list[float],
    steps: int = 100,
    nodes: int = 10,
    dim: int = 100_000,
    seed: int = 0,
) -> list[SweepRow]:
    """The experiment behind the default γ of each compressor (docs/compression.md): CHOCO
    consensus on a ``nodes``-ring with Metropolis weights and on the paper's dense random
    doubly stochastic matrix, from independent standard normal states of ``dim`` entries,
    for every spec and γ: one row per (matrix, spec, γ), in that order.

    The table of docs/compression.md is ``gamma_sweep(SPECS, GAMMAS)`` (about 25 minutes on
    two loaded cores; this script's default run)."""
    matrices = {
        "ring": torch.from_numpy(metropolis_matrix(nodes, ring(nodes))),
        "dense": torch.from_numpy(dense_random_matrix(nodes, np.random.default_rng(seed))),
    }
    generator = torch.Generator().manual_seed(seed)
    x0 = torch.randn(nodes, dim, generator=generator)
    rows: list[SweepRow] = []
    for name, w in matrices.items():
        for spec in specs:
            compressor = make_compressor(spec)
            for gamma in gammas:
                trace = choco_consensus(compressor, w, x0, gamma, steps, seed)
                rows.append(SweepRow(name, spec, gamma, trace.errors[min(24, steps - 1)],
                                     trace.errors[-1], trace.sum_drift))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100, help="CHOCO steps per run")
    ap.add_argument("--dim", type=int, default=100_000, help="entries of each node's state")
    add_standard_args(ap)
    args = ap.parse_args()
    specs, gammas = SPECS, GAMMAS
    if args.quick:
        specs, gammas = ["none", "int8", "topk:0.1", "randk:0.1"], [0.05, 0.2, 1.0]
        args.steps, args.dim = min(args.steps, 30), min(args.dim, 1_000)
    rows = gamma_sweep(specs, gammas, steps=args.steps, dim=args.dim)
    if not args.json:
        print(f"CHOCO consensus, 10 nodes, {args.dim} entries: error after 25 / {args.steps} "
              "steps (inf: diverged), largest relative drift of the sum")
        for r in rows:
            print(f"{r.matrix:5} {r.compression:10} γ={r.gamma:<5} {r.error_25:.3g} / "
                  f"{r.error_end:.3g}  drift {r.sum_drift:.1e}")
    # the states of a run that does not converge grow, and the float32 rounding of their sum
    # with them: the drift is held to rounding of the initial states where the states shrink
    drift = max((r.sum_drift for r in rows if r.error_end < 1.0), default=0.0)
    emit_result("gamma_sweep", drift, 1e-5, False, as_json=args.json, steps=args.steps,
                dim=args.dim, rows=[_json_row(r) for r in rows])
    return 0


def _json_row(row: SweepRow) -> dict[str, object]:
    """``row`` with a diverged error as ``None`` (JSON has no infinity)."""
    return {k: (None if isinstance(v, float) and math.isinf(v) else v)
            for k, v in asdict(row).items()}


if __name__ == "__main__":
    sys.exit(main())
