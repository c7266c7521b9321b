"""The guard against absurd and stale states: a member's scaled or sign-flipped state is refused
against a yardstick it cannot move, a replay for another round is refused, honest states pass."""

from __future__ import annotations

import pytest
import torch

from dacflnode.wire.errors import Reason
from dacflnode.wire.message import Kind, RoundMessage
from dacflnode.wire.state_guard import RobustGuard, distance, norm

P = 500


def own() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"omega": torch.randn(P, generator=g) * 0.3, "x": torch.randn(P, generator=g) * 0.3}


def honest(ours: dict[str, torch.Tensor], seed: int,
           spread: float = 0.05) -> dict[str, torch.Tensor]:
    """A neighbour's state after honest training: a few per cent of the norm away."""
    g = torch.Generator().manual_seed(seed)
    return {n: t + torch.randn(P, generator=g) * spread * float(t.abs().mean())
            for n, t in ours.items()}


def msg(tensors: dict[str, torch.Tensor], round_: int = 3, sender: str = "b",
        kind: Kind = Kind.STATE) -> RoundMessage:
    return RoundMessage(sender, round_, 2, tensors, kind=kind)


def test_the_distance_and_norm_are_taken_over_all_tensors_together():
    ours = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([0.0, 4.0])}
    theirs = {"a": torch.tensor([3.0, 1.0]), "b": torch.tensor([0.0, 4.0])}
    assert distance(ours, theirs) == pytest.approx((1.0, 5.0))
    assert norm(ours) == pytest.approx(5.0)


@pytest.mark.parametrize("scale", [5.0, 50.0, 99.0, -1.0])
def test_a_members_scaled_or_sign_flipped_honest_state_is_refused(scale):
    ours = own()
    guard = RobustGuard(lambda: ours)
    state = honest(ours, 1)
    refused = guard(msg({n: t * scale for n, t in state.items()}))
    assert refused is not None
    assert (refused.code, refused.reason) == ("INVALID_ARGUMENT", Reason.ABSURD_STATE)
    assert guard(msg(state)) is None  # its honest state of the same round still passes


@pytest.mark.parametrize("scale", [5.0, 50.0, 99.0, -1.0])
def test_a_member_that_poisons_every_round_is_refused_every_round(scale):
    ours = own()
    guard = RobustGuard(lambda: ours)
    for r in range(12):
        assert guard(msg(honest(ours, 100 + r), r, sender="c")) is None  # an honest neighbour
        poisoned = {n: t * scale for n, t in honest(ours, r).items()}
        assert guard(msg(poisoned, r)) is not None, f"round {r}"


def test_the_yardstick_cannot_be_moved_by_growing_pushes_of_one_neighbour():
    ours = own()
    guard = RobustGuard(lambda: ours)
    assert guard(msg(honest(ours, 99), 0, sender="c")) is None
    before = guard.yardstick()
    assert before == pytest.approx(norm(ours), rel=0.05)
    for r, scale in enumerate([3.5, 5.0, 8.0, 13.0, 21.0, 34.0, 55.0, 89.0]):
        assert guard(msg({n: t * scale for n, t in honest(ours, r).items()}, r)) is not None
    assert guard.yardstick() == pytest.approx(before)


def test_a_member_inside_the_limits_cannot_drag_the_yardstick_along():
    # a member sends 2.5x every round (accepted: within 3x), its norm joining the pool; the
    # median of the node's own state and its two honest neighbours' stays where they are
    ours = own()
    guard = RobustGuard(lambda: ours)
    for r in range(20):
        for k, sender in enumerate(("c", "d")):
            assert guard(msg(honest(ours, 10 * r + k), r, sender)) is None
        assert guard(msg({n: t * 2.5 for n, t in honest(ours, 10 * r + 5).items()}, r)) is None
    assert guard.yardstick() == pytest.approx(norm(ours), rel=0.05)
    refused = guard(msg({n: t * 3.5 for n, t in honest(ours, 999).items()}, 20))
    assert refused is not None and refused.reason is Reason.ABSURD_STATE


def test_honest_neighbours_are_never_refused_across_rounds():
    ours = own()
    guard = RobustGuard(lambda: ours)
    for r in range(20):
        for k, sender in enumerate(("b", "c", "d")):
            assert guard(msg(honest(ours, 10 * r + k, spread=0.3), r, sender)) is None


def test_a_state_replayed_for_another_round_is_refused_as_stale():
    ours = own()
    guard = RobustGuard(lambda: ours)
    state = honest(ours, 1)
    assert guard(msg(state, 3)) is None
    refused = guard(msg(state, 4))
    assert refused is not None and refused.reason is Reason.STALE_STATE
    assert "round 3" in refused.detail


def test_the_same_state_for_the_same_round_and_closing_states_are_not_replays():
    ours = own()
    guard = RobustGuard(lambda: ours)
    state = honest(ours, 1)
    assert guard(msg(state, 3)) is None
    assert guard(msg(state, 3)) is None  # a retried push, a pull after a restart
    for r in (4, 5, 6):  # the closing exchanges send the last state unchanged
        assert guard(msg(state, r, kind=Kind.FINAL)) is None
    assert guard(msg(state, 3, sender="c")) is None  # another sender's history is its own


def test_a_state_beyond_float32_squares_is_refused_not_overflowed():
    refused = RobustGuard(own)(msg({n: torch.full((P,), 3e38) for n in ("omega", "x")}))
    assert refused is not None and refused.reason is Reason.ABSURD_STATE


def test_norms_are_floored_at_one_and_nothing_to_compare_with_accepts():
    zero = {"x": torch.zeros(4)}  # a model that starts at zero: its neighbours' first steps pass
    guard = RobustGuard(lambda: zero)
    assert guard(msg({"x": torch.tensor([0.4, 0.0, 0.0, 0.0])})) is None
    assert guard(msg({"x": torch.tensor([0.0, 0.9, 0.0, 0.0])}, 4, sender="c")) is None
    assert guard(msg({"x": torch.tensor([3.5, 0.0, 0.0, 0.0])}, 4, sender="d")) is not None
    assert RobustGuard(lambda: None)(msg({"x": torch.full((P,), 1e6)})) is None
    with pytest.raises(ValueError):
        RobustGuard(own, norm_ratio=1.0)
    with pytest.raises(ValueError):
        RobustGuard(own, direction_tolerance=1.0)
