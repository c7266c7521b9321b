"""Train N nodes' copies of one architecture at once, as one stacked model.

A simulation runs N virtual nodes in one process. Training them one after the other leaves most
of the machine idle on small models (a 20-sample mini-batch is too little work to keep the
matrix kernels busy, and per-call overheads dominate). :class:`BatchedTrainer` instead converts
the model, layer by layer, into one stacked model that holds all N nodes' weights and runs all
N nodes' mini-batches through one set of kernels:

* ``Conv2d(cin, cout, groups=g)`` becomes ``Conv2d(N*cin, N*cout, groups=N*g)`` on
  channel-packed activations ``[B, N*C, H, W]`` (node-major: node ``n`` owns channels
  ``n*C .. n*C+C-1``), so every node convolves only its own channels with its own filters;
* ``BatchNorm2d(C)`` becomes ``BatchNorm2d(N*C)``: statistics are per channel, hence per node;
* ``ReLU`` and other element-wise activations, ``MaxPool2d`` and ``AvgPool2d`` act per channel
  and are used unchanged;
* ``Flatten`` turns ``[B, N*C, H, W]`` into ``[N, B, C*H*W]``;
* ``Linear`` keeps per-node weights ``[N, out, in]`` and runs as one batched matrix product.

Every stacked tensor viewed as ``[N, *original_shape]`` holds the N nodes' copies of one
``state_dict`` entry, so loading and extracting ``[N, P]`` flat vectors (see
:class:`~dacflnode.learning.layout.StateLayout`) is plain slicing.

The loss is the sum over nodes of each node's mean cross-entropy. No node's loss depends on
another node's weights, so the gradient with respect to node ``n``'s weights is exactly node
``n``'s own gradient, and one SGD optimizer over the stacked parameters (element-wise updates with
the same lr, momentum and weight decay) performs exactly the N separate SGD updates. Every node
follows the same :func:`~dacflnode.learning.train.batch_plan` as a
:class:`~dacflnode.learning.train.LocalTrainer` with the same ``node_index``, so both engines
see the same mini-batches and agree up to float32 rounding.

Speed-ups that keep the results the same:

* convolutions and batch norm run in the ``channels_last`` memory format, which oneDNN's grouped
  convolution, max pooling and batch norm handle much faster on CPUs;
* ``ReLU`` directly followed by ``MaxPool2d`` is run as ``MaxPool2d`` then ``ReLU`` (the two
  commute, values and gradients alike, since ReLU is monotone and zeroes the gradient of every
  non-positive input) so that ReLU touches a quarter of the values, in place;
* the (large) weight gradients of the linear layers are written into buffers that persist
  across steps instead of being allocated anew every step: fresh multi-megabyte allocations are
  served by the operating system page by page and cost more than the matrix products.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dacflnode.learning.layout import FLAT_DTYPE, StateLayout
from dacflnode.learning.train import TrainConfig, TrainResult, batch_plan

_ELEMENTWISE: tuple[type[nn.Module], ...] = (
    nn.ReLU,
    nn.LeakyReLU,
    nn.ELU,
    nn.GELU,
    nn.SiLU,
    nn.Tanh,
    nn.Sigmoid,
    nn.Identity,
)
_POOLS: tuple[type[nn.Module], ...] = (nn.MaxPool2d, nn.AvgPool2d)


class _Unsupported(Exception):
    pass


def _check_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's layers if the batched engine can convert it, else raise :class:`_Unsupported`.

    Supported: a flat ``nn.Sequential`` of ``Conv2d``, ``BatchNorm2d``, pooling and element-wise
    layers on ``[B, C, H, W]`` inputs, one ``Flatten`` of all but the batch dimension, then
    ``Linear`` and element-wise layers.
    """
    if type(model) is not nn.Sequential:
        raise _Unsupported("not an nn.Sequential")
    layers = list(model.named_children())
    if not layers:
        raise _Unsupported("empty model")
    spatial = True  # before Flatten: activations are [B, C, H, W]
    for name, layer in layers:
        kind = type(layer)
        if kind in _ELEMENTWISE:
            continue
        if spatial and (kind is nn.Conv2d or kind is nn.BatchNorm2d or kind in _POOLS):
            pass
        elif spatial and kind is nn.Flatten:
            assert isinstance(layer, nn.Flatten)
            if layer.start_dim != 1 or layer.end_dim != -1:
                raise _Unsupported(f"layer {name}: only Flatten(1, -1) is supported")
            spatial = False
        elif not spatial and kind is nn.Linear:
            pass
        else:
            where = "before" if spatial else "after"
            raise _Unsupported(f"layer {name}: {kind.__name__} {where} Flatten is not supported")
        if any(True for _ in layer.children()):
            raise _Unsupported(f"layer {name} has sub-modules")
    if spatial:
        raise _Unsupported("no Flatten layer: the output must be [B, classes]")
    return layers


