"""``simulate --replay RUN_DIR``: re-run an asynchronous cluster's computation from its nodes'
journals and end with its models (docs/algorithm.md, "Asynchronous DACFL").

Each daemon of ``schedule: async`` writes every change of its state, in the order applied, to
``<node-id>/exchanges.jsonl`` (:data:`~dacflnode.protocol.async_schedule.JOURNAL_FILE`): a
block's start (``train``) and fold, an exchange it asked for (``ask``: its snapshot), answered
(``answer``: the transfer from the asker's snapshot and its own state) or applied (``apply``:
the answer subtracted), and the node's end (``settle``); its checkpoints (``saved``), a restart
(``restart``: the node resumes from the ``saved`` mark of the block it restarted at) and the
reconciliation that follows (``reconcile`` at the neighbour, ``adopt`` at the node), a
departure (``leaving``, ``handover``) and its neighbours' taking it (``handed``). The replay
builds the same nodes as the simulator does (the run's settings from ``RUN_DIR/summary.json``:
the same data share, initial model and training code), then plays every node's journal in order
with the same functions of :mod:`dacflnode.algorithms.pairwise` and
:class:`~dacflnode.algorithms.edge_flows.EdgeFlows` the daemons ran. An ``answer`` waits for the
asker's ``ask``, an ``apply`` for the answer, an ``adopt`` for the neighbour's ``reconcile``, a
``handed`` for the leaver's ``leaving``; the nodes are stepped round-robin, each as far as its
journal can go. A compressed run is refused (its snapshot references are not replayed).
Training is deterministic for the seed, node and block, and so is every step: with the daemons'
thread count (``--threads 1`` on both sides) the replay ends with their models bit for bit,
whatever the timing of the real run was.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from dacflnode.algorithms import pairwise
from dacflnode.algorithms.edge_flows import EdgeFlows
from dacflnode.algorithms.rounds import NodeState
from dacflnode.config import RunConfig, config_from_mapping
from dacflnode.errors import ConfigError
from dacflnode.learning.train import TrainResult
from dacflnode.protocol.async_membership import EPOCH_SHIFT
from dacflnode.protocol.async_schedule import JOURNAL_FILE
from dacflnode.records.checkpoint import CHECKPOINT, read_checkpoint

#: The keys of a summary's ``config`` that are not run settings.
_NOT_SETTINGS = ("slowdown", "round_deadline")


def run_config_of(run_dir: Path) -> RunConfig:
    """The run settings ``launch`` recorded in ``run_dir/summary.json``."""
    path = run_dir / "summary.json"
    if not path.is_file():
        raise ConfigError("replay", f"{path} not found: give a folder `launch --out` wrote")
    recorded: dict[str, Any] = json.loads(path.read_text())["config"]
    values = {k: v for k, v in recorded.items() if k not in _NOT_SETTINGS}
    cfg = config_from_mapping(values, RunConfig())
    if cfg.schedule != "async":
        raise ConfigError("replay", f"{run_dir} ran schedule {cfg.schedule}: only an "
                          "asynchronous run keeps a journal to replay")
    if cfg.compression != "none":
        raise ConfigError("replay", f"{run_dir} ran compression {cfg.compression}: replaying "
                          "its snapshot references is not done; replay a run without "
                          "compression")
    return cfg


def read_journal(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ConfigError("replay", f"{path} not found: the node kept no journal")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class BlockTrainer(Protocol):
    """What replaying needs of a node's trainer: its training (the journal has no evaluation)."""

    async def train(self, start: torch.Tensor, round_: int) -> TrainResult:
        """Train from the flat vector ``start`` for block ``round_`` (0-based)."""
        ...


@dataclass
class _Node:
    id: str
    state: NodeState
    trainer: BlockTrainer
    journal: list[dict[str, Any]]
    at: int = 0
    start: torch.Tensor | None = None
    #: its edges' transfer totals, as the node keeps them
    flows: EdgeFlows = field(default_factory=EdgeFlows)
    #: its checkpoints (``saved`` marks) by block: what a restart resumes from
    saved: dict[int, tuple[NodeState, EdgeFlows]] = field(default_factory=dict)
    #: the epoch of its current process (its ids' high bits)
    epoch: int = 0


@dataclass
class _Shared:
    """What the nodes' steps hand each other while the journals play."""

    #: the asking node's snapshot of each exchange, by (asker, id)
    snapshots: dict[tuple[str, int], dict[str, torch.Tensor]] = field(default_factory=dict)
    #: each transfer, by (answerer, asker, the asker's id)
    answers: dict[tuple[str, str, int], dict[str, torch.Tensor]] = field(default_factory=dict)
    #: the totals a node gave a restarted neighbour, by (node, neighbour, its first id)
    totals: dict[tuple[str, str, int], dict[str, torch.Tensor]] = field(default_factory=dict)
    #: a leaving node's totals of each edge, by (leaver, neighbour)
    handed: dict[tuple[str, str], dict[str, torch.Tensor]] = field(default_factory=dict)


async def replay_journals(initial: torch.Tensor, trainers: Mapping[str, BlockTrainer],
                          journals: Mapping[str, list[dict[str, Any]]]) -> dict[str, NodeState]:
    """Every node's state after playing its journal (see the module docstring)."""
    nodes = {n: _Node(n, NodeState.initial(initial), trainers[n], list(journals[n]))
             for n in sorted(journals)}
    shared = _Shared()
    while True:
        moved = False
        for node in nodes.values():
            while node.at < len(node.journal):
                entry = node.journal[node.at]
                if not await _play(node, entry, shared, initial):
                    break
                node.at += 1
                moved = True
        if all(n.at == len(n.journal) for n in nodes.values()):
            return {n: node.state for n, node in nodes.items()}
        if not moved:
            stuck = {n: node.journal[node.at] for n, node in nodes.items()
                     if node.at < len(node.journal)}
            raise ConfigError("replay", f"the journals cannot be played in any order: each "
                              f"node waits at {stuck}")


