"""Throughput of one state exchange: dacflnode's PushState against a raw gRPC stream.

For every size ``S`` (MB of state per node, MB = 2**20 bytes; the state is DACFL's
``{"omega", "x"}``, two float32 tensors of ``P = S / 8`` elements each) a fresh child process
runs, on 127.0.0.1 with ports picked by the kernel:

* **raw** -- a minimal grpc.aio client-streaming method (generic handler, identity
  serializers, no protobuf) on a server from :func:`dacflnode.transport.channels.create_server`,
  called over a channel from :func:`~dacflnode.transport.channels.create_channel` (so the same
  options, windows included): ``S`` MB sent as preallocated 1 MiB ``bytes`` messages; the server
  only counts them and answers with the count. Timed from the call to the reply.
* **dacflnode** -- two :class:`~dacflnode.transport.grpc_transport.GrpcTransport` (``a``, ``b``),
  one handshake, then ``a.push("b", message)`` of a :class:`~dacflnode.wire.message.RoundMessage`
  of that size, timed until it returns (the server returns once the message is in ``b``'s
  inbox: validated, assembled, trailer checksum verified). Every repeat is a new round (``b``'s
  inbox moves with it, and drops the previous round as a node does), so the sender hashes the
  payload every time (chunk by chunk as it sends it), as a node does once per round.
* **dacflnode, checksum cached** -- the same message pushed a second time: the sender kept the
  checksum its first stream computed, as it does for a node's second, third, ... neighbour, so
  it only copies; the receiver still hashes and verifies.

The three are interleaved within each repeat, so background load hits them alike; the reported
rate is size / median time. Peak RSS growth is measured per push (``VmHWM`` of the process,
reset through ``/proc/self/clear_refs`` before each push; without that, ``ru_maxrss`` over the
whole child) relative to the RSS just before it, and the largest over the repeats is reported.
Sender and receiver share the process, so the receiver's copy of the state (1x) is part of the
dacflnode growth; gRPC's own buffers are part of both (the raw column shows them alone).

The result (``--json``: the last stdout line) is the smallest dacflnode / raw rate over the
sizes from 6 to 64 MB (target >= 1.0), with the figures per size and the largest peak RSS
growth of a dacflnode push over those sizes, as a multiple of the state.

Usage: ``python benchmarks/bench_exchange.py [--quick] [--sizes 6,13,64,400] [--repeats 5]
[--json]``. :class:`RawSink` / :class:`RawSender` are reused by ``bench_round_overhead.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import torch
from _common import add_standard_args, emit_result, machine

from dacflnode.transport import channels
from dacflnode.transport.base import Identity, Inbox
from dacflnode.transport.grpc_transport import GrpcTransport
from dacflnode.wire.buffers import BufferPool
from dacflnode.wire.decoder import Decoder
from dacflnode.wire.encoder import checksum, make_header, payload_slices, serialized_chunks
from dacflnode.wire.fast_path import parse_chunk
from dacflnode.wire.message import CHUNK_BYTES, RoundMessage
from dacflnode.wire.validation import Expectation

MB = 1 << 20
PUSH_TIMEOUT = 600.0
MODEL, RUN = "bench-model", "bench-run"

# ----------------------------------------------------------------------------- raw gRPC
RAW_SERVICE = "dacflbench.Raw"
RAW_METHOD = f"/{RAW_SERVICE}/Push"


def _identity(data: bytes) -> bytes:
    return data


async def _count(request_iterator: AsyncIterator[bytes], context: Any) -> bytes:
    total = 0
    async for data in request_iterator:
        total += len(data)
    return total.to_bytes(8, "little")


class RawSink:
    """A server with one raw client-streaming method that counts the bytes it receives."""

    def __init__(self) -> None:
        self.server = channels.create_server()
        handler = grpc.method_handlers_generic_handler(RAW_SERVICE, {
            "Push": grpc.stream_unary_rpc_method_handler(
                _count, request_deserializer=_identity, response_serializer=_identity),
        })
        self.server.add_generic_rpc_handlers((handler,))
        self.port = 0

    async def start(self, address: str = "127.0.0.1:0") -> int:
        self.port = channels.bind(self.server, address)
        await self.server.start()
        return self.port

    async def stop(self) -> None:
        await self.server.stop(0)


class RawSender:
    """Streams a number of bytes to a :class:`RawSink` as preallocated 1 MiB messages."""

    def __init__(self, address: str) -> None:
        self.channel = channels.create_channel(address)
        self._push = self.channel.stream_unary(
            RAW_METHOD, request_serializer=_identity, response_deserializer=_identity)
        self._chunk = os.urandom(CHUNK_BYTES)

    async def push(self, total_bytes: int, timeout: float = PUSH_TIMEOUT) -> float:
        """Send ``total_bytes``; return the seconds from the call to the server's reply."""
        full, rest = divmod(total_bytes, CHUNK_BYTES)
        chunk, tail = self._chunk, self._chunk[:rest]

        async def stream() -> AsyncIterator[bytes]:
            for _ in range(full):
                yield chunk
            if rest:
                yield tail

        started = time.perf_counter()
        reply = await self._push(stream(), timeout=timeout)
        seconds = time.perf_counter() - started
        got = int.from_bytes(reply, "little")
        if got != total_bytes:
            raise RuntimeError(f"raw sink counted {got} bytes, {total_bytes} were sent")
        return seconds

    async def close(self) -> None:
        await self.channel.close()


