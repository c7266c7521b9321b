"""``dacflnode`` commands in processes forked from one that has imported the daemon once.

A fresh interpreter spends seconds of CPU importing torch and gRPC before a daemon does
anything (about 4 s on a laptop core, several times that on a small board); ``launch`` starting
N of them at once on one machine pays it N times before the first round. multiprocessing's
fork server imports the daemon once (:mod:`dacflnode.cluster.preload`) and forks each command
from itself. A forked command is a process of its own, as a fresh one is: its own pid, signals,
exit status (negative: the signal that ended it), environment, working directory and output
files. Two things come from the fork server instead of the command's environment: what is read
at import time (``GRPC_*``, ``PYTHON*``, the loader's and OpenMP's variables other than the
thread count), and the user and network namespace. ``OMP_NUM_THREADS`` is applied in the fork
(``torch.set_num_threads``), as a fresh process applies it.

Where the platform has no fork server, :func:`available` is false and callers start an
interpreter (``python -m dacflnode``).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.reduction
import multiprocessing.util
import os
import runpy
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

#: The module the fork server imports before it forks anything.
PRELOAD = "dacflnode.cluster.preload"
#: How long a command still running when this process exits has to stop after SIGTERM (a
#: daemon checkpoints and exits) before it is killed.
EXIT_GRACE_S = 30.0
#: Where a forked command's output goes: a file appended to, or (for stderr) its stdout's file.
STDOUT: Final = "stdout"


def available() -> bool:
    """Whether this platform has multiprocessing's fork server (Linux and macOS do)."""
    return "forkserver" in multiprocessing.get_all_start_methods()


class Inherited:
    """A file descriptor of this process that the forked one gets a copy of (sent through the
    fork server): the write end of a pipe, say, whose reader sees its end when every process
    holding it is done, as with ``subprocess.PIPE``."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        # only while the Process is started: the fork server's connection carries the fd
        return _detach, (multiprocessing.reduction.DupFd(self.fd),)


def _detach(duplicate: Any) -> int:
    return int(duplicate.detach())


Output = Path | Inherited | int | None


def _open(target: Output) -> int:
    if isinstance(target, int):  # an Inherited, in the forked process
        return target
    if target is None:
        return os.open(os.devnull, os.O_WRONLY)
    assert isinstance(target, Path)
    return os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def _command(module: str, argv: Sequence[str], env: Mapping[str, str], stdout: Output,
             stderr: Output | Literal["stdout"], umask: int | None, new_session: bool) -> None:
    """The forked process: ``env`` as its environment, its output in the given files, its
    umask and session if given, then ``python -m module argv`` (which exits with the
    command's status)."""
    if new_session:
        os.setsid()
    if umask is not None:
        os.umask(umask)
    os.environ.clear()
    os.environ.update(env)
    out = _open(stdout)
    err = out if isinstance(stderr, str) else _open(stderr)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in {out, err} - {1, 2}:
        os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


class ForkedCommand:
    """``python -m module argv`` (``dacflnode ARGV``) forked from the fork server, with
    environment ``env`` and its output appended to ``stdout`` and ``stderr`` (files; or
    :class:`Inherited` descriptors; ``None``: discarded; :data:`STDOUT`: with stdout).

    ``umask`` and ``start_new_session`` are :class:`subprocess.Popen`'s (by default the fork
    has the umask and session of the fork server, which has this process's of when it
    started). ``returncode`` is ``None`` while it runs; ``join`` waits in this thread,
    ``await wait()`` in the event loop; ``send_signal`` does nothing once it has ended."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], *,
                 stdout: Path | Inherited | None = None,
                 stderr: Path | Inherited | Literal["stdout"] | None = STDOUT,
                 module: str = "dacflnode", umask: int | None = None,
                 start_new_session: bool = False) -> None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([PRELOAD])
        self.args = [module, *argv]
        self._process: Any = context.Process(
            target=_command,
            args=(module, list(argv), dict(env), stdout, stderr, umask, start_new_session),
            name=" ".join(self.args))
        self._process.start()
        pid = self._process.pid
        assert pid is not None
        self.pid: int = pid
        _track(self)

    @property
    def returncode(self) -> int | None:
        code = self._process.exitcode
        return None if code is None else int(code)

    def join(self, timeout: float | None = None) -> int | None:
        """The exit status, once ended; ``None`` if still running after ``timeout`` s."""
        self._process.join(timeout)
        return self.returncode

    async def wait(self) -> int:
        """The exit status, once ended, without blocking the event loop."""
        loop = asyncio.get_running_loop()
        while self.returncode is None:
            ended: asyncio.Future[None] = loop.create_future()

            def readable(done: asyncio.Future[None] = ended) -> None:
                if not done.done():
                    done.set_result(None)

            loop.add_reader(self._process.sentinel, readable)
            try:
                await ended
            finally:
                loop.remove_reader(self._process.sentinel)
        code = self.returncode
        assert code is not None
        return code

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_running: list[ForkedCommand] = []


def _track(command: ForkedCommand) -> None:
    if not _running:  # the first: before multiprocessing joins its children at exit
        multiprocessing.util.Finalize(None, _stop_running, exitpriority=10)
    _running[:] = [c for c in _running if c.returncode is None]
    _running.append(command)


def _stop_running() -> None:
    """At exit, the commands still running are asked to stop (SIGTERM), and killed if they
    have not after :data:`EXIT_GRACE_S`, instead of this process waiting for them forever."""
    for command in _running:
        command.terminate()
    for command in _running:
        if command.join(EXIT_GRACE_S) is None:
            command.kill()
            command.join()
