"""The stacked model: which models can be stacked, and the layers that hold N nodes' copies.

Besides holding the N copies, the stacked model is laid out for speed on a CPU:

* **channels_last.** Convolutions, batch norm and max pooling run in the ``channels_last``
  memory format, which oneDNN's grouped convolution and PyTorch's CPU pooling and batch norm
  handle much faster than ``NCHW``.
* ``ReLU`` directly followed by ``MaxPool2d`` is run as ``MaxPool2d`` then an in-place ``ReLU``
  (the two commute, values and gradients alike, since ReLU is monotone and zeroes the gradient
  of every non-positive input), so ReLU touches a quarter of the values.
* **Linear layers update themselves.** With plain SGD (no momentum, no weight decay: the
  paper's setting) the linear layers apply ``W -= lr * grad`` inside their backward pass, fused
  into the matrix product that computes the gradient; otherwise their weight gradients go into
  buffers that persist across steps. Either way no gradient of the size of the weights is
  allocated per step.

With ``precision: bf16`` the forward pass runs under :func:`torch.autocast`: convolutions and
the stacked linear products compute in bfloat16, batch norm, pooling and ReLU move half the
bytes, while the weights, their SGD update and the flat states stay float32 (see
:class:`_StackedLinearFn` for why its weight gradient stays float32). The figures are in
``benchmarks/RESULTS.md`` ("The batched engine: where its speed comes from").
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dacflnode.learning.layout import FLAT_DTYPE

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


class Unsupported(Exception):
    pass


def check_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's layers if the batched engine can convert it, else raise :class:`Unsupported`.

    Supported: a flat ``nn.Sequential`` of ``Conv2d``, ``BatchNorm2d``, pooling and element-wise
    layers on ``[B, C, H, W]`` inputs, one ``Flatten`` of all but the batch dimension, then
    ``Linear`` and element-wise layers.
    """
    if type(model) is not nn.Sequential:
        raise Unsupported("not an nn.Sequential")
    layers = list(model.named_children())
    if not layers:
        raise Unsupported("empty model")
    spatial = True  # before Flatten: activations are [B, C, H, W]
    for name, layer in layers:
        layer_type = type(layer)
        if layer_type in _ELEMENTWISE:
            continue
        if spatial and layer_type in (nn.Conv2d, nn.BatchNorm2d, *_POOLS):
            if getattr(layer, "return_indices", False):
                raise Unsupported(f"layer {name}: MaxPool2d(return_indices=True)")
        elif spatial and layer_type is nn.Flatten:
            assert isinstance(layer, nn.Flatten)
            if layer.start_dim != 1 or layer.end_dim != -1:
                raise Unsupported(f"layer {name}: only Flatten(1, -1) is supported")
            spatial = False
        elif not spatial and layer_type is nn.Linear:
            pass
        else:
            where = "before" if spatial else "after"
            raise Unsupported(
                f"layer {name}: {layer_type.__name__} {where} Flatten is not supported")
        if any(True for _ in layer.children()):
            raise Unsupported(f"layer {name} has sub-modules")
    if spatial:
        raise Unsupported("no Flatten layer: the output must be [B, classes]")
    return layers


def can_batch(model: nn.Module) -> bool:
    """Whether :class:`BatchedTrainer` can train ``model``: an ``nn.Sequential`` of supported
    layers (``Conv2d``, ``BatchNorm2d``, ``MaxPool2d``, ``AvgPool2d``, element-wise activations,
    one ``Flatten``, ``Linear``), as all built-in models are."""
    try:
        check_layers(model)
    except Unsupported:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# Stacked layers


