"""What the daemon adds to a round, beyond the training and the bytes it has to move.

Builds ``--nodes`` complete nodes in one process, the way ``dacflnode.daemon.service.build_node``
assembles them (a data share, the model seeded alike on every node, a
:class:`~dacflnode.learning.train.LocalTrainer`, a :class:`~dacflnode.protocol.setup.NodeSetup`
with a ``state_dir`` in a temporary folder, so metrics lines and checkpoints are written every
round), connects them over :class:`~dacflnode.transport.grpc_transport.GrpcTransport` on
127.0.0.1 (2 nodes: one edge; more: a ring) and times ``--rounds`` rounds (exchange, mix,
training in a thread, complete, evaluation, persistence) until the last node's checkpoint of
each round is written.

The raw cost of the same nodes is measured with fresh trainers built the same way, in the same
process and with the same concurrency: per round, every directed edge sends the same number of
bytes as the daemon's round message over the raw gRPC method of ``bench_exchange.py``
(concurrently), then every node's ``LocalTrainer.train`` runs (concurrently, one thread each,
as the runners do), then, on the runner's evaluation schedule, every node's ``evaluate``.

Daemon rounds are driven one at a time (``NodeRunner.run_round`` for every node, what
``NodeRunner.run`` loops over, after the same handshake) and interleaved with the raw rounds,
alternating which goes first, so that drift in other load on the machine hits both sides alike:

    overhead = daemon time / (train + transfer + evaluation) - 1

(``overhead_vs_train_transfer`` leaves the evaluation out of the baseline, i.e. counts it as
overhead too.)

The result's ``ratio`` is daemon time / (train + transfer + evaluation), i.e. ``1 + overhead``;
the target is ≤ 1.05.

Usage: ``python benchmarks/bench_round_overhead.py --nodes 2 --rounds 5 --model fmnist-cnn
--samples 2000 [--json]``; ``--quick`` (4 rounds of 400 samples per node, 200 evaluation samples)
runs in well under a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import torch
from _common import add_standard_args, emit_result, machine
from bench_exchange import RawSender, RawSink

from dacflnode.algorithms.rounds import NodeState, make_algorithm
from dacflnode.learning.datasets import DATASETS, Dataset, load_dataset
from dacflnode.learning.models import build_model
from dacflnode.learning.train import LocalTrainer, TrainConfig, evaluate
from dacflnode.protocol.runner import NodeRunner
from dacflnode.protocol.setup import NodeSetup, RoundReport
from dacflnode.protocol.training import ThreadedTrainer
from dacflnode.transport.base import Identity
from dacflnode.transport.grpc_transport import GrpcTransport

RUN_FINGERPRINT = "bench-round-overhead"


def neighbours(i: int, n: int) -> list[str]:
    """Node ``i``'s neighbours: the other node for two, a ring for more."""
    return sorted({f"node-{(i - 1) % n}", f"node-{(i + 1) % n}"} - {f"node-{i}"})


@dataclass
class Data:
    dataset: Dataset
    shares: list[tuple[torch.Tensor, torch.Tensor]]
    test_x: torch.Tensor
    test_y: torch.Tensor


def load_data(args: argparse.Namespace) -> Data:
    need = args.nodes * args.samples
    ds = load_dataset(args.dataset, args.data_root, synthetic_train=need,
                      synthetic_test=args.eval_samples, seed=args.seed)
    if len(ds.train_y) < need:
        raise SystemExit(f"{args.dataset} has {len(ds.train_y)} training samples, "
                         f"{args.nodes} x {args.samples} are needed")
    s = args.samples
    shares = [(ds.train_x[i * s:(i + 1) * s], ds.train_y[i * s:(i + 1) * s])
              for i in range(args.nodes)]
    return Data(ds, shares, ds.test_x[:args.eval_samples], ds.test_y[:args.eval_samples])


def make_trainer(args: argparse.Namespace, data: Data, index: int,
                 cfg: TrainConfig | None = None) -> LocalTrainer:
    torch.manual_seed(args.seed)  # every node starts from the same model, as in a run
    model = build_model(args.model, data.dataset.input_shape, data.dataset.num_classes)
    x, y = data.shares[index]
    return LocalTrainer(model, x, y, cfg or TrainConfig(batch_size=args.batch_size),
                        seed=args.seed, node_index=index)


def evaluated(done: int, args: argparse.Namespace) -> bool:
    """Whether the runner evaluates after ``done`` rounds (its own rule)."""
    return done % args.eval_every == 0 or done == args.rounds


