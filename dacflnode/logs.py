"""The daemon's log, safe from what peers send: escaped values, rate-limited repeats, rotation.

A node logs values that strangers choose (a Hello's ``node_id``, a push's ``sender``, a peer
address, the text of a refusal that quotes them). Written as they come, one newline forges a log
line, a terminal escape sequence rewrites the operator's screen, and a 100 KB id repeated a
thousand times grows the log by 100 MB. So every record of the ``dacflnode`` logger tree passes
one :class:`LogGuard` before any handler writes it; no call site has to remember anything:

* **Values are escaped and truncated.** Each argument of a record is checked: numbers pass; a
  string (or bytes) that is printable and at most :data:`MAX_VALUE_CHARS` long passes unchanged,
  so ordinary lines read as they always did; any other string is written like ``%r`` (quoted,
  newlines and control characters as escapes) and cut at :data:`MAX_VALUE_CHARS` characters with
  a ``…[+N chars]`` marker. Other objects (exceptions, paths, lists) are judged by their
  ``str()``, with the larger bound :data:`MAX_OBJECT_CHARS`, since an exception's text is mostly
  the node's own explanation. The whole message is then checked the same way (a call site that
  formatted a value itself cannot smuggle a newline in either) and capped at
  :data:`MAX_MESSAGE_CHARS`. A logged line is therefore always one line.
* **Repeats are rate-limited.** Records with the same logger and format string share a budget
  of :data:`RATE_LIMIT_COUNT` per :data:`RATE_LIMIT_WINDOW_S` seconds; the rest of the window's
  records are dropped and counted, and once the window is over one line says
  ``suppressed K similar messages, the last: <that record, formatted and escaped>``. A flood of
  refusals thus costs a bounded number of lines per format string, while rare messages are never
  delayed.
* **The file rotates** at :data:`LOG_FILE_BYTES`, keeping :data:`LOG_FILE_BACKUPS` old files
  (``daemon.log.1`` …): at most 60 MB of log per state directory, whatever peers do.

The guard is a :class:`logging.Filter` put on every handler of the tree (a filter on a *logger*
never sees the records of its children). A record is judged once, by the first handler that
sees it, and the verdict is stored on the record, so two handlers neither double-count nor
double-escape.

**Two formats** (``dacflnode start --log-format``), for the console and the file alike:

* ``text`` (the default): :data:`LINE_FORMAT`, for people.
* ``json``: one JSON object per line, for log collectors, with every key of
  :data:`JSON_KEYS`, first and in that order:

  ``time``
      when the record was made, ISO 8601 in UTC with milliseconds (``2026-05-04T12:00:00.123Z``);
  ``level``, ``logger``
      ``INFO``, ``WARNING``, …; the logger's name (``dacflnode.node``, ``dacflnode.transport``);
  ``node``
      the node the line is about: the node a message names first, else the daemon's own id;
  ``round``
      the round the message is about (an integer), or null;
  ``neighbour``
      the neighbour it is about, or null; where a message names several (a deadline nobody
      met), their ids joined by ``", "``;
  ``event``
      a stable name for what happened (``push_refused``, ``state_missing``, ``neighbour_up``,
      …; the table :data:`EVENTS`), or null for a message that has none;
  ``reason``
      on a refusal, its reason code (``round-passed``, ``not-neighbour``, … the
      :class:`~dacflnode.wire.errors.Reason` values of docs/wire-format.md), else null;
  ``message``
      the line the text format writes after the logger's name, less a leading ``"<node>: "``
      where ``node`` names that node already;
  ``traceback``
      the traceback of a logged exception, or null.

  A line about a round's figures (the per-round line and the summary of
  :mod:`dacflnode.node.round_log`) carries them after these keys, as the keys of
  :data:`VALUE_KEYS` it has (``rounds``, ``accuracy``, ``loss``, ``exchange_s``, ``train_s``,
  ``used``, ``missing``, ``late``, ``bytes_sent``, ``bytes_received``, ``seconds``).

  A key of :data:`JSON_KEYS` whose value is not known is null, never left out. A call site can
  give the fields itself with ``extra={"round": t, "neighbour": peer, "event": "...", ...}``;
  otherwise they are read off the record's arguments by its format string, through
  :data:`EVENTS`. Fields are checked like arguments (a sender id with a newline is escaped and
  cut as in the message), and :func:`json.dumps` writes every control and non-ASCII character
  as a ``\\u`` escape, so a peer's value can neither end a JSON line nor reach the operator's
  terminal unescaped.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import logging.handlers
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from dacflnode.filemodes import LOG_MODE, open_text

#: Longest string value written as it is; longer ones are cut (``%r``-escaped) with a marker.
MAX_VALUE_CHARS = 100
#: Longest ``str()`` of any other argument (an exception's text), cut the same way.
MAX_OBJECT_CHARS = 400
#: Longest whole message (after formatting its arguments), cut the same way.
MAX_MESSAGE_CHARS = 2000
#: Lines of a logged traceback kept (each cut at :data:`MAX_OBJECT_CHARS`).
MAX_TRACEBACK_LINES = 200
#: Records per logger and format string let through in one window ...
RATE_LIMIT_COUNT = 10
#: ... of this many seconds.
RATE_LIMIT_WINDOW_S = 10.0
#: The number of distinct (logger, format string) windows remembered; format strings come
#: from the code, but one built from a peer's value (an f-string) must not grow the table.
MAX_TEMPLATES = 1024
#: Size at which ``daemon.log`` rotates, and how many rotated files are kept.
LOG_FILE_BYTES = 10 * 1024 * 1024
LOG_FILE_BACKUPS = 5
#: The daemon's line format: human-readable, one record per line.
LINE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: The formats :func:`install` writes (see the module docstring).
LOG_FORMATS = ("text", "json")
LogFormat = Literal["text", "json"]
#: The keys of every JSON line, in the order written.
JSON_KEYS = ("time", "level", "logger", "node", "round", "neighbour", "event", "reason",
             "message", "traceback")
#: The fields a record carries beside its message (``extra=``, or read off its arguments).
FIELDS = ("node", "round", "neighbour", "event", "reason")
#: Figures a record may carry with ``extra=`` (the per-round line and the summary of
#: :mod:`dacflnode.node.round_log`): a JSON line writes those it has after :data:`JSON_KEYS`.
VALUE_KEYS = ("rounds", "accuracy", "loss", "exchange_s", "train_s", "used", "missing", "late",
              "bytes_sent", "bytes_received", "seconds")
#: A record given ``extra={UNLIMITED: True}`` is not rate-limited: for lines the node writes at
#: its own pace (one per round), never because of what a peer sends.
UNLIMITED = "unlimited"

#: The guard's own line: how many records of one format string it dropped, and the last of them.
SUPPRESSED = "suppressed %d similar messages, the last: %s"


#: What the JSON format reads off a record, by the record's format string: its event name and,
#: per field, the index of the argument that holds it. (A call site may pass the fields with
#: ``extra=`` instead; those win.) tests/test_logs.py checks that every format string of the
#: package is here and every one here is still in the package.
EVENTS: Mapping[str, tuple[str, Mapping[str, int]]] = {
    # dacflnode.node: the runner
    "%s: stop requested in round %d (%s)": ("stop_requested", {"node": 0, "round": 1}),
    "%s: leave requested in round %d (%s)": ("leave_requested", {"node": 0, "round": 1}),
    "%s: all %d rounds done": ("rounds_done", {"node": 0, "round": 1}),
    "%s: stopped at round %d": ("stopped", {"node": 0, "round": 1}),
    "%s: neighbour %s is up": ("neighbour_up", {"node": 0, "neighbour": 1}),
    "%s: %s did not answer within %.0fs; going on without them (they join when they come up)":
        ("neighbours_silent", {"node": 0, "neighbour": 1}),
    "%s: could not pull a model from %s to join: %s":
        ("join_pull_failed", {"node": 0, "neighbour": 1}),
    "%s: joining at round %d from the round-%d model of %s":
        ("joining", {"node": 0, "round": 1, "neighbour": 3}),
    "%s: no neighbour handed a model; joining at round %d with its own":
        ("joining_alone", {"node": 0, "round": 1}),
    "%s: %s did not agree on the join: %s": ("join_refused", {"node": 0, "neighbour": 1}),
    "%s: re-anchored at round %d (x := %s; |x - %s| was %.3g)":
        ("reanchored", {"node": 0, "round": 1}),
    "%s: round %d: no state from %s by the deadline; mixing without them":
        ("state_missing", {"node": 0, "round": 1, "neighbour": 2}),
    "%s: %d one-sided uses left unsettled at the end (a neighbour did not answer the closing "
    "exchanges); dacflnode invariant settles them from its checkpoint":
        ("unsettled_at_end", {"node": 0}),
    "%s: asking %s whether it is there failed unexpectedly":
        ("probe_failed", {"node": 0, "neighbour": 1}),
    "%s: the checkpoint (round %d) is older than what its neighbours mixed of this node: its "
    "mass is unknown; it joins without it and proposes a re-anchor":
        ("stale_checkpoint", {"node": 0, "round": 1}),
    "%s: %s declared this node gone: it joins without its mass (the re-anchor takes it)":
        ("rejoin_after_gone", {"node": 0, "neighbour": 1}),
    "%s: the network re-anchored at round %s since this node's round %d: it joins with mass 0":
        ("rejoin_after_anchor", {"node": 0}),
    "%s: round %d: no closing state from %s":
        ("closing_state_missing", {"node": 0, "round": 1, "neighbour": 2}),
    "%s: %d one-sided uses unsettled at leave; re-anchor proposed":
        ("unsettled_at_leave", {"node": 0}),
    "%s: left the network at round %d; handed |x - %s| = %.3g to %s (heard from %d of %d)":
        ("left", {"node": 0, "round": 1, "neighbour": 4}),
    "%s: left at round %d with no neighbour to hand its share to":
        ("left_alone", {"node": 0, "round": 1}),
    "%s: round %d state not delivered to %s by the deadline":
        ("push_timeout", {"node": 0, "round": 1, "neighbour": 2}),
    "%s: %s refused round %d: %s (%s): %s":
        ("push_refused", {"node": 0, "neighbour": 1, "round": 2, "reason": 4}),
    "%s: pulled round %d state of %s": ("pulled", {"node": 0, "round": 1, "neighbour": 2}),
    "%s: pull of round %d from %s failed: %s":
        ("pull_failed", {"node": 0, "round": 1, "neighbour": 2}),
    "%s: pull of round %d from %s failed unexpectedly":
        ("pull_failed", {"node": 0, "round": 1, "neighbour": 2}),
    "%s: push of round %d to %s failed unexpectedly; retrying":
        ("push_failed", {"node": 0, "round": 1, "neighbour": 2}),
    "%s: handshake with %s failed unexpectedly": ("handshake_failed", {"node": 0, "neighbour": 1}),
    # dacflnode.node: the edges and the daemon
    "%s: round %d: %s did not mix this node's round-%d state; undid the one-sided use":
        ("one_sided_undone", {"node": 0, "round": 1, "neighbour": 2}),
    "%s: %s leaves the network (round %d)":
        ("neighbour_leaving", {"node": 0, "neighbour": 1, "round": 2}),
    "%s: took over the share of %s": ("handover_received", {"node": 0, "neighbour": 1}),
    "%s: re-anchor at round %d (heard from %s)":
        ("reanchor_heard", {"node": 0, "round": 1, "neighbour": 2}),
    "%s: heard of the round-%d re-anchor only in round %d; proposing round %d":
        ("reanchor_late", {"node": 0, "round": 2}),
    "%s: %s missed %d rounds in a row: declared gone; re-anchor at round %d":
        ("neighbour_gone", {"node": 0, "neighbour": 1}),
    "%s: the handover of %s did not come; re-anchor at round %d":
        ("handover_missing", {"node": 0, "neighbour": 1}),
    "%s: %d one-sided uses of %s could not be settled; re-anchor at round %d":
        ("unsettled", {"node": 0, "neighbour": 2}),
    "%s: edge to %s mixed from round %d":
        ("edge_active", {"node": 0, "neighbour": 1, "round": 2}),
    "%s: writing the %s to %s failed: %s; trying again in %.1fs": ("write_retry", {"node": 0}),
    "%s: resuming from round %d": ("resuming", {"node": 0, "round": 1}),
    "%s: %s: %s": ("signal", {"node": 0}),
    "%s: neighbours are not authenticated (no node.tls): anyone who reaches %s can push states "
    "in a neighbour's name or pull this node's model; set node.tls (see `dacflnode certs` and "
    "docs/security.md)": ("unauthenticated", {"node": 0}),
    "%s: Prometheus metrics on %s://%s/metrics (%s)": ("metrics_serving", {"node": 0}),
    "%s: control service on %s (%s, token required: %s)": ("control_serving", {"node": 0}),
    "%s: clipped mixing, radius %.6g": ("clipped_mixing", {"node": 0}),
    "metrics: cannot accept a connection: %s": ("metrics_accept_failed", {}),
    "metrics: refused a request without the bearer token of node.metrics_token":
        ("metrics_token_refused", {}),
    "%s: %s refused this node's round-%d state (%s); not retried":
        ("state_refused_by_neighbour", {"node": 0, "neighbour": 1, "round": 2, "reason": 3}),
    "%s: round %d: pulled the full public copy of %s":
        ("copy_pulled", {"node": 0, "round": 1, "neighbour": 2}),
    "%s: round %d: the update of %s cannot be applied: %s":
        ("copy_update_refused", {"node": 0, "round": 1, "neighbour": 2}),
    "%s: round %d: could not pull the public copy of %s: %s; not mixed this round":
        ("copy_pull_failed", {"node": 0, "round": 1, "neighbour": 2}),
    "%s: round %d: the public copy of %s is refused: %s":
        ("copy_refused", {"node": 0, "round": 1, "neighbour": 2}),
    "%s: compression %s, CHOCO step %g": ("compression", {"node": 0}),
    "%s: refused the round-%d state of %s (%s); the round goes on without it":
        ("state_refused", {"node": 0, "round": 1, "neighbour": 2, "reason": 3}),
    "%s: edge to %s quarantined in round %d after %d refused states; it is not mixed again in "
    "this run; re-anchor at round %d": ("quarantined", {"node": 0, "neighbour": 1, "round": 2}),
    "%s: serving neighbours on %s with %s (round %d of %d, %s on %s)":
        ("serving", {"node": 0, "round": 3}),
    "%s: grpc.health.v1 alone, in plaintext, on %s": ("health_serving", {"node": 0}),
    "%s: left the network after round %d": ("left", {"node": 0, "round": 1}),
    "%s: %s": ("failed", {"node": 0}),
    "%s: cannot start: %s": ("start_failed", {"node": 0}),
    "%s: run complete: %d/%d rounds; final model %s": ("run_complete", {"node": 0, "round": 1}),
    "%s: round %d/%d: %s; exchange %.2fs, train %.2fs; neighbours used %s, missing %s, late %s; "
    "sent %s, received %s": ("round", {"node": 0, "round": 1}),
    "%s: finished %d/%d rounds in %s; final accuracy %s; sent %s, received %s":
        ("summary", {"node": 0, "round": 1}),
    "%s: the final model %s %s: writing it again from the checkpoint":
        ("final_rewritten", {"node": 0}),
    "%s %s; resuming from the previous checkpoint %s (round %d) instead%s":
        ("checkpoint_fallback", {"round": 3}),
    "%s was written without a checksum (by an older dacflnode): it is used unverified; the "
    "next checkpoint carries one": ("checkpoint_unverified", {}),
    "open-files limit %d (was %d)": ("open_files_limit", {}),
    "%s: GRPC_VERBOSITY=%s hides failed TLS handshakes: they are neither counted nor logged; "
    "unset it to see them": ("tls_handshakes_hidden", {"node": 0}),
    "%s: TLS handshake failed (%s): %s": ("tls_handshake_failed", {"node": 0, "reason": 1}),
    "%s: failed TLS handshakes are not counted: cannot start the relay of stderr: %s":
        ("tls_handshakes_hidden", {"node": 0}),
    "%s: the state folder %s is open to other users (mode %03o) and cannot be changed (%s): "
    "make it the node user's own with mode 0700 (`chmod 700 %s`)":
        ("state_dir_open", {"node": 0}),
    "%s: the state folder %s was open to other users (mode %03o): set to %03o":
        ("state_dir_tightened", {"node": 0}),
    "%s: %d training samples (%s), %d test samples; data contract: %s":
        ("data_loaded", {"node": 0}),
    "%s: %d undecodable files skipped (bad_files: skip)": ("data_files_skipped", {}),
    "metrics: could not refresh the status": ("status_failed", {}),
    # dacflnode.transport and dacflnode.control: refusals of what peers and callers send
    "%s from %r (peer %r, round %d) refused: %s: %s (%s)":
        ("{0}_refused", {"neighbour": 1, "round": 3, "reason": 6}),
    "control call from %.100r refused: missing or wrong token%s": ("control_refused", {}),
    # dacflnode.learning
    "no Dirichlet(%g) draw gave all %d nodes at least %d samples in %d tries; moving samples "
    "from the largest nodes to the smallest": ("partition_rebalanced", {}),
    "%s: %d decoded images read from the cache": ("data_cache_hit", {}),
    "could not cache the decoded images in %s: %s": ("data_cache_unwritable", {}),
    # this module
    SUPPRESSED: ("suppressed", {}),
}

_VERDICT = "_dacflnode_guard"


class _Escaped(str):
    """A value already written as ``%r`` would write it: ``%r`` must not quote it again."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str(self)


