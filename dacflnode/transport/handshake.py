"""The Hello exchange, shared by both transports: what a node sends and how it judges the reply.

The serving side of Hello is :meth:`dacflnode.transport.receiver.Receiver.hello`; this module is
the calling side, which both :mod:`~dacflnode.transport.memory` and
:mod:`~dacflnode.transport.grpc_transport` run after their own way of reaching the neighbour.
"""

from __future__ import annotations

from dataclasses import dataclass

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode.transport.base import HandshakeRefused, Identity
from dacflnode.wire.errors import Reason

#: Status codes with which a neighbour refuses a handshake (it is up, but will not talk to us).
HANDSHAKE_REFUSALS = frozenset({"FAILED_PRECONDITION", "PERMISSION_DENIED"})


@dataclass(frozen=True)
class PeerIdentity(Identity):
    """A neighbour's :class:`Identity` as its handshake reply gave it, with the round it is in
    and the round from which it mixes with this node (``join_round``; 0: as always)."""

    round: int = 0
    join_round: int = 0


def hello_request(identity: Identity, join_round: int = 0) -> pb.HelloRequest:
    """The Hello request that presents ``identity`` (proposing ``join_round``, if not 0)."""
    return pb.HelloRequest(
        node_id=identity.node_id,
        protocol_version=identity.protocol_version,
        model_fingerprint=identity.model_fingerprint,
        run_fingerprint=identity.run_fingerprint,
        join_round=join_round,
        data_contract=identity.data_contract,
    )


def check_identity(identity: Identity, peer: str, reply: pb.HelloReply) -> PeerIdentity:
    """The identity in ``reply``; raises :class:`HandshakeRefused` (reason
    :attr:`~Reason.MISMATCH`) if this node must refuse it.

    The neighbour checked this node's identity already; checking the reply too catches an
    address that another node serves, and a neighbour that runs an older version which does
    not compare every field.
    """
    other = PeerIdentity(reply.node_id, reply.model_fingerprint, reply.run_fingerprint,
                         reply.protocol_version, int(reply.round),
                         data_contract=reply.data_contract, join_round=int(reply.join_round))
    if other.node_id != peer:
        raise HandshakeRefused(
            f"the address of neighbour {peer!r} is served by {other.node_id!r}", Reason.MISMATCH)
    why = identity.mismatch(other)
    if why is not None:
        raise HandshakeRefused(f"{identity.node_id} refuses {peer}: {why}",
                               Reason.MISMATCH)
    return other
