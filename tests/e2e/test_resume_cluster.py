"""Reboots on real daemons (docs/faults.md, section 5): a node that stops, is killed or is
terminated, and starts again from its checkpoint, re-enters at the network's round without
costing its neighbours a deadline, and the invariant ``Σ x = Σ ω_prev`` holds over the final
checkpoints of every node to 2e-6 relative.

The clusters are 3-node rings of ``dacflnode start`` on synthetic data
(``tests/harness/cluster.py``, with the short deadline of ``test_fault_cluster.py``); a
restarted daemon is primed (its imports done) before its old process goes, so that the restart
costs what the node's own start-up costs.
"""

from __future__ import annotations

import shutil
import signal
import statistics
import time

import pytest

from dacflnode.protocol.scale_agreement import SCALE_FILE
from dacflnode.records.checkpoint import CHECKPOINT
from dacflnode.transport.grpc_control import fetch_status, request_stop
from tests.e2e.test_fault_cluster import TOLERANCE, cluster
from tests.harness.cluster import WAIT_S, Cluster
from tests.harness.owndata import CLASSES, write_csv_nodes
from tests.harness.polling import until, until_blocking

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


def rounds_of(c: Cluster, i: int) -> dict[int, float]:
    """Node ``i``'s seconds per completed round."""
    return {int(m["round"]): float(m["seconds"]) for m in c.metrics(i)}


#: The package of the round machinery, whose warnings these tests count.
ROUNDS = "dacflnode.protocol."


def node_warnings(c: Cluster, i: int, after: str) -> list[str]:
    """The WARNING lines of the round machinery (not the daemon's setup, data or metrics) in node
    ``i``'s stderr after the first line containing ``after``."""
    text = (c.root / f"node-{i}.stderr").read_text(errors="replace")
    tail = text[text.index(after):] if after in text else ""
    return [line for line in tail.splitlines() if f"WARNING {ROUNDS}" in line]


async def neighbour_state(c: Cluster, observer: int, peer: int) -> str:
    """How ``dacflnode status`` of node ``observer`` shows node ``peer``."""
    status = await fetch_status(c.control_address(observer), auth=c.control_auth(observer))
    return next(nb.state for nb in status.neighbours if nb.node_id == f"node-{peer}")


def restart(c: Cluster, i: int) -> None:
    c.prime(i)
    c.release(i)


def kill_primed(c: Cluster, i: int) -> None:
    """``kill -9`` node ``i``, with its next process primed (:meth:`Cluster.release` starts it)."""
    old = c.procs[i]
    c.prime(i)
    old.kill()
    old.wait()


async def test_a_stopped_node_restarted_costs_its_neighbours_no_deadline(tmp_path):
    deadline = 20.0
    with cluster(tmp_path, 3, rounds=24, deadline=deadline) as c:
        c.start(0, 1, 2)
        c.wait_for_round(2, 6)
        assert await request_stop(c.control_address(2), auth=c.control_auth(2))
        assert c.wait([2], timeout=30) == [0]
        stopped = c.done(2)
        down = time.monotonic()
        # its neighbours, waiting for its state, ask whether it is there: it is not

        async def unreachable() -> bool:
            return await neighbour_state(c, 0, 2) == "unreachable"

        await until(unreachable, 10, interval=0.2, what="node-0 still shows node-2 reachable")
        restart(c, 2)
        c.wait_for_round(2, stopped + 1)
        back = time.monotonic() - down
        assert c.wait() == [0, 0, 0], c.logs([0, 1, 2])
        c.assert_finished([0, 1])
        # node-2 completed every round once: the ones before the stop, then the rest
        assert [int(m["round"]) for m in c.metrics(2)] == list(range(1, c.rounds + 1))
        for i in (0, 1):
            seconds = rounds_of(c, i)
            # a round evaluates every 5 rounds (TINY.eval_every): compare like with like
            plain = [r for r in seconds if r % 5]
            healthy = statistics.median(seconds[r] for r in plain if 2 <= r < stopped)
            while_down = max(seconds[r] for r in (stopped, stopped + 1))
            # the first round after node-2 is back waits for its first training, which in a
            # fresh process pays the framework's warm-up; the rounds after it wait for no
            # deadline (a healthy round is hundredths of a second: the bound is far above
            # what another process's load adds, and far below a deadline)
            after = statistics.median(seconds[r] for r in plain if r > stopped + 2)
            print(f"node-{i}: healthy {healthy:.3f}s, while node-2 was down {while_down:.2f}s "
                  f"(down {back:.1f}s), after {after:.3f}s")
            assert while_down <= deadline, (i, while_down)
            assert after <= deadline / 20, (i, after, healthy)
            assert not any("node-2" in m["neighbours_missing"] for m in c.metrics(i)), i
        assert node_warnings(c, 2, "resuming from round") == []
        residual = c.residual([0, 1, 2])
        print(f"residual {residual:.2e}")
        assert residual <= TOLERANCE, residual


