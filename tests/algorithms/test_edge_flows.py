"""The edges' transfer totals of asynchronous DACFL: they hold what each node's exchanges did,
survive a checkpoint, and let a node that lost its recent exchanges make every edge cancel
again by adopting its neighbours' totals."""

from __future__ import annotations

import random

import pytest
import torch

from dacflnode.algorithms.edge_flows import EdgeFlows
from dacflnode.algorithms.pairwise import answered, asked, fold, transfer, vectors_of
from dacflnode.algorithms.rounds import NodeState

N, SIZE, W = 4, 200, 0.25
EDGES = [(i, (i + 1) % N) for i in range(N)]


def relative_gap(states: list[NodeState]) -> float:
    x = torch.stack([s.x.double() for s in states]).sum(0)
    tau = torch.stack([s.omega_prev.double() for s in states]).sum(0)
    return float((x - tau).norm() / tau.norm())


def exchange(states: list[NodeState], flows: list[EdgeFlows], i: int, j: int) -> None:
    """``i`` asks ``j``: both ends apply the transfer and record it."""
    c = transfer(W, vectors_of(states[i]), vectors_of(states[j]))
    states[j] = answered(states[j], c)
    flows[j].added(str(i), c, +1.0)
    states[i] = asked(states[i], c)
    flows[i].added(str(j), c, -1.0)


def train(states: list[NodeState], i: int, gen: torch.Generator) -> None:
    start = states[i].omega
    states[i] = fold(states[i], start, start + 0.1 * torch.randn(SIZE, generator=gen))


@pytest.mark.parametrize("seed", range(6))
def test_a_node_back_from_an_old_checkpoint_makes_the_sum_exact_by_adopting_its_edges(
        seed: int):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    states = [NodeState.initial(torch.randn(SIZE, generator=gen))] * N
    flows = [EdgeFlows() for _ in range(N)]
    for _ in range(60):
        if rng.random() < 0.4:
            train(states, rng.randrange(N), gen)
        else:
            exchange(states, flows, *rng.choice(EDGES))
    # node 1 checkpoints, then goes on exchanging and training, then loses all of it
    saved_state = states[1]
    saved_flows = EdgeFlows.from_tensors(flows[1].tensors())
    for _ in range(30):
        if rng.random() < 0.3:
            train(states, 1, gen)
        else:
            exchange(states, flows, *rng.choice(EDGES))
    states[1], flows[1] = saved_state, saved_flows
    assert relative_gap(states) > 1e-4  # the lost exchanges broke the sum
    for peer in (0, 2):
        states[1] = flows[1].adopt(states[1], str(peer), flows[peer].of("1", states[1].x))
    assert relative_gap(states) < 1e-6
    for i, j in EDGES:  # every edge cancels again
        mine, theirs = flows[i].of(str(j), states[i].x), flows[j].of(str(i), states[j].x)
        assert torch.allclose(mine["x"], -theirs["x"], atol=1e-6)


def test_adopting_an_edge_that_already_cancels_changes_nothing():
    gen = torch.Generator().manual_seed(3)
    states = [NodeState.initial(torch.randn(SIZE, generator=gen))] * N
    flows = [EdgeFlows() for _ in range(N)]
    exchange(states, flows, 0, 1)
    train(states, 0, gen)
    exchange(states, flows, 1, 0)
    after = flows[0].adopt(states[0], "1", flows[1].of("0", states[0].x))
    assert torch.equal(after.x, states[0].x) and torch.equal(after.omega, states[0].omega)
    assert torch.equal(after.omega_prev, states[0].omega_prev)  # τ holds only own steps


def test_an_edge_never_used_has_zero_totals_and_the_checkpoint_names_each_edge():
    flows = EdgeFlows()
    like = torch.ones(5)
    assert all(torch.equal(t, torch.zeros(5)) for t in flows.of("b", like).values())
    flows.added("b", {"omega": torch.ones(5), "x": torch.full((5,), 2.0)}, -1.0)
    names = flows.tensors()
    assert sorted(names) == ["flow.b.omega", "flow.b.x"]
    back = EdgeFlows.from_tensors({**names, "pending.3.b": torch.ones(5)})
    assert torch.equal(back.of("b", like)["x"], torch.full((5,), -2.0))
    # a node id may hold dots: the vector's name is after the last one
    dotted = EdgeFlows.from_tensors({"flow.node.eu-1.x": torch.ones(5)})
    assert set(dotted.totals) == {"node.eu-1"}
    assert torch.equal(dotted.of("node.eu-1", like)["omega"], torch.zeros(5))
