"""The clock of a node's deadlines and waits: the running event loop's ``time()``.

On a daemon's event loop that is ``time.monotonic()``; on the simulator's virtual-clock loop
(:mod:`dacflnode.sim.virtual_clock`) it is virtual seconds, so deadlines, timeouts and the
waits of the round and of the asynchronous schedule all play on the same clock as the
``asyncio.sleep`` and ``asyncio.timeout`` around them.
"""

from __future__ import annotations

import asyncio


def now() -> float:
    """Seconds on the running event loop's clock (call it from a coroutine or callback)."""
    return asyncio.get_running_loop().time()
