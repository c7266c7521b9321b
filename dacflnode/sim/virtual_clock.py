"""A virtual-clock asyncio event loop: simulated time that costs no real time.

An asynchronous simulation whose nodes "train" for modelled durations (``await
asyncio.sleep(seconds)``) and talk over an in-memory transport spends nearly all of its real time
asleep on a stock event loop. :class:`VirtualClockLoop` skips the sleeping: its ``time()`` is a
virtual clock (seconds, starting at ``start``, 0.0 by default) that jumps forward whenever the loop
has nothing else to do, so the simulation runs as fast as the CPU allows and gives the same
results every time.

**What counts as idle.** asyncio's loop asks its selector to wait for I/O, with a timeout, once
per iteration. The timeout is 0 when callbacks are ready (or the loop is stopping), the delay to the
nearest timer when only timers are pending, and ``None`` (forever) when there is nothing at all.
The loop is idle when that timeout is not 0 *and* a non-blocking poll of the real selector finds
nothing ready.

**How time advances.** When idle with timers pending, the clock is set to the nearest timer's
deadline (exactly: no float drift; the loop's clock resolution is kept at least one float step of
the clock, so a deadline near a unix-epoch ``start`` still counts as due) and the loop carries on,
so that timer fires next; nothing real is waited for. Real I/O is still polled, without blocking,
on every iteration, and is handled at the virtual instant it is seen. The exception is work in
threads: a job started by :meth:`VirtualClockLoop.run_in_executor` (``asyncio.to_thread``
included) in a real thread delivers its result only when the loop is idle, one job at a time, in
the order the jobs were started: an idle loop with such a job undelivered waits for real for the
oldest one (not for whichever thread happens to finish first) and delivers it, instead of
advancing. Virtual time stands still meanwhile: executor work takes zero virtual time, and its
result arrives at the instant it was started, after whatever else was ready at that instant and
before any later timer. A job an executor other than a thread pool completes as it is submitted
(an inline executor) is delivered at the next iteration, as a stock loop does.

**Why it is deterministic.** Nothing reads the real clock. The ready queue is a FIFO deque and
virtual deadlines are float sums of deterministic inputs. CPython's timer heap does not break ties
stably (``heapq`` orders equal deadlines by heap shape: twenty ``call_at`` with one deadline run
as 0, 2, 6, 14, 13, ... on a stock loop), so :meth:`VirtualClockLoop.call_at` tags each timer with a
sequence number and equal deadlines run in scheduling order. Threads finish in whatever order the
machine lets them; their results are delivered in the order they were started, at idle points
(above), so that order never reaches the simulation (before, two nodes' file writes or trainings
finishing in either order could interleave the nodes differently: a crash run's journals
differed about one run in ten under load). The only nondeterministic input left is I/O on real
file descriptors.

**What stalls.** When the loop would wait forever (no callback ready, no timer, no real I/O ready),
no executor job is in flight and no file descriptor other than the loop's own self-pipe is
registered, nothing can ever wake it: :class:`SimulationStalled` is raised out of ``run_*``, naming
the pending tasks, instead of hanging. With other descriptors registered (real sockets), the loop
waits for real, like a stock loop. Threads that call ``call_soon_threadsafe`` on their own (not
through ``run_in_executor``) are not known to the loop; a simulation must not rely on them.

This relies on asyncio's selector-loop internals (``_scheduled``, ``_ssock``,
``_clock_resolution``, ``call_at``'s body), which are the same in CPython 3.11 to 3.13.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import heapq
import itertools
import math
import selectors
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import Executor
from contextvars import Context
from typing import Any, TypeVar, TypeVarTuple, Unpack

__all__ = ["REAL_WAIT", "SimulationStalled", "VirtualClockLoop", "run_virtual", "virtual_now"]

T = TypeVar("T")
_Ts = TypeVarTuple("_Ts")

#: longest real wait (seconds) of one idle iteration while executor work is in flight
REAL_WAIT = 0.05

_Ready = list[tuple[selectors.SelectorKey, int]]


def _deliver(job: concurrent.futures.Future[Any], future: asyncio.Future[Any]) -> None:
    """Copy a finished executor job's outcome into the loop's future (unless cancelled)."""
    if future.cancelled():
        return
    if job.cancelled():
        future.cancel()
        return
    exc = job.exception()
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(job.result())


class SimulationStalled(RuntimeError):
    """The simulation can never make progress: no callback is ready, no timer is pending, and
    neither real I/O nor executor work can wake the loop (a deadlock, e.g. awaiting an Event that
    nobody sets)."""

    def __init__(self, when: float, tasks: tuple[str, ...]) -> None:
        self.when = when
        self.tasks = tasks
        listed = "; ".join(tasks) if tasks else "none"
        super().__init__(f"simulation stalled at virtual time {when:.6f}: nothing is scheduled "
                         f"and nothing can wake the loop; pending tasks ({len(tasks)}): {listed}")


class _OrderedTimerHandle(asyncio.TimerHandle):
    """A timer ordered by (deadline, scheduling order): the heap then breaks ties stably."""

    __slots__ = ("_seq",)

    def __init__(self, when: float, callback: Callable[..., object], args: tuple[Any, ...],
                 loop: asyncio.AbstractEventLoop, context: Context | None, seq: int) -> None:
        super().__init__(when, callback, args, loop, context)
        self._seq = seq

    def _key(self) -> tuple[float, int]:
        return (self.when(), self._seq)

    def __lt__(self, other: asyncio.TimerHandle) -> bool:
        if isinstance(other, _OrderedTimerHandle):
            return self._key() < other._key()
        return super().__lt__(other)

    def __le__(self, other: asyncio.TimerHandle) -> bool:
        if isinstance(other, _OrderedTimerHandle):
            return self._key() <= other._key()
        return super().__le__(other)

    def __gt__(self, other: asyncio.TimerHandle) -> bool:
        if isinstance(other, _OrderedTimerHandle):
            return self._key() > other._key()
        return super().__gt__(other)

    def __ge__(self, other: asyncio.TimerHandle) -> bool:
        if isinstance(other, _OrderedTimerHandle):
            return self._key() >= other._key()
        return super().__ge__(other)



class _VirtualSelector(selectors.BaseSelector):
    """The real selector, except that a wait (timeout other than 0) that a non-blocking poll
    cannot satisfy is handed to the loop's idle step instead of blocking."""

    def __init__(self) -> None:
        self.real = selectors.DefaultSelector()
        self.loop: VirtualClockLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self.real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self.real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self.real.modify(fileobj, events, data)

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self.real.get_key(fileobj)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self.real.get_map()

    def close(self) -> None:
        self.real.close()

    def select(self, timeout: float | None = None) -> _Ready:
        ready = self.real.select(0)
        if ready or timeout == 0 or self.loop is None:
            return ready
        return self.loop._idle()


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` is virtual: it jumps to the next timer whenever the
    loop is idle, and never sleeps for real except while executor work is in flight (see the
    module docstring)."""

    def __init__(self, start: float = 0.0) -> None:
        self._virtual_now = float(start)
        self._timer_seq = itertools.count()
        #: executor jobs on real threads not yet delivered, oldest first
        self._jobs: collections.deque[tuple[concurrent.futures.Future[Any],
                                            asyncio.Future[Any]]] = collections.deque()
        self._external_waits = 0
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self._virtual_selector = selector
        self._min_resolution: float = self._core._clock_resolution
        self._set_now(self._virtual_now)

    @property
    def _core(self) -> Any:
        """This loop, untyped: asyncio's private scheduling state (CPython 3.11-3.13)."""
        return self

    def time(self) -> float:
        return self._virtual_now

    def _set_now(self, now: float) -> None:
        # a timer is due when its deadline is under now + resolution: keep that sum above now even
        # where the clock's float spacing is coarse (a unix-epoch start has ~2.4e-7 s spacing)
        self._virtual_now = now
        self._core._clock_resolution = max(self._min_resolution, math.ulp(now))

    def call_at(self, when: float, callback: Callable[[Unpack[_Ts]], object], *args: *_Ts,
                context: Context | None = None) -> asyncio.TimerHandle:
        # BaseEventLoop.call_at (CPython 3.11-3.13), with a timer that keeps scheduling order
        core = self._core
        if when is None:
            raise TypeError("when cannot be None")
        core._check_closed()
        if core._debug:
            core._check_thread()
            core._check_callback(callback, "call_at")
        timer = _OrderedTimerHandle(when, callback, args, self, context, next(self._timer_seq))
        handle: Any = timer
        if handle._source_traceback:
            del handle._source_traceback[-1]
        heapq.heappush(core._scheduled, timer)
        handle._scheduled = True
        return timer

    def run_in_executor(self, executor: Executor | None, func: Callable[[Unpack[_Ts]], T],
                        *args: *_Ts) -> asyncio.Future[T]:
        # BaseEventLoop.run_in_executor (CPython 3.11-3.13), delivering in start order
        core = self._core
        core._check_closed()
        if executor is None:
            core._check_default_executor()
            executor = core._default_executor
            if executor is None:
                executor = concurrent.futures.ThreadPoolExecutor(thread_name_prefix="asyncio")
                core._default_executor = executor
        job = executor.submit(func, *args)
        future: asyncio.Future[T] = self.create_future()
        threaded = isinstance(executor, concurrent.futures.ThreadPoolExecutor)
        if job.done() and not threaded:  # an inline executor: at the next iteration, as a
            self.call_soon(_deliver, job, future)  # stock loop would (a thread that was
            # merely quick still waits its turn below: how fast it was must not matter)
        else:
            self._jobs.append((job, future))
        return future

    async def shutdown_default_executor(self, *args: Any, **kwargs: Any) -> None:
        # the executor's threads are joined in a thread that reports through
        # call_soon_threadsafe: wait for it for real (3.12+ also passes a timeout, which would
        # otherwise expire at once in virtual time)
        self._external_waits += 1
        try:
            await super().shutdown_default_executor(*args, **kwargs)
        finally:
            self._external_waits -= 1

    def threads_in_flight(self) -> bool:
        """Whether executor work started through this loop has yet to deliver its result."""
        return self._external_waits > 0 or bool(self._jobs)

    def _idle(self) -> _Ready:
        """The loop would block and nothing real is ready: deliver the oldest thread job (waiting
        for it), jump to the next timer, wait for real I/O, or declare a stall."""
        core = self._core
        while self._jobs and self._jobs[0][1].cancelled():
            self._jobs.popleft()  # nobody waits for it: its thread finishes on its own
        if self._jobs:
            job, future = self._jobs[0]
            if not job.done():
                concurrent.futures.wait([job], timeout=REAL_WAIT)
                return self._virtual_selector.real.select(0)
            self._jobs.popleft()
            _deliver(job, future)
            return []
        if self._external_waits > 0:
            return self._virtual_selector.real.select(REAL_WAIT)
        if core._scheduled:
            self._set_now(max(self._virtual_now, core._scheduled[0].when()))
            return []
        if self._real_io_registered():
            return self._virtual_selector.real.select(REAL_WAIT)
        raise SimulationStalled(self._virtual_now, self._pending_tasks())

    def _real_io_registered(self) -> bool:
        core = self._core
        own = core._ssock.fileno() if core._ssock is not None else -1
        return any(key.fd != own for key in self._virtual_selector.real.get_map().values())

    def _pending_tasks(self) -> tuple[str, ...]:
        described = []
        for task in asyncio.all_tasks(self):
            coro = task.get_coro()
            where = getattr(coro, "__qualname__", repr(coro))
            frames = task.get_stack(limit=1)
            if frames:
                where += f" at {frames[0].f_code.co_filename}:{frames[0].f_lineno}"
            described.append(f"{task.get_name()} ({where})")
        return tuple(sorted(described))


def run_virtual(main: Coroutine[Any, Any, T], *, start: float = 0.0) -> T:
    """Run ``main`` to completion on a fresh :class:`VirtualClockLoop` whose clock starts at
    ``start``, like ``asyncio.run``: leftover tasks are cancelled, async generators and the
    default executor are shut down, and the loop is closed."""
    with asyncio.Runner(loop_factory=lambda: VirtualClockLoop(start)) as runner:
        return runner.run(main)


def virtual_now() -> float:
    """The running loop's clock: virtual seconds on a :class:`VirtualClockLoop`."""
    return asyncio.get_running_loop().time()
