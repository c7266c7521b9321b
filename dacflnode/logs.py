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
  ``suppressed K similar messages: <format string>``. A flood of refusals thus costs a bounded
  number of lines per format string, while rare messages are never delayed.
* **The file rotates** at :data:`LOG_FILE_BYTES`, keeping :data:`LOG_FILE_BACKUPS` old files
  (``daemon.log.1`` …): at most 60 MB of log per state directory, whatever peers do.

The guard is a :class:`logging.Filter` put on every handler of the tree (a filter on a *logger*
never sees the records of its children). A record is judged once, by the first handler that
sees it, and the verdict is stored on the record, so two handlers neither double-count nor
double-escape.
"""

from __future__ import annotations

import logging
import logging.handlers
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

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
    __slots__ = ("level", "logger", "passed", "start", "suppressed", "template")

    def __init__(self, logger: str, level: int, template: str, start: float) -> None:
        self.logger, self.level, self.template = logger, level, template
        self.start, self.passed, self.suppressed = start, 0, 0


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
                    due.append((w.logger, w.level, w.template, w.suppressed))
                w.start, w.passed, w.suppressed = now, 0, 0
            allowed = w.passed < self.count
            if allowed:
                w.passed += 1
            else:
                w.suppressed += 1
        for logger, level, template, k in due:  # outside the lock: these records pass here
            summary = logging.LogRecord(logger, level, __file__, 0,
                                        "suppressed %d similar messages: %s",
                                        (k, template), None)
            setattr(summary, _VERDICT, True)
            sanitize(summary)
            logging.getLogger(logger).handle(summary)
        setattr(record, _VERDICT, allowed)
        if allowed:
            sanitize(record)
        return allowed

    def _expired(self, now: float) -> list[tuple[str, int, str, int]]:
        """Windows that ended with suppressed records (reported now) or that can be forgotten."""
        due = []
        for key, w in list(self._windows.items()):
            if now - w.start < self.window:
                continue
            if w.suppressed:
                due.append((w.logger, w.level, w.template, w.suppressed))
                w.start, w.passed, w.suppressed = now, 0, 0
            elif len(self._windows) > MAX_TEMPLATES // 2:
                del self._windows[key]
        if len(self._windows) >= MAX_TEMPLATES:  # all windows live: forget the oldest
            oldest = min(self._windows, key=lambda k: self._windows[k].start)
            del self._windows[oldest]
        return due


def sanitize(record: logging.LogRecord) -> None:
    """Rewrite ``record`` in place: safe arguments, then a safe, one-line, bounded message."""
    args = record.args
    if isinstance(args, tuple):
        record.args = tuple(safe_arg(a) for a in args)
    elif isinstance(args, dict):
        record.args = {k: safe_arg(v) for k, v in args.items()}
    try:
        message = record.getMessage()
    except Exception:  # a format string that does not match its arguments: keep the parts
        message = f"{record.msg!r} % {record.args!r}"
    record.msg = one_line(message, MAX_MESSAGE_CHARS)
    record.args = None
    if record.exc_info and record.exc_info[1] is not None:  # also over a text cached by
        record.exc_text = format_exception(record.exc_info)  # a formatter that ran before


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


def install(logger: logging.Logger, state_dir: Path, *, console: bool = True,
            guard: LogGuard | None = None) -> LogGuard:
    """Log ``logger``'s tree to ``state_dir/daemon.log`` (rotating) and, with ``console``, to
    stderr, every record through one :class:`LogGuard`; returns the guard."""
    guard = guard or LogGuard()
    fmt = logging.Formatter(LINE_FORMAT)
    handlers: list[logging.Handler] = [logging.handlers.RotatingFileHandler(
        state_dir / "daemon.log", maxBytes=LOG_FILE_BYTES, backupCount=LOG_FILE_BACKUPS,
        encoding="utf-8")]
    if console:
        handlers.insert(0, logging.StreamHandler())
    for handler in handlers:
        handler.setFormatter(fmt)
        handler.addFilter(guard)
        logger.addHandler(handler)
    return guard
