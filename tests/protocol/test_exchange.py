"""The exchange: what a fault drops is neither pushed nor waited for, and liveness is data."""

from __future__ import annotations

import asyncio
import time

from dacflnode.protocol.exchange import Exchanged
from dacflnode.protocol.fault_filter import FaultFilter
from dacflnode.protocol.faults import Drop, FaultPlan
from dacflnode.protocol.runner import NodeRunner
from dacflnode.transport.memory import MemoryNetwork
from dacflnode.wire.message import Kind
from tests.protocol.test_runner import make_runner, record_pushes


def test_a_dropped_edge_round_is_neither_pushed_nor_waited_for() -> None:
    async def scenario() -> None:
        plan = FaultPlan([Drop("a", "b", 0, 0), Drop("b", "a", 0, 0)])
        network = MemoryNetwork()
        a = make_runner(network, "a", ["b"], faults=plan)
        await a.transport.start()
        sent = record_pushes(a)
        message = await a.book.message(0, 1, Kind.STATE, a.state, (), ())
        started = time.monotonic()
        # b is not even running: without the drop, the exchange would wait for its deadline
        exchanged = await a.exchanger.run(0, ["b"], [], message, started + 30.0, probe=True,
                                          since=started)
        assert time.monotonic() - started < 5.0
        assert sent == [] and exchanged.received == {}

    asyncio.run(scenario())


def test_a_neighbour_is_alive_if_it_showed_it_or_called_unless_its_state_was_dropped() -> None:
    exchanged = Exchanged(3, {}, shown_alive={"b"}, since=100.0)
    heard = {"c": 101.0, "d": 99.0, "e": 150.0}
    faults = FaultFilter("a", FaultPlan([Drop("e", "a", 3, 3)]))
    assert exchanged.alive(["b", "c", "d", "e", "f"], heard, faults) == {"b", "c"}
    assert exchanged.alive(["b"], {}, FaultFilter("a", None)) == {"b"}


async def pair(round_a: int, round_b: int) -> tuple[NodeRunner, NodeRunner]:
    """Neighbours ``a`` and ``b``, serving, in rounds ``round_a`` and ``round_b``."""
    network = MemoryNetwork()
    a = make_runner(network, "a", ["b"], start_round=round_a)
    b = make_runner(network, "b", ["a"], start_round=round_b)
    for runner in (a, b):
        await runner.transport.start()
    return a, b


def test_a_state_a_neighbour_past_the_round_no_longer_keeps_is_not_waited_for() -> None:
    # a is three rounds behind b, which keeps only its last two states: a's push of round 3 is
    # refused as passed, its pull of round 3 as not kept; that state can never come
    async def scenario() -> None:
        a, _b = await pair(3, 6)  # b serves: it refuses and answers
        message = await a.book.message(3, 1, Kind.STATE, a.state, (), ())
        started = time.monotonic()
        exchanged = await a.exchanger.run(3, ["b"], [], message, started + 30.0, probe=True,
                                          since=started)
        assert time.monotonic() - started < 5.0  # not the 30 s deadline
        assert exchanged.received == {} and exchanged.shown_alive == {"b"}  # late, not gone
        assert a.transport.inbox.forgone(3, "b")

    asyncio.run(scenario())


def test_a_neighbour_in_the_round_a_restarted_node_resumes_is_waited_for_if_it_kept_nothing(
) -> None:
    # a restarted in round 3 and b is in round 3 too: b's state is pulled in case it went to
    # a's previous process; b has not published it yet, and will push it: a waits for it
    async def scenario() -> None:
        a, b = await pair(3, 3)
        a.exchanger.resumed_at = 3
        a.exchanger.peer_rounds["b"] = 3
        message = await a.book.message(3, 1, Kind.STATE, a.state, (), ())
        started = time.monotonic()
        exchange = asyncio.create_task(a.exchanger.run(
            3, ["b"], [], message, started + 30.0, probe=False, since=started))
        await asyncio.sleep(0.5)
        assert not exchange.done() and not a.transport.inbox.forgone(3, "b")
        theirs = await b.book.message(3, 1, Kind.STATE, b.state, (), ())
        await b.exchanger.push("a", theirs, time.monotonic() + 5.0)
        exchanged = await asyncio.wait_for(exchange, 5.0)
        assert set(exchanged.received) == {"b"}

    asyncio.run(scenario())
