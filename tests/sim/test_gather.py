"""The simulator's rendezvous: one action per round for all members, each gets its result."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from dacflnode.sim.gather import RoundGather


async def test_the_action_runs_once_when_every_member_has_called():
    calls: list[tuple[int, dict[str, int]]] = []

    async def double(round_: int, values: Mapping[str, int]) -> dict[str, int]:
        calls.append((round_, dict(values)))
        return {m: 2 * v for m, v in values.items()}

    async def scenario() -> list[int]:
        gather: RoundGather[int, int] = RoundGather(["a", "b", "c"], double)
        return list(await asyncio.gather(gather.submit(0, "a", 1), gather.submit(0, "b", 2),
                                         gather.submit(0, "c", 3)))

    assert await scenario() == [2, 4, 6]
    assert calls == [(0, {"a": 1, "b": 2, "c": 3})]


async def test_a_failing_action_fails_every_caller():
    async def broken(round_: int, values: Mapping[str, int]) -> dict[str, int]:
        raise RuntimeError("training failed")

    async def scenario() -> list[object]:
        gather: RoundGather[int, int] = RoundGather(["a", "b"], broken)
        return list(await asyncio.gather(gather.submit(0, "a", 1), gather.submit(0, "b", 2),
                                         return_exceptions=True))

    results = await scenario()
    assert all(isinstance(r, RuntimeError) for r in results)


async def test_a_member_calling_twice_in_a_round_is_an_error():
    async def echo(round_: int, values: Mapping[str, int]) -> dict[str, int]:
        return dict(values)

    gather: RoundGather[int, int] = RoundGather(["a", "b"], echo)
    first = asyncio.create_task(gather.submit(0, "a", 1))
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="twice"):
        await gather.submit(0, "a", 1)
    assert list(await asyncio.gather(first, gather.submit(0, "b", 2))) == [1, 2]
