"""Checkpoints and final models as safetensors files, written atomically.

A checkpoint holds the node's algorithm state (``x``, ``omega``, ``omega_prev``), its local
integer buffers, the round and the fingerprints of the run, and what the node needs to keep the
consensus invariant across a restart (docs/faults.md): its ``used_log``, its pending one-sided
corrections (``pending.<round>.<peer>`` tensors), the anchor rounds it knows, what it knows of
each neighbour (``peers``), and which field ``Σ x`` tracks (``tracked``). Under
``schedule: async`` it also holds each edge's transfer totals (``flow.<peer>.<omega|x>``
tensors) and the epoch of the node's exchange ids (``exchange_epoch``), from which a restarted
node reconciles with its neighbours (docs/algorithm.md, "Asynchronous DACFL"). The node reads
it back with ``safetensors`` (never pickle) and refuses it when the fingerprints differ;
``dacflnode invariant`` reads any node's, from disk or from the Control service.

Every checkpoint carries a checksum (XXH3-128 of its metadata and tensors,
:mod:`dacflnode.learning.files`) and is verified when read: a damaged one (a flipped value,
bytes written over it, cut short) or one holding non-finite values is refused. The previous
checkpoint stays beside the newest (``checkpoint.prev.safetensors``); a node whose newest is
damaged or missing resumes from it (docs/faults.md, "Checkpoint verification").
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dacflnode.algorithms.rounds import NodeState
from dacflnode.filemodes import SECRET_MODE, prepare_file
from dacflnode.learning.files import CorruptFile, atomic_save, read_verified
from dacflnode.records.membership import PeerTrack
from dacflnode.wire.message import UsedLog

CHECKPOINT = "checkpoint.safetensors"
#: The model a node writes after its last round (or when it leaves).
FINAL_MODEL = "final.safetensors"
#: The checkpoint before the newest, kept until the newest is written and verified.
CHECKPOINT_PREV = "checkpoint.prev.safetensors"
#: Where a damaged newest checkpoint is moved when the node resumes from the previous one.
CHECKPOINT_DAMAGED = "checkpoint.damaged.safetensors"

log = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from; the message names the file and what to do."""


def save_checkpoint(
    state_dir: Path,
    state: NodeState,
    local: Mapping[str, torch.Tensor],
    run_info: Mapping[str, str],
    *,
    used_log: UsedLog = (),
    pending: Mapping[str, torch.Tensor] | None = None,
    anchors: Iterable[int] = (),
    peers: Mapping[str, PeerTrack] | None = None,
    tracked: str = "x",
    left: bool = False,
    flows: Mapping[str, torch.Tensor] | None = None,
) -> Path:
    """Write ``STATE_DIR/checkpoint.safetensors`` atomically, with its checksum, keeping the one
    it replaces as ``checkpoint.prev.safetensors`` (see the module docstring)."""
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, t in (("x", state.x), ("omega", state.omega), ("omega_prev", state.omega_prev)):
        # CDSGD keeps one vector in all three fields: safetensors stores each tensor once
        tensors[name] = t.clone() if t.data_ptr() in seen else t
        seen.add(t.data_ptr())
    tensors.update({f"local.{k}": v for k, v in local.items()})
    tensors.update(pending or {})
    tensors.update(flows or {})
    meta = {
        **{k: str(v) for k, v in run_info.items()},
        "round": str(state.round),
        "used_log": json.dumps([[r, list(p)] for r, p in used_log]),
        "anchors": json.dumps(sorted(anchors)),
        "peers": json.dumps({k: v.to_json() for k, v in sorted((peers or {}).items())}),
        "tracked": tracked,
        "left": "1" if left else "0",
    }
    path = state_dir / CHECKPOINT
    atomic_save(tensors, path, meta, keep_previous=state_dir / CHECKPOINT_PREV)
    return path


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint as read back: the state, the local buffers, and the fault bookkeeping."""

    state: NodeState
    local: dict[str, torch.Tensor]
    meta: dict[str, str]
    used_log: UsedLog = ()
    #: ``pending.<round>.<peer>`` tensors: subtract from ``x`` if ``peer`` did not use this
    #: node's state in ``round`` (docs/faults.md)
    pending: dict[str, torch.Tensor] = field(default_factory=dict)
    anchors: tuple[int, ...] = ()
    peers: dict[str, PeerTrack] = field(default_factory=dict)
    tracked_name: str = "x"
    left: bool = False
    #: Whether a checksum was there to verify it (files written before checksums had none).
    verified: bool = True
    #: ``flow.<peer>.<name>`` tensors: an asynchronous node's transfer totals per edge
    flows: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def node(self) -> str:
        return self.meta.get("node", "")

    @property
    def used(self) -> tuple[str, ...]:
        """The neighbours mixed in the round before :attr:`state`'s."""
        for r, peers in self.used_log:
            if r == self.state.round - 1:
                return peers
        return ()

    @property
    def pending_entries(self) -> dict[tuple[int, str], torch.Tensor]:
        """:attr:`pending` by ``(round, peer)``."""
        out = {}
        for name, tensor in self.pending.items():
            round_text, _, peer = name[len("pending."):].partition(".")
            out[(int(round_text), peer)] = tensor
        return out

    @property
    def tracked(self) -> torch.Tensor:
        return getattr(self.state, self.tracked_name)  # type: ignore[no-any-return]


