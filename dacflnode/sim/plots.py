"""Figures: Average/Var of Acc per round (paper Figs. 4–7), per-node residual and round time
(``dacflnode report``), and the FODAC demo (Fig. 3).

Every function draws with the headless Agg backend and writes one file per path it is given; the
format follows each path's suffix (``.png``, ``.svg``, …), so one figure goes out as PNG and SVG.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

#: Nodes per run above which the per-node figure leaves out its legend (it would hide the lines).
LEGEND_MAX_NODES = 12

#: The paper's name of each algorithm, as legends and titles show it.
PAPER_NAMES = {"dacfl": "DACFL", "cdsgd": "CDSGD", "dpsgd": "D-PSGD", "fedavg": "FedAvg"}
#: One colour per algorithm in every figure, whatever the order of the runs.
COLOURS = {"dacfl": "#1f77b4", "cdsgd": "#ff7f0e", "dpsgd": "#2ca02c", "fedavg": "#d62728"}
#: The colour of a line whose algorithm is not one of :data:`PAPER_NAMES`.
OTHER_COLOUR = "#7f7f7f"
#: Line style and marker of the first, second, ... run of one algorithm in a figure; a run's
#: precision picks its own (fp32 the first, bf16 the second), so the two never hide each other.
STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"))
PRECISION_STYLE = {"fp32": 0, "bf16": 1}
#: At most this many markers per line: every round of a short run, a sample of a long one.
MARKERS_PER_LINE = 20
#: Var of Acc (in %²) goes on a log axis when its largest value is this many times its smallest.
LOG_SPREAD = 100.0
#: Var of Acc (in %²) below this counts as 0 (one global model; float rounding of a mean).
ZERO_VAR = 1e-9

PathArg = str | Path | Sequence[str | Path]
_ALGORITHM_WORD = re.compile(r"\b(" + "|".join(PAPER_NAMES) + r")\b", re.IGNORECASE)


def save_figure(fig: Figure, path: PathArg) -> None:
    """Write ``fig`` to every path of ``path`` (the format from each suffix) and close it."""
    paths = [path] if isinstance(path, str | Path) else list(path)
    fig.tight_layout()
    with plt.rc_context({"svg.fonttype": "none"}):  # SVG text stays text: searchable, editable
        for p in paths:
            fig.savefig(p, dpi=120)
    plt.close(fig)


def paper_label(text: str) -> str:
    """``text`` with every algorithm id written as the paper names it (``dacfl bf16`` ->
    ``DACFL bf16``)."""
    return _ALGORITHM_WORD.sub(lambda m: PAPER_NAMES[m.group(1).lower()], text)


def algorithm_of(label: str, curve: Mapping[str, Any] | None = None) -> str | None:
    """The algorithm of a line: the curve's ``algorithm``, else the first algorithm id in its
    label."""
    if curve is not None and str(curve.get("algorithm", "")).lower() in PAPER_NAMES:
        return str(curve["algorithm"]).lower()
    match = _ALGORITHM_WORD.search(label)
    return match.group(1).lower() if match else None


def colour_of(algorithm: str | None) -> str:
    return COLOURS.get(algorithm or "", OTHER_COLOUR)


def _precision_of(label: str, curve: Mapping[str, Any]) -> str | None:
    given = curve.get("precision")
    if isinstance(given, str) and given in PRECISION_STYLE:
        return given
    words = set(re.split(r"[^a-z0-9]+", label.lower()))
    found = [p for p in PRECISION_STYLE if p in words]
    return found[0] if len(found) == 1 else None


def _line_styles(curves: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per label: the colour of its algorithm, and a line style and marker of its own among the
    lines of that algorithm (by precision where the curves say, else by order)."""
    styles: dict[str, dict[str, Any]] = {}
    used: dict[str | None, set[int]] = {}
    for label, curve in curves.items():
        alg = algorithm_of(label, curve)
        taken = used.setdefault(alg, set())
        precision = _precision_of(label, curve)
        index = PRECISION_STYLE[precision] if precision is not None else 0
        while index in taken and len(taken) < len(STYLES):
            index += 1
        taken.add(index)
        linestyle, marker = STYLES[index % len(STYLES)]
        rounds = len(curve.get("rounds", ()))
        styles[label] = {"color": colour_of(alg), "linestyle": linestyle, "marker": marker,
                         "markersize": 4, "markevery": max(1, math.ceil(rounds / MARKERS_PER_LINE)),
                         "linewidth": 1.5, "label": paper_label(label)}
    return styles


