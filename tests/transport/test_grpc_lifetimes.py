"""Call lifetimes on the gRPC transport: cancellation, deadlines and stop, against a neighbour
that accepts every call and never answers; calls that grpc ends under their caller, a caller
whose process froze past its deadline, and a neighbour process stopped with SIGSTOP."""

from __future__ import annotations

import asyncio
import gc
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, cast

import grpc
import pytest

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode._proto.dacfl.v1 import neighbor_pb2_grpc
from dacflnode.transport.base import Identity, Inbox, PeerUnavailable, TransportClosed
from dacflnode.transport.grpc_status import unreachable
from dacflnode.transport.grpc_transport import PUSH_GRACE_S, GrpcTransport, NeighborCalls
from dacflnode.wire.agreement import AgreePhase
from dacflnode.wire.errors import REASON_METADATA_KEY
from dacflnode.wire.message import RoundMessage
from tests.harness.messages import message
from tests.harness.polling import until

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

    async def Exchange(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        await self._hang()
        yield pb.StateChunk()

    async def Agree(self, request: pb.AgreeRequest, context: Any) -> pb.AgreeReply:
        await self._hang()
        raise AssertionError("unreachable")


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
                              hello_call_timeout=20)
    await transport.start()
    yield transport
    await transport.stop(grace=0)


def sized(values: int) -> RoundMessage:
    return message("alice", 0, size=values)


CALLS: dict[str, Callable[[GrpcTransport], Coroutine[Any, Any, object]]] = {
    "hello": lambda t: t.hello("bob"),
    "push": lambda t: t.push("bob", sized(P), timeout=20),
    "pull": lambda t: t.pull("bob", 0, timeout=20),
    "agree": lambda t: t.agree("bob", AgreePhase.KEYS, (), timeout=20),
}


def client_tasks() -> list[asyncio.Task[Any]]:
    """Tasks running the transport's or grpc's client code (the server's own are not)."""

    def client(task: asyncio.Task[Any]) -> bool:
        code = getattr(task.get_coro(), "cr_code", None)
        name = code.co_filename if code is not None else ""
        return "dacflnode" in name or name.endswith(("aio/_call.py", "aio/_channel.py"))

    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and client(t)]


@pytest.mark.slow
@pytest.mark.parametrize("call", list(CALLS))
async def test_a_cancelled_caller_ends_its_call_and_gets_cancelled_error(
    alice: GrpcTransport, silent: tuple[Silent, str], loop_errors: list[dict[str, Any]],
    call: str,
) -> None:
    task = asyncio.create_task(CALLS[call](alice))
    await until(lambda: silent[0].started == 1)  # the neighbour took it, never answers
    assert not task.done()
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
    alice: GrpcTransport, silent: tuple[Silent, str], loop_errors: list[dict[str, Any]],
    call: str,
) -> None:
    task = asyncio.create_task(CALLS[call](alice))
    await until(lambda: silent[0].started == 1)  # the call is under way
    await alice.stop(grace=0)
    with pytest.raises(TransportClosed):
        await asyncio.wait_for(task, 5)
    gc.collect()
    await asyncio.sleep(0)
    assert loop_errors == []


async def test_every_call_keeps_its_deadline(alice: GrpcTransport) -> None:
    alice.hello_call_timeout = 0.3
    for call in (alice.hello("bob"), alice.push("bob", sized(P), timeout=0.3),
                 alice.pull("bob", 0, timeout=0.3)):
        with pytest.raises(PeerUnavailable, match="DEADLINE_EXCEEDED"):
            await asyncio.wait_for(call, 5)


# ---------------------------------------------------------------- calls ended under the caller
#
# A stalled neighbour (SIGSTOP, a long pause), or this process frozen past a call's deadline,
# ends calls under callers that asked for nothing. grpc's aio then raises CancelledError out of
# the call (from ``_receive_initial_metadata`` or a pending write), fails a write with
# ``INTERNAL: Internal error from Core``, or fails the half-close with ExecuteBatchError. Let
# through, any of them ends the node's exchange, and the daemon with it; the caller must see
# "peer unavailable, try again" instead, and go on.

BIG = 4 * 1024 * 1024  # values per tensor: 32 MiB a state, more than grpc buffers unread


class Recorded:
    """A stub that records every call it starts, so a test can end one under its caller, and
    counts the writes of its streaming calls: done, and still waiting to be taken."""

    def __init__(self, stub: NeighborCalls) -> None:
        self._stub = stub
        self.calls: list[Any] = []
        self.written = 0
        self.writing = 0

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._stub, name)

        def start(*args: Any, **kwargs: Any) -> Any:
            call = method(*args, **kwargs)
            self.calls.append(call)
            write = getattr(call, "write", None)
            if write is not None:

                async def counted(*a: Any) -> None:
                    self.writing += 1
                    try:
                        await write(*a)
                        self.written += 1
                    finally:
                        self.writing -= 1

                call.write = counted
            return call

        return start


def record_calls(transport: GrpcTransport, peer: str = "bob") -> Recorded:
    recorded = Recorded(transport._stub(peer))
    transport._stubs[peer] = cast("NeighborCalls", recorded)
    return recorded


