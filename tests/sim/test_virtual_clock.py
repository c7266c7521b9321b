"""The simulator's virtual-clock event loop: simulated time costs no real time, is deterministic,
waits for executor threads, and fails loudly on a deadlock."""

from __future__ import annotations

import asyncio
import gc
import random
import socket
import threading
import time
import warnings
from collections.abc import AsyncIterator

import pytest

from dacflnode.sim.virtual_clock import (
    SimulationStalled,
    VirtualClockLoop,
    run_virtual,
    virtual_now,
)

#: generous bound on real seconds for work that takes milliseconds (a loaded 2-core machine)
REAL_BOUND = 5.0


def test_an_hour_of_sleep_takes_no_real_time_and_advances_the_clock_by_3600():
    async def main() -> tuple[float, float, bool]:
        loop = asyncio.get_running_loop()
        before = loop.time()
        await asyncio.sleep(3600)
        return before, loop.time(), isinstance(loop, VirtualClockLoop)

    real = time.monotonic()
    before, after, virtual = run_virtual(main())
    assert time.monotonic() - real < REAL_BOUND
    assert virtual
    assert (before, after) == (0.0, 3600.0)


def test_concurrent_sleepers_wake_in_virtual_time_order_at_exact_times():
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, delay: float) -> None:
        await asyncio.sleep(delay)
        woke.append((name, virtual_now()))

    async def main() -> None:
        async with asyncio.TaskGroup() as group:
            for name, delay in [("c", 30.0), ("a", 0.5), ("d", 86400.0 * 3), ("b", 7.25)]:
                group.create_task(sleeper(name, delay))

    run_virtual(main())
    assert woke == [("a", 0.5), ("b", 7.25), ("c", 30.0), ("d", 259200.0)]


def test_timeouts_fire_at_the_virtual_deadline():
    async def main() -> list[tuple[str, float]]:
        seen: list[tuple[str, float]] = []
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(12.5):
                await asyncio.sleep(1000)
        seen.append(("timeout", virtual_now()))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), timeout=2.5)
        seen.append(("wait_for", virtual_now()))
        fired = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.25, lambda: fired.set_result(virtual_now()))
        seen.append(("call_later", await fired))
        return seen

    assert run_virtual(main()) == [("timeout", 12.5), ("wait_for", 15.0), ("call_later", 15.25)]


def _simulation(seed: int) -> list[tuple[float, str]]:
    """Nodes that train for random durations, exchange messages over queues, and meet at an
    Event: the event log (virtual time, what happened)."""

    async def main() -> list[tuple[float, str]]:
        rng = random.Random(seed)
        log: list[tuple[float, str]] = []
        inboxes = [asyncio.Queue[tuple[int, int]]() for _ in range(12)]
        done = asyncio.Event()

        async def node(i: int, delays: list[float]) -> None:
            for round_, delay in enumerate(delays):
                await asyncio.sleep(delay)
                log.append((virtual_now(), f"node {i} trained round {round_}"))
                await inboxes[(i + 1) % len(inboxes)].put((i, round_))
                sender, sent = await inboxes[i].get()
                log.append((virtual_now(), f"node {i} got round {sent} of node {sender}"))
            if i == 0:
                done.set()

        async def watcher() -> None:
            await done.wait()
            log.append((virtual_now(), "done"))

        async with asyncio.TaskGroup() as group:
            group.create_task(watcher())
            for i in range(len(inboxes)):
                delays = [rng.choice([0.0, 0.5, 1.0, rng.uniform(0, 5)]) for _ in range(8)]
                group.create_task(node(i, delays))
        return log

    return run_virtual(main())


def test_identical_seeded_programs_produce_identical_event_logs():
    first, second = _simulation(7), _simulation(7)
    assert first == second
    assert len(first) == 12 * 8 * 2 + 1
    assert [t for t, _ in first] == sorted(t for t, _ in first)
    assert first != _simulation(8)


