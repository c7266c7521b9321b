"""The guard against absurd states: far from the node's own state is refused, near is not."""

from __future__ import annotations

import pytest
import torch

from dacflnode.wire.codec import RoundMessage
from dacflnode.wire.errors import Reason
from dacflnode.wire.state_guard import ABSURD_RATIO, DistanceGuard, distance

P = 500


def own() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"omega": torch.randn(P, generator=g) * 0.1, "x": torch.randn(P, generator=g) * 0.1}


def from_b(tensors: dict[str, torch.Tensor]) -> RoundMessage:
    return RoundMessage("b", 3, 2, tensors)


def test_the_distance_is_taken_over_all_tensors_together():
    ours = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([0.0, 4.0])}
    theirs = {"a": torch.tensor([3.0, 1.0]), "b": torch.tensor([0.0, 4.0])}
    assert distance(ours, theirs) == pytest.approx((1.0, 5.0))


def test_a_forged_all_one_million_state_is_refused():
    guard = DistanceGuard(own)
    refused = guard(from_b({n: torch.full((P,), 1e6) for n in ("omega", "x")}))
    assert refused is not None
    assert (refused.code, refused.reason) == ("INVALID_ARGUMENT", Reason.ABSURD_STATE)


def test_a_state_beyond_float32_squares_is_refused_not_overflowed():
    refused = DistanceGuard(own)(from_b({n: torch.full((P,), 3e38) for n in ("omega", "x")}))
    assert refused is not None and refused.reason is Reason.ABSURD_STATE


def test_a_neighbour_state_after_honest_training_is_accepted():
    ours = own()
    g = torch.Generator().manual_seed(1)
    # a neighbour trained on other data: as far from us as a whole model norm, and more
    theirs = {n: t + torch.randn(P, generator=g) * 0.3 for n, t in ours.items()}
    assert DistanceGuard(lambda: ours)(from_b(theirs)) is None


def test_the_limit_is_ratio_times_the_own_norm_with_a_floor_of_one():
    zero = {"x": torch.zeros(4)}
    guard = DistanceGuard(lambda: zero, ratio=10.0)
    assert guard(from_b({"x": torch.tensor([5.0, 0.0, 0.0, 0.0])})) is None  # 5 <= 10 * 1
    assert guard(from_b({"x": torch.tensor([11.0, 0.0, 0.0, 0.0])})) is not None
    big = {"x": torch.tensor([100.0, 0.0, 0.0, 0.0])}
    guard = DistanceGuard(lambda: big, ratio=10.0)
    assert guard(from_b({"x": torch.tensor([1000.0, 0.0, 0.0, 0.0])})) is None  # 900 <= 1000
    assert guard(from_b({"x": torch.tensor([1101.0, 0.0, 0.0, 0.0])})) is not None


def test_nothing_to_compare_with_accepts_and_the_default_ratio_is_one_hundred():
    assert DistanceGuard(lambda: None)(from_b({"x": torch.full((P,), 1e6)})) is None
    assert DistanceGuard(own).ratio == ABSURD_RATIO == 100.0
    with pytest.raises(ValueError):
        DistanceGuard(own, ratio=0.0)
