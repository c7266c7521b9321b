"""The files a node writes into its state folder: a line of ``metrics.jsonl`` per round
(:class:`~dacflnode.records.metrics_log.MetricsLine`), the checkpoint, and ``final.safetensors``.

Every file is written off the event loop through a
:class:`~dacflnode.records.persist.Persister`: transient I/O errors are retried, the rest end the
run (:class:`~dacflnode.records.persist.PersistError`). Without a state folder nothing is written.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dacflnode.algorithms.rounds import NodeState
from dacflnode.learning.files import CorruptFile, read_verified, save_model
from dacflnode.protocol.setup import NodeSetup, RoundReport
from dacflnode.records.checkpoint import FINAL_MODEL, Checkpoint, save_checkpoint
from dacflnode.records.metrics_log import METRICS_FILE, MetricsLine, append_line
from dacflnode.records.persist import Persister

log = logging.getLogger(__name__)


class Outputs:
    """The state folder of the node of ``setup`` (``setup.state_dir``; ``None``: no files)."""

    def __init__(self, setup: NodeSetup) -> None:
        self.setup = setup
        self._files = (None if setup.state_dir is None
                       else Persister(setup.node_id, setup.state_dir))

    async def _write(self, what: str, fn: Callable[..., object], *args: Any) -> None:
        """Write a file off the event loop (``what`` names it in an error)."""
        files = self._files
        if files is None:
            return
        await asyncio.to_thread(files.write, what, lambda: fn(*args))

    async def metrics_line(self, report: RoundReport, alone_rounds: int,
                           refused_states: int) -> None:
        """Append the line of the round ``report`` describes."""
        setup = self.setup
        if setup.state_dir is None:
            return
        line = MetricsLine(
            round=report.round,
            node=setup.node_id,
            algorithm=setup.algorithm.name,
            lr=setup.trainer.lr_at(report.round - 1),
            train_loss=report.train_loss,
            samples=report.samples,
            accuracy=report.accuracy,
            test_loss=report.test_loss,
            consensus_residual=report.residual,
            neighbours_used=list(report.used),
            neighbours_missing=list(report.missing),
            alone_rounds=alone_rounds,
            refused_states=refused_states,
            bytes_sent=report.bytes_sent,
            bytes_received=report.bytes_received,
            exchange_s=round(report.exchange_s, 4),
            train_s=round(report.train_s, 4),
            seconds=round(report.seconds, 4),
            data_size=setup.data.size if setup.data else None,
            class_counts=dict(setup.data.class_counts) if setup.data else None,
            time=round(setup.clock(), 3),
            exchanges=report.exchanges,
            staleness=report.staleness,
        )
        await self._write("metrics line", append_line, setup.state_dir / METRICS_FILE, line)

    async def round_done(self, report: RoundReport, alone_rounds: int, refused_states: int,
                         make: Callable[[], Checkpoint],
                         on_round: Callable[[RoundReport], None] | None) -> None:
        """What follows a round's (or an asynchronous block's) report: its metrics line, the
        checkpoint ``make`` returns, and ``on_round`` told of it."""
        await self.metrics_line(report, alone_rounds, refused_states)
        await self.checkpoint(make)
        if on_round is not None:
            on_round(report)

    async def checkpoint(self, make: Callable[[], Checkpoint]) -> None:
        """Write the checkpoint ``make`` returns (called off the event loop), unless the setup
        turns checkpoints off."""
        if self.setup.state_dir is not None and self.setup.checkpoints:
            await self._write("checkpoint", _save, self.setup.state_dir, make)

    async def final_model(self, state: NodeState) -> None:
        """Write ``final.safetensors``: the model the setup's view makes of ``state``."""
        setup = self.setup
        model = await setup.view.final(state.round, setup.algorithm.model(state))
        if setup.state_dir is None:
            return
        meta = {"algorithm": setup.algorithm.name, "node": setup.node_id,
                "round": str(state.round), "fingerprint": setup.layout.fingerprint()}
        await self._write("final model", save_model, setup.state_dir / FINAL_MODEL,
                          setup.layout, model, setup.trainer.local_buffers(), meta)

    async def repair_final_model(self, state: NodeState) -> None:
        """Write ``final.safetensors`` again from ``state`` when it is missing or damaged (its
        checksum, its round, non-finite values)."""
        setup = self.setup
        if setup.state_dir is None:
            return
        path = setup.state_dir / FINAL_MODEL
        problem = await asyncio.to_thread(_final_problem, path, state.round)
        if problem is not None:
            log.warning("the final model %s %s: writing it again from the checkpoint",
                        path, problem,
                        extra={"event": "final_rewritten", "node": setup.node_id})
            await self.final_model(state)


def _save(state_dir: Path, make: Callable[[], Checkpoint]) -> None:
    checkpoint = make()
    save_checkpoint(state_dir, checkpoint.state, checkpoint.local, checkpoint.meta,
                    used_log=checkpoint.used_log, pending=checkpoint.pending,
                    anchors=checkpoint.anchors, peers=checkpoint.peers,
                    tracked=checkpoint.tracked_name, left=checkpoint.left,
                    flows=checkpoint.flows)


def _final_problem(path: Path, round_: int) -> str | None:
    """What is wrong with the final model ``path`` of a run of ``round_`` rounds (to follow the
    file's name), or ``None``."""
    if not path.exists():
        return "is missing"
    try:
        meta, tensors, verified = read_verified(path)
    except (OSError, CorruptFile) as exc:
        return str(exc).removeprefix(f"{path}: ")
    if not verified:
        return "has no checksum"
    if meta.get("round") != str(round_):
        return f"is of round {meta.get('round')}, not {round_}"
    if not all(bool(torch.isfinite(t).all()) for t in tensors.values() if t.is_floating_point()):
        return "holds non-finite values"
    return None
