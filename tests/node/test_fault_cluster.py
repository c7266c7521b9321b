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

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from dacflnode.config import RunConfig
from dacflnode.learning.names import node_ids
from dacflnode.node.cluster import generate_cluster
from dacflnode.node.invariant import compute_invariant, read_snapshot
from dacflnode.node.launcher import free_ports
from dacflnode.node.metrics_log import read_metrics
from dacflnode.node.peers import load_peers
from dacflnode.transport.control_types import ControlAuth
from dacflnode.transport.grpc_control import request_stop
from tests.node.cluster_helpers import control_of
from tests.node.netns_lab import hosts, sh

pytestmark = pytest.mark.timeout(120)

TINY = RunConfig(dataset="synthetic", model="tiny-cnn", lr=0.05, synthetic_train=600,
                 synthetic_test=200, device="cpu", eval_every=5)
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
#: Round deadline of the clusters here: short, so that a fault costs seconds, not minutes.
DEADLINE = 2.0
#: The invariant after faults, relative. float32 rounding alone leaves about 5e-7 after 24
#: rounds of a healthy ring and 2e-6 after 120, so no run here is longer than 60 rounds.
TOLERANCE = 2e-6
#: Longest wait for a cluster to finish, or for a node to reach a round.
WAIT_S = 55.0
COMMAND_TIMEOUT = 20
#: ``dacflnode ARGS`` once a line arrives on stdin, with the daemon's imports done before.
PRIMED = """
import sys
import dacflnode.node.daemon, dacflnode.transport.grpc_control, dacflnode.transport.grpc_transport
from dacflnode.cli.main import main
sys.stdin.readline()
main(sys.argv[1:])
"""


