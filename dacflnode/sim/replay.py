"""``simulate --replay RUN_DIR``: re-run an asynchronous cluster's computation from its nodes'
journals and end with its models (docs/algorithm.md, "Asynchronous DACFL").

Each daemon of ``schedule: async`` writes every change of its state, in the order applied, to
``<node-id>/exchanges.jsonl`` (:data:`~dacflnode.protocol.async_schedule.JOURNAL_FILE`): a
block's start (``train``) and fold, an exchange it asked for (``ask``: its snapshot), answered
(``answer``: the transfer from the asker's snapshot and its own state) or applied (``apply``:
the answer subtracted), and the node's end (``settle``). The replay builds the same nodes as the
simulator does (the run's settings from ``RUN_DIR/summary.json``: the same data share, initial
model and training code), then plays every node's journal in order with the same functions of
:mod:`dacflnode.algorithms.pairwise` the daemons ran. An ``answer`` waits for the asker's
``ask``, an ``apply`` for the answer; the nodes are stepped round-robin, each as far as its
journal can go. Training is deterministic for the seed, node and block, and so is every step:
with the daemons' thread count (``--threads 1`` on both sides) the replay ends with their
models bit for bit, whatever the timing of the real run was.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from dacflnode.algorithms import pairwise
from dacflnode.algorithms.rounds import NodeState
from dacflnode.config import RunConfig, config_from_mapping
from dacflnode.errors import ConfigError
from dacflnode.learning.train import TrainResult
from dacflnode.protocol.async_schedule import JOURNAL_FILE
from dacflnode.records.checkpoint import CHECKPOINT, read_checkpoint

#: The keys of a summary's ``config`` that are not run settings.
_NOT_SETTINGS = ("slowdown",)


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


async def replay_journals(initial: torch.Tensor, trainers: Mapping[str, BlockTrainer],
                          journals: Mapping[str, list[dict[str, Any]]]) -> dict[str, NodeState]:
    """Every node's state after playing its journal (see the module docstring)."""
    nodes = {n: _Node(n, NodeState.initial(initial), trainers[n], list(journals[n]))
             for n in sorted(journals)}
    snapshots: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
    answers: dict[tuple[str, str, int], dict[str, torch.Tensor]] = {}
    while True:
        moved = False
        for node in nodes.values():
            while node.at < len(node.journal):
                entry = node.journal[node.at]
                if not await _play(node, entry, snapshots, answers):
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


async def _play(node: _Node, entry: dict[str, Any],
                snapshots: dict[tuple[str, int], dict[str, torch.Tensor]],
                answers: dict[tuple[str, str, int], dict[str, torch.Tensor]]) -> bool:
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
        snapshots[(node.id, int(entry["id"]))] = pairwise.vectors_of(node.state)
    elif event == "answer":
        snapshot = snapshots.get((entry["peer"], int(entry["id"])))
        if snapshot is None:
            return False
        c = pairwise.transfer(float(entry["weight"]), snapshot,
                              pairwise.vectors_of(node.state))
        node.state = pairwise.answered(node.state, c)
        answers[(node.id, entry["peer"], int(entry["id"]))] = c
    elif event == "apply":
        answer = answers.get((entry["peer"], node.id, int(entry["id"])))
        if answer is None:
            return False
        node.state = pairwise.asked(node.state, answer)
    elif event == "settle":
        pass  # the node's end: every transfer applied at both ends
    elif event in ("restart", "reconcile", "adopt"):
        raise ConfigError("replay", f"{node.id} restarted during the run (or reconciled with "
                          "a node that did): its journal holds the lost process's steps, "
                          "which a replay cannot play; replay a run without restarts")
    elif event in ("leaving", "handover", "handed"):
        raise ConfigError("replay", f"{node.id}'s journal has a departure ({event}): a "
                          "replay plays runs whose nodes all stay; replay a run without "
                          "stop --drain")
    else:
        raise ConfigError("replay", f"unknown journal event {event!r}")
    return True


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
