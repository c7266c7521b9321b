#!/usr/bin/env python3
"""Round time of compressed DACFL on slow links: 5 daemons, one per network namespace.

Every node is a real ``dacflnode start`` in its own Linux network namespace, with one interface
``eth0`` (``10.<a>.<b>.<i+1>/24``), the end of a veth pair whose other end is a port of a bridge
in a hub namespace. Each node's uplink (what its ``eth0`` sends) is shaped to ``--rate`` (10
Mbit/s), with ``netem rate R delay D`` where the kernel has ``sch_netem`` and ``tbf rate R burst
32kb latency 400ms`` (rate only; the delay is skipped and the output says so) where it has not;
``--shape both`` shapes the hub's end of each veth (the node's downlink) too. The graph is a
ring (degree 2, the degree the issue's "21 s per round on a 10 Mbit/s uplink" figure assumes):
every node sends its round message to two neighbours over one shaped uplink.

The run: the paper's CNN (``fmnist-cnn``, 1 663 754 parameters; 13.3 MB of ``omega`` + ``x``
per neighbour uncompressed) on Fashion-MNIST from ``/usr/share/datasets/fashion-mnist`` (or
synthetic images of the same shape where it is missing), i.i.d., DACFL, ``--local-steps`` (2)
mini-batches of 20 a round so that the link, not training, dominates, ``--rounds`` rounds; then
the same cluster again for each compressor of ``--compressors`` (``none``, ``int8``,
``topk:0.01``), one after the other in the same namespaces, in this one run. Evaluation runs only
after the last round, on ``--eval-samples`` test images.

Per compressor, from the nodes' ``metrics.jsonl`` lines of rounds 2 … R−1 (round 1 is left out:
it includes the first dial of every neighbour and the first training step's allocations, and a
node that finished loading its data first waits there for the slowest; round R evaluates, the
same work whatever the link carries, and is reported apart): the median round time
(``seconds``), the median ``exchange_s`` and ``train_s``, the payload bytes a node sent per round
(``bytes_sent``, the median), the time those bytes need at the link rate (``wire_s``: the floor
a round cannot beat), and the bytes that really left each node's ``eth0`` per round (IP + TCP +
HTTP/2 + gRPC framing included) against the payload, the same bytes sent as plain TCP over the
same links (``raw_tcp_ring_s``), and the time and link bytes of the closing exchanges after the
last round. ``ratio`` (``--json``) = median round time of ``none`` ÷ that of ``topk:0.01``,
target ≥ 3.0 (issue 18); ``none`` ÷ ``int8`` is in ``speedup``. A compressor whose cluster
fails is reported in ``failed`` with its error (no ratio without ``topk:0.01``: 0, not met).

``--quick``: 4 rounds per compressor (rounds 2 and 3 measured), a smaller evaluation; about 8
minutes on 2 cores, most of it the uncompressed rounds (≈ 21 s each at 10 Mbit/s), their
closing exchanges and the daemons' start-up. Needs root, ``ip`` and ``tc`` (iproute2); every
namespace it creates carries the process id in its name and is deleted on exit, also on Ctrl-C,
SIGTERM and errors.

    sudo .venv/bin/python benchmarks/bench_slow_links.py --quick --json
    sudo .venv/bin/python benchmarks/bench_slow_links.py --rounds 6 --keep /tmp/slow-links
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from _common import add_standard_args, emit_result
from _netns import COMMAND_TIMEOUT, LabError, hosts, link_bytes, sh, start_daemon

from dacflnode.config import RunConfig
from dacflnode.peers.generate import generate_cluster
from dacflnode.records.metrics_log import read_metrics

DATA = Path("/usr/share/datasets/fashion-mnist")
COMPRESSORS = ("none", "int8", "topk:0.01")
SUBJECT, TARGET = "topk:0.01", 3.0
TBF_BURST, TBF_LATENCY = "32kb", "400ms"


@dataclass
class Lab:
    namespaces: list[str]  # node i runs in namespaces[i] ...
    ips: list[str]  # ... at ips[i], on eth0
    netem: bool  # False: the kernel has no sch_netem, links are shaped by tbf (rate only)
    qdisc: str  # the qdisc line of a node's eth0, as tc shows it


def shape(ns: str, dev: str, rate: str, delay_ms: float) -> bool:
    """Limit what ``dev`` of ``ns`` sends to ``rate``: netem (with the delay) where the kernel has
    it, else tbf (rate only). Returns whether netem was used."""
    try:
        netem = ["netem", "rate", rate]
        if delay_ms > 0:
            netem += ["delay", f"{delay_ms}ms"]
        sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", *netem)
        return True
    except RuntimeError as exc:
        if "unknown" not in str(exc).lower():
            raise
    sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
       "burst", TBF_BURST, "latency", TBF_LATENCY)
    return False


@contextmanager
def lab(prefix: str, subnet: str, nodes: int, rate: str, delay_ms: float,
        downlink: bool) -> Iterator[Lab]:
    """``nodes`` namespaces ``{prefix}-n{i}`` at ``{subnet}.{i + 1}/24``, bridged in
    ``{prefix}-hub`` (:func:`_netns.hosts`), each node's ``eth0`` (and with ``downlink`` the
    hub's end of its veth too) shaped to ``rate``; every namespace (and with it every link) is
    deleted on exit, whatever ends the block."""
    with hosts(prefix, subnet, nodes, tools=("ip", "tc")) as made:
        netem = []
        for i, ns in enumerate(made.namespaces):
            netem.append(shape(ns, "eth0", rate, delay_ms))  # the node's uplink
            if downlink:
                netem.append(shape(made.hub, f"port{i}", rate, delay_ms))  # its downlink
        qdisc = sh("tc", "-n", made.namespaces[0], "qdisc", "show", "dev", "eth0").strip()
        yield Lab(made.namespaces, made.ips, all(netem), qdisc)


def link_tx(ns: str) -> int:
    """Bytes ``eth0`` of ``ns`` has sent so far."""
    return link_bytes(ns)[0]


def rate_bits(rate: str) -> float:
    """tc's ``10mbit`` / ``500kbit`` / ``1gbit`` as bits per second."""
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1.0}
    text = rate.strip().lower()
    for unit, factor in units.items():
        if text.endswith(unit):
            return float(text[: -len(unit)]) * factor
    raise argparse.ArgumentTypeError(f"--rate {rate!r}: give it as tc does, e.g. 10mbit")