def read_checkpoint(source: Path | bytes) -> Checkpoint:
    """A checkpoint file (or its bytes, as the Control service sends them), verified against
    its checksum but without checking which run it belongs to; raises :class:`CheckpointError`
    (a ``ValueError``) when it is not a sound checkpoint: unreadable, cut short, changed since
    it was written, or holding non-finite values."""
    where = str(source) if isinstance(source, Path) else "checkpoint"
    try:
        meta, tensors, verified = read_verified(source)
    except OSError as exc:
        raise CheckpointError(f"{where}: cannot be read: {exc.strerror or exc}") from exc
    except CorruptFile as exc:
        raise CheckpointError(str(exc)) from exc
    numel = None
    for name in ("x", "omega", "omega_prev"):
        t = tensors.get(name)
        if t is None or t.dtype != torch.float32 or t.dim() != 1 or (
                numel is not None and t.numel() != numel):
            raise CheckpointError(f"{where}: tensor {name} is missing or has the wrong shape")
        numel = t.numel()
    for name, t in tensors.items():
        checked = name in ("x", "omega", "omega_prev") or name.startswith(("pending.", "flow."))
        if checked and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{where}: tensor {name} holds non-finite values (NaN or "
                                  "infinity)")
    try:
        state = NodeState(int(meta["round"]), tensors["x"], tensors["omega"],
                          tensors["omega_prev"])
        used_log = tuple((int(r), tuple(str(x) for x in p))
                         for r, p in json.loads(meta.get("used_log", "[]")))
        if not used_log and "used" in meta:  # written before used_log existed
            used_log = ((state.round - 1, tuple(json.loads(meta["used"]))),)
        anchors = tuple(int(a) for a in json.loads(meta.get("anchors", "[]")))
        peers = {k: PeerTrack.from_json(v) for k, v in json.loads(meta.get("peers", "{}")).items()}
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{where}: malformed metadata ({exc})") from exc
    tracked = meta.get("tracked", "x")
    if tracked not in ("x", "omega", "omega_prev"):
        raise CheckpointError(f"{where}: unknown tracked field {tracked!r}")
    local = {k[len("local."):]: v for k, v in tensors.items() if k.startswith("local.")}
    pending = {k: v for k, v in tensors.items() if k.startswith("pending.")}
    flows = {k: v for k, v in tensors.items() if k.startswith("flow.")}
    for name, t in flows.items():
        if t.dtype != torch.float32 or t.dim() != 1 or t.numel() != numel:
            raise CheckpointError(f"{where}: tensor {name} has the wrong shape")
    return Checkpoint(state, local, meta, used_log, pending, anchors, peers, tracked,
                      meta.get("left") == "1", verified, flows)


