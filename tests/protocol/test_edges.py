"""Faults on in-memory runners: one-sided uses undone, a gone neighbour and the re-anchor, a
leave with its handover, a join, a cut that heals (docs/faults.md)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from dacflnode.records.membership import PeerState
from tests.harness.memory_network import Drops, FakeNetwork, residual, ring, states
from tests.harness.polling import until

TOL = 1e-6


async def finish(net: FakeNetwork) -> list[bool]:
    tasks = await net.start()
    return list(await asyncio.gather(*tasks))


async def test_a_healthy_ring_keeps_the_invariant_and_records_every_use():
    net = FakeNetwork(ring(4), rounds=6)
    assert await finish(net) == [True] * 4
    assert residual(states(net.runners)) < TOL
    for runner in net.runners.values():
        assert len(runner.edges.ledger) == 0
        assert all(p.corrections == 0 and p.missed == 0 for p in runner.peers.values())


async def test_a_one_sided_use_is_undone_exactly_and_without_the_repair_it_stays():
    lost = {("n0", "n1", 2), ("n2", "n3", 4)}  # n1 mixes without n0 in round 2; n0 still mixes n1
    repaired = FakeNetwork(ring(4), rounds=6, setup_extra={"faults": Drops(set(lost))})
    await finish(repaired)
    assert residual(states(repaired.runners)) < TOL
    assert repaired.runners["n1"].peers["n0"].corrections == 0
    assert repaired.runners["n0"].peers["n1"].corrections == 1  # n0 undid its use of n1
    assert repaired.runners["n1"].peers["n0"].missed == 1

    broken = FakeNetwork(ring(4), rounds=6,
                         setup_extra={"faults": Drops(set(lost)), "repair": False})
    await finish(broken)
    assert residual(states(broken.runners)) > 1e-3


async def test_the_last_round_is_settled_by_the_closing_exchange():
    net = FakeNetwork(ring(3), rounds=4, setup_extra={"faults": Drops({("n0", "n1", 3)})})
    await finish(net)
    assert net.runners["n0"].peers["n1"].corrections == 1  # n0 mixed n1; n1 missed n0
    assert residual(states(net.runners)) < TOL


async def test_a_silent_neighbour_is_declared_gone_and_everyone_reanchors():
    # n2 stalls from round 3 on: its neighbours declare it gone after 2 rounds and re-anchor
    stall = Drops(when=lambda s, r, t: t >= 3 and "n2" in (s, r))
    net = FakeNetwork(ring(5), rounds=14,
                      setup_extra={"faults": stall, "gone_after": 2, "anchor_delay": 4})

    tasks = await net.start()
    others = [t for t in tasks if t.get_name() != "n2"]
    await asyncio.gather(*others)
    net.runners["n2"].request_stop()
    await asyncio.gather(*tasks)
    survivors = {k: r for k, r in net.runners.items() if k != "n2"}
    for node in ("n1", "n3"):
        assert survivors[node].peers["n2"].state is PeerState.GONE
    assert all(r.reanchored >= 1 for r in survivors.values())
    assert residual(states(survivors)) < TOL


async def test_a_leaving_node_hands_over_its_mass_and_its_neighbours_go_on_at_once():
    net = FakeNetwork(ring(5), rounds=10, deadline=30.0)

    tasks = await net.start()
    leaver = net.runners["n2"]
    await until(lambda: leaver.round >= 4, interval=0.001)
    leaver.request_leave()
    results = await asyncio.gather(*tasks)
    assert results == [True, True, False, True, True]
    assert leaver.phase == "left"
    stay = {k: r for k, r in net.runners.items() if k != "n2"}
    for node in ("n1", "n3"):
        assert stay[node].peers["n2"].state is PeerState.LEFT
        last = stay[node].last
        assert last is not None and last.exchange_s < 5.0
    assert all(r.reanchored == 0 for r in stay.values())  # the handover kept it exact
    assert residual(states(stay)) < TOL


@pytest.mark.slow
async def test_a_node_far_behind_joins_at_an_agreed_round_and_keeps_the_invariant():
    edges = [*ring(4), ("n4", "n0"), ("n4", "n2")]
    net = FakeNetwork(edges, rounds=12, setup_extra={"hello_timeout": 0.3})

    tasks = await net.start(["n0", "n1", "n2", "n3"])
    await until(lambda: min(r.round for r in net.runners.values()) >= 4, interval=0.001)
    tasks += await net.start(["n4"])
    assert await asyncio.gather(*tasks) == [True] * 5
    joiner = net.runners["n4"]
    assert joiner.peers["n0"].state is PeerState.ACTIVE and joiner.peers["n0"].active_from > 4
    assert net.runners["n0"].peers["n4"].active_from == joiner.peers["n0"].active_from
    assert residual(states(net.runners)) < TOL


@pytest.mark.parametrize("heal", [True, False])
async def test_a_cut_graph_runs_on_both_sides_and_merges_again_when_it_heals(heal):
    # ring of 4 cut into {n0, n1} and {n2, n3} from round 2; healed at round 9
    cut = {frozenset(("n1", "n2")), frozenset(("n3", "n0"))}

    def down(s: str, r: str, t: int) -> bool:
        return frozenset((s, r)) in cut and t >= 2 and (not heal or t < 9)

    net = FakeNetwork(ring(4), rounds=20, deadline=30.0,
                      setup_extra={"faults": Drops(when=down), "gone_after": 2,
                                   "anchor_delay": 3})
    assert await finish(net) == [True] * 4
    if heal:
        assert net.runners["n1"].peers["n2"].state is PeerState.ACTIVE
        assert residual(states(net.runners)) < TOL
    else:
        for side in (("n0", "n1"), ("n2", "n3")):
            assert residual(r.state for k, r in net.runners.items() if k in side) < TOL
    assert torch.isfinite(net.runners["n0"].state.x).all()


def _flicker(node: str, ids: list[str]):
    """Each edge is up in some 2-round epochs and down in others (a time-varying graph)."""
    def active(t: int) -> list[str]:
        return [j for j in ids if j != node
                and (ids.index(node) + ids.index(j) + t // 2) % 3 != 0]
    return active


@pytest.mark.parametrize("drops", [False, True])
async def test_a_time_varying_graph_settles_uses_across_idle_epochs_without_reanchoring(drops):
    edges = [(a, b) for a in ("n0", "n1", "n2", "n3") for b in ("n0", "n1", "n2", "n3") if a < b]
    lost = {("n0", "n1", 3), ("n2", "n3", 7), ("n1", "n2", 12)} if drops else set()
    net = FakeNetwork(edges, rounds=24, setup_extra={"faults": Drops(lost)})
    for node in net.ids:
        net.runner(node, active_neighbours=_flicker(node, net.ids))
    assert await finish(net) == [True] * 4
    assert all(r.reanchored == 0 and not r.anchors for r in net.runners.values())
    hit = [(s, r, t) for s, r, t in lost if r in _flicker(s, net.ids)(t)]
    assert len(hit) == (2 if drops else 0)  # one drop falls on an idle edge: no effect
    assert sum(p.corrections for r in net.runners.values() for p in r.peers.values()) == len(hit)
    assert residual(states(net.runners)) < TOL


def test_two_refused_states_within_the_window_quarantine_an_edge_for_good():
    from dacflnode.protocol.edges import EdgeBook
    from dacflnode.records.membership import PeerTrack

    book = EdgeBook("a", ["b", "c"], gone_after=3)  # window: 5 rounds
    assert not book.offence("b", 2, 2)
    assert not book.offence("b", 2, 2)  # the same round counts once (both ends may say it)
    assert not book.offence("b", 8, 8)  # the first one is out of the window
    assert book.offence("b", 10, 10)
    track = book.peers["b"]
    assert (track.state, track.refused_states) == (PeerState.QUARANTINED, 3)
    assert book.quarantined == ["b"] and book.anchors == {10 + 1 + book.anchor_delay}
    assert not book.peers["b"].mixes_in(11) and book.mixing(11, ["b", "c"]) == ["c"]
    # never greeted, a Hello of it does not re-open the edge, nor an agreed join
    assert "b" not in book.to_greet()
    assert book.on_join("b", 12, 10) == 0 and book.peers["b"].state is PeerState.QUARANTINED
    book.joined_with("b", 12)
    assert book.peers["b"].state is PeerState.QUARANTINED
    # kept in the checkpoint, so a restart keeps it
    saved = {j: PeerTrack.from_json(t.to_json())
             for j, t in book.checkpoint_fields()["peers"].items()}
    again = EdgeBook("a", ["b", "c"], peers=saved)
    assert again.quarantined == ["b"] and again.peers["b"].offence_rounds == (8, 10)
