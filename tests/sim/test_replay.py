"""Replaying asynchronous journals: the same steps, in any order the dependencies allow, give
the same states; a journal that cannot be played is an error naming where each node waits."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from dacflnode.errors import ConfigError
from dacflnode.learning.train import TrainResult
from dacflnode.protocol.async_schedule import JOURNAL_FILE
from dacflnode.protocol.faults import parse_fault_plan
from dacflnode.sim.replay import max_difference, read_journal, replay_journals, run_config_of


class StepTrainer:
    """Training as a fixed step per block (deterministic, no data)."""

    def __init__(self, step: float) -> None:
        self.step = step

    async def train(self, start: torch.Tensor, round_: int) -> TrainResult:
        return TrainResult(start + self.step * (round_ + 1), 0.0, 1, 1)


def journal_of_two() -> dict[str, list[dict[str, Any]]]:
    return {
        "a": [{"event": "train", "block": 0}, {"event": "fold", "block": 1},
              {"event": "ask", "id": 1, "peer": "b", "blocks": 1},
              {"event": "apply", "id": 1, "peer": "b", "weight": 0.25}, {"event": "settle"}],
        "b": [{"event": "answer", "id": 1, "peer": "a", "weight": 0.25},
              {"event": "train", "block": 0}, {"event": "fold", "block": 1},
              {"event": "settle"}],
    }


async def test_a_journal_replays_the_exchange_from_the_askers_snapshot():
    trainers = {"a": StepTrainer(1.0), "b": StepTrainer(-1.0)}
    states = await replay_journals(torch.zeros(3), trainers, journal_of_two())
    # a trained to ω = x = 1 and asked; b answered from 0: c = 0.25 · (1 − 0) for ω and x,
    # b += c, a −= c; τ moves only by a node's own steps
    assert torch.equal(states["a"].x, torch.full((3,), 0.75))
    # b trained from ω = 0.25 to −0.75 (the exchange overlapped no block of b's: whole step)
    assert torch.equal(states["b"].x, torch.full((3,), 0.25 - 1.0))
    total = states["a"].x + states["b"].x
    tau = states["a"].omega_prev + states["b"].omega_prev
    assert torch.allclose(total, tau)
    assert max_difference(states, states) == 0.0


async def test_a_journal_waiting_on_a_step_nobody_takes_is_an_error():
    journals = journal_of_two()
    journals["a"] = [e for e in journals["a"] if e["event"] != "ask"]
    with pytest.raises(ConfigError, match="cannot be played"):
        await replay_journals(torch.zeros(3), {"a": StepTrainer(1.0), "b": StepTrainer(1.0)},
                              journals)


def test_replay_needs_an_asynchronous_launch_folder(tmp_path):
    with pytest.raises(ConfigError, match=r"summary\.json"):
        run_config_of(tmp_path)
    (tmp_path / "summary.json").write_text('{"config": {"schedule": "sync"}}')
    with pytest.raises(ConfigError, match="only an asynchronous run"):
        run_config_of(tmp_path)
    (tmp_path / "summary.json").write_text(
        '{"config": {"schedule": "async", "compression": "int8"}}')
    with pytest.raises(ConfigError, match="compression int8"):
        run_config_of(tmp_path)


def journals_of(folder: Path, ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    return {n: read_journal(folder / n / JOURNAL_FILE) for n in ids}


@pytest.mark.parametrize("plan", [
    # two neighbours crash in a block and start again from their last checkpoints
    {"faults": [{"crash": "node-1", "round": 2, "restart": 3},
                {"crash": "node-2", "round": 2, "restart": 4}]},
    # one drains away after 3 blocks, one starts late
    {"faults": [{"leave": "node-1", "round": 3}, {"join": "node-3", "round": 2}]},
], ids=["restarts", "leave-and-join"])
def test_a_run_with_restarts_or_a_departure_replays_to_the_same_models(tmp_path, plan):
    """The journals of a run whose nodes crashed and restarted (the lost processes' steps
    included), or left, replay to the very models the nodes ended with."""
    from tests.sim.test_simulator_async import CFG, simulate

    cfg = dataclasses.replace(CFG, nodes=5, rounds=6)
    sim = simulate(cfg, out=tmp_path, faults=parse_fault_plan(plan), slowdown={"node-0": 3.0})
    ids = [r.setup.node_id for r in sim.runners]
    journals = journals_of(tmp_path, ids)
    assert any(e["event"] in ("restart", "leaving") for j in journals.values() for e in j)
    # (its own loop: the simulation ran on a virtual-clock loop of its own)
    states = asyncio.run(replay_journals(sim.initial, sim.engine.trainers, journals))
    assert max_difference(states, {r.setup.node_id: r.state for r in sim.runners}) == 0.0
