"""The daemon's log output: where records go (``daemon.log``, rotating, and the console), in
which format, each through one :class:`~dacflnode.logs.guard.LogGuard`.

* **The file rotates** at :data:`LOG_FILE_BYTES`, keeping :data:`LOG_FILE_BACKUPS` old files
  (``daemon.log.1`` …): at most 60 MB of log per state directory, whatever peers do.
* **Two formats** (``dacflnode start --log-format``), for the console and the file alike:
  ``text`` (the default), :data:`LINE_FORMAT`, for people; ``json``, one JSON object per line,
  for log collectors (:mod:`dacflnode.logs.json_format`).
"""

from __future__ import annotations

import logging
import logging.handlers
from pathlib import Path
from typing import Any, Literal

from dacflnode.filemodes import LOG_MODE, open_text
from dacflnode.logs.guard import LogGuard
from dacflnode.logs.json_format import JsonFormatter

#: Size at which ``daemon.log`` rotates, and how many rotated files are kept.
LOG_FILE_BYTES = 10 * 1024 * 1024
LOG_FILE_BACKUPS = 5
#: The daemon's line format: human-readable, one record per line.
LINE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: The formats :func:`install` writes (see the module docstring).
LOG_FORMATS = ("text", "json")
LogFormat = Literal["text", "json"]


class LineFormatter(logging.Formatter):
    """:data:`LINE_FORMAT`, the message preceded by ``"<node>: "`` where the record names the
    node it is about (its ``node`` field, :data:`~dacflnode.logs.guard.FIELDS`): the call site
    writes the node once, in ``extra``, and a line still says which node it is about when
    several nodes log to one console (``launch``, ``simulate``, tests)."""

    def __init__(self, fmt: str = LINE_FORMAT) -> None:
        super().__init__(fmt)

    def formatMessage(self, record: logging.LogRecord) -> str:
        node = getattr(record, "node", None)
        if isinstance(node, str) and node:
            saved = record.message
            record.message = f"{node}: {saved}"
            try:
                return super().formatMessage(record)
            finally:
                record.message = saved
        return super().formatMessage(record)


class _ConsoleHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`log_to_console` adds (told apart from any other by its class)."""


def log_to_console(logger: logging.Logger, level: int = logging.WARNING) -> logging.Handler:
    """Show ``logger``'s records of ``level`` and above on stderr, each its message preceded by
    the node it is about: for a command that runs nodes in its own process (``simulate``), where
    Python's last-resort handler would show the message alone. Called again (a second command
    in one process), it returns the handler it added the first time. Returns the handler."""
    for existing in logger.handlers:
        if isinstance(existing, _ConsoleHandler):
            return existing
    handler = _ConsoleHandler()
    handler.setLevel(level)
    handler.setFormatter(LineFormatter("%(message)s"))
    logger.addHandler(handler)
    return handler


def make_formatter(log_format: LogFormat, node: str | None = None) -> logging.Formatter:
    """The formatter of ``log_format`` (one of :data:`LOG_FORMATS`)."""
    if log_format == "json":
        return JsonFormatter(node)
    if log_format == "text":
        return LineFormatter()
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
