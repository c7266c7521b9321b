"""Offences of an edge become a quarantine, told to the caller as a value."""

from __future__ import annotations

import torch

from dacflnode.protocol.edges import EdgeBook
from dacflnode.protocol.quarantine import Quarantine
from dacflnode.records.membership import QUARANTINE_OFFENCES, PeerState
from dacflnode.wire.errors import Reason, Refusal
from dacflnode.wire.message import RoundMessage


def quarantine(current: int = 5) -> Quarantine:
    return Quarantine("a", EdgeBook("a", ["b", "c"]), lambda: current)


def test_offences_in_distinct_rounds_quarantine_the_edge_once() -> None:
    q = quarantine()
    verdicts = [q.offence("b", r, Reason.ABSURD_STATE, mine=r % 2 == 0)
                for r in range(QUARANTINE_OFFENCES + 1)]
    assert verdicts == [False] * (QUARANTINE_OFFENCES - 1) + [True, False]
    assert q.count == 1 and q.edges.peers["b"].state is PeerState.QUARANTINED
    assert q.was_refused(0, "b") and not q.was_refused(0, "c")


def test_a_second_refusal_in_the_same_round_is_not_a_second_offence() -> None:
    q = quarantine()
    for _ in range(QUARANTINE_OFFENCES):
        assert not q.offence("b", 1, Reason.STALE_STATE, mine=False)
    assert q.edges.peers["b"].refused_states == 1


def test_the_inbox_refusals_that_are_not_offences_are_ignored() -> None:
    q = quarantine()
    message = RoundMessage("b", 5, 1, {"x": torch.zeros(1)})
    assert not q.judge(message, Refusal(Reason.NON_FINITE, "nan"))
    assert not q.refused
    assert not q.judge(message, Refusal(Reason.ABSURD_STATE, "too far"))
    assert q.was_refused(5, "b")


def test_a_neighbours_quarantine_is_this_nodes_too_and_proposes_an_anchor() -> None:
    q = quarantine(current=7)
    assert q.quarantined_by("c") is True
    assert q.quarantined_by("c") is False  # already
    assert q.edges.anchors == {7 + 1 + q.edges.anchor_delay}


def test_refusals_of_finished_rounds_are_forgotten() -> None:
    q = quarantine()
    q.offence("b", 3, Reason.ABSURD_STATE, mine=False)
    q.offence("c", 4, Reason.ABSURD_STATE, mine=False)
    q.forget_through(3)
    assert q.refused == {(4, "c")}
