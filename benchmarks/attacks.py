"""Resource attacks on a live daemon, rerun: stalled streams, idle connections, huge Hellos.

A real daemon (``dacflnode start`` in a child process, on 127.0.0.1, ports from ``bind(0)``) runs
node ``node-0`` of a 2-node synthetic run whose neighbour ``node-1`` never comes (``hello_timeout``
10 minutes), so it serves its Neighbor port and waits, as a node does while a cluster assembles.
Its model is :class:`Wide` (``--state-mib`` MiB per tensor; DACFL exchanges two tensors, ``x``
and ``omega``), so a stalled push that the daemon buffers costs a visible amount of memory. An
outside client built only from the generated ``dacfl.v1`` stubs then runs, one after another:

* **stalled**: ``--streams`` PushState streams, spread over ``--channels`` connections, each
  sending a valid header (sender ``node-1``, a round of the accepted window, the right tensors,
  a correct XXH3-128 of the payload) and the payload minus one byte, then nothing. Reported:
  the daemon's RSS growth (``VmRSS`` after the streams are written, and ``VmHWM``, minus
  ``VmRSS`` before) and how each stream ended: its status code and when.
* **connections**: ``--connections`` TCP connections that each send the HTTP/2 preface and an
  empty SETTINGS frame, then stay idle, with the daemon started under ``ulimit -n
  --fd-limit``. Reported: how many the daemon kept open (the rest it closed), its open
  descriptors (``/proc/PID/fd``), whether ``dacflnode status`` still answers while they are
  held, and the growth of ``daemon.log``.
* **hellos**: ``--hellos`` Hello calls with a ``--id-kib`` KiB ``node_id`` (plus one with a
  newline in it). Reported: ``daemon.log`` bytes before and after, and its longest line.
* **duplicates**: one, then two push streams in node-1's name that send a valid header and
  then nothing, then node-1's real push of the same round (retried while refused
  ``IN_PROGRESS``), against a daemon with the default deadlines. Reported: how long the real
  push took (at once beside one stalled stream; at most ``first_message_timeout`` beside two).
* **slots**: a live 3-node ring (``dacflnode start`` per node, tiny CNN, synthetic data,
  plaintext on 127.0.0.1) runs ``--slot-rounds`` rounds untouched, then again with
  ``--slot-streams`` PushState streams that never send a message kept open against node-0
  (each reopened as soon as the node cuts it). Reported: rounds per minute of each (node-0's
  rounds, start-up excluded), the longest round and exchange, neighbours missed, how the
  streams ended, and the load average; the ``attacked / untouched`` ratio (target ≥ 0.9).

Each figure comes with the 1-minute load average at the time. The stream deadlines are the
daemon's defaults (:data:`dacflnode.transport.receiver.IDLE_TIMEOUT`, ``STREAM_TIMEOUT``);
``--idle-timeout`` shortens them in the daemon process (the daemon has no setting for them),
as ``--quick`` does. All loops are bounded in count and time, and everything stays on loopback.

The result's ``ratio`` is the daemon's peak RSS growth under the stalled streams against the
bytes those streams pushed (``streams`` × state): a receiver without limits holds all of them
(ratio 1; before the limits, 40 streams of 8 MiB held 320 MiB). Target ≤ 0.25. The growth is
bounded (one state per neighbour and accepted round, plus transient buffers), so the ratio falls
as ``--streams`` grows; ``states_held_at_peak`` gives the same growth in states.

Usage: ``python benchmarks/attacks.py [--quick] [--json] [--scenarios slots,...]``;
``--quick``: 60 streams, 400 connections, 200 Hellos, a 2 s idle deadline, 4 ring rounds.
The CI versions of these attacks, with assertions, are in ``tests/e2e/test_attacks.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import torch
import xxhash
import yaml
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb  # noqa: E402
from dacflnode._proto.dacfl.v1 import neighbor_pb2_grpc  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import add_standard_args, emit_result  # noqa: E402

#: The HTTP/2 client preface followed by an empty SETTINGS frame: what a gRPC client sends first.
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")
CHUNK = 1 << 20
#: The scenarios, in the order they run.
SCENARIOS = ("metrics", "stalled", "hellos", "connections", "duplicates", "slots")


class Wide(nn.Module):
    """A linear classifier carrying ``ATTACK_STATE_MIB`` MiB of extra parameters (environment
    variable; default 8), so that one buffered state is large enough to see in the RSS."""

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int) -> None:
        super().__init__()
        c, h, w = input_shape
        self.fc = nn.Linear(c * h * w, num_classes)
        mib = float(os.environ.get("ATTACK_STATE_MIB", "8"))
        self.bulk = nn.Parameter(torch.zeros(max(1, int(mib * (1 << 20)) // 4)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(x.flatten(1)) + 0.0 * self.bulk[:1]
        return out


def load_1m() -> float:
    return round(os.getloadavg()[0], 2)


def proc_status(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of ``pid`` in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def open_files_limit(pid: int) -> tuple[int, int]:
    """Soft and hard ``RLIMIT_NOFILE`` of ``pid`` (from ``/proc/PID/limits``)."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise LookupError("no open-files limit")


