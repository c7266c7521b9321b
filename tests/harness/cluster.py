"""Real ``dacflnode start`` processes for the tests whose behaviour is the daemon's: a tiny run
configuration, a quiet environment, one cluster of daemons (:class:`Cluster`) with what they
wrote, and the checks several of those tests make.

Ports come from bind(0) (namespaces have their own); every process a cluster starts is killed
when its ``with cluster(...)`` block ends, whatever happens; each node's stderr is kept in a file
whose tail a failing check prints.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from safetensors.torch import load_file

from dacflnode.cluster.launcher import free_ports
from dacflnode.config import RunConfig
from dacflnode.learning.names import node_ids
from dacflnode.peers.control_token import client_token
from dacflnode.peers.file import load_peers
from dacflnode.peers.generate import generate_cluster
from dacflnode.records.invariant import compute_invariant, read_snapshot
from dacflnode.records.metrics_log import read_metrics
from dacflnode.transport.control_types import ControlAuth
from tests.harness import preloaded
from tests.harness.polling import until_blocking

#: A run that takes seconds: synthetic data, the tiny CNN, on the CPU.
TINY = RunConfig(dataset="synthetic", model="tiny-cnn", lr=0.05, synthetic_train=600,
                 synthetic_test=200, device="cpu")
#: One thread per daemon, so that several daemons share the cores fairly.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
#: Round deadline of a cluster unless a test sets one: far above any healthy exchange.
DEADLINE = 30.0
#: Hello timeout of two nodes that refuse each other: the refused one exits at once, the
#: refusing one goes on waiting for its hello this long (the other has exited). Long enough for
#: both to start and greet on a loaded machine.
HELLO_REFUSED = 8.0
#: Longest wait for a cluster to finish, or for a node to reach a round.
WAIT_S = 55.0
#: Longest wait for one short command (``ip``, ``kill``, a process to die once killed).
COMMAND_TIMEOUT = 20
#: ``dacflnode ARGS`` once a line arrives on stdin, with the daemon's imports done before.
PRIMED = """
import sys
import dacflnode.daemon.service, dacflnode.transport.grpc_control
import dacflnode.transport.grpc_transport
from dacflnode.cli.main import main
sys.stdin.readline()
main(sys.argv[1:])
"""


#: A daemon's process: forked from the preloaded fork server, or a fresh interpreter.
Process = subprocess.Popen[bytes] | preloaded.ForkedProcess


def start_node(path: Path, *args: str, stderr: Path | None = None, namespace: str | None = None,
               how: Sequence[str] = ("-m", "dacflnode"), stdin: int | None = None,
               env: dict[str, str] | None = None, umask: int | None = None) -> Process:
    """``dacflnode start --peers path ARGS`` in a process of its own (in network namespace
    ``namespace`` and under ``umask``, if given), its stderr appended to ``stderr`` (``None``:
    discarded). Forked
    from the preloaded fork server (:mod:`tests.harness.preloaded`) when it can be: ``-m
    dacflnode``, no stdin and the fork server's import-time settings; else a fresh interpreter
    (through ``ip netns exec`` for a namespace) running ``how``."""
    env = ENV if env is None else env
    argv = ["start", "--peers", str(path), *args]
    if (tuple(how), stdin) == (("-m", "dacflnode"), None) and preloaded.can_fork(env):
        return preloaded.fork(argv, env, stderr=stderr, namespace=namespace, umask=umask)
    prefix = ["ip", "netns", "exec", namespace] if namespace is not None else []
    with contextlib.ExitStack() as files:
        err = files.enter_context(stderr.open("ab")) if stderr is not None else subprocess.DEVNULL
        return subprocess.Popen([*prefix, sys.executable, *how, *argv], stdin=stdin,
                                stdout=subprocess.DEVNULL, stderr=err, env=env,
                                umask=-1 if umask is None else umask)


def run_nodes(paths: Sequence[Path], root: Path, timeout: float,
              args: Sequence[Sequence[str]] = ()) -> tuple[list[int], list[str]]:
    """``dacflnode start`` of every peers file in ``paths`` (node ``i`` with ``args[i]``), to
    their end: their exit codes and stderr texts (kept in ``root/<peers file>.stderr``).
    Fails, with their stderr, when one still runs at ``timeout``."""
    errs = [root / f"{p.stem}.stderr" for p in paths]
    extra = list(args) or [()] * len(paths)
    procs = [start_node(p, *a, stderr=e) for p, a, e in zip(paths, extra, errs, strict=True)]
    end = time.monotonic() + timeout
    try:
        codes = [p.wait(timeout=max(0.1, end - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        pytest.fail(f"a node still runs after {timeout:.0f}s\n"
                    + "\n".join(e.read_text(errors="replace")[-2000:] for e in errs))
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return codes, [e.read_text(errors="replace") for e in errs]


def set_node(path: Path, **node: object) -> None:
    """Set keys of the ``node:`` section of peers file ``path`` (as an operator edits it)."""
    data = yaml.safe_load(path.read_text())
    data["node"].update(node)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def control_of(path: Path) -> tuple[str, ControlAuth]:
    """The control address of the node of peers file ``path`` and its token (read now: a node
    draws a new one at every start), as ``dacflnode status --peers`` finds them."""
    node = load_peers(path).node
    return node.control, ControlAuth(token=client_token(node))


def max_diff(a: Path, b: Path) -> float:
    """The largest absolute difference between two safetensors files with the same keys."""
    ta, tb = load_file(str(a)), load_file(str(b))
    assert ta.keys() == tb.keys()
    return max(float((ta[k].double() - tb[k].double()).abs().max()) for k in ta)


#: What a failed start must never print.
NOISE = ("Traceback", "never awaited", "Event loop is closed", "add_port.cc")


def assert_one_line_failure(run: subprocess.CompletedProcess[str], path: Path,
                            *said: str) -> None:
    """``run`` (``dacflnode start --peers path``) failed with exit 2 and one ERROR line that
    holds every ``said``, also written to the node's daemon.log, and nothing of :data:`NOISE`."""
    assert run.returncode == 2, run.stderr
    assert not any(n in run.stderr for n in NOISE), run.stderr
    errors = [line for line in run.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, run.stderr
    assert all(s in errors[0] for s in said), errors[0]
    log = (load_peers(path).node.state_dir / "daemon.log").read_text()
    assert errors[0].split(" ERROR ", 1)[1] in log


class Cluster:
    """The peers files, processes and state directories of one test's daemons.

    ``run`` replaces fields of the run settings (:data:`TINY`); the graph is a ring from three
    nodes on, complete below. ``metrics`` gives every node a ``/metrics`` address
    (:attr:`metrics_addresses`). ``args`` are added to every ``dacflnode start``;
    ``daemon_settings`` go into every peers file's ``daemon:`` section.
    ``namespaces[i]``, when given, is the network namespace node ``i`` runs in (then ``hosts``
    are the nodes' addresses there). Node ``i`` is ``node-i``, its state is ``root/node-i`` and
    its stderr ``root/node-i.stderr``.
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
        metrics: bool = False,
        args: Sequence[str] = (),
        daemon_settings: dict[str, Any] | None = None,
        **run: Any,
    ) -> None:
        self.root = root
        self.ids = node_ids(nodes)
        self.rounds = rounds
        self.deadline = deadline
        self.namespaces = list(namespaces)
        self.args = list(args)
        where: dict[str, Any] = {}
        if hosts:  # one address per namespace: the same ports everywhere
            ports, control = [7000] * nodes, [8000] * nodes
            where = {"hosts": list(hosts), "insecure": True}
        else:
            free = free_ports(3 * nodes if metrics else 2 * nodes)
            ports, control = free[:nodes], free[nodes:2 * nodes]
            if metrics:
                where = {"metrics_ports": free[2 * nodes:]}
        cfg = replace(TINY, nodes=nodes, rounds=rounds, **run)
        self.paths = generate_cluster("ring" if nodes >= 3 else "complete", nodes, cfg,
                                      root / "peers", ports=ports, control_ports=control,
                                      state_root=root, round_deadline=deadline,
                                      hello_timeout=hello_timeout,
                                      daemon_settings=daemon_settings or {}, **where)
        self.metrics_addresses = [f"127.0.0.1:{p}" for p in where.get("metrics_ports", [])]
        self.procs: dict[int, Process] = {}
        self.primed: set[int] = set()

    # ------------------------------------------------------------------ processes
    def start(self, *nodes: int) -> Cluster:
        """``dacflnode start`` of ``nodes`` (default: all)."""
        self._spawn(nodes or range(len(self.ids)), ["-m", "dacflnode"])
        return self

    def prime(self, *nodes: int) -> None:
        """Make ready to start ``nodes`` with the daemon's modules loaded (:meth:`release`
        starts them), so that a late start is not seconds of imports late: a fork of the
        preloaded server, or else an interpreter that imports them and waits on its stdin."""
        if preloaded.can_fork(ENV):
            self.primed.update(nodes)  # a fork starts at once
            return
        self._spawn(nodes, ["-c", PRIMED], stdin=subprocess.PIPE)

    def release(self, *nodes: int) -> None:
        for i in nodes:
            if i in self.primed:
                self.primed.discard(i)
                self._spawn([i], ["-m", "dacflnode"])
                continue
            proc = self.procs[i]
            assert isinstance(proc, subprocess.Popen) and proc.stdin is not None, \
                f"node-{i} was not primed"
            proc.stdin.write(b"start\n")
            proc.stdin.close()

    def _spawn(self, nodes: Sequence[int], how: list[str], stdin: int | None = None) -> None:
        for i in nodes:
            self.procs[i] = start_node(
                self.paths[i], *self.args, stderr=self.root / f"node-{i}.stderr",
                namespace=self.namespaces[i] if self.namespaces else None, how=how, stdin=stdin)

    def freeze(self, i: int, seconds: float) -> None:
        """Stop node ``i``'s process (SIGSTOP) for ``seconds``, then let it go on."""
        pid = self.procs[i].pid
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)  # the fault itself: a process that does nothing this long
        finally:
            os.kill(pid, signal.SIGCONT)

    def kill(self, i: int) -> None:
        """``kill -9`` of node ``i`` (a crash: no checkpoint of the round in flight)."""
        self.procs[i].kill()
        self.procs[i].wait(timeout=COMMAND_TIMEOUT)

    def send(self, sig: int, *nodes: int) -> None:
        """Send ``sig`` to the running processes of ``nodes`` (default: all started)."""
        for i in nodes or sorted(self.procs):
            if self.procs[i].poll() is None:
                self.procs[i].send_signal(sig)

    def control_address(self, i: int) -> str:
        return load_peers(self.paths[i]).node.control

    def control_auth(self, i: int) -> ControlAuth:
        """Node ``i``'s control token, from its token file (a new one at every start)."""
        return control_of(self.paths[i])[1]

    def set_node(self, **node: object) -> None:
        """Set keys of every peers file's ``node:`` section (before :meth:`start`)."""
        for path in self.paths:
            set_node(path, **node)

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
                            f"\n{self.logs(nodes)}\n{self.task_dumps(nodes)}")
        return codes

    def task_dumps(self, nodes: Sequence[int]) -> str:
        """Where each of ``nodes`` still running waits: its tasks' stacks, which SIGUSR1 has
        the daemon write to its stderr (docs/operations.md, "A node that seems stuck")."""
        running = [i for i in nodes if self.procs[i].poll() is None]
        sizes = {i: (self.root / f"node-{i}.stderr").stat().st_size for i in running}
        for i in running:
            self.procs[i].send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        parts = []
        for i in running:
            with (self.root / f"node-{i}.stderr").open("rb") as err:
                err.seek(sizes[i])
                parts.append(f"--- node-{i} tasks ---\n{err.read().decode(errors='replace')}")
        return "\n".join(parts)

    def stop(self, sig: int = signal.SIGINT, timeout: float = 60) -> list[int]:
        """Ask every node to stop (``sig``), then kill what is still running; the exit codes
        (a killed node's is negative)."""
        self.send(sig)
        codes = []
        for i in sorted(self.procs):
            try:
                codes.append(self.procs[i].wait(timeout=timeout))
            except subprocess.TimeoutExpired:
                self.procs[i].kill()
                codes.append(self.procs[i].wait(timeout=COMMAND_TIMEOUT))
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
        """The lines of node ``i``'s metrics.jsonl, one per round it completed."""
        return read_metrics(self.state_dir(i) / "metrics.jsonl")

    def done(self, i: int) -> int:
        """The last round node ``i`` completed (0: none)."""
        lines = self.metrics(i)
        return int(lines[-1]["round"]) if lines else 0

    def wait_for_round(self, i: int, round_: int, timeout: float = WAIT_S) -> None:
        """Until node ``i`` completed round ``round_``; fails, with its log, if it exits before
        or the time is up."""

        def reached() -> bool:
            proc = self.procs.get(i)
            if proc is not None and proc.poll() is not None and self.done(i) < round_:
                pytest.fail(f"node-{i} exited {proc.returncode} before round {round_}\n"
                            f"{self.logs([i])}")
            return self.done(i) >= round_

        until_blocking(reached, timeout, interval=0.05,
                       what=lambda: f"node-{i} did not reach round {round_}\n{self.logs([i])}")

    def wait_for_rounds(self, round_: int, timeout: float = WAIT_S) -> None:
        """Until every node completed round ``round_``."""
        for i in range(len(self.ids)):
            self.wait_for_round(i, round_, timeout)

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
    """A :class:`Cluster` whose processes are killed when the block ends."""
    c = Cluster(root, nodes, rounds, **kw)
    try:
        yield c
    finally:
        c.close()
