"""``dacflnode ARGS`` for the tests, forked from the fork server that ``launch`` uses
(:mod:`dacflnode.cluster.forked`) instead of a fresh interpreter each.

A fresh interpreter spends about 4 s of CPU importing torch, gRPC and the daemon before a node
does anything; a suite that starts hundreds of daemons and commands on two cores spent most of
its time there. A forked command is a real process of its own (pid, signals, exit status,
environment, output files), started from a process that has only imported modules.

What a fork cannot have is an import-time setting (:data:`IMPORT_TIME`) other than the fork
server's, another interpreter, user or network namespace: :func:`can_fork` says so, and
:func:`run` and :func:`tests.harness.cluster.start_node` then start a fresh interpreter.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dacflnode.cluster import forked
from dacflnode.cluster.preload import FORK_SUPPORT

Output = Path | forked.Inherited | None

#: Environment variables that a process reads while it imports (gRPC, OpenMP, MKL, Python,
#: torch, CUDA, the loader): a fork has the fork server's, whatever its own environment says
#: (``OMP_NUM_THREADS`` aside: the fork applies it).
IMPORT_TIME = ("GRPC_", "OMP_", "MKL_", "PYTHON", "TORCH_", "CUDA_", "LD_", "KMP_")

_lock = threading.Lock()
_server_env: dict[str, str] | None = None
_started: list[ForkedProcess] = []


def _import_time(env: Mapping[str, str]) -> dict[str, str]:
    # `dacflnode start` and the fork server's preload both set FORK_SUPPORT when it is unset;
    # the other commands forked here (status, stop, invariant) are clients that never fork
    found = {k: v for k, v in env.items()
             if k.startswith(IMPORT_TIME) and k != "OMP_NUM_THREADS"}
    return {FORK_SUPPORT[0]: FORK_SUPPORT[1], **found}


def _server() -> dict[str, str]:
    """Start the fork server (once) and return the import-time settings its forks have."""
    global _server_env
    with _lock:
        if _server_env is None:
            multiprocessing.get_context("forkserver").set_forkserver_preload([forked.PRELOAD])
            multiprocessing.forkserver.ensure_running()
            _server_env = _import_time(os.environ)
            # before forked's own clean-up and multiprocessing's join: kill what is left
            multiprocessing.util.Finalize(None, _kill_all, exitpriority=20)
    return _server_env


def can_fork(env: Mapping[str, str]) -> bool:
    """Whether a command with environment ``env`` can be forked: the platform has a fork
    server and ``env``'s import-time settings are the fork server's."""
    return forked.available() and _import_time(env) == _server()


class ForkedProcess:
    """A forked ``dacflnode`` command with the part of :class:`subprocess.Popen` that the
    tests use (``pid``, ``args``, ``returncode``, ``poll``, ``wait``, ``send_signal``,
    ``terminate``, ``kill``): a negative return code is the signal that ended it."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], stdout: Output,
                 stderr: Output, module: str = "dacflnode", **popen: Any) -> None:
        self._command = forked.ForkedCommand(argv, env, stdout=stdout, stderr=stderr,
                                             module=module, **popen)
        self.args, self.pid = self._command.args, self._command.pid

    @property
    def returncode(self) -> int | None:
        return self._command.returncode

    def poll(self) -> int | None:
        return self._command.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self._command.join(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def send_signal(self, sig: int) -> None:
        self._command.send_signal(sig)

    def terminate(self) -> None:
        self._command.terminate()

    def kill(self) -> None:
        self._command.kill()


def fork(argv: Sequence[str], env: Mapping[str, str], *, stdout: Output = None,
         stderr: Output = None, namespace: str | None = None, umask: int | None = None,
         start_new_session: bool = False) -> ForkedProcess:
    """``dacflnode argv`` forked from the fork server, in network namespace ``namespace`` if
    given (:mod:`tests.harness.in_namespace`); ``stdout``/``stderr`` are files appended to or
    inherited descriptors (``None``: discarded); ``umask`` and ``start_new_session`` as for
    :class:`subprocess.Popen`. Check :func:`can_fork` first."""
    _server()
    _started[:] = [p for p in _started if p.poll() is None]
    popen: dict[str, Any] = {"umask": umask, "start_new_session": start_new_session}
    proc = (ForkedProcess(argv, env, stdout, stderr, **popen) if namespace is None else
            ForkedProcess([namespace, *argv], env, stdout, stderr, "tests.harness.in_namespace",
                          **popen))
    _started.append(proc)
    return proc


def start(*args: str, env: Mapping[str, str], stdout: Path, stderr: Path,
          start_new_session: bool = False) -> ForkedProcess | subprocess.Popen[bytes]:
    """``dacflnode ARGS`` started, its output appended to ``stdout`` and ``stderr``: forked
    when :func:`can_fork`, else a fresh interpreter."""
    if can_fork(env):
        return fork(args, env, stdout=stdout, stderr=stderr,
                    start_new_session=start_new_session)
    with stdout.open("ab") as out, stderr.open("ab") as err:
        return subprocess.Popen([sys.executable, "-m", "dacflnode", *args], stdout=out,
                                stderr=err, env=dict(env), start_new_session=start_new_session)


def run(*args: str, env: Mapping[str, str], timeout: float,
        umask: int | None = None) -> subprocess.CompletedProcess[str]:
    """``dacflnode ARGS`` to its end (under ``umask`` if given), as ``subprocess.run(...,
    capture_output=True, text=True)``: forked when :func:`can_fork`, else a fresh interpreter.
    As there, the output is complete when every process that holds it is done (a daemon's
    stderr relay too)."""
    if not can_fork(env):
        return subprocess.run([sys.executable, "-m", "dacflnode", *args], capture_output=True,
                              text=True, timeout=timeout, env=dict(env),
                              umask=-1 if umask is None else umask)
    pipes = [os.pipe(), os.pipe()]
    try:
        proc = fork(args, env, stdout=forked.Inherited(pipes[0][1]),
                    stderr=forked.Inherited(pipes[1][1]), umask=umask)
    finally:
        for _, write in pipes:
            os.close(write)
    with concurrent.futures.ThreadPoolExecutor(2) as readers:
        texts = [readers.submit(_read_to_end, read) for read, _ in pipes]
        try:
            end = time.monotonic() + timeout
            code = proc.wait(timeout)
            out, err = (t.result(timeout=max(0.1, end - time.monotonic())) for t in texts)
        except (subprocess.TimeoutExpired, concurrent.futures.TimeoutError):
            proc.kill()
            raise subprocess.TimeoutExpired(proc.args, timeout) from None
    return subprocess.CompletedProcess(proc.args, code, out, err)


def _read_to_end(fd: int) -> str:
    with open(fd, "rb") as pipe:
        return pipe.read().decode(errors="replace")


def _kill_all() -> None:
    for proc in _started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a stopped one too
            proc.kill()
            proc.wait(10)