# ----------------------------------------------------------------------------- dacflnode
class Pair:
    """Two GrpcTransports, ``a`` pushing to ``b``; ``b``'s inbox follows :attr:`round`."""

    def __init__(self, p: int) -> None:
        self.round = 0
        tensors = {"omega": (p,), "x": (p,)}
        self.a = GrpcTransport(Identity("a", MODEL, RUN), "127.0.0.1:0", {},
                               Inbox(senders=frozenset({"b"}), current_round=lambda: 0), tensors)
        self.b = GrpcTransport(Identity("b", MODEL, RUN), "127.0.0.1:0", {},
                               Inbox(senders=frozenset({"a"}), current_round=lambda: self.round),
                               tensors)

    async def start(self) -> None:
        await self.a.start()
        await self.b.start()
        self.a.peers["b"] = f"127.0.0.1:{self.b.port}"
        self.b.peers["a"] = f"127.0.0.1:{self.a.port}"
        await self.a.hello("b")

    async def push(self, message: RoundMessage) -> float:
        """``a.push("b", message)``; the seconds until it returned (message in b's inbox)."""
        self.round = message.round
        started = time.perf_counter()
        await self.a.push("b", message, timeout=PUSH_TIMEOUT)
        seconds = time.perf_counter() - started
        got = self.b.inbox.get(message.round).get("a")
        if got is None or got.payload_bytes != message.payload_bytes:
            raise RuntimeError(f"round {message.round} did not arrive in b's inbox")
        return seconds

    def drop(self) -> None:
        """Free what b received, so the next push does not find it still allocated."""
        self.b.inbox.discard_before(self.round + 1)

    async def stop(self) -> None:
        await self.a.stop(grace=0)
        await self.b.stop(grace=0)


# ----------------------------------------------------------------------------- memory
_STATUS = "/proc/self/status"


def _status_kib(field: str) -> int | None:
    try:
        with open(_STATUS) as f:
            m = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return _status_kib("VmHWM") is not None


class PeakRss:
    """Peak RSS growth (bytes) of the process over one ``with`` block."""

    exact = False
    growth = 0

    def __enter__(self) -> PeakRss:
        gc.collect()
        self.exact = _reset_peak()
        self.before = _status_kib("VmRSS") if self.exact else _maxrss_kib()
        return self

    def __exit__(self, *exc: object) -> None:
        after = _status_kib("VmHWM") if self.exact else _maxrss_kib()
        self.growth = max(0, ((after or 0) - (self.before or 0)) * 1024)


def _maxrss_kib() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux


