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
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

#: Nodes per run above which the per-node figure leaves out its legend (it would hide the lines).
LEGEND_MAX_NODES = 12

#: The paper's name of each algorithm, as legends and titles show it.
PAPER_NAMES = {"dacfl": "DACFL", "cdsgd": "CDSGD", "dpsgd": "D-PSGD", "fedavg": "FedAvg"}
#: The qualitative colormaps lines take their colours from: tab10, then tab20 past ten lines.
TAB10 = tuple(to_hex(c) for c in matplotlib.colormaps["tab10"](range(10)))
TAB20 = tuple(to_hex(c) for c in matplotlib.colormaps["tab20"](range(20)))
#: The colour of the first run of each algorithm in every figure, whatever the order of the
#: runs (tab10's first four); a further run of an algorithm takes a tab10 colour of its own.
COLOURS = {"dacfl": TAB10[0], "cdsgd": TAB10[1], "dpsgd": TAB10[2], "fedavg": TAB10[3]}
#: The colour of a line whose algorithm is not one of :data:`PAPER_NAMES`.
OTHER_COLOUR = TAB10[7]
#: The line style of each algorithm (several runs of one algorithm differ in colour and marker).
LINESTYLES = {"dacfl": "-", "cdsgd": "--", "dpsgd": "-.", "fedavg": ":"}
#: The marker of the first, second, ... line of a figure.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
#: At most this many markers per line: every round of a short run, a sample of a long one.
MARKERS_PER_LINE = 20
#: Var of Acc (in %²) goes on a log axis when its largest value is this many times its smallest.
LOG_SPREAD = 100.0
#: Var of Acc (in %²) below this counts as 0 (one global model; float rounding of a mean).
ZERO_VAR = 1e-9
#: The x axis of :func:`accuracy_figure`: the round, or seconds since the run started.
X_LABELS = {"round": "round", "time": "time (s)"}

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


