"""The local launcher's process handling: one failed daemon stops the cluster at once; the
daemons' command line is one the ``start`` command accepts."""

from __future__ import annotations

import asyncio
import importlib
import signal
import sys
import time

from dacflnode.cli.main import COMMANDS
from dacflnode.cluster import launcher
from dacflnode.cluster.launcher import _wait_all_or_first_failure, daemon_argv


async def spawn(code: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(sys.executable, "-c", code)


async def test_a_failed_daemon_stops_the_others_instead_of_leaving_them_waiting():
    async def scenario() -> tuple[list[int], float]:
        procs = [await spawn("import time; time.sleep(60)"),
                 await spawn("import time, sys; time.sleep(0.5); sys.exit(3)")]
        started = time.monotonic()
        codes = await _wait_all_or_first_failure(procs)
        return codes, time.monotonic() - started

    codes, seconds = await scenario()
    assert codes[1] == 3
    assert codes[0] != 0  # terminated, not left running for its minute
    assert seconds < 20


async def test_daemons_that_all_succeed_are_all_waited_for():
    async def scenario() -> list[int]:
        procs = [await spawn("import time; time.sleep(0.3)"), await spawn("pass")]
        return await _wait_all_or_first_failure(procs)

    assert await scenario() == [0, 0]



def test_the_daemon_command_line_is_one_the_start_command_accepts(tmp_path):
    peers, plan = tmp_path / "node-0.yaml", tmp_path / "faults.yaml"
    peers.write_text("{}\n")
    plan.write_text("{}\n")
    argv = daemon_argv(peers, plan)
    assert argv[:3] == [sys.executable, "-m", "dacflnode"]  # dacflnode/__main__.py: the CLI
    module, attribute, _ = COMMANDS[argv[3]]
    command = getattr(importlib.import_module(module), attribute)
    params = command.make_context(argv[3], argv[4:]).params  # refuses an unknown option
    assert (params["peers_file"], params["faults_file"]) == (str(peers), str(plan))
    assert "--faults" not in daemon_argv(peers)


def test_a_ctrl_c_is_noted_and_still_reaches_the_handler_that_was_there():
    """The launcher notes a SIGINT even when its daemons, stopped by the same Ctrl-C, exit 0
    before the event loop cancels the wait for them; the handler in place before (asyncio's,
    which cancels the main task) still runs, and is back in place afterwards."""
    calls: list[int] = []

    def before(signum: int, frame: object) -> None:
        calls.append(signum)

    previous = signal.signal(signal.SIGINT, before)
    try:
        with launcher._noting_interrupts() as received:
            signal.raise_signal(signal.SIGINT)
        assert received == [signal.SIGINT] and calls == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is before
        with launcher._noting_interrupts() as received:
            pass
        assert received == []
    finally:
        signal.signal(signal.SIGINT, previous)
