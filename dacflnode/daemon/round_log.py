"""One INFO line per round of a daemon, and one summary line at the end.

The runner reports each finished round (:class:`~dacflnode.protocol.setup.RoundReport`); this
module turns the report into the line an operator follows with ``tail -f daemon.log`` or
``kubectl logs -f``::

    node-0: round 3/20: accuracy 0.8123, loss 0.5432; exchange 0.12s, train 0.40s;
        neighbours used 2 (node-1, node-3), missing 0, late 0; sent 1.2 MB, received 1.2 MB

(one line, cut here to fit the page).

A round that was not evaluated (``run.eval_every``) says ``not evaluated``. Missing and late
neighbours are named: *missing* ones sent no state by the round's deadline, *late* ones among
them showed they were alive (a late push, a refusal, a Hello). With ``--log-format json`` the
same record carries the figures as fields of their own (:data:`dacflnode.logs.VALUE_KEYS`), so a
log collector needs no parsing of the message. Rounds come at the node's own pace, so their
lines are not rate-limited (``unlimited``).

The bytes are the report's (:attr:`~dacflnode.protocol.setup.RoundReport.bytes_sent`, ...)
where the runner counts them, else what the transport counted over all neighbours since the last
line (a neighbour ahead of this node may have sent its next state already: it counts there).

After the last round, :meth:`RoundLog.summary` writes one line with the rounds run, the last
accuracy, the total time and the bytes sent and received.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from dacflnode.records.membership import PeerTrack

log = logging.getLogger(__name__)



class Report(Protocol):
    """What the line needs of a round's report
    (:class:`~dacflnode.protocol.setup.RoundReport`)."""

    @property
    def round(self) -> int: ...
    @property
    def used(self) -> tuple[str, ...]: ...
    @property
    def missing(self) -> tuple[str, ...]: ...
    @property
    def accuracy(self) -> float | None: ...
    @property
    def test_loss(self) -> float | None: ...
    @property
    def exchange_s(self) -> float: ...
    @property
    def train_s(self) -> float: ...
    @property
    def bytes_sent(self) -> int: ...
    @property
    def bytes_received(self) -> int: ...


def size(n: int) -> str:
    """``n`` bytes as people read them: ``0 B``, ``812 B``, ``1.2 kB``, ``3.4 MB``, ``1.1 GB``."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def duration(seconds: float) -> str:
    """``seconds`` as ``12.3s``, ``4m05s`` or ``2h03m``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(round(seconds), 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


def _names(ids: tuple[str, ...] | list[str]) -> str:
    return f"{len(ids)} ({', '.join(ids)})" if ids else "0"


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


class RoundLog:
    """Logs each round of node ``node`` (of ``rounds``) and, at the end, the summary.

    ``peers``: gives the runner's neighbour tracks, read after each round to tell the late
    neighbours (those whose :attr:`~dacflnode.records.membership.PeerTrack.late` count grew) from
    the silent.
    """

    def __init__(self, node: str, rounds: int,
                 peers: Callable[[], Mapping[str, PeerTrack]] | None = None,
                 traffic: Callable[[], tuple[int, int]] | None = None) -> None:
        self.node = node
        self.rounds = rounds
        self.peers = peers
        #: the transport's bytes sent and received so far, over all neighbours: the round's
        #: bytes where the report has none (a runner that does not count them)
        self.traffic = traffic
        self._traffic = traffic() if traffic is not None else (0, 0)
        self.started = time.monotonic()
        self.done = 0
        self.accuracy: float | None = None
        self.bytes_sent = 0
        self.bytes_received = 0
        self._late = self._late_counts()

    def _late_counts(self) -> dict[str, int]:
        return {} if self.peers is None else {j: t.late for j, t in self.peers().items()}

    def __call__(self, report: Report) -> None:
        self.done = report.round
        accuracy, loss = _finite(report.accuracy), _finite(report.test_loss)
        if accuracy is not None:
            self.accuracy = accuracy
        sent, received = report.bytes_sent, report.bytes_received
        if self.traffic is not None:
            now = self.traffic()
            if not sent and not received:
                sent, received = now[0] - self._traffic[0], now[1] - self._traffic[1]
            self._traffic = now
        self.bytes_sent += sent
        self.bytes_received += received
        counts = self._late_counts()
        late = sorted(j for j, n in counts.items() if n > self._late.get(j, 0))
        self._late = counts
        evaluated = ("not evaluated" if accuracy is None else
                     f"accuracy {accuracy:.4f}" + ("" if loss is None else f", loss {loss:.4f}"))
        log.info("round %d/%d: %s; exchange %.2fs, train %.2fs; neighbours used %s, "
                 "missing %s, late %s; sent %s, received %s", report.round,
                 self.rounds, evaluated, report.exchange_s, report.train_s,
                 _names(report.used), _names(report.missing), _names(late),
                 size(sent), size(received),
                 extra={"event": "round", "node": self.node, "round": report.round,
                        "unlimited": True, "rounds": self.rounds, "accuracy": accuracy,
                        "loss": loss, "exchange_s": round(report.exchange_s, 4),
                        "train_s": round(report.train_s, 4), "used": list(report.used),
                        "missing": list(report.missing), "late": late,
                        "bytes_sent": sent, "bytes_received": received})

    def summary(self) -> None:
        """The line at the end of the run: rounds, final accuracy, total time, bytes."""
        seconds = time.monotonic() - self.started
        accuracy = "not evaluated" if self.accuracy is None else f"{self.accuracy:.4f}"
        log.info("finished %d/%d rounds in %s; final accuracy %s; sent %s, received %s",
                 self.done, self.rounds, duration(seconds), accuracy,
                 size(self.bytes_sent), size(self.bytes_received),
                 extra={"event": "summary", "node": self.node, "round": self.done,
                        "rounds": self.rounds, "accuracy": self.accuracy,
                        "seconds": round(seconds, 3), "bytes_sent": self.bytes_sent,
                        "bytes_received": self.bytes_received})
