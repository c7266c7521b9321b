"""Checkpoints and final models as safetensors files, written atomically.

A checkpoint holds the node's algorithm state (``x``, ``omega``, ``omega_prev``), its local
integer buffers, the round and the fingerprints of the run; it is read back only by the node that
wrote it, with ``safetensors`` (never pickle), and refused when the fingerprints differ.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from dacflnode.algorithms.rounds import NodeState
from dacflnode.learning.files import atomic_save

CHECKPOINT = "checkpoint.safetensors"


def save_checkpoint(
    state_dir: Path,
    state: NodeState,
    local: Mapping[str, torch.Tensor],
    run_info: Mapping[str, str],
    used: Sequence[str] = (),
) -> Path:
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, t in (("x", state.x), ("omega", state.omega), ("omega_prev", state.omega_prev)):
        # CDSGD keeps one vector in all three fields: safetensors stores each tensor once
        tensors[name] = t.clone() if t.data_ptr() in seen else t
        seen.add(t.data_ptr())
    tensors.update({f"local.{k}": v for k, v in local.items()})
    meta = {**{k: str(v) for k, v in run_info.items()}, "round": str(state.round),
            "used": json.dumps(list(used))}
    path = state_dir / CHECKPOINT
    atomic_save(tensors, path, meta)
    return path


@dataclass(frozen=True)
class Checkpoint:
    state: NodeState
    local: dict[str, torch.Tensor]
    meta: dict[str, str]
    used: tuple[str, ...]


def load_checkpoint(state_dir: Path, run_info: Mapping[str, str], numel: int) -> Checkpoint | None:
    """The checkpoint in ``state_dir`` if there is one for this run; ``None`` if there is none.

    Raises ``ValueError`` when the file belongs to another run or model (the user must move it
    away: silently starting over would throw away training).
    """
    path = state_dir / CHECKPOINT
    if not path.exists():
        return None
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata() or {})
        for key, value in run_info.items():
            if meta.get(key) != str(value):
                raise ValueError(
                    f"{path} belongs to another run ({key} differs); move it away to start over"
                )
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open API
    for name in ("x", "omega", "omega_prev"):
        t = tensors.get(name)
        if t is None or t.dtype != torch.float32 or t.shape != (numel,):
            raise ValueError(f"{path}: tensor {name} is missing or has the wrong shape")
    state = NodeState(int(meta["round"]), tensors["x"], tensors["omega"], tensors["omega_prev"])
    local = {k[len("local."):]: v for k, v in tensors.items() if k.startswith("local.")}
    return Checkpoint(state, local, meta, tuple(json.loads(meta.get("used", "[]"))))
