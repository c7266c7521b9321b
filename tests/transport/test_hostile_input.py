"""Hostile input to the serving side: impersonation, strangers, stalled and trickling streams,
concurrent duplicates, forged log lines. None of it crashes the node or changes its state, and
every refusal is counted by reason."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterable
from functools import partial

import grpc
import pytest
import torch

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode._proto.dacfl.v1 import neighbor_pb2_grpc
from dacflnode.transport import grpc_service
from dacflnode.transport.base import Identity, Inbox, PeerStats
from dacflnode.transport.grpc_status import reason_of
from dacflnode.transport.grpc_transport import GrpcTransport
from dacflnode.transport.receiver import (
    FIRST_MESSAGE_TIMEOUT,
    IDLE_TIMEOUT,
    STREAM_TIMEOUT,
    Receiver,
)
from dacflnode.wire.encoder import encode
from dacflnode.wire.errors import Reason, WireError
from dacflnode.wire.message import PROTOCOL_VERSION
from tests.harness import messages as harness
from tests.harness.polling import until

P = 32
TENSORS = {"omega": (P,), "x": (P,)}
MODEL, RUN = "model-fingerprint-1", "run-fingerprint-1"
LOGGER = "dacflnode.transport.receiver"


message = partial(harness.message, size=P, degree=2)


def receiving(r: Receiver) -> int:
    """The streams whose header ``r`` took and which are still arriving."""
    return sum(len(calls) for calls in r._receiving.values())


def bob(idle: float = IDLE_TIMEOUT, total: float = STREAM_TIMEOUT,
        first_message: float = FIRST_MESSAGE_TIMEOUT) -> Receiver:
    inbox = Inbox(senders=frozenset({"alice", "carol"}), current_round=lambda: 0)
    return Receiver(Identity("bob", MODEL, RUN), inbox, TENSORS, {},
                    idle_timeout=idle, stream_timeout=total,
                    first_message_timeout=first_message)


async def stream_of(chunks: Iterable[pb.StateChunk], pause: float = 0.0,
                    stall_after: int | None = None) -> AsyncIterator[pb.StateChunk]:
    for i, chunk in enumerate(chunks):
        if stall_after is not None and i == stall_after:
            await asyncio.Event().wait()  # never set: the sender stalls
        if pause:
            await asyncio.sleep(pause)
        yield chunk


def hello(node_id: str) -> pb.HelloRequest:
    return pb.HelloRequest(node_id=node_id, protocol_version=PROTOCOL_VERSION,
                           model_fingerprint=MODEL,
                           run_fingerprint=RUN)


# ---------------------------------------------------------------- identities
async def test_a_member_pushing_as_another_member_is_refused_as_a_stranger():
    r = bob()
    with pytest.raises(WireError) as err:
        await r.push(stream_of(encode(message("carol"))), peer_ids=frozenset({"alice"}))
    assert (err.value.code, err.value.message, err.value.reason) == (
        "PERMISSION_DENIED", "refused", Reason.NOT_AUTHENTICATED)
    assert r.inbox.get(0) == {}
    await r.push(stream_of(encode(message("alice"))), peer_ids=frozenset({"alice"}))
    assert set(r.inbox.get(0)) == {"alice"}
    assert r.refusals == {Reason.NOT_AUTHENTICATED: 1}


async def test_a_member_pulling_as_another_member_is_refused():
    r = bob()
    r.publish(message("bob"), None)
    with pytest.raises(WireError) as err:
        r.pull(pb.PullRequest(requester="carol", round=0), peer_ids=frozenset({"alice"}))
    assert (err.value.code, err.value.message, err.value.reason) == (
        "PERMISSION_DENIED", "refused", Reason.NOT_AUTHENTICATED)
    chunks = list(r.pull(pb.PullRequest(requester="alice", round=0),
                         peer_ids=frozenset({"alice"})))
    assert chunks[0].header.sender == "bob"


@pytest.mark.parametrize("claimed", ["alice", "carol", "mallory"])
def test_a_stranger_learns_nothing_about_membership_from_its_refusal(claimed):
    # authenticated as mallory (or as no one): the answer is the same whoever it claims to be
    r = bob()
    for peer_ids in (frozenset({"mallory"}), frozenset()):
        with pytest.raises(WireError) as err:
            r.hello(hello(claimed + "-not-me"), peer_ids=peer_ids)
        assert (err.value.code, err.value.message, err.value.reason) == (
            "PERMISSION_DENIED", "refused", Reason.NOT_AUTHENTICATED)
    assert r.refusals == {Reason.NOT_AUTHENTICATED: 2}


def test_an_authenticated_node_that_is_not_a_neighbour_is_refused():
    r = bob()
    with pytest.raises(WireError) as err:
        r.hello(hello("mallory"), peer_ids=frozenset({"mallory"}))
    assert (err.value.message, err.value.reason) == ("refused", Reason.NOT_NEIGHBOUR)
    assert r.hello(hello("alice"), peer_ids=frozenset({"alice"})).node_id == "bob"


async def test_a_newline_in_a_claimed_id_cannot_forge_a_log_line(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    r = bob()
    forged = "x\nWARNING dacflnode.node: all rounds done"
    with pytest.raises(WireError):
        await r.push(stream_of(encode(message(forged))))
    with pytest.raises(WireError):
        r.hello(hello(forged))
    lines = [rec.getMessage() for rec in caplog.records if rec.name == LOGGER]
    assert len(lines) == 2 and not any("\n" in line for line in lines)
    assert all(repr(forged) in line for line in lines)


# ---------------------------------------------------------------- one state per sender and round
async def test_two_streams_of_one_state_may_arrive_at_once_and_the_first_complete_is_kept():
    r = bob()
    first = asyncio.create_task(r.push(stream_of(encode(message("alice"), chunk_bytes=32),
                                                 pause=0.05)))
    await asyncio.sleep(0.08)  # the first stream's header is in, its data is not
    await r.push(stream_of(encode(message("alice", seed=1))))  # a second one completes first
    assert torch.equal(r.inbox.get(0)["alice"].tensors["x"], message("alice", seed=1).tensors["x"])
    with pytest.raises(WireError) as err:  # the first is cut at once, as a duplicate
        await asyncio.wait_for(first, 1.0)
    assert (err.value.code, err.value.reason) == ("ALREADY_EXISTS", Reason.DUPLICATE)
    with pytest.raises(WireError) as err:  # done now: a duplicate
        await r.push(stream_of(encode(message("alice", seed=2))))
    assert (err.value.code, err.value.reason) == ("ALREADY_EXISTS", Reason.DUPLICATE)
    assert r.refusals == {Reason.DUPLICATE: 2}
    assert r._receiving == {}


async def test_a_third_stream_while_two_arrive_is_refused_in_progress():
    r = bob()
    slow = [asyncio.create_task(r.push(stream_of(encode(message("alice", seed=s),
                                                        chunk_bytes=32), pause=0.05)))
            for s in (0, 1)]
    await until(lambda: receiving(r) == 2)  # both headers are in, and both streams keep sending
    with pytest.raises(WireError) as err:
        await r.push(stream_of(encode(message("alice", seed=2))))
    assert (err.value.code, err.value.reason) == ("ABORTED", Reason.IN_PROGRESS)
    results = await asyncio.gather(*slow, return_exceptions=True)
    assert sum(isinstance(x, pb.PushReply) for x in results) == 1
    assert [x.reason for x in results if isinstance(x, WireError)] == [Reason.DUPLICATE]
    assert r.refusals == {Reason.IN_PROGRESS: 1, Reason.DUPLICATE: 1}


async def test_a_stalled_stream_in_a_neighbours_name_does_not_delay_its_real_push():
    r = bob()  # deadlines of 30 s and more: nothing here waits for them
    stalled = asyncio.create_task(r.push(stream_of(encode(message("alice", seed=9)),
                                                   stall_after=1)))
    await until(lambda: receiving(r) == 1)  # its header is in, then it sends nothing
    started = time.monotonic()
    await r.push(stream_of(encode(message("alice"))))
    assert time.monotonic() - started < 1.0
    assert torch.equal(r.inbox.get(0)["alice"].tensors["x"], message("alice").tensors["x"])
    with pytest.raises(WireError) as err:
        await asyncio.wait_for(stalled, 1.0)
    assert err.value.reason is Reason.DUPLICATE


async def test_stalled_duplicates_give_way_after_the_first_message_deadline():
    first_message = 0.3
    r = bob(first_message=first_message)
    stalled = [asyncio.create_task(r.push(stream_of(encode(message("alice", seed=s)),
                                                    stall_after=1)))
               for s in (7, 8)]
    await until(lambda: receiving(r) == 2)  # both headers are in
    with pytest.raises(WireError) as err:  # both candidates are fresh: retry later
        await r.push(stream_of(encode(message("alice"))))
    assert err.value.reason is Reason.IN_PROGRESS
    await asyncio.sleep(first_message)  # not a wait for an event: the deadline passes
    started = time.monotonic()
    await r.push(stream_of(encode(message("alice"))))  # takes the stalest one's place
    assert time.monotonic() - started < 1.0
    results = await asyncio.wait_for(asyncio.gather(*stalled, return_exceptions=True), 2.0)
    errors = [x for x in results if isinstance(x, WireError)]
    assert sorted(x.reason for x in errors) == sorted([Reason.PREEMPTED, Reason.DUPLICATE])
    assert [x.code for x in errors if x.reason is Reason.PREEMPTED] == ["RESOURCE_EXHAUSTED"]
    assert torch.equal(r.inbox.get(0)["alice"].tensors["x"], message("alice").tensors["x"])
    assert r._receiving == {}


@pytest.mark.slow
async def test_a_flood_of_duplicates_holds_at_most_two_buffers_per_state():
    r = bob(first_message=0.05)
    opened = []
    for i in range(30):  # each one stalls after its header; every new one finds stale ones
        opened.append(asyncio.create_task(r.push(stream_of(encode(message("alice", seed=i)),
                                                           stall_after=1))))
        # not a wait for an event: the first-message deadline passes (the header needs far
        # less), so that the next stream finds this one stale
        await asyncio.sleep(0.06)
        assert sum(len(v) for v in r._receiving.values()) <= 2
    await r.push(stream_of(encode(message("alice"))))
    results = await asyncio.wait_for(asyncio.gather(*opened, return_exceptions=True), 2.0)
    errors = [x for x in results if isinstance(x, WireError)]
    assert len(errors) == len(results)
    assert {x.reason for x in errors} <= {Reason.PREEMPTED, Reason.DUPLICATE, Reason.IN_PROGRESS}
    assert r._receiving == {}


async def test_a_stream_that_sends_no_header_is_cut_at_the_first_message_deadline():
    r = bob(first_message=0.2)
    started = time.monotonic()
    with pytest.raises(WireError) as err:
        await r.push(stream_of(encode(message("alice")), stall_after=0))
    assert 0.2 <= time.monotonic() - started < 2.0
    assert (err.value.code, err.value.reason) == ("RESOURCE_EXHAUSTED", Reason.IDLE)
    assert "no header" in err.value.message


# ---------------------------------------------------------------- deadlines
async def test_a_stalled_stream_is_cut_at_the_idle_deadline_and_released():
    r = bob(idle=0.2)
    started = time.monotonic()
    with pytest.raises(WireError) as err:
        await r.push(stream_of(encode(message("alice"), chunk_bytes=32), stall_after=2))
    assert 0.2 <= time.monotonic() - started < 2.0
    assert (err.value.code, err.value.reason) == ("RESOURCE_EXHAUSTED", Reason.IDLE)
    assert r.inbox.get(0) == {} and r.refusals == {Reason.IDLE: 1}
    await r.push(stream_of(encode(message("alice"))))  # its round is free again
    assert set(r.inbox.get(0)) == {"alice"}


async def test_a_trickling_stream_is_cut_at_the_total_deadline():
    r = bob(idle=1.0, total=0.4)
    started = time.monotonic()
    with pytest.raises(WireError) as err:  # a chunk every 0.1 s: never idle, never done
        await r.push(stream_of(encode(message("alice"), chunk_bytes=4), pause=0.1))
    assert 0.4 <= time.monotonic() - started < 2.0
    assert (err.value.code, err.value.reason) == ("RESOURCE_EXHAUSTED", Reason.TOO_SLOW)
    assert r.inbox.get(0) == {} and r.refusals == {Reason.TOO_SLOW: 1}


def test_the_default_deadlines_are_generous_but_finite():
    assert (IDLE_TIMEOUT, STREAM_TIMEOUT) == (30.0, 300.0)
    r = Receiver(Identity("bob", MODEL, RUN), Inbox(senders={"a"}, current_round=lambda: 0),
                 TENSORS, {"a": PeerStats()})
    assert (r.idle_timeout, r.stream_timeout) == (IDLE_TIMEOUT, STREAM_TIMEOUT)


async def grpc_bob(idle: float) -> tuple[GrpcTransport, grpc.aio.Channel]:
    inbox = Inbox(senders={"alice"}, current_round=lambda: 0)
    server = GrpcTransport(Identity("bob", MODEL, RUN), "127.0.0.1:0", {"alice": ""}, inbox,
                           TENSORS)
    server.receiver.idle_timeout = idle
    await server.start()
    return server, grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")


async def test_over_grpc_a_stalled_stream_is_cut_at_once_not_drained():
    server, channel = await grpc_bob(idle=0.3)
    stub = neighbor_pb2_grpc.NeighborStub(channel)
    try:
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.PushState(stream_of(encode(message("alice"), chunk_bytes=32),
                                           stall_after=2), timeout=20)
        assert (err.value.code(), reason_of(err.value)) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.IDLE)
        assert time.monotonic() - started < 0.3 + grpc_service.DRAIN_SECONDS / 2
    finally:
        await channel.close()
        await server.stop(grace=0)


async def test_over_grpc_stalled_streams_hold_two_buffers_and_are_cut(monkeypatch):
    monkeypatch.setattr(grpc_service, "DRAIN_SECONDS", 0.5)  # refused stalled streams
    server, channel = await grpc_bob(idle=0.3)
    inbox = server.inbox
    stub = neighbor_pb2_grpc.NeighborStub(channel)
    try:
        started = time.monotonic()
        calls = [stub.PushState(stream_of(encode(message("alice"), chunk_bytes=32),
                                          stall_after=1), timeout=20) for _ in range(5)]
        codes = []
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            codes.append((err.value.code(), reason_of(err.value)))
        elapsed = time.monotonic() - started
        # two streams hold a buffer for alice's round 0 until they are cut; the others are
        # refused (none of the two had stalled for the first-message deadline, 5 s)
        assert codes.count((grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.IDLE)) == 2, codes
        assert codes.count((grpc.StatusCode.ABORTED, Reason.IN_PROGRESS)) == 3, codes
        assert elapsed < 5.0
        assert inbox.get(0) == {} and server.receiver._receiving == {}
        assert server.receiver.refusals == {Reason.IDLE: 2, Reason.IN_PROGRESS: 3}
        await stub.PushState(stream_of(encode(message("alice"))), timeout=5)
        assert set(inbox.get(0)) == {"alice"}
    finally:
        await channel.close()
        await server.stop(grace=0)
