"""The feature agreement's messages: checked before they are kept, replies within budget."""

import pytest

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode.wire import agreement
from dacflnode.wire.agreement import AgreeItem, AgreePhase
from dacflnode.wire.errors import WireError


def test_a_request_of_an_unknown_phase_is_refused():
    with pytest.raises(WireError, match="phase 9"):
        agreement.read_request(pb.AgreeRequest(sender="a", phase=9))


def test_ids_of_absurd_length_or_number_are_refused():
    with pytest.raises(WireError, match="characters"):
        agreement.read_request(pb.AgreeRequest(sender="a", phase=1, have=["x" * 300]))
    with pytest.raises(WireError, match="at most"):
        agreement.read_request(pb.AgreeRequest(sender="a", phase=1,
                                               have=[str(i) for i in range(5000)]))
    bad = pb.AgreeReply()
    bad.items.add(origin="", payload=b"k")
    with pytest.raises(WireError):
        agreement.read_reply(bad)


def test_a_reply_stops_at_its_byte_budget_but_always_carries_one_item(monkeypatch):
    monkeypatch.setattr(agreement, "REPLY_BUDGET", 10)
    items = [AgreeItem(o, (), b"x" * 8) for o in "abc"]
    assert [i.origin for i in agreement.reply_of(items).items] == ["a"]
    big = [AgreeItem("a", (), b"x" * 50)]
    assert len(agreement.reply_of(big).items) == 1


def test_a_request_and_reply_read_back_what_was_sent():
    phase, have = agreement.read_request(agreement.request_of("a", AgreePhase.SUMS, {"c", "b"}))
    assert (phase, have) == (AgreePhase.SUMS, frozenset({"b", "c"}))
    items = [AgreeItem("b", ("a", "c"), b"\x00\x01")]
    assert agreement.read_reply(agreement.reply_of(items)) == items
