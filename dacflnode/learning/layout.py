"""The flat view of a model's state that nodes mix, train, exchange and track.

Every algorithm works on one contiguous ``float32`` vector per node. :class:`StateLayout` maps a
model's ``state_dict`` onto that vector and back.

What goes into the vector (the *shared* state):

* every floating-point parameter, and
* every floating-point buffer, i.e. batch-norm ``running_mean`` and ``running_var``. They are
  mixed and tracked exactly like the weights: the statistics describe the activations of the
  weights they came with, so the network-average model is only coherent if its normalisation
  statistics are averaged alongside its weights. Mixing keeps ``running_var`` positive (a
  convex combination of positive numbers); an update that adds a difference to the mix does
  not, and CDSGD was measured to drive some nodes' variances negative.

What stays out (the *local* state):

* integer buffers (batch-norm ``num_batches_tracked``). They are step counters, not statistics:
  averaging them is meaningless and they only matter for cumulative-average batch norm
  (``momentum=None``). Each node keeps its own, counts its own steps, and saves them with its
  final model.

The reasons, the fresh optimizer of every round and the CDSGD measurement: docs/model-state.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

FLAT_DTYPE = torch.float32


@dataclass(frozen=True)
class TensorSpec:
    """One ``state_dict`` entry: name, shape, dtype, and where it lives in the flat vector."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int
    numel: int


class StateLayout:
    """Ordered mapping between a model's ``state_dict`` and one flat float32 vector."""

    def __init__(self, state: Mapping[str, torch.Tensor]) -> None:
        shared: list[TensorSpec] = []
        local: list[TensorSpec] = []
        offset = 0
        for name, tensor in state.items():
            shape = tuple(int(s) for s in tensor.shape)
            numel = int(tensor.numel())
            if tensor.is_floating_point():
                shared.append(TensorSpec(name, shape, tensor.dtype, offset, numel))
                offset += numel
            else:
                local.append(TensorSpec(name, shape, tensor.dtype, 0, numel))
        self.shared: tuple[TensorSpec, ...] = tuple(shared)
        self.local: tuple[TensorSpec, ...] = tuple(local)
        self.numel = offset

    @classmethod
    def from_module(cls, module: nn.Module) -> StateLayout:
        return cls(module.state_dict())

    def fingerprint(self) -> str:
        """SHA-256 over the names, shapes and dtypes of every entry (shared and local).

        Two nodes can exchange state only if their fingerprints match.
        """
        digest = hashlib.sha256()
        for spec in (*self.shared, *self.local):
            digest.update(f"{spec.name}|{spec.shape}|{spec.dtype}\n".encode())
        return digest.hexdigest()

    def flatten(self, state: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Copy the shared entries of ``state`` into a new flat float32 CPU vector."""
        flat = torch.empty(self.numel, dtype=FLAT_DTYPE)
        for spec in self.shared:
            flat[spec.offset : spec.offset + spec.numel].copy_(state[spec.name].reshape(-1))
        return flat

    def flatten_module(self, module: nn.Module) -> torch.Tensor:
        return self.flatten(module.state_dict())

    def local_state(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """Clones of the module's local (integer) buffers."""
        state = module.state_dict()
        return {spec.name: state[spec.name].detach().clone().cpu() for spec in self.local}

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views into ``flat`` shaped like the shared entries (no copy; dtype stays float32)."""
        self._check(flat)
        return {
            spec.name: flat[spec.offset : spec.offset + spec.numel].view(spec.shape)
            for spec in self.shared
        }

    def state_dict(
        self, flat: torch.Tensor, local: Mapping[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        """A full ``state_dict`` (own memory, original dtypes) from a flat vector and local buffers.

        Missing local buffers are filled with zeros.
        """
        out: dict[str, torch.Tensor] = {}
        views = self.views(flat)
        for spec in self.shared:
            out[spec.name] = views[spec.name].to(spec.dtype).clone()
        for spec in self.local:
            value = None if local is None else local.get(spec.name)
            out[spec.name] = (
                value.clone() if value is not None else torch.zeros(spec.shape, dtype=spec.dtype)
            )
        return out

    def load_into(
        self,
        module: nn.Module,
        flat: torch.Tensor,
        local: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        """Write ``flat`` (and, if given, the local buffers) into ``module`` in place."""
        views = self.views(flat)
        with torch.no_grad():
            state = module.state_dict()
            for spec in self.shared:
                state[spec.name].copy_(views[spec.name])
            if local is not None:
                for spec in self.local:
                    if spec.name in local:
                        state[spec.name].copy_(local[spec.name])

    def _check(self, flat: torch.Tensor) -> None:
        if flat.dim() != 1 or flat.numel() != self.numel:
            raise ValueError(
                f"flat state has shape {tuple(flat.shape)}, expected ({self.numel},) for this model"
            )