def load_checkpoint(state_dir: Path, run_info: Mapping[str, str], numel: int) -> Checkpoint | None:
    """The checkpoint in ``state_dir`` if there is one for this run; ``None`` if there is none.

    The newest (``checkpoint.safetensors``) is used when it is sound; when it is missing or
    damaged and the previous one (``checkpoint.prev.safetensors``) is sound, that one is used, a
    warning names both, the damaged file is moved aside to ``checkpoint.damaged.safetensors``
    (kept for inspection) and a copy of the previous one becomes the newest. Raises
    :class:`CheckpointError`, whose message says what to do, when neither is sound, or when the
    checkpoint belongs to another run, node or model (the user must move it away: silently
    starting over would throw away training). A checkpoint written before checksums existed is
    used after a warning.
    """
    path, prev = state_dir / CHECKPOINT, state_dir / CHECKPOINT_PREV
    if not path.exists() and not prev.exists():
        return None
    try:
        checkpoint = read_checkpoint(path) if path.exists() else None
        damage = None if checkpoint is not None else "is missing"
    except CheckpointError as exc:
        checkpoint, damage = None, _reason(exc, path)
    if checkpoint is None:
        try:
            checkpoint = read_checkpoint(prev) if prev.exists() else None
        except CheckpointError as exc:
            raise CheckpointError(
                f"{path} {damage}; the previous one, {CHECKPOINT_PREV}, cannot be used either "
                f"({_reason(exc, prev)}); move both away to start this node afresh (it joins "
                "the running network) or restore them from a backup") from exc
        if checkpoint is None:
            raise CheckpointError(
                f"{path} {damage}; move it away to start this node afresh (it joins the "
                "running network) or restore it from a backup")
        _check_owner(checkpoint, prev, run_info, numel)
        damaged = path.exists()
        if damaged:
            os.replace(path, state_dir / CHECKPOINT_DAMAGED)
        # the previous one is the newest again (a node that writes no checkpoint before it is
        # restarted, one that had finished, finds it there)
        tmp = path.with_name(path.name + ".tmp")
        prepare_file(tmp, SECRET_MODE)  # copyfile truncates it and keeps the mode
        shutil.copyfile(prev, tmp)
        os.replace(tmp, path)
        log.warning("%s %s; resuming from the previous checkpoint %s (round %d) instead%s",
                    path, damage, prev, checkpoint.state.round,
                    f"; the damaged file is kept as {CHECKPOINT_DAMAGED}" if damaged else "",
                    extra={"event": "checkpoint_fallback", "round": checkpoint.state.round})
    else:
        _check_owner(checkpoint, path, run_info, numel)
    if not checkpoint.verified:
        log.warning("%s was written without a checksum (by an older dacflnode): it is used "
                    "unverified; the next checkpoint carries one", path,
                    extra={"event": "checkpoint_unverified"})
    return checkpoint


def _reason(exc: CheckpointError, path: Path) -> str:
    """What :func:`read_checkpoint` found wrong with ``path``, without the file's name."""
    return str(exc).removeprefix(f"{path}: ")


def _check_owner(checkpoint: Checkpoint, path: Path, run_info: Mapping[str, str],
                 numel: int) -> None:
    """Refuse a checkpoint of another node, run or model (see :func:`load_checkpoint`)."""
    node = run_info.get("node")
    if node is not None and checkpoint.meta.get("node") != str(node):
        raise CheckpointError(
            f"{path} belongs to node {checkpoint.meta.get('node')!r}, not {node!r}: give each "
            "node its own node.state_dir, or move the file away to start this node afresh")
    for key, value in run_info.items():
        if checkpoint.meta.get(key) != str(value):
            raise CheckpointError(
                f"{path} belongs to another run ({key} differs); move it away to start over"
            )
    if checkpoint.state.x.numel() != numel:
        raise CheckpointError(f"{path}: tensor x has {checkpoint.state.x.numel()} values, the "
                              f"model {numel}; move it away to start over")