def can_batch(model: nn.Module) -> bool:
    """Whether :class:`BatchedTrainer` can train ``model``: an ``nn.Sequential`` of supported
    layers (``Conv2d``, ``BatchNorm2d``, ``MaxPool2d``, ``AvgPool2d``, element-wise activations,
    one ``Flatten``, ``Linear``), as all built-in models are."""
    try:
        _check_layers(model)
    except _Unsupported:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# Stacked layers


class _StackedLinearFn(torch.autograd.Function):
    """``y[n] = x[n] @ W[n].T + b[n]`` for ``x`` ``[N, B, in]``, ``W`` ``[N, out, in]``.

    The backward pass writes the parameter gradients straight into the owner's persistent
    buffers and assigns them to ``.grad`` (so an optimizer sees them), returning no gradient for
    the parameters to autograd.
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        owner: _StackedLinear,
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.owner = owner
        if bias is None:
            return torch.bmm(x, weight.transpose(1, 2))
        return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        x, weight = ctx.saved_tensors
        owner: _StackedLinear = ctx.owner
        grad_x = torch.bmm(grad, weight) if ctx.needs_input_grad[0] else None
        if ctx.needs_input_grad[1]:
            torch.bmm(grad.transpose(1, 2), x, out=owner.grad_buffer("weight"))
        if ctx.needs_input_grad[2]:
            torch.sum(grad, dim=1, out=owner.grad_buffer("bias"))
        return grad_x, None, None, None


class _StackedLinear(nn.Module):
    def __init__(self, layer: nn.Linear, n: int) -> None:
        super().__init__()
        out_f, in_f = layer.weight.shape
        self.weight = nn.Parameter(torch.empty(n, out_f, in_f, dtype=FLAT_DTYPE))
        self.bias = (
            nn.Parameter(torch.empty(n, out_f, dtype=FLAT_DTYPE))
            if layer.bias is not None
            else None
        )
        self._grads: dict[str, torch.Tensor] = {}

    def grad_buffer(self, which: str) -> torch.Tensor:
        """The persistent gradient buffer of ``weight`` or ``bias``, attached as its ``.grad``."""
        param = self.weight if which == "weight" else self.bias
        assert param is not None
        buf = self._grads.get(which)
        if buf is None or buf.shape != param.shape or buf.device != param.device:
            buf = torch.empty_like(param, memory_format=torch.contiguous_format)
            self._grads[which] = buf
        param.grad = buf
        return buf

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (self.weight.requires_grad or x.requires_grad):
            out: torch.Tensor = _StackedLinearFn.apply(x, self.weight, self.bias, self)
            return out
        if self.bias is None:
            return torch.bmm(x, self.weight.transpose(1, 2))
        return torch.baddbmm(self.bias.unsqueeze(1), x, self.weight.transpose(1, 2))


class _ToNodes(nn.Module):
    """``Flatten``: channel-packed ``[B, N*C, H, W]`` to per-node rows ``[N, B, C*H*W]``."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        return x.reshape(b, self.n, -1).transpose(0, 1)


class _InplaceReLU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x, inplace=True)


def _stack_conv(layer: nn.Conv2d, n: int) -> nn.Conv2d:
    return nn.Conv2d(
        layer.in_channels * n,
        layer.out_channels * n,
        layer.kernel_size,  # type: ignore[arg-type]
        stride=layer.stride,  # type: ignore[arg-type]
        padding=layer.padding,  # type: ignore[arg-type]
        dilation=layer.dilation,  # type: ignore[arg-type]
        groups=layer.groups * n,
        bias=layer.bias is not None,
        padding_mode=layer.padding_mode,
        dtype=FLAT_DTYPE,
    )


