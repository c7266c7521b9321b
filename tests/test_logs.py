"""The daemon's log guard: peers' values cannot forge or flood a log line; the file rotates; the
JSON format is one parseable object per line with the same guard."""

from __future__ import annotations

import ast
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from dacflnode import logs
from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode._proto.dacfl.v1 import neighbor_pb2_grpc
from dacflnode.cluster.launcher import free_ports
from dacflnode.daemon.service import setup_logging
from dacflnode.transport.base import Identity, Inbox
from dacflnode.transport.receiver import Receiver
from dacflnode.wire.errors import Reason, WireError
from dacflnode.wire.message import PROTOCOL_VERSION


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
    h.setFormatter(logs.LineFormatter())
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
    assert lines[3].endswith("suppressed 47 similar messages, the last: hello from 'n49' "
                             "refused")
    assert "%" not in lines[3]
    assert lines[4].endswith("hello from 'late' refused")
    assert len(lines) == 5


def test_the_summary_formats_the_last_dropped_record_escaped_like_any_other(logger):
    """A refusal flood summarised: the format string is filled in, and what a peer sent is
    still escaped and cut (no newline, no 10 KB id), in the summary as in the records."""
    clock = Clock()
    lines = capture(logger, logs.LogGuard(count=1, window=10.0, clock=clock))
    template = "%s from %r (peer %r, round %d) refused: %s: %s (%s)"
    for i in range(11):
        logger.warning(template, "push", "node-9\nforged" + "x" * 10_000, "ipv4:10.0.0.9:1",
                       i, "FAILED_PRECONDITION", "not a neighbour", "not-neighbour")
    clock.now += 10.0
    logger.info("later")
    summary = lines[1]
    assert "suppressed 10 similar messages, the last: push from " in summary
    assert "(peer 'ipv4:10.0.0.9:1', round 10) refused: FAILED_PRECONDITION: not a " \
        "neighbour (not-neighbour)" in summary
    assert "%" not in summary and "\n" not in summary and "node-9\\nforged" in summary
    assert len(summary) < 600 and "chars]" in summary


def test_a_summary_is_written_when_any_later_record_arrives(logger):
    clock = Clock()
    lines = capture(logger, logs.LogGuard(count=1, window=10.0, clock=clock))
    for _ in range(5):
        logger.warning("flood")
    clock.now += 11.0
    logger.info("something else")
    assert [line.split(": ", 1)[1] for line in lines] == [
        "flood", "suppressed 4 similar messages, the last: flood", "something else"]


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
    monkeypatch.setattr(logs.handlers, "LOG_FILE_BYTES", 4096)
    monkeypatch.setattr(logs.handlers, "LOG_FILE_BACKUPS", 2)
    logs.install(logger, tmp_path, console=False, guard=logs.LogGuard(count=10_000))
    for i in range(400):
        logger.info("line %d %s", i, "x" * 50)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["daemon.log", "daemon.log.1", "daemon.log.2"]
    assert all((tmp_path / f).stat().st_size <= 4096 for f in files)
    assert "line 399 " in (tmp_path / "daemon.log").read_text()



# ---------------------------------------------------------------- --log-format json
HOSTILE = "evil\n2026-01-01 INFO forged\x1b[2J\"}{\"event\": \"x"


def json_lines(path: Path) -> list[dict[str, object]]:
    """Every line of the file, each parsed on its own (a line that is not one JSON object fails)."""
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture
def json_daemon_log(tmp_path: Path) -> Iterator[Path]:
    """The daemon's own logging setup (``start --log-format json``) for node ``bob``, undone
    after."""
    root = logging.getLogger("dacflnode")
    before = (list(root.handlers), root.level)
    setup_logging(tmp_path, "INFO", "json", node="bob")
    try:
        yield tmp_path / "daemon.log"
    finally:
        for h in list(root.handlers):
            if h not in before[0]:
                root.removeHandler(h)
                h.close()
        root.setLevel(before[1])


