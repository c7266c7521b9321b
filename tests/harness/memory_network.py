"""N node runners on an in-memory network with a cheap fake trainer: the fault tests' harness.

The trainer adds a seeded random step to the start vector (every node and round its own), so a
run is deterministic and takes milliseconds, while ``ω`` still changes every round: what the
FODAC invariant ``Σ x = Σ ω_prev`` is about.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial

import torch

from dacflnode.algorithms.rounds import NodeState, make_algorithm
from dacflnode.learning.layout import StateLayout
from dacflnode.learning.train import TrainResult
from dacflnode.protocol.runner import NodeRunner
from dacflnode.protocol.setup import NodeSetup
from dacflnode.transport.base import Identity
from dacflnode.transport.memory import MemoryNetwork, MemoryTransport

SIZE = 64


class FakeTrainer:
    """``Train(v) = v + 0.1 · noise(node, round)``; evaluation reports the vector's mean."""

    def __init__(self, index: int) -> None:
        self.index = index

    async def train(self, start: torch.Tensor, round_: int) -> TrainResult:
        gen = torch.Generator().manual_seed(1000 * self.index + round_)
        step = torch.randn(start.shape, generator=gen) * 0.1
        return TrainResult(start + step, 0.0, 1, 1)

    async def evaluate(self, model: torch.Tensor, round_: int) -> tuple[float, float]:
        return float(model.mean()), 0.0

    def local_buffers(self) -> dict[str, torch.Tensor]:
        return {}

    def lr_at(self, round_: int) -> float:
        return 0.1


def _layout() -> StateLayout:
    return StateLayout.from_module(torch.nn.Linear(SIZE - 1, 1))  # SIZE parameters in all


@dataclass
class FakeNetwork:
    """The runners of one network, by id; :meth:`runner` builds (or rebuilds) one."""

    edges: list[tuple[str, str]]
    rounds: int
    deadline: float = math.inf
    setup_extra: dict[str, object] = field(default_factory=dict)
    network: MemoryNetwork = field(default_factory=lambda: MemoryNetwork(copy=False))
    runners: dict[str, NodeRunner] = field(default_factory=dict)

    @property
    def ids(self) -> list[str]:
        return sorted({n for e in self.edges for n in e})

    def neighbours(self, node: str) -> list[str]:
        return sorted({b if a == node else a for a, b in self.edges if node in (a, b)})

    def runner(self, node: str, state: NodeState | None = None, **extra: object) -> NodeRunner:
        layout = _layout()
        algorithm = make_algorithm("dacfl")
        gen = torch.Generator().manual_seed(7)
        initial = torch.randn(layout.numel, generator=gen)
        neighbours = self.neighbours(node)
        transport = partial(MemoryTransport, self.network,
                            Identity(node, layout.fingerprint(), "fake"), neighbours,
                            tensors={name: (layout.numel,) for name in algorithm.exchanged})
        options = {**self.setup_extra, **extra}
        setup = NodeSetup(node_id=node, neighbours=neighbours, algorithm=algorithm,
                          trainer=FakeTrainer(self.ids.index(node)), layout=layout,
                          rounds=self.rounds, round_deadline=self.deadline,
                          absurd_ratio=None, **options)  # type: ignore[arg-type]
        runner = NodeRunner(setup, transport, state or NodeState.initial(initial))
        self.runners[node] = runner
        return runner

    async def start(self, nodes: Iterable[str] | None = None) -> list[asyncio.Task[bool]]:
        tasks = []
        for node in nodes if nodes is not None else self.ids:
            runner = self.runners.get(node) or self.runner(node)
            await runner.transport.start()
            tasks.append(asyncio.create_task(runner.run(), name=node))
        return tasks


def residual(states: Iterable[NodeState]) -> float:
    """``|Σ x − Σ ω_prev| / |Σ ω_prev|`` (DACFL's lagged invariant) over ``states``."""
    states = list(states)
    sum_x = torch.stack([s.x.double() for s in states]).sum(0)
    sum_t = torch.stack([s.omega_prev.double() for s in states]).sum(0)
    return float(torch.linalg.vector_norm(sum_x - sum_t) / torch.linalg.vector_norm(sum_t))


@dataclass
class Drops:
    """A minimal fault plan: the directed edge-rounds in ``lost`` are dropped."""

    lost: set[tuple[str, str, int]] = field(default_factory=set)
    when: Callable[[str, str, int], bool] | None = None

    def down(self, node: str, round_: int) -> bool:
        return False

    def drops(self, sender: str, receiver: str, round_: int) -> bool:
        if (sender, receiver, round_) in self.lost:
            return True
        return self.when is not None and self.when(sender, receiver, round_)


def ring(n: int) -> list[tuple[str, str]]:
    return [(f"n{i}", f"n{(i + 1) % n}") for i in range(n)]


def states(runners: Mapping[str, NodeRunner]) -> list[NodeState]:
    return [r.state for r in runners.values()]
