"""What neighbours exchange: a :class:`RoundMessage` (one node's state for one round), the
kinds of state (:class:`Kind`), and the constants of the wire format: its version, its limits,
its chunk and checksum sizes and the tensor dtypes it carries.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb

#: 3: the checksum travels in a trailer after the data (2 had it in the header).
PROTOCOL_VERSION = 3
#: At most this many rounds in a header's ``used_log`` (a node sends ``gone_after + 2``).
MAX_USED_LOG = 64
#: At most this many anchor rounds in a header.
MAX_ANCHORS = 16
#: Payload bytes in one data chunk (the last one of a tensor may carry fewer).
CHUNK_BYTES = 1 << 20
#: Bytes of the trailer's checksum (XXH3-128).
CHECKSUM_BYTES = 16
#: The tensor dtypes the wire carries, by wire name: float32 for full states, the others for
#: the parts of a compressed state (docs/compression.md).
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "int32": torch.int32,
}
#: The dtypes whose values can be NaN or infinite (integers are always finite).
FLOAT_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})
#: The wire name of each dtype the wire carries.
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("the dacfl wire format is little-endian; this host is not")


class Kind(enum.IntEnum):
    """What a state is for (``StateKind`` on the wire; see docs/faults.md)."""

    STATE = pb.STATE  # a round's state, to be mixed
    LEAVING = pb.LEAVING  # the sender's last state before it leaves: read, do not mix
    HANDOVER = pb.HANDOVER  # after LEAVING: ``x`` is the sender's mass to add to ``x``
    FINAL = pb.FINAL  # after the last round: read, do not mix
    EXCHANGE = pb.EXCHANGE  # an asynchronous exchange's request: the asking node's snapshot
    EXCHANGED = pb.EXCHANGED  # its reply: the transfer the answering node added
    EXCHANGE_DONE = pb.EXCHANGE_DONE  # no tensors: the sender trains no more, asks no more
    RECONCILE = pb.RECONCILE  # no tensors: the sender restarted; answered with the edge's totals


#: The kinds a round's push or pull carries.
ROUND_KINDS = frozenset({Kind.STATE, Kind.LEAVING, Kind.HANDOVER, Kind.FINAL})
#: The kinds an Exchange call carries (request, reply, the notice of a node done, the request
#: of a node that restarted, and the handover of a node that leaves).
EXCHANGE_KINDS = frozenset({Kind.EXCHANGE, Kind.EXCHANGED, Kind.EXCHANGE_DONE,
                            Kind.RECONCILE, Kind.HANDOVER})


#: ``(round, neighbours mixed in that round)`` for the sender's last few rounds, oldest first.
UsedLog = tuple[tuple[int, tuple[str, ...]], ...]


@dataclass(frozen=True)
class RoundMessage:
    """One node's state for one round, as neighbours exchange it.

    ``used_log`` says which neighbours' states the sender mixed in each of its last few rounds
    (how a neighbour learns that an edge was used on one end only, and undoes it); ``anchors``
    are the future rounds at which every node re-anchors (both: docs/faults.md).

    A compressed state carries the ids of the sender's public copy before (``copy_base``) and
    after (``copy_next``) applying its update; a copy-pull reply carries the pulled copy's id
    in ``copy_next``. 0: none (docs/compression.md).
    """

    sender: str
    round: int
    degree: int
    tensors: Mapping[str, torch.Tensor]
    used_log: UsedLog = ()
    kind: Kind = Kind.STATE
    anchors: tuple[int, ...] = ()
    copy_base: int = 0
    copy_next: int = 0
    #: an asynchronous exchange's id (the asking node's; a retry carries the same one) and the
    #: weight of its transfer (in the reply)
    exchange_id: int = 0
    weight: float = 0.0

    @property
    def payload_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    @property
    def used(self) -> tuple[str, ...]:
        """The neighbours the sender mixed in the round before this one."""
        return self.used_in(self.round - 1) or ()

    def used_in(self, round_: int) -> tuple[str, ...] | None:
        """The neighbours the sender mixed in ``round_``; ``None`` if the log does not say."""
        for r, peers in self.used_log:
            if r == round_:
                return peers
        return None



def dtype_name(tensor: torch.Tensor) -> str:
    """The wire name of ``tensor``'s dtype (its torch name when the wire does not carry it)."""
    return dtype_name_of(tensor.dtype)


def dtype_name_of(dtype: torch.dtype) -> str:
    """The wire name of ``dtype`` (its torch name when the wire does not carry it)."""
    return DTYPE_NAMES.get(dtype, str(dtype))

