"""Commands forked from the preloaded fork server behave as the same command in a fresh
interpreter: same exit status, same output in the same file, their own environment and
threads, signals reaching them; the launcher falls back to an interpreter where there is no
fork server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest

from dacflnode.cluster import forked, launcher
from dacflnode.cluster.launcher import free_ports
from dacflnode.peers.generate import generate_cluster
from tests.harness.cluster import ENV, TINY
from tests.harness.polling import until_blocking

pytestmark = pytest.mark.slow


def waiting_node(tmp_path: Path) -> Path:
    """node-0's peers file of a 2-node run whose neighbour never starts: it serves and waits."""
    ports = free_ports(4)
    return generate_cluster("complete", 2, replace(TINY, nodes=2, rounds=1), tmp_path / "peers",
                            ports=ports[:2], control_ports=ports[2:], state_root=tmp_path,
                            hello_timeout=60)[0]


async def test_a_forked_daemon_fails_as_an_interpreters_does_with_the_same_output(
        tmp_path, monkeypatch):
    missing = tmp_path / "missing.yaml"
    outputs, codes = {}, {}
    for way, fork in (("forked", True), ("interpreter", False)):
        monkeypatch.setattr(forked, "available", lambda fork=fork: fork)
        out = tmp_path / f"{way}.out"
        proc = await launcher.start_daemon(missing, None, out, ENV)
        assert isinstance(proc, forked.ForkedCommand) == fork
        codes[way] = await asyncio.wait_for(proc.wait(), 60)
        outputs[way] = out.read_text()
    assert codes == {"forked": 2, "interpreter": 2}
    assert outputs["forked"] == outputs["interpreter"]
    assert f"cannot read {missing}" in outputs["forked"]


def test_a_forked_command_has_its_own_environment_arguments_threads_and_folder(tmp_path):
    out = tmp_path / "out"
    env = {**ENV, "MARK": "mine", "OMP_NUM_THREADS": "2"}
    command = forked.ForkedCommand(["a", "b"], env, stdout=out, module="tests.harness.probe")
    assert command.join(60) == 0
    seen = json.loads(out.read_text())
    assert seen["environ"] == env and seen["argv"][1:] == ["a", "b"]
    assert seen["threads"] == 2 and seen["cwd"] == os.getcwd()
    assert seen["pid"] == command.pid != os.getpid()


def test_sigterm_reaches_a_forked_daemon_which_exits_0_and_sigkill_is_minus_9(tmp_path):
    path = waiting_node(tmp_path)
    log = tmp_path / "node-0" / "daemon.log"
    for sig, expected in ((signal.SIGTERM, 0), (signal.SIGKILL, -signal.SIGKILL)):
        command = forked.ForkedCommand(["start", "--peers", str(path)], ENV,
                                       stdout=tmp_path / "out")
        until_blocking(lambda: log.exists() and "serving neighbours on" in log.read_text(),
                       60, what="the daemon serving")
        command.send_signal(sig)
        assert command.join(60) == expected
        command.send_signal(sig)  # once ended: nothing, not an error
        log.unlink()