async def _play(node: _Node, entry: dict[str, Any], shared: _Shared,
                initial: torch.Tensor) -> bool:
    """Apply one journal ``entry`` of ``node``; False when what it needs is not there yet."""
    event = entry["event"]
    if event == "train":
        node.start = node.state.omega
    elif event == "fold":
        assert node.start is not None, "a fold before its block's start"
        trained = await node.trainer.train(node.start, int(entry["block"]) - 1)
        node.state = pairwise.fold(node.state, node.start, trained.flat,
                                   float(entry.get("kept", 1.0)))
        node.start = None
    elif event == "ask":
        shared.snapshots[(node.id, int(entry["id"]))] = pairwise.vectors_of(node.state)
    elif event == "answer":
        snapshot = shared.snapshots.get((entry["peer"], int(entry["id"])))
        if snapshot is None:
            return False
        c = pairwise.transfer(float(entry["weight"]), snapshot,
                              pairwise.vectors_of(node.state))
        node.state = pairwise.answered(node.state, c)
        node.flows.added(entry["peer"], c, +1.0)
        shared.answers[(node.id, entry["peer"], int(entry["id"]))] = c
    elif event == "apply":
        answer = shared.answers.get((entry["peer"], node.id, int(entry["id"])))
        if answer is None:
            return False
        if not entry.get("dropped"):
            node.state = pairwise.asked(node.state, answer)
            node.flows.added(entry["peer"], answer, -1.0)
    elif event == "saved":
        node.saved[int(entry["blocks"])] = (node.state, EdgeFlows(node.flows.totals))
    elif event == "restart":
        _restart(node, entry, initial)
    elif event == "reconcile":
        shared.totals[(node.id, entry["peer"], int(entry["floor"]))] = node.flows.of(
            entry["peer"], node.state.x)
    elif event == "adopt":
        theirs = shared.totals.get((entry["peer"], node.id, node.epoch << EPOCH_SHIFT))
        if theirs is None:
            return False
        if "moved" in entry:  # (the node adopted: the other end had not settled the edge)
            node.state = node.flows.adopt(node.state, entry["peer"], theirs)
    elif event == "leaving":
        for peer in list(node.flows.totals):
            shared.handed[(node.id, peer)] = node.flows.of(peer, node.state.x)
    elif event == "handed":
        leaver = shared.handed.get((entry["peer"], node.id))
        if leaver is None:
            return False
        node.state = node.flows.handed(node.state, entry["peer"], leaver)
    elif event in ("settle", "handover"):
        pass  # the node's end (every transfer applied at both ends); a handover taken
    else:
        raise ConfigError("replay", f"unknown journal event {event!r}")
    return True


def _restart(node: _Node, entry: dict[str, Any], initial: torch.Tensor) -> None:
    """The node's process was lost and started again from its checkpoint of block
    ``entry["blocks"]`` (the latest ``saved`` mark of that block; the initial model when it
    had none): what it did since is lost, as it was."""
    blocks = int(entry["blocks"])
    if blocks in node.saved:
        state, flows = node.saved[blocks]
        node.state, node.flows = state, EdgeFlows(flows.totals)
    elif blocks == 0:
        node.state, node.flows = NodeState.initial(initial), EdgeFlows()
    else:
        raise ConfigError("replay", f"{node.id} restarted at block {blocks}, and its journal "
                          "marks no checkpoint of that block")
    node.start = None
    node.epoch = int(entry["epoch"])


def daemon_states(run_dir: Path, ids: list[str]) -> dict[str, NodeState]:
    """Each daemon's state as its last checkpoint holds it."""
    out = {}
    for node in ids:
        path = run_dir / node / CHECKPOINT
        if not path.is_file():
            raise ConfigError("replay", f"{path} not found: the node did not finish")
        out[node] = read_checkpoint(path).state
    return out


def max_difference(a: Mapping[str, NodeState], b: Mapping[str, NodeState]) -> float:
    """The largest ``|Δ|`` between the two sets' ``x`` and ``ω``, over every node."""
    worst = 0.0
    for node in a:
        for name in ("x", "omega"):
            diff = (getattr(a[node], name).double() - getattr(b[node], name).double()).abs()
            worst = max(worst, float(diff.max()))
    return worst


def replay(run_dir: str | Path) -> dict[str, Any]:
    """Replay the asynchronous run ``launch --out`` wrote in ``run_dir``; returns what
    ``simulate --replay --json`` prints: the nodes, the steps played, and the largest
    ``|Δ|`` of the replayed states against the daemons' last checkpoints."""
    import asyncio

    from dacflnode.sim.experiment import simulations

    root = Path(run_dir)
    cfg = run_config_of(root)
    cfg.apply_threads()
    make, _ = simulations(cfg, None)
    sim = make(cfg.algorithm[0], None)
    ids = list(sim.ids)
    journals = {node: read_journal(root / node / JOURNAL_FILE) for node in ids}
    states = asyncio.run(replay_journals(sim.initial, sim.engine.trainers, journals))
    sim.engine.close()
    daemons = daemon_states(root, ids)
    return {
        "run": str(root),
        "nodes": ids,
        "steps": {node: len(journals[node]) for node in ids},
        "blocks": {node: states[node].round for node in ids},
        "max_abs_diff": max_difference(states, daemons),
        "threads": cfg.threads,
    }