class _StackedLinearFn(torch.autograd.Function):
    """``y[n] = x[n] @ W[n].T + b[n]`` for ``x`` ``[N, B, in]``, ``W`` ``[N, out, in]``.

    The backward pass does not hand the parameter gradients to autograd. It either writes them
    into the owner's persistent buffers and attaches those as ``.grad`` (for the optimizer), or,
    when the owner has ``sgd_lr`` set (plain SGD: no momentum, no weight decay), applies the SGD
    step ``W -= lr * grad`` to the parameters directly, fused into the matrix product that
    computes the gradient, so that the gradient never goes through memory.

    Under :func:`torch.autocast` (bf16) the forward product and the input gradient run in the
    autocast dtype, with the float32 weights cast once per step into a persistent buffer. The
    weight gradient and the update stay float32: ``grad`` and ``x`` (``[N, B, *]``, small) are
    cast up, and the fused ``baddbmm_`` (or the gradient buffer) is exactly the float32 one.
    A low-precision weight gradient would be no faster: the update is a rank-``B`` product, bound
    by reading and writing the float32 weights either way, and adding a separate bf16 gradient
    to them costs a second pass.
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        owner: StackedLinear,
    ) -> torch.Tensor:
        ctx.owner = owner
        ctx.x_dtype = x.dtype
        device_type = x.device.type
        if not torch.is_autocast_enabled(device_type):
            ctx.save_for_backward(x, weight)
            if bias is None:
                return torch.bmm(x, weight.transpose(1, 2))
            return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))
        dtype = torch.get_autocast_dtype(device_type)
        with torch.autocast(device_type, enabled=False):
            x_low = x.to(dtype)
            w_low = owner.low_precision_weight(dtype)
            ctx.save_for_backward(x_low, w_low)
            if bias is None:
                return torch.bmm(x_low, w_low.transpose(1, 2))
            return torch.baddbmm(bias.to(dtype).unsqueeze(1), x_low, w_low.transpose(1, 2))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        x, weight = ctx.saved_tensors
        owner: StackedLinear = ctx.owner
        # The input gradient first: it needs the weights from before the update.
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.bmm(grad.to(weight.dtype), weight).to(ctx.x_dtype)
        lr = owner.sgd_lr
        master = owner.weight.dtype
        grad, x = grad.to(master), x.to(master)  # no-ops in float32; small under autocast
        if ctx.needs_input_grad[1]:
            if lr is None:
                torch.bmm(grad.transpose(1, 2), x, out=owner.grad_buffer("weight"))
            else:
                owner.weight.baddbmm_(grad.transpose(1, 2), x, alpha=-lr)
        if ctx.needs_input_grad[2]:
            assert owner.bias is not None
            if lr is None:
                torch.sum(grad, dim=1, dtype=owner.bias.dtype, out=owner.grad_buffer("bias"))
            else:
                owner.bias.add_(grad.sum(dim=1, dtype=owner.bias.dtype), alpha=-lr)
        return grad_x, None, None, None


class StackedLinear(nn.Module):
    def __init__(self, layer: nn.Linear, n: int) -> None:
        super().__init__()
        out_f, in_f = layer.weight.shape
        self.weight = nn.Parameter(torch.empty(n, out_f, in_f, dtype=FLAT_DTYPE))
        self.bias = (
            nn.Parameter(torch.empty(n, out_f, dtype=FLAT_DTYPE))
            if layer.bias is not None
            else None
        )
        self.sgd_lr: float | None = None  # set: backward applies plain SGD itself
        self._grads: dict[str, torch.Tensor] = {}
        self._low: torch.Tensor | None = None

    def low_precision_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """The weights cast to ``dtype``, into a buffer reused from step to step (a step's
        backward pass is done before the next step's forward pass overwrites it)."""
        w = self.weight.detach()
        low = self._low
        if low is None or low.dtype != dtype or low.shape != w.shape or low.device != w.device:
            low = self._low = torch.empty(w.shape, dtype=dtype, device=w.device)
        low.copy_(w)
        return low

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


class StackedModel:
    """The stacked model plus the map from ``state_dict`` names to stacked tensors."""

    def __init__(self, model: nn.Module, n: int, channels_last: bool) -> None:
        layers = check_layers(model)
        self._frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
        self.n = n
        self.channels_last = channels_last
        ops: list[nn.Module] = []
        self._where: dict[str, tuple[nn.Module, str]] = {}  # state_dict name -> (module, attr)
        self.batchnorms: dict[str, nn.BatchNorm2d] = {}  # prefix -> stacked BN
        i = 0
        while i < len(layers):
            name, layer = layers[i]
            nxt = layers[i + 1][1] if i + 1 < len(layers) else None
            if isinstance(layer, nn.Conv2d):
                conv = _stack_conv(layer, n)
                ops.append(conv)
                self._add(name, conv, ("weight", "bias"))
            elif isinstance(layer, nn.BatchNorm2d):
                bn = _stack_bn(layer, n)
                ops.append(bn)
                self.batchnorms[name] = bn
                self._add(name, bn, ("weight", "bias", "running_mean", "running_var"))
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
                lin = StackedLinear(layer, n)
                ops.append(lin)
                self._add(name, lin, ("weight", "bias"))
            else:  # element-wise layers and pooling act per channel: reuse as they are
                ops.append(layer)
            i += 1
        self.module = nn.Sequential(*ops)
        if channels_last:
            for op in ops:
                if isinstance(op, nn.Conv2d):
                    op.to(memory_format=torch.channels_last)

    def _add(self, prefix: str, module: nn.Module, keys: tuple[str, ...]) -> None:
        for key in keys:
            value = getattr(module, key)
            if value is None:
                continue
            name = f"{prefix}.{key}"
            self._where[name] = (module, key)
            if name in self._frozen:  # frozen stays frozen
                value.requires_grad_(False)

    @property
    def names(self) -> set[str]:
        return set(self._where)

    def tensor(self, name: str) -> torch.Tensor:
        """The stacked tensor holding every node's copy of ``state_dict`` entry ``name``.

        Looked up afresh each time: moving the module may replace its tensors.
        """
        module, key = self._where[name]
        value: torch.Tensor = getattr(module, key)
        return value


_INPLACE_SAFE_AFTER: tuple[type[nn.Module], ...] = (
    nn.Conv2d,
    nn.BatchNorm2d,
    nn.MaxPool2d,
    nn.AvgPool2d,
    StackedLinear,
)
"""Layers whose backward pass does not need their output, so a ReLU after them may overwrite it."""

