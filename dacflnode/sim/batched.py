"""Train N nodes' copies of one architecture at once, as one stacked model.

A simulation runs N virtual nodes in one process. :class:`BatchedTrainer` converts the model,
layer by layer, into one stacked model that holds all N nodes' weights and runs all N nodes'
mini-batches through one set of kernels:

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
see the same mini-batches and agree up to float32 rounding (which, as between any two float32
implementations, training can amplify: batch norm over small batches is ill-conditioned).

Where the speed comes from, on a CPU (measured for ``fmnist-cnn``, 10 nodes, batch 20, on 2
cores, against a bare single-model PyTorch loop; see ``benchmarks/bench_training.py``). Most of
the time is the second convolution, which runs near the cores' peak in both cases, so the gains
are in everything around it:

* **Bigger kernels.** A stacked model does per step what one model does in N steps, with the
  same arithmetic but a fraction of the per-call overheads, and its kernels are large enough to
  spread over the cores: with one thread it trains about 1.3-1.4x the samples per CPU-second of
  the bare loop; going from one to two threads gains it about 1.7x, the bare loop about 1.45x.
* **channels_last.** Convolutions, batch norm and max pooling run in the ``channels_last``
  memory format, which oneDNN's grouped convolution and PyTorch's CPU pooling and batch norm
  handle much faster (max pooling ~25x) than ``NCHW``.
* ``ReLU`` directly followed by ``MaxPool2d`` is run as ``MaxPool2d`` then an in-place ``ReLU``
  (the two commute, values and gradients alike, since ReLU is monotone and zeroes the gradient
  of every non-positive input), so ReLU touches a quarter of the values.
* **Linear layers update themselves.** With plain SGD (no momentum, no weight decay: the
  paper's setting) the linear layers apply ``W -= lr * grad`` inside their backward pass, fused
  into the matrix product that computes the gradient; otherwise their weight gradients go into
  buffers that persist across steps. Either way no 64 MB gradient is allocated per step.
* **No page faults.** glibc's ``malloc`` is told to keep freed memory
  (:func:`_keep_freed_memory`): a fresh multi-megabyte allocation is faulted in by the OS page
  by page, which costs as much as some layers' arithmetic.
* **One worker per core.** The nodes are split into as many groups as PyTorch has intra-op
  threads, each a stacked model trained on its own thread with single-threaded kernels. On a
  quiet machine that is as fast as one group using all cores per kernel; when other processes
  compete for the cores it is much faster (2.2x measured at load average 4), as no kernel waits
  at a barrier for a descheduled thread. Results do not depend on the split.

Those are float32 figures. With ``precision: bf16`` the forward pass runs under
:func:`torch.autocast`: convolutions and the stacked linear products compute in bfloat16 (on a
CPU with AVX-512 BF16/AMX, oneDNN's bf16 kernels run several times faster than fp32), batch
norm, pooling and ReLU move half the bytes, while the weights, their SGD update and the flat
states stay float32. Measured on one thread in CPU time (so that other load does not count),
10 nodes, batch 20, Fashion-MNIST: training 1.75-1.8x the samples per CPU-second of the fp32
stacked model (about 2,100 against 1,170), evaluation 2.3x (about 9,100 against 4,000). The
convolutions stop dominating; the largest single cost becomes the first linear layer
(3136 x 512 per node, 16 M weights for 10 nodes), whose matrix products at batch 20 are bound
by memory, not arithmetic: each step casts its float32 weights to bf16 once (about 9 ms on one
core), runs the forward and input-gradient products in bf16 (3 + 2.5 ms, against 11 + 13 ms in
fp32) and applies the fused float32 update (8 ms). Computing the weight gradient in bf16 and
adding it to the float32 weights instead doubled the layer's time (80-90 ms against 31 ms per
step), which is why :class:`_StackedLinearFn` keeps that product in float32. See
``benchmarks/profiles/simulator_bf16.txt``.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import platform
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dacflnode.learning.layout import FLAT_DTYPE, StateLayout
from dacflnode.learning.train import (
    TrainConfig,
    TrainResult,
    autocast,
    autocast_dtype,
    batch_plan,
)

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
            if getattr(layer, "return_indices", False):
                raise _Unsupported(f"layer {name}: MaxPool2d(return_indices=True)")
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
        owner: _StackedLinear,
    ) -> torch.Tensor:
        ctx.owner = owner
        ctx.x_dtype = x.dtype
        kind = x.device.type
        if not torch.is_autocast_enabled(kind):
            ctx.save_for_backward(x, weight)
            if bias is None:
                return torch.bmm(x, weight.transpose(1, 2))
            return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))
        dtype = torch.get_autocast_dtype(kind)
        with torch.autocast(kind, enabled=False):
            x_low = x.to(dtype)
            w_low = owner.low_precision_weight(dtype)
            ctx.save_for_backward(x_low, w_low)
            if bias is None:
                return torch.bmm(x_low, w_low.transpose(1, 2))
            return torch.baddbmm(bias.to(dtype).unsqueeze(1), x_low, w_low.transpose(1, 2))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        x, weight = ctx.saved_tensors
        owner: _StackedLinear = ctx.owner
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


class _Stacked:
    """The stacked model plus the map from ``state_dict`` names to stacked tensors."""

    def __init__(self, model: nn.Module, n: int, channels_last: bool) -> None:
        layers = _check_layers(model)
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
                lin = _StackedLinear(layer, n)
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
    _StackedLinear,
)
"""Layers whose backward pass does not need their output, so a ReLU after them may overwrite it."""


# ---------------------------------------------------------------------------------------------
# Memory allocation

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_malloc_tuned = False


def _keep_freed_memory() -> None:
    """Make glibc's ``malloc`` keep freed memory for reuse instead of returning it to the OS.

    PyTorch allocates every activation and gradient afresh with ``malloc``. By default glibc
    serves blocks above a (dynamic, at most 32 MiB) threshold with ``mmap`` and gives freed heap
    memory back once more than twice that lies unused at its top, so the megabyte-sized tensors
    of a stacked model are re-faulted into memory page by page at every step. That costs as much
    as some of the layers' arithmetic. Raising both thresholds once per process makes such
    blocks come from, and stay in, the heap; the price is that the process keeps up to the trim
    threshold of freed memory. A no-op where the C library is not glibc.
    """
    global _malloc_tuned
    if _malloc_tuned:
        return
    _malloc_tuned = True
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if not mallopt(_M_MMAP_THRESHOLD, 256 << 20):
        mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # older glibc caps the threshold
    mallopt(_M_TRIM_THRESHOLD, 1 << 30)


# ---------------------------------------------------------------------------------------------
# One stacked model over a contiguous range of nodes


class _Group:
    """Nodes ``lo .. hi-1`` as one stacked model, with their data concatenated."""

    def __init__(
        self,
        model: nn.Module,
        layout: StateLayout,
        node_data: Sequence[tuple[torch.Tensor, torch.Tensor]],
        lo: int,
        device: torch.device,
        amp_dtype: torch.dtype | None = None,
    ) -> None:
        self.lo = lo
        self.amp_dtype = amp_dtype
        self.n = len(node_data)
        self.hi = lo + self.n
        self.layout = layout
        self.device = device
        self.stacked = _Stacked(model, self.n, channels_last=device.type == "cpu")
        self.stacked.module.to(device)
        if {s.name for s in layout.shared} != self.stacked.names:
            raise ValueError("internal error: the stacked model does not cover the state")
        sizes = [int(y.shape[0]) for _, y in node_data]
        self.offsets = torch.tensor([sum(sizes[:i]) for i in range(self.n)], dtype=torch.long)
        self.x = torch.cat([x.to(FLAT_DTYPE) for x, _ in node_data]).to(device)
        self.y = torch.cat([y.long() for _, y in node_data]).to(device)

    def load(self, flats: torch.Tensor) -> None:
        with torch.no_grad():
            for spec in self.layout.shared:
                target = self.stacked.tensor(spec.name)
                chunk = flats[:, spec.offset : spec.offset + spec.numel]
                target.copy_(chunk.reshape(target.shape))

    def extract(self, out: torch.Tensor) -> None:
        with torch.no_grad():
            for spec in self.layout.shared:
                source = self.stacked.tensor(spec.name).detach()
                out[:, spec.offset : spec.offset + spec.numel].copy_(
                    source.reshape(self.n, spec.numel)
                )

    def set_counters(self, local: Sequence[dict[str, torch.Tensor]]) -> None:
        """Give each stacked batch norm the nodes' step counter.

        Only batch norm with ``momentum=None`` (a cumulative average, weighted by the counter)
        uses it, and one stacked layer has one counter: its nodes' counters must agree.
        """
        for prefix, bn in self.stacked.batchnorms.items():
            name = f"{prefix}.num_batches_tracked"
            if bn.num_batches_tracked is None or name not in local[0]:
                continue
            counts = {int(node[name]) for node in local}
            if bn.momentum is None and len(counts) > 1:
                raise ValueError(
                    f"batch norm {prefix} averages cumulatively (momentum=None) and the nodes' "
                    "step counters differ; use the sequential engine"
                )
            bn.num_batches_tracked.fill_(min(counts))

    def pack(self, x: torch.Tensor, b: int) -> torch.Tensor:
        """``[B*n, C, H, W]`` in (sample, node) order -> channel-packed ``[B, n*C, H, W]``."""
        packed = x.view(b, self.n * x.shape[1], *x.shape[2:])
        if self.stacked.channels_last and packed.dim() == 4:
            packed = packed.contiguous(memory_format=torch.channels_last)
        return packed

    def train(
        self,
        flats: torch.Tensor,
        steps: Sequence[torch.Tensor],
        cfg: TrainConfig,
        round: int,
        out: torch.Tensor,
    ) -> torch.Tensor:
        """Train from ``flats`` ``[n, P]`` along ``steps`` (each ``[n, B]`` positions into the
        nodes' own data); write the results into ``out`` ``[n, P]``; return the per-step,
        per-node losses ``[steps, n]``."""
        self.load(flats)
        module = self.stacked.module
        module.train()
        lr = cfg.lr_at(round)
        # Plain SGD: the linear layers update themselves during the backward pass.
        fused = [m for m in module if isinstance(m, _StackedLinear)]
        if cfg.momentum != 0 or cfg.weight_decay != 0:
            fused = []
        skip = {id(p) for m in fused for p in m.parameters()}
        params = [p for p in module.parameters() if p.requires_grad and id(p) not in skip]
        opt = torch.optim.SGD(
            params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        ) if params else None
        for m in fused:
            m.sgd_lr = lr
        try:
            losses = self._run_steps(module, opt, steps)
        finally:
            for m in fused:
                m.sgd_lr = None
        self.extract(out)
        return losses

    def _run_steps(
        self, module: nn.Module, opt: torch.optim.Optimizer | None, steps: Sequence[torch.Tensor]
    ) -> torch.Tensor:
        offsets = self.offsets.to(self.device)
        losses: list[torch.Tensor] = []
        for plan_step in steps:
            idx = plan_step.to(self.device) + offsets[:, None]  # [n, B], node-major
            b = idx.shape[1]
            xb = self.pack(self.x.index_select(0, idx.t().reshape(-1)), b)
            yb = self.y.index_select(0, idx.reshape(-1))
            if opt is not None:
                opt.zero_grad(set_to_none=True)
            with autocast(self.device, self.amp_dtype):
                logits = module(xb)  # [n, B, K]
            per_sample = F.cross_entropy(
                logits.float().reshape(-1, logits.shape[-1]), yb, reduction="none"
            )
            per_node = per_sample.view(self.n, b).mean(dim=1)
            torch.autograd.backward(per_node.sum())
            if opt is not None:
                opt.step()
            losses.append(per_node.detach())
        if not losses:
            return torch.empty(0, self.n)
        return torch.stack(losses).cpu()

    @torch.no_grad()
    def evaluate(
        self,
        flats: torch.Tensor,
        test_x: torch.Tensor,
        test_y: torch.Tensor,
        chunk: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per node, the number of correct predictions and the summed cross-entropy."""
        self.load(flats)
        module = self.stacked.module
        module.eval()
        correct = torch.zeros(self.n, dtype=torch.long, device=self.device)
        loss_sum = torch.zeros(self.n, dtype=torch.float64, device=self.device)
        # one autocast region for all chunks: each weight is cast to bf16 once, not per chunk
        with autocast(self.device, self.amp_dtype):
            for start in range(0, int(test_y.shape[0]), chunk):
                xb = test_x[start : start + chunk].to(self.device, FLAT_DTYPE)
                yb = test_y[start : start + chunk].to(self.device).long()
                b = xb.shape[0]
                packed = self.pack(xb.unsqueeze(1).expand(b, self.n, *xb.shape[1:]).reshape(
                    b * self.n, *xb.shape[1:]), b)
                logits = module(packed).float()  # [n, b, K]
                ce = F.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), yb.repeat(self.n), reduction="none"
                )
                loss_sum += ce.view(self.n, b).double().sum(dim=1)
                correct += (logits.argmax(dim=-1) == yb.unsqueeze(0)).sum(dim=1)
        return correct.cpu(), loss_sum.cpu()