class Cluster:
    """The peers files, processes and state directories of one test's daemons.

    ``run`` replaces fields of the run settings (:data:`TINY`). ``namespaces[i]``, when given,
    is the network namespace node ``i`` runs in (then ``hosts`` are the nodes' addresses there).
    Node ``i`` is ``node-i``, its state is ``root/node-i`` and its stderr
    ``root/node-i.stderr``.
    """

    def __init__(
        self,
        root: Path,
        nodes: int,
        rounds: int,
        *,
        deadline: float = DEADLINE,
        hello_timeout: float = 60.0,
        namespaces: Sequence[str] = (),
        hosts: Sequence[str] = (),
        **run: Any,
    ) -> None:
        self.root = root
        self.ids = node_ids(nodes)
        self.rounds = rounds
        self.deadline = deadline
        self.namespaces = list(namespaces)
        if hosts:  # one address per namespace: the same ports everywhere
            ports, control = [7000] * nodes, [8000] * nodes
            where: dict[str, Any] = {"hosts": list(hosts), "insecure": True}
        else:
            free = free_ports(2 * nodes)
            ports, control, where = free[:nodes], free[nodes:], {}
        cfg = replace(TINY, nodes=nodes, rounds=rounds, **run)
        self.paths = generate_cluster("ring", nodes, cfg, root / "peers", ports=ports,
                                      control_ports=control, state_root=root,
                                      round_deadline=deadline, hello_timeout=hello_timeout,
                                      **where)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    # ------------------------------------------------------------------ processes
    def python(self, i: int) -> list[str]:
        """The Python of node ``i``'s host (in its namespace, if any)."""
        prefix = ["ip", "netns", "exec", self.namespaces[i]] if self.namespaces else []
        return [*prefix, sys.executable]

    def start(self, *nodes: int) -> None:
        """``dacflnode start`` of ``nodes``."""
        self._spawn(nodes, ["-m", "dacflnode"])

    def prime(self, *nodes: int) -> None:
        """Start the processes of ``nodes`` with the daemon's modules loaded but not the daemon
        (:meth:`release` starts it), so that a late start is not seconds of imports late."""
        self._spawn(nodes, ["-c", PRIMED], stdin=subprocess.PIPE)

    def release(self, *nodes: int) -> None:
        for i in nodes:
            stdin = self.procs[i].stdin
            assert stdin is not None, f"node-{i} was not primed"
            stdin.write(b"start\n")
            stdin.close()

    def _spawn(self, nodes: Sequence[int], how: list[str], stdin: int | None = None) -> None:
        for i in nodes:
            with (self.root / f"node-{i}.stderr").open("ab") as err:
                self.procs[i] = subprocess.Popen(
                    [*self.python(i), *how, "start", "--peers", str(self.paths[i])],
                    stdin=stdin, stdout=subprocess.DEVNULL, stderr=err, env=ENV)

    def freeze(self, i: int, seconds: float) -> None:
        """Stop node ``i``'s process (SIGSTOP) for ``seconds``, then let it go on."""
        pid = self.procs[i].pid
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)

    def control_address(self, i: int) -> str:
        return load_peers(self.paths[i]).node.control

    def control_auth(self, i: int) -> ControlAuth:
        """Node ``i``'s control token, from its token file (a new one at every start)."""
        return control_of(self.paths[i])[1]

    def wait(self, nodes: Sequence[int] | None = None, timeout: float = WAIT_S) -> list[int]:
        """The exit codes of ``nodes`` (default: all started); fails, with their logs, if one
        is still running at ``timeout``."""
        nodes = sorted(self.procs) if nodes is None else list(nodes)
        end = time.monotonic() + timeout
        codes = []
        for i in nodes:
            try:
                codes.append(self.procs[i].wait(timeout=max(0.1, end - time.monotonic())))
            except subprocess.TimeoutExpired:
                rounds = {self.ids[j]: self.done(j) for j in nodes}
                pytest.fail(f"node-{i} still runs after {timeout:.0f}s (rounds done: {rounds})"
                            f"\n{self.logs(nodes)}")
        return codes

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a frozen process too
                proc.kill()
                proc.wait(timeout=COMMAND_TIMEOUT)

    # ------------------------------------------------------------------ what the nodes wrote
    def state_dir(self, i: int) -> Path:
        return self.root / f"node-{i}"

    def metrics(self, i: int) -> list[dict[str, Any]]:
        return read_metrics(self.state_dir(i) / "metrics.jsonl")

    def done(self, i: int) -> int:
        """The last round node ``i`` completed (0: none)."""
        lines = self.metrics(i)
        return int(lines[-1]["round"]) if lines else 0

    def wait_for_round(self, i: int, round_: int, timeout: float = WAIT_S) -> None:
        end = time.monotonic() + timeout
        while self.done(i) < round_:
            proc = self.procs.get(i)
            if proc is not None and proc.poll() is not None:
                pytest.fail(f"node-{i} exited {proc.returncode} before round {round_}\n"
                            f"{self.logs([i])}")
            if time.monotonic() > end:
                pytest.fail(f"node-{i} did not reach round {round_} in {timeout:.0f}s\n"
                            f"{self.logs([i])}")
            time.sleep(0.05)

    def residual(self, nodes: Sequence[int]) -> float:
        """``|Σx − Σω_prev| / |Σω_prev|`` over the checkpoints of ``nodes``, as written (the
        corrections a node still holds pending are not applied)."""
        report = compute_invariant([read_snapshot(self.state_dir(i)) for i in nodes])
        return report.raw_residual

    def logs(self, nodes: Sequence[int], chars: int = 2500) -> str:
        parts = []
        for i in nodes:
            err = self.root / f"node-{i}.stderr"
            text = err.read_text(errors="replace")[-chars:] if err.exists() else "(none)"
            parts.append(f"--- node-{i} stderr ---\n{text}")
        return "\n".join(parts)

    def assert_finished(self, nodes: Sequence[int], first: int = 1) -> None:
        """Each of ``nodes`` completed every round from ``first`` to the last, once, in order,
        and wrote its final model."""
        for i in nodes:
            rounds = [int(m["round"]) for m in self.metrics(i)]
            assert rounds == list(range(first, self.rounds + 1)), (
                f"node-{i} completed rounds {rounds}\n{self.logs([i])}")
            assert (self.state_dir(i) / "final.safetensors").exists(), f"node-{i}"


@contextmanager
def cluster(root: Path, nodes: int, rounds: int, **kw: Any) -> Iterator[Cluster]:
    c = Cluster(root, nodes, rounds, **kw)
    try:
        yield c
    finally:
        c.close()


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


def test_a_drained_node_leaves_and_its_neighbours_go_on_without_waiting(tmp_path):
    deadline = 3.0
    with cluster(tmp_path, 5, rounds=30, deadline=deadline) as c:
        c.start(*range(5))
        c.wait_for_round(2, 5)
        # what `dacflnode stop --drain` sends (the command: test_cluster.py, test_stop_drain_*),
        # sent from here to land within a round or two, whatever the command's start-up costs
        assert asyncio.run(request_stop(c.control_address(2), drain=True,
                                        auth=c.control_auth(2)))
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
