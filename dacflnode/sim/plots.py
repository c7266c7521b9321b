"""Figures: Average/Var of Acc per round (paper Figs. 4–7) and the FODAC demo (Fig. 3)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def plot_accuracy(
    curves: Mapping[str, Mapping[str, Any]], path: str | Path, title: str = ""
) -> None:
    """``curves[label]`` is an algorithm summary with ``rounds``, ``avg_acc`` and ``var_acc``."""
    fig, (ax_avg, ax_var) = plt.subplots(1, 2, figsize=(11, 4))
    for label, s in curves.items():
        ax_avg.plot(s["rounds"], [100 * a for a in s["avg_acc"]], label=label)
        ax_var.plot(s["rounds"], [1e4 * v for v in s["var_acc"]], label=label)
    ax_avg.set(xlabel="round", ylabel="Average of Acc (%)", title=title or "Average of Acc")
    ax_var.set(xlabel="round", ylabel="Var of Acc (%²)", title="Var of Acc")
    for ax in (ax_avg, ax_var):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_consensus_demo(mae: Mapping[str, Sequence[float]], path: str | Path, title: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in mae.items():
        ax.plot(range(1, len(values) + 1), values, marker="o", markersize=3, label=name.upper())
    ax.set(xlabel="t", ylabel="mean |estimate − average|", title=title)
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
