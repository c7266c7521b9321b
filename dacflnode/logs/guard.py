"""The guard every record of the ``dacflnode`` logger tree passes: escaped values, rate-limited
repeats.

A node logs values that strangers choose (a Hello's ``node_id``, a push's ``sender``, a peer
address, the text of a refusal that quotes them). Written as they come, one newline forges a log
line, a terminal escape sequence rewrites the operator's screen, and a 100 KB id repeated a
thousand times grows the log by 100 MB. So every record passes one :class:`LogGuard` before any
handler writes it; no call site has to remember anything:

* **Values are escaped and truncated.** Each argument of a record is checked: numbers pass; a
  string (or bytes) that is printable and at most :data:`MAX_VALUE_CHARS` long passes unchanged,
  so ordinary lines read as they always did; any other string is written like ``%r`` (quoted,
  newlines and control characters as escapes) and cut at :data:`MAX_VALUE_CHARS` characters with
  a ``…[+N chars]`` marker. Other objects (exceptions, paths, lists) are judged by their
  ``str()``, with the larger bound :data:`MAX_OBJECT_CHARS`, since an exception's text is mostly
  the node's own explanation. The whole message is then checked the same way (a call site that
  formatted a value itself cannot smuggle a newline in either) and capped at
  :data:`MAX_MESSAGE_CHARS`. A logged line is therefore always one line. The fields a call site
  gives with ``extra=`` (:data:`FIELDS`) are checked the same way.
* **Repeats are rate-limited.** Records with the same logger and format string share a budget
  of :data:`RATE_LIMIT_COUNT` per :data:`RATE_LIMIT_WINDOW_S` seconds; the rest of the window's
  records are dropped and counted, and once the window is over one line says
  ``suppressed K similar messages, the last: <that record, formatted and escaped>``. A flood of
  refusals thus costs a bounded number of lines per format string, while rare messages are never
  delayed.

The guard is a :class:`logging.Filter` put on every handler of the tree (a filter on a *logger*
never sees the records of its children). A record is judged once, by the first handler that
sees it, and the verdict is stored on the record, so two handlers neither double-count nor
double-escape.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any

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

#: The fields a record may carry beside its message, given by the call site with
#: ``extra={"event": "push_refused", "node": ..., "round": t, "neighbour": peer, ...}``:
#:
#: ``event``
#:     a stable name for what happened (``push_refused``, ``state_missing``, ``neighbour_up``,
#:     …), lower case with underscores;
#: ``node``
#:     the node the line is about: the message does not name it, the text format writes it
#:     before the message (``"<node>: "``) and the JSON format as its own key;
#: ``round``
#:     the round the message is about (an integer);
#: ``neighbour``
#:     the neighbour it is about; where a message names several (a deadline nobody met), a
#:     list of their ids, written joined by ``", "``;
#: ``reason``
#:     on a refusal, its reason code (``round-passed``, ``not-neighbour``, … the
#:     :class:`~dacflnode.wire.errors.Reason` values of docs/wire-format.md).
FIELDS = ("node", "round", "neighbour", "event", "reason")
#: A record given ``extra={UNLIMITED: True}`` is not rate-limited: for lines the node writes at
#: its own pace (one per round), never because of what a peer sends.
UNLIMITED = "unlimited"

#: The guard's own line: how many records of one format string it dropped, and the last of them.
SUPPRESSED = "suppressed %d similar messages, the last: %s"
#: The event of that line.
SUPPRESSED_EVENT = "suppressed"

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
            summary.__dict__["event"] = SUPPRESSED_EVENT
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


def judged(record: logging.LogRecord) -> bool:
    """Whether a :class:`LogGuard` has judged (and so checked) ``record`` already."""
    return getattr(record, _VERDICT, None) is not None


def sanitize(record: logging.LogRecord) -> None:
    """Rewrite ``record`` in place: safe arguments and fields (:data:`FIELDS`), then a safe,
    one-line, bounded message."""
    args = record.args
    if isinstance(args, tuple):
        record.args = tuple(safe_arg(a) for a in args)
    elif isinstance(args, dict):
        record.args = {k: safe_arg(v) for k, v in args.items()}
    for name, value in record_fields(record).items():
        setattr(record, name, field_value(value))
    try:
        message = record.getMessage()
    except Exception:  # a format string that does not match its arguments: keep the parts
        message = f"{record.msg!r} % {record.args!r}"
    record.msg = one_line(message, MAX_MESSAGE_CHARS)
    record.args = None
    if record.exc_info and record.exc_info[1] is not None:  # also over a text cached by
        record.exc_text = format_exception(record.exc_info)  # a formatter that ran before


def record_fields(record: logging.LogRecord) -> dict[str, object]:
    """The :data:`FIELDS` of ``record`` that its call gave (with ``extra=``)."""
    return {name: value for name in FIELDS
            if (value := getattr(record, name, None)) is not None}


def field_value(value: object) -> object:
    """A field as JSON writes it: numbers as they are, a list of ids joined by ``", "``,
    anything else as checked text."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        value = ", ".join(map(str, value))
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
