#!/usr/bin/env python3
"""Consensus-only DACFL rounds at 10, 100 and 1000 simulated nodes: rounds/s and memory per node.

Every node holds a flat state of P = 1 663 562 float32 parameters by default (the ``fmnist-cnn``
:class:`~dacflnode.learning.layout.StateLayout`, 6.35 MiB), a different random vector per node.
A *consensus-only* round is a DACFL round with the local update left out (``Train`` is the
identity): each node mixes its neighbours' ``ω`` and ``x`` with the Metropolis weights it would
compute itself (:func:`~dacflnode.algorithms.mixing.metropolis_weights`) and takes the FODAC step,
``ω' = Σ_j w_ij ω_j``, ``x' = Σ_j w_ij x_j + (ω − ω_prev)``. Graphs: a ring (degree 2) and
seeded random-regular graphs (:func:`~dacflnode.algorithms.graphs.random_regular`, degrees 4 and
8 by default).

(a) **project**: the code a node runs — for every node ``DACFL.prepare`` (two ``weighted_sum``
    mixes over the node and its neighbours in sorted order, accumulated in float64) then
    ``DACFL.complete`` with the mixed ``ω`` as the trained vector, each node its own
    :class:`~dacflnode.algorithms.rounds.NodeState`; a round is synchronous (every node mixes
    round-``t`` states), as in the simulator.
(b) **baseline**, in the same process, on the same data: the same round for all nodes as raw
    tensor algebra, ``S' = W @ S`` over the ``[N, 2P]`` float32 matrix ``S = [Ω | X]`` (one
    sparse CSR product; for N ≤ 128 also a dense one, and the faster of the two counts), then
    ``X' += Ω − Ω_prev`` in place.

``ratio`` = project rounds/s ÷ baseline rounds/s, the worst over all cases (higher is better).
Target ≥ 0.5: the per-node path does the same two mixes per round as the baseline, and is
allowed at most twice the raw cost for keeping every node's state apart and for the float64
accumulation that keeps ``Σ x`` from drifting (``weighted_sum``).

**Memory.** A node's state is three vectors (``x``, ``ω``, ``ω_prev``: 19 MiB at full P), and a
synchronous round holds the old and the new states at once, so 1000 full-size nodes need more
than 24 GiB. Consensus is column-separable (every parameter is mixed on its own), so the
benchmark runs the P columns in blocks that fit ``--memory-gib`` (both paths, the same blocks;
the rounds of all blocks add up to the round time). ``rss_per_node_mb`` is the peak RSS growth
of the project's rounds over the first (largest) block, per node, scaled to the full P
(memory is linear in the block width; with one block it is the measured figure itself);
``rss_bytes_per_param`` is the same per node and parameter (float32 state = 4 bytes).

**Threads.** Both paths run with the same torch intra-op thread count, ``--threads`` (default 1:
figures per core). On a loaded 2-core machine two OpenMP threads stall at every barrier: a
10-node round of the project's path took 0.93–1.6 s with 2 threads against 0.014–0.022 s with
one, at load average 4.7.

**Correctness.** After the rounds, ``Σ_i x_i = Σ_i ω_prev_i`` (DACFL's invariant: the network sum
of ``x`` tracks the sum of the models) — the largest residual over all columns, relative to
``max |Σ ω_prev|``, is reported per case — and the project's ``x`` is compared with the
baseline's (largest absolute difference).

**Growth.** Per path, seconds per round ÷ (N·P) is fitted over all cases as ``α + β·(d+1)``
(N nodes, degree d, d+1 vectors mixed per node: a node's fixed work per parameter plus its work
per mixed vector), and for each degree the spread of that figure across N is given (1.0 =
exactly linear in N); ``ns_per_term`` = seconds per round ÷ (N·(d+1)·P) per case.

    python benchmarks/bench_scale.py                      # 10, 100, 1000 nodes, full P (minutes)
    python benchmarks/bench_scale.py --quick [--json]     # 10 and 100 nodes, P/16, < 60 s
    python benchmarks/bench_scale.py --nodes 1000 --params 20000 --rounds 2
"""

from __future__ import annotations

import argparse
import ctypes
import math
import resource
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from _common import add_standard_args, emit_result, machine

from dacflnode.algorithms import graphs
from dacflnode.algorithms.mixing import metropolis_matrix, metropolis_weights
from dacflnode.algorithms.rounds import DACFL, NodeState
from dacflnode.learning.layout import StateLayout
from dacflnode.learning.models import build_model

MIB = 2**20
#: Peak bytes per node and parameter column the two paths hold (project: initial block, old and
#: new states, float64 accumulator and temporaries, measured up to 50 B; baseline: [Ω | X] twice,
#: Ω_prev, and the project's x kept for the comparison), used to size
#: the column blocks to ``--memory-gib``.
BYTES_PER_NODE_COLUMN = 64
DENSE_BASELINE_MAX_NODES = 128


