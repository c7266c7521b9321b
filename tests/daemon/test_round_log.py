"""The daemon's line per round and its summary line, their parts on their own: names, sizes,
durations, the rate limit they are exempt from, the JSON message. A real pair of daemons writing
them in both formats: tests/e2e/test_round_log_daemon.py."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import pytest

from dacflnode import logs
from dacflnode.daemon.round_log import RoundLog, duration, size
from dacflnode.records.membership import PeerTrack


@dataclass
class Report:
    round: int
    used: tuple[str, ...] = ("b",)
    missing: tuple[str, ...] = ()
    accuracy: float | None = None
    test_loss: float | None = None
    exchange_s: float = 0.1
    train_s: float = 0.2
    bytes_sent: int = 0
    bytes_received: int = 0


@pytest.fixture
def captured(caplog):
    caplog.set_level(logging.INFO, logger="dacflnode.daemon.round_log")
    return caplog


def test_missing_and_late_neighbours_are_named_and_bytes_add_up(captured):
    tracks = {"b": PeerTrack(), "c": PeerTrack(), "d": PeerTrack()}
    rl = RoundLog("a", 5, lambda: tracks)
    tracks["d"].late += 1  # d showed it was alive, c stayed silent
    rl(Report(1, used=("b",), missing=("c", "d"), bytes_sent=1500, bytes_received=2_500_000))
    rl(Report(2, accuracy=0.5, test_loss=1.25, bytes_sent=500))
    rl.summary()
    first, second, end = (r.getMessage() for r in captured.records)
    assert "neighbours used 1 (b), missing 2 (c, d), late 1 (d); sent 1.5 kB, received 2.5 MB" \
        in first and "not evaluated" in first
    assert "round 2/5: accuracy 0.5000, loss 1.2500;" in second and "late 0;" in second
    assert end.startswith("finished 2/5 rounds in ") and "final accuracy 0.5000" in end
    assert {r.node for r in captured.records} == {"a"}  # the node is named once, as a field
    assert end.endswith("sent 2.0 kB, received 2.5 MB")
    assert captured.records[0].late == ["d"]


def test_without_bytes_in_the_report_the_transports_count_of_the_round_is_used(captured):
    counted = [(100, 50)]
    rl = RoundLog("a", 3, traffic=lambda: counted[-1])
    counted.append((1100, 2050))
    rl(Report(1))
    counted.append((1200, 2150))
    rl(Report(2, bytes_sent=7, bytes_received=9))  # counted by the runner: those win
    counted.append((1300, 2250))
    rl(Report(3))
    assert [(r.bytes_sent, r.bytes_received) for r in captured.records] == [
        (1000, 2000), (7, 9), (100, 100)]
    assert (rl.bytes_sent, rl.bytes_received) == (1107, 2109)


def test_a_run_never_evaluated_says_so_in_its_summary(captured):
    rl = RoundLog("a", 3)
    rl(Report(1, accuracy=float("nan")))
    rl.summary()
    assert captured.records[-1].getMessage().split("; ")[1] == "final accuracy not evaluated"


def test_sizes_and_durations_read_as_people_write_them():
    assert [size(n) for n in (0, 999, 1000, 1_234_567, 5 * 10**9)] == [
        "0 B", "999 B", "1.0 kB", "1.2 MB", "5.0 GB"]
    assert [duration(s) for s in (3.21, 65, 7500)] == ["3.2s", "1m05s", "2h05m"]


def test_round_lines_are_not_rate_limited_but_other_repeats_are(tmp_path):
    logger = logging.getLogger("dacflnode.test_round_log")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        logs.install(logger, tmp_path, console=False)
        for i in range(3 * logs.RATE_LIMIT_COUNT):
            logger.info("line %d", i, extra={logs.UNLIMITED: True})
            logger.info("other %d", i)
        text = (tmp_path / "daemon.log").read_text()
    finally:
        for h in list(logger.handlers):
            logger.removeHandler(h)
            h.close()
    assert text.count(" line ") == 3 * logs.RATE_LIMIT_COUNT
    assert text.count(" other ") == logs.RATE_LIMIT_COUNT


def test_the_json_message_is_the_call_sites_own_and_the_node_only_a_key():
    def message(msg: str, *args: object, **fields: object) -> str:
        record = logging.LogRecord("dacflnode.protocol.runner", logging.INFO, __file__, 1, msg,
                                   args, None)
        record.__dict__.update(fields)  # as extra= sets them
        return str(json.loads(logs.JsonFormatter(node="n0").format(record))["message"])

    assert message("neighbour %s is up", "n2", node="n1") == "neighbour n2 is up"
    assert message("n0: something") == "n0: something"  # nothing is stripped from a message
    assert message("n1: something", node="n1") == "n1: something"