def run_config(args: argparse.Namespace, compression: str) -> RunConfig:
    real = args.data.is_dir() and not args.synthetic
    common: dict[str, Any] = dict(
        algorithm=("dacfl",), nodes=args.nodes, rounds=args.rounds, model="fmnist-cnn",
        lr=0.001, batch_size=20, local_steps=args.local_steps, seed=args.seed,
        compression=compression, eval_every=args.rounds, eval_samples=args.eval_samples,
        device="cpu", threads=1,
    )
    if real:
        return RunConfig(dataset="fashion-mnist", data_root=str(args.data), **common)
    return RunConfig(dataset="synthetic", synthetic_train=200 * args.nodes,
                     synthetic_test=args.eval_samples, **common)


def run_cluster(args: argparse.Namespace, lab_: Lab, compression: str, root: Path,
                ports: tuple[int, int]) -> dict[str, Any]:
    """One cluster of daemons with ``compression``, to its end; its per-round figures."""
    cfg = run_config(args, compression)
    paths = generate_cluster("ring", args.nodes, cfg, root / "peers", hosts=lab_.ips,
                             ports=[ports[0]] * args.nodes,
                             control_ports=[ports[1]] * args.nodes, state_root=root,
                             round_deadline=args.round_deadline,
                             hello_timeout=args.hello_timeout, insecure=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    tx_before = [link_tx(ns) for ns in lab_.namespaces]
    procs: list[subprocess.Popen[bytes]] = []
    started = time.monotonic()
    deadline = started + args.cluster_timeout
    try:
        for i, (ns, path) in enumerate(zip(lab_.namespaces, paths, strict=True)):
            procs.append(start_daemon(ns, path, root / f"node-{i}.stderr", env))
        # the link counters when every node has written its last round's line: what the
        # rounds sent, apart from the closing exchanges that follow them
        tx_rounds: list[int] | None = None
        rounds_end = None
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if tx_rounds is None and all(
                    len(read_metrics(root / f"node-{i}" / "metrics.jsonl")) >= args.rounds
                    for i in range(args.nodes)):
                tx_rounds = [link_tx(ns) for ns in lab_.namespaces]
                rounds_end = time.monotonic()
            time.sleep(0.5)
        codes = [p.poll() for p in procs]
    finally:
        stop(procs)
    wall = time.monotonic() - started
    tx_end = [link_tx(ns) for ns in lab_.namespaces]
    if tx_rounds is None or rounds_end is None:  # a node failed: reported below
        tx_rounds, rounds_end = tx_end, time.monotonic()
    tx = [a - b for a, b in zip(tx_rounds, tx_before, strict=True)]
    closing_tx = [a - b for a, b in zip(tx_end, tx_rounds, strict=True)]
    for i, code in enumerate(codes):
        if code != 0:
            tail = (root / f"node-{i}.stderr").read_text()[-2000:]
            raise RuntimeError(f"{compression}: node-{i} "
                               f"{'did not finish in time' if code is None else f'exited {code}'}"
                               f" (stderr in {root}/node-{i}.stderr):\n{tail}")
    row = summarize(args, compression, root, wall, tx)
    row["closing_s"] = round(wall - (rounds_end - started), 1)
    row["closing_link_mb_per_node"] = round(statistics.median(closing_tx) / 2**20, 2)
    per_neighbour = row["bytes_sent_per_round"] // 2  # a ring: two neighbours
    raw = raw_ring(lab_, per_neighbour, ports[0] + 5)
    row["raw_tcp_ring_s"] = round(raw, 3)
    return row


RAW_NODE = """
import socket, sys, threading, time
port, size, peers = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", port))
srv.listen(8)
print("listening", flush=True)
sys.stdin.readline()
got = []
def serve():
    conn, _ = srv.accept()
    n = 0
    while True:
        b = conn.recv(1 << 20)
        if not b:
            break
        n += len(b)
    got.append(n)
def send(host):
    for _ in range(200):
        try:
            s = socket.create_connection((host, port), timeout=60)
            break
        except OSError:
            time.sleep(0.05)
    s.sendall(bytes(size))
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
    s.close()
t0 = time.perf_counter()
threads = [threading.Thread(target=serve) for _ in peers]
threads += [threading.Thread(target=send, args=(h,)) for h in peers]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(time.perf_counter() - t0, sum(got), flush=True)
"""


def raw_ring(lab_: Lab, size: int, port: int) -> float:
    """The same exchange as plain TCP: every node sends ``size`` bytes to each of its two ring
    neighbours at once over the same shaped links (one connection each, no framing); the median
    over nodes of the time until a node has received both and sent both."""
    n = len(lab_.namespaces)
    procs: list[subprocess.Popen[str]] = []
    try:
        for i, ns in enumerate(lab_.namespaces):
            peers = [lab_.ips[(i + 1) % n], lab_.ips[(i - 1) % n]]
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, "-c", RAW_NODE, str(port),
                 str(size), *peers], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "listening":
                raise RuntimeError("a raw TCP ring node did not start")
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        times = []
        for p in procs:
            out, _ = p.communicate(timeout=600)
            seconds, received = out.split()
            if int(received) != 2 * size:
                raise RuntimeError(f"raw TCP ring: received {received} bytes, not {2 * size}")
            times.append(float(seconds))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=COMMAND_TIMEOUT)
    return float(statistics.median(times))


def stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Terminate the daemons this run started that are still running, then kill them."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=COMMAND_TIMEOUT)


def summarize(args: argparse.Namespace, compression: str, root: Path, wall: float,
              tx: list[int]) -> dict[str, Any]:
    lines = [read_metrics(root / f"node-{i}" / "metrics.jsonl") for i in range(args.nodes)]
    for i, node in enumerate(lines):
        if [m["round"] for m in node] != list(range(1, args.rounds + 1)):
            raise RuntimeError(f"{compression}: node-{i} wrote rounds "
                               f"{[m['round'] for m in node]}, not 1..{args.rounds}")
        missing = [m["round"] for m in node if m["neighbours_missing"]]
        if missing:
            raise RuntimeError(f"{compression}: node-{i} mixed without a neighbour in rounds "
                               f"{missing}: raise --round-deadline")
    last = measured_last(args.rounds)
    measured = [m for node in lines for m in node if 2 <= m["round"] <= last]

    def median(key: str) -> float:
        return float(statistics.median(float(m[key]) for m in measured))

    sent = median("bytes_sent")
    payload_total = sum(int(m["bytes_sent"]) for node in lines for m in node)
    accuracy = [node[-1]["accuracy"] for node in lines]
    return {
        "compression": compression,
        "round_s": round(median("seconds"), 3),
        "round_s_per_round": [round(statistics.median(float(node[r]["seconds"])
                                                      for node in lines), 3)
                              for r in range(args.rounds)],
        "exchange_s": round(median("exchange_s"), 3),
        "train_s": round(median("train_s"), 3),
        "bytes_sent_per_round": int(sent),
        "wire_s": round(sent * 8 / rate_bits(args.rate), 3),
        "link_bytes_per_payload_byte": round(sum(tx) / payload_total, 4) if payload_total else None,
        "accuracy": round(statistics.mean(float(a) for a in accuracy), 4)
        if all(a is not None for a in accuracy) else None,
        "last_round_s": round(statistics.median(float(node[-1]["seconds"]) for node in lines), 3),
        "wall_s": round(wall, 1),
    }