async def retrying(call: Coroutine[Any, Any, object]) -> str:
    """What a node's exchange does with a call: "unavailable" means try again later."""
    try:
        await call
    except PeerUnavailable:
        return "unavailable"
    return "done"


@pytest.mark.slow
@pytest.mark.parametrize("call", list(CALLS))
async def test_a_call_that_grpc_cancels_under_its_caller_raises_peer_unavailable(
    alice: GrpcTransport, silent: tuple[Silent, str], loop_errors: list[dict[str, Any]],
    call: str,
) -> None:
    calls = record_calls(alice).calls
    task = asyncio.create_task(retrying(CALLS[call](alice)))
    await until(lambda: silent[0].started == 1)
    calls[0].cancel()  # grpc ends the call; the caller asked for nothing
    assert await asyncio.wait_for(task, 5) == "unavailable"
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0
    await asyncio.wait_for(silent[0].ended.wait(), 5)
    assert client_tasks() == []
    gc.collect()
    await asyncio.sleep(0)
    assert loop_errors == []


@pytest.mark.slow
async def test_a_push_cut_off_under_it_while_blocked_writing_raises_peer_unavailable(
    alice: GrpcTransport, silent: tuple[Silent, str], loop_errors: list[dict[str, Any]]
) -> None:
    recorded = record_calls(alice)
    task = asyncio.create_task(retrying(alice.push("bob", sized(BIG), timeout=20)))
    await until(lambda: silent[0].started == 1)
    # the neighbour reads nothing: chunks go out until grpc's buffers are full, and a write
    # waits for window
    await until(lambda: recorded.written > 0 and recorded.writing == 1)
    assert not task.done()
    recorded.calls[0].cancel()
    assert await asyncio.wait_for(task, 5) == "unavailable"
    assert 0 < alice.stats["bob"].bytes_sent < 2 * 4 * BIG  # cut off half-way
    assert client_tasks() == []
    gc.collect()
    await asyncio.sleep(0)
    assert loop_errors == []


@pytest.mark.parametrize(
    ("trailing", "retry"),
    [((), True), (((REASON_METADATA_KEY, "round-passed"),), False)],
    ids=["grpc-internal", "a-refusal"],
)
def test_an_internal_error_without_a_refusal_reason_is_retried(trailing, retry) -> None:
    # what a write that fails on a call that ended under it raises ("Internal error from Core")
    err = grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, grpc.aio.Metadata(),
                               grpc.aio.Metadata(*trailing), details="Internal error from Core")
    assert unreachable(err) is retry


@pytest.mark.slow
@pytest.mark.parametrize("values", [P, BIG], ids=["waiting-for-the-answer", "writing"])
async def test_a_push_whose_process_froze_past_its_deadline_raises_peer_unavailable(
    alice: GrpcTransport, silent: tuple[Silent, str], loop_errors: list[dict[str, Any]],
    values: int,
) -> None:
    task = asyncio.create_task(retrying(alice.push("bob", sized(values), timeout=0.5)))
    await until(lambda: silent[0].started == 1)
    time.sleep(1.5)  # the whole process stops (as under SIGSTOP): every timer fires late
    assert await asyncio.wait_for(task, 5) == "unavailable"
    await until(lambda: client_tasks() == [], 5)  # grpc's tasks of the call end soon after
    gc.collect()
    await asyncio.sleep(0)
    assert loop_errors == []


class FreezingStub:
    """A stub whose push calls freeze the whole process (as SIGSTOP does) for ``seconds`` just
    before the step named ``before`` ("write" of the first chunk, or "done_writing")."""

    def __init__(self, stub: NeighborCalls, before: str,
                 seconds: float) -> None:
        self._stub = stub
        self.before = before
        self.seconds = seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)

    def push(self, *args: Any, **kwargs: Any) -> Any:
        call = self._stub.push(*args, **kwargs)
        step = getattr(call, self.before)
        frozen = False

        async def freeze_then(*a: Any) -> None:
            nonlocal frozen
            if not frozen:
                frozen = True
                time.sleep(self.seconds)
            await step(*a)

        setattr(call, self.before, freeze_then)
        return call


@pytest.mark.slow
@pytest.mark.parametrize("before", ["write", "done_writing"])
async def test_a_push_frozen_past_its_deadline_before_a_step_raises_peer_unavailable(
    alice: GrpcTransport, loop_errors: list[dict[str, Any]], before: str
) -> None:
    # grpc fails the step of a call whose deadline passed in core with an internal error
    # ("Failed execute_batch" out of done_writing): that, too, means "unavailable, try again"
    alice._stubs["bob"] = cast("NeighborCalls",
                               FreezingStub(alice._stub("bob"), before, 1.0))
    assert await retrying(alice.push("bob", sized(P), timeout=0.3)) == "unavailable"
    await until(lambda: client_tasks() == [], 5)
    gc.collect()
    await asyncio.sleep(0)
    assert loop_errors == []


