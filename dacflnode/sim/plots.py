"""Figures: Average/Var of Acc per round (paper Figs. 4–7), per-node residual and round time
(``dacflnode report``), and the FODAC demo (Fig. 3).

Every function draws with the headless Agg backend and writes one file per path it is given; the
format follows each path's suffix (``.png``, ``.svg``, …), so one figure goes out as PNG and SVG.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

#: Nodes per run above which the per-node figure leaves out its legend (it would hide the lines).
LEGEND_MAX_NODES = 12

PathArg = str | Path | Sequence[str | Path]


def _save(fig: Figure, path: PathArg) -> None:
    paths = [path] if isinstance(path, str | Path) else list(path)
    fig.tight_layout()
    with plt.rc_context({"svg.fonttype": "none"}):  # SVG text stays text: searchable, editable
        for p in paths:
            fig.savefig(p, dpi=120)
    plt.close(fig)


def plot_accuracy(
    curves: Mapping[str, Mapping[str, Any]], path: PathArg, title: str = ""
) -> None:
    """``curves[label]`` is an algorithm summary with ``rounds``, ``avg_acc`` and ``var_acc``
    (what :func:`~dacflnode.node.metrics_log.summarize` returns); one line per label."""
    fig, (ax_avg, ax_var) = plt.subplots(1, 2, figsize=(11, 4))
    for label, s in curves.items():
        ax_avg.plot(s["rounds"], [100 * a for a in s["avg_acc"]], label=label)
        ax_var.plot(s["rounds"], [1e4 * v for v in s["var_acc"]], label=label)
    ax_avg.set(xlabel="round", ylabel="Average of Acc (%)", title=title or "Average of Acc")
    ax_var.set(xlabel="round", ylabel="Var of Acc (%²)", title="Var of Acc")
    for ax in (ax_avg, ax_var):
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if curves:
            ax.legend(fontsize=8)
    _save(fig, path)


def _finite(lines: Sequence[Mapping[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for line in lines:
        value = line.get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            xs.append(float(line["round"]))
            ys.append(float(value))
    return xs, ys


def _residual_scale(ax: Axes, values: list[float]) -> None:
    """Log scale for a residual that decays over orders of magnitude; symlog where some are 0
    (an algorithm without tracking writes 0)."""
    positive = [v for v in values if v > 0]
    if not positive:
        return
    if len(positive) == len(values):
        ax.set_yscale("log")
    else:
        ax.set_yscale("symlog", linthresh=min(positive))


def plot_nodes(runs: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]], path: PathArg
               ) -> None:
    """``runs[label][node]`` is that node's ``metrics.jsonl`` lines; one row per run: the
    consensus residual ‖x_i − ω_i‖ and the round time (``seconds``) of each node per round."""
    rows = max(1, len(runs))
    fig, axes = plt.subplots(rows, 2, figsize=(11, 3.2 * rows), squeeze=False)
    for (label, nodes), (ax_res, ax_sec) in zip(runs.items(), axes, strict=False):
        residuals: list[float] = []
        for node, lines in nodes.items():
            xs, ys = _finite(lines, "consensus_residual")
            ax_res.plot(xs, ys, label=node, linewidth=1)
            residuals.extend(ys)
            xs, ys = _finite(lines, "seconds")
            ax_sec.plot(xs, ys, label=node, linewidth=1)
        _residual_scale(ax_res, residuals)
        if residuals and not any(residuals):
            ax_res.text(0.5, 0.5, "0 for every node and round:\nthis algorithm tracks no average",
                        transform=ax_res.transAxes, ha="center", va="center", fontsize=9)
        ax_res.set(xlabel="round", ylabel="‖x − ω‖", title=f"{label}: consensus residual")
        ax_sec.set(xlabel="round", ylabel="seconds", title=f"{label}: round time")
        for ax in (ax_res, ax_sec):
            ax.grid(alpha=0.3)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if 0 < len(nodes) <= LEGEND_MAX_NODES:
                ax.legend(fontsize=7, ncol=2)
    _save(fig, path)


def plot_consensus_demo(mae: Mapping[str, Sequence[float]], path: str | Path, title: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in mae.items():
        ax.plot(range(1, len(values) + 1), values, marker="o", markersize=3, label=name.upper())
    ax.set(xlabel="t", ylabel="mean |estimate − average|", title=title)
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.grid(alpha=0.3)
    ax.legend()
    _save(fig, path)
