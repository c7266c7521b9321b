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

Each figure comes with the 1-minute load average at the time. The stream deadlines are the
daemon's defaults (:data:`dacflnode.transport.receiver.IDLE_TIMEOUT`, ``STREAM_TIMEOUT``);
``--idle-timeout`` shortens them in the daemon process (the daemon has no setting for them),
as ``--quick`` does. All loops are bounded in count and time, and everything stays on loopback.

The result's ``ratio`` is the daemon's peak RSS growth under the stalled streams against the
bytes those streams pushed (``streams`` × state): a receiver without limits holds all of them
(ratio 1; before the limits, 40 streams of 8 MiB held 320 MiB). Target ≤ 0.25. The growth is
bounded (one state per neighbour and accepted round, plus transient buffers), so the ratio falls
as ``--streams`` grows; ``states_held_at_peak`` gives the same growth in states.

Usage: ``python benchmarks/attacks.py [--quick] [--json]``; ``--quick``: 60 streams, 400
connections, 200 Hellos, a 2 s idle deadline.
The CI versions of these attacks, with assertions, are in ``tests/node/test_attacks.py``.
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
from dataclasses import dataclass, field, replace
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
    proc: subprocess.Popen[bytes] | None = None
    listen: str = ""
    control: str = ""
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
        from dacflnode.config import RunConfig
        from dacflnode.learning.layout import StateLayout
        from dacflnode.node.cluster import generate_cluster
        from dacflnode.node.launcher import free_ports

        run = RunConfig(dataset="synthetic", model="attacks:Wide", nodes=2, rounds=5,
                        synthetic_train=200, synthetic_test=50, device="cpu")
        ports = free_ports(4)
        paths = generate_cluster("complete", 2, run, self.workdir / "peers", ports=ports[:2],
                                 control_ports=ports[2:], state_root=self.workdir,
                                 hello_timeout=600, round_deadline=600)
        self.listen, self.control = f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[2]}"
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
        paths[0].write_text(yaml.safe_dump(peers, sort_keys=False))
        cmd = [sys.executable, "-m", "dacflnode", "start", "--peers", str(paths[0])]
        if self.fd_limit is not None:  # exec keeps the pid: /proc/PID is the daemon's
            limits = f"ulimit -n {self.fd_limit}"
            if self.soft_fd_limit is not None:
                limits += f" && ulimit -S -n {self.soft_fd_limit}"
            cmd = ["bash", "-c", f"{limits} && exec \"$@\"", "bash", *cmd]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
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

    def stop(self) -> int | None:
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
    digest = xxhash.xxh3_128()
    zeros = bytes(CHUNK)
    for off in range(0, total, CHUNK):
        digest.update(zeros[: min(CHUNK, total - off)])
    checksum = digest.digest()
    release = asyncio.Event()
    written = 0

    def header(round_: int) -> pb.StateChunk:
        return pb.StateChunk(header=pb.StateHeader(
            sender="node-1", round=round_, degree=1, payload_bytes=total, checksum=checksum,
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
            s = socket.socket()
            s.settimeout(5)
            try:
                s.connect((host, int(port)))
                s.sendall(H2_PREFACE)
            except OSError:
                refused += 1
                s.close()
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


# ---------------------------------------------------------------------------- hellos
async def big_hellos(target: Target, count: int, id_kib: int,
                     concurrency: int = 16) -> dict[str, Any]:
    """``count`` Hellos with a ``id_kib`` KiB node_id, and one whose id holds a newline;
    ``concurrency`` calls in flight on one connection (more than the server's
    ``grpc.max_concurrent_streams`` makes some fail with ``UNAVAILABLE`` on a new connection)."""
    log_before = target.log_path.stat().st_size
    node_id = "A" * (id_kib * 1024)
    codes: dict[str, int] = {}
    start = time.monotonic()
    async with grpc.aio.insecure_channel(target.listen) as ch:
        stub = neighbor_pb2_grpc.NeighborStub(ch)

        async def hello(nid: str) -> None:
            try:
                await stub.Hello(pb.HelloRequest(node_id=nid, protocol_version=1), timeout=30)
                codes["OK"] = codes.get("OK", 0) + 1
            except grpc.aio.AioRpcError as exc:
                codes[exc.code().name] = codes.get(exc.code().name, 0) + 1

        await hello("evil\n2099-01-01 00:00:00,000 INFO dacflnode.daemon: forged line")
        for base in range(0, count, concurrency):
            await asyncio.gather(*(hello(node_id)
                                   for _ in range(min(concurrency, count - base))))
    seconds = time.monotonic() - start
    await asyncio.sleep(0.5)
    text = target.log_path.read_text(errors="replace")
    return {
        "hellos": count, "id_bytes": len(node_id), "codes": codes, "seconds": round(seconds, 2),
        "log_bytes_before": log_before, "log_bytes_after": target.log_path.stat().st_size,
        "longest_log_line": max(len(line) for line in text.splitlines()),
        "forged_line_in_log": any(line.startswith("2099-01-01") for line in text.splitlines()),
        "load_1m": load_1m(), "alive": target.alive(),
    }


# ---------------------------------------------------------------------------- main
def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"config": {k: v for k, v in vars(args).items() if k != "json"},
                               "load_1m_start": load_1m(), "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="dacfl-attacks-") as tmp:
        base = Target(Path(tmp) / "a", state_mib=args.state_mib, idle_timeout=args.idle_timeout,
                      stream_timeout=args.stream_timeout)
        base.start()
        try:
            results["stalled"] = asyncio.run(stalled_streams(
                base, args.streams, args.channels, args.wait))
            results["hellos"] = asyncio.run(big_hellos(base, args.hellos, args.id_kib))
            results["stalled"]["status_answers_after"] = base.status_answers()
        finally:
            results["exit_code_stalled_hellos"] = base.stop()
        limited = replace(base, workdir=Path(tmp) / "b", fd_limit=args.fd_limit, proc=None)
        limited.start()
        try:
            results["connections"] = idle_connections(limited, args.connections)
        finally:
            results["exit_code_connections"] = limited.stop()
    return results


def table(r: dict[str, Any]) -> str:
    mib = 1 << 20
    s, c, h = r["stalled"], r["connections"], r["hellos"]
    rows = [
        ("stalled streams", f"{s['streams']} over {s['channels']} connections, "
         f"{s['state_bytes'] / mib:.1f} MiB state each", s["load_1m"]),
        ("  RSS growth", f"{s['rss_growth'] / mib:+.1f} MiB (peak {s['hwm_growth'] / mib:+.1f} "
         f"MiB), {s['held_after_writing']} held after writing", s["load_1m"]),
        ("  ended", ", ".join(f"{k}: {v['count']} at {v['first_s']}-{v['last_s']} s"
                              for k, v in s["outcomes"].items()), s["load_1m"]),
        ("  open after wait", f"{s['still_open_after_wait']} (waited {s['wait_s']} s); "
         f"status answers: {s['status_answers_after']}", s["load_1m"]),
        ("idle connections", f"{c['connections']} under ulimit -n {c['fd_limit']}: "
         f"{c['kept_open']} kept, {c['closed_by_daemon']} closed, "
         f"{c['connect_failed']} connect failed", c["load_1m"]),
        ("  daemon fds", f"{c['daemon_fds_before']} -> {c['daemon_fds_held']}; status answers: "
         f"{c['status_answers_while_held']}; alive: {c['alive']}", c["load_1m"]),
        ("  daemon.log", f"{c['log_bytes_before']} -> {c['log_bytes_after']} bytes", c["load_1m"]),
        ("huge Hellos", f"{h['hellos']} x {h['id_bytes'] // 1024} KiB node_id in "
         f"{h['seconds']} s: {h['codes']}", h["load_1m"]),
        ("  daemon.log", f"{h['log_bytes_before']} -> {h['log_bytes_after']} bytes, longest line "
         f"{h['longest_log_line']} chars, forged line: {h['forged_line_in_log']}", h["load_1m"]),
    ]
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
    args = p.parse_args()
    if args.quick:
        args.streams, args.connections, args.hellos = 60, 400, 200
        args.idle_timeout = args.idle_timeout or 2.0
        args.wait = min(args.wait, 15.0)
    results = run(args)
    if not args.json:
        print(table(results))
    s = results["stalled"]
    emit_result("attacks", s["hwm_growth"] / (s["streams"] * s["state_bytes"]), 0.25, False,
                as_json=args.json, states_held_at_peak=round(s["hwm_growth"] / s["state_bytes"], 2),
                **results)


if __name__ == "__main__":
    main()
