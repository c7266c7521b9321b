"""A member that poisons what it sends (scaled 5×, 50×, 99× or sign-flipped, once or every
round) is refused by its neighbours' guards: the honest nodes end within 2 points of the
untouched run, the invariant holds among them, a member that keeps at it is quarantined, and no
round waits for a refused state (the simulator has no deadline: a wait would hang the run)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dacflnode.config import RunConfig
from dacflnode.sim.insider import Outcome, load, play

pytestmark = pytest.mark.slow

RING = RunConfig(dataset="synthetic", nodes=5, rounds=12, model="tiny-cnn", lr=0.05,
                 batch_size=20, synthetic_train=400, synthetic_test=100, topology="ring",
                 engine="sequential", device="cpu")
REGULAR = replace(RING, nodes=10, topology="random-regular", degree=3, synthetic_train=600)
#: float32 rounding of Σ x − Σ tracked over a few nodes
EXACT = 1e-6
#: how far the honest nodes' mean accuracy may be from the untouched run's
POINTS = 0.02


_UNTOUCHED: dict[tuple[str, str], Outcome] = {}


def untouched(cfg: RunConfig) -> Outcome:
    """The run without poison (once per topology and compression in this module)."""
    key = (cfg.topology, cfg.compression)
    if key not in _UNTOUCHED:
        _UNTOUCHED[key] = play(cfg, [], data=load(cfg), timeout=120)
    return _UNTOUCHED[key]


def attack(cfg: RunConfig, rounds: list[int], scale: float) -> Outcome:
    return play(cfg, [{"poison": "node-2", "rounds": rounds, "scale": scale}], data=load(cfg),
                timeout=120)


@pytest.mark.parametrize(("cfg", "scale"), [(RING, 5.0), (REGULAR, -1.0)],
                         ids=["ring-5x", "regular-sign-flip"])
def test_one_poisoned_round_is_refused_and_changes_nothing_for_the_honest(cfg, scale):
    base, hit = untouched(cfg), attack(cfg, [4, 4], scale)
    assert hit.refused >= 2  # every neighbour of node-2 refused its round-4 state
    assert hit.quarantined == []  # one offence is not enough
    assert abs(hit.mean_accuracy - base.mean_accuracy) <= POINTS
    assert hit.invariant is not None and hit.invariant <= EXACT


@pytest.mark.parametrize(("cfg", "scale"), [(RING, -1.0), (RING, 99.0), (REGULAR, 50.0)],
                         ids=["ring-sign-flip", "ring-99x", "regular-50x"])
def test_a_member_poisoning_every_round_is_quarantined_and_the_honest_stay_exact(cfg, scale):
    base, hit = untouched(cfg), attack(cfg, [3, cfg.rounds - 1], scale)
    neighbours = {peer for node, peer in hit.quarantined}
    assert neighbours == {"node-2"}
    assert len(hit.quarantined) == (2 if cfg is RING else 3)  # by each of its neighbours
    assert abs(hit.mean_accuracy - base.mean_accuracy) <= POINTS
    assert hit.invariant is not None and hit.invariant <= EXACT  # among the honest nodes


@pytest.mark.parametrize("compression", ["int8", "topk:0.05"])
def test_a_compressed_runs_guard_judges_copies_and_quarantines_a_poisoning_member(compression):
    cfg = replace(RING, compression=compression)
    base, hit = untouched(cfg), attack(cfg, [3, cfg.rounds - 1], 50.0)
    assert {peer for _, peer in hit.quarantined} == {"node-2"}
    assert len(hit.quarantined) == 2
    assert abs(hit.mean_accuracy - base.mean_accuracy) <= POINTS
    assert hit.invariant is not None and hit.invariant <= EXACT
