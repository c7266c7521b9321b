"""The report's figures as a reader of the paper sees them, checked on the figures' artists
(legend texts, line colours and styles, titles, axis scales and tick labels), not on pixels."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from dacflnode.records.metrics_log import METRICS_FILE, MetricsLine, append_line
from dacflnode.sim.plots import COLOURS, MARKERS_PER_LINE, accuracy_figure, nodes_figure
from dacflnode.sim.report import figures, find_runs

CONFIG = {"dataset": "synthetic", "nodes": 3, "topology": "ring", "time_varying": 5,
          "partition": "iid", "precision": "fp32"}


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def metrics_line(node: str, r: int, algorithm: str, residual: float) -> MetricsLine:
    base: dict[str, Any] = {
        "round": r, "node": node, "algorithm": algorithm, "lr": 0.05, "train_loss": 1.0,
        "samples": 100, "accuracy": 0.1 * r + 0.01 * int(node[-1]), "test_loss": 1.0,
        "consensus_residual": residual, "neighbours_used": [], "neighbours_missing": [],
        "alone_rounds": 0, "refused_states": 0, "bytes_sent": 0, "bytes_received": 0,
        "exchange_s": 0.01, "train_s": 0.1,
        "seconds": 0.1 * r, "data_size": 30, "class_counts": {"a": 30},
        "time": 1_800_000_000.0 + 0.1 * r}
    return MetricsLine(**base)


def write_simulate_run(out: Path, algorithms: tuple[str, ...], rounds: int = 4,
                       **config: Any) -> Path:
    """A `simulate` output folder: DIR/<algorithm>/<node>/metrics.jsonl and DIR/summary.json."""
    for alg in algorithms:
        for i in range(3):
            folder = out / alg / f"node-{i}"
            folder.mkdir(parents=True)
            for r in range(1, rounds + 1):
                residual = 1.0 / r if alg == "dacfl" else 0.0
                append_line(folder / METRICS_FILE, metrics_line(f"node-{i}", r, alg, residual))
    (out / "summary.json").write_text(json.dumps({"config": {**CONFIG, **config}}))
    return out


def lines_by_label(ax: Axes) -> dict[str, Line2D]:
    return {str(line.get_label()): line for line in ax.get_lines()}


def legend_texts(ax: Axes) -> list[str]:
    legend = ax.get_legend()
    return [] if legend is None else [t.get_text() for t in legend.get_texts()]


def colour(line: Line2D) -> str:
    return to_hex(line.get_color())


def curve(alg: str, var: list[float], **extra: Any) -> dict[str, Any]:
    rounds = list(range(1, len(var) + 1))
    return {"rounds": rounds, "avg_acc": [0.1 * r for r in rounds], "var_acc": var,
            "algorithm": alg, **extra}


def test_a_two_algorithm_report_names_the_papers_algorithms_in_one_colour_each_everywhere(
        tmp_path):
    runs = find_runs([write_simulate_run(tmp_path / "run", ("dacfl", "cdsgd"))])
    drawn = figures(runs)
    ax_avg, ax_var = drawn["accuracy"].axes
    for ax in (ax_avg, ax_var):
        assert legend_texts(ax) == ["DACFL", "CDSGD"]  # not run/dacfl; the paper's order
        assert {label: colour(line) for label, line in lines_by_label(ax).items()} == {
            "DACFL": COLOURS["dacfl"], "CDSGD": COLOURS["cdsgd"]}
    assert lines_by_label(ax_avg)["DACFL"].get_linestyle() != (
        lines_by_label(ax_avg)["CDSGD"].get_linestyle())  # and a line style each


def test_the_colour_of_an_algorithm_does_not_depend_on_the_order_of_the_runs():
    first = accuracy_figure({"fedavg": curve("fedavg", [0.0] * 3),
                             "dacfl": curve("dacfl", [1e-4] * 3)})
    second = accuracy_figure({"dacfl": curve("dacfl", [1e-4] * 3),
                              "dpsgd": curve("dpsgd", [1e-4] * 3),
                              "fedavg": curve("fedavg", [0.0] * 3)})
    for fig in (first, second):
        lines = lines_by_label(fig.axes[0])
        assert colour(lines["DACFL"]) == COLOURS["dacfl"]
        assert colour(lines["FedAvg"]) == COLOURS["fedavg"]
    assert len(set(COLOURS.values())) == 4


def test_the_title_names_data_nodes_topology_and_split(tmp_path):
    runs = find_runs([write_simulate_run(tmp_path / "run", ("dacfl",))])
    drawn = figures(runs)
    title = "synthetic · 3 nodes · ring, rebuilt every 5 rounds · i.i.d."
    for fig in drawn.values():
        assert fig.get_suptitle().splitlines()[0] == title


def test_runs_differing_only_in_precision_share_the_title_and_say_their_precision(tmp_path):
    fp32 = write_simulate_run(tmp_path / "fp32", ("dacfl",))
    bf16 = write_simulate_run(tmp_path / "bf16", ("dacfl",), precision="bf16")
    drawn = figures(find_runs([fp32, bf16]))
    lines = lines_by_label(drawn["accuracy"].axes[0])
    assert sorted(lines) == ["DACFL precision=bf16", "DACFL precision=fp32"]
    assert colour(lines["DACFL precision=fp32"]) != colour(lines["DACFL precision=bf16"])
    assert lines["DACFL precision=fp32"].get_marker() != lines["DACFL precision=bf16"].get_marker()
    assert drawn["accuracy"].get_suptitle() == "synthetic · 3 nodes · ring, rebuilt every 5 " \
        "rounds · i.i.d."


def test_runs_of_one_algorithm_with_identical_values_each_have_a_colour_and_both_show(tmp_path):
    plain = write_simulate_run(tmp_path / "plain", ("dacfl",), compression="none")
    int8 = write_simulate_run(tmp_path / "comp-int8", ("dacfl",), compression="int8")
    drawn = figures(find_runs([plain, int8]))
    for ax in drawn["accuracy"].axes:
        lines = lines_by_label(ax)
        assert sorted(lines) == ["DACFL compression=int8", "DACFL compression=none"]
        first, second = ax.get_lines()  # the same values: the second is drawn over the first
        assert np.array_equal(first.get_ydata(), second.get_ydata())
        assert colour(first) == COLOURS["dacfl"]
        assert colour(second) not in COLOURS.values()  # not taken for another algorithm
        assert first.get_marker() != second.get_marker()
        assert second.get_zorder() > first.get_zorder()
        assert second.get_linewidth() < first.get_linewidth()  # the lower one shows as a rim
        assert second.get_markersize() < first.get_markersize()
        assert first.get_markevery() == second.get_markevery() == 1  # a marker per round


def test_every_run_has_a_colour_of_its_own_from_a_qualitative_colormap():
    fig = accuracy_figure({f"dacfl {k}": curve("dacfl", [1e-4] * 3) for k in range(12)})
    colours = [colour(line) for line in fig.axes[0].get_lines()]
    tab = {to_hex(c) for name in ("tab10", "tab20") for c in plt.get_cmap(name)(range(20))}
    assert len(set(colours)) == 12 and set(colours) <= tab


def test_global_model_algorithms_draw_no_var_of_acc_line_and_are_named_instead():
    fig = accuracy_figure({"dacfl": curve("dacfl", [1e-4, 2e-4]),
                           "dpsgd": curve("dpsgd", [0.0, 0.0]),
                           "fedavg": curve("fedavg", [0.0, 1e-40])})
    ax_avg, ax_var = fig.axes
    assert sorted(lines_by_label(ax_avg)) == ["D-PSGD", "DACFL", "FedAvg"]
    assert sorted(lines_by_label(ax_var)) == ["DACFL"]
    notes = [t.get_text() for t in ax_var.texts]
    assert notes == ["0 in every round, not drawn: D-PSGD, FedAvg"]


@pytest.mark.slow
def test_var_of_acc_spanning_orders_of_magnitude_is_on_a_log_axis_with_plain_ticks():
    fig = accuracy_figure({"dacfl": curve("dacfl", [1e-5, 2e-5, 1e-5]),  # 0.1-0.2 %²
                           "cdsgd": curve("cdsgd", [0.14, 0.1, 0.12])})  # 1000-1400 %²
    ax_var = fig.axes[1]
    assert ax_var.get_yscale() == "log"
    fig.canvas.draw()
    labels = [t.get_text() for t in ax_var.get_yticklabels() if t.get_text()]
    assert {"0.1", "1", "10", "100", "1000"} <= set(labels)
    assert not any("$" in text or "×" in text or "^" in text for text in labels)
    close = accuracy_figure({"dacfl": curve("dacfl", [1e-4, 3e-4]),
                             "cdsgd": curve("cdsgd", [2e-4, 5e-4])})
    assert close.axes[1].get_yscale() == "linear"


@pytest.mark.slow
def test_short_runs_have_a_marker_per_round_and_long_ones_a_sample():
    short = lines_by_label(accuracy_figure({"dacfl": curve("dacfl", [1e-4] * 5)}).axes[0])
    assert short["DACFL"].get_marker() not in (None, "None", "")
    assert short["DACFL"].get_markevery() == 1
    long = lines_by_label(accuracy_figure({"dacfl": curve("dacfl", [1e-4] * 200)}).axes[0])
    assert long["DACFL"].get_markevery() == 200 // MARKERS_PER_LINE


def test_nodes_figure_of_four_algorithms_has_no_empty_panel(tmp_path):
    runs = find_runs([write_simulate_run(tmp_path / "run",
                                         ("dacfl", "cdsgd", "dpsgd", "fedavg"))])
    fig: Figure = figures(runs)["nodes"]
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["DACFL: consensus residual", "DACFL: round time", "CDSGD: round time",
                      "D-PSGD: round time", "FedAvg: round time"]  # the paper's order
    for ax in fig.axes:
        assert ax.get_lines() and all(np.asarray(line.get_xdata()).tolist() == [1, 2, 3, 4]
                                      for line in ax.get_lines())
    assert "no consensus residual (0: no average tracked): CDSGD, D-PSGD, FedAvg" in (
        fig.get_suptitle())


def test_nodes_figure_of_runs_without_data_draws_what_there_is():
    lines = [asdict(metrics_line("node-0", r, "dacfl", float("nan"))) for r in (1, 2)]
    fig = nodes_figure({"dacfl": {"node-0": lines}})
    assert [ax.get_title() for ax in fig.axes] == ["DACFL: round time"]


def node_lines(residuals: dict[str, list[float]]) -> dict[str, list[dict[str, Any]]]:
    return {node: [asdict(metrics_line(node, r, "dacfl", v)) for r, v in enumerate(values, 1)]
            for node, values in residuals.items()}


def tick_labels(ax: Axes) -> list[str]:
    ax.figure.canvas.draw()
    return [t.get_text() for t in ax.get_yticklabels() if t.get_text()]


def test_each_node_has_a_distinct_colour_the_same_in_every_panel(tmp_path):
    runs = find_runs([write_simulate_run(tmp_path / "run", ("dacfl", "cdsgd"))])
    fig = figures(runs)["nodes"]
    per_panel = [[colour(line) for line in ax.get_lines()] for ax in fig.axes]
    tab10 = [to_hex(c) for c in plt.get_cmap("tab10")(range(3))]
    assert per_panel == [tab10] * len(fig.axes)
    many = nodes_figure({"dacfl": node_lines({f"node-{i}": [1.0, 0.5] for i in range(15)})})
    assert len({colour(line) for line in many.axes[0].get_lines()}) == 15


@pytest.mark.parametrize("values", [[2.5, 1.9, 1.4, 1.0], [0.9, 0.6, 0.4, 0.25]])
def test_a_residual_within_a_decade_is_on_a_linear_axis_with_several_labels(values):
    fig = nodes_figure({"dacfl": node_lines({"node-0": values, "node-1": values[::-1]})})
    ax = fig.axes[0]
    assert ax.get_title() == "DACFL: consensus residual"
    assert ax.get_yscale() == "linear"
    assert len(tick_labels(ax)) >= 3


def test_a_residual_over_decades_is_on_a_log_axis_with_plain_labelled_ticks():
    fig = nodes_figure({"dacfl": node_lines({"node-0": [1.0, 0.3, 0.1, 0.03],
                                             "node-1": [0.8, 0.2, 0.05, 0.01]})})
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    labels = tick_labels(ax)
    assert {"0.01", "0.1", "1"} <= set(labels) and {"0.02", "0.05"} & set(labels)
    assert not any("$" in text or "^" in text for text in labels)