def _line_styles(curves: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per label: a colour of its own (the first line of an algorithm its algorithm's colour,
    any further one a free tab10/tab20 colour), its algorithm's line style, and a marker of its
    own. Each line is drawn above the ones before it, thinner and with smaller markers, so that
    two lines with the same values both show: the lower one as a border around the upper."""
    algorithms = [algorithm_of(label, curve) for label, curve in curves.items()]
    reserved = {*COLOURS.values(), OTHER_COLOUR}  # an algorithm's colour is never another's
    free = [c for c in dict.fromkeys(TAB10 + TAB20) if c not in reserved]
    taken: set[str] = set()
    count = len(curves)
    styles: dict[str, dict[str, Any]] = {}
    for i, ((label, curve), alg) in enumerate(zip(curves.items(), algorithms, strict=True)):
        colour = colour_of(alg)
        if colour in taken:
            colour = free.pop(0) if free else TAB20[i % len(TAB20)]
        taken.add(colour)
        points = len(curve.get("time" if "time" in curve else "rounds", ()))
        depth = (count - 1 - i) / (count - 1) if count > 1 else 0.5
        styles[label] = {"color": colour, "linestyle": LINESTYLES.get(alg or "", "-"),
                         "marker": MARKERS[i % len(MARKERS)], "markersize": 4 + 3 * depth,
                         "markevery": max(1, math.ceil(points / MARKERS_PER_LINE)),
                         "linewidth": 1.2 + 1.8 * depth, "alpha": 0.9, "zorder": 2 + i,
                         "label": paper_label(label)}
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
    curves: Mapping[str, Mapping[str, Any]], path: PathArg, title: str = "", x: str = "round"
) -> None:
    """Write :func:`accuracy_figure` to ``path``."""
    save_figure(accuracy_figure(curves, title, x), path)


def accuracy_figure(curves: Mapping[str, Mapping[str, Any]], title: str = "",
                    x: str = "round") -> Figure:
    """The Average of Acc and Var of Acc per round, or over time.

    ``curves[label]`` is an algorithm summary with ``rounds``, ``avg_acc`` and ``var_acc``
    (what :func:`~dacflnode.records.metrics_log.summarize` returns) and optionally ``algorithm``;
    one line per label, labelled with the paper's algorithm names. With ``x="time"`` the x axis
    is ``curves[label]["time"]`` (seconds since the run started) and each line is a step
    function: the value holds until the next point.

    Every line has its colour, marker and thickness (:func:`_line_styles`); an algorithm has
    its line style. A Var of Acc that is 0 everywhere (D-PSGD and FedAvg evaluate one global
    model) is not drawn but named on the panel; Var of Acc goes on a log axis when its values
    span :data:`LOG_SPREAD` or more. ``title`` (the setting) heads the figure."""
    if x not in X_LABELS:
        raise ValueError(f"x is one of {', '.join(X_LABELS)}, got {x!r}")
    key = "rounds" if x == "round" else "time"
    steps = {"drawstyle": "steps-post"} if x == "time" else {}
    fig, (ax_avg, ax_var) = plt.subplots(1, 2, figsize=(11, 4.4 if title else 4))
    styles = _line_styles(curves)
    zero: list[str] = []
    drawn: list[tuple[list[float], list[float], dict[str, Any]]] = []
    for label, s in curves.items():
        ax_avg.plot(s[key], [100 * a for a in s["avg_acc"]], **styles[label], **steps)
        var = [1e4 * v for v in s["var_acc"]]
        if var and all(abs(v) < ZERO_VAR for v in var):
            zero.append(styles[label]["label"])
        else:
            drawn.append((list(s[key]), var, {**styles[label], **steps}))
    positive = [v for _, var, _ in drawn for v in var if v >= ZERO_VAR]
    log = bool(positive) and max(positive) >= LOG_SPREAD * min(positive)
    for xs, var, style in drawn:
        ax_var.plot(xs, [v if v >= ZERO_VAR or not log else math.nan for v in var], **style)
    if log:
        use_log_axis(ax_var, positive)
    if zero:
        where = "in every round" if x == "round" else "throughout"
        ax_var.text(0.98, 0.02, f"0 {where}, not drawn: {', '.join(zero)}",
                    transform=ax_var.transAxes, ha="right", va="bottom", fontsize=8,
                    color="0.35")
    ax_avg.set(xlabel=X_LABELS[x], ylabel="Average of Acc (%)", title="Average of Acc")
    ax_var.set(xlabel=X_LABELS[x], ylabel="Var of Acc (%²)",
               title="Var of Acc" + (" (log scale)" if log else ""))
    if title:
        fig.suptitle(title)
    for ax in (ax_avg, ax_var):
        ax.grid(alpha=0.3)
        if x == "round":
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
    """Log scale for a residual that decays over a decade or more (symlog where some are 0),
    its ticks labelled as plain numbers; a linear axis for a narrower range, where a log axis
    would label one or two ticks at most."""
    positive = [v for v in values if v > 0]
    if not positive or max(positive) < 10 * min(positive):
        return
    if len(positive) == len(values):
        use_log_axis(ax, positive)
    else:
        ax.set_yscale("symlog", linthresh=min(positive))


def node_colours(count: int) -> list[dict[str, Any]]:
    """A colour (tab10, tab20 past ten nodes) and line style of its own for each of ``count``
    nodes; past twenty nodes the colours come round again with another line style."""
    palette = TAB10 if count <= len(TAB10) else TAB20
    dashes = ("-", "--", ":", "-.")
    return [{"color": palette[k % len(palette)],
             "linestyle": dashes[(k // len(palette)) % len(dashes)]} for k in range(count)]


def nodes_figure(runs: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]],
                 title: str = "") -> Figure:
    """Each node of each run per round: the consensus residual ‖x_i − ω_i‖ and the round time
    (``seconds``). ``runs[label][node]`` is that node's ``metrics.jsonl`` lines; one panel of
    each per run, each node in a colour of its own (:func:`node_colours`; the n-th node of
    every panel in the same one).

    A panel with nothing to draw is left out: a run whose residual is 0 everywhere (an
    algorithm that tracks no average) is named in the figure's title instead. The residual
    panels come first, then the round times, two to a row."""
    Panel = tuple[str, str, Mapping[str, Sequence[Mapping[str, Any]]]]
    residual_panels: list[Panel] = []
    time_panels: list[Panel] = []
    untracked: list[str] = []
    for label, nodes in runs.items():
        shown = paper_label(label)
        residuals = [v for lines in nodes.values() for v in _finite(lines, "consensus_residual")[1]]
        if any(residuals):
            residual_panels.append((shown, "consensus_residual", nodes))
        elif residuals:
            untracked.append(shown)
        if any(_finite(lines, "seconds")[1] for lines in nodes.values()):
            time_panels.append((shown, "seconds", nodes))
    panels = residual_panels + time_panels
    columns = 2 if len(panels) > 1 else 1
    rows = max(1, math.ceil(len(panels) / columns))
    fig, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 3.2 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, (shown, key, nodes) in zip(flat, panels, strict=False):
        values: list[float] = []
        styles = node_colours(len(nodes))
        for k, (style, (node, lines)) in enumerate(zip(styles, nodes.items(), strict=True)):
            xs, ys = _finite(lines, key)
            depth = (len(styles) - 1 - k) / (len(styles) - 1) if len(styles) > 1 else 0.0
            ax.plot(xs, ys, label=node, linewidth=1 + depth, marker="o", markersize=3 + depth,
                    markevery=max(1, math.ceil(len(xs) / MARKERS_PER_LINE)), zorder=2 + k,
                    **style)  # each node above, and thinner than, the ones before: all show
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
