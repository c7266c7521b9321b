"""The Control service (``dacflnode status|metrics|stop|invariant``): server side and client
calls.

The node side provides a :class:`ControlProvider` (plain Python, no grpc); this module turns it into
the gRPC service and offers the client functions the CLI uses.

Authentication: the service listens on loopback by default, where any local user can connect,
so the daemon always serves it behind a :class:`TokenInterceptor` (``node.control_token``, or a
token drawn at every start and written to ``STATE_DIR/control.token``, readable by the node's
user only: :mod:`dacflnode.peers.control_token`): every call must carry metadata
``authorization: Bearer <token>`` (compared in constant time); any other call ends
``UNAUTHENTICATED`` before a method runs, and is logged (at most one line per second, with a
count of those not logged). An exposed (non-loopback) control address is served over TLS with
the node's certificate, so the token does not travel in the clear; the client verifies that
certificate against the run's CA (:class:`~dacflnode.transport.control_types.ControlAuth`).
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import grpc
from google.protobuf.message import Message

from dacflnode._proto.dacfl.v1 import control_pb2 as pb
from dacflnode._proto.dacfl.v1 import control_pb2_grpc as pb_grpc
from dacflnode.transport.channels import create_channel
from dacflnode.transport.control_types import ControlAuth, NeighbourInfo, NodeStatus
from dacflnode.transport.errors import PeerUnavailable

CALL_TIMEOUT = 5.0
#: Seconds a whole checkpoint download may take (a large model on a slow link).
CHECKPOINT_TIMEOUT = 120.0
#: Bytes per :class:`FileChunk` of a checkpoint download (well under the channels' message cap;
#: not the wire's state chunk, :data:`dacflnode.wire.message.CHUNK_BYTES`).
CHECKPOINT_CHUNK_BYTES = 1 << 20
#: The metadata key that carries the control token, as ``Bearer <token>``.
AUTH_METADATA_KEY = "authorization"
#: At most one "refused" log line per this many seconds (a flood of bad calls cannot fill the
#: log); the next line says how many were not logged.
REFUSAL_LOG_INTERVAL = 1.0

log = logging.getLogger(__name__)


class ControlUnauthenticated(Exception):
    """The daemon refused the call's token (``token_sent``: a wrong one; else it wants one)."""

    def __init__(self, target: str, token_sent: bool) -> None:
        self.target = target
        self.token_sent = token_sent
        what = "refused the control token" if token_sent else "wants a control token"
        super().__init__(f"the daemon at {target} {what}")


class ControlCallFailed(Exception):
    """The daemon answered a Control call with an error (its code and details in the message)."""


class ControlProvider(Protocol):
    def status(self) -> NodeStatus: ...

    def metrics(self, fmt: str) -> tuple[str, str]: ...

    def stop(self, drain: bool = False) -> None:
        """Stop the node; with ``drain``, have it leave the network first."""

    async def checkpoint_bytes(self) -> bytes | None:
        """The node's latest checkpoint file, ``None`` before the first."""


class ControlServicer(pb_grpc.ControlServicer):
    def __init__(self, provider: ControlProvider) -> None:
        self.provider = provider

    async def Status(self, request: pb.StatusRequest, context: Any) -> pb.StatusReply:
        return status_to_proto(self.provider.status())

    async def Metrics(self, request: pb.MetricsRequest, context: Any) -> pb.MetricsReply:
        fmt = request.format or "json"
        if fmt not in ("json", "prometheus"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"format must be json or prometheus, not {fmt!r}")
        content_type, body = self.provider.metrics(fmt)
        return pb.MetricsReply(content_type=content_type, body=body)

    async def Stop(self, request: pb.StopRequest, context: Any) -> pb.StopReply:
        self.provider.stop(drain=request.drain)
        return pb.StopReply(accepted=True)

    async def Checkpoint(self, request: pb.CheckpointRequest, context: Any
                         ) -> AsyncIterator[pb.FileChunk]:
        data = await self.provider.checkpoint_bytes()
        if data is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                "no checkpoint yet: the node writes one after each round")
            return
        for start in range(0, len(data), CHECKPOINT_CHUNK_BYTES):
            yield pb.FileChunk(data=data[start:start + CHECKPOINT_CHUNK_BYTES])


