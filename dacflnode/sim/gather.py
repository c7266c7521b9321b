"""A rendezvous of the simulated nodes: one call per node and round, one action for all of them.

The simulator's runners are independent coroutines, but some work is done best (or can only be
done) for all nodes at once: training them as one stacked model, evaluating the network average
of D-PSGD and FedAvg. :class:`RoundGather` collects the calls of one round and, when every member
has called, runs the action once and hands each caller its own result.

Members are fixed: a simulation has no faults, every node calls every round. Should the action
fail or the caller that runs it be cancelled, every waiting caller gets the same error (or is
cancelled), so no runner waits forever on a round that will not complete.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Generic, TypeVar

V = TypeVar("V")
R = TypeVar("R")

Action = Callable[[int, Mapping[str, V]], Awaitable[Mapping[str, R]]]


class RoundGather(Generic[V, R]):
    """``await gather.submit(round, member, value)`` returns ``action(round, values)[member]``."""

    def __init__(self, members: Sequence[str], action: Action[V, R]) -> None:
        if len(set(members)) != len(members) or not members:
            raise ValueError("a gather needs distinct members")
        self.members = frozenset(members)
        self._action = action
        self._pending: dict[int, dict[str, tuple[V, asyncio.Future[R]]]] = {}

    async def submit(self, round_: int, member: str, value: V) -> R:
        if member not in self.members:
            raise ValueError(f"{member!r} is not a member of this gather")
        calls = self._pending.setdefault(round_, {})
        if member in calls:
            raise RuntimeError(f"{member} called twice in round {round_}")
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        calls[member] = (value, future)
        if len(calls) == len(self.members):
            del self._pending[round_]
            await self._complete(round_, calls)
        return await future

    async def _complete(self, round_: int, calls: dict[str, tuple[V, asyncio.Future[R]]]) -> None:
        futures = {m: f for m, (_, f) in calls.items()}
        try:
            results = await self._action(round_, {m: v for m, (v, _) in calls.items()})
        except asyncio.CancelledError:
            for f in futures.values():
                f.cancel()
            raise
        except Exception as exc:
            for f in futures.values():
                if not f.done():  # a caller cancelled meanwhile has a cancelled future
                    f.set_exception(exc)
            return
        for m, f in futures.items():
            if not f.done():
                f.set_result(results[m])
