"""``dacflnode status`` at the edges of a run: a watched node that finishes is shown as done, a
stopped neighbour is not ``active``, errors of ``--json`` are JSON, nothing is cut at 80
columns."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from dacflnode.cli.daemon_cmds import _status_view
from dacflnode.cluster.launcher import free_ports
from dacflnode.peers.generate import generate_cluster
from dacflnode.transport.grpc_control import fetch_status
from tests.harness.cluster import ENV, TINY, control_of

pytestmark = pytest.mark.slow


def pair(tmp_path: Path, rounds: int, round_deadline: float = 30,
         **daemon: float) -> list[Path]:
    ports = free_ports(4)
    return generate_cluster("complete", 2, replace(TINY, nodes=2, rounds=rounds),
                            tmp_path / "peers", ports=ports[:2], control_ports=ports[2:],
                            state_root=tmp_path, hello_timeout=60,
                            round_deadline=round_deadline, daemon_settings=daemon)


def start(path: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "dacflnode", "start", "--peers", str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)


def wait_for_log(path: Path, text: str, timeout: float = 90) -> None:
    end = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text()):
        assert time.monotonic() < end, f"{text!r} not in {path}"
        time.sleep(0.1)


def test_watch_ends_with_done_and_exit_0_when_the_node_finishes(tmp_path):
    paths = pair(tmp_path, rounds=5)
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
        assert seen["node_id"] == "node-0" and seen["round"] < 5
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
                    "rounds_total": 5, "phase": last["phase"]}


def test_a_stopped_neighbour_is_unreachable_not_active(tmp_path):
    # a long deadline: node-0 waits for node-1's state all along, and never misses a round
    paths = pair(tmp_path, rounds=100_000, round_deadline=120, gone_after=1000)
    procs = [start(p) for p in paths]
    try:
        for node in ("node-0", "node-1"):
            wait_for_log(tmp_path / node / "metrics.jsonl", '"round": 2')
        stop = subprocess.run([sys.executable, "-m", "dacflnode", "stop", "--peers",
                               str(paths[1])], capture_output=True, timeout=60, env=ENV)
        assert stop.returncode == 0, stop.stderr
        assert procs[1].wait(timeout=60) == 0
        addr, auth = control_of(paths[0])
        end = time.monotonic() + 30  # far less than the round deadline
        while True:
            (nb,) = asyncio.run(fetch_status(addr, auth=auth)).neighbours
            if nb.state == "unreachable":
                break
            assert nb.state == "active" and time.monotonic() < end, nb
            time.sleep(0.2)
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


LONG = "node-1.dacflnode-peers.federated-learning.svc.cluster.local:7000"


def status_data() -> dict[str, object]:
    nb = {"node_id": "node-1-with-a-long-name", "address": LONG, "connected": True,
          "state": "active", "last_round_received": 3, "bytes_received": 12_000_000,
          "bytes_sent": 12_000_000, "latency_ms": 3.5, "missed_rounds": 2, "late_states": 1,
          "refused": 0, "corrections": 1, "refused_states": 0}
    return {"node_id": "node-0", "algorithm": "dacfl", "round": 3, "rounds_total": 20,
            "phase": "training", "neighbours": [nb], "last_accuracy": 0.5, "last_loss": 1.0,
            "consensus_residual": 0.1, "device": "cpu", "uptime_s": 10.0}


def test_addresses_ids_and_titles_are_never_cut_on_an_80_column_terminal():
    out = io.StringIO()
    Console(file=out, width=80).print(_status_view(status_data()))
    text = out.getvalue()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    # each cell folded onto several lines, whole: read the first table's columns back
    neighbours = text.split("faults per neighbour")[0]
    first = [line.split("│") for line in neighbours.splitlines() if line.startswith("│")]
    assert "".join(cells[1].strip() for cells in first) == "node-1-with-a-long-name"
    assert "".join(cells[2].strip() for cells in first) == LONG


def test_piped_status_is_as_wide_as_its_content(monkeypatch):
    from dacflnode.cli import daemon_cmds

    out = io.StringIO()
    console = daemon_cmds._status_console()
    console.file = out
    console.print(_status_view(status_data()))
    lines = out.getvalue().splitlines()
    assert any(LONG in line and "last round" not in line for line in lines)
    header = next(line for line in lines if "address" in line and "latency" in line)
    assert "last round" in header  # the titles on one line each