@dataclass
class Target:
    """A daemon under attack: node-0 of a 2-node run whose node-1 never starts."""

    workdir: Path
    state_mib: float = 8.0
    fd_limit: int | None = None
    soft_fd_limit: int | None = None  # below fd_limit: the daemon should raise it at start
    idle_timeout: float | None = None
    stream_timeout: float | None = None
    #: serve /metrics on 127.0.0.1 (node.metrics), at :attr:`metrics`
    metrics_port: bool = False
    #: start node-1 too, so that the rounds progress (``rounds`` of them, ``round_deadline``)
    both: bool = False
    rounds: int = 5
    round_deadline: float = 600.0
    eval_every: int | None = None
    first_message_timeout: float | None = None
    proc: subprocess.Popen[bytes] | None = None
    neighbour: subprocess.Popen[bytes] | None = None
    listen: str = ""
    control: str = ""
    metrics: str = ""
    peers: Path | None = None
    tensors: dict[str, int] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def log_path(self) -> Path:
        return self.workdir / "node-0" / "daemon.log"

    def start(self, timeout: float = 120.0) -> None:
        from dacflnode.cluster.launcher import free_ports
        from dacflnode.config import RunConfig
        from dacflnode.learning.layout import StateLayout
        from dacflnode.peers.generate import generate_cluster

        run = RunConfig(dataset="synthetic", model="attacks:Wide", nodes=2, rounds=self.rounds,
                        synthetic_train=200, synthetic_test=50, device="cpu",
                        **({} if self.eval_every is None else {"eval_every": self.eval_every}))
        ports = free_ports(6)
        paths = generate_cluster("complete", 2, run, self.workdir / "peers", ports=ports[:2],
                                 control_ports=ports[2:4],
                                 metrics_ports=ports[4:] if self.metrics_port else None,
                                 state_root=self.workdir, hello_timeout=600,
                                 round_deadline=self.round_deadline)
        self.listen, self.control = f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[2]}"
        self.metrics = f"127.0.0.1:{ports[4]}" if self.metrics_port else ""
        self.peers = paths[0]
        os.environ["ATTACK_STATE_MIB"] = str(self.state_mib)
        numel = StateLayout.from_module(Wide((1, 8, 8), 10)).numel
        self.tensors = {"omega": numel, "x": numel}
        env = {**os.environ, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent), str(ROOT)])}
        peers = yaml.safe_load(paths[0].read_text())
        if self.idle_timeout is not None:
            peers["run"]["stream_idle_timeout"] = self.idle_timeout
        if self.stream_timeout is not None:
            peers["run"]["stream_timeout"] = self.stream_timeout
        if self.first_message_timeout is not None:
            peers["run"]["first_message_timeout"] = self.first_message_timeout
        paths[0].write_text(yaml.safe_dump(peers, sort_keys=False))
        cmd = [sys.executable, "-m", "dacflnode", "start", "--peers", str(paths[0])]
        if self.fd_limit is not None:  # exec keeps the pid: /proc/PID is the daemon's
            limits = f"ulimit -n {self.fd_limit}"
            if self.soft_fd_limit is not None:
                limits += f" && ulimit -S -n {self.soft_fd_limit}"
            cmd = ["bash", "-c", f"{limits} && exec \"$@\"", "bash", *cmd]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        if self.both:
            self.neighbour = subprocess.Popen(
                [sys.executable, "-m", "dacflnode", "start", "--peers", str(paths[1])], env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.monotonic() + timeout
        while not asyncio.run(self._serving()):
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}; "
                                   f"see {self.log_path}")
            if time.monotonic() > end:
                raise TimeoutError("daemon did not serve its Neighbor port")
            time.sleep(0.3)

    async def _serving(self) -> bool:
        async with grpc.aio.insecure_channel(self.listen) as ch:
            stub = neighbor_pb2_grpc.NeighborStub(ch)
            try:
                await stub.PullState(pb.PullRequest(requester="probe", round=0)).read()
            except grpc.aio.AioRpcError as exc:
                return exc.code() != grpc.StatusCode.UNAVAILABLE
            return True

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def status_answers(self) -> bool:
        """Whether ``dacflnode status --peers PEERS --json`` (its control address and token)
        answers with this node."""
        cli = subprocess.run([sys.executable, "-m", "dacflnode", "status", "--peers",
                              str(self.peers), "--json"], capture_output=True, text=True,
                             timeout=60, cwd=ROOT, check=False)
        return cli.returncode == 0 and json.loads(cli.stdout).get("node_id") == "node-0"

    def rounds_done(self) -> list[dict[str, Any]]:
        """node-0's ``metrics.jsonl`` lines so far (one per finished round)."""
        from dacflnode.records.metrics_log import read_metrics

        path = self.workdir / "node-0" / "metrics.jsonl"
        return read_metrics(path) if path.exists() else []

    def stop(self) -> int | None:
        if self.neighbour is not None and self.neighbour.poll() is None:
            self.neighbour.send_signal(signal.SIGTERM)
            try:
                self.neighbour.wait(30)
            except subprocess.TimeoutExpired:
                self.neighbour.kill()
                self.neighbour.wait()
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