def _decimal(value: float, _pos: int = 0) -> str:
    """A log axis tick as a plain number: ``0.01``, ``1``, ``1000`` (not ``10⁰``)."""
    return f"{value:g}"


def use_log_axis(ax: Axes, values: Sequence[float]) -> None:
    """A log y axis for ``values`` whose ticks are written as plain numbers (``0.01``, ``1``,
    ``1000``), without minor labels: decades, and 2 and 5 times them where ``values`` span less
    than three decades (so a narrow range still has labelled ticks)."""
    positive = [v for v in values if v > 0]
    narrow = bool(positive) and max(positive) < 1000 * min(positive)
    ax.set_yscale("log", nonpositive="mask")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if narrow else (1.0,)))
    ax.yaxis.set_major_formatter(FuncFormatter(_decimal))
    ax.yaxis.set_minor_formatter(NullFormatter())


def plot_accuracy(
    curves: Mapping[str, Mapping[str, Any]], path: PathArg, title: str = ""
) -> None:
    """Write :func:`accuracy_figure` to ``path``."""
    save_figure(accuracy_figure(curves, title), path)


def accuracy_figure(curves: Mapping[str, Mapping[str, Any]], title: str = "") -> Figure:
    """The Average of Acc and Var of Acc per round.

    ``curves[label]`` is an algorithm summary with ``rounds``, ``avg_acc`` and ``var_acc``
    (what :func:`~dacflnode.records.metrics_log.summarize` returns) and optionally ``algorithm``
    and ``precision``; one line per label, labelled with the paper's algorithm names.

    Every algorithm has its colour (:data:`COLOURS`); several lines of one algorithm differ in
    line style and marker. A Var of Acc that is 0 in every round (D-PSGD and FedAvg evaluate one
    global model) is not drawn but named on the panel; Var of Acc goes on a log axis when its
    values span :data:`LOG_SPREAD` or more. ``title`` (the setting) heads the figure."""
    fig, (ax_avg, ax_var) = plt.subplots(1, 2, figsize=(11, 4.4 if title else 4))
    styles = _line_styles(curves)
    zero: list[str] = []
    drawn: list[tuple[list[float], list[float], dict[str, Any]]] = []
    for label, s in curves.items():
        ax_avg.plot(s["rounds"], [100 * a for a in s["avg_acc"]], **styles[label])
        var = [1e4 * v for v in s["var_acc"]]
        if var and all(abs(v) < ZERO_VAR for v in var):
            zero.append(styles[label]["label"])
        else:
            drawn.append((list(s["rounds"]), var, styles[label]))
    positive = [v for _, var, _ in drawn for v in var if v >= ZERO_VAR]
    log = bool(positive) and max(positive) >= LOG_SPREAD * min(positive)
    for rounds, var, style in drawn:
        ax_var.plot(rounds, [v if v >= ZERO_VAR or not log else math.nan for v in var], **style)
    if log:
        use_log_axis(ax_var, positive)
    if zero:
        ax_var.text(0.98, 0.02, f"0 in every round, not drawn: {', '.join(zero)}",
                    transform=ax_var.transAxes, ha="right", va="bottom", fontsize=8,
                    color="0.35")
    ax_avg.set(xlabel="round", ylabel="Average of Acc (%)", title="Average of Acc")
    ax_var.set(xlabel="round", ylabel="Var of Acc (%²)",
               title="Var of Acc" + (" (log scale)" if log else ""))
    if title:
        fig.suptitle(title)
    for ax in (ax_avg, ax_var):
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.get_lines():
            ax.legend(fontsize=8)
    return fig


