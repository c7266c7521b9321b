"""The daemon's log, safe from what peers send: escaped values, rate-limited repeats, rotation,
and a JSON format for log collectors.

* :mod:`dacflnode.logs.guard`: the filter every record of the ``dacflnode`` logger tree passes
  (values escaped and cut, repeats rate-limited), and the fields a record may carry;
* :mod:`dacflnode.logs.json_format`: ``--log-format json``, one object per line;
* :mod:`dacflnode.logs.handlers`: :func:`install`, which puts the rotating ``daemon.log`` and
  the console on a logger, in a format, through one guard.

A module logs to ``logging.getLogger(__name__)``, and a line says what happened next to its
message: ``extra={"event": "neighbour_up", "node": me, "neighbour": peer}`` (the fields are
:data:`FIELDS`; the JSON format writes them, the text format leaves them out).
"""

from dacflnode.logs.guard import (
    FIELDS,
    MAX_MESSAGE_CHARS,
    MAX_OBJECT_CHARS,
    MAX_TEMPLATES,
    MAX_TRACEBACK_LINES,
    MAX_VALUE_CHARS,
    RATE_LIMIT_COUNT,
    RATE_LIMIT_WINDOW_S,
    SUPPRESSED,
    SUPPRESSED_EVENT,
    UNLIMITED,
    LogGuard,
    escape,
    format_exception,
    one_line,
    safe_arg,
    sanitize,
)
from dacflnode.logs.handlers import (
    LINE_FORMAT,
    LOG_FILE_BACKUPS,
    LOG_FILE_BYTES,
    LOG_FORMATS,
    LineFormatter,
    LogFormat,
    install,
    log_to_console,
    make_formatter,
)
from dacflnode.logs.json_format import JSON_KEYS, VALUE_KEYS, JsonFormatter

__all__ = [
    "FIELDS", "JSON_KEYS", "LINE_FORMAT", "LOG_FILE_BACKUPS", "LOG_FILE_BYTES", "LOG_FORMATS",
    "MAX_MESSAGE_CHARS", "MAX_OBJECT_CHARS", "MAX_TEMPLATES", "MAX_TRACEBACK_LINES",
    "MAX_VALUE_CHARS", "RATE_LIMIT_COUNT", "RATE_LIMIT_WINDOW_S", "SUPPRESSED",
    "SUPPRESSED_EVENT", "UNLIMITED", "VALUE_KEYS", "JsonFormatter", "LineFormatter", "LogFormat",
    "LogGuard", "escape", "format_exception", "install", "log_to_console", "make_formatter",
    "one_line", "safe_arg", "sanitize",
]
