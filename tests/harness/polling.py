"""Waiting for a condition: poll it, with a deadline, instead of sleeping for a guessed time.

:func:`until` is for ``async`` tests (it yields to the event loop between polls);
:func:`until_blocking` is the same loop for tests that drive separate processes from plain
functions. Both return the condition's first true value, so a poll can also fetch what it
waited for, and fail with ``what`` (a string, or a callable asked at the deadline for the
latest news) when the deadline passes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator
from typing import TypeVar

T = TypeVar("T")

#: Seconds between two polls: short next to anything a test waits for.
INTERVAL = 0.02


def _polls(condition: Callable[[], T | None], timeout: float, interval: float,
           what: str | Callable[[], str]) -> Generator[float, None, T]:
    """Checks ``condition`` until it holds (the generator returns its value), yielding the
    pause before the next check; raises AssertionError once ``timeout`` seconds have passed."""
    end = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > end:
            said = what() if callable(what) else what
            raise AssertionError(f"not within {timeout:g} s: {said or condition}")
        yield interval


async def until(condition: Callable[[], T | None], timeout: float = 10.0, *,
                interval: float = INTERVAL, what: str | Callable[[], str] = "") -> T:
    """``condition()``'s first true value, polled every ``interval`` seconds."""
    polls = _polls(condition, timeout, interval, what)
    try:
        while True:
            await asyncio.sleep(next(polls))
    except StopIteration as done:
        result: T = done.value
        return result


def until_blocking(condition: Callable[[], T | None], timeout: float = 10.0, *,
                   interval: float = INTERVAL, what: str | Callable[[], str] = "") -> T:
    """:func:`until` for code outside an event loop: blocks between polls."""
    polls = _polls(condition, timeout, interval, what)
    try:
        while True:
            time.sleep(next(polls))
    except StopIteration as done:
        result: T = done.value
        return result