def fmnist_params() -> int:
    """P of the ``fmnist-cnn`` flat state (its :class:`StateLayout`)."""
    return StateLayout.from_module(build_model("fmnist-cnn", (1, 28, 28), 10)).numel


# ----------------------------------------------------------------------------- graphs, weights
def build_graph(kind: str, nodes: int, degree: int, seed: int) -> graphs.Edges:
    if kind == "ring":
        return graphs.ring(nodes)
    if kind == "random-regular":
        return graphs.random_regular(nodes, degree, np.random.default_rng(seed))
    raise ValueError(f"unknown graph '{kind}'")


def node_names(nodes: int) -> list[str]:
    """Zero-padded, so that the sorted order ``weighted_sum`` mixes in is the numeric order."""
    return [f"node-{i:05d}" for i in range(nodes)]


def node_weights(nodes: int, edges: graphs.Edges) -> list[dict[str, float]]:
    """Each node's mixing weights (itself included), as a daemon computes them from its own degree
    and the degrees its neighbours announce."""
    adj = graphs.neighbours(nodes, edges)
    names = node_names(nodes)
    out = []
    for i in range(nodes):
        self_w, row = metropolis_weights(len(adj[i]), {names[j]: len(adj[j]) for j in adj[i]})
        out.append({names[i]: self_w, **row})
    return out


# ----------------------------------------------------------------------------- the two paths
def project_rounds(omega0: torch.Tensor, weights: Sequence[dict[str, float]],
                   rounds: int) -> list[NodeState]:
    """``rounds`` consensus-only DACFL rounds through the project's per-node algorithm core.

    Node ``i`` starts from ``x = ω = ω_prev = omega0[i]`` (its own copies). Returns the states.
    """
    algorithm = DACFL("lagged")
    nodes = omega0.shape[0]
    names = node_names(nodes)
    states = [NodeState.initial(omega0[i]) for i in range(nodes)]
    for _ in range(rounds):
        outgoing = {names[i]: algorithm.outgoing(s) for i, s in enumerate(states)}
        new = []
        for i, state in enumerate(states):
            inbox = {j: outgoing[j] for j in weights[i] if j != names[i]}
            prepared = algorithm.prepare(state, names[i], weights[i], inbox)
            new.append(algorithm.complete(state, prepared, prepared.train_from))
        del outgoing
        states = new
    return states


