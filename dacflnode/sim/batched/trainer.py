"""The batched trainer: N nodes trained and evaluated at once, in groups of stacked models."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from dacflnode.learning.layout import FLAT_DTYPE, StateLayout
from dacflnode.learning.train import (
    EVAL_BATCH,
    TrainConfig,
    TrainResult,
    autocast,
    autocast_dtype,
    batch_plan,
)
from dacflnode.sim.batched.layers import StackedLinear, StackedModel, Unsupported, check_layers
from dacflnode.sim.batched.memory import keep_freed_memory
from dacflnode.sim.batched.threads import run_parallel, split_bounds


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
        self.stacked = StackedModel(model, self.n, channels_last=device.type == "cpu")
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
        round_: int,
        out: torch.Tensor,
    ) -> torch.Tensor:
        """Train from ``flats`` ``[n, P]`` along ``steps`` (each ``[n, B]`` positions into the
        nodes' own data); write the results into ``out`` ``[n, P]``; return the per-step,
        per-node losses ``[steps, n]``."""
        self.load(flats)
        module = self.stacked.module
        module.train()
        lr = cfg.lr_at(round_)
        # Plain SGD: the linear layers update themselves during the backward pass.
        fused = [m for m in module if isinstance(m, StackedLinear)]
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


class BatchedTrainer:
    """Trains N copies of one architecture as one stacked model.

    ``node_data[n]`` is node ``n``'s ``(x [S_n, C, H, W], y [S_n])``; node ``n`` follows
    ``batch_plan(S_n, cfg, seed, n, round_)``. All nodes must take the same number of steps with
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
            check_layers(model)
        except Unsupported as exc:
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
            keep_freed_memory()
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

    def plans(self, round_: int) -> list[list[torch.Tensor]]:
        """Every node's :func:`~dacflnode.learning.train.batch_plan` for ``round_``."""
        return [
            batch_plan(size, self.cfg, self.seed, self.first_node + node, round_)
            for node, size in enumerate(self.sizes)
        ]

    def _steps(self, round_: int) -> list[torch.Tensor]:
        """Per step, the ``[N, B]`` positions of every node's batch in its own data."""
        plans = self.plans(round_)
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

    def train(self, flats: torch.Tensor, round_: int) -> list[TrainResult]:
        """Train every node from its row of ``flats`` ``[N, P]`` for one round.

        Node ``n``'s result equals ``LocalTrainer(..., node_index=n).train(flats[n], round_)`` up
        to float32 rounding. As there, the optimizer is fresh every round (momentum is not
        carried over: each round starts from a new, mixed model).
        """
        self._check_flats(flats)
        steps = self._steps(round_)
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
                    round_,
                    out[group.lo : group.hi],
                )

            return run

        run_parallel([job(g) for g in self._groups])
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
        batch_size: int = EVAL_BATCH,
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

        run_parallel([job(g) for g in self._groups])
        return [(int(correct[i]) / total, float(loss_sum[i]) / total) for i in range(self.n)]
