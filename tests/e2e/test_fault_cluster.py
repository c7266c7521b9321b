"""Faults on real daemons: a 5-node ring of ``dacflnode start`` processes on synthetic data.

Each test injects a fault the way an operator or the world would, and checks that every node
that should finish does, and that the consensus invariant ``Σ x = Σ ω_prev`` holds, to 2e-6
relative, over the final checkpoints of the nodes that stay (docs/faults.md):

* stalls: one daemon at a time frozen with SIGSTOP beyond the round deadline, at three rounds on
  three nodes;
* ``dacflnode stop --drain`` of one node mid-run (the Control ``Stop(drain)`` call the command
  makes): its neighbours go on without waiting for it, and the drained daemon exits 0;
* a late join: a run member whose daemon starts only after the others have done a few rounds;
* a partition of the ring into two sides, and its heal (in network namespaces; skipped where
  ``ip netns`` is not available).

A ``kill -9`` followed by a restart within the deadline is
``test_cluster.py::test_a_killed_node_restarted_from_its_checkpoint_rejoins_the_cluster``.

Ports come from bind(0) (the namespaces have their own); every process a test starts is killed
when the test ends, whatever happens. A failing check prints the tail of the nodes' stderr.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dacflnode.transport.grpc_control import request_stop
from tests.harness import cluster as harness
from tests.harness.cluster import Cluster
from tests.harness.netns import hosts, sh

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

#: Round deadline of the clusters here: short, so that a fault costs seconds, not minutes.
DEADLINE = 2.0
#: The invariant after faults, relative. float32 rounding alone leaves about 5e-7 after 24
#: rounds of a healthy ring and 2e-6 after 120, so no run here is longer than 60 rounds.
TOLERANCE = 2e-6


@contextmanager
def cluster(root: Path, nodes: int, rounds: int, **kw: Any) -> Iterator[Cluster]:
    """A ring of daemons with this module's short deadline, evaluating every 5 rounds."""
    kw.setdefault("deadline", DEADLINE)
    kw.setdefault("eval_every", 5)
    with harness.cluster(root, nodes, rounds, **kw) as c:
        yield c


def missed(c: Cluster, observer: int, peer: int) -> list[int]:
    """The rounds in which node ``observer`` mixed without node ``peer``'s state (a frozen node
    that had pushed its state before it froze is not missed: it misses its neighbours')."""
    return [int(m["round"]) for m in c.metrics(observer)
            if f"node-{peer}" in m["neighbours_missing"]]


def ring_neighbours(i: int, n: int) -> tuple[int, int]:
    return (i - 1) % n, (i + 1) % n


# ---------------------------------------------------------------------------------- stalls


def test_three_stalls_beyond_the_deadline_keep_every_node_and_the_invariant(tmp_path):
    stalls = [(1, 3), (3, 9), (0, 15)]  # (node, after its round): three nodes, three rounds
    with cluster(tmp_path, 5, rounds=24) as c:
        c.start(*range(5))
        for node, after in stalls:
            c.wait_for_round(node, after)
            c.freeze(node, DEADLINE + 1.5)
        assert c.wait() == [0] * 5, c.logs(range(5))
        c.assert_finished(range(5))
        for node, after in stalls:  # each stall outlasted a deadline on one of its edges
            assert any(missed(c, i, j) for nb in ring_neighbours(node, 5)
                       for i, j in ((nb, node), (node, nb))), (node, after)
        residual = c.residual(range(5))
        print(f"residual {residual:.2e}")  # shown with -s: the figure of the run
        assert residual <= TOLERANCE, residual


# ---------------------------------------------------------------------------------- leave


async def test_a_drained_node_leaves_and_its_neighbours_go_on_without_waiting(tmp_path):
    deadline = 3.0
    with cluster(tmp_path, 5, rounds=30, deadline=deadline) as c:
        c.start(*range(5))
        c.wait_for_round(2, 5)
        # what `dacflnode stop --drain` sends (the command: test_cluster.py, test_stop_drain_*),
        # sent from here to land within a round or two, whatever the command's start-up costs
        assert await request_stop(c.control_address(2), drain=True,
                                        auth=c.control_auth(2))
        assert c.wait([2], timeout=30) == [0]
        last = c.done(2)
        assert 5 <= last < c.rounds - 10, last
        stay = [0, 1, 3, 4]
        assert c.wait(stay) == [0] * 4, c.logs(stay)
        c.assert_finished(stay)
        for i in ring_neighbours(2, 5):
            # at most the round right after node-2's last one may wait for it; none after
            slow = [(int(m["round"]), m["exchange_s"]) for m in c.metrics(i)
                    if int(m["round"]) > last + 1 and m["exchange_s"] >= deadline / 2]
            assert slow == [], (f"node-{i}", last, slow)
        residual = c.residual(stay)
        print(f"residual {residual:.2e}")  # shown with -s: the figure of the run
        assert residual <= TOLERANCE, residual


# ---------------------------------------------------------------------------------- join