class LostWakeupStub:
    """A stub whose push calls' first write waits for something never set: what grpc's
    ``_StreamRequestMixin._write`` does when the call ended before its headers went out (it
    waits on ``_metadata_sent``, which nothing sets then; seen after a SIGSTOP)."""

    def __init__(self, stub: NeighborCalls) -> None:
        self._stub = stub
        self.calls: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)

    def push(self, *args: Any, **kwargs: Any) -> Any:
        call = self._stub.push(*args, **kwargs)
        never = asyncio.Event()

        async def write(chunk: bytes) -> None:
            await never.wait()

        setattr(call, "write", write)  # noqa: B010 (mypy: a method is replaced)
        self.calls.append(call)
        return call


@pytest.mark.slow
async def test_a_push_whose_write_grpc_never_wakes_is_given_up_soon_after_its_deadline(
    alice: GrpcTransport, silent: tuple[Silent, str], loop_errors: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    stub = LostWakeupStub(alice._stub("bob"))
    alice._stubs["bob"] = cast("NeighborCalls", stub)
    started = time.monotonic()
    assert await asyncio.wait_for(retrying(alice.push("bob", sized(P), timeout=0.3)),
                                  5) == "unavailable"
    assert time.monotonic() - started < 0.3 + PUSH_GRACE_S + 1.0
    assert stub.calls[0].cancelled() or stub.calls[0].done()
    assert not alice.stats["bob"].connected
    assert [getattr(r, "neighbour", None) for r in caplog.records
            if getattr(r, "event", None) == "push_stuck"] == ["bob"]
    await until(lambda: client_tasks() == [], 5)
    gc.collect()
    await asyncio.sleep(0)
    assert loop_errors == []


class FreezingAtStart:
    """A stub whose calls freeze the whole process for ``seconds`` right after they start."""

    def __init__(self, stub: NeighborCalls, seconds: float) -> None:
        self._stub = stub
        self.seconds = seconds

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._stub, name)

        def start(*args: Any, **kwargs: Any) -> Any:
            call = method(*args, **kwargs)
            time.sleep(self.seconds)
            return call

        return start


#: The calls of CALLS with a deadline of 0.3 s (hello's is the transport's hello_call_timeout).
SHORT_CALLS: dict[str, Callable[[GrpcTransport], Coroutine[Any, Any, object]]] = {
    "hello": lambda t: t.hello("bob"),
    "push": lambda t: t.push("bob", sized(P), timeout=0.3),
    "pull": lambda t: t.pull("bob", 0, timeout=0.3),
}


@pytest.mark.slow
@pytest.mark.parametrize("call", list(SHORT_CALLS))
async def test_a_call_frozen_past_its_deadline_as_it_starts_raises_peer_unavailable(
    alice: GrpcTransport, silent: tuple[Silent, str], loop_errors: list[dict[str, Any]],
    call: str,
) -> None:
    alice.hello_call_timeout = 0.3
    alice._stubs["bob"] = cast("NeighborCalls",
                               FreezingAtStart(alice._stub("bob"), 1.0))
    assert await retrying(SHORT_CALLS[call](alice)) == "unavailable"
    await until(lambda: client_tasks() == [], 5)
    gc.collect()
    await asyncio.sleep(0)
    assert loop_errors == []


BOB = """
import asyncio
from dacflnode.transport.base import Identity, Inbox
from dacflnode.transport.grpc_transport import GrpcTransport


async def main() -> None:
    inbox = Inbox(senders={"alice"}, current_round=lambda: 0)
    bob = GrpcTransport(Identity("bob", "m", "r"), "127.0.0.1:0", {}, inbox,
                        {"omega": (VALUES,), "x": (VALUES,)})
    await bob.start()
    print(bob.port, flush=True)
    await asyncio.Event().wait()


asyncio.run(main())
""".replace("VALUES", str(P))


@pytest.fixture
async def stoppable_bob() -> AsyncIterator[tuple[subprocess.Popen[str], str]]:
    """A real neighbour in its own process, which the test can SIGSTOP."""
    proc = subprocess.Popen([sys.executable, "-c", BOB], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        assert port.strip().isdigit(), port
        yield proc, f"127.0.0.1:{port.strip()}"
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait(timeout=10)


@pytest.mark.slow
async def test_pushes_to_a_sigstopped_neighbour_raise_peer_unavailable_until_it_resumes(
    stoppable_bob: tuple[subprocess.Popen[str], str], loop_errors: list[dict[str, Any]]
) -> None:
    proc, address = stoppable_bob
    alice = GrpcTransport(Identity("alice", "m", "r"), "127.0.0.1:0", {"bob": address},
                          Inbox(senders={"bob"}, current_round=lambda: 0), TENSORS)
    await alice.start()
    try:
        await alice.push("bob", sized(P), timeout=20)
        proc.send_signal(signal.SIGSTOP)
        for _ in range(3):  # a node's retries within one round
            assert await retrying(alice.push("bob", sized(P), timeout=0.5)) == "unavailable"
        proc.send_signal(signal.SIGCONT)
        hello = await alice.hello("bob")  # the same channel works again
        assert hello.node_id == "bob"
    finally:
        await alice.stop(grace=0)
    gc.collect()
    await asyncio.sleep(0)
    assert loop_errors == []