# ----------------------------------------------------------------------------- one size
def _state(p: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(p)
    return {"omega": torch.rand(p, generator=g), "x": torch.rand(p, generator=g)}


async def measure_size(size_mb: int, repeats: int) -> dict[str, Any]:
    """Everything for one size, in this process (the parent runs it in a fresh child)."""
    size_bytes = size_mb * MB
    if size_bytes % 8:
        raise ValueError("size must be a whole number of 8-byte pairs")
    p = size_bytes // 8
    rss_start = _status_kib("VmRSS")
    tensors = _state(p)
    pair = Pair(p)
    sink = RawSink()
    await pair.start()
    sender = RawSender(f"127.0.0.1:{await sink.start()}")
    await sender.push(4 * MB)  # connect the raw channel (the pair connected in its handshake)

    times: dict[str, list[float]] = {"raw": [], "dacflnode": [], "cached": []}
    peaks: dict[str, list[int]] = {"raw": [], "dacflnode": [], "cached": []}
    exact: list[bool] = []
    for k in range(repeats):
        message = RoundMessage("a", k + 1, 1, tensors)
        with PeakRss() as rss:
            times["dacflnode"].append(await pair.push(message))
        peaks["dacflnode"].append(rss.growth)
        exact.append(rss.exact)
        pair.drop()
        with PeakRss() as rss:
            times["cached"].append(await pair.push(message))  # same message: checksum cached
        peaks["cached"].append(rss.growth)
        pair.drop()
        with PeakRss() as rss:
            times["raw"].append(await sender.push(size_bytes))
        peaks["raw"].append(rss.growth)
        del message

    await sender.close()
    await sink.stop()
    await pair.stop()
    steps = cpu_steps(tensors)

    def rate(kind: str) -> float:
        return size_mb / statistics.median(times[kind])

    return {
        "size_mb": size_mb,
        "payload_bytes": size_bytes,
        "elements_per_tensor": p,
        "seconds": times,
        "mb_s": {kind: rate(kind) for kind in times},
        "ratio": rate("dacflnode") / rate("raw"),
        "ratio_cached": rate("cached") / rate("raw"),
        "cpu_steps_s": steps,
        "checksum_mb_s": size_mb / steps["xxh3"],
        "peak_rss_growth_bytes": {kind: max(v) for kind, v in peaks.items()},
        "peak_rss_growth_x_state": {kind: max(v) / size_bytes for kind, v in peaks.items()},
        "rss_exact": all(exact),
        "rss_at_start_mb": (rss_start or 0) / 1024,
    }


def cpu_steps(tensors: dict[str, torch.Tensor]) -> dict[str, float]:
    """Seconds of the single-threaded work dacflnode adds to the bytes gRPC moves, step by
    step, without a network: the sender's header (no pass over the payload), serialising the
    chunks and the trailer (one copy and one hash of each chunk), parsing them and writing them
    into the receive buffer (copy, hash, float sum; the buffer comes from a pool, as in a
    receiver's second and later rounds), and the receiver's final checks
    (:meth:`Decoder.finish`). Over gRPC the sender's and the receiver's per-chunk work run in
    worker threads, overlapping the transfer. ``xxh3``: one XXH3-128 pass over the payload,
    for reference."""
    message = RoundMessage("a", 0, 1, tensors)
    started = time.perf_counter()
    checksum(list(payload_slices(message)))
    xxh3 = time.perf_counter() - started
    started = time.perf_counter()
    header = make_header(message)
    sender_hash = time.perf_counter() - started
    expect = Expectation(senders={"a"}, tensors={n: tuple(t.shape) for n, t in tensors.items()})
    pool = BufferPool()
    warm = Decoder(expect, pool=pool)
    warm.header(header)
    for raw in serialized_chunks(message):  # the pool's buffer, faulted in once
        warm.take(parse_chunk(raw))
    warm.finish()
    del warm
    decoder = Decoder(expect, pool=pool)
    decoder.header(header)
    encode = decode = 0.0
    stream = serialized_chunks(message)
    while True:
        t0 = time.perf_counter()
        data = next(stream, None)
        if data is None:
            break
        t1 = time.perf_counter()
        decoder.take(parse_chunk(data))
        t2 = time.perf_counter()
        encode += t1 - t0
        decode += t2 - t1
    started = time.perf_counter()
    decoder.finish()
    receiver_hash = time.perf_counter() - started
    return {"sender_hash": sender_hash, "sender_encode": encode, "receiver_decode": decode,
            "receiver_hash": receiver_hash, "xxh3": xxh3,
            "total": sender_hash + encode + decode + receiver_hash}


# ----------------------------------------------------------------------------- driver
def run_child(size_mb: int, repeats: int) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", str(size_mb),
           "--repeats", str(repeats)]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(results: list[dict[str, Any]]) -> str:
    head = (f"{'size MB':>8} {'raw MB/s':>9} {'dacfl MB/s':>10} {'ratio':>6} "
            f"{'cached MB/s':>11} {'ratio':>6} {'hash MB/s':>12} "
            f"{'peak RSS growth (dacfl)':>24}")
    lines = [head, "-" * len(head)]
    for r in results:
        grow = r["peak_rss_growth_bytes"]["dacflnode"]
        lines.append(
            f"{r['size_mb']:>8} {r['mb_s']['raw']:>9.0f} {r['mb_s']['dacflnode']:>10.0f} "
            f"{r['ratio']:>6.2f} {r['mb_s']['cached']:>11.0f} {r['ratio_cached']:>6.2f} "
            f"{r['checksum_mb_s']:>12.0f} "
            f"{grow / MB:>12.0f} MB = {r['peak_rss_growth_x_state']['dacflnode']:.2f}x")
    lines += ["", "dacflnode's own CPU work per push, single-threaded, no network (seconds):",
              f"{'size MB':>8} {'header':>11} {'encode':>7} {'decode':>7} "
              f"{'finish':>9} {'sum':>6} {'raw push':>8} {'dacfl push':>10}"]
    for r in results:
        c = r["cpu_steps_s"]
        lines.append(
            f"{r['size_mb']:>8} {c['sender_hash']:>11.3f} {c['sender_encode']:>7.3f} "
            f"{c['receiver_decode']:>7.3f} {c['receiver_hash']:>9.3f} {c['total']:>6.3f} "
            f"{statistics.median(r['seconds']['raw']):>8.3f} "
            f"{statistics.median(r['seconds']['dacflnode']):>10.3f}")
    return "\n".join(lines)


