"""``dacflnode start --log-format json``: one JSON object per line, for log collectors.

Every line has every key of :data:`JSON_KEYS`, first and in that order:

``time``
    when the record was made, ISO 8601 in UTC with milliseconds (``2026-05-04T12:00:00.123Z``);
``level``, ``logger``
    ``INFO``, ``WARNING``, …; the logger's name, which is the module that logged the line
    (``dacflnode.protocol.runner``, ``dacflnode.transport.receiver``);
``node``
    the node the line is about (its ``node`` field), else the daemon's own id;
``round``
    the round the message is about (an integer), or null;
``neighbour``
    the neighbour it is about, or null; where a message names several (a deadline nobody met),
    their ids joined by ``", "``;
``event``
    a stable name for what happened (``push_refused``, ``state_missing``, ``neighbour_up``, …),
    or null for a message that has none;
``reason``
    on a refusal, its reason code (``round-passed``, ``not-neighbour``, … the
    :class:`~dacflnode.wire.errors.Reason` values of docs/wire-format.md), else null;
``message``
    the line the text format writes after the logger's name, less a leading ``"<node>: "``
    where ``node`` names that node already;
``traceback``
    the traceback of a logged exception, or null.

A line about a round's figures (the per-round line and the summary of
:mod:`dacflnode.daemon.round_log`) carries them after these keys, as the keys of :data:`VALUE_KEYS`
it has (``rounds``, ``accuracy``, ``loss``, ``exchange_s``, ``train_s``, ``used``, ``missing``,
``late``, ``bytes_sent``, ``bytes_received``, ``seconds``).

A key of :data:`JSON_KEYS` whose value is not known is null, never left out. The fields
``node``, ``round``, ``neighbour``, ``event`` and ``reason`` are those the call site gives with
``extra=`` (:data:`~dacflnode.logs.guard.FIELDS`), next to its message::

    log.warning("round %d: no state from %s by the deadline; mixing without them",
                t, ", ".join(late),
                extra={"event": "state_missing", "node": me, "round": t, "neighbour": late})

Fields are checked like arguments (a sender id with a newline is escaped and cut as in the
message), and :func:`json.dumps` writes every control and non-ASCII character as a ``\\u``
escape, so a peer's value can neither end a JSON line nor reach the operator's terminal
unescaped.
"""

from __future__ import annotations

import datetime as dt
import json
import logging

from dacflnode.logs.guard import (
    MAX_MESSAGE_CHARS,
    field_value,
    format_exception,
    judged,
    one_line,
    record_fields,
    sanitize,
)

#: The keys of every JSON line, in the order written.
JSON_KEYS = ("time", "level", "logger", "node", "round", "neighbour", "event", "reason",
             "message", "traceback")
#: Figures a record may carry with ``extra=`` (the per-round line and the summary of
#: :mod:`dacflnode.daemon.round_log`): a JSON line writes those it has after :data:`JSON_KEYS`.
VALUE_KEYS = ("rounds", "accuracy", "loss", "exchange_s", "train_s", "used", "missing", "late",
              "bytes_sent", "bytes_received", "seconds")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line, with the keys :data:`JSON_KEYS` (see the module
    docstring); ``node`` is the id written where a record names no node."""

    def __init__(self, node: str | None = None) -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        if not judged(record):  # not through a guard: check it here
            sanitize(record)
        fields = {name: field_value(value) for name, value in record_fields(record).items()}
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
            "message": one_line(record.getMessage(), MAX_MESSAGE_CHARS),
            "traceback": tb or None,
        }
        for name in VALUE_KEYS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = ([field_value(v) for v in value] if isinstance(value, list)
                              else field_value(value))
        return json.dumps(line, ensure_ascii=True, default=str)
