"""Task lifetimes of :class:`NodeRunner`: nothing it starts outlives a round or the run, its
caller's cancellation reaches the caller, refusals are recognised by their reason."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import pytest
import torch

from dacflnode.algorithms.rounds import NodeState, make_algorithm
from dacflnode.learning.layout import StateLayout
from dacflnode.learning.models import build_model
from dacflnode.learning.train import LocalTrainer, TrainConfig
from dacflnode.protocol.runner import NodeRunner
from dacflnode.protocol.setup import NodeSetup
from dacflnode.protocol.training import ThreadedTrainer
from dacflnode.records.checkpoint import Checkpoint
from dacflnode.transport.base import Identity
from dacflnode.transport.memory import MemoryNetwork, MemoryTransport
from dacflnode.wire.errors import Reason, WireError
from dacflnode.wire.message import Kind, RoundMessage


def make_runner(
    network: MemoryNetwork, node_id: str, neighbours: list[str], *, start_round: int = 0,
    rounds: int = 3, deadline: float = math.inf, used_prev: tuple[str, ...] = (),
    **options: Any,
) -> NodeRunner:
    torch.manual_seed(0)
    model = build_model("tiny-cnn", (1, 8, 8), 10)
    layout = StateLayout.from_module(model)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(20, 1, 8, 8, generator=gen), torch.randint(0, 10, (20,), generator=gen)
    local = LocalTrainer(model, x, y, TrainConfig(lr=0.05), seed=0, node_index=0)
    algorithm = make_algorithm("dacfl")
    transport = partial(MemoryTransport, network, Identity(node_id, layout.fingerprint(), "test"),
                        neighbours, tensors={name: (layout.numel,) for name in algorithm.exchanged})
    setup = NodeSetup(node_id=node_id, neighbours=neighbours, algorithm=algorithm,
                      trainer=ThreadedTrainer(local, x, y), layout=layout, rounds=rounds,
                      round_deadline=deadline, **options)
    state = replace(NodeState.initial(layout.flatten_module(model)), round=start_round)
    resume = None
    if used_prev:
        resume = Checkpoint(state, {}, {}, used_log=((start_round - 1, used_prev),))
    return NodeRunner(setup, transport, state, resume)


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def others() -> set[asyncio.Task[object]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


def record_pushes(runner: NodeRunner) -> list[RoundMessage]:
    """Every message ``runner`` pushes from now on, in order (each push still goes out)."""
    sent: list[RoundMessage] = []
    push = runner.transport.push

    async def recording_push(peer: str, message: RoundMessage, timeout: float) -> None:
        sent.append(message)
        await push(peer, message, timeout)

    runner.transport.push = recording_push  # type: ignore[method-assign]
    return sent


async def stuck_exchange() -> tuple[NodeRunner, asyncio.Task[bool]]:
    """Node a (resumed in round 2) pushes to b (in round 0), which refuses it as too far
    ahead, so a's push retries and a waits for b's state: both stay pending."""
    network = MemoryNetwork()
    a = make_runner(network, "a", ["b"], start_round=2)
    b = make_runner(network, "b", ["a"])
    await a.transport.start()
    await b.transport.start()
    sent = record_pushes(a)
    task = asyncio.create_task(a.run())
    await until(lambda: len(sent) >= 2)  # refused once, retrying
    assert a.phase == "exchanging"
    assert len(others()) >= 3  # the run, its exchange, the push being retried (and more)
    return a, task


def test_cancelling_run_cancels_the_pushes_and_reaches_the_caller():
    async def scenario() -> None:
        _, task = await stuck_exchange()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert others() == set()

    asyncio.run(scenario())


def test_a_stop_request_abandons_the_exchange_and_leaves_no_task():
    async def scenario() -> None:
        a, task = await stuck_exchange()
        a.request_stop()
        assert await asyncio.wait_for(task, 10) is False
        assert a.phase == "stopped" and a.round == 2
        assert others() == set()

    asyncio.run(scenario())


def test_a_neighbour_past_the_round_is_not_offered_it_again():
    async def scenario() -> None:
        network = MemoryNetwork()
        a = make_runner(network, "a", ["b"], rounds=1, deadline=0.5)
        b = make_runner(network, "b", ["a"], start_round=1)
        await a.transport.start()
        await b.transport.start()
        sent = record_pushes(a)
        assert await a.run() is True
        # refused as ROUND_PASSED: no retry until the deadline (then the closing exchange)
        assert [(m.round, m.kind) for m in sent] == [(0, Kind.STATE), (1, Kind.FINAL)]
        assert a.last is not None and a.last.missing == ("b",)
        assert others() == set()

    asyncio.run(scenario())


def test_two_runners_finish_their_rounds_and_leave_no_task():
    async def scenario() -> None:
        network = MemoryNetwork()
        a = make_runner(network, "a", ["b"])
        b = make_runner(network, "b", ["a"])
        await a.transport.start()
        await b.transport.start()
        assert list(await asyncio.gather(a.run(), b.run())) == [True, True]
        assert a.round == b.round == 3
        assert a.last is not None and b.last is not None
        assert (a.last.used, b.last.used) == (("b",), ("a",))
        assert others() == set()

    asyncio.run(scenario())


def test_a_resumed_node_announces_the_neighbours_its_checkpoint_says_it_used():
    async def scenario() -> None:
        network = MemoryNetwork()
        a = make_runner(network, "a", ["b"], start_round=1, rounds=2, used_prev=("b",))
        b = make_runner(network, "b", ["a"], start_round=1, rounds=2)
        await a.transport.start()
        await b.transport.start()
        sent = record_pushes(a)
        assert list(await asyncio.gather(a.run(), b.run())) == [True, True]
        assert [(m.round, m.used, m.kind) for m in sent[:2]] == [
            (1, ("b",), Kind.STATE), (2, ("b",), Kind.FINAL)]
        # then the other closing exchanges, one per round of the anchor delay
        assert [(m.round, m.kind) for m in sent[2:]] == [(r, Kind.FINAL) for r in (3, 4, 5)]
        assert a.round == b.round == 2

    asyncio.run(scenario())


def test_a_push_refused_as_a_duplicate_counts_as_delivered():
    async def scenario() -> None:
        network = MemoryNetwork()
        a = make_runner(network, "a", ["b"], rounds=1, deadline=0.5)
        b = make_runner(network, "b", ["a"])
        await a.transport.start()
        await b.transport.start()
        # b already holds a's round-0 state (it pulled it, say)
        own = a.setup.algorithm.outgoing(a.state)
        await b.transport.inbox.put(RoundMessage("a", 0, 1, own))
        sent = record_pushes(a)
        assert await a.run() is True
        # refused as DUPLICATE: no retry until the deadline (then the closing exchange)
        assert [(m.round, m.kind) for m in sent] == [(0, Kind.STATE), (1, Kind.FINAL)]
        assert others() == set()

    asyncio.run(scenario())


def test_the_runner_guards_its_inbox_and_an_honest_run_is_never_refused():
    async def scenario() -> None:
        network = MemoryNetwork()
        a = make_runner(network, "a", ["b"])
        b = make_runner(network, "b", ["a"])
        await a.transport.start()
        await b.transport.start()
        assert a.transport.inbox.guard is not None
        assert list(await asyncio.gather(a.run(), b.run())) == [True, True]
        for runner in (a, b):
            assert isinstance(runner.transport, MemoryTransport)
            assert runner.transport.receiver.refusals == {}
        forged = RoundMessage("b", 3, 1, {n: torch.full_like(t, 1e6) for n, t in
                                          a.setup.algorithm.outgoing(a.state).items()})
        with pytest.raises(WireError) as err:
            await a.transport.inbox.put(forged)
        assert err.value.reason is Reason.ABSURD_STATE
        assert a.transport.inbox.get(3) == {}

    asyncio.run(scenario())


def test_a_state_asked_for_twice_is_pulled_once_and_a_duplicate_is_not_a_warning(caplog):
    """A restarted node pulls the state of a neighbour already past its round, and its push of
    that round, refused ROUND_PASSED, asks for the same state: one pull, no WARNING (the
    second used to fail as "received already"); a push that lands during a pull is no
    warning either."""
    async def scenario() -> None:
        network = MemoryNetwork()
        a = make_runner(network, "a", ["b"])
        calls: list[int] = []
        release = asyncio.Event()

        async def slow_pull(peer: str, round_: int, expect_tensors: object = None,
                            timeout: float = 0.0, copy_id: int = 0) -> RoundMessage:
            calls.append(round_)
            await release.wait()
            return RoundMessage("b", round_, 1, state_of_b(round_))

        def state_of_b(round_: int) -> dict[str, torch.Tensor]:
            # b's state of each round (honest states differ from round to round)
            return {k: v + 1e-3 * round_ for k, v in a.setup.algorithm.outgoing(a.state).items()}

        a.transport.pull = slow_pull  # type: ignore[method-assign]
        deadline = asyncio.get_running_loop().time() + 10
        first = asyncio.create_task(a.exchanger.pull("b", 0, deadline))
        second = asyncio.create_task(a.exchanger.pull("b", 0, deadline))
        await until(lambda: calls == [0])
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.gather(first, second)
        assert calls == [0] and a.transport.inbox.has(0, "b")

        release.clear()  # a pull of round 1 overtaken by the push of the same state
        pull = asyncio.create_task(a.exchanger.pull("b", 1, deadline))
        await until(lambda: calls == [0, 1])
        await a.transport.inbox.put(RoundMessage("b", 1, 1, state_of_b(1)))
        release.set()
        await pull
        assert a.transport.inbox.has(1, "b")

    with caplog.at_level(logging.INFO, logger="dacflnode"):
        asyncio.run(scenario())
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert sum("pulled round" in r.getMessage() for r in caplog.records) == 1


def test_the_runner_builds_its_inbox_with_what_the_inbox_asks_of_the_node():
    """The inbox gets the node's round, the guard and the answer to a join when the runner
    makes it, before the transport exists: nothing is patched in afterwards."""
    network = MemoryNetwork()
    a = make_runner(network, "a", ["b"], start_round=3)
    inbox = a.transport.inbox
    assert inbox.current_round() == 3
    assert inbox.guard is not None and inbox.on_refused is not None
    assert inbox.on_join is not None
    assert inbox.on_join("b", 0) == 0  # a Hello that proposes nothing: mixed as always
    assert inbox.copy_of is None and inbox.outgoing is None  # no compression, no poison
    assert inbox.senders == ["b"]


def test_a_join_proposal_is_answered_by_the_runners_edges():
    async def scenario() -> None:
        network = MemoryNetwork()
        a = make_runner(network, "a", ["b"], start_round=3)
        assert a.transport.inbox.on_join is not None
        assert a.transport.inbox.on_join("b", 6) == 6  # mixed again from the proposed round
        assert a.peers["b"].active_from == 6

    asyncio.run(scenario())
