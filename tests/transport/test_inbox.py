"""The inbox's round window, and the typed reasons it refuses with."""

from __future__ import annotations

import pytest
import torch

from dacflnode.transport.base import Inbox
from dacflnode.wire.codec import RoundMessage, WireError
from dacflnode.wire.errors import Reason


def inbox_in_round(current: int) -> Inbox:
    return Inbox(senders={"a"}, current_round=lambda: current)


@pytest.mark.parametrize(
    ("round_", "reason"),
    [(3, Reason.ROUND_PASSED), (4, None), (5, None), (6, Reason.ROUND_AHEAD)],
)
def test_the_window_is_the_current_round_and_the_next(round_: int, reason: Reason | None) -> None:
    refused = inbox_in_round(4).refusal(round_)
    assert (refused.reason if refused else None) is reason


async def test_a_put_outside_the_window_raises_a_typed_wire_error() -> None:
    inbox = inbox_in_round(4)
    with pytest.raises(WireError) as err:
        await inbox.put(RoundMessage("a", 2, 1, {"x": torch.zeros(1)}))
    assert (err.value.code, err.value.reason) == ("FAILED_PRECONDITION", Reason.ROUND_PASSED)
    assert inbox.get(2) == {}