def baseline_rounds(omega0: torch.Tensor, w: torch.Tensor,
                    rounds: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same rounds as raw algebra: ``S' = W @ [Ω | X]``, ``X' += Ω − Ω_prev``. ``w`` is a
    dense or sparse-CSR float32 ``[N, N]`` matrix. Returns ``(X, Ω_prev)``."""
    cols = omega0.shape[1]
    s = torch.cat([omega0, omega0], dim=1)
    prev = omega0
    for _ in range(rounds):
        new = torch.sparse.mm(w, s) if w.layout == torch.sparse_csr else w @ s
        new[:, cols:].add_(s[:, :cols]).sub_(prev)
        prev = s[:, :cols]
        s = new
    return s[:, cols:], prev


def dense_reference(omega0: torch.Tensor, w: np.ndarray,
                    rounds: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rounds in float64 with a dense ``W`` (tests compare both paths with it)."""
    wd = torch.tensor(w, dtype=torch.float64)
    omega = omega0.double()
    x = omega.clone()
    prev = omega.clone()
    for _ in range(rounds):
        omega, x, prev = wd @ omega, wd @ x + (omega - prev), omega
    return x, prev


def invariant_residual(x: torch.Tensor, omega_prev: torch.Tensor) -> float:
    """``max_k |Σ_i x_ik − Σ_i ω_prev_ik| / max_k |Σ_i ω_prev_ik|`` (sums in float64)."""
    sx = x.double().sum(dim=0)
    so = omega_prev.double().sum(dim=0)
    return float((sx - so).abs().max() / so.abs().max().clamp_min(1e-30))


def stack(states: Sequence[NodeState], field: str) -> torch.Tensor:
    return torch.stack([getattr(s, field) for s in states])


# ----------------------------------------------------------------------------- memory
def _status_kib(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def trim_heap() -> bool:
    """Give the heap's free pages back to the OS (glibc ``malloc_trim(0)``), so that RSS growth
    over the next block counts what it allocates, not what earlier cases left free in the heap.
    False off glibc."""
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


class PeakRss:
    """Peak RSS growth in bytes over a ``with`` block (``VmHWM`` reset via ``clear_refs``)."""

    def __enter__(self) -> PeakRss:
        trim_heap()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.exact = _status_kib("VmHWM") is not None
        except OSError:
            self.exact = False
        self.before = _status_kib("VmRSS") or 0
        self.growth = 0
        return self

    def __exit__(self, *exc: object) -> None:
        after = (_status_kib("VmHWM") if self.exact
                 else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        self.growth = max(0, ((after or 0) - self.before) * 1024)


# ----------------------------------------------------------------------------- one case
@dataclass
class CaseResult:
    graph: str
    degree: int
    nodes: int
    params: int
    rounds: int
    blocks: int
    block_cols: int
    rounds_per_s: float
    baseline_rounds_per_s: float
    baseline: str
    ratio: float
    rss_per_node_mb: float
    rss_bytes_per_param: float
    baseline_rss_per_node_mb: float
    state_mb: float
    invariant_residual: float
    max_abs_diff_vs_baseline: float
    ns_per_term: float


def initial_block(nodes: int, cols: int, seed: int, block: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + block)
    return torch.rand(nodes, cols, generator=g)


def run_case(kind: str, nodes: int, degree: int, params: int, rounds: int,
             memory_bytes: int, seed: int) -> CaseResult:
    edges = build_graph(kind, nodes, degree, seed)
    degree = graphs.degrees(nodes, edges)[0]
    weights = node_weights(nodes, edges)
    w_np = metropolis_matrix(nodes, edges)
    with warnings.catch_warnings():  # "sparse CSR tensor support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        csr = torch.tensor(w_np, dtype=torch.float32).to_sparse_csr()
    dense = torch.tensor(w_np, dtype=torch.float32)
    kinds = {"csr": csr, **({"dense": dense} if nodes <= DENSE_BASELINE_MAX_NODES else {})}

    cols = max(1, min(params, memory_bytes // (BYTES_PER_NODE_COLUMN * nodes)))
    blocks = math.ceil(params / cols)
    project_s = 0.0
    base_s = dict.fromkeys(kinds, 0.0)
    rss = base_rss = 0
    residual = diff = 0.0
    for b in range(blocks):
        width = min(cols, params - b * cols)
        omega0 = initial_block(nodes, width, seed, b)
        with PeakRss() as peak:
            started = time.perf_counter()
            states = project_rounds(omega0, weights, rounds)
            project_s += time.perf_counter() - started
        if b == 0:
            rss = peak.growth
        x = stack(states, "x")
        residual = max(residual, invariant_residual(x, stack(states, "omega_prev")))
        del states
        for name, w in kinds.items():
            with PeakRss() as peak:
                started = time.perf_counter()
                bx, bprev = baseline_rounds(omega0, w, rounds)
                base_s[name] += time.perf_counter() - started
            if b == 0 and name == "csr":
                base_rss = peak.growth
            diff = max(diff, float((bx - x).abs().max()))
            residual_base = invariant_residual(bx, bprev)
            if not residual_base < 1e-3:
                raise AssertionError(f"baseline broke Σx = Σω_prev: {residual_base}")
            del bx, bprev
        del x, omega0
    best = min(base_s, key=lambda k: base_s[k])
    project_rps = rounds / project_s
    base_rps = rounds / base_s[best]
    per_param = rss / nodes / cols
    return CaseResult(
        graph=kind, degree=degree, nodes=nodes, params=params, rounds=rounds, blocks=blocks,
        block_cols=cols, rounds_per_s=project_rps, baseline_rounds_per_s=base_rps, baseline=best,
        ratio=project_rps / base_rps,
        rss_per_node_mb=per_param * params / MIB,
        rss_bytes_per_param=per_param,
        baseline_rss_per_node_mb=base_rss / nodes / cols * params / MIB,
        state_mb=params * 4 / MIB,
        invariant_residual=residual,
        max_abs_diff_vs_baseline=diff,
        ns_per_term=project_s / rounds / (nodes * (degree + 1) * params) * 1e9,
    )


def growth_fit(results: Sequence[CaseResult]) -> dict[str, Any]:
    """How the round time grows, per path: seconds per round ÷ (N·P) fitted as ``α + β·(d+1)``
    (a node's fixed work per parameter, plus its work per mixed vector), and, per degree, the
    spread of seconds per round ÷ (N·P) over N (1.0: exactly linear in N)."""
    out: dict[str, Any] = {"model": "seconds_per_round = N * P * (alpha + beta * (d + 1))"}
    for path in ("project", "baseline"):
        terms = np.array([r.degree + 1 for r in results], dtype=np.float64)
        per_node_param = np.array(
            [1.0 / (r.rounds_per_s if path == "project" else r.baseline_rounds_per_s)
             / (r.nodes * r.params) for r in results])
        fit: dict[str, Any] = {}
        if len(set(terms.tolist())) >= 2:
            beta, alpha = np.polyfit(terms, per_node_param, 1)
            pred = alpha + beta * terms
            ss_tot = float(((per_node_param - per_node_param.mean()) ** 2).sum())
            fit = {"alpha_ns": float(alpha) * 1e9, "beta_ns": float(beta) * 1e9,
                   "r2": 1.0 - float(((per_node_param - pred) ** 2).sum()) / ss_tot
                   if ss_tot > 0 else 1.0}
        spread = {}
        for d in sorted({r.degree for r in results}):
            vals = [v for r, v in zip(results, per_node_param, strict=True) if r.degree == d]
            if len(vals) >= 2:
                spread[str(d)] = float(max(vals) / min(vals))
        fit["max_over_min_across_nodes_by_degree"] = spread
        out[path] = fit
    return out


# ----------------------------------------------------------------------------- main
def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=_ints, default=None,
                        help="comma-separated node counts (default 10,100,1000; quick: 10,100)")
    parser.add_argument("--degrees", type=_ints, default=[4, 8],
                        help="random-regular degrees (default 4,8); the ring is always run")
    parser.add_argument("--params", type=int, default=None,
                        help="parameters per node (default: fmnist-cnn's P; quick: P/16)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="consensus rounds per case (default 3, 2 from 1000 nodes on; "
                        "quick: 2)")
    parser.add_argument("--memory-gib", type=float, default=8.0,
                        help="memory for one column block of all nodes (default 8 GiB)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads for both paths (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    add_standard_args(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    full_p = fmnist_params()
    nodes_list = args.nodes or ([10, 100] if args.quick else [10, 100, 1000])
    params = args.params or (full_p // 16 if args.quick else full_p)
    def rounds_for(nodes: int) -> int:
        return int(args.rounds or (2 if args.quick or nodes >= 1000 else 3))
    memory = int(args.memory_gib * 2**30)

    results: list[CaseResult] = []
    header = (f"{'graph':<15} {'d':>2} {'nodes':>5} {'blocks':>6} {'rounds/s':>9} "
              f"{'base r/s':>9} {'base':>5} {'ratio':>6} {'RSS/node MiB':>12} "
              f"{'B/param':>7} {'ns/term':>8} {'Σ resid':>8} {'|Δx|':>8}")
    if not args.json:
        print(f"P = {params} parameters per node ({params * 4 / MIB:.2f} MiB per vector; "
              f"fmnist-cnn: {full_p}), {rounds_for(10)} rounds per case below 1000 nodes, "
              f"{rounds_for(1000)} from 1000 on, {args.threads} torch thread(s), "
              f"load average {machine()['loadavg']}")
        print(header)
    for nodes in nodes_list:
        cases = [("ring", 2)] + [("random-regular", d) for d in args.degrees if d < nodes]
        for kind, degree in cases:
            r = run_case(kind, nodes, degree, params, rounds_for(nodes), memory, args.seed)
            results.append(r)
            if not args.json:
                print(f"{r.graph:<15} {r.degree:>2} {r.nodes:>5} {r.blocks:>6} "
                      f"{r.rounds_per_s:>9.3f} {r.baseline_rounds_per_s:>9.3f} {r.baseline:>5} "
                      f"{r.ratio:>6.3f} {r.rss_per_node_mb:>12.2f} "
                      f"{r.rss_bytes_per_param:>7.1f} {r.ns_per_term:>8.3f} "
                      f"{r.invariant_residual:>8.1e} {r.max_abs_diff_vs_baseline:>8.1e}",
                      flush=True)
    fit = growth_fit(results)
    worst = min(results, key=lambda r: r.ratio)
    if not args.json:
        for path in ("project", "baseline"):
            f = fit[path]
            if "beta_ns" in f:
                print(f"{path}: seconds per round = N·P·({f['alpha_ns']:.3f} + "
                      f"{f['beta_ns']:.3f}·(d+1)) ns  (r² = {f['r2']:.3f}); per degree, "
                      f"max/min of time ÷ (N·P) across N: "
                      + (", ".join(f"d={d}: {v:.2f}" for d, v in
                                   f["max_over_min_across_nodes_by_degree"].items())
                         or "n/a (one N)"))
        print(f"worst ratio: {worst.graph} d={worst.degree} N={worst.nodes}")
    table = [{"graph": r.graph, "degree": r.degree, "nodes": r.nodes,
              "rounds_per_s": round(r.rounds_per_s, 4),
              "baseline_rounds_per_s": round(r.baseline_rounds_per_s, 4),
              "rss_per_node_mb": round(r.rss_per_node_mb, 2)} for r in results]
    emit_result(
        "scale", worst.ratio, 0.5, True, as_json=args.json,
        params=params, threads=args.threads, table=table, growth=fit,
        cases=[{k: (round(v, 6) if isinstance(v, float) and k != "invariant_residual" else v)
                for k, v in asdict(r).items()} for r in results],
        max_invariant_residual=max(r.invariant_residual for r in results),
        torch_threads=torch.get_num_threads(),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