def measured_last(rounds: int) -> int:
    """The last measured round: the one before the last, which also evaluates (evaluation is
    the same work whatever crosses the link), where at least round 2 stays."""
    return rounds - 1 if rounds >= 3 else rounds


def table(rows: list[dict[str, Any]], lab_: Lab, args: argparse.Namespace) -> None:
    shaping = ("netem" if lab_.netem else
               "tbf (the kernel has no sch_netem: rate only, no delay or loss)")
    links = "every node's uplink" if args.shape == "uplink" else "both ends of every veth"
    print(f"{args.nodes} daemons in network namespaces, ring, {links} at {args.rate} "
          f"via {shaping}")
    print(f"  node eth0: {lab_.qdisc}")
    data = ("Fashion-MNIST" if run_config(args, "none").dataset == "fashion-mnist"
            else "synthetic 1x28x28 images")
    print(f"fmnist-cnn, {data}, {args.local_steps} local steps of 20, "
          f"{args.rounds} rounds per compressor; medians over nodes, rounds "
          f"2..{measured_last(args.rounds)}")
    head = (f"{'compression':>12} {'round s':>8} {'exchange s':>10} {'train s':>8} "
            f"{'MB sent/round':>13} {'wire s':>7} {'raw TCP s':>9} {'link/payload':>12} "
            f"{'closing s':>9} {'none ÷':>7}")
    print(head)
    base = rows[0]["round_s"]
    for r in rows:
        print(f"{r['compression']:>12} {r['round_s']:>8.2f} {r['exchange_s']:>10.2f} "
              f"{r['train_s']:>8.2f} {r['bytes_sent_per_round'] / 2**20:>13.3f} "
              f"{r['wire_s']:>7.2f} {r['raw_tcp_ring_s']:>9.2f} "
              f"{r['link_bytes_per_payload_byte'] or 0:>12.3f} {r['closing_s']:>9.1f} "
              f"{base / r['round_s']:>6.2f}x")


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="DACFL round time over rate-limited links: 5 dacflnode daemons, one per "
                    "network namespace, a ring, each compressor against none in the same run "
                    "(needs root and iproute2).",
        epilog="example: sudo .venv/bin/python benchmarks/bench_slow_links.py --quick --json",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_standard_args(parser)
    parser.add_argument("--nodes", type=int, default=5, help="daemons, one per namespace")
    parser.add_argument("--rounds", type=int, default=6,
                        help="rounds per compressor (4 with --quick); round 1 and the last,"
                             " evaluating round are not measured")
    parser.add_argument("--local-steps", type=int, default=2,
                        help="mini-batches of 20 a node trains per round")
    parser.add_argument("--compressors", default=",".join(COMPRESSORS),
                        help="comma-separated values of the compression setting; none first")
    parser.add_argument("--rate", default="10mbit", help="link rate (tc units)")
    parser.add_argument("--shape", choices=("uplink", "both"), default="uplink",
                        help="uplink: each node's eth0 sends at --rate (an edge uplink; the "
                             "hub forwards freely); both: the hub's end of each veth too")
    parser.add_argument("--delay-ms", type=float, default=20.0,
                        help="one-way delay per veth end where the kernel has netem (skipped, "
                             "and said so, where it has not)")
    parser.add_argument("--eval-samples", type=int, default=1000,
                        help="test images each node evaluates after its last round")
    parser.add_argument("--round-deadline", type=float, default=240.0,
                        help="the daemons' round deadline, seconds")
    parser.add_argument("--hello-timeout", type=float, default=240.0,
                        help="the daemons' hello timeout, seconds")
    parser.add_argument("--cluster-timeout", type=float, default=900.0,
                        help="seconds one cluster may take from start to exit")
    parser.add_argument("--data", type=Path, default=DATA, help="Fashion-MNIST IDX folder")
    parser.add_argument("--synthetic", action="store_true",
                        help="synthetic images of Fashion-MNIST's shape even where it is "
                             "installed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, default=None,
                        help="write the daemons' state folders here and keep them")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = 4
        args.eval_samples = min(args.eval_samples, 500)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2: round 1 is not measured")
    args.compressors = [c.strip() for c in args.compressors.split(",") if c.strip()]
    if args.compressors[0] != "none":
        parser.error("--compressors must start with none, the baseline")
    rate_bits(args.rate)
    return args


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, on_sigterm)  # so that the namespaces are deleted then too
    pid = os.getpid()
    prefix = f"slk{pid}"
    subnet = f"10.{200 + pid % 50}.{(pid // 50) % 250}"
    holder = tempfile.TemporaryDirectory(prefix="slow-links-") if args.keep is None else None
    root = Path(holder.name) if holder is not None else args.keep
    root.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    try:
        with lab(prefix, subnet, args.nodes, args.rate, args.delay_ms,
                 args.shape == "both") as made:
            if not made.netem:
                print(f"note: this kernel has no netem qdisc (sch_netem): links are shaped by "
                      f"tbf at {args.rate}, rate only; --delay-ms {args.delay_ms:g} and loss "
                      f"are skipped", file=sys.stderr, flush=True)
            for k, compression in enumerate(args.compressors):
                out = root / compression.replace(":", "-")
                try:
                    rows.append(run_cluster(args, made, compression, out,
                                            (7000 + 10 * k, 8000 + 10 * k)))
                except RuntimeError as exc:  # keep the other compressors' figures
                    rows.append({"compression": compression, "error": str(exc)[:4000]})
                print(f"{compression}: {rows[-1]}", file=sys.stderr, flush=True)
            if not args.json:
                table([r for r in rows if "error" not in r], made, args)
            netem, qdisc = made.netem, made.qdisc
    except LabError as exc:
        print(f"bench_slow_links: {exc}", file=sys.stderr)
        return 2
    finally:
        if holder is not None:
            holder.cleanup()
    if SUBJECT not in args.compressors:
        print(f"bench_slow_links: no ratio without {SUBJECT} in --compressors", file=sys.stderr)
        return 2
    failed = {r["compression"]: r["error"] for r in rows if "error" in r}
    base = rows[0].get("round_s")
    speedup = {r["compression"]: round(base / r["round_s"], 3) for r in rows[1:]
               if base is not None and "round_s" in r}
    for compression, error in failed.items():
        print(f"bench_slow_links: {compression} failed: {error}", file=sys.stderr)
    # a failed run has no ratio: reported as 0 (target not met), the error in "failed"
    emit_result("slow_links", speedup.get(SUBJECT, 0.0), TARGET, True, as_json=args.json,
                failed=failed,
                rows=rows, speedup=speedup, nodes=args.nodes, graph="ring", rate=args.rate,
                netem=netem, delay_ms=args.delay_ms if netem else None, qdisc=qdisc,
                rounds=args.rounds, local_steps=args.local_steps, shape=args.shape,
                measured_rounds=f"2..{measured_last(args.rounds)}",
                dataset=run_config(args, "none").dataset)
    return 0


if __name__ == "__main__":
    sys.exit(main())
