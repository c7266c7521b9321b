"""``dacflnode report``: the runs found under some folders, summarised and drawn.

A *run* is one algorithm on one set of nodes: the ``metrics.jsonl`` files of its nodes. They are
found anywhere below the folders given, so the same code reads

* ``launch`` and ``simulate`` output: ``DIR/<node-id>/metrics.jsonl``, and
  ``DIR/<algorithm>/<node-id>/metrics.jsonl`` when several algorithms ran;
* state directories copied off devices into one folder: ``DIR/<anything>/metrics.jsonl``.

The files below one folder are grouped by the ``algorithm`` their lines name. Where a node id
then occurs twice in a group (a folder of several runs of the same algorithm, such as the
reproduction script's output) the group is split by the folder that holds the node
directories. A run is labelled by its folder's name, followed by that split (the algorithm's
folder, or the algorithm) when the folder holds several runs.

Every number comes from :func:`~dacflnode.records.metrics_log.summarize`, the function
``simulate`` and ``launch`` write ``summary.json`` with, so a report and a summary agree: a round
counts when every node of the run has written it. The mean round time is the mean of the
``seconds`` of those lines.

The figures tell runs apart by the settings that differ between them (:func:`run_settings`,
:func:`figure_labels`). Where one run is asynchronous (``schedule: async``) the accuracy is
drawn against the seconds since each run started (:func:`accuracy_over_time`), which
:func:`time_to_accuracy` reads too.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dacflnode.filemodes import LOG_MODE, make_dir, prepare_file
from dacflnode.records.metrics_log import METRICS_FILE, read_metrics, summarize

if TYPE_CHECKING:  # matplotlib loads only when a figure is drawn
    from matplotlib.figure import Figure

#: The file ``simulate`` and ``launch`` write the run's configuration into.
SUMMARY_FILE = "summary.json"
#: The figures :func:`write_figures` draws, each written as PNG and SVG.
FIGURES = ("accuracy", "nodes")
FORMATS = ("png", "svg")


class ReportError(ValueError):
    """The folders hold nothing to report, or runs that cannot be told apart."""


@dataclass(frozen=True)
class Run:
    """The nodes of one run, in node order, with every line each has written."""

    label: str
    source: Path  # the folder it was found under, as given
    algorithm: str
    node_dirs: tuple[Path, ...]
    lines: dict[str, list[dict[str, Any]]]  # node id -> lines

    def summary(self) -> dict[str, Any]:
        """What :func:`summarize` makes of the run's node directories."""
        return summarize(self.node_dirs, self.algorithm, 0.0, engine="report")

    def config(self) -> dict[str, Any]:
        """The run configuration ``simulate`` or ``launch`` wrote into ``summary.json`` beside
        (or above) the node directories, up to the folder given; ``{}`` where there is none
        (state directories copied off devices)."""
        if not self.node_dirs:
            return {}
        top = self.source.resolve()
        folder = self.node_dirs[0].resolve().parent
        while True:
            data = _read_json(folder / SUMMARY_FILE)
            if isinstance(data, dict) and isinstance(data.get("config"), dict):
                return dict(data["config"])
            if folder == top or folder.parent == folder or top not in folder.parents:
                return {}
            folder = folder.parent

    def row(self) -> dict[str, Any]:
        """The run's line of the report (``--json`` prints these, the table shows them)."""
        s = self.summary()
        rounds = len(s["train_loss"])
        seconds = [line["seconds"] for lines in self.lines.values() for line in lines[:rounds]
                   if isinstance(line.get("seconds"), int | float)]
        mean_s = sum(seconds) / len(seconds) if seconds else None
        return {
            "label": self.label,
            "source": str(self.source),
            "algorithm": self.algorithm,
            "nodes": len(self.node_dirs),
            "node_ids": list(self.lines),
            "rounds": rounds,
            "final_round": s["final"]["round"],
            "avg_acc": s["final"]["avg_acc"],
            "var_acc": s["final"]["var_acc"],
            "train_loss": s["final"]["train_loss"],
            "consensus_residual": _finite_or_none(s["final"]["consensus_residual"]),
            "mean_round_s": None if mean_s is None else round(mean_s, 4),
            "bytes_sent_per_round": s["final"].get("bytes_sent_per_round"),
            "curve": {"round": s["rounds"], "avg_acc": s["avg_acc"], "var_acc": s["var_acc"],
                      "bytes_sent": s.get("bytes_sent", [])},
            "per_node": self.per_node(),
        }

    def per_node(self) -> list[dict[str, Any]]:
        """Each node's data (size, samples per class, from its latest line; ``None`` in files
        written before the lines carried them) and its latest accuracy."""
        out = []
        for node, lines in self.lines.items():
            last = lines[-1] if lines else {}
            accs = [line["accuracy"] for line in lines if line.get("accuracy") is not None]
            out.append({"node": node, "data_size": last.get("data_size"),
                        "class_counts": last.get("class_counts"),
                        "accuracy": accs[-1] if accs else None})
        return out


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _finite_or_none(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _natural(text: str) -> list[Any]:
    """Sort key that puts node-2 before node-10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _metrics_files(source: Path) -> list[Path]:
    if source.is_file():
        if source.name != METRICS_FILE:
            raise ReportError(f"{source} is a file, not a run folder: give the folder a "
                              f"`launch` or `simulate` wrote (--out), or a node's state directory")
        return [source]
    if not source.is_dir():
        raise ReportError(f"{source} does not exist: give the --out folder of a `launch` or "
                          f"`simulate` run, or a folder of state directories")
    files = sorted(p for p in source.rglob(METRICS_FILE) if p.is_file())
    if not files:
        raise ReportError(f"no {METRICS_FILE} found under {source}: give the --out folder of a "
                          f"`launch` or `simulate` run, or a folder holding the state "
                          f"directories (node.state_dir) copied off the devices")
    return files


def _split(source: Path, read: dict[Path, list[dict[str, Any]]]
           ) -> list[tuple[str, list[Path], str]]:
    """Group the files of one folder into runs: (algorithm, files, name within the folder)."""
    files = list(read)
    algorithm = {f: str(lines[0].get("algorithm")) for f, lines in read.items() if lines}
    by_alg: dict[str, list[Path]] = defaultdict(list)
    for f in files:
        if f in algorithm:
            by_alg[algorithm[f]].append(f)
    for f in files:  # a node with no line yet joins the run its siblings belong to
        if f in algorithm:
            continue
        siblings = {algorithm[g] for g in algorithm if g.parent.parent == f.parent.parent}
        known = siblings or set(by_alg)
        by_alg[next(iter(known)) if len(known) == 1 else "unknown"].append(f)
    groups: list[tuple[str, list[Path], str]] = []
    for alg, members in sorted(by_alg.items()):
        ids = Counter(_node_id(f, read[f]) for f in members)
        if max(ids.values()) == 1:
            groups.append((alg, members, _where(source, members) or alg))
            continue
        by_folder: dict[Path, list[Path]] = defaultdict(list)
        for f in members:
            by_folder[f.parent.parent].append(f)
        for folder, part in sorted(by_folder.items()):
            twice = [n for n, k in Counter(_node_id(f, read[f]) for f in part).items() if k > 1]
            if twice:
                shown = ", ".join(str(f) for f in part if _node_id(f, read[f]) == twice[0])
                raise ReportError(f"{folder} holds several runs of {alg} ({twice[0]} in "
                                  f"{shown}): give each run's folder on its own")
            groups.append((alg, part, _where(source, part) or alg))
    return groups


def _node_id(path: Path, lines: list[dict[str, Any]]) -> str:
    return str(lines[0].get("node")) if lines else path.parent.name


def _where(source: Path, files: list[Path]) -> str:
    """The folder holding the run's node directories, relative to ``source`` ('' for itself)."""
    parents = {f.parent.parent for f in files}
    if len(parents) != 1 or not source.is_dir():
        return ""
    rel = next(iter(parents)).relative_to(source)
    return "" if str(rel) == "." else rel.as_posix()


def find_runs(sources: Sequence[str | Path]) -> list[Run]:
    """Every run below ``sources`` (see the module docstring), in the order given."""
    if not sources:
        raise ReportError("give at least one run folder")
    found: list[tuple[Path, str, list[Path], str, bool]] = []
    read: dict[Path, list[dict[str, Any]]] = {}
    seen: set[Path] = set()
    for given in sources:
        source = Path(given)
        if source.resolve() in seen:
            continue
        seen.add(source.resolve())
        here = {f: read_metrics(f) for f in _metrics_files(source)}
        read.update(here)
        groups = _split(source, here)
        for alg, files, name in groups:
            found.append((source, alg, files, name, len(groups) > 1))
    bases = Counter(_base(source) for source in {s for s, *_ in found})
    labels: Counter[str] = Counter()
    runs = []
    for source, alg, files, name, several in found:
        base = _base(source) if bases[_base(source)] == 1 else str(source)
        label = f"{base}/{name}" if several else base
        labels[label] += 1
        if labels[label] > 1:
            label = f"{label} ({labels[label]})"
        order = sorted(files, key=lambda f: _natural(_node_id(f, read[f])))
        runs.append(Run(label, source, alg, tuple(f.parent for f in order),
                        {_node_id(f, read[f]): read[f] for f in order}))
    return runs


def _base(source: Path) -> str:
    name = source.resolve().name if source.is_dir() else source.resolve().parent.name
    return name or str(source)


_SPLITS = {"iid": "i.i.d.", "shards": "non-i.i.d. shards", "dirichlet": "Dirichlet"}


def setting_parts(config: dict[str, Any], nodes: int) -> dict[str, str]:
    """The setting of a run as a reader names it: data, nodes, topology, split, an
    asynchronous schedule and precision (from its configuration; the number of nodes from the
    run itself where there is none)."""
    parts: dict[str, str] = {}
    if config.get("dataset"):
        parts["data"] = str(config["dataset"])
    parts["nodes"] = f"{config.get('nodes') or nodes} nodes"
    topology = config.get("topology")
    if topology:
        every = config.get("time_varying") or 0
        parts["topology"] = f"{topology}, rebuilt every {every} rounds" if every else str(topology)
    partition = config.get("partition")
    if partition and config.get("dataset") in (None, "fashion-mnist", "mnist", "cifar10",
                                                 "synthetic"):
        split = _SPLITS.get(str(partition), str(partition))
        if partition == "shards" and config.get("shards_per_node"):
            split += f" ({config['shards_per_node']} per node)"
        elif partition == "dirichlet" and config.get("dirichlet_alpha") is not None:
            split += f" α={config['dirichlet_alpha']}"
        parts["split"] = split
    if config.get("schedule") == "async":
        staleness = config.get("staleness")
        parts["schedule"] = "asynchronous" + (f", staleness ≤ {staleness}"
                                              if staleness is not None else "")
    if config.get("precision"):
        parts["precision"] = str(config["precision"])
    return parts


#: Settings that say where a run's files were, not what ran: never named in a legend.
BOOKKEEPING = frozenset({"algorithm", "data_root", "test_root", "download", "bad_files",
                         "threads", "out", "out_dir", "state_dir", "version"})
#: The settings a legend names first, where they differ between the runs compared.
PREFERRED = ("schedule", "compression", "slowdown", "round_deadline", "staleness", "topology",
             "nodes", "mixing")
#: At most this many settings per legend entry (all of :data:`PREFERRED` that differ, then
#: others up to this many).
LEGEND_KEYS = 4


def _relevant(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with today's default of each setting it does not have (one written before
    the setting existed), less the settings that cannot change its run (the Dirichlet alpha of
    an i.i.d. split; see :class:`~dacflnode.config.schema.Setting`), and ``staleness`` outside
    an asynchronous run; ``{}`` for ``{}``."""
    from types import SimpleNamespace

    from dacflnode.config import RunConfig, schema

    if not config:
        return {}
    out = {**RunConfig().to_json(), **config}
    values = SimpleNamespace(**out)
    for declared in schema.fields_of(RunConfig):
        test = declared.setting.relevant
        try:
            if test is not None and not test(values):
                out.pop(declared.name, None)
        except Exception:  # a setting of another version: keep what was written
            continue
    if out.get("schedule", "sync") != "async":
        out.pop("staleness", None)
    return out


def is_async(run: Run) -> bool:
    """Whether ``run`` ran asynchronously: its settings say ``schedule: async``, or (with no
    settings) its lines count pairwise exchanges."""
    schedule = run.config().get("schedule")
    if schedule is not None:
        return str(schedule) == "async"
    return any(line.get("exchanges") is not None for lines in run.lines.values()
               for line in lines)


def run_settings(run: Run) -> dict[str, Any]:
    """The settings ``run`` ran with, as its legend compares them: its configuration (less
    :data:`BOOKKEEPING` and what is not relevant to it), with its ``nodes``, ``schedule``
    (``sync`` where not written) and ``slowdown`` (``None`` where not written or 1) always
    there."""
    config = _relevant(run.config())
    settings = {k: v for k, v in config.items() if k not in BOOKKEEPING}
    settings.setdefault("nodes", len(run.node_dirs))
    settings["schedule"] = "async" if is_async(run) else "sync"
    settings["slowdown"] = _slowdown(settings.get("slowdown"))
    return settings


def _slowdown(value: Any) -> Any:
    """A slowdown as a legend compares it: ``None`` for none (not written, ``{}``, a factor
    of 1), the mapping node id → factor less the nodes at 1, or the one factor of every node."""
    if isinstance(value, dict):
        slowed = {k: v for k, v in value.items() if v not in (None, 1, 1.0)}
        return slowed or None
    return None if value in (None, 1, 1.0) else value


def _show(key: str, value: Any) -> str:
    if value is None or value == {} or value == []:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        sep = "×" if key == "slowdown" else ":"
        return "+".join(f"{k}{sep}{_show(key, v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return "+".join(_show(key, v) for v in value)
    return str(value)


def differing_settings(runs: Sequence[Run]) -> list[str]:
    """The settings (of :func:`run_settings`) every run has and not all with one value:
    :data:`PREFERRED` first, then the rest in the first run's order, :data:`LEGEND_KEYS` at
    most (all the preferred ones)."""
    if len(runs) < 2:
        return []
    settings = [run_settings(r) for r in runs]
    shared = [k for k in settings[0] if all(k in s for s in settings[1:])]
    differ = [k for k in shared
              if len({json.dumps(s[k], sort_keys=True, default=str) for s in settings}) > 1]
    first = [k for k in PREFERRED if k in differ]
    rest = [k for k in differ if k not in PREFERRED]
    return first + rest[:max(0, LEGEND_KEYS - len(first))]


def figure_labels(runs: Sequence[Run]) -> tuple[str, dict[str, str]]:
    """The figures' title (the setting every run shares) and each run's legend text: the
    paper's name of its algorithm, followed by the settings that differ between the runs
    (``DACFL schedule=async, compression=int8``); by its folder's label where that leaves two
    alike (nothing differs, or the runs have no settings).

    Runs without settings (a cluster started by hand, state directories) are titled by their
    folder's name and algorithm too, where all runs share them."""
    from dacflnode.sim.plots import paper_label

    parts = {r.label: setting_parts(r.config(), len(r.node_dirs)) for r in runs}
    keys = ("data", "nodes", "topology", "split", "schedule", "precision")
    shared = [k for k in keys
              if runs and all(k in parts[r.label] for r in runs)
              and len({parts[r.label][k] for r in runs}) == 1]
    named = [parts[runs[0].label][k] for k in shared if k != "precision"] if runs else []
    if runs and not any(r.config() for r in runs):
        folders = {_base(r.source) for r in runs}
        algorithms = {r.algorithm for r in runs}
        named[:0] = ([next(iter(folders))] if len(folders) == 1 else []) + (
            [paper_label(r.algorithm) for r in runs[:1]] if len(algorithms) == 1 else [])
    differ = differing_settings(runs)
    labels: dict[str, str] = {}
    for r in runs:
        settings = run_settings(r)
        shown = ", ".join(f"{k}={_show(k, settings[k])}" for k in differ)
        labels[r.label] = f"{paper_label(r.algorithm)} {shown}".rstrip()
    texts = Counter(labels.values())
    for r in runs:
        if texts[labels[r.label]] > 1:
            labels[r.label] = f"{labels[r.label]} ({r.label})"
    return " · ".join(named), labels


def _event_times(run: Run) -> tuple[float | None, list[tuple[float, int, float]]]:
    """The run's start (unix seconds) and its accuracies as (time, node index, accuracy)."""
    starts: list[float] = []
    events: list[tuple[float, int, float]] = []
    for index, lines in enumerate(run.lines.values()):
        timed = [line for line in lines if _number(line.get("time"))]
        if timed:
            first = timed[0]
            took = first.get("seconds")
            took = took if isinstance(took, int | float) and _number(took) and took > 0 else 0.0
            starts.append(float(first["time"]) - took)
        events.extend((float(line["time"]), index, float(line["accuracy"])) for line in timed
                      if _number(line.get("accuracy")))
    return (min(starts) if starts else None), sorted(events)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def has_times(run: Run) -> bool:
    """Whether every accuracy ``run`` recorded has its ``time`` (files written before lines
    carried one have none) and there is at least one."""
    accs = [line for lines in run.lines.values() for line in lines
            if line.get("accuracy") is not None]
    return bool(accs) and all(_number(line.get("time")) for line in accs)


def accuracy_over_time(run: Run) -> dict[str, list[float]]:
    """Average and Var of Acc over wall-clock time, a step function: at each time a node wrote
    an accuracy, the mean (population variance) over the nodes of each one's latest accuracy,
    from the time every node has written one. ``time`` is seconds since the run started: the
    earliest a node's first line says its round began (``time - seconds``)."""
    start, events = _event_times(run)
    latest: dict[int, float] = {}
    out: dict[str, list[float]] = {"time": [], "avg_acc": [], "var_acc": []}
    count = len(run.lines)
    for at, node, accuracy in events:
        latest[node] = accuracy
        if len(latest) < count or start is None:
            continue
        accs = list(latest.values())
        mean = sum(accs) / count
        point = (round(at - start, 6), mean, sum((a - mean) ** 2 for a in accs) / count)
        if out["time"] and out["time"][-1] == point[0]:  # nodes that wrote at the same time
            for key in out:
                out[key].pop()
        for key, value in zip(out, point, strict=True):
            out[key].append(value)
    return out


def time_to_accuracy(run: Run, target: float) -> float | None:
    """Seconds from ``run``'s start until its Average of Acc over time
    (:func:`accuracy_over_time`) first reaches ``target`` (a fraction: 0.8 for 80 %); ``None``
    where it never does or the lines carry no time."""
    curve = accuracy_over_time(run)
    return next((t for t, a in zip(curve["time"], curve["avg_acc"], strict=True) if a >= target),
                None)


def accuracy_axis(runs: Sequence[Run]) -> str:
    """``time`` where a run is asynchronous and every run's accuracies carry their time (so
    synchronous and asynchronous arms share one time axis), else ``round``."""
    timed = any(is_async(r) for r in runs) and all(
        has_times(r) or not any(line.get("accuracy") is not None
                                for lines in r.lines.values() for line in lines) for r in runs)
    return "time" if timed else "round"


def figures(runs: Sequence[Run]) -> dict[str, Figure]:
    """The figures of :data:`FIGURES`: ``accuracy`` (Average and Var of Acc per round, or over
    time where a run is asynchronous: :func:`accuracy_axis`; one line per run) and ``nodes``
    (each run's residual and round time per node), titled with the runs' setting and
    labelled with the paper's algorithm names and what tells the runs apart."""
    from dacflnode.sim.plots import PAPER_NAMES, accuracy_figure, nodes_figure

    order = list(PAPER_NAMES)  # legends and panels in the paper's order: DACFL first
    runs = sorted(runs, key=lambda r: order.index(r.algorithm) if r.algorithm in order
                  else len(order))
    title, labels = figure_labels(runs)
    x = accuracy_axis(runs)
    curves = {}
    for r in runs:
        curve = r.summary() if x == "round" else accuracy_over_time(r)
        curves[labels[r.label]] = {**curve, "algorithm": r.algorithm}
    return {"accuracy": accuracy_figure(curves, title, x),
            "nodes": nodes_figure({labels[r.label]: r.lines for r in runs}, title)}


def write_figures(runs: Sequence[Run], out_dir: Path) -> list[Path]:
    """Draw :func:`figures` into ``out_dir`` as PNG and SVG."""
    from dacflnode.sim.plots import save_figure

    make_dir(out_dir)
    paths = {name: [out_dir / f"{name}.{fmt}" for fmt in FORMATS] for name in FIGURES}
    files = [p for name in FIGURES for p in paths[name]]
    for path in files:  # matplotlib truncates an existing file and keeps its mode
        prepare_file(path, LOG_MODE)
    for name, fig in figures(runs).items():
        save_figure(fig, paths[name])
    return files


def build_report(sources: Sequence[str | Path], out_dir: Path) -> dict[str, Any]:
    """Find the runs, draw the figures; returns ``{"runs": [row, ...], "files": [...]}``."""
    runs = find_runs(sources)
    files = write_figures(runs, out_dir)
    return {"runs": [r.row() for r in runs], "files": [str(p) for p in files]}
