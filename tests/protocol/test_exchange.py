"""The exchange: what a fault drops is neither pushed nor waited for, and liveness is data."""

from __future__ import annotations

import asyncio
import time

from dacflnode.protocol.exchange import Exchanged
from dacflnode.protocol.fault_filter import FaultFilter
from dacflnode.protocol.faults import Drop, FaultPlan
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
