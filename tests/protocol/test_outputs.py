"""The files a node writes (protocol/outputs.py): metrics lines, checkpoints, the final model."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import torch

from dacflnode.learning.files import read_verified
from dacflnode.protocol.phase import Phase
from dacflnode.records.checkpoint import CHECKPOINT, FINAL_MODEL, read_checkpoint
from dacflnode.records.metrics_log import LINE_KEYS, METRICS_FILE, MetricsLine, append_line
from dacflnode.transport.memory import MemoryNetwork
from tests.protocol.test_runner import make_runner


def test_a_metrics_line_keeps_its_keys_and_their_order(tmp_path: Path):
    """The keys of metrics.jsonl, in the order written, are a format that readers rely on."""
    keys = ("round", "node", "algorithm", "lr", "train_loss", "samples", "accuracy", "test_loss",
            "consensus_residual", "neighbours_used", "neighbours_missing", "alone_rounds",
            "refused_states", "bytes_sent", "bytes_received", "exchange_s", "train_s",
            "seconds", "data_size", "class_counts", "time", "exchanges", "staleness")
    assert keys == LINE_KEYS
    values: dict[str, Any] = {k: i for i, k in enumerate(keys)}
    append_line(tmp_path / METRICS_FILE, MetricsLine(**values))
    assert (tmp_path / METRICS_FILE).read_text() == json.dumps(values) + "\n"


def test_a_finished_run_writes_its_lines_its_checkpoint_and_its_final_model(tmp_path: Path):
    async def scenario() -> None:
        network = MemoryNetwork()
        (tmp_path / "a").mkdir()
        a = make_runner(network, "a", ["b"], rounds=2, state_dir=tmp_path / "a")
        b = make_runner(network, "b", ["a"], rounds=2)
        await a.transport.start()
        await b.transport.start()
        assert list(await asyncio.gather(a.run(), b.run())) == [True, True]
        assert a.phase is Phase.DONE

        lines = [json.loads(raw) for raw in (tmp_path / "a" / METRICS_FILE).read_text()
                 .splitlines()]
        assert [tuple(line) for line in lines] == [LINE_KEYS, LINE_KEYS]
        assert [line["round"] for line in lines] == [1, 2]
        # each line says when it was written, in unix seconds, in the order written
        assert lines[0]["time"] <= lines[1]["time"] <= time.time()
        assert lines[0]["time"] > time.time() - 600
        assert all(line["node"] == "a" and line["neighbours_used"] == ["b"] for line in lines)

        # the checkpoint on disk is the runner's checkpoint, field by field
        written = read_checkpoint(tmp_path / "a" / CHECKPOINT)
        expected = a.checkpoint()
        assert written.state.round == expected.state.round == 2
        assert torch.equal(written.state.x, expected.state.x)
        assert written.used_log == expected.used_log
        assert written.anchors == expected.anchors
        assert set(written.peers) == set(expected.peers) == {"b"}
        assert written.tracked_name == expected.tracked_name
        assert written.left is False

        meta, _, verified = read_verified(tmp_path / "a" / FINAL_MODEL)
        assert verified and meta["round"] == "2" and meta["node"] == "a"

    asyncio.run(scenario())


def test_a_damaged_final_model_is_written_again_when_the_finished_node_starts(tmp_path: Path):
    async def scenario() -> None:
        network = MemoryNetwork()
        (tmp_path / "a").mkdir()
        a = make_runner(network, "a", ["b"], rounds=1, start_round=1,
                        state_dir=tmp_path / "a")
        (tmp_path / "a" / FINAL_MODEL).write_bytes(b"not a model")
        assert await a.confirm_finished() is True
        meta, _, verified = read_verified(tmp_path / "a" / FINAL_MODEL)
        assert verified and meta["round"] == "1"

    asyncio.run(scenario())


def test_without_a_state_folder_nothing_is_written(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    async def scenario() -> None:
        network = MemoryNetwork()
        a = make_runner(network, "a", ["b"], rounds=1)
        b = make_runner(network, "b", ["a"], rounds=1)
        await a.transport.start()
        await b.transport.start()
        assert list(await asyncio.gather(a.run(), b.run())) == [True, True]

    asyncio.run(scenario())
    assert list(tmp_path.iterdir()) == []