def escape(text: str, limit: int = MAX_VALUE_CHARS) -> str:
    """``text`` unchanged if it is printable and at most ``limit`` characters; otherwise its
    ``repr`` (one line, control characters escaped), cut after ``limit`` characters with a
    ``…[+N chars]`` marker naming how much was left out."""
    if isinstance(text, _Escaped) or (len(text) <= limit and text.isprintable()):
        return text
    shown = repr(text[:limit])
    if len(shown) > limit + 2:  # escapes made it longer: cut the escaped form, keep the quote
        shown = shown[: limit + 1] + shown[0]
    if len(text) > limit:
        shown += f"…[+{len(text) - limit} chars]"
    return _Escaped(shown)


def one_line(text: str, limit: int) -> str:
    """``text`` with every unprintable character (newline, escape, …) written as its escape
    sequence, cut after ``limit`` characters with a ``…[+N chars]`` marker; no quotes added."""
    if len(text) <= limit and text.isprintable():
        return text
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[: limit + 1])
    if len(out) > limit or len(text) > limit:
        return out[:limit] + f"…[+{len(text) - min(len(text), limit)} chars]"
    return out


def safe_arg(value: object) -> object:
    """One argument of a log record, made safe to write (see the module docstring)."""
    if value is None or isinstance(value, (bool, int, float, _Escaped)):
        return value
    if isinstance(value, str):
        return escape(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return escape(repr(bytes(value[: MAX_VALUE_CHARS + 1])))
    try:
        text = str(value)
    except Exception:  # a broken __str__ must not lose the record
        return _Escaped(f"<unprintable {type(value).__name__}>")
    if len(text) <= MAX_OBJECT_CHARS and text.isprintable():
        return value  # keeps %r and %d working on the object itself
    return escape(text, MAX_OBJECT_CHARS)


class _Window:
    __slots__ = ("last", "level", "logger", "passed", "start", "suppressed", "template")

    def __init__(self, logger: str, level: int, template: str, start: float) -> None:
        self.logger, self.level, self.template = logger, level, template
        self.start, self.passed, self.suppressed = start, 0, 0
        #: the arguments of the last record dropped (formatted into the summary)
        self.last: Any = None

    def summary(self) -> tuple[str, int, str, Any, int]:
        return self.logger, self.level, self.template, self.last, self.suppressed


class LogGuard(logging.Filter):
    """Escapes, truncates and rate-limits every record it sees (see the module docstring)."""

    def __init__(self, count: int = RATE_LIMIT_COUNT, window: float = RATE_LIMIT_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.count = count
        self.window = window
        self._clock = clock
        self._windows: dict[tuple[str, str], _Window] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        verdict = getattr(record, _VERDICT, None)
        if verdict is not None:
            return bool(verdict)
        now = self._clock()
        key = (record.name, str(record.msg))
        with self._lock:
            due = self._expired(now)
            w = self._windows.get(key)
            if w is None:
                w = self._windows[key] = _Window(record.name, record.levelno, key[1], now)
            elif now - w.start >= self.window:
                if w.suppressed:
                    due.append(w.summary())
                w.start, w.passed, w.suppressed = now, 0, 0
            allowed = w.passed < self.count or bool(getattr(record, UNLIMITED, False))
            if allowed:
                w.passed += 1
            else:
                w.suppressed += 1
                w.last = record.args
        for logger, level, template, args, k in due:  # outside the lock: these records pass
            last = logging.LogRecord(logger, level, __file__, 0, template, args, None)
            sanitize(last)  # the last dropped record, formatted as it would have been written
            summary = logging.LogRecord(logger, level, __file__, 0, SUPPRESSED,
                                        (k, _Escaped(last.getMessage())), None)
            setattr(summary, _VERDICT, True)
            sanitize(summary)
            logging.getLogger(logger).handle(summary)
        setattr(record, _VERDICT, allowed)
        if allowed:
            sanitize(record)
        return allowed

    def _expired(self, now: float) -> list[tuple[str, int, str, Any, int]]:
        """Windows that ended with suppressed records (reported now) or that can be forgotten."""
        due = []
        for key, w in list(self._windows.items()):
            if now - w.start < self.window:
                continue
            if w.suppressed:
                due.append(w.summary())
                w.start, w.passed, w.suppressed = now, 0, 0
            elif len(self._windows) > MAX_TEMPLATES // 2:
                del self._windows[key]
        if len(self._windows) >= MAX_TEMPLATES:  # all windows live: forget the oldest
            oldest = min(self._windows, key=lambda k: self._windows[k].start)
            del self._windows[oldest]
        return due


def sanitize(record: logging.LogRecord) -> None:
    """Rewrite ``record`` in place: safe arguments and fields (:data:`FIELDS`, read off the
    arguments where the call did not give them), then a safe, one-line, bounded message."""
    args = record.args
    if isinstance(args, tuple):
        record.args = tuple(safe_arg(a) for a in args)
    elif isinstance(args, dict):
        record.args = {k: safe_arg(v) for k, v in args.items()}
    for name, value in record_fields(record).items():
        setattr(record, name, _field_value(value))
    try:
        message = record.getMessage()
    except Exception:  # a format string that does not match its arguments: keep the parts
        message = f"{record.msg!r} % {record.args!r}"
    record.msg = one_line(message, MAX_MESSAGE_CHARS)
    record.args = None
    if record.exc_info and record.exc_info[1] is not None:  # also over a text cached by
        record.exc_text = format_exception(record.exc_info)  # a formatter that ran before


def record_fields(record: logging.LogRecord) -> dict[str, object]:
    """The :data:`FIELDS` of ``record`` that are known: those the call gave with ``extra=``, else
    those :data:`EVENTS` reads off its arguments (before :func:`sanitize` has formatted them)."""
    fields = {name: getattr(record, name) for name in FIELDS
              if getattr(record, name, None) is not None}
    spec = EVENTS.get(record.msg) if isinstance(record.msg, str) else None
    args = record.args if isinstance(record.args, tuple) else ()
    if spec is not None and args:
        event, positions = spec
        if "event" not in fields:
            try:
                fields["event"] = event.format(*args)
            except (IndexError, KeyError, ValueError):
                fields["event"] = event
        for name, index in positions.items():
            value = args[index] if index < len(args) else None
            if name == "round" and isinstance(value, int) and value < 0:
                value = None  # a refused Hello is about no round (the receiver writes -1)
            if name not in fields and value is not None:
                fields[name] = value
    elif spec is not None:
        fields.setdefault("event", spec[0])
    return fields


def _field_value(value: object) -> object:
    """A field as JSON writes it: numbers as they are, anything else as checked text."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    safe = safe_arg(value if isinstance(value, str) else str(value))
    return str(safe) if isinstance(safe, str) else safe


def format_exception(
    exc_info: tuple[type[BaseException], BaseException, TracebackType | None]
    | tuple[None, None, None],
) -> str:
    """A traceback for the log whose exception messages are one line each (a message quoting a
    peer's value cannot add a line), every line cut, at most :data:`MAX_TRACEBACK_LINES`."""
    if exc_info[1] is None:
        return ""
    te = traceback.TracebackException(type(exc_info[1]), exc_info[1], exc_info[2])
    todo, seen = [te], set()
    while todo:  # the exception and its causes and contexts
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        message = getattr(t, "_str", None)  # what format_exception_only prints after "Type: "
        if isinstance(message, str):
            t._str = one_line(message, MAX_OBJECT_CHARS)  # type: ignore[attr-defined]
        todo.extend(x for x in (t.__cause__, t.__context__) if x is not None)
    lines = "".join(te.format()).splitlines()
    if len(lines) > MAX_TRACEBACK_LINES:
        lines = [*lines[: MAX_TRACEBACK_LINES // 2], f"…[{len(lines) - MAX_TRACEBACK_LINES} "
                 "lines]", *lines[-MAX_TRACEBACK_LINES // 2 :]]
    return "\n".join(one_line(line, MAX_OBJECT_CHARS) for line in lines)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line, with the keys :data:`JSON_KEYS` (see the module
    docstring); ``node`` is the id written where a record names no node."""

    def __init__(self, node: str | None = None) -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        if getattr(record, _VERDICT, None) is None:  # not through a guard: check it here
            sanitize(record)
        fields = {name: _field_value(value) for name, value in record_fields(record).items()}
        created = dt.datetime.fromtimestamp(record.created, tz=dt.UTC)
        tb = record.exc_text or (format_exception(record.exc_info) if record.exc_info else "")
        line = {
            "time": created.strftime("%Y-%m-%dT%H:%M:%S.") + f"{created.microsecond // 1000:03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "node": fields.get("node", self.node),
            "round": fields.get("round"),
            "neighbour": fields.get("neighbour"),
            "event": fields.get("event"),
            "reason": fields.get("reason"),
            "message": _without_node(one_line(record.getMessage(), MAX_MESSAGE_CHARS),
                                     fields.get("node", self.node)),
            "traceback": tb or None,
        }
        for name in VALUE_KEYS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = ([_field_value(v) for v in value] if isinstance(value, list)
                              else _field_value(value))
        return json.dumps(line, ensure_ascii=True, default=str)


def _without_node(message: str, node: object) -> str:
    """``message`` without a leading ``"<node>: "`` where ``node`` is the record's node field
    (the JSON line names it already)."""
    if isinstance(node, str) and node and message.startswith(node + ": "):
        return message[len(node) + 2:]
    return message


def make_formatter(log_format: LogFormat, node: str | None = None) -> logging.Formatter:
    """The formatter of ``log_format`` (one of :data:`LOG_FORMATS`)."""
    if log_format == "json":
        return JsonFormatter(node)
    if log_format == "text":
        return logging.Formatter(LINE_FORMAT)
    raise ValueError(f"log format {log_format!r} is not one of {', '.join(LOG_FORMATS)}")


class _ModeRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """A rotating log whose every file, the first and each one a rollover starts, is created
    with :data:`~dacflnode.filemodes.LOG_MODE` whatever the umask."""

    def _open(self) -> Any:
        return open_text(self.baseFilename, LOG_MODE, append="a" in self.mode)


def install(logger: logging.Logger, state_dir: Path, *, console: bool = True,
            guard: LogGuard | None = None, log_format: LogFormat = "text",
            node: str | None = None) -> LogGuard:
    """Log ``logger``'s tree to ``state_dir/daemon.log`` (rotating) and, with ``console``, to
    stderr, every record through one :class:`LogGuard`, in ``log_format`` (``node``: the id a
    JSON line names when its record names none); returns the guard."""
    guard = guard or LogGuard()
    fmt = make_formatter(log_format, node)
    handlers: list[logging.Handler] = [_ModeRotatingFileHandler(
        state_dir / "daemon.log", maxBytes=LOG_FILE_BYTES, backupCount=LOG_FILE_BACKUPS,
        encoding="utf-8")]
    if console:
        handlers.insert(0, logging.StreamHandler())
    for handler in handlers:
        handler.setFormatter(fmt)
        handler.addFilter(guard)
        logger.addHandler(handler)
    return guard