# ---------------------------------------------------------------------------- stalled streams
async def stalled_streams(target: Target, streams: int, channels: int,
                          wait: float) -> dict[str, Any]:
    """``streams`` pushes that stop one byte short; wait up to ``wait`` s for them to be cut."""
    names = sorted(target.tensors)
    total = 4 * sum(target.tensors.values())
    zeros = bytes(CHUNK)
    release = asyncio.Event()
    written = 0

    def header(round_: int) -> pb.StateChunk:
        return pb.StateChunk(header=pb.StateHeader(
            sender="node-1", round=round_, degree=1, payload_bytes=total,
            tensors=[pb.TensorSpec(name=n, dtype="float32", shape=[target.tensors[n]])
                     for n in names]))

    async def chunks(round_: int) -> Any:
        nonlocal written
        yield header(round_)
        left = total - 1
        while left > 0:
            n = min(CHUNK, left)
            yield pb.StateChunk(data=zeros[:n])
            left -= n
        written += 1
        await release.wait()  # stall: the stream never ends on its own

    chans = [grpc.aio.insecure_channel(target.listen, options=[
        ("grpc.use_local_subchannel_pool", 1), ("grpc.max_send_message_length", 8 << 20)])
        for _ in range(channels)]
    before = proc_status(target.pid)["VmRSS"]
    Path(f"/proc/{target.pid}/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    start = time.monotonic()
    ended: list[tuple[str, float]] = []

    async def one(i: int) -> None:
        stub = neighbor_pb2_grpc.NeighborStub(chans[i % channels])
        try:
            await stub.PushState(chunks(i % 3), timeout=wait + 30)
            ended.append(("OK", time.monotonic() - start))
        except grpc.aio.AioRpcError as exc:
            reason = dict(exc.trailing_metadata() or ()).get("dacfl-reason", "")
            ended.append((f"{exc.code().name}/{reason}", time.monotonic() - start))

    tasks = [asyncio.create_task(one(i)) for i in range(streams)]
    settle = time.monotonic() + min(wait, 20.0)
    while time.monotonic() < settle and written + len(ended) < streams:
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)
    mem = proc_status(target.pid)
    held = streams - len(ended)
    load_held = load_1m()
    _, pending = await asyncio.wait(tasks, timeout=max(0.0, wait - (time.monotonic() - start)))
    release.set()  # the ones still open: let them go
    for t in pending:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for ch in chans:
        await ch.close()
    outcomes: dict[str, dict[str, float]] = {}
    for code, at in ended:
        o = outcomes.setdefault(code, {"count": 0, "first_s": at, "last_s": at})
        o["count"] += 1
        o["first_s"], o["last_s"] = min(o["first_s"], at), max(o["last_s"], at)
    return {
        "streams": streams, "channels": channels, "state_bytes": total,
        "rss_before": before, "rss_growth": mem["VmRSS"] - before,
        "hwm_growth": mem["VmHWM"] - before, "held_after_writing": held,
        "still_open_after_wait": len(pending), "wait_s": wait,
        "outcomes": {k: {kk: round(vv, 2) for kk, vv in v.items()}
                     for k, v in sorted(outcomes.items())},
        "load_1m": load_held, "alive": target.alive(),
    }


# ---------------------------------------------------------------------------- connections
def idle_connections(target: Target, count: int, hold: float = 3.0) -> dict[str, Any]:
    """``count`` HTTP/2 connections left idle; how many the daemon keeps, its fds, its log."""
    host, port = target.listen.rsplit(":", 1)
    log_before = target.log_path.stat().st_size
    fds_before = fd_count(target.pid)
    socks: list[socket.socket] = []
    refused = 0
    deadline = time.monotonic() + 60
    try:
        for _ in range(count):
            if time.monotonic() > deadline:
                break
            s = _open_and_send(host, port, H2_PREFACE)
            if s is None:
                refused += 1
                continue
            socks.append(s)
        time.sleep(hold)
        closed = 0
        for s in socks:
            s.setblocking(False)
            try:
                while s.recv(65536):
                    pass
                closed += 1  # b"": the daemon closed it
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        fds_held = fd_count(target.pid)
        load_held = load_1m()
        answers = target.status_answers()  # while the connections are still held
    finally:
        for s in socks:
            s.close()
    time.sleep(1.0)
    return {
        "connections": count, "connect_failed": refused, "kept_open": len(socks) - closed,
        "closed_by_daemon": closed, "daemon_fds_before": fds_before,
        "daemon_fds_held": fds_held, "fd_limit": target.fd_limit,
        "status_answers_while_held": answers, "alive": target.alive(),
        "log_bytes_before": log_before, "log_bytes_after": target.log_path.stat().st_size,
        "load_1m": load_held,
    }


# ---------------------------------------------------------------------------- /metrics
def cpu_seconds(pid: int) -> float:
    """User and system CPU time of ``pid`` so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def raise_own_fd_limit(need: int) -> None:
    """Let this process hold ``need`` sockets (soft ``RLIMIT_NOFILE`` up to the hard one)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, need + 256), hard))


def scrape(address: str, timeout: float = 10.0) -> tuple[int, float]:
    """One ``GET /metrics`` as Prometheus sends it: the status code (0: no answer) and seconds."""
    host, port = address.rsplit(":", 1)
    start = time.monotonic()
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: " + address.encode()
                      + b"\r\nAccept-Encoding: gzip\r\n\r\n")
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
    except OSError:
        return 0, time.monotonic() - start
    code = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else 0
    return code, round(time.monotonic() - start, 3)


def _open_and_send(host: str, port: str | int, data: bytes) -> socket.socket | None:
    """A TCP connection to ``host:port`` that has sent ``data`` (``None``: refused)."""
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect((host, int(port)))
        s.sendall(data)
    except OSError:
        s.close()
        return None
    return s