def _finite(lines: Sequence[Mapping[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for line in lines:
        value = line.get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            xs.append(float(line["round"]))
            ys.append(float(value))
    return xs, ys


def _residual_scale(ax: Axes, values: list[float]) -> None:
    """Log scale for a residual that decays over orders of magnitude; symlog where some are 0."""
    positive = [v for v in values if v > 0]
    if not positive:
        return
    if len(positive) == len(values):
        use_log_axis(ax, positive)
    else:
        ax.set_yscale("symlog", linthresh=min(positive))


def node_shades(algorithm: str | None, count: int) -> list[tuple[float, float, float]]:
    """``count`` shades of the algorithm's colour, from the full colour towards white, for the
    nodes of one run."""
    r, g, b = to_rgb(colour_of(algorithm))
    fractions = [0.65 * k / (count - 1) for k in range(count)] if count > 1 else [0.0]
    return [(r + (1 - r) * f, g + (1 - g) * f, b + (1 - b) * f) for f in fractions]


def nodes_figure(runs: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]], title: str = "",
                 algorithms: Mapping[str, str] | None = None) -> Figure:
    """Each node of each run per round: the consensus residual ‖x_i − ω_i‖ and the round time
    (``seconds``). ``runs[label][node]`` is that node's ``metrics.jsonl`` lines; one panel of
    each per run, the nodes in shades of the run's algorithm's colour (``algorithms[label]``,
    else the lines' own).

    A panel with nothing to draw is left out: a run whose residual is 0 everywhere (an
    algorithm that tracks no average) is named in the figure's title instead. The residual
    panels come first, then the round times, two to a row."""
    Panel = tuple[str, str, str | None, Mapping[str, Sequence[Mapping[str, Any]]]]
    residual_panels: list[Panel] = []
    time_panels: list[Panel] = []
    untracked: list[str] = []
    for label, nodes in runs.items():
        alg = (algorithms or {}).get(label) or _lines_algorithm(nodes)
        shown = paper_label(label)
        residuals = [v for lines in nodes.values() for v in _finite(lines, "consensus_residual")[1]]
        if any(residuals):
            residual_panels.append((shown, "consensus_residual", alg, nodes))
        elif residuals:
            untracked.append(shown)
        if any(_finite(lines, "seconds")[1] for lines in nodes.values()):
            time_panels.append((shown, "seconds", alg, nodes))
    panels = residual_panels + time_panels
    columns = 2 if len(panels) > 1 else 1
    rows = max(1, math.ceil(len(panels) / columns))
    fig, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 3.2 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, (shown, key, alg, nodes) in zip(flat, panels, strict=False):
        values: list[float] = []
        for shade, (node, lines) in zip(node_shades(alg, len(nodes)), nodes.items(),
                                        strict=True):
            xs, ys = _finite(lines, key)
            ax.plot(xs, ys, label=node, linewidth=1, color=shade, marker="o", markersize=3,
                    markevery=max(1, math.ceil(len(xs) / MARKERS_PER_LINE)))
            values.extend(ys)
        if key == "consensus_residual":
            _residual_scale(ax, values)
            ax.set(xlabel="round", ylabel="‖x − ω‖", title=f"{shown}: consensus residual")
        else:
            ax.set(xlabel="round", ylabel="seconds", title=f"{shown}: round time")
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if 0 < len(nodes) <= LEGEND_MAX_NODES:
            ax.legend(fontsize=7, ncol=2)
    for ax in flat[len(panels):]:
        ax.remove()
    heading = [title] if title else []
    if untracked:
        heading.append(f"no consensus residual (0: no average tracked): {', '.join(untracked)}")
    if heading:
        fig.suptitle("\n".join(heading), fontsize=10)
    return fig


def _lines_algorithm(nodes: Mapping[str, Sequence[Mapping[str, Any]]]) -> str | None:
    for lines in nodes.values():
        for line in lines[:1]:
            alg = str(line.get("algorithm", "")).lower()
            if alg in PAPER_NAMES:
                return alg
    return None


def plot_consensus_demo(mae: Mapping[str, Sequence[float]], path: str | Path, title: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in mae.items():
        alg = "dacfl" if name == "fodac" else name  # FODAC is DACFL's tracking: its colour
        ax.plot(range(1, len(values) + 1), values, marker="o", markersize=3,
                label=PAPER_NAMES.get(name, name.upper()), color=colour_of(alg))
    ax.set(xlabel="t", ylabel="mean |estimate − average|", title=title)
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path)
