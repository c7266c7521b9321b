"""What a simulation reports: a record per round over the nodes (:class:`RoundRecord`), made
from the runners' reports as they come (:class:`RoundRecords`), and the run's result."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from dacflnode.algorithms.rounds import Algorithm, NodeState
from dacflnode.protocol.setup import RoundReport
from dacflnode.records.invariant import relative_residual


@dataclass
class RoundRecord:
    """One round of every node, for progress displays."""

    round: int  # rounds completed (1-based)
    train_loss: list[float]
    residual: list[float]
    samples: int
    accuracy: list[float] | None = None
    #: the nodes that reported the round (every node, in a run without node faults)
    nodes: list[str] = field(default_factory=list)
    #: ``|Σ x − Σ tracked| / |Σ tracked|`` over those nodes, in a run with faults (``None``:
    #: no faults, or not a FODAC algorithm)
    invariant: float | None = None

    @property
    def avg_acc(self) -> float | None:
        return None if self.accuracy is None else float(np.mean(self.accuracy))

    @property
    def var_acc(self) -> float | None:
        return None if self.accuracy is None else float(np.var(self.accuracy))

    @property
    def mean_train_loss(self) -> float:
        return float(np.mean(self.train_loss))


ProgressFn = Callable[[str, int, int, RoundRecord], None]


@dataclass
class SimulationResult:
    algorithm: str
    engine: str
    wall_s: float
    records: list[RoundRecord] = field(default_factory=list)
    #: the invariant residual over the nodes that finished the run (``None``: not FODAC)
    invariant: float | None = None


class RoundRecords:
    """Builds the per-round :class:`RoundRecord` s from the runners' reports.

    The record of round ``r`` is complete when every node has reported it, except nodes that
    are not running (down, gone, left, not yet joined, finished) and nodes already past ``r``
    without reporting it; records are handed out in round order.
    """

    def __init__(self, ids: Sequence[str], alg: Algorithm, rounds: int, faults: bool,
                 result: SimulationResult, progress: ProgressFn | None) -> None:
        self.ids = list(ids)
        self.alg = alg
        self.rounds = rounds
        self.result = result
        self.progress = progress
        #: whether a node may still report a round (set by the nodes' keeper)
        self.may_report: Callable[[str, int], bool] = lambda node, round_: False
        self._reports: dict[int, dict[str, RoundReport]] = {}
        self._sums: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._done = 0
        #: per-round sums only when faults are played or the mixing is not exact (a healthy
        #: run of exact mixing keeps Σ x = Σ tracked)
        self._tracks = alg.tracked_field != "x" and (
            faults or alg.mixing.rule != "exact")

    def add(self, node: str, report: RoundReport, state: NodeState) -> None:
        if report.round <= self._done:
            return  # a restarted node repeating a round already recorded without it
        self._reports.setdefault(report.round, {})[node] = report
        if self._tracks:
            x, t = state.x.double(), self.alg.tracked(state).double()
            sums = self._sums.get(report.round)
            self._sums[report.round] = (x, t) if sums is None else (sums[0] + x, sums[1] + t)
        self.flush()

    def _complete(self, round_: int) -> bool:
        got = self._reports.get(round_, {})
        return not any(node not in got and self.may_report(node, round_)
                       for node in self.ids)

    def flush(self, everything: bool = False) -> None:
        for round_ in sorted(self._reports):
            if not everything and not self._complete(round_):
                return
            self._emit(round_)

    def finish(self) -> None:
        self.flush(everything=True)

    def _emit(self, round_: int) -> None:
        done = self._reports.pop(round_)
        sums = self._sums.pop(round_, None)
        rows = [done[j] for j in self.ids if j in done]
        accs = [r.accuracy for r in rows]
        record = RoundRecord(
            round=round_, train_loss=[r.train_loss for r in rows],
            residual=[r.residual for r in rows], samples=sum(r.samples for r in rows),
            accuracy=None if any(a is None for a in accs) else
            [float(a) for a in accs if a is not None],
            nodes=[j for j in self.ids if j in done],
            invariant=None if sums is None else relative_residual(*sums),
        )
        self._done = round_
        self.result.records.append(record)
        if self.progress is not None:
            self.progress(self.alg.name, round_, self.rounds, record)