def _closed(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def slow_metrics(target: Target, count: int, hold: float = 3.0, wait_closed: float = 0.0,
                 partial: bytes = b"GET /metr") -> dict[str, Any]:
    """``count`` connections to ``/metrics`` that each send half a request line and hold it:
    whether the daemon lives, its descriptors, threads and RSS, and whether a scrape and
    ``dacflnode status`` answer while they are held (``hold`` s); then up to ``wait_closed`` s
    for the daemon to have closed every one (its head deadline)."""
    host, port = target.metrics.rsplit(":", 1)
    raise_own_fd_limit(count)
    fds_before, threads_before = fd_count(target.pid), thread_count(target.pid)
    rss_before = proc_status(target.pid)["VmRSS"]
    log_before = target.log_path.stat().st_size
    socks: list[socket.socket] = []
    failed = 0
    fds_max, threads_max = fds_before, threads_before
    start = time.monotonic()
    try:
        for k in range(count):
            if time.monotonic() - start > 60:
                break
            s = _open_and_send(host, port, partial)
            if s is None:
                failed += 1
                continue
            socks.append(s)
            if k % 100 == 0:
                fds_max = max(fds_max, fd_count(target.pid))
                threads_max = max(threads_max, thread_count(target.pid))
        opened_s = time.monotonic() - start
        scrape_code, scrape_s = scrape(target.metrics)
        answers = target.status_answers()
        end = time.monotonic() + hold
        while time.monotonic() < end:
            fds_max = max(fds_max, fd_count(target.pid))
            threads_max = max(threads_max, thread_count(target.pid))
            time.sleep(0.2)
        closed = sum(_closed(s) for s in socks)
        load_held = load_1m()
        rss_held = proc_status(target.pid)["VmRSS"]
        open_socks = [s for s in socks if not _closed(s)]
        end = time.monotonic() + wait_closed
        while open_socks and time.monotonic() < end:
            time.sleep(0.2)
            open_socks = [s for s in open_socks if not _closed(s)]
        all_closed_s = round(time.monotonic() - start, 2) if not open_socks else None
    finally:
        for s in socks:
            s.close()
    return {
        "connections": count, "connect_failed": failed, "opened_in_s": round(opened_s, 2),
        "held_s": hold, "closed_by_daemon": closed, "kept_open": len(socks) - closed,
        "daemon_fds_before": fds_before, "daemon_fds_max": fds_max,
        "daemon_threads_before": threads_before, "daemon_threads_max": threads_max,
        "all_closed_after_s": all_closed_s,
        "rss_growth": rss_held - rss_before, "scrape_while_held": scrape_code,
        "scrape_s": scrape_s, "status_answers_while_held": answers, "alive": target.alive(),
        "fd_limit": target.fd_limit, "log_bytes_before": log_before,
        "log_bytes_after": target.log_path.stat().st_size, "load_1m": load_held,
    }


class SlowClients:
    """``count`` connections to ``address`` that each send ``partial`` and hold; one the server
    closes is opened again at once, for as long as :meth:`run` lasts (a persistent attacker)."""

    def __init__(self, address: str, count: int, partial: bytes = b"GET /metr") -> None:
        host, port = address.rsplit(":", 1)
        self.target = (host, int(port))
        self.count, self.partial = count, partial
        self.opened = self.closed_by_server = self.connect_failed = 0

    def _open(self) -> socket.socket | None:
        s = socket.socket()
        s.settimeout(5)
        try:
            s.connect(self.target)
            s.sendall(self.partial)
        except OSError:
            self.connect_failed += 1
            s.close()
            return None
        self.opened += 1
        s.setblocking(False)
        return s

    def run(self, seconds: float, stop: Any = None) -> None:
        import selectors

        raise_own_fd_limit(self.count)
        end = time.monotonic() + seconds
        sel = selectors.DefaultSelector()
        live = 0
        try:
            while time.monotonic() < end and (stop is None or not stop.is_set()):
                while live < self.count and time.monotonic() < end:
                    s = self._open()
                    if s is not None:
                        sel.register(s, selectors.EVENT_READ)
                        live += 1
                for key, _ in sel.select(timeout=0.2):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    try:
                        data = sock.recv(4096)
                    except OSError:
                        data = b""
                    if not data:  # the server closed it: open another
                        self.closed_by_server += 1
                        sel.unregister(sock)
                        sock.close()
                        live -= 1
        finally:
            for key in list(sel.get_map().values()):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                sock.close()
            sel.close()


def metrics_rounds(workdir: Path, count: int, seconds: float, baseline: float,
                   round_deadline: float = 30.0) -> dict[str, Any]:
    """A 2-node run whose rounds progress; node-0's ``/metrics`` gets ``count`` slow
    connections, reopened as the server closes them, for ``seconds``. Reported: node-0's rounds
    per second in ``baseline`` s before and during the attack, its longest round in each
    window against ``round_deadline``, its descriptors, threads and RSS, and whether a scrape
    and ``dacflnode status`` answer during the attack."""
    import threading

    target = Target(workdir, state_mib=0.01, metrics_port=True, both=True, rounds=1_000_000,
                    round_deadline=round_deadline, eval_every=1_000_000)
    target.start()
    try:
        end = time.monotonic() + 120
        while len(target.rounds_done()) < 3:  # both nodes are up and mixing
            if time.monotonic() > end or not target.alive():
                raise RuntimeError(f"the rounds did not start; see {target.log_path}")
            time.sleep(0.2)
        fds_before, threads_before = fd_count(target.pid), thread_count(target.pid)
        rss_before = proc_status(target.pid)["VmRSS"]
        r0, cpu0 = len(target.rounds_done()), cpu_seconds(target.pid)
        time.sleep(baseline)
        r1, cpu1 = len(target.rounds_done()), cpu_seconds(target.pid)
        load_base = load_1m()
        clients = SlowClients(target.metrics, count)
        stop = threading.Event()
        attacker = threading.Thread(target=clients.run, args=(seconds + 60, stop), daemon=True)
        attacker.start()
        while clients.opened < count and attacker.is_alive():  # the flood is in place
            time.sleep(0.1)
        r2, cpu2 = len(target.rounds_done()), cpu_seconds(target.pid)
        start = time.monotonic()
        fds_max, threads_max = fds_before, threads_before
        scrapes: list[tuple[int, float]] = []
        answers = []
        while time.monotonic() - start < seconds:
            fds_max = max(fds_max, fd_count(target.pid))
            threads_max = max(threads_max, thread_count(target.pid))
            if len(scrapes) < 10:
                scrapes.append(scrape(target.metrics))
            if len(answers) < 3:
                answers.append(target.status_answers())
            time.sleep(0.5)
        attack_s = time.monotonic() - start
        r3, cpu3 = len(target.rounds_done()), cpu_seconds(target.pid)
        load_attack = load_1m()
        rss_attack = proc_status(target.pid)["VmRSS"]
        stop.set()
        attacker.join(30)
        rows = target.rounds_done()
        longest_base = max(float(x["seconds"]) for x in rows[r0:r1]) if r1 > r0 else None
        longest_attack = max(float(x["seconds"]) for x in rows[r2:r3]) if r3 > r2 else None
        return {
            "connections": count, "attack_s": round(attack_s, 1), "baseline_s": baseline,
            "opened": clients.opened, "closed_by_daemon": clients.closed_by_server,
            "connect_failed": clients.connect_failed,
            "rounds_per_s_before": round((r1 - r0) / baseline, 2),
            "rounds_per_s_attack": round((r3 - r2) / attack_s, 2),
            "longest_round_s_before": longest_base, "longest_round_s_attack": longest_attack,
            "round_deadline_s": round_deadline,
            "daemon_cpu_per_round_ms_before": round(1000 * (cpu1 - cpu0) / max(1, r1 - r0), 1),
            "daemon_cpu_per_round_ms_attack": round(1000 * (cpu3 - cpu2) / max(1, r3 - r2), 1),
            "daemon_cpu_share_before": round((cpu1 - cpu0) / baseline, 2),
            "daemon_cpu_share_attack": round((cpu3 - cpu2) / attack_s, 2),
            "daemon_fds_before": fds_before, "daemon_fds_max": fds_max,
            "daemon_threads_before": threads_before, "daemon_threads_max": threads_max,
            "rss_growth": rss_attack - rss_before,
            "scrapes_during_attack": [code for code, _ in scrapes],
            "scrape_s_max": max((t for _, t in scrapes), default=None),
            "status_answers_during_attack": all(answers) and bool(answers),
            "alive": target.alive(), "load_1m_before": load_base, "load_1m": load_attack,
        }
    finally:
        target.stop()


# ---------------------------------------------------------------------------- hellos
async def big_hellos(target: Target, count: int, id_kib: int,
                     concurrency: int = 16) -> dict[str, Any]:
    """``count`` Hellos with a ``id_kib`` KiB node_id, and one whose id holds a newline;
    ``concurrency`` calls in flight on one connection (more than the server's
    ``grpc.max_concurrent_streams`` makes some fail with ``UNAVAILABLE`` on a new connection).
    A call the connection failed (``UNAVAILABLE``) is made again, at most twice, once the
    channel is ready (``retried_unavailable``): ``codes`` are the daemon's answers."""
    log_before = target.log_path.stat().st_size
    node_id = "A" * (id_kib * 1024)
    codes: dict[str, int] = {}
    retried = [0]
    start = time.monotonic()
    async with grpc.aio.insecure_channel(target.listen) as ch:
        stub = neighbor_pb2_grpc.NeighborStub(ch)

        async def hello(nid: str) -> None:
            for attempt in range(3):
                try:
                    await stub.Hello(pb.HelloRequest(node_id=nid, protocol_version=1),
                                     timeout=30, wait_for_ready=attempt > 0)
                    codes["OK"] = codes.get("OK", 0) + 1
                except grpc.aio.AioRpcError as exc:
                    # the connection, not the daemon, failed the call (a busy machine's
                    # reconnect): as any client would, it calls again, once ready
                    if exc.code() == grpc.StatusCode.UNAVAILABLE and attempt < 2:
                        retried[0] += 1
                        continue
                    codes[exc.code().name] = codes.get(exc.code().name, 0) + 1
                return

        await hello("evil\n2099-01-01 00:00:00,000 INFO dacflnode.daemon: forged line")
        for base in range(0, count, concurrency):
            await asyncio.gather(*(hello(node_id)
                                   for _ in range(min(concurrency, count - base))))
    seconds = time.monotonic() - start
    await asyncio.sleep(0.5)
    text = target.log_path.read_text(errors="replace")
    return {
        "hellos": count, "id_bytes": len(node_id), "codes": codes, "seconds": round(seconds, 2),
        "retried_unavailable": retried[0],
        "log_bytes_before": log_before, "log_bytes_after": target.log_path.stat().st_size,
        "longest_log_line": max(len(line) for line in text.splitlines()),
        "forged_line_in_log": any(line.startswith("2099-01-01") for line in text.splitlines()),
        "load_1m": load_1m(), "alive": target.alive(),
    }


# ---------------------------------------------------------------------------- duplicates
async def stalled_duplicates(target: Target, stalled: int, round_: int = 1,
                             wait: float = 30.0) -> dict[str, Any]:
    """``stalled`` push streams in node-1's name for ``round_`` that send a valid header and
    then nothing, then node-1's real push of that round (the whole state, retried every 0.2 s
    while it is refused ``IN_PROGRESS``, at most ``wait`` s); how long the real push took."""
    names = sorted(target.tensors)
    total = 4 * sum(target.tensors.values())
    # node-1's state as an honest node-1 would send it (the run's initial model, seed 0, every
    # exchanged tensor), so that the guard accepts it; changed a little in each round, as
    # training changes it, so that it is no replay of another round's state
    from dacflnode.learning.layout import StateLayout

    torch.manual_seed(0)
    model = Wide((1, 8, 8), 10)
    initial = StateLayout.from_module(model).flatten_module(model).detach() * (1 + 1e-3 * round_)
    payload = b"".join(initial.to(torch.float32).numpy().tobytes() for _ in names)
    assert len(payload) == total, (len(payload), total)
    digest = xxhash.xxh3_128(payload)
    header = pb.StateChunk(header=pb.StateHeader(
        sender="node-1", round=round_, degree=1, payload_bytes=total,
        tensors=[pb.TensorSpec(name=n, dtype="float32", shape=[target.tensors[n]])
                 for n in names]))

    async def whole() -> Any:
        yield header
        for off in range(0, total, CHUNK):
            yield pb.StateChunk(data=payload[off:off + CHUNK])
        yield pb.StateChunk(trailer=digest.digest())

    ended: list[str] = []
    async with grpc.aio.insecure_channel(target.listen, options=[
            ("grpc.max_send_message_length", 8 << 20)]) as ch:
        stub = neighbor_pb2_grpc.NeighborStub(ch)

        async def stall() -> None:
            call = stub.PushState(timeout=wait + 30)
            try:
                await call.write(header)
                await call
                ended.append("OK")
            except grpc.aio.AioRpcError as exc:
                reason = dict(exc.trailing_metadata() or ()).get("dacfl-reason", "")
                ended.append(f"{exc.code().name}/{reason}")

        held = [asyncio.create_task(stall()) for _ in range(stalled)]
        await asyncio.sleep(0.5)  # their headers are in
        start = time.monotonic()
        tries = 0
        refusals: dict[str, int] = {}
        outcome = "timed out"
        while time.monotonic() - start < wait:
            tries += 1
            try:
                await stub.PushState(whole(), timeout=wait)
                outcome = "OK"
                break
            except grpc.aio.AioRpcError as exc:
                reason = dict(exc.trailing_metadata() or ()).get("dacfl-reason", "")
                key = f"{exc.code().name}/{reason}"
                refusals[key] = refusals.get(key, 0) + 1
                if reason != "in-progress":
                    outcome = key
                    break
            await asyncio.sleep(0.2)
        took = time.monotonic() - start
        _, pending = await asyncio.wait(held, timeout=5.0)
        for t in pending:
            t.cancel()
        await asyncio.gather(*held, return_exceptions=True)
    return {"stalled": stalled, "round": round_, "real_push": outcome,
            "real_push_s": round(took, 2), "tries": tries, "refused": refusals,
            "stalled_ended": sorted(ended), "stalled_still_open": len(pending),
            "alive": target.alive(), "load_1m": load_1m()}


# ---------------------------------------------------------------------------- slots
async def headerless_streams(listen: str, streams: int, stop: asyncio.Event,
                             channels: int = 8) -> dict[str, Any]:
    """``streams`` PushState streams that never send a message, each reopened as soon as it
    ends, until ``stop`` is set; how they ended (status code and reason) and how many were
    opened. ``UNAVAILABLE`` (the node is not up yet, or gone) is retried after 50 ms."""
    chans = [grpc.aio.insecure_channel(listen, options=[("grpc.use_local_subchannel_pool", 1)])
             for _ in range(channels)]
    ended: dict[str, int] = {}
    opened = 0
    up = False  # the node has answered a stream: UNAVAILABLE before that is its start-up

    async def one(i: int) -> None:
        nonlocal opened, up
        stub = neighbor_pb2_grpc.NeighborStub(chans[i % channels])
        while not stop.is_set():
            opened += 1
            try:
                await stub.PushState(timeout=120)  # a call made to be written to: never is
                key = "OK"
            except grpc.aio.AioRpcError as exc:
                reason = dict(exc.trailing_metadata() or ()).get("dacfl-reason", "")
                key = f"{exc.code().name}/{reason}" if reason else exc.code().name
                if exc.code() is grpc.StatusCode.UNAVAILABLE:
                    key += "" if up else " (starting)"
                    await asyncio.sleep(0.05)
            up = up or not key.startswith("UNAVAILABLE")
            ended[key] = ended.get(key, 0) + 1

    tasks = [asyncio.create_task(one(i)) for i in range(streams)]
    await stop.wait()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for ch in chans:
        await ch.close()
    return {"streams": streams, "opened": opened, "ended": dict(sorted(ended.items()))}


#: The run of the ``slots`` scenario: a 3-node ring of the tiny CNN on synthetic data.
def ring_config(rounds: int) -> Any:
    from dacflnode.config import RunConfig

    return RunConfig(dataset="synthetic", model="tiny-cnn", lr=0.05, nodes=3, rounds=rounds,
                     synthetic_train=600, synthetic_test=200, device="cpu",
                     algorithm=("dacfl",), topology="ring")


async def ring_run(workdir: Path, rounds: int, attack_streams: int = 0,
                   daemon_settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """A live 3-node ring (``dacflnode start`` per node, plaintext on 127.0.0.1) running
    ``rounds`` rounds; with ``attack_streams``, that many header-less streams are kept open
    against node-0 from its start to its end (:func:`headerless_streams`). Rounds per minute
    count the rounds' own time on node-0 (exchange, training, evaluation: not start-up)."""
    from dacflnode.cluster.launcher import run_cluster
    from dacflnode.records.metrics_log import read_metrics

    stop = asyncio.Event()
    cluster = asyncio.create_task(run_cluster(
        ring_config(rounds), workdir, algorithm="dacfl", topology="ring", round_deadline=120,
        hello_timeout=120, daemon_settings=daemon_settings))
    attack: asyncio.Task[dict[str, Any]] | None = None
    peers = workdir / "peers" / "node-0.yaml"
    load = [load_1m()]
    try:
        if attack_streams:
            while not peers.exists() and not cluster.done():
                await asyncio.sleep(0.05)
            if not cluster.done():
                listen = yaml.safe_load(peers.read_text())["node"]["listen"]
                attack = asyncio.create_task(headerless_streams(listen, attack_streams, stop))
        while not cluster.done():
            await asyncio.sleep(1.0)
            load.append(load_1m())
        summary = await cluster
    finally:
        stop.set()
        attacked = await attack if attack is not None else None
        if not cluster.done():
            cluster.cancel()
    lines = {n: read_metrics(workdir / n / "metrics.jsonl")
             for n in ("node-0", "node-1", "node-2")}
    seconds = sum(line["seconds"] for line in lines["node-0"])
    return {
        "rounds": rounds, "attack_streams": attack_streams,
        "rounds_per_min": round(60.0 * len(lines["node-0"]) / seconds, 2),
        "round_s_max": round(max(line["seconds"] for ls in lines.values() for line in ls), 2),
        "exchange_s_max": round(max(line["exchange_s"] for ls in lines.values()
                                    for line in ls), 2),
        "neighbours_missing": sum(len(line["neighbours_missing"]) for ls in lines.values()
                                  for line in ls),
        "wall_s": summary["wall_s"], "attack": attacked,
        "load_1m": max(load),
    }


async def slots(workdir: Path, streams: int, rounds: int) -> dict[str, Any]:
    """The ``slots`` scenario: an untouched ring, then the same ring with ``streams``
    header-less streams reopened continuously against node-0."""
    untouched = await ring_run(workdir / "untouched", rounds)
    attacked = await ring_run(workdir / "attacked", rounds, attack_streams=streams)
    return {"untouched": untouched, "attacked": attacked,
            "rounds_per_min_ratio": round(attacked["rounds_per_min"]
                                          / untouched["rounds_per_min"], 3)}


# ---------------------------------------------------------------------------- main
def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"config": {k: v for k, v in vars(args).items() if k != "json"},
                               "load_1m_start": load_1m(), "cpus": os.cpu_count()}
    wanted = set(args.scenarios.split(","))
    if "metrics" in wanted:
        with tempfile.TemporaryDirectory(prefix="dacfl-attacks-") as tmp:
            results["metrics"] = metrics_rounds(Path(tmp), args.slow_metrics,
                                                args.metrics_seconds, args.metrics_baseline)
    with tempfile.TemporaryDirectory(prefix="dacfl-attacks-") as tmp:
        if wanted & {"stalled", "hellos"}:
            base = Target(Path(tmp) / "a", state_mib=args.state_mib,
                          idle_timeout=args.idle_timeout, stream_timeout=args.stream_timeout)
            base.start()
            try:
                if "stalled" in wanted:
                    results["stalled"] = asyncio.run(stalled_streams(
                        base, args.streams, args.channels, args.wait))
                if "hellos" in wanted:
                    results["hellos"] = asyncio.run(big_hellos(base, args.hellos, args.id_kib))
                if "stalled" in wanted:
                    results["stalled"]["status_answers_after"] = base.status_answers()
            finally:
                results["exit_code_stalled_hellos"] = base.stop()
        if "connections" in wanted:
            limited = Target(Path(tmp) / "b", state_mib=args.state_mib,
                             idle_timeout=args.idle_timeout,
                             stream_timeout=args.stream_timeout, fd_limit=args.fd_limit)
            limited.start()
            try:
                results["connections"] = idle_connections(limited, args.connections)
            finally:
                results["exit_code_connections"] = limited.stop()
        if "duplicates" in wanted:
            patient = Target(Path(tmp) / "d", state_mib=args.state_mib)
            patient.start()
            try:
                results["duplicates"] = [asyncio.run(stalled_duplicates(patient, n, round_=r))
                                         for r, n in ((0, 1), (1, 2))]
            finally:
                results["exit_code_duplicates"] = patient.stop()
        if "slots" in wanted:
            results["slots"] = asyncio.run(slots(Path(tmp) / "s", args.slot_streams,
                                                 args.slot_rounds))
    return results


def metrics_table(m: dict[str, Any]) -> list[tuple[str, str, float]]:
    mib = 1 << 20
    return [
        ("slow /metrics", f"{m['connections']} held for {m['attack_s']} s (reopened as closed: "
         f"{m['opened']} opened, {m['closed_by_daemon']} closed by the daemon); alive: "
         f"{m['alive']}", m["load_1m"]),
        ("  daemon", f"fds {m['daemon_fds_before']} -> max {m['daemon_fds_max']}, threads "
         f"{m['daemon_threads_before']} -> max {m['daemon_threads_max']}, RSS "
         f"{m['rss_growth'] / mib:+.1f} MiB", m["load_1m"]),
        ("  rounds", f"{m['rounds_per_s_before']}/s before, {m['rounds_per_s_attack']}/s during;"
         f" longest {m['longest_round_s_before']} s before, {m['longest_round_s_attack']} s "
         f"during (deadline {m['round_deadline_s']} s)", m["load_1m"]),
        ("  daemon CPU", f"{m['daemon_cpu_share_before']} -> {m['daemon_cpu_share_attack']} "
         f"cores; {m['daemon_cpu_per_round_ms_before']} -> "
         f"{m['daemon_cpu_per_round_ms_attack']} ms a round", m["load_1m"]),
        ("  answers", f"scrapes {m['scrapes_during_attack']} (slowest {m['scrape_s_max']} s), "
         f"status: {m['status_answers_during_attack']}", m["load_1m"]),
    ]


def table(r: dict[str, Any]) -> str:
    mib = 1 << 20
    rows: list[tuple[str, str, Any]] = []
    if "stalled" in r:
        s = r["stalled"]
        rows += [
            ("stalled streams", f"{s['streams']} over {s['channels']} connections, "
             f"{s['state_bytes'] / mib:.1f} MiB state each", s["load_1m"]),
            ("  RSS growth", f"{s['rss_growth'] / mib:+.1f} MiB (peak "
             f"{s['hwm_growth'] / mib:+.1f} MiB), {s['held_after_writing']} held after writing",
             s["load_1m"]),
            ("  ended", ", ".join(f"{k}: {v['count']} at {v['first_s']}-{v['last_s']} s"
                                  for k, v in s["outcomes"].items()), s["load_1m"]),
            ("  open after wait", f"{s['still_open_after_wait']} (waited {s['wait_s']} s); "
             f"status answers: {s['status_answers_after']}", s["load_1m"]),
        ]
    if "connections" in r:
        c = r["connections"]
        rows += [
            ("idle connections", f"{c['connections']} under ulimit -n {c['fd_limit']}: "
             f"{c['kept_open']} kept, {c['closed_by_daemon']} closed, "
             f"{c['connect_failed']} connect failed", c["load_1m"]),
            ("  daemon fds", f"{c['daemon_fds_before']} -> {c['daemon_fds_held']}; status "
             f"answers: {c['status_answers_while_held']}; alive: {c['alive']}", c["load_1m"]),
            ("  daemon.log", f"{c['log_bytes_before']} -> {c['log_bytes_after']} bytes",
             c["load_1m"]),
        ]
    if "hellos" in r:
        h = r["hellos"]
        rows += [
            ("huge Hellos", f"{h['hellos']} x {h['id_bytes'] // 1024} KiB node_id in "
             f"{h['seconds']} s: {h['codes']}", h["load_1m"]),
            ("  daemon.log", f"{h['log_bytes_before']} -> {h['log_bytes_after']} bytes, "
             f"longest line {h['longest_log_line']} chars, forged line: "
             f"{h['forged_line_in_log']}", h["load_1m"]),
        ]
    for d in r.get("duplicates", []):
        rows.append((f"stalled duplicates ({d['stalled']})",
                     f"real push {d['real_push']} after {d['real_push_s']} s, {d['tries']} "
                     f"tries; stalled ones ended {d['stalled_ended']}", d["load_1m"]))
    if "slots" in r:
        sl = r["slots"]
        for name in ("untouched", "attacked"):
            x = sl[name]
            what = (f"{x['rounds_per_min']} rounds/min, longest round {x['round_s_max']} s, "
                    f"longest exchange {x['exchange_s_max']} s, "
                    f"{x['neighbours_missing']} neighbours missed")
            if x["attack"]:
                what += (f"; {x['attack']['streams']} streams, {x['attack']['opened']} opened, "
                         f"ended {x['attack']['ended']}")
            rows.append((f"3-node ring, {name}", what, x["load_1m"]))
        rows.append(("  attacked / untouched", f"{sl['rounds_per_min_ratio']} (rounds per "
                     "minute)", sl["attacked"]["load_1m"]))
    if "metrics" in r:
        rows += metrics_table(r["metrics"])
    width = max(len(a) for a, _, _ in rows)
    lines = [f"{'attack'.ljust(width)}  {'figure'}  (load 1m)"]
    lines += [f"{a.ljust(width)}  {b}  ({load})" for a, b, load in rows]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_standard_args(p)
    p.add_argument("--streams", type=int, default=150)
    p.add_argument("--channels", type=int, default=10)
    p.add_argument("--state-mib", type=float, default=8.0,
                   help="MiB per exchanged tensor of the daemon's model")
    p.add_argument("--wait", type=float, default=45.0,
                   help="seconds to wait for the stalled streams to be cut")
    p.add_argument("--idle-timeout", type=float, default=None,
                   help="the daemon's stream idle deadline (default: its own)")
    p.add_argument("--stream-timeout", type=float, default=None,
                   help="the daemon's total stream deadline (default: its own)")
    p.add_argument("--connections", type=int, default=1500)
    p.add_argument("--fd-limit", type=int, default=1024)
    p.add_argument("--hellos", type=int, default=1000)
    p.add_argument("--id-kib", type=int, default=100)
    p.add_argument("--slow-metrics", type=int, default=1100,
                   help="slow connections to /metrics, held and reopened")
    p.add_argument("--metrics-seconds", type=float, default=30.0,
                   help="seconds the slow /metrics connections are held")
    p.add_argument("--metrics-baseline", type=float, default=15.0,
                   help="seconds of rounds measured before that attack")
    p.add_argument("--slot-streams", type=int, default=70,
                   help="header-less streams kept open against the ring of the slots scenario")
    p.add_argument("--slot-rounds", type=int, default=10,
                   help="rounds of each ring of the slots scenario")
    p.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help=f"comma-separated, of: {', '.join(SCENARIOS)}")
    args = p.parse_args()
    unknown = set(args.scenarios.split(",")) - set(SCENARIOS)
    if unknown:
        p.error(f"unknown scenario(s) {sorted(unknown)}: choose from {', '.join(SCENARIOS)}")
    if args.quick:
        args.streams, args.connections, args.hellos = 60, 400, 200
        args.metrics_seconds, args.metrics_baseline = 15.0, 10.0
        args.idle_timeout = args.idle_timeout or 2.0
        args.wait = min(args.wait, 15.0)
        args.slot_rounds = min(args.slot_rounds, 4)
    results = run(args)
    if not args.json:
        print(table(results))
    if "stalled" in results:
        s = results["stalled"]
        emit_result("attacks", s["hwm_growth"] / (s["streams"] * s["state_bytes"]), 0.25, False,
                    as_json=args.json,
                    states_held_at_peak=round(s["hwm_growth"] / s["state_bytes"], 2), **results)
    elif "slots" in results:
        emit_result("attacks-slots", results["slots"]["rounds_per_min_ratio"], 0.9, True,
                    as_json=args.json, **results)
    elif "metrics" in results:  # rounds during the slow /metrics connections / before
        m = results["metrics"]
        before = m["rounds_per_s_before"] or float("nan")
        emit_result("attacks-metrics", m["rounds_per_s_attack"] / before, 0.5, True,
                    as_json=args.json, **results)
    elif args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