# ----------------------------------------------------------------------------- daemon
class DaemonNodes:
    """``--nodes`` NodeRunners over GrpcTransports, driven one round at a time."""

    def __init__(self, args: argparse.Namespace, data: Data, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.runners: dict[str, NodeRunner] = {}
        self.transports: list[GrpcTransport] = []
        self.reports: dict[str, list[RoundReport]] = {}
        for i in range(args.nodes):
            node_id = f"node-{i}"
            nbrs = neighbours(i, args.nodes)
            algorithm = make_algorithm(args.algorithm)
            trainer = make_trainer(args, data, i)
            layout = trainer.layout
            identity = Identity(node_id, layout.fingerprint(), RUN_FINGERPRINT)
            transport = partial(GrpcTransport, identity, "127.0.0.1:0", {},
                                tensors={name: (layout.numel,) for name in algorithm.exchanged})
            state_dir = tmp / node_id
            state_dir.mkdir(parents=True)
            setup = NodeSetup(
                node_id=node_id, neighbours=nbrs, algorithm=algorithm,
                trainer=ThreadedTrainer(trainer, data.test_x, data.test_y), layout=layout,
                rounds=args.rounds,
                eval_every=args.eval_every, round_deadline=600.0, hello_timeout=60.0,
                state_dir=state_dir,
                run_info={"run_fingerprint": RUN_FINGERPRINT,
                          "model_fingerprint": identity.model_fingerprint, "node": node_id},
            )
            runner = NodeRunner(setup, transport,
                                NodeState.initial(layout.flatten_module(trainer.model)))
            self.reports[node_id] = []
            runner.on_round = self.reports[node_id].append  # called after the checkpoint
            self.runners[node_id] = runner
            self.transports.append(cast(GrpcTransport, runner.transport))
        self.payload_bytes = layout.numel * 4 * len(algorithm.exchanged)

    async def start(self) -> None:
        for t in self.transports:
            await t.start()
        ports = {t.identity.node_id: t.port for t in self.transports}
        for t in self.transports:
            for peer in self.runners[t.identity.node_id].setup.neighbours:
                t.peers[peer] = f"127.0.0.1:{ports[peer]}"
        # handshake (connects every channel) before any clock starts, as NodeRunner.run does
        await asyncio.gather(*(r.wait_for_neighbours() for r in self.runners.values()))

    async def round(self, t: int) -> float:
        """Round ``t`` of every node, as :meth:`NodeRunner.run` runs it; seconds until the
        last node has written its checkpoint."""
        started = time.perf_counter()
        await asyncio.gather(*(r.run_round(t) for r in self.runners.values()))
        return time.perf_counter() - started

    async def stop(self) -> None:
        for t in self.transports:
            await t.stop(grace=0)
        if any(r.round != self.args.rounds for r in self.runners.values()):
            raise RuntimeError("a node did not complete its rounds")

    def summary(self) -> dict[str, Any]:
        return {
            "state_files": sorted(p.name for p in (self.tmp / "node-0").iterdir()),
            # what the runners measured themselves, per node, summed over the rounds
            # (round_s stops before the checkpoint is written)
            "node_reports": {node: {"exchange_s": sum(r.exchange_s for r in rs),
                                    "train_s": sum(r.train_s for r in rs),
                                    "round_s": sum(r.seconds for r in rs),
                                    "accuracy_last": rs[-1].accuracy}
                             for node, rs in self.reports.items()},
        }


# ----------------------------------------------------------------------------- raw
class RawNodes:
    """The same nodes' raw work: raw gRPC transfers, LocalTrainer.train, evaluate."""

    def __init__(self, args: argparse.Namespace, data: Data, payload_bytes: int) -> None:
        self.args = args
        self.data = data
        self.payload_bytes = payload_bytes
        self.trainers = [make_trainer(args, data, i) for i in range(args.nodes)]
        self.flats = [t.layout.flatten_module(t.model) for t in self.trainers]
        self.sinks = [RawSink() for _ in range(args.nodes)]
        self.senders: list[RawSender] = []

    async def start(self) -> None:
        ports = [await s.start() for s in self.sinks]
        n = self.args.nodes
        self.senders = [RawSender(f"127.0.0.1:{ports[int(j.split('-')[1])]}")
                        for i in range(n) for j in neighbours(i, n)]
        await asyncio.gather(*(s.push(1 << 20) for s in self.senders))  # connect

    async def round(self, r: int) -> dict[str, float]:
        data = self.data
        t0 = time.perf_counter()
        await asyncio.gather(*(s.push(self.payload_bytes) for s in self.senders))
        t1 = time.perf_counter()
        results = await asyncio.gather(*(asyncio.to_thread(t.train, self.flats[i], r)
                                         for i, t in enumerate(self.trainers)))
        self.flats = [res.flat for res in results]
        t2 = time.perf_counter()
        if evaluated(r + 1, self.args):
            await asyncio.gather(*(asyncio.to_thread(
                evaluate, t.model, self.flats[i], data.test_x, data.test_y, local=t.local)
                for i, t in enumerate(self.trainers)))
        t3 = time.perf_counter()
        return {"transfer_s": t1 - t0, "train_s": t2 - t1, "eval_s": t3 - t2,
                "seconds": t3 - t0}

    async def stop(self) -> None:
        for s in self.senders:
            await s.close()
        for sink in self.sinks:
            await sink.stop()


# ----------------------------------------------------------------------------- driver
def warm_up(args: argparse.Namespace, data: Data) -> None:
    """A few steps, so neither side pays for the first use of the kernels."""
    cfg = TrainConfig(batch_size=args.batch_size, local_steps=5)
    trainer = make_trainer(args, data, 0, cfg)
    flat = trainer.layout.flatten_module(trainer.model)
    trainer.train(flat, 0)
    evaluate(trainer.model, flat, data.test_x, data.test_y, local=trainer.local)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    data = load_data(args)
    warm_up(args, data)
    daemon_s: list[float] = []
    raw_rounds: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="dacfl-bench-") as tmp:
        daemon = DaemonNodes(args, data, Path(tmp))
        raw = RawNodes(args, data, daemon.payload_bytes)
        await daemon.start()
        await raw.start()
        for r in range(args.rounds):
            # alternate which side goes first, so drift in other load hits both alike
            if r % 2 == 0:
                raw_rounds.append(await raw.round(r))
                daemon_s.append(await daemon.round(r))
            else:
                daemon_s.append(await daemon.round(r))
                raw_rounds.append(await raw.round(r))
        await raw.stop()
        await daemon.stop()
        summary = daemon.summary()
    raw_sum = {k: sum(rr[k] for rr in raw_rounds) for k in raw_rounds[0]}
    total = sum(daemon_s)
    base_tt = raw_sum["train_s"] + raw_sum["transfer_s"]
    paired = [d / rr["seconds"] - 1.0 for d, rr in zip(daemon_s, raw_rounds, strict=True)]
    res = {
        "benchmark": "round_overhead",
        "machine": machine(),
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "numel": daemon.payload_bytes // 4 // len(make_algorithm(args.algorithm).exchanged),
        "payload_bytes": daemon.payload_bytes,
        "daemon": {"seconds": total, "round_s": daemon_s, **summary},
        "raw": {**raw_sum, "rounds": raw_rounds},
        "overhead": total / raw_sum["seconds"] - 1.0,
        "overhead_median_per_round": statistics.median(paired),
        "overhead_per_round": paired,
        "overhead_vs_train_transfer": total / base_tt - 1.0,
    }
    res.update(outside_training(res))
    return res


