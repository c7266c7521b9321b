"""Call slots cannot be hoarded: every call is counted from its start in its caller's pool (a
certificate identity; on plaintext its host, then the id it claims on that host), a call that
sends nothing is cut at the first-message deadline, a stalled call gives way to a new one of its
pool, and a caller beyond its quota is refused ``RESOURCE_EXHAUSTED`` ``too-many-calls``. Real
servers on 127.0.0.1 (ports from bind(0)); every wait is bounded."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from dacflnode.security.certs import tls_files, write_certs
from dacflnode.transport import channels
from dacflnode.transport.base import Identity, Inbox
from dacflnode.transport.grpc_service import SERVICE_NAME
from dacflnode.transport.grpc_status import reason_of, unreachable
from dacflnode.transport.grpc_transport import GrpcTransport
from dacflnode.transport.slots import PER_ADDRESS, PER_PEER, Call, CallSlots, peer_host
from dacflnode.wire.errors import REASON_METADATA_KEY, Reason, WireError
from tests.harness.messages import message
from tests.harness.polling import until

P = 16
TENSORS = {"omega": (P,), "x": (P,)}
MODEL, RUN = "model-fingerprint-1", "run-fingerprint-1"
FIRST = 0.4  # the first-message deadline of the servers here


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def parked() -> Call:
    """A call served by a task that waits forever (until it is cut)."""
    task = asyncio.create_task(asyncio.Event().wait())
    await asyncio.sleep(0)
    return Call(task=task)


# ---------------------------------------------------------------- the pools
def test_the_host_of_a_grpc_peer_drops_the_port():
    assert peer_host("ipv4:127.0.0.1:50123") == "ipv4:127.0.0.1"
    assert peer_host("ipv6:[::1]:50123") == "ipv6:[::1]"
    assert peer_host("unix:/tmp/socket") == "unix:/tmp/socket"
    assert peer_host("?") == "?"


async def test_a_peer_beyond_its_quota_is_refused_and_others_are_not():
    slots = CallSlots(per_peer=2, stale_after=5.0)
    for _ in range(2):
        slots.open(await parked(), ("cert", "alice"))
    with pytest.raises(WireError) as err:
        slots.open(await parked(), ("cert", "alice"))
    assert (err.value.code, err.value.reason) == ("RESOURCE_EXHAUSTED", Reason.TOO_MANY_CALLS)
    slots.open(await parked(), ("cert", "carol"))
    assert (slots.held(("cert", "alice")), slots.held(("cert", "carol")), len(slots)) == (2, 1, 3)


async def test_a_stalled_call_gives_way_to_a_new_one_of_its_pool_after_the_deadline():
    clock = Clock()
    slots = CallSlots(per_peer=2, stale_after=5.0)
    old, busy = await parked(), await parked()
    for c in (old, busy):
        c.clock = clock
        c.touch()
        slots.open(c, ("claim", "alice", "ipv4:127.0.0.1"))
    clock.now += 4.9
    busy.touch()  # still sending
    with pytest.raises(WireError):
        slots.open(await parked(), ("claim", "alice", "ipv4:127.0.0.1"))
    clock.now += 0.2  # `old` has sent nothing for 5.1 s
    new = await parked()
    slots.open(new, ("claim", "alice", "ipv4:127.0.0.1"))
    assert old.cut_error is not None and old.cut_error.reason is Reason.PREEMPTED
    assert old.pool is None and busy.cut_error is None
    await asyncio.sleep(0)
    assert old.task is not None and old.task.cancelled()
    assert slots.held(("claim", "alice", "ipv4:127.0.0.1")) == 2


async def test_calls_that_sent_nothing_give_way_at_once_in_their_address_pool():
    slots = CallSlots(per_address=3)
    first = await parked()
    slots.open(first, ("address", "ipv4:10.0.0.9"))
    for _ in range(2):
        slots.open(await parked(), ("address", "ipv4:10.0.0.9"))
    newest = await parked()
    slots.open(newest, ("address", "ipv4:10.0.0.9"))  # the oldest is cut to make room
    assert first.cut_error is not None and first.cut_error.reason is Reason.PREEMPTED
    assert slots.held(("address", "ipv4:10.0.0.9")) == 3
    slots.move(newest, ("claim", "alice", "ipv4:10.0.0.9"))  # its first message came
    assert slots.held(("address", "ipv4:10.0.0.9")) == 2
    assert slots.held(("claim", "alice", "ipv4:10.0.0.9")) == 1
    slots.close(newest)
    slots.close(newest)  # twice is harmless
    assert slots.held(("claim", "alice", "ipv4:10.0.0.9")) == 0
    assert ("claim", "alice", "ipv4:10.0.0.9") not in slots._pools


async def test_a_cut_call_reads_its_refusal_and_other_cancellations_stay_cancellations():
    seen: list[object] = []
    calls: list[Call] = []

    async def serve() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append(calls[0].taken())
            raise

    for cut in (True, False):
        task = asyncio.create_task(serve())
        await asyncio.sleep(0)
        calls[:] = [Call(task=task)]
        if cut:
            calls[0].cut(WireError("RESOURCE_EXHAUSTED", "cut", Reason.PREEMPTED))
        else:
            task.cancel()  # not a cut: the caller went away
        with pytest.raises(asyncio.CancelledError):
            await task
    assert [getattr(x, "reason", x) for x in seen] == [Reason.PREEMPTED, None]


def test_the_quotas_leave_the_server_room_for_honest_peers():
    # one host's calls that sent nothing, plus a claimed neighbour's, fill less than half of
    # the server's slots, so neighbours on that host still get theirs
    assert PER_ADDRESS + PER_PEER < channels.MAX_CONCURRENT_RPCS / 2


# ---------------------------------------------------------------- over gRPC
async def bob_server(tls: Any = None, first: float = FIRST) -> GrpcTransport:
    inbox = Inbox(senders={"alice", "carol"}, current_round=lambda: 0)
    bob = GrpcTransport(Identity("bob", MODEL, RUN), "127.0.0.1:0",
                        {"alice": "", "carol": ""}, inbox, TENSORS, tls=tls,
                        first_message_timeout=first)
    await bob.start()
    return bob


def silent_call(channel: grpc.aio.Channel, method: str) -> Any:
    """A call of ``method`` that sends its start and then nothing (not even a request)."""
    if method == "PullState":
        return channel.stream_stream(f"/{SERVICE_NAME}/{method}")()
    return channel.stream_unary(f"/{SERVICE_NAME}/{method}")()


async def outcome(call: Any, timeout: float) -> tuple[grpc.StatusCode, Reason]:
    try:
        async with asyncio.timeout(timeout):
            if hasattr(call, "read"):
                while await call.read() is not grpc.aio.EOF:
                    pass
            await call
    except grpc.aio.AioRpcError as err:
        return err.code(), reason_of(err)
    raise AssertionError("the call was answered")


@pytest.mark.parametrize("method", ["PushState", "Hello", "PullState"])
async def test_over_grpc_a_call_that_sends_nothing_is_cut_at_the_first_message_deadline(method):
    bob = await bob_server()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{bob.port}")
    try:
        started = time.monotonic()
        got = await outcome(silent_call(channel, method), 10.0)
        assert got == (grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.IDLE)
        assert FIRST <= time.monotonic() - started < FIRST + 3.0
        assert bob.receiver.refusals == {Reason.IDLE: 1}
        assert len(bob.slots) == 0
    finally:
        await channel.close()
        await bob.stop(grace=0)


async def test_over_grpc_a_neighbour_on_a_flooded_host_still_pushes_at_once():
    # plaintext on one host: the flood and alice share 127.0.0.1; the flood's calls that sent
    # nothing hold at most the host's quota, and alice's call takes the oldest one's place
    bob = await bob_server(first=30.0)  # the flood is not cut by the deadline here
    alice = GrpcTransport(Identity("alice", MODEL, RUN), "127.0.0.1:0",
                          {"bob": f"127.0.0.1:{bob.port}"},
                          Inbox(senders={"bob"}, current_round=lambda: 0), TENSORS)
    flood_channels = [grpc.aio.insecure_channel(f"127.0.0.1:{bob.port}",
                                                options=[("grpc.use_local_subchannel_pool", 1)])
                      for _ in range(4)]
    flood = [silent_call(flood_channels[i % 4], "PushState") for i in range(40)]
    try:
        await until(lambda: sum(1 for c in flood if c.done()) >= 40 - PER_ADDRESS, 10.0,
                    interval=0.05, what="the flood was not cut down to the quota")
        assert len(bob.slots) == PER_ADDRESS
        started = time.monotonic()
        await alice.push("bob", message("alice"), timeout=10.0)
        assert time.monotonic() - started < 2.0
        assert set(bob.inbox.get(0)) == {"alice"}
        cut = [await outcome(c, 5.0) for c in flood if c.done()]
        assert set(cut) == {(grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.PREEMPTED)}
        assert bob.receiver.refusals[Reason.PREEMPTED] == len(cut) >= 40 - PER_ADDRESS
    finally:
        for c in flood:
            c.cancel()
        for ch in flood_channels:
            await ch.close()
        await alice.stop(grace=0)
        await bob.stop(grace=0)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("pki")
    write_certs(run, ["alice", "bob", "carol"])
    return run


async def test_over_tls_a_member_beyond_its_quota_is_refused_too_many_calls(pki):
    bob = await bob_server(tls=tls_files(pki, "bob").load(), first=30.0)
    address = f"127.0.0.1:{bob.port}"
    alice_channel = channels.create_channel(address, tls_files(pki, "alice").load(),
                                            target_name="bob")
    carol = GrpcTransport(Identity("carol", MODEL, RUN), "127.0.0.1:0", {"bob": address},
                          Inbox(senders={"bob"}, current_round=lambda: 0), TENSORS,
                          tls=tls_files(pki, "carol").load())
    held = [silent_call(alice_channel, "PushState") for _ in range(PER_PEER)]
    try:
        await until(lambda: len(bob.slots) >= PER_PEER, 10.0, interval=0.05)
        got = await outcome(silent_call(alice_channel, "Hello"), 10.0)
        assert got == (grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.TOO_MANY_CALLS)
        assert bob.receiver.refusals == {Reason.TOO_MANY_CALLS: 1}
        await carol.push("bob", message("carol"), timeout=10.0)  # another member: unaffected
        assert set(bob.inbox.get(0)) == {"carol"}
        assert not any(c.done() for c in held)
    finally:
        for c in held:
            c.cancel()
        await alice_channel.close()
        await carol.stop(grace=0)
        await bob.stop(grace=0)


def test_a_sender_retries_a_refusal_for_too_many_calls_as_busy():
    class Refused(grpc.aio.AioRpcError):
        def __init__(self) -> None:
            super().__init__(grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.aio.Metadata(),
                             grpc.aio.Metadata((REASON_METADATA_KEY, "too-many-calls")),
                             details="busy")

    assert unreachable(Refused())
