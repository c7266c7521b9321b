"""The fault filter: the one place a node reads its fault plan."""

from __future__ import annotations

import torch

from dacflnode.protocol.fault_filter import FaultFilter
from dacflnode.protocol.faults import Crash, Drop, FaultPlan, Poison
from dacflnode.wire.message import RoundMessage


def test_without_a_plan_everything_goes_through() -> None:
    faults = FaultFilter("a", None)
    message = RoundMessage("a", 3, 1, {"x": torch.ones(2)})
    assert faults.pushes("b", 3) and faults.hears("b", 3) and faults.linked("b", 3)
    assert not faults.down("b", 3) and not faults.poisons
    assert faults.sent_to("b", message) is message


def test_a_drop_stops_one_direction_of_one_edge_in_its_rounds() -> None:
    faults = FaultFilter("a", FaultPlan([Drop("b", "a", 2, 3)]))
    assert [faults.hears("b", t) for t in range(5)] == [True, True, False, False, True]
    assert all(faults.pushes("b", t) for t in range(5))  # a's states to b still go
    assert not faults.linked("b", 2)  # a handshake is lost with the states
    assert faults.hears("c", 2)


def test_a_crashed_neighbour_is_down_and_silent_until_it_restarts() -> None:
    faults = FaultFilter("a", FaultPlan([Crash("b", 2, 4)]))
    assert [faults.down("b", t) for t in range(5)] == [False, False, True, True, False]
    assert not faults.hears("b", 3) and not faults.pushes("b", 3)


def test_a_poisoning_node_scales_only_the_float_parts_and_only_to_its_targets() -> None:
    faults = FaultFilter("a", FaultPlan([Poison("a", 1, 1, 10.0, to=("b",))]))
    message = RoundMessage("a", 1, 1, {"x": torch.ones(2),
                                       "codes": torch.ones(2, dtype=torch.int8)})
    poisoned = faults.sent_to("b", message)
    assert faults.poisons
    assert torch.equal(poisoned.tensors["x"], torch.full((2,), 10.0))
    assert torch.equal(poisoned.tensors["codes"], message.tensors["codes"])
    assert faults.sent_to("b", message) is poisoned  # made once per message
    assert faults.sent_to("c", message) is message
    assert faults.sent_to("b", RoundMessage("a", 2, 1, {"x": torch.ones(2)})).tensors[
        "x"].sum() == 2