def outside_training(res: dict[str, Any]) -> dict[str, float]:
    """The daemon's time outside training against the raw transfer + evaluation, as a share of
    the raw total.

    Training is the same code on both sides and by far the longest step, so load on the machine
    that slows it down in one side's rounds swamps the comparison of totals. This takes each
    side's training out (the daemon's as its runners timed it, the slowest node's): what is
    left of the daemon is exchange, mixing, complete, evaluation and checkpointing; of the raw
    side, transfer and evaluation.
    """
    d, raw = res["daemon"], res["raw"]
    train = max(nr["train_s"] for nr in d["node_reports"].values())
    outside = d["seconds"] - train
    raw_outside = raw["transfer_s"] + raw["eval_s"]
    rounds = res["settings"]["rounds"]
    return {
        "daemon_outside_training_s": outside,
        "raw_outside_training_s": raw_outside,
        "added_per_round_s": (outside - raw_outside) / rounds,
        "overhead_outside_training": (outside - raw_outside) / raw["seconds"],
    }


def report(res: dict[str, Any]) -> str:
    s, m, d, raw = res["settings"], res["machine"], res["daemon"], res["raw"]
    r = s["rounds"]
    lines = [
        f"machine: {m['cpus']} CPUs, {m['platform']}, torch {m['torch']}, "
        f"loadavg {m['loadavg']}",
        f"{s['nodes']} nodes, {s['rounds']} rounds, {s['model']} ({res['numel']:,} parameters, "
        f"{res['payload_bytes'] / 2**20:.1f} MB per message), {s['dataset']}, "
        f"{s['samples']} samples/node, batch {s['batch_size']}, eval every {s['eval_every']} "
        f"round(s) on {s['eval_samples']} samples, torch threads {s['torch_threads']}",
        "",
        f"{'':34} {'total s':>8} {'per round s':>11}",
        f"{'daemon (NodeRunner over gRPC)':34} {d['seconds']:>8.2f} {d['seconds'] / r:>11.3f}",
        f"{'raw: train':34} {raw['train_s']:>8.2f} {raw['train_s'] / r:>11.3f}",
        f"{'raw: transfer (raw gRPC)':34} {raw['transfer_s']:>8.2f} "
        f"{raw['transfer_s'] / r:>11.3f}",
        f"{'raw: evaluation':34} {raw['eval_s']:>8.2f} {raw['eval_s'] / r:>11.3f}",
        f"{'raw: sum':34} {raw['seconds']:>8.2f} {raw['seconds'] / r:>11.3f}",
        "",
        f"overhead vs train + transfer + evaluation: {100 * res['overhead']:+.1f}% "
        f"(per round: {', '.join(f'{100 * x:+.1f}%' for x in res['overhead_per_round'])}; "
        f"median {100 * res['overhead_median_per_round']:+.1f}%)",
        f"overhead vs train + transfer only:         "
        f"{100 * res['overhead_vs_train_transfer']:+.1f}%",
        f"time outside training: daemon {res['daemon_outside_training_s']:.2f} s (exchange, "
        f"mix, complete, eval, checkpoint), raw {res['raw_outside_training_s']:.2f} s "
        f"(transfer, eval): +{res['added_per_round_s']:.3f} s per round = "
        f"{100 * res['overhead_outside_training']:+.1f}% of the raw total",
    ]
    for node, nr in d["node_reports"].items():
        lines.append(f"runner's own numbers, {node}: exchange {nr['exchange_s']:.2f} s, "
                     f"train {nr['train_s']:.2f} s, round {nr['round_s']:.2f} s (before "
                     f"checkpoint), final accuracy {nr['accuracy_last']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=None, help="default 5 (quick: 4)")
    ap.add_argument("--model", default="fmnist-cnn")
    ap.add_argument("--samples", type=int, default=None,
                    help="training samples per node (default 2000; quick: 400)")
    ap.add_argument("--dataset", default="fashion-mnist", choices=DATASETS)
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--algorithm", default="dacfl")
    ap.add_argument("--batch-size", type=int, default=20)
    ap.add_argument("--eval-every", type=int, default=None,
                    help="the runner's evaluation schedule (default: --rounds, i.e. only after "
                    "the last round; the daemon's own default is 1)")
    ap.add_argument("--eval-samples", type=int, default=None,
                    help="evaluation samples (default 1000; quick: 200)")
    ap.add_argument("--torch-threads", type=int, default=None,
                    help="torch intra-op threads (default: CPUs / nodes, at least 1)")
    ap.add_argument("--seed", type=int, default=0)
    add_standard_args(ap)
    args = ap.parse_args(argv)
    quick = args.quick
    if args.rounds is None:
        args.rounds = 4 if quick else 5
    if args.samples is None:
        args.samples = 400 if quick else 2000
    if args.eval_samples is None:
        args.eval_samples = 200 if quick else 1000
    if args.eval_every is None:
        args.eval_every = args.rounds
    if args.nodes < 2 or args.rounds < 1 or args.samples < 1 or args.eval_every < 1:
        ap.error("need --nodes >= 2, --rounds >= 1, --samples >= 1, --eval-every >= 1")
    if args.torch_threads is None:
        args.torch_threads = max(1, (os.cpu_count() or 1) // args.nodes)
    torch.set_num_threads(args.torch_threads)
    logging.getLogger("dacflnode").setLevel(logging.WARNING)

    res = asyncio.run(measure(args))
    if not args.json:
        print(report(res))
    details = {k: v for k, v in res.items() if k not in ("benchmark", "machine")}
    emit_result("round_overhead", 1.0 + res["overhead"], 1.05, False, as_json=args.json,
                **details)
    return 0


if __name__ == "__main__":
    sys.exit(main())