def test_equal_time_timers_run_in_scheduling_order():
    async def main() -> tuple[list[int], list[int]]:
        loop = asyncio.get_running_loop()
        timers: list[int] = []
        for i in range(50):
            loop.call_at(10.0, timers.append, i)
        sleepers: list[int] = []

        async def sleeper(i: int) -> None:
            await asyncio.sleep(3.0)
            sleepers.append(i)

        async with asyncio.TaskGroup() as group:
            for i in range(50):
                group.create_task(sleeper(i))
        await asyncio.sleep(20.0)
        return timers, sleepers

    assert run_virtual(main()) == (list(range(50)), list(range(50)))


def test_executor_work_is_delivered_and_virtual_time_waits_for_it():
    """A thread's job takes no virtual time: the clock stands still while it runs, and its
    result arrives at the instant it was started, before any later timer fires."""
    events: list[tuple[str, float]] = []

    def work(x: int) -> int:
        time.sleep(0.05)
        return x * 2

    async def sleeper() -> None:
        await asyncio.sleep(10.0)
        events.append(("sleeper woke", virtual_now()))

    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        alone = await loop.run_in_executor(None, work, 1)  # no timer at all: no stall either
        events.append(("alone", virtual_now()))
        async with asyncio.TaskGroup() as group:
            group.create_task(sleeper())
            result = await loop.run_in_executor(None, work, 21)
            events.append(("executor result", virtual_now()))
            await asyncio.to_thread(time.sleep, 0.05)
            events.append(("to_thread", virtual_now()))
        return alone, result

    assert run_virtual(main()) == (2, 42)
    assert events == [("alone", 0.0), ("executor result", 0.0), ("to_thread", 0.0),
                      ("sleeper woke", 10.0)]


def test_a_deadlock_raises_simulation_stalled_naming_the_pending_tasks():
    async def main() -> None:
        never = asyncio.Event()
        waiter = asyncio.create_task(never.wait(), name="waits-for-nobody")
        await asyncio.sleep(5.0)
        await waiter

    real = time.monotonic()
    with pytest.raises(SimulationStalled, match="waits-for-nobody") as caught:
        run_virtual(main())
    assert time.monotonic() - real < REAL_BOUND
    assert caught.value.when == 5.0
    assert len(caught.value.tasks) == 2
    assert isinstance(caught.value, RuntimeError)


def test_real_io_already_ready_is_delivered_without_advancing_virtual_time():
    async def main() -> tuple[bytes, float]:
        loop = asyncio.get_running_loop()
        left, right = socket.socketpair()
        with left, right:
            left.setblocking(False)
            right.setblocking(False)
            right.send(b"ping")
            later = asyncio.create_task(asyncio.sleep(100.0))
            data = await loop.sock_recv(left, 4)
            now = virtual_now()
            later.cancel()
            return data, now

    assert run_virtual(main()) == (b"ping", 0.0)


def test_start_offsets_the_virtual_clock():
    epoch = 1_700_000_000.0

    async def main() -> tuple[float, float, float]:
        first = virtual_now()
        await asyncio.sleep(5.0)
        return first, virtual_now(), asyncio.get_running_loop().time()

    assert run_virtual(main(), start=epoch) == (epoch, epoch + 5.0, epoch + 5.0)


def test_cleanup_leaves_no_pending_tasks_threads_or_warnings():
    finalised: list[str] = []
    threads_before = {t.ident for t in threading.enumerate()}

    async def ticker() -> AsyncIterator[int]:
        try:
            for i in range(10**9):
                yield i
                await asyncio.sleep(1.0)
        finally:
            finalised.append("generator")

    async def forever() -> None:
        try:
            await asyncio.sleep(1e9)
        finally:
            finalised.append("task")

    async def main() -> asyncio.AbstractEventLoop:
        background = asyncio.create_task(forever())
        ticks = ticker()
        assert [await anext(ticks), await anext(ticks)] == [0, 1]
        await asyncio.get_running_loop().run_in_executor(None, time.sleep, 0.01)
        assert not background.done()
        return asyncio.get_running_loop()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loop = run_virtual(main())
        gc.collect()
    assert loop.is_closed()
    assert asyncio.all_tasks(loop) == set()
    assert sorted(finalised) == ["generator", "task"]
    assert [str(w.message) for w in caught] == []
    leftover = [t for t in threading.enumerate()
                if t.ident not in threads_before and t.name.startswith("asyncio")]
    assert leftover == []
