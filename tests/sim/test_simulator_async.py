"""The simulator's asynchronous runs: the daemon's node code on a virtual clock, the sum exact,
deterministic per seed, with slow nodes and links modelled instead of waited for."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest
import torch

from dacflnode.config import RunConfig
from dacflnode.errors import ConfigError
from dacflnode.learning.datasets import load_dataset
from dacflnode.learning.partition import partition
from dacflnode.protocol.faults import parse_fault_plan
from dacflnode.protocol.snapshot import snapshot_of
from dacflnode.records.metrics_log import METRICS_FILE, read_metrics
from dacflnode.sim.report import accuracy_over_time, find_runs
from dacflnode.sim.round_records import SimulationResult
from dacflnode.sim.simulator import Simulation

CFG = RunConfig(dataset="synthetic", nodes=4, rounds=4, topology="ring", schedule="async",
                engine="sequential", synthetic_train=400, synthetic_test=100, threads=1)


class Simulated(Simulation):
    """A simulation that has run, with its result."""

    result: SimulationResult


def simulate(cfg: RunConfig = CFG, out: Path | None = None, **kw) -> Simulated:
    cfg.validate()
    data = load_dataset("synthetic", None, synthetic_train=cfg.synthetic_train,
                        synthetic_test=cfg.synthetic_test, seed=cfg.seed)
    parts = partition(data.train_y, cfg.nodes, cfg.partition, seed=cfg.seed)
    sim = Simulated(cfg, "dacfl", data, parts, out_dir=out, **kw)
    sim.result = sim.run()
    return sim


def assert_applied_once(sim: Simulated) -> None:
    """The sum is exact, and every node answered and applied each exchange id once."""
    assert sim.result.invariant is not None and sim.result.invariant <= 2e-6
    for runner in sim.runners:
        journal = runner.async_node.journal  # type: ignore[union-attr]
        for event in ("answer", "apply"):
            steps = [(e["peer"], e["id"]) for e in journal if e["event"] == event]
            assert steps and len(steps) == len(set(steps)), (runner.setup.node_id, event)


def test_an_async_run_ends_settled_with_the_sum_exact_and_every_block_trained(tmp_path):
    sim = simulate(out=tmp_path)
    assert [r.round for r in sim.runners] == [4] * 4
    assert all(r.phase == "done" for r in sim.runners)
    assert sim.result.invariant is not None and sim.result.invariant <= 2e-6
    for r in sim.runners:  # no exchange left unanswered; x and ω treated alike throughout
        assert r.async_node is not None and not r.async_node.asked
        assert torch.equal(r.state.x, r.state.omega)
    lines = read_metrics(tmp_path / "node-1" / METRICS_FILE)
    assert [line["round"] for line in lines] == [1, 2, 3, 4]
    # block b of a node of slowdown 1 ends at b × block_time on the virtual clock
    assert [line["time"] for line in lines] == [1.0, 2.0, 3.0, 4.0]
    assert all(line["exchanges"] >= 1 and line["staleness"] is not None for line in lines)


def test_an_async_run_is_the_same_for_the_same_seed():
    a, b = simulate(), simulate()
    assert a.result.wall_s == b.result.wall_s
    for ra, rb in zip(a.runners, b.runners, strict=True):
        assert torch.equal(ra.state.x, rb.state.x)
        assert ra.async_node.journal == rb.async_node.journal  # type: ignore[union-attr]


def test_a_slow_node_sets_only_its_own_pace_and_is_still_mixed_often(tmp_path):
    sim = simulate(out=tmp_path, slowdown={"node-0": 4.0})
    assert sim.result.wall_s == pytest.approx(4 * CFG.rounds * CFG.block_time)
    fast = read_metrics(tmp_path / "node-2" / METRICS_FILE)
    slow = read_metrics(tmp_path / "node-0" / METRICS_FILE)
    assert fast[-1]["time"] == pytest.approx(CFG.rounds * CFG.block_time)
    assert slow[-1]["time"] == pytest.approx(4 * CFG.rounds * CFG.block_time)
    # its neighbours come to it: more exchanges with it than its own blocks would ask for
    node0 = sim.runners[0].async_node
    assert node0 is not None and sum(node0.per_edge.values()) > 2 * CFG.rounds
    assert sim.result.invariant is not None and sim.result.invariant <= 2e-6


def test_a_staleness_bound_refuses_snapshots_too_far_apart_and_keeps_the_sum(tmp_path):
    cfg = dataclasses.replace(CFG, staleness=1, rounds=6)
    sim = simulate(cfg, out=tmp_path, slowdown={"node-0": 4.0})
    lines = [line for node in ("node-1", "node-3")
             for line in read_metrics(tmp_path / node / METRICS_FILE)]
    assert max(line["staleness"] for line in lines) <= 1
    assert sim.result.invariant is not None and sim.result.invariant <= 2e-6


def test_modelled_links_add_their_time_and_no_real_time_passes():
    slow_links = dataclasses.replace(CFG, link_latency=5.0)
    began = time.perf_counter()
    sim = simulate(slow_links)
    assert time.perf_counter() - began < 60  # 4 × 5 s of latency per block are not slept
    assert sim.result.wall_s > CFG.rounds * CFG.block_time + 10.0


def test_an_async_run_refuses_round_faults_a_crash_for_good_and_the_batched_engine():
    with pytest.raises(ConfigError, match="schedule async"):
        simulate(faults=parse_fault_plan(
            {"faults": [{"drop": ["node-0", "node-1"], "rounds": [2, 2]}]}))
    with pytest.raises(ConfigError, match="for good"):
        simulate(faults=parse_fault_plan({"faults": [{"crash": "node-0", "round": 2}]}))
    with pytest.raises(ConfigError, match="batched"):
        simulate(dataclasses.replace(CFG, engine="batched"))


def test_an_async_run_refuses_an_unknown_slow_node():
    with pytest.raises(ConfigError, match="node-9"):
        simulate(slowdown={"node-9": 2.0})


def test_a_lost_answer_is_asked_again_and_applied_once_at_each_end(monkeypatch):
    """Every third answer is lost on its way back (the answering node applied it): the asking
    node asks again with the same id, gets the same answer, and each exchange is applied once
    at each end, so the sum stays exact."""
    from dacflnode.transport.base import PeerUnavailable
    from dacflnode.transport.memory import MemoryTransport

    real = MemoryTransport.exchange
    calls = {"n": 0}

    async def lossy(self, peer, request, timeout):
        reply = await real(self, peer, request, timeout)
        calls["n"] += 1
        if request.exchange_id and calls["n"] % 3 == 0:
            raise PeerUnavailable("the answer was lost")
        return reply

    monkeypatch.setattr(MemoryTransport, "exchange", lossy)
    sim = simulate()
    assert_applied_once(sim)
    # every exchange applied by its asking end was answered once by the other end
    answered = {(r.setup.node_id, e["peer"], e["id"]) for r in sim.runners
                for e in r.async_node.journal if e["event"] == "answer"}  # type: ignore[union-attr]
    applied = {(e["peer"], r.setup.node_id, e["id"]) for r in sim.runners
               for e in r.async_node.journal if e["event"] == "apply"}  # type: ignore[union-attr]
    assert applied == answered and calls["n"] > 10


def test_status_and_prometheus_show_blocks_exchanges_per_edge_and_the_wait():
    """What an operator reads of an asynchronous node: the schedule, its blocks, the
    exchanges per neighbour and the time it waited, through the snapshot, the Control
    reply and the Prometheus exposition."""
    from dacflnode.daemon.prometheus import NodeMetrics
    from dacflnode.protocol.snapshot import snapshot_of
    from dacflnode.transport.control_types import NeighbourInfo, NodeStatus
    from dacflnode.transport.grpc_control import status_from_proto, status_to_proto

    sim = simulate(slowdown={"node-0": 4.0})
    runner = sim.runners[1]
    snap = snapshot_of(runner)
    assert (snap.schedule, snap.round) == ("async", CFG.rounds)
    assert snap.peer("node-0").exchanges > 0 and snap.peer("node-2").exchanges > 0
    assert snap.waited_s > 0  # node-1 finished its blocks long before node-0
    status = NodeStatus(
        node_id="node-1", algorithm="dacfl", round=snap.round, rounds_total=snap.rounds,
        phase=snap.phase, schedule=snap.schedule, waited_s=snap.waited_s,
        ahead_of=["node-0"],
        neighbours=[NeighbourInfo(j, "", exchanges=snap.peer(j).exchanges)
                    for j in ("node-0", "node-2")])
    back = status_from_proto(status_to_proto(status))
    assert (back.schedule, back.waited_s, back.ahead_of) == ("async", snap.waited_s, ["node-0"])
    assert [n.exchanges for n in back.neighbours] == [n.exchanges for n in status.neighbours]
    metrics = NodeMetrics("node-1", process=False)
    metrics.update(status)
    text = metrics.prometheus()
    assert f'dacfl_peer_exchanges_total{{node="node-1",peer="node-0"}} ' \
           f'{float(snap.peer("node-0").exchanges)}' in text
    assert 'dacfl_waited_seconds{node="node-1"}' in text


def test_max_duration_ends_every_node_settled_at_that_time_whatever_blocks_are_left():
    cfg = dataclasses.replace(CFG, rounds=10, max_duration=3.5)
    sim = simulate(cfg, slowdown={"node-0": 2.0})
    # a block starts while less than 3.5 s have passed: 4 blocks of 1 s, 2 blocks of 2 s
    assert [r.round for r in sim.runners] == [2, 4, 4, 4]
    assert all(r.phase == "done" for r in sim.runners)
    assert sim.finishers == sim.runners
    assert sim.result.invariant is not None and sim.result.invariant <= 2e-6


def test_virtual_time_plays_synchronous_rounds_at_the_slowest_nodes_pace(tmp_path):
    """Synchronous rounds on the virtual clock: every round waits for the slow node, so the
    fast nodes' lines come at its pace; a tight round deadline lets them go on without it."""
    sync = dataclasses.replace(CFG, schedule="sync")
    even = simulate(sync, out=tmp_path / "even", virtual_time=True)
    assert even.result.wall_s == pytest.approx(CFG.rounds * CFG.block_time)
    slow = simulate(sync, out=tmp_path / "slow", virtual_time=True, slowdown={"node-0": 4.0})
    assert slow.result.wall_s == pytest.approx(4 * CFG.rounds * CFG.block_time)
    # node-1 mixes node-0's state of every round: its round R ends 1 s after node-0's began
    fast = read_metrics(tmp_path / "slow" / "node-1" / METRICS_FILE)
    assert fast[-1]["time"] == pytest.approx(4 * (CFG.rounds - 1) + 1)
    simulate(sync, out=tmp_path / "tight", virtual_time=True, slowdown={"node-0": 4.0},
             round_deadline=1.5)
    tight = read_metrics(tmp_path / "tight" / "node-1" / METRICS_FILE)
    assert tight[-1]["time"] < fast[-1]["time"]
    assert any(line["neighbours_missing"] for line in tight)


