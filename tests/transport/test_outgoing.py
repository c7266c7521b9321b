"""The shared preparation of outgoing states: one per message, owned by no single pusher."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import torch

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode.transport import outgoing
from dacflnode.transport.base import Identity, Inbox, PeerStats, TransportClosed
from dacflnode.transport.outgoing import ChunkStream, HeaderCache
from dacflnode.transport.receiver import Receiver
from dacflnode.wire import decoder, encoder, fast_path, validation
from dacflnode.wire.message import RoundMessage

P = 16


def message(round_: int = 0) -> RoundMessage:
    return RoundMessage("a", round_, 1, {"x": torch.arange(P, dtype=torch.float32)})


def cache() -> HeaderCache:
    stats: dict[str, PeerStats] = {}
    inbox = Inbox(senders={"b"}, current_round=lambda: 0)
    return HeaderCache(Receiver(Identity("a", "m", "r"), inbox, {"x": (P,)}, stats))


class Gate:
    """Holds ``make_header`` in its worker thread until opened; counts its calls."""

    def __init__(self, fail: bool = False) -> None:
        self.open = threading.Event()
        self.entered = threading.Event()
        self.calls = 0
        self.fail = fail
        self._real: Callable[[RoundMessage], pb.StateHeader] = encoder.make_header

    def __call__(self, msg: RoundMessage) -> pb.StateHeader:
        self.calls += 1
        self.entered.set()
        self.open.wait(10)
        if self.fail:
            raise ValueError("the state could not be read")
        return self._real(msg)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    g = Gate()
    monkeypatch.setattr("dacflnode.transport.outgoing.make_header", g)
    yield g
    g.open.set()


@pytest.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    yield errors
    loop.set_exception_handler(previous)


async def entered(gate: Gate) -> None:
    await asyncio.to_thread(gate.entered.wait, 5)


async def test_a_pusher_giving_up_does_not_cancel_the_preparation_of_the_others(
    gate: Gate,
) -> None:
    headers = cache()
    sent = message()
    first = asyncio.create_task(headers.get(sent))
    second = asyncio.create_task(headers.get(sent))
    await entered(gate)
    first.cancel()
    gate.open.set()
    out = await asyncio.wait_for(second, 5)
    assert first.cancelled()
    assert out.message is sent and gate.calls == 1
    assert await headers.get(sent) is out  # a retry reuses it


async def test_a_failure_after_the_last_waiter_left_is_never_reported_as_unretrieved(
    gate: Gate, loop_errors: list[dict[str, Any]]
) -> None:
    gate.fail = True
    headers = cache()
    sent = message()
    waiter = asyncio.create_task(headers.get(sent))
    await entered(gate)
    waiter.cancel()
    gate.open.set()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    for _ in range(20):  # let the preparation fail with no one waiting
        await asyncio.sleep(0.01)
    gc.collect()
    await asyncio.sleep(0)
    assert loop_errors == []
    with pytest.raises(ValueError, match="could not be read"):
        await headers.get(sent)  # a later pusher learns of the failure...
    gate.fail = False
    assert (await headers.get(sent)).message is sent  # ...and the next one tries again
    assert gate.calls == 2


async def test_close_ends_the_preparations_still_running(gate: Gate) -> None:
    headers = cache()
    waiter = asyncio.create_task(headers.get(message()))
    await entered(gate)
    await asyncio.wait_for(headers.close(), 5)  # while the worker thread is still held
    gate.open.set()
    with pytest.raises(TransportClosed):
        await asyncio.wait_for(waiter, 5)


def test_a_chunk_stream_counts_the_payload_it_handed_out() -> None:
    sent = message()
    out = outgoing.Outgoing(sent, encoder.make_header(sent))
    stream = ChunkStream(out)
    parts = iter(stream)
    assert next(parts).WhichOneof("part") == "header" and stream.sent == 0
    assert sum(len(c.data) for c in parts) == stream.sent == sent.payload_bytes


def test_the_first_stream_of_a_message_keeps_its_checksum_for_the_next_ones() -> None:
    sent = message()
    out = outgoing.Outgoing(sent, encoder.make_header(sent))
    first = list(ChunkStream(out).serialized())
    assert out.trailer is not None
    assert pb.StateChunk.FromString(first[-1]).trailer == out.trailer
    assert list(ChunkStream(out))[-1].trailer == out.trailer
    assert list(ChunkStream(out).serialized()) == first
    decoded = decoder.decode((fast_path.parse_chunk(c) for c in first),
                             validation.Expectation(senders={"a"}, tensors={"x": (P,)}))
    assert torch.equal(decoded.tensors["x"], sent.tensors["x"])