def test_a_killed_node_restarted_rounds_behind_keeps_the_invariant(tmp_path):
    # a deadline the restarted node's rounds stay within on a loaded machine: with 1 s it fell
    # behind again after its join and was still 3 rounds behind when the others ended, which
    # is the straggler at the end of a run (pending corrections no checkpoint settles), not
    # the restart this test is about
    with cluster(tmp_path, 3, rounds=40, deadline=3.0) as c:
        c.start(0, 1, 2)
        c.wait_for_round(2, 5)
        kill_primed(c, 2)  # no checkpoint of the round in flight
        killed = c.done(2)
        c.wait_for_round(0, killed + 2)  # the others go on without it, two rounds or more
        # held while node-2 builds its node: its restart costs seconds on a loaded machine, in
        # which the others would run to the last rounds, and the claim is a restart mid-run
        c.send(signal.SIGSTOP, 0, 1)
        try:
            c.release(2)
            until_blocking(lambda: (c.root / "node-2.stderr").read_text(
                errors="replace").count("serving neighbours on") == 2, WAIT_S,
                what="node-2 serving again")
        finally:
            c.send(signal.SIGCONT, 0, 1)
        assert c.wait() == [0, 0, 0], c.logs([0, 1, 2])
        c.assert_finished([0, 1])
        resumed = [int(m["round"]) for m in c.metrics(2)]
        assert resumed[-1] == c.rounds, resumed
        log = (c.root / "node-2.stderr").read_text(errors="replace")
        how = ("joined" if "joining at round" in log else "rejoined after being declared gone"
               if "declared this node gone" in log else "pulled what it missed")
        residual = c.residual([0, 1, 2])
        print(f"residual {residual:.2e}, killed after round {killed}, {how}")
        assert residual <= TOLERANCE, residual


def test_a_node_terminated_mid_round_and_restarted_keeps_the_invariant(tmp_path):
    with cluster(tmp_path, 3, rounds=24, deadline=2.0) as c:
        c.start(0, 1, 2)
        c.wait_for_round(1, 5)
        c.procs[2].send_signal(signal.SIGTERM)  # whatever the node is doing: pushing, mostly
        assert c.wait([2], timeout=30) == [0]
        restart(c, 2)
        assert c.wait() == [0, 0, 0], c.logs([0, 1, 2])
        c.assert_finished([0, 1])
        residual = c.residual([0, 1, 2])
        print(f"residual {residual:.2e}")
        assert residual <= TOLERANCE, residual


def test_a_stale_checkpoint_is_a_restart_behind_and_the_network_reanchors(tmp_path):
    with cluster(tmp_path, 3, rounds=40, deadline=1.0) as c:
        c.start(0, 1, 2)
        c.wait_for_round(2, 3)
        stale = tmp_path / "stale.safetensors"
        shutil.copyfile(c.state_dir(2) / CHECKPOINT, stale)
        c.wait_for_round(2, 9)
        kill_primed(c, 2)
        shutil.copyfile(stale, c.state_dir(2) / CHECKPOINT)  # an old backup restored
        c.release(2)
        assert c.wait() == [0, 0, 0], c.logs([0, 1, 2])
        c.assert_finished([0, 1])
        log = (c.root / "node-2.stderr").read_text(errors="replace")
        assert "older than what" in log, c.logs([2])
        residual = c.residual([0, 1, 2])
        print(f"residual {residual:.2e}")
        assert residual <= TOLERANCE, residual


def test_a_killed_node_of_a_table_run_restarts_with_the_scale_the_network_agreed(tmp_path):
    train, test = write_csv_nodes(tmp_path / "data")
    with cluster(tmp_path / "run", 3, rounds=30, deadline=3.0, dataset="table", model=None,
                 classes=CLASSES, label_column="kind", data_root=str(train),
                 test_root=str(test)) as c:
        c.start(0, 1, 2)
        c.wait_for_round(2, 4)
        agreed = (c.root / "node-2" / SCALE_FILE).read_text()
        kill_primed(c, 2)
        c.release(2)
        assert c.wait() == [0, 0, 0], c.logs([0, 1, 2])
        c.assert_finished([0, 1])
        log = (c.root / "node-2.stderr").read_text(errors="replace")
        # agreed once with the others, then read back, not agreed again
        assert log.count("(standardize over 4 features, agreed)") == 1, log
        assert log.count("(standardize over 4 features, saved)") == 1, log
        assert {(c.root / f"node-{i}" / SCALE_FILE).read_text() for i in range(3)} == {agreed}
        residual = c.residual([0, 1, 2])
        assert residual <= TOLERANCE, residual