def test_a_virtual_runs_durations_are_virtual_so_its_time_to_accuracy_is_the_same_every_run(
        tmp_path):
    """The metrics lines' ``seconds``, ``train_s`` and ``exchange_s`` are on the virtual clock
    (a real duration there would shift the run's start, and with it every time to accuracy,
    by however long the machine took for the first round)."""
    sync = dataclasses.replace(CFG, schedule="sync")
    curves = []
    for arm in ("a", "b"):
        simulate(sync, out=tmp_path / arm, virtual_time=True, slowdown={"node-0": 4.0})
        slow = read_metrics(tmp_path / arm / "node-0" / METRICS_FILE)
        fast = read_metrics(tmp_path / arm / "node-1" / METRICS_FILE)
        assert [line["train_s"] for line in slow] == [4.0] * CFG.rounds
        assert [line["train_s"] for line in fast] == [1.0] * CFG.rounds
        # node-1 waits the 3 s node-0 trains longer for node-0's state (from round 2 on)
        assert [line["exchange_s"] for line in fast][1:] == [3.0] * (CFG.rounds - 1)
        assert all(line["seconds"] == line["exchange_s"] + line["train_s"] for line in fast)
        (run,) = find_runs([tmp_path / arm])
        curves.append(accuracy_over_time(run))
    assert curves[0] == curves[1] and curves[0]["time"][0] == 4.0


