"""Mixing matrices: symmetric, doubly stochastic weights over a connected graph.

* :func:`metropolis_weights` is what a daemon computes on its own from its degree and the degrees
  its neighbours announce; :func:`metropolis_matrix` assembles the same rows for a whole graph.
* :func:`dense_random_matrix` is the paper's Algorithm 3 (every entry non-zero).
* :func:`sparse_random_matrix` is the paper's "sparse" ψ = 0.5 matrix: a random symmetric zero
  pattern (about half the entries zero, graph connected) scaled by Sinkhorn–Knopp.
* :func:`validate_mixing_matrix` says which row or column breaks which property.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TypeVar

import numpy as np

from dacflnode.algorithms.graphs import Edges, is_connected, neighbours
from dacflnode.errors import MixingMatrixError

K = TypeVar("K")

#: Tolerance used to accept a matrix as symmetric and doubly stochastic.
TOLERANCE = 1e-9


def metropolis_weights(
    own_degree: int, neighbour_degrees: Mapping[K, int]
) -> tuple[float, dict[K, float]]:
    """Metropolis–Hastings weights of one node, computed locally.

    ``w_ij = 1 / (1 + max(d_i, d_j))`` for each neighbour ``j`` and ``w_ii = 1 - Σ_j w_ij``.
    Returns ``(self_weight, {neighbour: weight})``. Both ends of an edge compute the same
    ``w_ij``, so the assembled matrix is symmetric and doubly stochastic.
    """
    # Each weight is rounded to float32 first, the precision states are mixed in: then the
    # self weight 1 − Σ w_ij, computed exactly (fsum), makes the row sum exactly 1 in the
    # arithmetic the mix uses, and Σ x does not drift by float32's rounding of 1/(1 + d) every
    # round (docs/faults.md). fsum is exactly rounded, so the self weight does not depend on
    # the neighbours' order either.
    weights = {j: float(np.float32(1.0 / (1.0 + max(own_degree, d))))
               for j, d in neighbour_degrees.items()}
    return 1.0 - math.fsum(weights.values()), weights


def metropolis_matrix(n: int, edges: Edges) -> np.ndarray:
    adj = neighbours(n, edges)
    deg = [len(a) for a in adj]
    w = np.zeros((n, n))
    for i in range(n):
        self_w, row = metropolis_weights(deg[i], {j: deg[j] for j in adj[i]})
        w[i, i] = self_w
        for j, v in row.items():
            w[i, j] = v
    return w


def uniform_matrix(n: int) -> np.ndarray:
    return np.full((n, n), 1.0 / n)


def dense_random_matrix(
    n: int, rng: np.random.Generator, max_attempts: int = 100_000
) -> np.ndarray:
    """The paper's Algorithm 3: a random doubly stochastic ``A``, then ``W = (A + Aᵀ) / 2``.

    Line by line (1-based in the paper, 0-based here): fill the first row and column with
    shrinking random fractions, fill the inner block with ``min(row rest, column rest) * rand``,
    close the last row and column so every sum is one, and start over while ``A[n, n]`` is not
    positive (the paper retries on ``A(n, n) < 0``; we also retry on exactly 0 so that every
    entry is non-zero, which is what "dense" means).
    """
    if n < 2:
        raise ValueError("a mixing matrix needs at least 2 nodes")
    for _ in range(max_attempts):
        a = np.zeros((n, n))
        a[0, 0] = rng.random()
        for i in range(1, n - 1):
            a[0, i] = (1.0 - a[0, :i].sum()) * rng.random()
        for i in range(1, n - 1):
            a[i, 0] = (1.0 - a[:i, 0].sum()) * rng.random()
        for i in range(1, n - 1):
            for j in range(1, n - 1):
                d1 = 1.0 - a[i, :j].sum()
                d2 = 1.0 - a[:i, j].sum()
                a[i, j] = min(d1, d2) * rng.random()
        for i in range(n - 1):
            a[n - 1, i] = 1.0 - a[: n - 1, i].sum()
        for i in range(n):
            a[i, n - 1] = 1.0 - a[i, : n - 1].sum()
        if a[n - 1, n - 1] > 0:
            return (a + a.T) / 2.0
    raise RuntimeError(f"Algorithm 3 found no matrix with A(n,n) > 0 in {max_attempts} tries")


def sinkhorn_knopp(a: np.ndarray, tol: float = 1e-14, max_iter: int = 100_000) -> np.ndarray:
    """Scale a symmetric non-negative matrix with total support to ``D A D``, doubly stochastic.

    Uses the symmetric form of the Sinkhorn–Knopp iteration, ``d ← sqrt(d / (A d))``, which
    keeps the result symmetric; a final ``(W + Wᵀ) / 2`` removes rounding asymmetry.
    """
    if not np.allclose(a, a.T):
        raise ValueError("sinkhorn_knopp expects a symmetric matrix")
    d = np.ones(a.shape[0])
    for _ in range(max_iter):
        d = np.sqrt(d / (a @ d))
        w = d[:, None] * a * d[None, :]
        if np.max(np.abs(w.sum(axis=1) - 1.0)) < tol:
            break
    else:
        raise RuntimeError("Sinkhorn–Knopp did not converge: does the pattern have total support?")
    symmetric: np.ndarray = (w + w.T) / 2.0
    return symmetric


def sparse_random_matrix(
    n: int, rng: np.random.Generator, zero_fraction: float = 0.5
) -> np.ndarray:
    """The paper's "sparse" matrix: about ``zero_fraction`` of the n² entries are zero.

    The diagonal is always non-zero; the zeros come in symmetric pairs. The non-zero pattern is a
    random spanning tree plus random extra edges, so the graph is connected. The values are
    uniform in (0, 1), symmetric, and Sinkhorn–Knopp scales them to doubly stochastic.
    """
    if n < 2:
        raise ValueError("a mixing matrix needs at least 2 nodes")
    if not 0.0 <= zero_fraction < 1.0:
        raise ValueError("zero_fraction must be in [0, 1)")
    pairs = n * (n - 1) // 2
    zero_pairs = round(zero_fraction * n * n) // 2
    edge_count = min(pairs, max(n - 1, pairs - zero_pairs))
    order = rng.permutation(n)
    chosen: set[tuple[int, int]] = set()
    for k in range(1, n):
        parent = order[int(rng.integers(0, k))]
        child = order[k]
        chosen.add((int(min(parent, child)), int(max(parent, child))))
    rest = [(i, j) for i in range(n) for j in range(i + 1, n) if (i, j) not in chosen]
    extra = edge_count - len(chosen)
    if extra > 0:
        picks = rng.choice(len(rest), size=extra, replace=False)
        chosen.update(rest[int(p)] for p in picks)
    a = np.zeros((n, n))
    for i, j in chosen:
        a[i, j] = a[j, i] = 0.05 + rng.random()
    a[np.diag_indices(n)] = 0.05 + rng.random(n)
    return sinkhorn_knopp(a)


def graph_of(w: np.ndarray, atol: float = 0.0) -> Edges:
    """The edges ``(i, j)``, ``i < j``, on which ``w`` is non-zero (above ``atol``)."""
    n = w.shape[0]
    return tuple(
        (i, j)
        for i in range(n)
        for j in range(i + 1, n)
        if abs(w[i, j]) > atol or abs(w[j, i]) > atol
    )


def validate_mixing_matrix(w: np.ndarray, tol: float = TOLERANCE) -> None:
    """Raise :class:`MixingMatrixError` naming the first row/column that breaks a property.

    Checks: square, finite, non-negative, symmetric, every row and column summing to one within
    ``tol``, and a connected graph.
    """
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise MixingMatrixError(f"mixing matrix must be square, got shape {w.shape}")
    n = w.shape[0]
    if not np.all(np.isfinite(w)):
        i, j = np.argwhere(~np.isfinite(w))[0]
        raise MixingMatrixError(f"entry ({i}, {j}) is not finite")
    if np.any(w < -tol):
        i, j = np.argwhere(w < -tol)[0]
        raise MixingMatrixError(f"entry ({i}, {j}) = {w[i, j]:.3g} is negative")
    asym = np.abs(w - w.T)
    if np.any(asym > tol):
        i, j = np.argwhere(asym > tol)[0]
        raise MixingMatrixError(
            f"not symmetric: entry ({i}, {j}) = {w[i, j]:.12g} but ({j}, {i}) = {w[j, i]:.12g}"
        )
    rows = w.sum(axis=1)
    for i in range(n):
        if abs(rows[i] - 1.0) > tol:
            raise MixingMatrixError(f"row {i} sums to {rows[i]:.12g}, not 1")
    cols = w.sum(axis=0)
    for j in range(n):
        if abs(cols[j] - 1.0) > tol:
            raise MixingMatrixError(f"column {j} sums to {cols[j]:.12g}, not 1")
    if not is_connected(n, graph_of(w, atol=tol)):
        raise MixingMatrixError("the graph of the mixing matrix is not connected")