def test_a_member_started_after_the_others_joins_and_finishes(tmp_path):
    late = 5
    with cluster(tmp_path, 6, rounds=40, hello_timeout=6.0) as c:
        c.prime(late)
        c.start(*range(late))  # they give up waiting for node-5 after hello_timeout
        c.wait_for_round(0, 3)
        c.release(late)
        assert c.wait() == [0] * 6, c.logs(range(6))
        c.assert_finished(range(late))
        joined = [int(m["round"]) for m in c.metrics(late)]
        assert joined and joined[0] > 3 and joined[-1] == c.rounds, joined
        assert joined == list(range(joined[0], c.rounds + 1))
        for i in ring_neighbours(late, 6):  # it took part in the mixing, both ways
            assert any(f"node-{late}" in m["neighbours_used"] for m in c.metrics(i)), i
        assert any(m["neighbours_used"] for m in c.metrics(late))
        residual = c.residual(range(6))
        print(f"residual {residual:.2e}")  # shown with -s: the figure of the run
        assert residual <= TOLERANCE, residual


# ---------------------------------------------------------------------------------- partition
#
# Node i runs in namespace <prefix>-n<i> behind one veth whose other end is a port of a bridge in
# a hub namespace (as in test_netns.py, without shaping). A cut between two sides is a
# blackhole route, in each node of one side, to each node of the other: packets vanish, as on a
# broken link; healing deletes the routes.

PREFIX = f"dacflcut{os.getpid()}"
SUBNET = "10.214.0"


@dataclass
class Lab:
    namespaces: list[str]
    ips: list[str]

    def cut(self, side_a: Sequence[int], side_b: Sequence[int], heal: bool = False) -> None:
        verb = "del" if heal else "add"
        for here, there in ((side_a, side_b), (side_b, side_a)):
            for i in here:
                for j in there:
                    sh("ip", "-n", self.namespaces[i], "route", verb, "blackhole",
                       f"{self.ips[j]}/32")


@pytest.fixture
def lab() -> Iterator[Lab]:
    with hosts(PREFIX, SUBNET, 5) as made:
        yield Lab(made.namespaces, made.ips)


def used_across(c: Cluster, observer: int, peer: int, after: int) -> bool:
    """Whether node ``observer`` mixed node ``peer``'s state in a round after ``after``."""
    return any(f"node-{peer}" in m["neighbours_used"] for m in c.metrics(observer)
               if int(m["round"]) > after)


def test_a_partitioned_ring_runs_on_both_sides_and_merges_when_it_heals(lab: Lab, tmp_path):
    side_a, side_b = [0, 1], [2, 3, 4]  # the ring 0-1-2-3-4-0 loses edges 1-2 and 4-0
    # more data per node, so that the rounds after the heal last the seconds that TCP takes to
    # retransmit into a link that came back (the run stays short enough for float32's residual)
    with cluster(tmp_path, 5, rounds=60, namespaces=lab.namespaces, hosts=lab.ips,
                 synthetic_train=8000) as c:
        c.start(*range(5))
        c.wait_for_round(0, 4)
        lab.cut(side_a, side_b)
        cut_at = max(c.done(i) for i in range(5))
        # both sides go on: past the rounds it takes to declare the other side gone
        beyond = cut_at + 6
        c.wait_for_round(0, beyond)
        c.wait_for_round(3, beyond)
        lab.cut(side_a, side_b, heal=True)
        healed_at = max(c.done(i) for i in range(5))
        assert c.wait() == [0] * 5, c.logs(range(5))
        c.assert_finished(range(5))
        for observer, peer in ((1, 2), (2, 1), (0, 4), (4, 0)):  # the cut edges work again
            assert used_across(c, observer, peer, healed_at), (observer, peer, healed_at)
        residual = c.residual(range(5))
        print(f"residual {residual:.2e}")  # shown with -s: the figure of the run
        assert residual <= TOLERANCE, residual


def test_an_async_ring_partitioned_and_healed_ends_with_the_sum_exact(lab: Lab, tmp_path):
    """``schedule: async`` across the same cut: each side trains and mixes on its own, the
    exchanges over the cut edges wait (asked again with the same id, so an answer lost in the
    cut is applied once), and after the heal they go through again and every node ends with
    ``Σ x = Σ τ``."""
    side_a, side_b = [0, 1], [2, 3, 4]
    with cluster(tmp_path, 5, rounds=30, namespaces=lab.namespaces, hosts=lab.ips,
                 schedule="async", synthetic_train=4000) as c:
        c.start(*range(5))
        c.wait_for_round(0, 3)
        lab.cut(side_a, side_b)
        cut_at = max(c.done(i) for i in range(5))
        c.wait_for_round(0, cut_at + 4)
        c.wait_for_round(3, cut_at + 4)
        def journal(i: int) -> list[str]:
            return (c.state_dir(i) / "exchanges.jsonl").read_text().splitlines()

        before = {i: len(journal(i)) for i in (0, 1)}
        lab.cut(side_a, side_b, heal=True)
        assert c.wait() == [0] * 5, c.logs(range(5))
        c.assert_finished(range(5))
        for observer, peer in ((1, 2), (0, 4)):  # the cut edges exchanged after the heal
            after = journal(observer)[before[observer]:]
            assert any(f'"peer": "node-{peer}"' in line
                       and ('"apply"' in line or '"answer"' in line) for line in after), (
                observer, peer)
        residual = c.residual(range(5))
        print(f"residual {residual:.2e}")
        assert residual <= TOLERANCE, residual
