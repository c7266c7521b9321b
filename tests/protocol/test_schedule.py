"""The synchronous schedule orders the steps of a round, and of a closing exchange."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any, cast

from dacflnode.protocol.schedule import RoundSteps, RoundWork, SyncSchedule
from dacflnode.protocol.setup import RoundReport
from dacflnode.wire.message import Kind


class Steps:
    """Steps that only note when they run, and with what."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.work = cast(RoundWork, object())

    async def exchange(self, t: int, kind: Kind = Kind.STATE,
                       skip: Collection[str] = ()) -> RoundWork:
        self.calls.append(("exchange", (t, kind, tuple(skip))))
        return self.work

    async def mix(self, work: RoundWork) -> None:
        self.calls.append(("mix", work))

    async def train(self, work: RoundWork) -> None:
        self.calls.append(("train", work))

    async def complete(self, work: RoundWork) -> None:
        self.calls.append(("complete", work))

    async def record(self, work: RoundWork) -> RoundReport:
        self.calls.append(("record", work))
        return RoundReport(1, (), (), 0.0, 0, None, None, 0.0, 0.0, 0.0, 0.0)

    async def fold(self, work: RoundWork) -> list[str]:
        self.calls.append(("fold", work))
        return ["b"]


def test_a_round_is_exchange_mix_train_complete_record_on_one_work_record() -> None:
    steps = Steps()
    report = asyncio.run(SyncSchedule().round(cast(RoundSteps, steps), 4))
    assert [name for name, _ in steps.calls] == ["exchange", "mix", "train", "complete",
                                                 "record"]
    assert steps.calls[0][1] == (4, Kind.STATE, ())
    assert all(arg is steps.work for _, arg in steps.calls[1:])
    assert report.round == 1


def test_a_closing_exchange_is_an_exchange_and_a_fold_without_mixing() -> None:
    steps = Steps()
    heard = asyncio.run(SyncSchedule().closing(cast(RoundSteps, steps), 9, Kind.FINAL,
                                               skip={"c"}))
    assert steps.calls == [("exchange", (9, Kind.FINAL, ("c",))), ("fold", steps.work)]
    assert heard == ["b"]