def _stack_bn(layer: nn.BatchNorm2d, n: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(
        layer.num_features * n,
        eps=layer.eps,
        momentum=layer.momentum,
        affine=layer.affine,
        track_running_stats=layer.track_running_stats,
        dtype=FLAT_DTYPE,
    )


class _Stacked:
    """The stacked model plus the map from ``state_dict`` names to stacked tensors."""

    def __init__(self, model: nn.Module, n: int, channels_last: bool) -> None:
        layers = _check_layers(model)
        self.n = n
        self.channels_last = channels_last
        ops: list[nn.Module] = []
        self.tensors: dict[str, torch.Tensor] = {}  # state_dict name -> stacked tensor
        self.batchnorms: dict[str, nn.BatchNorm2d] = {}  # prefix -> stacked BN
        i = 0
        while i < len(layers):
            name, layer = layers[i]
            nxt = layers[i + 1][1] if i + 1 < len(layers) else None
            if isinstance(layer, nn.Conv2d):
                conv = _stack_conv(layer, n)
                ops.append(conv)
                self._add(name, "weight", conv.weight)
                if conv.bias is not None:
                    self._add(name, "bias", conv.bias)
            elif isinstance(layer, nn.BatchNorm2d):
                bn = _stack_bn(layer, n)
                ops.append(bn)
                self.batchnorms[name] = bn
                for key in ("weight", "bias", "running_mean", "running_var"):
                    value = getattr(bn, key)
                    if value is not None:
                        self._add(name, key, value)
            elif type(layer) is nn.ReLU and isinstance(nxt, nn.MaxPool2d):
                # relu(maxpool(x)) == maxpool(relu(x)), gradients included; see module docs.
                ops.append(nxt)
                ops.append(_InplaceReLU())
                i += 1
            elif type(layer) is nn.ReLU and ops and isinstance(ops[-1], _INPLACE_SAFE_AFTER):
                ops.append(_InplaceReLU())
            elif isinstance(layer, nn.Flatten):
                ops.append(_ToNodes(n))
            elif isinstance(layer, nn.Linear):
                lin = _StackedLinear(layer, n)
                ops.append(lin)
                self._add(name, "weight", lin.weight)
                if lin.bias is not None:
                    self._add(name, "bias", lin.bias)
            else:  # element-wise layers and pooling act per channel: reuse as they are
                ops.append(layer)
            i += 1
        self.module = nn.Sequential(*ops)
        if channels_last:
            for op in ops:
                if isinstance(op, nn.Conv2d):
                    op.to(memory_format=torch.channels_last)

    def _add(self, prefix: str, key: str, tensor: torch.Tensor) -> None:
        self.tensors[f"{prefix}.{key}"] = tensor

    def to(self, device: torch.device) -> None:
        self.module.to(device)
        # Parameters keep their identity under Module.to, but buffers may be replaced.
        for prefix, bn in self.batchnorms.items():
            for key in ("running_mean", "running_var"):
                value = getattr(bn, key)
                if value is not None:
                    self.tensors[f"{prefix}.{key}"] = value


_INPLACE_SAFE_AFTER: tuple[type[nn.Module], ...] = (
    nn.Conv2d,
    nn.BatchNorm2d,
    nn.MaxPool2d,
    nn.AvgPool2d,
    _StackedLinear,
)
"""Layers whose backward pass does not need their output, so a ReLU after them may overwrite it."""


# ---------------------------------------------------------------------------------------------


class BatchedTrainer:
    """Trains N copies of one architecture as one stacked model.

    ``node_data[n]`` is node ``n``'s ``(x [S_n, C, H, W], y [S_n])``; node ``n`` follows
    ``batch_plan(S_n, cfg, seed, n, round)``. All nodes must take the same number of steps with
    the same batch size at every step (in practice: equal partition sizes), otherwise
    :meth:`train` raises ``ValueError``; use one
    :class:`~dacflnode.learning.train.LocalTrainer` per node then.

    ``local[n]`` holds node ``n``'s integer buffers (batch-norm step counters), counted exactly
    as a ``LocalTrainer`` counts them.
    """

    def __init__(
        self,
        model: nn.Module,
        node_data: Sequence[tuple[torch.Tensor, torch.Tensor]],
        cfg: TrainConfig,
        *,
        seed: int,
        device: torch.device | None = None,
    ) -> None:
        try:
            _check_layers(model)
        except _Unsupported as exc:
            raise ValueError(
                f"the batched engine cannot train this model ({exc}); use the sequential engine"
            ) from None
        if not node_data:
            raise ValueError("node_data is empty")
        self.n = len(node_data)
        self.cfg = cfg
        self.seed = seed
        self.device = torch.device("cpu") if device is None else torch.device(device)
        template = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        self.layout = StateLayout(template)
        local0 = {s.name: template[s.name].clone() for s in self.layout.local}
        self.local: list[dict[str, torch.Tensor]] = [
            {k: v.clone() for k, v in local0.items()} for _ in range(self.n)
        ]
        self._stacked = _Stacked(model, self.n, channels_last=self.device.type == "cpu")
        self._stacked.to(self.device)
        missing = {s.name for s in self.layout.shared} ^ set(self._stacked.tensors)
        if missing:
            raise ValueError(f"internal error: stacked model does not cover {sorted(missing)}")
        self._counters = [
            s.name for s in self.layout.local if s.name.endswith("num_batches_tracked")
        ]

        # All nodes' data in one tensor, so that one gather builds a packed batch.
        shapes = {tuple(x.shape[1:]) for x, _ in node_data}
        if len(shapes) != 1:
            raise ValueError(f"nodes' samples differ in shape: {sorted(shapes)}")
        self.sample_shape: tuple[int, ...] = shapes.pop()
        for x, y in node_data:
            if y.ndim != 1 or x.shape[0] != y.shape[0]:
                raise ValueError(
                    f"data of shape {tuple(x.shape)} does not match labels {tuple(y.shape)}"
                )
        self.sizes = [int(y.shape[0]) for _, y in node_data]
        offsets = [0]
        for s in self.sizes[:-1]:
            offsets.append(offsets[-1] + s)
        self._offsets = torch.tensor(offsets, dtype=torch.long)
        self._x = torch.cat([x.to(FLAT_DTYPE) for x, _ in node_data]).to(self.device)
        self._y = torch.cat([y.long() for _, y in node_data]).to(self.device)

    # -------------------------------------------------------------- state in and out
    def load(self, flats: torch.Tensor) -> None:
        """Write the nodes' flat vectors ``[N, P]`` into the stacked model."""
        if flats.dim() != 2 or tuple(flats.shape) != (self.n, self.layout.numel):
            raise ValueError(
                f"flats has shape {tuple(flats.shape)}, expected ({self.n}, {self.layout.numel})"
            )
        with torch.no_grad():
            for spec in self.layout.shared:
                target = self._stacked.tensors[spec.name]
                chunk = flats[:, spec.offset : spec.offset + spec.numel]
                target.copy_(chunk.reshape(target.shape))

    def extract(self) -> torch.Tensor:
        """The nodes' flat vectors ``[N, P]`` (new CPU float32 tensor) from the stacked model."""
        out = torch.empty(self.n, self.layout.numel, dtype=FLAT_DTYPE)
        with torch.no_grad():
            for spec in self.layout.shared:
                source = self._stacked.tensors[spec.name].detach()
                out[:, spec.offset : spec.offset + spec.numel].copy_(
                    source.reshape(self.n, spec.numel)
                )
        return out

    def _set_counters(self, training: bool) -> None:
        """Give each stacked batch norm the nodes' step counter (needed for momentum=None)."""
        for prefix, bn in self._stacked.batchnorms.items():
            name = f"{prefix}.num_batches_tracked"
            if bn.num_batches_tracked is None or name not in self.local[0]:
                continue
            counts = {int(local[name]) for local in self.local}
            if training and bn.momentum is None and len(counts) > 1:
                raise ValueError(
                    f"batch norm {prefix} averages cumulatively (momentum=None) and the nodes' "
                    "step counters differ; use the sequential engine"
                )
            bn.num_batches_tracked.fill_(min(counts))

    # -------------------------------------------------------------- training
    def plans(self, round: int) -> list[list[torch.Tensor]]:
        return [
            batch_plan(size, self.cfg, self.seed, node, round)
            for node, size in enumerate(self.sizes)
        ]

    def _packed_steps(self, round: int) -> list[torch.Tensor]:
        """Per step, the ``[B, N]`` indices into the concatenated data (row = sample slot)."""
        plans = self.plans(round)
        steps = {len(p) for p in plans}
        if len(steps) != 1:
            raise ValueError(
                f"nodes take different numbers of steps this round ({sorted(steps)}); the "
                "batched engine needs equal partition sizes, use the sequential engine"
            )
        out = []
        for t in range(steps.pop()):
            sizes = {int(p[t].numel()) for p in plans}
            if len(sizes) != 1:
                raise ValueError(
                    f"nodes' batch sizes differ at step {t} ({sorted(sizes)}); the batched "
                    "engine needs equal partition sizes, use the sequential engine"
                )
            idx = torch.stack([p[t] for p in plans]) + self._offsets[:, None]  # [N, B]
            out.append(idx.t().contiguous().to(self.device))
        return out

    def _pack(self, x: torch.Tensor) -> torch.Tensor:
        """``[B*N, C, H, W]`` in (sample, node) order -> channel-packed ``[B, N*C, H, W]``."""
        b = x.shape[0] // self.n
        packed = x.view(b, self.n * x.shape[1], *x.shape[2:])
        if self._stacked.channels_last:
            packed = packed.contiguous(memory_format=torch.channels_last)
        return packed

    def train(self, flats: torch.Tensor, round: int) -> list[TrainResult]:
        """Train every node from its row of ``flats`` ``[N, P]`` for one round.

        Node ``n``'s result equals ``LocalTrainer(..., node_index=n).train(flats[n], round)`` up
        to float32 rounding. As there, the optimizer is fresh every round (momentum is not
        carried over: each round starts from a new, mixed model).
        """
        steps = self._packed_steps(round)
        self.load(flats)
        self._set_counters(training=True)
        module = self._stacked.module
        module.train()
        params = [p for p in module.parameters() if p.requires_grad]
        opt = torch.optim.SGD(
            params,
            lr=self.cfg.lr_at(round),
            momentum=self.cfg.momentum,
            weight_decay=self.cfg.weight_decay,
        )
        losses: list[torch.Tensor] = []
        samples = 0
        for idx in steps:
            flat_idx = idx.reshape(-1)
            xb = self._pack(self._x.index_select(0, flat_idx))
            yb = self._y.index_select(0, idx.t().reshape(-1))  # node-major [N*B]
            opt.zero_grad(set_to_none=True)
            logits = module(xb)  # [N, B, K]
            per_sample = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), yb, reduction="none"
            )
            per_node = per_sample.view(self.n, -1).mean(dim=1)
            per_node.sum().backward()
            opt.step()
            losses.append(per_node.detach())
            samples += int(idx.shape[0])
        for local in self.local:
            for name in self._counters:
                if name in local:
                    local[name] = local[name] + len(steps)
        flats_out = self.extract()
        node_loss = (
            torch.stack(losses).double().mean(dim=0).cpu().tolist()
            if losses
            else [math.nan] * self.n
        )
        return [
            TrainResult(flat=flats_out[i].clone(), loss=float(node_loss[i]), steps=len(steps),
                        samples=samples)
            for i in range(self.n)
        ]

    # -------------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(
        self,
        flats: torch.Tensor,
        test_x: torch.Tensor,
        test_y: torch.Tensor,
        batch_size: int = 1000,
    ) -> list[tuple[float, float]]:
        """Per node ``(accuracy, mean cross-entropy)`` of the models ``flats`` ``[N, P]`` on one
        test set, in eval mode, as :func:`~dacflnode.learning.train.evaluate` computes them.

        Every node sees the same test batch; ``batch_size`` bounds the memory like that of a
        single model evaluated with that batch size (each chunk holds ``batch_size / N``
        samples for each of the N nodes).
        """
        if test_y.ndim != 1 or test_x.shape[0] != test_y.shape[0]:
            raise ValueError(
                f"data of shape {tuple(test_x.shape)} does not match labels {tuple(test_y.shape)}"
            )
        total = int(test_y.shape[0])
        if total == 0:
            raise ValueError("cannot evaluate on an empty test set")
        self.load(flats)
        self._set_counters(training=False)
        module = self._stacked.module
        module.eval()
        chunk = max(1, batch_size // self.n)
        correct = torch.zeros(self.n, dtype=torch.long, device=self.device)
        loss_sum = torch.zeros(self.n, dtype=torch.float64, device=self.device)
        for start in range(0, total, chunk):
            xb = test_x[start : start + chunk].to(self.device, FLAT_DTYPE)
            yb = test_y[start : start + chunk].to(self.device).long()
            b = xb.shape[0]
            packed = xb.unsqueeze(1).expand(b, self.n, *xb.shape[1:])
            packed = packed.reshape(b, self.n * xb.shape[1], *xb.shape[2:])
            if self._stacked.channels_last:
                packed = packed.contiguous(memory_format=torch.channels_last)
            logits = module(packed)  # [N, b, K]
            k = logits.shape[-1]
            targets = yb.repeat(self.n)
            ce = F.cross_entropy(logits.reshape(-1, k), targets, reduction="none")
            loss_sum += ce.view(self.n, b).double().sum(dim=1)
            correct += (logits.argmax(dim=-1) == yb.unsqueeze(0)).sum(dim=1)
        return [
            (int(correct[i]) / total, float(loss_sum[i]) / total) for i in range(self.n)
        ]
