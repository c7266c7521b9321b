"""The inbox's round window, and the typed reasons it refuses with."""

from __future__ import annotations

import pytest
import torch

from dacflnode.transport.base import Inbox
from dacflnode.wire.errors import Reason, Refusal, WireError
from dacflnode.wire.message import RoundMessage


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


def msg(sender: str, round_: int, value: float) -> RoundMessage:
    return RoundMessage(sender, round_, 1, {"x": torch.full((3,), value)})


async def test_a_second_message_of_a_sender_for_a_round_is_refused_and_the_first_kept() -> None:
    inbox = inbox_in_round(4)
    first = msg("a", 4, 1.0)
    await inbox.put(first)
    with pytest.raises(WireError) as err:
        await inbox.put(msg("a", 4, 2.0))
    assert (err.value.code, err.value.reason) == ("ALREADY_EXISTS", Reason.DUPLICATE)
    assert inbox.get(4) == {"a": first}
    assert inbox.has(4, "a") and not inbox.has(5, "a")
    await inbox.put(msg("a", 5, 2.0))  # the next round is another message


async def test_a_guard_refusal_is_raised_and_nothing_is_buffered() -> None:
    inbox = inbox_in_round(4)
    seen: list[int] = []

    def guard(message: RoundMessage) -> Refusal | None:
        seen.append(message.round)
        if float(message.tensors["x"].abs().max()) > 10:
            return Refusal(Reason.ABSURD_STATE, "too far", "INVALID_ARGUMENT")
        return None

    inbox.guard = guard
    with pytest.raises(WireError) as err:
        await inbox.put(msg("a", 4, 1e6))
    assert (err.value.code, err.value.reason) == ("INVALID_ARGUMENT", Reason.ABSURD_STATE)
    assert inbox.get(4) == {}
    await inbox.put(ok := msg("a", 4, 1.0))
    assert inbox.get(4) == {"a": ok} and seen == [4, 4]


async def test_a_round_that_moved_on_while_the_guard_ran_is_refused() -> None:
    current = 4
    inbox = Inbox(senders={"a"}, current_round=lambda: current)

    def slow_guard(message: RoundMessage) -> Refusal | None:
        nonlocal current
        current = 5  # the node finished round 4 meanwhile
        return None

    inbox.guard = slow_guard
    with pytest.raises(WireError) as err:
        await inbox.put(msg("a", 4, 1.0))
    assert err.value.reason is Reason.ROUND_PASSED
    assert inbox.get(4) == {}


async def test_a_barred_sender_is_refused_and_not_waited_for_in_this_round_or_the_next() -> None:
    inbox = Inbox(senders={"a", "b"}, current_round=lambda: 4)
    inbox.bar("a")
    with pytest.raises(WireError) as err:
        await inbox.put(msg("a", 4, 1.0))
    assert err.value.reason is Reason.QUARANTINED
    assert inbox.forgone(4, "a") and inbox.forgone(5, "a") and not inbox.forgone(4, "b")


async def test_a_refused_state_bars_its_sender_when_the_node_says_so() -> None:
    told: list[tuple[str, Reason]] = []

    def refuse_big(message: RoundMessage) -> Refusal | None:
        return Refusal(Reason.ABSURD_STATE, "too big") if message.sender == "a" else None

    def judge(message: RoundMessage, refusal: Refusal) -> bool:
        told.append((message.sender, refusal.reason))
        return True

    inbox = Inbox(senders={"a", "b"}, current_round=lambda: 4, guard=refuse_big,
                  on_refused=judge)
    with pytest.raises(WireError):
        await inbox.put(msg("a", 4, 1.0))
    await inbox.put(msg("b", 4, 1.0))
    assert told == [("a", Reason.ABSURD_STATE)] and inbox.barred == {"a"}
