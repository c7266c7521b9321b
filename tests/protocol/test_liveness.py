"""Slow is not gone (docs/faults.md, section 2): a neighbour whose state does not come by the
deadline but that shows it is alive (it answers the Hello the waiting node sends, refuses a
push for its round, calls this node) is late; only a silent one is declared gone."""

from __future__ import annotations

import asyncio

import pytest

from dacflnode.protocol.edges import EdgeBook
from dacflnode.records.membership import PeerState
from dacflnode.transport.memory import MemoryNetwork
from tests.harness.polling import until
from tests.protocol.test_runner import make_runner, others


def test_missed_rounds_of_a_neighbour_that_shows_it_is_alive_do_not_declare_it_gone():
    book = EdgeBook("a", ["b"], gone_after=2)
    for t in range(4):
        assert book.note_round(t, [], ["b"], alive={"b"}) == []
    track = book.peers["b"]
    assert (track.state, track.missed, track.late, track.consecutive) == (
        PeerState.ACTIVE, 4, 4, 0)
    assert book.anchors == set()
    # then silent: gone after gone_after silent rounds in a row
    assert book.note_round(4, [], ["b"]) == []
    assert book.note_round(5, [], ["b"]) == ["b"]
    assert track.state is PeerState.GONE and book.anchors


@pytest.mark.slow
@pytest.mark.parametrize(("answers", "state"), [(True, PeerState.ACTIVE),
                                                (False, PeerState.GONE)])
async def test_a_neighbour_that_sends_nothing_is_gone_only_when_it_is_silent(answers, state):
    network = MemoryNetwork()
    a = make_runner(network, "a", ["b"], rounds=2, deadline=30.0, anchor_delay=1)
    b = make_runner(network, "b", ["a", "c"], rounds=2, deadline=1.5, gone_after=2,
                    anchor_delay=1)
    c = make_runner(network, "c", ["b"], rounds=2)  # up, but its rounds never run
    for runner in (a, b, c):
        await runner.transport.start()
    run_b = asyncio.create_task(b.run())
    await until(lambda: b.phase == "exchanging")
    if not answers:
        await c.transport.stop()  # from now on it does not answer either
    assert list(await asyncio.gather(a.run(), run_b)) == [True, True]
    track = b.peers["c"]
    assert track.state is state
    assert track.missed == 2 and track.late == (2 if answers else 0)
    assert b.alone_rounds == 0  # it mixed a in every round
    for runner in (a, b, c):
        await runner.transport.stop()
    assert others() == set()