def test_rounds_on_the_virtual_clock_train_each_node_on_its_own_whatever_the_engine_setting(
        tmp_path):
    """The batched engine trains (and evaluates) a round's nodes together, which waits for the
    slowest: ``auto`` takes the sequential one on the virtual clock, so a tight deadline lets
    the fast nodes go on; ``batched`` asked for by name is refused in one line."""
    sync = dataclasses.replace(CFG, schedule="sync", engine="auto")
    sim = simulate(sync, out=tmp_path, virtual_time=True, slowdown={"node-0": 4.0},
                   round_deadline=1.5)
    assert sim.engine.name == "sequential"
    fast = read_metrics(tmp_path / "node-2" / METRICS_FILE)
    assert fast[-1]["time"] < 4 * CFG.rounds * CFG.block_time
    with pytest.raises(ConfigError, match=r"virtual clock.*sequential"):
        simulate(dataclasses.replace(sync, engine="batched"), virtual_time=True)


def test_a_round_deadline_without_virtual_time_is_refused():
    with pytest.raises(ConfigError, match="virtual"):
        simulate(dataclasses.replace(CFG, schedule="sync"), round_deadline=1.0)


#: node-1 and node-2 (neighbours on the ring) crash after block 2; node-1 is back once the
#: others reach block 3, node-2 at block 4: node-1 restarts while its neighbour is still down,
#: and both ends of their edge restarted.
CRASHES = {"faults": [{"crash": "node-1", "round": 2, "restart": 3},
                      {"crash": "node-2", "round": 2, "restart": 4}]}


