"""Why a message was refused, as a type both sides of a connection agree on.

A node refuses a pushed or pulled state, or a handshake, for a reason the other side must act on
differently: a neighbour already past the round will never take that round's state (stop
retrying), one that is behind may take it later, a checksum failure may be retried at once, a
mismatched model never. Those decisions are made on :class:`Reason`, never on message text: the
text is for people and may change. Over gRPC the reason travels next to the status code in the
trailing metadata :data:`REASON_METADATA_KEY` (see docs/wire-format.md) and the client rebuilds
the same :class:`WireError`; a reason it does not know (a newer peer) or a missing one (an
older peer, or a failure outside the protocol) reads as :attr:`Reason.OTHER`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

#: The trailing-metadata key that carries a refusal's :class:`Reason` over gRPC.
REASON_METADATA_KEY = "dacfl-reason"

#: All a stranger is told (with ``PERMISSION_DENIED``): nothing about members, rounds or shapes.
STRANGER_MESSAGE = "refused"


class Reason(enum.StrEnum):
    """Why a message or a handshake was refused."""

    UNKNOWN_SENDER = "unknown-sender"  # the sender is not one of this node's neighbours
    ROUND_PASSED = "round-passed"  # the receiver is already past that round
    ROUND_AHEAD = "round-ahead"  # the round is too far ahead of the receiver
    BAD_HEADER = "bad-header"  # a malformed stream: header missing, repeated, out of range
    BAD_PAYLOAD = "bad-payload"  # tensor names, shapes, dtypes or sizes differ from the model
    CHECKSUM = "checksum"  # the payload does not match its checksum
    TRUNCATED = "truncated"  # the stream ended before the announced payload
    NOT_KEPT = "not-kept"  # a pull asked for a round the peer no longer (or never) kept
    NOT_NEIGHBOUR = "not-neighbour"  # a handshake or pull from a node that is not a neighbour
    MISMATCH = "mismatch"  # handshake: model, run settings or protocol differ
    NOT_AUTHENTICATED = "not-authenticated"  # the claimed id is not the one the transport verified
    NON_FINITE = "non-finite"  # the state holds NaN or infinite values
    ABSURD_STATE = "absurd-state"  # the state's norm or distance is implausible (a poison)
    STALE_STATE = "stale-state"  # the sender sent this very state for another round (a replay)
    STALE = "stale"  # an asynchronous exchange of snapshots more blocks apart than `staleness`
    FINISHED = "finished"  # the node has ended its run: it answers no more exchanges
    RECONCILING = "reconciling"  # the node restarted and has not reconciled that edge yet
    RESTARTED = "restarted"  # an exchange the sender chose before it restarted
    QUARANTINED = "quarantined"  # the receiver quarantined the edge after repeated offences
    DUPLICATE = "duplicate"  # this sender's state for this round was received already
    IN_PROGRESS = "in-progress"  # a stream of this sender's state for this round is still arriving
    IDLE = "idle"  # the stream sent nothing for longer than the idle deadline
    TOO_SLOW = "too-slow"  # the stream did not complete within the total deadline
    TOO_MANY_CALLS = "too-many-calls"  # the caller has its quota of calls in flight already
    PREEMPTED = "preempted"  # a stalled stream, cut to make room for a newer one of its kind
    OTHER = "other"  # anything else, and any reason this version does not know

    @classmethod
    def parse(cls, value: str | bytes | None) -> Reason:
        """The reason named by ``value`` (as read from the wire); :attr:`OTHER` when unknown."""
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if value is None:
            return cls.OTHER
        try:
            return cls(value)
        except ValueError:
            return cls.OTHER


class WireError(Exception):
    """A message broke the wire contract or was refused.

    ``code`` is the gRPC status name the receiver answers with, ``reason`` why, as a type the
    sender can branch on, ``message`` the human-readable text the sender gets. ``detail``, when
    set, is what only the receiver's log may say: a refusal of a stranger sends the short
    :data:`STRANGER_MESSAGE` and keeps who claimed what, and why it failed, for the log.
    """

    def __init__(
        self, code: str, message: str, reason: Reason = Reason.OTHER, detail: str | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason
        self.detail = detail if detail is not None else message

    def __repr__(self) -> str:
        return f"WireError({self.code!r}, {self.message!r}, {self.reason!r})"


@dataclass(frozen=True)
class Refusal:
    """Why a receiver will not take a message for some round, before any payload is read, and
    the status code it answers with (a round outside the window is a precondition, not a
    malformed message)."""

    reason: Reason
    detail: str
    code: str = "FAILED_PRECONDITION"
