"""Asynchronous DACFL's fold and pairwise transfer keep ``Σ x = Σ τ`` whatever the order."""

from __future__ import annotations

import random

import pytest
import torch

from dacflnode.algorithms.pairwise import (
    answered,
    asked,
    fold,
    kept_after,
    metropolis_weight,
    transfer,
    vectors_of,
)
from dacflnode.algorithms.rounds import NodeState


def _sums(states: list[NodeState]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.stack([s.x.double() for s in states]).sum(0)
    tau = torch.stack([s.omega_prev.double() for s in states]).sum(0)
    omega = torch.stack([s.omega.double() for s in states]).sum(0)
    return x, tau, omega


@pytest.mark.parametrize("seed", range(8))
def test_any_interleaving_of_folds_and_stale_exchanges_keeps_the_sum_exact(seed: int):
    """Random folds and exchanges, each exchange's asking snapshot taken some events before
    its answer and its transfer subtracted some events after: once every transfer is applied
    at both ends, Σx = Στ to float rounding, and x and ω are the same, bit for bit."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    n, size = 5, 1000
    start = torch.randn(size, generator=gen)
    states = [NodeState.initial(start) for _ in range(n)]
    edges = [(i, (i + 1) % n) for i in range(n)]
    in_flight: list[tuple[int, int, dict[str, torch.Tensor] | None, dict[str, torch.Tensor]]] = []
    for _ in range(400):
        what = rng.random()
        if what < 0.3:  # a block of training: a random step
            i = rng.randrange(n)
            begin = states[i].omega
            states[i] = fold(states[i], begin, begin + 0.1 * torch.randn(size, generator=gen))
        elif what < 0.6:  # an exchange is asked for: snapshot now
            i, j = rng.choice(edges)
            in_flight.append((i, j, None, vectors_of(states[i])))
        elif in_flight:
            k = rng.randrange(len(in_flight))
            i, j, c, snap = in_flight[k]
            if c is None:  # answered now, from the old snapshot
                c = transfer(metropolis_weight(2, 2), snap, vectors_of(states[j]))
                states[j] = answered(states[j], c)
                in_flight[k] = (i, j, c, snap)
            else:  # the answer arrives at the asking end
                states[i] = asked(states[i], c)
                in_flight.pop(k)
    for i, _j, c, _ in in_flight:  # settle what is in flight
        if c is not None:
            states[i] = asked(states[i], c)
    x, tau, omega = _sums(states)
    scale = float(tau.norm())
    assert float((x - tau).norm()) / scale < 1e-6
    assert float((omega - tau).norm()) / scale < 1e-6
    assert all(torch.equal(s.x, s.omega) for s in states)


def test_the_two_ends_of_an_exchange_change_by_exact_opposites():
    gen = torch.Generator().manual_seed(1)
    a = NodeState(3, torch.randn(50, generator=gen), torch.randn(50, generator=gen),
                  torch.randn(50, generator=gen))
    b = NodeState(7, torch.randn(50, generator=gen), torch.randn(50, generator=gen),
                  torch.randn(50, generator=gen))
    c = transfer(1 / 3, vectors_of(a), vectors_of(b))
    assert torch.equal(c["x"], (a.x - b.x) * (1 / 3))
    a2, b2 = asked(a, c), answered(b, c)
    # the same c, added at one end and subtracted at the other; τ is not moved
    assert torch.equal(a2.x, a.x - c["x"]) and torch.equal(b2.x, b.x + c["x"])
    assert torch.equal(a2.omega, a.omega - c["omega"])
    assert torch.equal(b2.omega, b.omega + c["omega"])
    assert torch.equal(a2.omega_prev, a.omega_prev)
    assert torch.equal(b2.omega_prev, b.omega_prev)
    assert (a2.round, b2.round) == (3, 7)  # an exchange is not a block


def test_exchanges_alone_bring_every_estimate_to_the_average():
    """With no training, repeated pairwise exchanges on a ring are gossip averaging: every x
    goes to the mean of the starting x."""
    gen = torch.Generator().manual_seed(2)
    n = 6
    states = [NodeState(0, torch.randn(20, generator=gen), torch.zeros(20), torch.zeros(20))
              for _ in range(n)]
    mean = torch.stack([s.x for s in states]).mean(0)
    for _ in range(200):
        for i in range(n):
            j = (i + 1) % n
            c = transfer(metropolis_weight(2, 2), vectors_of(states[i]), vectors_of(states[j]))
            states[j] = answered(states[j], c)
            states[i] = asked(states[i], c)
    for s in states:
        assert torch.allclose(s.x, mean, atol=1e-5)


def test_a_fold_adds_the_blocks_step_to_the_model_the_estimate_and_the_tracked_signal():
    state = NodeState(4, torch.full((3,), 1.0), torch.full((3,), 2.5), torch.full((3,), 2.0))
    after = fold(state, torch.full((3,), 2.0), torch.full((3,), 3.0))  # a step of +1
    assert after.round == 5
    assert torch.equal(after.omega, torch.full((3,), 3.5))
    assert torch.equal(after.x, torch.full((3,), 2.0))
    assert torch.equal(after.omega_prev, torch.full((3,), 3.0))


def test_a_block_overlapped_by_exchanges_folds_the_share_of_its_step_still_its_own():
    """Two exchanges of weight 1/4 while the block trained leave (3/4)² of its start in ω:
    that share of the step is folded."""
    state = NodeState(0, torch.zeros(2), torch.zeros(2), torch.zeros(2))
    kept = kept_after(kept_after(1.0, 0.25), 0.25)
    assert kept == 0.5625
    after = fold(state, torch.zeros(2), torch.full((2,), 2.0), kept)
    assert torch.equal(after.omega, torch.full((2,), 1.125))
    assert torch.equal(after.x, after.omega) and torch.equal(after.omega_prev, after.omega)
    with pytest.raises(ValueError, match="kept"):
        fold(state, torch.zeros(2), torch.zeros(2), 1.5)


def test_metropolis_weights_are_symmetric_and_at_most_a_half():
    for di in range(1, 6):
        for dj in range(1, 6):
            w = metropolis_weight(di, dj)
            assert w == metropolis_weight(dj, di) and 0 < w <= 0.5
    with pytest.raises(ValueError):
        metropolis_weight(0, 2)
    with pytest.raises(ValueError, match="weight"):
        transfer(0.7, {"omega": torch.zeros(1), "x": torch.zeros(1)},
                 {"omega": torch.zeros(1), "x": torch.zeros(1)})