def crash_run(out: Path | None = None) -> Simulated:
    return simulate(dataclasses.replace(CFG, rounds=6), out=out,
                    faults=parse_fault_plan(CRASHES), slowdown={"node-0": 3.0})


def test_nodes_restarted_from_their_last_checkpoint_reconcile_their_edges_and_the_sum_is_exact(
        tmp_path):
    sim = crash_run(tmp_path)
    assert [r.round for r in sim.runners] == [6] * 4
    assert all(r.phase == "done" for r in sim.runners)
    assert sim.result.invariant is not None and sim.result.invariant <= 2e-6
    journals = {r.setup.node_id: r.async_node.journal  # type: ignore[union-attr]
                for r in sim.runners}
    for node in ("node-1", "node-2"):
        events = [e["event"] for e in journals[node]]
        assert events[0] == "restart" and events.count("adopt") >= 1
    # the edge both ends restarted on is adopted by one end only (node-1, first by id)
    assert [e["peer"] for e in journals["node-2"] if e["event"] == "adopt"] == ["node-3"]
    assert any(e["event"] == "reconcile" and e["peer"] == "node-1"
               for e in journals["node-2"])
    # what the lost processes' exchanges did after their checkpoints was repaired
    moved = [e["moved"] for n in ("node-1", "node-2") for e in journals[n]
             if e["event"] == "adopt"]
    assert max(moved) > 0
    # the journal on disk holds both processes, the second after a restart of epoch 1
    disk = (tmp_path / "node-1" / "exchanges.jsonl").read_text()
    assert '"event": "restart", "epoch": 1' in disk


def test_a_run_with_crashes_and_files_is_the_same_twice(tmp_path):
    """The nodes' files are written in threads that finish in any order; the simulation does
    not see that order (the virtual clock delivers thread results in the order started)."""
    a, b = crash_run(tmp_path / "a"), crash_run(tmp_path / "b")
    for ra, rb in zip(a.runners, b.runners, strict=True):
        assert ra.async_node.journal == rb.async_node.journal  # type: ignore[union-attr]
        assert torch.equal(ra.state.x, rb.state.x)


def test_without_the_reconciliation_the_same_crashes_break_the_sum(monkeypatch):
    from dacflnode.algorithms.edge_flows import EdgeFlows

    monkeypatch.setattr(EdgeFlows, "adopt", lambda self, state, peer, theirs: state)
    sim = crash_run()
    assert sim.result.invariant is not None and sim.result.invariant > 1e-4


def test_a_neighbour_refuses_exchange_ids_from_before_a_restart():
    from dacflnode.wire.errors import Reason, WireError
    from dacflnode.wire.message import Kind, RoundMessage

    sim = crash_run()
    node_0 = sim.runners[0].async_node
    assert node_0 is not None and node_0.members.floor["node-1"] == 1 << 32
    old = RoundMessage("node-1", 2, 2, {}, kind=Kind.EXCHANGE,
                       exchange_id=7)
    with pytest.raises(WireError) as refused:
        asyncio.run(node_0.answer(old))
    assert refused.value.reason is Reason.RESTARTED


def test_a_node_that_leaves_hands_its_edges_over_and_a_late_one_joins_with_the_sum_exact(
        tmp_path):
    """node-1 leaves after 3 blocks (a drain), node-3 starts only once the others have done 2:
    the nodes that stay end with Σ x = Σ τ, the leaver's neighbours took its share of each
    edge and mix without it; without the handover the same run is far off."""
    cfg = dataclasses.replace(CFG, nodes=5, rounds=6)
    plan = {"faults": [{"leave": "node-1", "round": 3}, {"join": "node-3", "round": 2}]}
    sim = simulate(cfg, out=tmp_path, faults=parse_fault_plan(plan),
                   slowdown={"node-0": 2.0})
    by_id = {r.setup.node_id: r for r in sim.runners}
    assert (by_id["node-1"].phase, by_id["node-1"].round) == ("left", 3)
    assert [r.round for n, r in sorted(by_id.items()) if n != "node-1"] == [6] * 4
    assert sim.result.invariant is not None and sim.result.invariant <= 2e-6
    for n in ("node-0", "node-2"):
        node = by_id[n].async_node
        assert node is not None and "node-1" not in node.neighbours
        assert [e["peer"] for e in node.journal if e["event"] == "handed"] == ["node-1"]
        assert snapshot_of(by_id[n]).peer("node-1").state == "left"  # as status shows it
    joiner = read_metrics(tmp_path / "node-3" / METRICS_FILE)
    others = read_metrics(tmp_path / "node-2" / METRICS_FILE)
    assert joiner[0]["time"] > others[1]["time"]  # it began after the others' second block


