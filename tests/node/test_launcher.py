"""The local launcher's process handling: one failed daemon stops the cluster at once."""

from __future__ import annotations

import asyncio
import sys
import time

from dacflnode.node.launcher import _wait_all_or_first_failure


async def spawn(code: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(sys.executable, "-c", code)


async def test_a_failed_daemon_stops_the_others_instead_of_leaving_them_waiting():
    async def scenario() -> tuple[list[int], float]:
        procs = [await spawn("import time; time.sleep(60)"),
                 await spawn("import time, sys; time.sleep(0.5); sys.exit(3)")]
        started = time.monotonic()
        codes = await _wait_all_or_first_failure(procs)
        return codes, time.monotonic() - started

    codes, seconds = await scenario()
    assert codes[1] == 3
    assert codes[0] != 0  # terminated, not left running for its minute
    assert seconds < 20


async def test_daemons_that_all_succeed_are_all_waited_for():
    async def scenario() -> list[int]:
        procs = [await spawn("import time; time.sleep(0.3)"), await spawn("pass")]
        return await _wait_all_or_first_failure(procs)

    assert await scenario() == [0, 0]