async def test_every_line_of_a_json_daemon_log_parses_with_every_key(json_daemon_log):
    receiver = Receiver(Identity("bob", "m", "r"),
                        Inbox(senders=frozenset({"alice"}), current_round=lambda: 3), {}, {})
    for claimed in (HOSTILE, "A" * 100_000):  # a stranger's Hello, through the real receiver
        with pytest.raises(WireError):
            receiver.hello(pb.HelloRequest(node_id=claimed, protocol_version=PROTOCOL_VERSION,
                                           model_fingerprint="m", run_fingerprint="r"))
    node_log = logging.getLogger("dacflnode.protocol.runner")
    node_log.warning("round %d: no state from %s by the deadline; mixing without them",
                     4, "alice, carol", extra={"event": "state_missing", "node": "bob",
                                                      "round": 4, "neighbour": ["alice", "carol"]})
    node_log.info("neighbour %s is up", HOSTILE,
                  extra={"event": "neighbour_up", "node": "bob", "neighbour": HOSTILE})
    node_log.info("custom %s", "line", extra={"round": 7, "neighbour": HOSTILE, "event": "mine"})
    try:
        raise ValueError(HOSTILE)
    except ValueError:
        node_log.exception("%s", "failed\nforged", extra={"event": "failed",
                                                                     "node": "bob"})
    for _ in range(3 * logs.RATE_LIMIT_COUNT):  # a flood: rate-limited as the text format is
        node_log.warning("%s refused round %d: %s (%s): %s", "carol", 5,
                         "ABORTED", Reason.ROUND_PASSED, "too late",
                         extra={"event": "push_refused", "node": "bob", "round": 5,
                                "neighbour": "carol", "reason": Reason.ROUND_PASSED})

    lines = json_lines(json_daemon_log)
    assert all(list(line) == list(logs.JSON_KEYS) for line in lines)
    assert all(isinstance(line["time"], str) and line["time"].endswith("Z") for line in lines)
    raw = json_daemon_log.read_text(encoding="utf-8")
    assert "\x1b" not in raw and raw.count("\n") == len(lines)
    by_event: dict[object, list[dict[str, object]]] = {}
    for line in lines:
        by_event.setdefault(line["event"], []).append(line)

    hostile, long_id = by_event["hello_refused"]
    assert (hostile["node"], hostile["round"], hostile["reason"]) == ("bob", None, "not-neighbour")
    assert hostile["level"] == "WARNING" and hostile["logger"] == "dacflnode.transport.receiver"
    assert hostile["neighbour"] == repr(HOSTILE)  # escaped as in the text format, then JSON
    assert repr(HOSTILE) in str(hostile["message"])
    assert len(str(long_id["neighbour"])) < logs.MAX_VALUE_CHARS + 30
    assert "…[+" in str(long_id["neighbour"])

    (missing,) = by_event["state_missing"]
    assert (missing["node"], missing["round"], missing["neighbour"]) == ("bob", 4, "alice, carol")
    (up,) = by_event["neighbour_up"]
    assert up["neighbour"] == repr(HOSTILE) and up["round"] is None and up["reason"] is None
    (mine,) = by_event["mine"]
    assert (mine["round"], mine["neighbour"], mine["message"]) == (7, repr(HOSTILE), "custom line")
    (failed,) = by_event["failed"]
    assert failed["level"] == "ERROR" and failed["message"] == repr("failed\nforged")
    assert str(failed["traceback"]).startswith("Traceback (most recent call last):")
    assert str(failed["traceback"]).endswith("ValueError: " + logs.one_line(HOSTILE, 400))
    refused = by_event["push_refused"]
    assert len(refused) == logs.RATE_LIMIT_COUNT
    assert (refused[0]["neighbour"], refused[0]["round"], refused[0]["reason"]) == (
        "carol", 5, "round-passed")
    (limit,) = by_event["open_files_limit"]
    assert limit["node"] == "bob"  # named by the daemon where the message names no node


def test_the_json_format_is_one_line_without_a_guard_too():
    record = logging.LogRecord("dacflnode.x", logging.INFO, __file__, 1, "a %s", (HOSTILE,), None)
    line = logs.JsonFormatter(node="n").format(record)
    assert "\n" not in line and "\x1b" not in line
    assert json.loads(line)["message"] == "a " + repr(HOSTILE)


def test_the_text_format_is_unchanged_by_the_fields(tmp_path, logger):
    logs.install(logger, tmp_path, console=False)
    logger.info("%s: neighbour %s is up", "bob", "alice", extra={"round": 3})
    (line,) = (tmp_path / "daemon.log").read_text().splitlines()
    assert line.endswith(f"INFO {logger.name}: bob: neighbour alice is up")