def test_without_the_handover_a_departure_breaks_the_sum(monkeypatch):
    from dacflnode.algorithms.edge_flows import EdgeFlows

    monkeypatch.setattr(EdgeFlows, "handed", lambda self, state, peer, theirs: state)
    cfg = dataclasses.replace(CFG, nodes=5, rounds=6)
    sim = simulate(cfg, faults=parse_fault_plan({"faults": [{"leave": "node-1", "round": 3}]}))
    assert sim.result.invariant is not None and sim.result.invariant > 1e-4


@pytest.mark.parametrize("compression", ["int8", "topk:0.1"])
def test_compressed_exchanges_send_fewer_bytes_and_keep_the_sum_exact(tmp_path, compression):
    """Snapshots go as deltas from per-edge references, transfers compressed and applied
    decoded at both ends: the sum stays exact while far fewer bytes move; a restart (no
    references) sends its first snapshots whole and is refused nothing for good."""
    def sent(folder: Path) -> int:
        return sum(line["bytes_sent"] for n in range(4)
                   for line in read_metrics(folder / f"node-{n}" / METRICS_FILE))

    simulate(dataclasses.replace(CFG, rounds=6), out=tmp_path / "full",
             slowdown={"node-0": 3.0})
    cfg = dataclasses.replace(CFG, rounds=6, compression=compression)
    small = simulate(cfg, out=tmp_path / "small", slowdown={"node-0": 3.0})
    assert small.result.invariant is not None and small.result.invariant <= 2e-6
    assert sent(tmp_path / "small") * 3 < sent(tmp_path / "full")
    crashed = simulate(cfg, faults=parse_fault_plan(CRASHES), slowdown={"node-0": 3.0})
    assert crashed.result.invariant is not None and crashed.result.invariant <= 2e-6
    assert all(r.round == 6 and r.phase == "done" for r in crashed.runners)


def test_a_poisoning_member_is_refused_and_quarantined_and_the_sum_stays_exact():
    """node-2 sends its snapshots scaled by 50 from its block 2 on (a fault plan's poison):
    its neighbours' guards refuse them (nothing applied at either end), the edges are
    quarantined at both ends after repeated refusals, every node ends, and Σ x = Σ τ holds
    over all of them; the honest nodes learn as in a clean run."""
    cfg = dataclasses.replace(CFG, nodes=5, rounds=10)
    clean = simulate(cfg)
    plan = {"faults": [{"poison": "node-2", "rounds": [2, 10], "scale": 50.0}]}
    sim = simulate(cfg, faults=parse_fault_plan(plan))
    assert all(r.phase == "done" and r.round == 10 for r in sim.runners)
    assert sim.result.invariant is not None and sim.result.invariant <= 2e-6
    by_id = {r.setup.node_id: r.async_node for r in sim.runners}
    for honest in ("node-1", "node-3"):
        node = by_id[honest]
        assert node is not None and node.guard is not None
        assert node.guard.quarantined == {"node-2"} and "node-2" not in node.neighbours
        assert node.edge_state("node-2") == "quarantined"
    honest_ids = ("node-0", "node-1", "node-3", "node-4")
    acc = {r.setup.node_id: r.last_accuracy for r in sim.runners}
    before = {r.setup.node_id: r.last_accuracy for r in clean.runners}
    assert min(acc[n] for n in honest_ids) >= min(before[n] for n in honest_ids) - 0.1


def test_a_retry_that_overlaps_its_first_try_is_answered_once(monkeypatch):
    """Every exchange request arrives twice at once (a retry sent while the first try is still
    being answered): the answering node applies it once and both calls get the same answer, so
    the sum stays exact."""
    from dacflnode.transport.memory import MemoryTransport
    from dacflnode.wire.message import Kind

    real = MemoryTransport.exchange

    async def twice(self, peer, request, timeout):
        if request.kind is not Kind.EXCHANGE:
            return await real(self, peer, request, timeout)
        first, second = await asyncio.gather(real(self, peer, request, timeout),
                                             real(self, peer, request, timeout),
                                             return_exceptions=True)
        if isinstance(first, BaseException):
            raise first
        assert isinstance(second, BaseException) or second is first
        return first

    monkeypatch.setattr(MemoryTransport, "exchange", twice)
    assert_applied_once(simulate())