def split_bounds(n: int, workers: int) -> list[int]:
    """Where ``n`` nodes are cut into ``workers`` contiguous groups: group ``i`` holds nodes
    ``bounds[i] .. bounds[i+1] - 1``. A node's last bits depend on its group, so every engine
    that must equal the batched engine bit for bit cuts its nodes here."""
    return [i * n // workers for i in range(workers + 1)]


def _run_parallel(jobs: Sequence[Callable[[], None]]) -> None:
    """Run ``jobs`` on one CPU thread each, every thread's PyTorch ops single-threaded.

    The process-wide intra-op thread count is set to 1 while the jobs run and restored after.
    """
    if len(jobs) == 1:
        jobs[0]()
        return
    errors: list[BaseException] = []

    def work(job: Callable[[], None]) -> None:
        try:
            torch.set_num_threads(1)
            job()
        except BaseException as exc:  # re-raised in the calling thread
            errors.append(exc)

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        threads = [threading.Thread(target=work, args=(job,)) for job in jobs[1:]]
        for thread in threads:
            thread.start()
        work(jobs[0])
        for thread in threads:
            thread.join()
    finally:
        torch.set_num_threads(saved)
    if errors:
        raise errors[0]


# ---------------------------------------------------------------------------------------------


class BatchedTrainer:
    """Trains N copies of one architecture as one stacked model.

    ``node_data[n]`` is node ``n``'s ``(x [S_n, C, H, W], y [S_n])``; node ``n`` follows
    ``batch_plan(S_n, cfg, seed, n, round)``. All nodes must take the same number of steps with
    the same batch size at every step (in practice: equal partition sizes), otherwise
    :meth:`train` raises ``ValueError``; use one
    :class:`~dacflnode.learning.train.LocalTrainer` per node then.

    On the CPU the nodes are split into ``workers`` groups (default: as many as PyTorch's
    intra-op threads, at most N), each a stacked model trained on its own thread with
    single-threaded kernels: as fast as one group on a quiet machine, much faster when other
    processes compete for the cores. While they run, the process-wide intra-op thread count is
    1 (restored afterwards), so do not run other PyTorch work in parallel threads meanwhile. The
    results do not depend on the split. On an accelerator there is one group.

    ``local[n]`` holds node ``n``'s integer buffers (batch-norm step counters), counted exactly
    as a ``LocalTrainer`` counts them.

    ``first_node``: the run-wide index of ``node_data[0]``, for a trainer that holds a contiguous
    slice of a run's nodes (node ``n`` here follows the plan of node ``first_node + n``).
    """

    def __init__(
        self,
        model: nn.Module,
        node_data: Sequence[tuple[torch.Tensor, torch.Tensor]],
        cfg: TrainConfig,
        *,
        seed: int,
        device: torch.device | None = None,
        workers: int | None = None,
        first_node: int = 0,
    ) -> None:
        try:
            _check_layers(model)
        except _Unsupported as exc:
            raise ValueError(
                f"the batched engine cannot train this model ({exc}); use the sequential engine"
            ) from None
        if not node_data:
            raise ValueError("node_data is empty")
        shapes = {tuple(x.shape[1:]) for x, _ in node_data}
        if len(shapes) != 1:
            raise ValueError(f"the nodes' samples differ in shape: {sorted(shapes)}")
        for x, y in node_data:
            if y.ndim != 1 or x.shape[0] != y.shape[0]:
                raise ValueError(
                    f"data of shape {tuple(x.shape)} does not match labels {tuple(y.shape)}"
                )
        self.n = len(node_data)
        #: the index of ``node_data[0]`` in the whole run (its batch plan's ``node_index``)
        self.first_node = first_node
        self.cfg = cfg
        self.seed = seed
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.amp_dtype = autocast_dtype(cfg.precision, self.device)
        if self.device.type == "cpu":
            _keep_freed_memory()
        self.sizes = [int(y.shape[0]) for _, y in node_data]
        template = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        self.layout = StateLayout(template)
        self.local: list[dict[str, torch.Tensor]] = [
            {s.name: template[s.name].clone() for s in self.layout.local} for _ in range(self.n)
        ]
        self._counters = [
            s.name for s in self.layout.local if s.name.endswith("num_batches_tracked")
        ]
        if workers is None:
            workers = torch.get_num_threads() if self.device.type == "cpu" else 1
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        workers = min(workers, self.n)
        bounds = split_bounds(self.n, workers)
        self._groups = [
            _Group(model, self.layout, node_data[lo:hi], lo, self.device, self.amp_dtype)
            for lo, hi in itertools.pairwise(bounds)
        ]

    @property
    def workers(self) -> int:
        return len(self._groups)

    def _check_flats(self, flats: torch.Tensor) -> None:
        if flats.dim() != 2 or tuple(flats.shape) != (self.n, self.layout.numel):
            raise ValueError(
                f"flats has shape {tuple(flats.shape)}, expected ({self.n}, {self.layout.numel})"
            )

    def plans(self, round: int) -> list[list[torch.Tensor]]:
        """Every node's :func:`~dacflnode.learning.train.batch_plan` for ``round``."""
        return [
            batch_plan(size, self.cfg, self.seed, self.first_node + node, round)
            for node, size in enumerate(self.sizes)
        ]

    def _steps(self, round: int) -> list[torch.Tensor]:
        """Per step, the ``[N, B]`` positions of every node's batch in its own data."""
        plans = self.plans(round)
        counts = {len(p) for p in plans}
        if len(counts) != 1:
            raise ValueError(
                f"the nodes take different numbers of steps this round ({sorted(counts)}); the "
                "batched engine needs equal partition sizes, use the sequential engine"
            )
        steps = []
        for t in range(counts.pop()):
            sizes = {int(p[t].numel()) for p in plans}
            if len(sizes) != 1:
                raise ValueError(
                    f"the nodes' batch sizes differ at step {t} ({sorted(sizes)}); the batched "
                    "engine needs equal partition sizes, use the sequential engine"
                )
            steps.append(torch.stack([p[t] for p in plans]))
        return steps

    def train(self, flats: torch.Tensor, round: int) -> list[TrainResult]:
        """Train every node from its row of ``flats`` ``[N, P]`` for one round.

        Node ``n``'s result equals ``LocalTrainer(..., node_index=n).train(flats[n], round)`` up
        to float32 rounding. As there, the optimizer is fresh every round (momentum is not
        carried over: each round starts from a new, mixed model).
        """
        self._check_flats(flats)
        steps = self._steps(round)
        for group in self._groups:  # checked here, before any group starts
            group.set_counters(self.local[group.lo : group.hi])
        flats = flats.detach().to(FLAT_DTYPE)
        out = torch.empty(self.n, self.layout.numel, dtype=FLAT_DTYPE)
        losses = torch.full((len(steps), self.n), math.nan)

        def job(group: _Group) -> Callable[[], None]:
            def run() -> None:
                losses[:, group.lo : group.hi] = group.train(
                    flats[group.lo : group.hi],
                    [s[group.lo : group.hi] for s in steps],
                    self.cfg,
                    round,
                    out[group.lo : group.hi],
                )

            return run

        _run_parallel([job(g) for g in self._groups])
        for node in self.local:
            for name in self._counters:
                if name in node:
                    node[name] = node[name] + len(steps)
        node_loss = losses.double().mean(dim=0) if steps else torch.full((self.n,), math.nan)
        samples = sum(int(s.shape[1]) for s in steps)
        return [
            TrainResult(flat=out[i].clone(), loss=float(node_loss[i]), steps=len(steps),
                        samples=samples)
            for i in range(self.n)
        ]

    def evaluate(
        self,
        flats: torch.Tensor,
        test_x: torch.Tensor,
        test_y: torch.Tensor,
        batch_size: int = 1000,
    ) -> list[tuple[float, float]]:
        """Per node ``(accuracy, mean cross-entropy)`` of the models ``flats`` ``[N, P]`` on one
        test set, in eval mode, as :func:`~dacflnode.learning.train.evaluate` computes them.

        Every node sees the same test batches. ``batch_size`` bounds the memory like that of one
        model evaluated with that batch size: each chunk holds ``batch_size / N`` samples for
        each of the N nodes.
        """
        self._check_flats(flats)
        if test_y.ndim != 1 or test_x.shape[0] != test_y.shape[0]:
            raise ValueError(
                f"data of shape {tuple(test_x.shape)} does not match labels {tuple(test_y.shape)}"
            )
        total = int(test_y.shape[0])
        if total == 0:
            raise ValueError("cannot evaluate on an empty test set")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        flats = flats.detach().to(FLAT_DTYPE)
        chunk = max(1, batch_size // self.n)
        correct = torch.zeros(self.n, dtype=torch.long)
        loss_sum = torch.zeros(self.n, dtype=torch.float64)

        def job(group: _Group) -> Callable[[], None]:
            def run() -> None:
                c, s = group.evaluate(flats[group.lo : group.hi], test_x, test_y, chunk)
                correct[group.lo : group.hi] = c
                loss_sum[group.lo : group.hi] = s

            return run

        _run_parallel([job(g) for g in self._groups])
        return [(int(correct[i]) / total, float(loss_sum[i]) / total) for i in range(self.n)]
