"""The Control service (``dacflnode status|metrics|stop``): server side and client calls.

The node side provides a :class:`ControlProvider` (plain Python, no grpc); this module turns it into
the gRPC service and offers the client functions the CLI uses.
"""

from __future__ import annotations

import json
import math
from typing import Any, Protocol

import grpc

from dacflnode._proto.dacfl.v1 import control_pb2 as pb
from dacflnode._proto.dacfl.v1 import control_pb2_grpc as pb_grpc
from dacflnode.transport.base import PeerUnavailable
from dacflnode.transport.channels import create_channel
from dacflnode.transport.control_types import NeighbourInfo, NodeStatus

CALL_TIMEOUT = 5.0


class ControlProvider(Protocol):
    def status(self) -> NodeStatus: ...

    def metrics(self, fmt: str) -> tuple[str, str]: ...

    def stop(self) -> None: ...


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
        self.provider.stop()
        return pb.StopReply(accepted=True)


def add_control_service(server: grpc.aio.Server, provider: ControlProvider) -> None:
    pb_grpc.add_ControlServicer_to_server(ControlServicer(provider), server)


def status_to_proto(s: NodeStatus) -> pb.StatusReply:
    return pb.StatusReply(
        node_id=s.node_id, algorithm=s.algorithm, round=s.round, rounds_total=s.rounds_total,
        phase=s.phase,
        neighbours=[pb.NeighbourStatus(
            node_id=n.node_id, address=n.address, connected=n.connected,
            last_round_received=n.last_round_received, bytes_received=n.bytes_received,
            bytes_sent=n.bytes_sent, latency_ms=n.latency_ms) for n in s.neighbours],
        last_accuracy=s.last_accuracy, last_loss=s.last_loss,
        consensus_residual=s.consensus_residual, device=s.device, uptime_s=s.uptime_s,
        listen_address=s.listen_address,
    )


def status_from_proto(r: pb.StatusReply) -> NodeStatus:
    return NodeStatus(
        node_id=r.node_id, algorithm=r.algorithm, round=r.round, rounds_total=r.rounds_total,
        phase=r.phase,
        neighbours=[NeighbourInfo(n.node_id, n.address, n.connected, n.last_round_received,
                                  n.bytes_received, n.bytes_sent, n.latency_ms)
                    for n in r.neighbours],
        last_accuracy=r.last_accuracy, last_loss=r.last_loss,
        consensus_residual=r.consensus_residual, device=r.device, uptime_s=r.uptime_s,
        listen_address=r.listen_address,
    )


async def _call(target: str, method: str, request: Any, timeout: float) -> Any:
    channel = create_channel(target)
    try:
        stub = pb_grpc.ControlStub(channel)
        return await getattr(stub, method)(request, timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            raise PeerUnavailable(f"no dacflnode daemon answers at {target}") from exc
        raise
    finally:
        await channel.close()


async def fetch_status(target: str, timeout: float = CALL_TIMEOUT) -> NodeStatus:
    return status_from_proto(await _call(target, "Status", pb.StatusRequest(), timeout))


async def fetch_metrics(target: str, fmt: str = "json", timeout: float = CALL_TIMEOUT) -> str:
    reply = await _call(target, "Metrics", pb.MetricsRequest(format=fmt), timeout)
    return str(reply.body)


async def request_stop(target: str, timeout: float = CALL_TIMEOUT) -> bool:
    reply = await _call(target, "Stop", pb.StopRequest(), timeout)
    return bool(reply.accepted)


def metrics_json(status: NodeStatus, extra: dict[str, Any]) -> str:
    body = {**status.to_json(), **extra}
    return json.dumps(body, default=lambda v: None if isinstance(v, float) and math.isnan(v) else v)