LEVELS = {"debug", "info", "warning", "error", "exception", "critical", "log"}


def logging_calls() -> Iterator[tuple[str, ast.Call]]:
    """``(where, call)`` for every logging call of the package: a level method called on a
    name ending in ``log`` or ``logger``."""
    package = Path(logs.__file__).parent.parent
    for path in sorted(package.rglob("*.py")):
        if "_proto" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in LEVELS and isinstance(node.func.value, ast.Name)
                    and node.func.value.id.lower().endswith(("log", "logger"))):
                yield f"{path.relative_to(package.parent)}:{node.lineno}", node


def test_the_package_has_logging_calls_to_check():
    assert sum(1 for _ in logging_calls()) >= 60


def test_every_logging_call_names_its_event_and_gives_only_known_fields():
    """What the JSON format writes of a line comes from its call site: a line without an event
    (a refusal quoting a peer's id, say) could not be told apart by a log collector, and a
    misspelt field would silently be left out of every JSON line."""
    allowed = {*logs.FIELDS, *logs.VALUE_KEYS, logs.UNLIMITED}
    no_event, unknown, bad_name = [], [], []
    for where, call in logging_calls():
        extra = next((k.value for k in call.keywords if k.arg == "extra"), None)
        if not isinstance(extra, ast.Dict):
            no_event.append(where)
            continue
        fields = {ast.literal_eval(k): v for k, v in zip(extra.keys, extra.values, strict=True)
                  if k is not None}
        unknown += [f"{where} {name!r}" for name in fields if name not in allowed]
        event = fields.get("event")
        if event is None:
            no_event.append(where)
        elif isinstance(event, ast.Constant):
            if not (isinstance(event.value, str) and event.value.isidentifier()
                    and event.value == event.value.lower()):
                bad_name.append(where)
        elif not isinstance(event, ast.JoinedStr):  # f"{call}_refused": still named here
            bad_name.append(where)
    assert no_event == [], f"give these logging calls extra={{'event': '<what_happened>', ...}} " \
                           f"with the node, round, neighbour and reason they are about: {no_event}"
    assert unknown == [], f"not a field of dacflnode.logs.FIELDS or VALUE_KEYS: {unknown}"
    assert bad_name == [], f"an event is a lower-case name with underscores: {bad_name}"


def test_the_text_line_names_the_node_before_the_message_and_the_json_line_as_its_key(
        logger, tmp_path):
    lines = capture(logger, logs.LogGuard())
    logs.install(logger, tmp_path, console=False, log_format="json", node="bob")
    logger.warning("round %d: no state from %s", 4, "alice", extra={"event": "state_missing",
                   "node": "carol", "round": 4, "neighbour": "alice"})
    logger.info("no node named", extra={"event": "plain"})
    assert lines[0].endswith(f" WARNING {logger.name}: carol: round 4: no state from alice")
    assert lines[1].endswith(f" INFO {logger.name}: no node named")
    first, second = json_lines(tmp_path / "daemon.log")
    assert (first["node"], first["message"]) == ("carol", "round 4: no state from alice")
    assert (second["node"], second["message"]) == ("bob", "no node named")


def test_a_console_for_in_process_nodes_shows_each_warning_after_its_node_once(logger, capsys):
    first = logs.log_to_console(logger)
    assert logs.log_to_console(logger) is first  # a second command in one process adds none
    logger.warning("round %d: no state from %s", 2, "alice", extra={"node": "bob"})
    logger.info("not shown", extra={"node": "bob"})
    assert capsys.readouterr().err == "bob: round 2: no state from alice\n"


def test_no_log_call_writes_its_node_into_the_message_too():
    """The node a line is about is given once, as ``extra={"node": ...}``; the formats write it
    (a ``"%s: "`` prefix with the same value would print it twice in the text format)."""
    package = Path(logs.__file__).parent.parent
    doubled = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("debug", "info", "warning", "error", "exception")
                    and node.args and isinstance(node.args[0], ast.Constant)):
                continue
            extra = next((k.value for k in node.keywords if k.arg == "extra"), None)
            names_node = isinstance(extra, ast.Dict) and any(
                isinstance(k, ast.Constant) and k.value == "node" for k in extra.keys)
            if names_node and str(node.args[0].value).startswith("%s: "):
                doubled.append(f"{path.relative_to(package.parent)}:{node.lineno}")
    assert doubled == []


