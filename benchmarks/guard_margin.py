#!/usr/bin/env python3
"""How close honest neighbours' states come to the absurd-state guard's limits.

The guard (``dacflnode/wire/state_guard.py``, docs/security.md) refuses a state ``m_j`` whose norm
is more than 3 times ``R`` or less than ``R / 3`` (the norm test; ``R`` the median norm of the
states the receiver trusted in its last rounds), or with ``‖m_j − m_i‖ > 0.8 · (‖m_j‖ + ‖m_i‖)``
(the direction test). This script runs an honest ring of daemons' node runners over the in-memory
transport, with the guard on, and records for every state a node receives how much of each limit it
uses; it prints the largest share of either: the margin an honest run leaves. Non-i.i.d. data (each
node sees mostly its own two classes) and a high learning rate make neighbours drift apart as much
as a healthy run can.

The result's ``ratio`` is the largest share of a limit an honest state used (the limits are the
baseline: constants of the guard, not a second measurement; shares are log-ratios for the norm
test). Target ≤ 0.25: four times inside both limits at lr 0.05. Not ten: a sign flip (direction
ratio ≈ 1) must stay outside the direction limit, and a run that diverges at lr 0.5 (norms a
factor 2 apart, direction ratio 0.6) inside both, which leaves no room for a tenfold margin
(docs/security.md). ``--quick``: 20 rounds.

    python benchmarks/guard_margin.py --rounds 100 --algorithm dacfl --lr 0.05
    python benchmarks/guard_margin.py --quick --json
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from functools import partial
from typing import Any

import torch
from _common import add_standard_args, emit_result

from dacflnode.algorithms.rounds import NodeState, make_algorithm
from dacflnode.learning.layout import StateLayout
from dacflnode.learning.models import build_model
from dacflnode.learning.train import LocalTrainer, TrainConfig
from dacflnode.protocol.runner import NodeRunner
from dacflnode.protocol.setup import NodeSetup
from dacflnode.protocol.training import ThreadedTrainer
from dacflnode.transport.base import Identity
from dacflnode.transport.memory import MemoryNetwork, MemoryTransport
from dacflnode.wire.errors import Refusal
from dacflnode.wire.message import RoundMessage
from dacflnode.wire.state_guard import RobustGuard


def ring(n: int) -> dict[str, list[str]]:
    ids = [f"node-{i}" for i in range(n)]
    return {node: sorted({ids[(i - 1) % n], ids[(i + 1) % n]}) for i, node in enumerate(ids)}


def make_runner(network: MemoryNetwork, graph: dict[str, list[str]], node: str, index: int,
                args: argparse.Namespace, ratios: list[tuple[float, float]]) -> NodeRunner:
    torch.manual_seed(0)  # the same initial model everywhere, as in a run
    model = build_model("tiny-cnn", (1, 8, 8), 2 * len(graph))
    layout = StateLayout.from_module(model)
    gen = torch.Generator().manual_seed(100 + index)
    y = torch.randint(0, 2, (args.samples,), generator=gen) + 2 * index  # two classes per node
    x = torch.randn(args.samples, 1, 8, 8, generator=gen) + y.view(-1, 1, 1, 1).float() * 0.3
    local = LocalTrainer(model, x, y, TrainConfig(lr=args.lr), seed=0, node_index=index)
    algorithm = make_algorithm(args.algorithm)
    transport = partial(MemoryTransport, network, Identity(node, layout.fingerprint(), "margin"),
                        graph[node],
                        tensors={name: (layout.numel,) for name in algorithm.exchanged})
    setup = NodeSetup(node_id=node, neighbours=graph[node], algorithm=algorithm,
                      trainer=ThreadedTrainer(local, x, y), layout=layout, rounds=args.rounds,
                      round_deadline=math.inf)
    runner = NodeRunner(setup, transport, NodeState.initial(layout.flatten_module(model)))
    inbox = runner.transport.inbox
    guard = inbox.guard
    assert isinstance(guard, RobustGuard), "the runner installs the guard by default"

    def recording(message: RoundMessage) -> Refusal | None:
        measured = guard.measure(message)  # before the state joins the yardstick's pool
        if measured is not None:
            ratios.append(guard.shares(measured))
        return guard(message)

    inbox.guard = recording
    return runner


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    graph = ring(args.nodes)
    network = MemoryNetwork(copy=False)
    ratios: list[tuple[float, float]] = []
    runners = [make_runner(network, graph, node, i, args, ratios)
               for i, node in enumerate(graph)]
    for r in runners:
        await r.transport.start()
    done = await asyncio.gather(*(r.run() for r in runners))
    transports = [r.transport for r in runners]
    refused = sum(sum(t.receiver.refusals.values())
                  for t in transports if isinstance(t, MemoryTransport))
    norm_share = max(r[0] for r in ratios)
    direction_share = max(r[1] for r in ratios)
    largest = max(norm_share, direction_share)
    return {
        "algorithm": args.algorithm, "lr": args.lr,
        "nodes": args.nodes, "rounds": args.rounds, "all_rounds_done": all(done),
        "states_checked": len(ratios), "refused": refused,
        "norm_share": round(norm_share, 4), "direction_share": round(direction_share, 4),
        "largest_share": round(largest, 4),
        "margin": round(1 / largest, 1) if largest else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algorithm", default="dacfl", choices=("dacfl", "cdsgd"))
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--samples", type=int, default=64, help="training samples per node")
    add_standard_args(ap)
    args = ap.parse_args()
    if args.quick:
        args.rounds = 20
    result = asyncio.run(measure(args))
    if not args.json:
        print(f"{args.algorithm}, lr {args.lr}, {args.nodes}-node ring, {args.rounds} rounds: "
              f"{result['states_checked']} states; largest share of the norm limit "
              f"{result['norm_share']}, of the direction limit {result['direction_share']} "
              f"(margin {result['margin']}x), refused {result['refused']}")
    emit_result("guard_margin", result["largest_share"], 0.25, False,
                as_json=args.json, **result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
