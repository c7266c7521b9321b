"""The daemon's log guard: peers' values cannot forge or flood a log line; the file rotates."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from dacflnode import logs


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def logger(tmp_path: Path) -> Iterator[logging.Logger]:
    lg = logging.getLogger(f"dacflnode.test_logs.{tmp_path.name}")
    lg.setLevel(logging.INFO)
    lg.propagate = False
    yield lg
    for h in list(lg.handlers):
        lg.removeHandler(h)
        h.close()


def capture(logger: logging.Logger, guard: logs.LogGuard) -> list[str]:
    """Lines the logger writes through ``guard`` (a list handler with the daemon's format)."""
    lines: list[str] = []

    class ListHandler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    h = ListHandler()
    h.setFormatter(logging.Formatter(logs.LINE_FORMAT))
    h.addFilter(guard)
    logger.addHandler(h)
    return lines


def test_a_newline_in_a_value_is_escaped_and_cannot_start_a_line(logger):
    lines = capture(logger, logs.LogGuard())
    logger.warning("push from %s refused", "node-1\n2026-01-01 00:00:00 INFO forged")
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "'node-1\\n2026-01-01 00:00:00 INFO forged'" in lines[0]


def test_ordinary_values_are_written_as_before(logger):
    lines = capture(logger, logs.LogGuard())
    logger.info("%s: serving on %s (round %d of %d)", "node-0", "127.0.0.1:7000", 3, 40)
    logger.info("hello refused: %r is not a neighbour", "node-9")
    assert lines[0].endswith("node-0: serving on 127.0.0.1:7000 (round 3 of 40)")
    assert lines[1].endswith("hello refused: 'node-9' is not a neighbour")


def test_an_escaped_value_under_percent_r_is_quoted_once(logger):
    lines = capture(logger, logs.LogGuard())
    logger.warning("hello from %r refused", "a\tb")
    assert lines[0].endswith("hello from 'a\\tb' refused")


def test_a_100_kb_value_is_cut_at_the_limit_with_a_marker(logger):
    lines = capture(logger, logs.LogGuard())
    logger.warning("hello from %r refused", "A" * 100_000)
    message = lines[0].split(": ", 1)[1]
    assert f"…[+{100_000 - logs.MAX_VALUE_CHARS} chars]" in message
    assert len(message) < logs.MAX_VALUE_CHARS + 60
    assert message.count("A") == logs.MAX_VALUE_CHARS


def test_escape_sequences_are_cut_in_their_escaped_form():
    text = logs.escape("\x1b" * 500)
    assert "\x1b" not in text and len(text) < logs.MAX_VALUE_CHARS + 30


def test_bytes_and_objects_whose_text_holds_a_newline_are_escaped(logger):
    lines = capture(logger, logs.LogGuard())
    logger.error("%s: %s", b"\n\x00" * 200, ValueError("bad\nforged"))
    assert len(lines) == 1 and "\n" not in lines[0]
    assert lines[0].endswith("'bad\\nforged'")


def test_a_message_formatted_by_its_caller_cannot_hold_a_newline(logger):
    lines = capture(logger, logs.LogGuard())
    sender = "x\ny"
    logger.warning(f"push from {sender} refused")
    assert lines[0].endswith("push from x\\ny refused")


def test_the_message_of_a_logged_traceback_is_one_line(logger):
    lines = capture(logger, logs.LogGuard())
    try:
        raise ValueError("bad\n2026-01-01 INFO forged")
    except ValueError:
        logger.exception("failed")
    text = lines[0]
    assert "Traceback (most recent call last):" in text
    assert text.splitlines()[-1] == "ValueError: bad\\n2026-01-01 INFO forged"


def test_repeats_beyond_the_budget_are_dropped_then_summarised_once(logger):
    clock = Clock()
    lines = capture(logger, logs.LogGuard(count=3, window=10.0, clock=clock))
    for i in range(50):
        logger.warning("hello from %r refused", f"n{i}")
    assert len(lines) == 3
    clock.now += 10.0
    logger.warning("hello from %r refused", "late")
    assert lines[3].endswith("suppressed 47 similar messages: hello from %r refused")
    assert lines[4].endswith("hello from 'late' refused")
    assert len(lines) == 5


def test_a_summary_is_written_when_any_later_record_arrives(logger):
    clock = Clock()
    lines = capture(logger, logs.LogGuard(count=1, window=10.0, clock=clock))
    for _ in range(5):
        logger.warning("flood")
    clock.now += 11.0
    logger.info("something else")
    assert [line.split(": ", 1)[1] for line in lines] == [
        "flood", "suppressed 4 similar messages: flood", "something else"]


def test_templates_and_loggers_have_separate_budgets(logger):
    lines = capture(logger, logs.LogGuard(count=2, window=10.0, clock=Clock()))
    other = logger.getChild("other")
    for _ in range(5):
        logger.warning("a %d", 1)
        logger.warning("b %d", 1)
        other.warning("a %d", 1)
    assert len(lines) == 6


def test_two_handlers_see_the_same_lines_and_do_not_double_count(logger):
    guard = logs.LogGuard(count=4, window=10.0, clock=Clock())
    first, second = capture(logger, guard), capture(logger, guard)
    for i in range(10):
        logger.warning("refused %s", f"x\n{i}")
    assert first == second and len(first) == 4
    assert all("'x\\n" in line for line in first)


def test_the_template_table_stays_bounded_against_formatted_messages(logger):
    guard = logs.LogGuard(count=1, window=10.0, clock=Clock())
    capture(logger, guard)
    for i in range(3 * logs.MAX_TEMPLATES):
        logger.warning(f"refused {i}")
    assert len(guard._windows) <= logs.MAX_TEMPLATES


def test_install_writes_a_rotating_daemon_log(tmp_path, logger, monkeypatch):
    monkeypatch.setattr(logs, "LOG_FILE_BYTES", 4096)
    monkeypatch.setattr(logs, "LOG_FILE_BACKUPS", 2)
    logs.install(logger, tmp_path, console=False, guard=logs.LogGuard(count=10_000))
    for i in range(400):
        logger.info("line %d %s", i, "x" * 50)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["daemon.log", "daemon.log.1", "daemon.log.2"]
    assert all((tmp_path / f).stat().st_size <= 4096 for f in files)
    assert "line 399 " in (tmp_path / "daemon.log").read_text()