def test_every_module_logs_under_its_own_name():
    """``logging.getLogger(__name__)``: the JSON ``logger`` key and the text line name the module
    that logged; only the daemon's setup addresses the tree's root, ``dacflnode``."""
    package = Path(logs.__file__).parent.parent
    named = []
    for path in sorted(package.rglob("*.py")):
        if "_proto" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "getLogger" and node.args
                    and isinstance(node.args[0], ast.Constant)  # a name written by hand
                    and node.args[0].value != "dacflnode"):
                named.append(f"{path.relative_to(package.parent)}:{node.lineno}")
    assert named == []


def test_a_line_about_several_neighbours_names_them_joined(logger, tmp_path):
    logs.install(logger, tmp_path, console=False, log_format="json", node="bob")
    logger.warning("round %d: no closing state from %s", 3, "alice, carol",
                   extra={"event": "closing_state_missing", "node": "bob", "round": 3,
                          "neighbour": ["alice", "carol\nforged"]})
    (line,) = json_lines(tmp_path / "daemon.log")
    assert line["neighbour"] == repr("alice, carol\nforged")
    assert (line["node"], line["round"], line["message"]) == (
        "bob", 3, "round 3: no closing state from alice, carol")


def test_the_guard_s_summary_line_names_its_event(logger, tmp_path):
    clock = Clock()
    logs.install(logger, tmp_path, console=False, log_format="json",
                 guard=logs.LogGuard(count=1, window=10.0, clock=clock))
    for _ in range(3):
        logger.warning("flood", extra={"event": "flood"})
    clock.now += 10.0
    logger.info("later", extra={"event": "later"})
    assert [line["event"] for line in json_lines(tmp_path / "daemon.log")] == [
        "flood", logs.SUPPRESSED_EVENT, "later"]


FAST_RECONNECT = [("grpc.initial_reconnect_backoff_ms", 100),
                  ("grpc.min_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 100)]


@pytest.mark.slow
def test_a_real_daemon_with_json_logs_writes_one_object_per_line_despite_a_hostile_hello(
        tmp_path):
    """``dacflnode start --log-format json`` as a process: a stranger's Hello whose id holds a
    newline and an escape sequence is refused and logged; the neighbour never answers, so the
    node ends soon after; every line of its daemon.log, and of its stderr, parses on its own."""
    listen, control, silent = free_ports(3)
    (tmp_path / "node-0.yaml").write_text(yaml.safe_dump({
        "node": {"id": "node-0", "listen": f"127.0.0.1:{listen}",
                 "control": f"127.0.0.1:{control}", "share": 0},
        "neighbours": [{"id": "node-1", "address": f"127.0.0.1:{silent}"}],
        "run": {"dataset": "synthetic", "model": "mlp", "nodes": 2, "rounds": 1, "lr": 0.05,
                "round_deadline": 1, "hello_timeout": 5}}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "dacflnode", "start", "--peers", str(tmp_path / "node-0.yaml"),
         "--log-format", "json"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # the daemon serves only while it waits for its neighbour: connect every 100 ms, so
        # that a slow start (torch's import under load) does not fall between two backoffs
        with grpc.insecure_channel(f"127.0.0.1:{listen}", options=FAST_RECONNECT) as channel:
            grpc.channel_ready_future(channel).result(timeout=60)
            with pytest.raises(grpc.RpcError) as refused:
                neighbor_pb2_grpc.NeighborStub(channel).Hello(pb.HelloRequest(
                    node_id=HOSTILE, protocol_version=PROTOCOL_VERSION), timeout=10)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    lines = json_lines(tmp_path / "node-0" / "daemon.log")
    assert [json.loads(x) for x in stderr.decode().splitlines()] == lines  # the console too
    keys = list(logs.JSON_KEYS)
    assert all(list(line)[: len(keys)] == keys and line["node"] == "node-0" for line in lines)
    events = {str(line["event"]): line for line in lines}
    assert {"serving", "hello_refused"} <= set(events)
    assert events["hello_refused"]["neighbour"] == repr(HOSTILE)
    assert events["hello_refused"]["reason"] == "not-neighbour"
