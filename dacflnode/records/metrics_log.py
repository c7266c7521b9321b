"""``metrics.jsonl``: one line per node and round, and the run summary made from those lines.

Every node writes the same line whether it runs as a daemon (``launch``, ``start``) or inside the
simulator, and :func:`summarize` reads the files back for both, so the two commands produce the
same layout and the same ``summary.json`` entries. The paper's per-round metrics
(docs/algorithm.md): *Average of Acc* — the mean over nodes of each node's test accuracy — and
*Var of Acc*, their population variance; also the mean training loss and the mean
``consensus_residual`` ``‖x_i − ω_i‖`` (how far a node's estimate is from its own latest model).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from dacflnode.filemodes import LOG_MODE, open_text

METRICS_FILE = "metrics.jsonl"


@dataclass(frozen=True)
class DataInfo:
    """A node's data as its metrics line, ``status``, ``/metrics`` and ``report`` show it."""

    size: int
    test_size: int
    #: training samples per class name, in the run's class order
    class_counts: dict[str, int] = field(default_factory=dict)
    #: undecodable files left out (``bad_files: skip``)
    skipped: int = 0


@dataclass(frozen=True)
class MetricsLine:
    """One node's line of one round: its fields are the line's keys, in the order written."""

    round: int
    node: str
    algorithm: str
    lr: float
    train_loss: float
    samples: int
    accuracy: float | None
    test_loss: float | None
    consensus_residual: float
    neighbours_used: list[str]
    neighbours_missing: list[str]
    alone_rounds: int
    refused_states: int
    bytes_sent: int
    bytes_received: int
    exchange_s: float
    train_s: float
    seconds: float
    data_size: int | None
    class_counts: dict[str, int] | None
    #: unix seconds when the line was written (the simulator's: its virtual clock's), so that
    #: time to an accuracy can be read across nodes
    time: float
    #: an asynchronous run's pairwise exchanges applied in the block, and how many blocks the
    #: oldest neighbour snapshot mixed in it was behind the node's own (``None`` in a
    #: synchronous run)
    exchanges: int | None = None
    staleness: int | None = None


#: The keys of every metrics line, in the order they are written.
LINE_KEYS = tuple(f.name for f in fields(MetricsLine))


def append_line(path: Path, line: MetricsLine) -> None:
    """Append one round's line (one format for all: the fields of :class:`MetricsLine`)."""
    with open_text(path, LOG_MODE, append=True) as out:
        out.write(json.dumps(asdict(line)) + "\n")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The lines of one ``metrics.jsonl`` (a line being written right now is skipped)."""
    if not path.exists():
        return []
    lines = []
    for raw in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            lines.append(json.loads(raw))
    return lines


def summarize(
    node_dirs: Sequence[Path], algorithm: str, wall_s: float, engine: str
) -> dict[str, Any]:
    """Per-round Average/Var of Acc, mean training loss, residual and payload bytes a node sent
    (``bytes_sent``, the mean over the nodes) over ``node_dirs``.

    A round counts when every node has written it; ``samples_per_s`` is every sample every node
    trained on in those rounds over ``wall_s``.
    """
    per_node = [read_metrics(d / METRICS_FILE) for d in node_dirs]
    rounds = min((len(m) for m in per_node), default=0)
    evaluated: list[int] = []
    avg: list[float] = []
    var: list[float] = []
    train_loss: list[float] = []
    residual: list[float] = []
    sent: list[float] = []
    samples = 0
    for r in range(rounds):
        rows = [m[r] for m in per_node]
        samples += sum(int(row["samples"]) for row in rows)
        sent.append(float(np.mean([row.get("bytes_sent") or 0 for row in rows])))
        train_loss.append(float(np.mean([row["train_loss"] for row in rows])))
        residual.append(float(np.mean([row["consensus_residual"] for row in rows])))
        accs = [row["accuracy"] for row in rows]
        if all(a is not None for a in accs):
            evaluated.append(int(rows[0]["round"]))
            avg.append(float(np.mean(accs)))
            var.append(float(np.var(accs)))
    return {
        "algorithm": algorithm,
        "engine": engine,
        "wall_s": round(wall_s, 3),
        "samples": samples,
        "samples_per_s": round(samples / wall_s, 1) if wall_s > 0 else None,
        "final": {
            "round": evaluated[-1] if evaluated else None,
            "avg_acc": avg[-1] if avg else None,
            "var_acc": var[-1] if var else None,
            "train_loss": train_loss[-1] if train_loss else None,
            "consensus_residual": residual[-1] if residual else None,
            "bytes_sent_per_round": float(np.mean(sent)) if sent else None,
        },
        "rounds": evaluated,
        "avg_acc": avg,
        "var_acc": var,
        "train_loss": train_loss,
        "consensus_residual": residual,
        "bytes_sent": sent,
    }