def add_control_service(server: grpc.aio.Server, provider: ControlProvider) -> None:
    pb_grpc.add_ControlServicer_to_server(ControlServicer(provider), server)


def token_matches(metadata: Any, token: str) -> bool:
    """Whether call ``metadata`` (pairs of key and value) carries ``Bearer <token>``."""
    expected = f"Bearer {token}".encode()
    for key, value in metadata or ():
        if key == AUTH_METADATA_KEY:
            given = value if isinstance(value, bytes) else str(value).encode()
            return hmac.compare_digest(given, expected)
    return False


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Lets a call through only with ``authorization: Bearer <token>``; ends any other
    ``UNAUTHENTICATED`` (with a handler of the method's kind: unary, or server-streaming for
    ``Checkpoint``) and logs it, rate-limited."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("a control token must not be empty")
        self._token = token
        self._last_log = -math.inf
        self._unlogged = 0
        self.refused = 0
        self._refuse: grpc.RpcMethodHandler[Any, Any] = grpc.unary_unary_rpc_method_handler(
            self._refuse_call)
        self._refuse_stream: grpc.RpcMethodHandler[Any, Any] = \
            grpc.unary_stream_rpc_method_handler(self._refuse_stream_call)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails],
                               Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        if token_matches(handler_call_details.invocation_metadata, self._token):
            return await continuation(handler_call_details)
        if handler_call_details.method in STREAMING_METHODS:
            return self._refuse_stream
        return self._refuse

    async def _refuse_stream_call(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
                                  ) -> AsyncIterator[Any]:
        await self._refuse_call(request, context)
        yield  # pragma: no cover - never reached: the refusal aborts the call

    async def _refuse_call(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
                           ) -> None:
        self.refused += 1
        now = time.monotonic()
        if now - self._last_log >= REFUSAL_LOG_INTERVAL:
            log.warning("control call from %.100r refused: missing or wrong token%s",
                        context.peer(), f" ({self._unlogged} more not logged)"
                        if self._unlogged else "", extra={"event": "control_refused"})
            self._last_log, self._unlogged = now, 0
        else:
            self._unlogged += 1
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "a valid control token is required")


#: Full names (``/package.Service/Method``) of the Control methods that stream their reply.
STREAMING_METHODS = frozenset(
    f"/{pb.DESCRIPTOR.services_by_name['Control'].full_name}/{m.name}"
    for m in pb.DESCRIPTOR.services_by_name["Control"].methods if m.server_streaming)


def control_interceptors(token: str | None) -> list[TokenInterceptor]:
    """The interceptors of a Control server: a :class:`TokenInterceptor` if ``token`` is set."""
    return [TokenInterceptor(token)] if token else []


def _fields(message: Any, source: Any) -> dict[str, Any]:
    """The fields of protobuf message type ``message``, read by name from ``source``."""
    return {f.name: getattr(source, f.name) for f in message.DESCRIPTOR.fields}


def _plain(reply: Message) -> dict[str, Any]:
    """The fields of ``reply`` by name, a repeated field as a list and a map as a dict."""
    return {name: dict(value) if isinstance(value, Mapping)
            else list(value) if isinstance(value, Sequence) and not isinstance(value, str)
            else value
            for name, value in _fields(reply, reply).items()}


def status_to_proto(s: NodeStatus) -> pb.StatusReply:
    """``s`` as the Status call answers it: the fields the reply has (a field of the status
    that the reply lacks stays on this side)."""
    fields = _fields(pb.StatusReply, s)
    fields["neighbours"] = [pb.NeighbourStatus(**_fields(pb.NeighbourStatus, n))
                            for n in s.neighbours]
    return pb.StatusReply(**fields)


