"""The feature agreement's messages (``Agree`` in ``dacfl.v1.Neighbor``): phases, items and the
checks every request and reply passes before anything is kept.

An item is one node's contribution to one phase (its public key, its masked statistics, or the
agreed scale), relayed unchanged from node to node until every node holds every node's item
(:mod:`dacflnode.protocol.scale_agreement`). gRPC's message limit (8 MiB) bounds what a reply
can make a node allocate; the checks here bound what it keeps: ids, member lists and payloads
of sane sizes, one item per origin.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode.wire.errors import Reason, WireError

#: Most items in a reply, ids in a request's ``have`` or members in an item (nodes of a run).
MAX_NODES = 4096
#: Longest node id.
MAX_ID_CHARS = 256
#: Most payload bytes a reply carries (the rest comes on the next ask).
REPLY_BUDGET = 6 * 1024 * 1024


class AgreePhase(enum.IntEnum):
    KEYS = 1
    SUMS = 2
    SCALE = 3


@dataclass(frozen=True)
class AgreeItem:
    """``origin``'s item of a phase (see ``AgreeItem`` in neighbor.proto)."""

    origin: str
    members: tuple[str, ...]
    payload: bytes


def _ids(values: Sequence[str], what: str) -> tuple[str, ...]:
    if len(values) > MAX_NODES:
        raise WireError("INVALID_ARGUMENT", f"{what}: {len(values)} ids, at most {MAX_NODES}",
                        Reason.BAD_HEADER)
    for value in values:
        if not value or len(value) > MAX_ID_CHARS:
            raise WireError("INVALID_ARGUMENT", f"{what}: an id of {len(value)} characters",
                            Reason.BAD_HEADER)
    return tuple(values)


def request_of(sender: str, phase: AgreePhase, have: Iterable[str]) -> pb.AgreeRequest:
    return pb.AgreeRequest(sender=sender, phase=int(phase), have=sorted(have))


def read_request(request: pb.AgreeRequest) -> tuple[AgreePhase, frozenset[str]]:
    """The phase and the ``have`` set of a request; ``WireError`` for a bad one."""
    try:
        phase = AgreePhase(request.phase)
    except ValueError:
        raise WireError("INVALID_ARGUMENT", f"agreement phase {request.phase} is not one of "
                        f"{[int(p) for p in AgreePhase]}", Reason.BAD_HEADER) from None
    return phase, frozenset(_ids(list(request.have), "have"))


def reply_of(items: Iterable[AgreeItem]) -> pb.AgreeReply:
    """A reply with ``items`` in order, up to :data:`REPLY_BUDGET` payload bytes (always one)."""
    reply = pb.AgreeReply()
    budget = REPLY_BUDGET
    for item in items:
        if reply.items and len(item.payload) > budget:
            break
        budget -= len(item.payload)
        reply.items.add(origin=item.origin, members=list(item.members), payload=item.payload)
    return reply


def read_reply(reply: pb.AgreeReply) -> list[AgreeItem]:
    """The items of a reply, checked; ``WireError`` for a bad one."""
    if len(reply.items) > MAX_NODES:
        raise WireError("INVALID_ARGUMENT", f"{len(reply.items)} agreement items, at most "
                        f"{MAX_NODES}", Reason.BAD_HEADER)
    items = []
    for item in reply.items:
        (origin,) = _ids([item.origin], "origin")
        items.append(AgreeItem(origin, _ids(list(item.members), "members"), bytes(item.payload)))
    return items
