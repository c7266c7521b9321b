"""How a gRPC status from a neighbour reads to the transport: "try again later"
(:func:`unreachable`), or the refusal it carries (:func:`reason_of`, :func:`wire_error`), its
:class:`~dacflnode.wire.errors.Reason` read back from the trailing metadata ``dacfl-reason``."""

from __future__ import annotations

import grpc

from dacflnode.wire.errors import REASON_METADATA_KEY, Reason, WireError

_UNREACHABLE = frozenset({
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
})
#: Codes that mean "try again later" when no refusal reason comes with them (see unreachable).
_UNREACHABLE_WITHOUT_REASON = frozenset({
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.INTERNAL,
})


def unreachable(err: grpc.aio.AioRpcError) -> bool:
    """Whether ``err`` means "try again later" rather than "the peer refused this".

    Besides the transport's own failures, a ``RESOURCE_EXHAUSTED`` without a refusal reason is
    gRPC's server-wide call limit (``maximum_concurrent_rpcs``, see
    :mod:`~dacflnode.transport.channels`): the peer is busy, perhaps flooded, and a neighbour's
    push must be retried, not given up. The receiver's own ``RESOURCE_EXHAUSTED`` refusals
    (a stream cut at its idle or total deadline) carry a reason, except that
    :attr:`~Reason.TOO_MANY_CALLS` means busy too: this node's quota of call slots on the peer
    is taken (:mod:`~dacflnode.transport.slots`). An ``INTERNAL`` without a
    reason is grpc's own "Internal error from Core": a write failed because the call had ended
    under it (its deadline passed while this process was stopped, the connection broke); the
    peer refused nothing.
    """
    if err.code() in _UNREACHABLE:
        return True
    if (err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            and reason_of(err) is Reason.TOO_MANY_CALLS):
        return True
    return err.code() in _UNREACHABLE_WITHOUT_REASON and reason_of(err) is Reason.OTHER


def reason_of(err: grpc.aio.AioRpcError) -> Reason:
    """The refusal reason a peer sent with ``err`` (:attr:`Reason.OTHER` if none or unknown)."""
    metadata = err.trailing_metadata()
    return Reason.parse(metadata.get(REASON_METADATA_KEY) if metadata else None)


def wire_error(err: grpc.aio.AioRpcError) -> WireError:
    """The :class:`WireError` the peer raised, rebuilt from its status and trailing metadata."""
    return WireError(err.code().name, err.details() or "", reason_of(err))