def status_from_proto(r: pb.StatusReply) -> NodeStatus:
    fields = _plain(r)
    fields["neighbours"] = [NeighbourInfo(**_plain(n)) for n in r.neighbours]
    return NodeStatus(**fields)


def _translate(target: str, auth: ControlAuth, exc: grpc.aio.AioRpcError) -> Exception:
    """What a failed call means to the CLI: :class:`ControlUnauthenticated`,
    :class:`PeerUnavailable` (nothing answers, or the TLS handshake failed: the details say
    which), or the error itself."""
    if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
        return ControlUnauthenticated(target, auth.token is not None)
    if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return PeerUnavailable(f"no dacflnode daemon answers at {target} "
                               f"({exc.code().name}: {exc.details()})")
    return exc


def _metadata(auth: ControlAuth) -> tuple[tuple[str, str], ...] | None:
    return ((AUTH_METADATA_KEY, f"Bearer {auth.token}"),) if auth.token else None


async def _call(target: str, method: str, request: Any, timeout: float,
                auth: ControlAuth | None) -> Any:
    """One unary Control call; raises :class:`PeerUnavailable` or
    :class:`ControlUnauthenticated` (see :func:`_translate`)."""
    auth = auth or ControlAuth()
    channel = create_channel(target, ca=auth.ca, target_name=auth.server_name)
    try:
        stub = pb_grpc.ControlStub(channel)
        return await getattr(stub, method)(request, timeout=timeout, metadata=_metadata(auth))
    except grpc.aio.AioRpcError as exc:
        raise _translate(target, auth, exc) from exc
    finally:
        await channel.close()


async def fetch_status(target: str, timeout: float = CALL_TIMEOUT,
                       auth: ControlAuth | None = None) -> NodeStatus:
    return status_from_proto(await _call(target, "Status", pb.StatusRequest(), timeout, auth))


async def fetch_metrics(target: str, fmt: str = "json", timeout: float = CALL_TIMEOUT,
                        auth: ControlAuth | None = None) -> str:
    reply = await _call(target, "Metrics", pb.MetricsRequest(format=fmt), timeout, auth)
    return str(reply.body)


async def request_stop(target: str, timeout: float = CALL_TIMEOUT,
                       auth: ControlAuth | None = None, drain: bool = False) -> bool:
    """Ask the node to stop (``drain``: to leave the network first); whether it accepted."""
    reply = await _call(target, "Stop", pb.StopRequest(drain=drain), timeout, auth)
    return bool(reply.accepted)


async def fetch_checkpoint(target: str, timeout: float = CHECKPOINT_TIMEOUT,
                           auth: ControlAuth | None = None) -> bytes | None:
    """The node's latest checkpoint file (safetensors bytes), ``None`` when it has none yet;
    raises as :func:`fetch_status` does, and :class:`ControlCallFailed` for any other error."""
    auth = auth or ControlAuth()
    channel = create_channel(target, ca=auth.ca, target_name=auth.server_name)
    try:
        stub = pb_grpc.ControlStub(channel)
        parts = [chunk.data async for chunk in stub.Checkpoint(
            pb.CheckpointRequest(), timeout=timeout, metadata=_metadata(auth))]
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return None
        error = _translate(target, auth, exc)
        if error is exc:
            hint = (" (a daemon that predates checkpoint downloads?)"
                    if exc.code() == grpc.StatusCode.UNIMPLEMENTED else "")
            error = ControlCallFailed(f"{target}: {exc.code().name}: {exc.details()}{hint}")
        raise error from exc
    finally:
        await channel.close()
    return b"".join(parts)


def metrics_json(status: NodeStatus, extra: dict[str, Any]) -> str:
    body = {**status.to_json(), **extra}
    return json.dumps(body, default=lambda v: None if isinstance(v, float) and math.isnan(v) else v)
