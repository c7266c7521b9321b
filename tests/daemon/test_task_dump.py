"""SIGUSR1's task dump (dacflnode/daemon/task_dump.py): every task, with where it waits, and
the daemon goes on."""

from __future__ import annotations

import asyncio
import io
import logging

from dacflnode.daemon.task_dump import dump_tasks


async def wait_for_the_neighbour(event: asyncio.Event) -> None:
    await its_state(event)


async def its_state(event: asyncio.Event) -> None:
    await event.wait()


async def test_every_task_is_written_with_the_await_it_is_in(caplog):
    event = asyncio.Event()
    waiting = asyncio.create_task(wait_for_the_neighbour(event), name="exchange-node-2")
    not_started = asyncio.create_task(asyncio.sleep(0), name="not-started")
    await asyncio.sleep(0)
    out = io.StringIO()
    with caplog.at_level(logging.WARNING, logger="dacflnode.daemon.task_dump"):
        count = dump_tasks("node-0", out)
    text = out.getvalue()
    assert text.startswith(f"--- node-0: {count} tasks ---\n")
    assert text.count("\ntask ") == count >= 2  # this test's own task and the waiting one
    block = text.split("task exchange-node-2:\n")[1].split("\ntask ")[0]
    # the whole await chain, outermost first, down to what has no frame
    chain = [line.strip().rsplit(" in ", 1)[-1] for line in block.splitlines()]
    assert chain == ["wait_for_the_neighbour", "its_state", "Event.wait",
                     "(awaiting FutureIter)"], block
    (line,) = [r for r in caplog.records if getattr(r, "event", None) == "task_dump"]
    assert line.node == "node-0" and f"{count} tasks" in line.getMessage()
    assert not waiting.done()  # looking does not disturb
    event.set()
    await asyncio.gather(waiting, not_started)
