"""Waiting for a condition: poll it, with a deadline, instead of sleeping for a guessed time.

:func:`until` is for ``async`` tests (it yields to the event loop between polls, and its
condition may be a coroutine function, such as a status query); :func:`until_blocking` is the
same loop for tests that drive separate processes from plain functions. Both return the
condition's first true value, so a poll can also fetch what it waited for, and fail with
``what`` (a string, or a callable asked at the deadline for the latest news) when the deadline
passes.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")

#: Seconds between two polls: short next to anything a test waits for.
INTERVAL = 0.02


class _Deadline:
    def __init__(self, timeout: float, what: str | Callable[[], str], condition: object) -> None:
        self.timeout = timeout
        self.end = time.monotonic() + timeout
        self.what = what
        self.condition = condition

    def check(self) -> None:
        """Raises AssertionError once the deadline has passed."""
        if time.monotonic() > self.end:
            said = self.what() if callable(self.what) else self.what
            raise AssertionError(f"not within {self.timeout:g} s: {said or self.condition}")


@overload
async def until(condition: Callable[[], Awaitable[T | None]], timeout: float = 10.0, *,
                interval: float = INTERVAL, what: str | Callable[[], str] = "") -> T: ...


@overload
async def until(condition: Callable[[], T | None], timeout: float = 10.0, *,
                interval: float = INTERVAL, what: str | Callable[[], str] = "") -> T: ...


async def until(condition: Callable[[], object], timeout: float = 10.0, *,
                interval: float = INTERVAL, what: str | Callable[[], str] = "") -> Any:
    """``condition()``'s first true value (awaited if it is a coroutine), polled every
    ``interval`` seconds."""
    deadline = _Deadline(timeout, what, condition)
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        deadline.check()
        await asyncio.sleep(interval)


def until_blocking(condition: Callable[[], T | None], timeout: float = 10.0, *,
                   interval: float = INTERVAL, what: str | Callable[[], str] = "") -> T:
    """:func:`until` for code outside an event loop: blocks between polls."""
    deadline = _Deadline(timeout, what, condition)
    while True:
        value = condition()
        if value:
            return value
        deadline.check()
        time.sleep(interval)
