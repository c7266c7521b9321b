"""First-order dynamic average consensus (FODAC) and the paper's Fig. 3 experiment.

FODAC (paper, Algorithm 4): each node tracks the network average of time-varying reference
inputs ``r_i(t)`` with ``x(t+1) = W x(t) + r(t+1) − r(t)``, from ``x_i(first) = r_i(first)``.
Because ``W`` is doubly stochastic, ``Σ_i x_i(t) = Σ_i r_i(t)`` at every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dacflnode.algorithms import graphs
from dacflnode.algorithms.mixing import (
    dense_random_matrix,
    metropolis_matrix,
    sparse_random_matrix,
    uniform_matrix,
)
from dacflnode.algorithms.names import DEMO_INPUTS as DEMO_INPUTS
from dacflnode.algorithms.names import DEMO_MATRICES as DEMO_MATRICES


def fodac_step(w: np.ndarray, x: np.ndarray, r_next: np.ndarray, r_now: np.ndarray) -> np.ndarray:
    """One FODAC step for all nodes: ``W x + r(t+1) − r(t)`` (rows of ``x`` are nodes)."""
    tracked: np.ndarray = w @ x + (r_next - r_now)
    return tracked


def fig3_inputs(inputs: str, nodes: int = 10, steps: int = 20) -> np.ndarray:
    """The paper's reference inputs, shape ``[steps, nodes]`` for t = 1..steps, i = 1..nodes.

    Inputs I: ``r_i(t) = sin t + (1/t)^i + t + i`` (large spread between nodes);
    Inputs II: the same without ``+ i``.
    """
    if inputs not in DEMO_INPUTS:
        raise ValueError(f"inputs must be one of {DEMO_INPUTS}")
    t = np.arange(1, steps + 1, dtype=np.float64)[:, None]
    i = np.arange(1, nodes + 1, dtype=np.float64)[None, :]
    r = np.sin(t) + (1.0 / t) ** i + t
    return r + i if inputs == "I" else r


def demo_matrix(matrix: str, nodes: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if matrix == "sparse":
        return sparse_random_matrix(nodes, rng)
    if matrix == "dense":
        return dense_random_matrix(nodes, rng)
    if matrix == "uniform":
        return uniform_matrix(nodes)
    if matrix == "ring":
        return metropolis_matrix(nodes, graphs.ring(nodes))
    raise ValueError(f"matrix must be one of {DEMO_MATRICES}")


@dataclass(frozen=True)
class DemoResult:
    inputs: str
    matrix: str
    nodes: int
    steps: int
    seed: int
    mae: dict[str, list[float]]

    def to_json(self) -> dict[str, object]:
        return {
            "inputs": self.inputs,
            "matrix": self.matrix,
            "nodes": self.nodes,
            "steps": self.steps,
            "seed": self.seed,
            "mae": self.mae,
        }


def consensus_demo(
    inputs: str = "I", matrix: str = "sparse", seed: int = 0, nodes: int = 10, steps: int = 20
) -> DemoResult:
    """Track the mean of the Fig. 3 inputs with FODAC, CDSGD and D-PSGD estimators.

    ``mae[name][k]`` is the mean over nodes of ``|estimate_i(t) − mean_j r_j(t)|`` at
    ``t = k + 1``. Estimators: FODAC's state ``x_i(t)``; CDSGD's neighbourhood average
    ``Σ_j w_ij r_j(t)``; D-PSGD's network-wide average of the CDSGD estimate (a "god node").
    """
    r = fig3_inputs(inputs, nodes, steps)
    w = demo_matrix(matrix, nodes, seed)
    x = r[0].copy()
    mae: dict[str, list[float]] = {"fodac": [], "cdsgd": [], "dpsgd": []}
    for k in range(steps):
        if k > 0:
            x = fodac_step(w, x, r[k], r[k - 1])
        target = r[k].mean()
        cdsgd = w @ r[k]
        dpsgd = np.full(nodes, cdsgd.mean())
        mae["fodac"].append(float(np.mean(np.abs(x - target))))
        mae["cdsgd"].append(float(np.mean(np.abs(cdsgd - target))))
        mae["dpsgd"].append(float(np.mean(np.abs(dpsgd - target))))
    return DemoResult(inputs, matrix, nodes, steps, seed, mae)