#: The sizes (MB) the target is held to.
TARGET_SIZES = (6, 64)
QUICK_SIZES, QUICK_REPEATS = "6,13,64", 3


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures held to the target: over the sizes from 6 to 64 MB (all sizes if none is
    in that range), the smallest dacflnode / raw rate and the largest peak RSS growth."""
    lo, hi = TARGET_SIZES
    held = [r for r in results if lo <= r["size_mb"] <= hi] or results
    return {
        "ratio": min(r["ratio"] for r in held),
        "ratio_sizes_mb": [r["size_mb"] for r in held],
        "per_size": {
            str(r["size_mb"]): {
                "raw_mb_s": round(r["mb_s"]["raw"], 1),
                "dacflnode_mb_s": round(r["mb_s"]["dacflnode"], 1),
                "cached_mb_s": round(r["mb_s"]["cached"], 1),
                "ratio": round(r["ratio"], 3),
                "ratio_cached": round(r["ratio_cached"], 3),
                "peak_rss_growth_x_state": round(r["peak_rss_growth_x_state"]["dacflnode"], 3),
                "raw_peak_rss_growth_x_state": round(r["peak_rss_growth_x_state"]["raw"], 3),
            } for r in results
        },
        "peak_rss_growth_x_state": max(r["peak_rss_growth_x_state"]["dacflnode"] for r in held),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default=None,
                    help="MB (2**20 bytes) of state per node, comma-separated (default "
                         f"6,13,64,400; --quick: {QUICK_SIZES})")
    ap.add_argument("--repeats", type=int, default=None,
                    help=f"pushes of each kind per size (default 5; --quick: {QUICK_REPEATS})")
    add_standard_args(ap)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    repeats = args.repeats or (QUICK_REPEATS if args.quick else 5)
    if repeats < 1:
        ap.error("--repeats must be >= 1")

    if args.child is not None:
        print(json.dumps(asyncio.run(measure_size(args.child, repeats))))
        return 0

    sizes = [int(s) for s in (args.sizes or (QUICK_SIZES if args.quick else "6,13,64,400"))
             .split(",") if s.strip()]
    info = machine()
    results = [run_child(size, repeats) for size in sizes]
    if not args.json:
        print(f"machine: {info['cpus']} CPUs, {info['platform']}, grpc {grpc.__version__}, "
              f"loadavg {info['loadavg']}; {repeats} repeats, median")
        print(table(results))
        print("cached = the same message pushed again (the sender's checksum cached by its first "
              "stream, as for a node's further neighbours).")
        print("RSS growth includes the receiver's own copy of the state (1.00x), since both "
              "nodes share this process.")
    figures = summary(results)
    emit_result("exchange", figures.pop("ratio"), 1.0, True, as_json=args.json,
                machine_at_start=info, repeats=repeats, grpc=grpc.__version__, **figures,
                results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
