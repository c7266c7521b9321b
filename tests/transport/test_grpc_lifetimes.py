"""Call lifetimes on the gRPC transport: cancellation, deadlines and stop, against a neighbour
that accepts every call and never answers."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import grpc
import pytest
import torch

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode._proto.dacfl.v1 import neighbor_pb2_grpc
from dacflnode.transport.base import Identity, Inbox, PeerUnavailable, TransportClosed
from dacflnode.transport.grpc_transport import GrpcTransport
from dacflnode.wire.codec import RoundMessage

P = 32
TENSORS = {"omega": (P,), "x": (P,)}


class Silent(neighbor_pb2_grpc.NeighborServicer):
    """Takes every call and never answers (a neighbour stuck in a long pause); counts the calls
    that the caller ended."""

    def __init__(self) -> None:
        self.started = 0
        self.ended = asyncio.Event()

    async def _hang(self) -> None:
        self.started += 1
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.ended.set()
            raise

    async def Hello(self, request: pb.HelloRequest, context: Any) -> pb.HelloReply:
        await self._hang()
        raise AssertionError("unreachable")

    async def PushState(self, request_iterator: Any, context: Any) -> pb.PushReply:
        await self._hang()
        raise AssertionError("unreachable")

    async def PullState(self, request: pb.PullRequest, context: Any) -> AsyncIterator[Any]:
        await self._hang()
        yield pb.StateChunk()


@pytest.fixture
async def silent() -> AsyncIterator[tuple[Silent, str]]:
    servicer = Silent()
    server = grpc.aio.server()
    neighbor_pb2_grpc.add_NeighborServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield servicer, f"127.0.0.1:{port}"
    await server.stop(0)


@pytest.fixture
async def alice(silent: tuple[Silent, str]) -> AsyncIterator[GrpcTransport]:
    transport = GrpcTransport(Identity("alice", "m", "r"), "127.0.0.1:0",
                              {"bob": silent[1]},
                              Inbox(senders={"bob"}, current_round=lambda: 0), TENSORS,
                              hello_timeout=20)
    await transport.start()
    yield transport
    await transport.stop(grace=0)


@pytest.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """What the event loop reports to its exception handler ("never retrieved", ...)."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    yield errors
    loop.set_exception_handler(previous)


def message() -> RoundMessage:
    return RoundMessage("alice", 0, 1, {"omega": torch.ones(P), "x": torch.zeros(P)})


CALLS: dict[str, Callable[[GrpcTransport], Coroutine[Any, Any, object]]] = {
    "hello": lambda t: t.hello("bob"),
    "push": lambda t: t.push("bob", message(), timeout=20),
    "pull": lambda t: t.pull("bob", 0, timeout=20),
}


def client_tasks() -> list[asyncio.Task[Any]]:
    """Tasks running the transport's or grpc's client code (the server's own are not)."""

    def client(task: asyncio.Task[Any]) -> bool:
        code = getattr(task.get_coro(), "cr_code", None)
        name = code.co_filename if code is not None else ""
        return "dacflnode" in name or name.endswith(("aio/_call.py", "aio/_channel.py"))

    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and client(t)]


@pytest.mark.parametrize("call", list(CALLS))
async def test_a_cancelled_caller_ends_its_call_and_gets_cancelled_error(
    alice: GrpcTransport, silent: tuple[Silent, str], loop_errors: list[dict[str, Any]],
    call: str,
) -> None:
    task = asyncio.create_task(CALLS[call](alice))
    await asyncio.sleep(0.3)
    assert not task.done() and silent[0].started == 1  # the neighbour took it, never answers
    assert task in client_tasks()  # (with the tasks grpc runs for the call)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    await asyncio.wait_for(silent[0].ended.wait(), 5)  # the call ended on the neighbour too
    assert client_tasks() == []  # and nothing of it is left running here
    gc.collect()
    await asyncio.sleep(0)
    assert loop_errors == []


@pytest.mark.parametrize("call", list(CALLS))
async def test_a_call_cut_off_by_stop_raises_transport_closed(
    alice: GrpcTransport, loop_errors: list[dict[str, Any]], call: str
) -> None:
    task = asyncio.create_task(CALLS[call](alice))
    await asyncio.sleep(0.3)
    await alice.stop(grace=0)
    with pytest.raises(TransportClosed):
        await asyncio.wait_for(task, 5)
    gc.collect()
    await asyncio.sleep(0)
    assert loop_errors == []


async def test_every_call_keeps_its_deadline(alice: GrpcTransport) -> None:
    alice.hello_timeout = 0.3
    for call in (alice.hello("bob"), alice.push("bob", message(), timeout=0.3),
                 alice.pull("bob", 0, timeout=0.3)):
        with pytest.raises(PeerUnavailable, match="DEADLINE_EXCEEDED"):
            await asyncio.wait_for(call, 5)
