"""A round's report counts the bytes moved for that round, however early or late they land."""

from __future__ import annotations

import asyncio

from dacflnode.protocol.runner import NodeRunner
from dacflnode.transport.base import PeerStats
from dacflnode.transport.memory import MemoryNetwork
from tests.protocol.test_runner import make_runner


def test_bytes_are_taken_once_by_the_round_they_were_moved_for() -> None:
    stats = PeerStats()
    stats.sent(100, 3)
    stats.received(90, 3)
    stats.received(80, 4)  # a neighbour ahead pushed round 4 already
    assert stats.take(3) == (100, 90)
    assert stats.take(3) == (0, 0)
    stats.sent(7, 2)  # a pull of round 2 served late
    assert stats.take(4) == (7, 80)
    assert (stats.bytes_sent, stats.bytes_received) == (107, 170)  # the totals keep all


def test_in_a_healthy_ring_every_rounds_received_bytes_match_its_sent_bytes() -> None:
    """Four nodes over the byte-for-byte network path: each round's line counts the states
    of that round, however the nodes drift (a fast one pushes the next round early)."""
    async def scenario() -> list[NodeRunner]:
        network = MemoryNetwork(copy=True)
        ids = [f"n{i}" for i in range(4)]
        runners = [make_runner(network, node, [ids[(i - 1) % 4], ids[(i + 1) % 4]], rounds=4,
                               deadline=30.0)
                   for i, node in enumerate(ids)]
        reports: dict[str, list[tuple[int, int]]] = {node: [] for node in ids}
        for runner in runners:
            await runner.transport.start()
            runner.on_round = (lambda r, node=runner.setup.node_id:
                               reports[node].append((r.bytes_sent, r.bytes_received)))
        assert all(await asyncio.gather(*(r.run() for r in runners)))
        for node, lines in reports.items():
            assert len(lines) == 4, node
            for sent, received in lines:
                assert sent > 0 and abs(received - sent) <= 0.1 * sent, (node, lines)
        return runners

    asyncio.run(scenario())
