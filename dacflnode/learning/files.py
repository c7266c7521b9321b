"""Writing models as safetensors files (never pickle), atomically."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file

from dacflnode.learning.layout import StateLayout


def atomic_save(tensors: Mapping[str, torch.Tensor], path: Path, meta: Mapping[str, str]) -> None:
    """Write ``tensors`` to ``path`` through a temporary file and a rename."""
    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=dict(meta))
    os.replace(tmp, path)


def save_model(
    path: Path,
    layout: StateLayout,
    model: torch.Tensor,
    local: Mapping[str, torch.Tensor],
    meta: Mapping[str, str],
) -> None:
    """A node's model as a full ``state_dict`` (loadable into the architecture)."""
    atomic_save(layout.state_dict(model, local), path, meta)
