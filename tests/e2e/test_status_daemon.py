"""``dacflnode status`` at the edges of a run, on real processes: a watched node that finishes
is shown as done, a stopped neighbour is not ``active``, the errors of ``--json`` are JSON. The
view's layout on its own: tests/daemon/test_status_edges.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from dacflnode.cluster.launcher import free_ports
from dacflnode.peers.generate import generate_cluster
from dacflnode.transport.grpc_control import fetch_status
from tests.harness import preloaded
from tests.harness.cluster import ENV, TINY, Process, control_of, start_node
from tests.harness.polling import until_blocking

pytestmark = pytest.mark.slow


def pair(tmp_path: Path, rounds: int, round_deadline: float = 30,
         **daemon: float) -> list[Path]:
    ports = free_ports(4)
    return generate_cluster("complete", 2, replace(TINY, nodes=2, rounds=rounds),
                            tmp_path / "peers", ports=ports[:2], control_ports=ports[2:],
                            state_root=tmp_path, hello_timeout=60,
                            round_deadline=round_deadline, daemon_settings=daemon)


def start(path: Path) -> Process:
    return start_node(path)


def wait_for_log(path: Path, text: str, timeout: float = 90) -> None:
    until_blocking(lambda: path.exists() and text in path.read_text(), timeout,
                   what=f"{text!r} in {path}")


def test_watch_ends_with_done_and_exit_0_when_the_node_finishes(tmp_path):
    paths = pair(tmp_path, rounds=2)
    first = start(paths[0])  # waits for node-1's Hello: the watch sees it running
    watch = None
    try:
        wait_for_log(tmp_path / "node-0" / "daemon.log", "control service on")
        watch = subprocess.Popen(
            [sys.executable, "-m", "dacflnode", "status", "--peers", str(paths[0]), "--watch",
             "--interval", "0.2", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=ENV, text=True)
        assert watch.stdout is not None
        seen = json.loads(watch.stdout.readline())  # one status seen while it runs
        assert seen["node_id"] == "node-0" and seen["round"] < 2
        second = start(paths[1])
        assert [first.wait(timeout=120), second.wait(timeout=120)] == [0, 0]
        out, err = watch.communicate(timeout=60)
    finally:
        for p in (first, watch):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert watch.returncode == 0, err
    assert "no dacflnode daemon answers" not in err and "error" not in err
    last = json.loads(out.splitlines()[-1])
    assert last == {"node_id": "node-0", "state": "done", "round": last["round"],
                    "rounds_total": 2, "phase": last["phase"]}


def test_a_stopped_neighbour_is_unreachable_not_active(tmp_path):
    # a long deadline: node-0 waits for node-1's state all along, and never misses a round
    paths = pair(tmp_path, rounds=100_000, round_deadline=120, gone_after=1000)
    procs = [start(p) for p in paths]
    try:
        for node in ("node-0", "node-1"):
            wait_for_log(tmp_path / node / "metrics.jsonl", '"round": 1')
        stop = preloaded.run("stop", "--peers", str(paths[1]), env=ENV, timeout=60)
        assert stop.returncode == 0, stop.stderr
        assert procs[1].wait(timeout=60) == 0
        addr, auth = control_of(paths[0])

        def unreachable() -> bool:
            (nb,) = asyncio.run(fetch_status(addr, auth=auth)).neighbours
            assert nb.state in ("active", "unreachable"), nb
            return nb.state == "unreachable"

        # far less than the round deadline
        until_blocking(unreachable, 30, interval=0.2, what="node-1 shown unreachable")
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_status_json_without_a_daemon_prints_a_json_error_and_exits_1():
    port = free_ports(1)[0]
    proc = subprocess.run([sys.executable, "-m", "dacflnode", "status", "--json", "--target",
                           f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    assert data["target"] == f"127.0.0.1:{port}"
    assert data["error"].startswith(f"no dacflnode daemon answers at 127.0.0.1:{port}: ")
    assert data["error"].endswith("(is it running? pass --target HOST:PORT or --peers FILE)")
    assert proc.stderr == f"error: {data['error']}\n"  # one line, said once
