"""The Exchange call of asynchronous DACFL, over both transports: the request reaches the
answering node's handler whole, the answer comes back checked, refusals keep their reason."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dacflnode.transport.base import PeerUnavailable
from dacflnode.wire.errors import Reason, WireError
from dacflnode.wire.message import Kind, RoundMessage
from tests.harness.messages import message
from tests.transport.test_protocol import FULL, Cluster, P


@pytest.fixture(params=["memory", "memory-nocopy", "grpc"])
async def cluster(request):
    c = Cluster(request.param)
    yield c
    await c.close()


def request(sender: str = "a", blocks: int = 3, exchange_id: int = 7) -> RoundMessage:
    return dataclasses.replace(message(sender, blocks, size=P, degree=2), kind=Kind.EXCHANGE,
                               exchange_id=exchange_id)


def answering(node, weight: float = 1 / 3):
    """Make ``node`` answer with ``weight × its request`` (and remember what it was asked)."""
    asked: list[RoundMessage] = []

    async def on_exchange(req: RoundMessage) -> RoundMessage:
        asked.append(req)
        tensors = ({} if req.kind is Kind.EXCHANGE_DONE else
                   {k: v * weight for k, v in req.tensors.items()})
        return RoundMessage(node.id, node.round, 2, tensors, kind=Kind.EXCHANGED,
                            exchange_id=req.exchange_id, weight=weight)

    node.inbox.on_exchange = on_exchange
    return asked


async def test_an_exchange_reaches_the_handler_whole_and_its_answer_comes_back(cluster):
    nodes = await cluster.build(FULL)
    nodes["b"].round = 5
    asked = answering(nodes["b"])
    sent = request()
    reply = await nodes["a"].transport.exchange("b", sent, timeout=10)
    (got,) = asked
    assert (got.sender, got.round, got.kind, got.exchange_id) == ("a", 3, Kind.EXCHANGE, 7)
    assert all(torch.equal(got.tensors[k], sent.tensors[k]) for k in sent.tensors)
    assert (reply.sender, reply.round, reply.kind, reply.exchange_id) == (
        "b", 5, Kind.EXCHANGED, 7)
    assert reply.weight == 1 / 3
    for k in sent.tensors:
        assert torch.equal(reply.tensors[k], sent.tensors[k] * (1 / 3))
    # both ends count the bytes: the request's out and in, the answer's back
    a_stats, b_stats = nodes["a"].transport.stats["b"], nodes["b"].transport.stats["a"]
    assert a_stats.bytes_sent == b_stats.bytes_received == sent.payload_bytes
    assert a_stats.bytes_received == b_stats.bytes_sent == reply.payload_bytes


async def test_a_done_notice_carries_no_tensors_and_is_answered_empty(cluster):
    nodes = await cluster.build(FULL)
    asked = answering(nodes["b"])
    done = RoundMessage("a", 9, 2, {}, kind=Kind.EXCHANGE_DONE, exchange_id=11)
    reply = await nodes["a"].transport.exchange("b", done, timeout=10)
    assert [m.kind for m in asked] == [Kind.EXCHANGE_DONE]
    assert (reply.kind, reply.exchange_id, dict(reply.tensors)) == (Kind.EXCHANGED, 11, {})


async def test_a_node_of_the_synchronous_schedule_refuses_every_exchange(cluster):
    nodes = await cluster.build(FULL)
    with pytest.raises(WireError) as err:
        await nodes["a"].transport.exchange("b", request(), timeout=10)
    assert err.value.reason is Reason.MISMATCH and "synchronous" in err.value.message
    assert nodes["b"].transport.receiver.refusals[Reason.MISMATCH] == 1


async def test_the_handlers_refusal_reaches_the_asking_node_with_its_reason(cluster):
    nodes = await cluster.build(FULL)

    async def stale(req: RoundMessage) -> RoundMessage:
        raise WireError("FAILED_PRECONDITION", "too stale", Reason.ROUND_PASSED)

    nodes["b"].inbox.on_exchange = stale
    with pytest.raises(WireError) as err:
        await nodes["a"].transport.exchange("b", request(), timeout=10)
    assert err.value.reason is Reason.ROUND_PASSED


@pytest.mark.parametrize("bad", ["state-kind", "tensors-on-done", "wrong-shape"])
async def test_a_malformed_request_is_refused_before_the_handler_runs(cluster, bad):
    nodes = await cluster.build(FULL)
    asked = answering(nodes["b"])
    if bad == "state-kind":
        sent = dataclasses.replace(request(), kind=Kind.STATE)
    elif bad == "tensors-on-done":
        sent = dataclasses.replace(request(), kind=Kind.EXCHANGE_DONE)
    else:
        sent = dataclasses.replace(request(), tensors={"omega": torch.zeros(P + 1),
                                                       "x": torch.zeros(P + 1)})
    with pytest.raises(WireError) as err:
        await nodes["a"].transport.exchange("b", sent, timeout=10)
    assert err.value.reason in (Reason.BAD_HEADER, Reason.BAD_PAYLOAD)
    assert asked == []


async def test_an_answer_to_another_exchange_is_refused_by_the_asking_node(cluster):
    nodes = await cluster.build(FULL)

    async def confused(req: RoundMessage) -> RoundMessage:
        return RoundMessage("b", 0, 2, dict(req.tensors), kind=Kind.EXCHANGED,
                            exchange_id=req.exchange_id + 1, weight=0.25)

    nodes["b"].inbox.on_exchange = confused
    with pytest.raises(WireError) as err:
        await nodes["a"].transport.exchange("b", request(), timeout=10)
    assert err.value.reason is Reason.BAD_HEADER


async def test_an_exchange_with_an_absent_neighbour_is_unavailable(cluster):
    nodes = await cluster.build({"a": ["b"]})
    with pytest.raises(PeerUnavailable):
        await nodes["a"].transport.exchange("b", request(), timeout=2)


async def test_a_push_of_an_exchange_kind_is_refused():
    """A round's push carries round kinds only: an exchange's snapshot pushed is refused."""
    c = Cluster("memory")
    try:
        nodes = await c.build(FULL)
        with pytest.raises(WireError) as err:
            await nodes["a"].transport.push("b", request(blocks=0), timeout=5)
        assert err.value.reason is Reason.BAD_HEADER
    finally:
        await c.close()
