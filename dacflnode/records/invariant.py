"""The network-wide consensus invariant, read from the nodes' checkpoints.

DACFL's estimates track the network-average model because mixing preserves a sum: with the
lagged FODAC variant, ``Σ_i x_i = Σ_i ω_i^{prev}`` holds exactly while every round's mixing is
symmetric and doubly stochastic (docs/faults.md). Each checkpoint names the tensor its node's
``x`` tracks (meta ``tracked``: ``omega_prev``, ``omega`` or, for algorithms without a tracker,
``x`` itself), so the relative residual ``|Σ x_i − Σ tracked_i| / |Σ tracked_i|`` over a set of
nodes measures how far the network is from the invariant.

A checkpoint may hold *pending* corrections: node ``i`` mixed neighbour ``j``'s round-``t`` state
and keeps the vector it must subtract from ``x_i`` should ``j`` turn out not to have mixed ``i``'s
(a one-sided use of the edge). The node resolves them when ``j``'s ``used_log`` arrives; here
they are resolved across the snapshots the same way: subtracted when ``j``'s checkpoint says ``j``
did not use ``i`` in round ``t``, dropped when it says ``j`` did, and left *unresolved* (not
subtracted) when ``j``'s checkpoint has no entry for round ``t`` or ``j`` is not among the
snapshots. So the *resolved* residual is what the network's invariant will be once every
correction in flight lands, the *raw* residual what the files hold now.

Nodes checkpoint after each of their rounds, so snapshots taken from a running network may be of
different rounds: the residual is then an estimate only, and the report says so. A node that left
the network handed its share to its neighbours: the invariant holds among those that remain, so
its snapshot serves only to resolve their pending corrections and is not summed.

Pure functions over typed data; reading files and fetching live checkpoints is the caller's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dacflnode.records.checkpoint import CHECKPOINT, CHECKPOINT_PREV, Checkpoint, read_checkpoint
from dacflnode.records.metrics_log import METRICS_FILE

TRACKED_NAMES = ("omega_prev", "omega", "x")
#: The relative residual under which the invariant is said to hold: float32 rounding leaves up
#: to ~1e-6 after hundreds of rounds with faults (docs/faults.md, "What this does not cover").
TOLERANCE = 2e-6


@dataclass(frozen=True)
class Snapshot:
    """What the invariant needs of one node's checkpoint.

    ``used_log`` maps a round to the neighbours whose state the node mixed in it; ``pending``
    maps ``(round, peer)`` to the vector to subtract from ``x`` if ``peer`` did not use this
    node's state in that round.
    """

    node: str
    round: int
    x: torch.Tensor
    tracked: torch.Tensor
    tracked_name: str = "omega_prev"
    used_log: Mapping[int, frozenset[str]] = field(default_factory=dict)
    pending: Mapping[tuple[int, str], torch.Tensor] = field(default_factory=dict)
    #: The run fingerprint the checkpoint was written for ("" when it has none).
    run: str = ""
    #: Whether the node had left the network (drained out) when it wrote the checkpoint.
    left: bool = False

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> Snapshot:
        name = checkpoint.tracked_name
        if name not in TRACKED_NAMES:
            raise ValueError(f"tracked tensor {name!r} is not one of {', '.join(TRACKED_NAMES)}")
        return cls(
            node=checkpoint.node, round=checkpoint.state.round, x=checkpoint.state.x,
            tracked=checkpoint.tracked, tracked_name=name,
            used_log=used_log_map(checkpoint.used_log), pending=checkpoint.pending_entries,
            run=checkpoint.meta.get("run_fingerprint", ""), left=checkpoint.left,
        )


def used_log_map(log: Iterable[tuple[int, Iterable[str]]]) -> dict[int, frozenset[str]]:
    """A ``used_log`` (pairs of round and neighbours used) as a map from round to neighbours."""
    return {int(r): frozenset(peers) for r, peers in log}


@dataclass(frozen=True)
class Skipped:
    """A source that gave no snapshot, and why."""

    source: str
    reason: str


def read_snapshot(source: Path | bytes) -> Snapshot:
    """The snapshot of a checkpoint file (a path, or its bytes); a directory stands for the
    ``checkpoint.safetensors`` in it. Raises ``FileNotFoundError`` when there is no such file,
    ``ValueError`` when it is not a checkpoint, or not one of a named node."""
    if isinstance(source, Path):
        if source.is_dir():
            source = source / CHECKPOINT
        if not source.exists():
            raise FileNotFoundError(source)
    snapshot = Snapshot.from_checkpoint(read_checkpoint(source))
    if not snapshot.node:
        raise ValueError("the checkpoint names no node")
    return snapshot


#: What a node's state folder holds once its daemon ran: how :func:`node_folders` tells one.
NODE_FOLDER_FILES = (CHECKPOINT, CHECKPOINT_PREV, METRICS_FILE, "daemon.log")


def node_folders(path: Path) -> list[Path]:
    """The state folders that the folder ``path`` stands for: ``path`` itself when it is a
    node's (it holds a checkpoint, a metrics log or a daemon log) or has no node folder below
    it; else, sorted, every node folder below it: ``DIR/<node-id>/`` of ``launch --out DIR``, or
    ``DIR/<algorithm>/<node-id>/`` when it ran several algorithms."""

    def is_node(folder: Path) -> bool:
        return any((folder / name).exists() for name in NODE_FOLDER_FILES)

    if is_node(path):
        return [path]
    found: list[Path] = []
    for child in sorted(p for p in path.iterdir() if p.is_dir()):
        if is_node(child):
            found.append(child)
        else:
            found.extend(sorted(g for g in child.iterdir() if g.is_dir() and is_node(g)))
    return found or [path]


def read_snapshots(
    sources: Sequence[tuple[str, Path | bytes | None]],
) -> tuple[list[Snapshot], list[Skipped]]:
    """The snapshots of ``(label, source)`` pairs, and the sources that gave none (``None``:
    the source had nothing to read, e.g. a node without a checkpoint yet; a second snapshot of
    a node already read is skipped)."""
    snapshots: list[Snapshot] = []
    skipped: list[Skipped] = []
    seen: dict[str, str] = {}
    for label, source in sources:
        if source is None:
            skipped.append(Skipped(label, "no checkpoint yet"))
            continue
        try:
            snap = read_snapshot(source)
        except FileNotFoundError:
            skipped.append(Skipped(label, "no checkpoint yet"))
            continue
        except ValueError as exc:
            skipped.append(Skipped(label, str(exc)))
            continue
        if snap.node in seen:
            skipped.append(Skipped(label, f"node {snap.node} was read already from "
                                          f"{seen[snap.node]}"))
            continue
        seen[snap.node] = label
        snapshots.append(snap)
    return snapshots, skipped


@dataclass(frozen=True)
class NodeReport:
    """One node in an :class:`InvariantReport`.

    ``deviation``: ``|x_i − tracked_i|``; ``applied``: its pending corrections subtracted,
    ``dropped``: those found unneeded (the peer did use this node's state), ``unresolved``:
    those that could not be decided.
    """

    node: str
    round: int
    tracked: str
    deviation: float
    pending: int
    applied: int
    dropped: int
    unresolved: int


@dataclass(frozen=True)
class Unresolved:
    """A pending correction of ``node`` for ``(round, peer)`` that the snapshots cannot decide."""

    node: str
    round: int
    peer: str
    why: str


@dataclass(frozen=True)
class InvariantReport:
    """The invariant over a set of snapshots (see the module docstring)."""

    nodes: tuple[NodeReport, ...]
    raw_residual: float
    resolved_residual: float
    unresolved: tuple[Unresolved, ...]
    warnings: tuple[str, ...]
    #: Nodes whose snapshot says they had left the network: not summed (see the module
    #: docstring), used only to resolve the others' corrections.
    left: tuple[str, ...] = ()

    @property
    def rounds(self) -> dict[str, int]:
        return {n.node: n.round for n in self.nodes}

    @property
    def rounds_differ(self) -> bool:
        return len(set(self.rounds.values())) > 1

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data (an infinite or NaN residual written as ``None``)."""

        def num(v: float) -> float | None:
            return v if math.isfinite(v) else None

        return {
            "nodes": [n.node for n in self.nodes],
            "rounds": self.rounds,
            "rounds_differ": self.rounds_differ,
            "raw_residual": num(self.raw_residual),
            "resolved_residual": num(self.resolved_residual),
            "unresolved": len(self.unresolved),
            "unresolved_corrections": [
                {"node": u.node, "round": u.round, "peer": u.peer, "why": u.why}
                for u in self.unresolved],
            "per_node": {n.node: {"round": n.round, "tracked": n.tracked,
                                  "deviation": num(n.deviation), "pending": n.pending,
                                  "applied": n.applied, "dropped": n.dropped,
                                  "unresolved": n.unresolved} for n in self.nodes},
            "left": list(self.left),
            "warnings": list(self.warnings),
        }


def relative_residual(sum_x: torch.Tensor, sum_tracked: torch.Tensor) -> float:
    """``|sum_x − sum_tracked| / |sum_tracked|`` (0 when both are zero, inf when only the
    denominator is)."""
    num = float(torch.linalg.vector_norm(sum_x - sum_tracked))
    den = float(torch.linalg.vector_norm(sum_tracked))
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def compute_invariant(snapshots: Sequence[Snapshot]) -> InvariantReport:
    """The invariant over ``snapshots`` (one per node), pending corrections resolved across
    them; snapshots of nodes that left are not summed. Raises ``ValueError`` when no node that
    stayed is among them, when two share a node or when their tensors differ in size."""
    by_node = {s.node: s for s in snapshots}
    if len(by_node) != len(snapshots):
        raise ValueError("two snapshots of one node")
    staying = [s for s in snapshots if not s.left]
    if not staying:
        raise ValueError("no snapshots" if not snapshots else
                         "every node read has left the network")
    sizes = {s.x.numel() for s in snapshots} | {s.tracked.numel() for s in snapshots}
    if len(sizes) != 1:
        raise ValueError(f"the snapshots' models differ in size: {sorted(sizes)}")
    warnings: list[str] = []
    rounds = {s.round for s in staying}
    if len(rounds) > 1:
        warnings.append(f"the nodes are at different rounds ({min(rounds)} to {max(rounds)}): "
                        "the residual is only an estimate")
    runs = {s.run for s in snapshots if s.run}
    if len(runs) > 1:
        warnings.append("the checkpoints belong to different runs")
    tracked_names = {s.tracked_name for s in staying}
    if len(tracked_names) > 1:
        warnings.append(f"the nodes track different tensors ({', '.join(sorted(tracked_names))})")

    sum_x = torch.zeros(next(iter(sizes)), dtype=torch.float64)
    sum_tracked = torch.zeros_like(sum_x)
    correction = torch.zeros_like(sum_x)
    reports: list[NodeReport] = []
    unresolved: list[Unresolved] = []
    for s in sorted(staying, key=lambda s: s.node):
        x = s.x.detach().reshape(-1).double()
        tracked = s.tracked.detach().reshape(-1).double()
        sum_x += x
        sum_tracked += tracked
        applied = dropped = open_ = 0
        for (t, peer), c in sorted(s.pending.items(), key=lambda item: item[0]):
            if c.numel() != x.numel():
                raise ValueError(f"{s.node}: pending correction ({t}, {peer}) has "
                                 f"{c.numel()} values, the model {x.numel()}")
            other = by_node.get(peer)
            used = None if other is None else other.used_log.get(t)
            if used is None:
                open_ += 1
                why = (f"{peer} is not among the snapshots" if other is None else
                       f"the checkpoint of {peer} (round {other.round}) has no entry for "
                       f"round {t}")
                unresolved.append(Unresolved(s.node, t, peer, why))
            elif s.node in used:
                dropped += 1
            else:
                applied += 1
                correction += c.detach().reshape(-1).double()
        reports.append(NodeReport(
            node=s.node, round=s.round, tracked=s.tracked_name,
            deviation=float(torch.linalg.vector_norm(x - tracked)), pending=len(s.pending),
            applied=applied, dropped=dropped, unresolved=open_))
    if unresolved:
        warnings.append(f"{len(unresolved)} pending correction(s) could not be resolved from "
                        "these snapshots: the resolved residual leaves them out")
    return InvariantReport(
        nodes=tuple(reports),
        raw_residual=relative_residual(sum_x, sum_tracked),
        resolved_residual=relative_residual(sum_x - correction, sum_tracked),
        unresolved=tuple(unresolved),
        warnings=tuple(warnings),
        left=tuple(sorted(s.node for s in snapshots if s.left)),
    )


@dataclass(frozen=True)
class Verdict:
    """Whether the invariant holds over what was read: ``text`` is ``holds: R ≤ T`` or
    ``BROKEN: …`` naming every reason."""

    holds: bool
    text: str


def verdict(report: InvariantReport | None, skipped: Sequence[Skipped],
            tolerance: float = TOLERANCE) -> Verdict:
    """The verdict on ``report`` (``None``: nothing could be read): it holds when every source
    gave a snapshot, no pending correction is left unresolved and the resolved residual is at
    most ``tolerance``."""
    reasons = [f"{s.source}: {s.reason}" for s in skipped]
    if report is None:
        return Verdict(False, "BROKEN: no checkpoint could be read" +
                       "".join(f"; {r}" for r in reasons))
    residual = report.resolved_residual
    if report.unresolved:
        reasons.append(f"{len(report.unresolved)} pending correction(s) unresolved")
    if not residual <= tolerance:  # NaN included
        reasons.append(f"residual {residual:.2g} > {tolerance:.2g}")
    if reasons:
        return Verdict(False, "BROKEN: " + "; ".join(reasons))
    return Verdict(True, f"holds: {residual:.2g} ≤ {tolerance:.2g}")


# ---------------------------------------------------------------- simulator output
#: The summary a simulator (``dacflnode simulate --out DIR``) writes at the top of ``DIR``.
SUMMARY = "summary.json"


@dataclass(frozen=True)
class SimulatorInvariant:
    """The invariant a simulator run wrote in its summary: per algorithm that keeps one (DACFL's
    tracker), the residual over the nodes that finished; the others track their own ``x``."""

    summary: Path
    #: algorithm → the relative residual over the nodes that finished (``None``: none finished)
    residuals: Mapping[str, float | None]
    #: algorithm → how many nodes the final residual is over (``None``: not written)
    nodes: Mapping[str, int | None]
    #: the run's algorithms that track their own ``x`` (no invariant to check)
    untracked: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"source": "simulator", "summary": str(self.summary),
                "residuals": dict(self.residuals), "nodes": dict(self.nodes),
                "untracked": list(self.untracked)}


def simulator_summary(path: Path) -> Path | None:
    """The simulator summary that the folder ``path`` belongs to: ``path`` is the output folder
    itself, a node's folder in it, or a node's folder of one of its algorithms (several
    algorithms: ``DIR/<algorithm>/<node-id>``); ``None`` when there is none, or when the
    summary is that of daemons (``dacflnode launch``), which leave checkpoints to read."""
    if not path.is_dir():
        return None
    for folder in (path, path.parent, path.parent.parent):
        candidate = folder / SUMMARY
        if candidate.is_file():
            try:
                summary = json.loads(candidate.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return None
            algorithms = summary.get("algorithms") if isinstance(summary, dict) else None
            if not isinstance(algorithms, dict) or any(
                    isinstance(a, dict) and a.get("engine") == "daemon"
                    for a in algorithms.values()):
                return None
            return candidate
    return None


def read_simulator_invariant(summary_path: Path) -> SimulatorInvariant:
    """What the simulator summary ``summary_path`` says of the invariant; ``ValueError`` naming
    the file when it says nothing of it (written by an older dacflnode) or is damaged."""
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        algorithms = list(summary["algorithms"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{summary_path} is not a simulator summary ({exc})") from exc
    written = summary.get("invariant")
    if not isinstance(written, dict):
        raise ValueError(f"{summary_path} holds no invariant (written by an older dacflnode): "
                         "run `dacflnode simulate` again, or give the daemons' state folders")
    residuals: dict[str, float | None] = {}
    nodes: dict[str, int | None] = {}
    for name in algorithms:
        entry = written.get(name)
        if not isinstance(entry, dict):
            continue
        final = entry.get("final")
        residuals[name] = float(final) if isinstance(final, int | float) else None
        counts = entry.get("nodes")
        nodes[name] = (int(counts[-1]) if isinstance(counts, list) and counts
                       and isinstance(counts[-1], int) else None)
    untracked = tuple(name for name in algorithms if name not in residuals)
    return SimulatorInvariant(summary_path, residuals, nodes, untracked)


def simulator_verdict(found: SimulatorInvariant, tolerance: float = TOLERANCE) -> Verdict:
    """The verdict on a simulator run: it holds when every algorithm that keeps the invariant
    ended with a residual of at most ``tolerance`` over the nodes that finished."""
    if not found.residuals:
        return Verdict(False, "not applicable: no algorithm of this run keeps the invariant ("
                       f"{', '.join(found.untracked)} track their own x)")
    reasons = []
    for name, residual in found.residuals.items():
        if residual is None:
            reasons.append(f"{name}: no node finished the run")
        elif not residual <= tolerance:
            reasons.append(f"{name}: residual {residual:.2g} > {tolerance:.2g}")
    if reasons:
        return Verdict(False, "BROKEN: " + "; ".join(reasons))
    worst = max(r for r in found.residuals.values() if r is not None)
    return Verdict(True, f"holds: {worst:.2g} ≤ {tolerance:.2g}")
