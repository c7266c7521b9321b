"""A node from its settings: the one builder the daemon and the simulator both use.

Three steps, each one function, whatever runs the node:

* :func:`run_parts` — what every node of a run shares, from the run settings and the initial
  model: the flat layout, the algorithm (made once, with the run's mixing rule) and a compressed
  run's :class:`~dacflnode.protocol.copies.Compression`. CHOCO's step ``γ`` has one source, the
  algorithm's mixing (:meth:`~dacflnode.config.run.RunConfig.mixing_rule`, which reads
  ``consensus_step``); the compression is made from it, so the two cannot differ;
* :func:`node_setup` — one node's :class:`~dacflnode.protocol.setup.NodeSetup`: the rounds,
  evaluation, deadlines, ``gone_after``, ``anchor_delay``, guard and repair from the settings,
  and what differs between a daemon and a simulated node *injected*: the trainer, the mixing
  policy, the model view, the executor, the state folder, the fault plan;
* :func:`build_runner` — the ready :class:`~dacflnode.protocol.runner.NodeRunner`, from the
  setup, the transport factory and the state (or checkpoint) it starts from.

:func:`build_node` is the daemon's use of them, from its peers file: its data, model, trainer
and checkpoint (everything heavy: run it in a thread). The simulator's is
:class:`~dacflnode.sim.simulator.Simulation`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from dacflnode.algorithms.rounds import CHOCO, Algorithm, NodeState, make_algorithm
from dacflnode.assembly.data import (
    builtin_node_data,
    cache_dir_in,
    contract_summary,
    own_node_data,
)
from dacflnode.config import DaemonSettings, RunConfig, anchor_delay
from dacflnode.filemodes import make_dir
from dacflnode.learning.feature_scale import FeatureScale
from dacflnode.learning.layout import StateLayout
from dacflnode.learning.models import build_model
from dacflnode.learning.train import LocalTrainer, pick_device
from dacflnode.protocol.copies import Compression, SharedDecodes, compression_for, wire_parts
from dacflnode.protocol.policies import Metropolis, MixingPolicy, ModelView, OwnModel
from dacflnode.protocol.runner import NodeRunner
from dacflnode.protocol.scale_agreement import ScaleAgreement
from dacflnode.protocol.setup import NodeSetup
from dacflnode.protocol.training import NodeTrainer, ThreadedTrainer, slowed
from dacflnode.records.checkpoint import Checkpoint, load_checkpoint
from dacflnode.transport.base import Identity, Inbox, Transport
from dacflnode.wire.state_guard import ABSURD_RATIO

if TYPE_CHECKING:
    from dacflnode.peers.file import PeersFile
    from dacflnode.protocol.faults import FaultPlan
    from dacflnode.records.metrics_log import DataInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunParts:
    """What every node of a run shares: the flat layout of the model, its initial values, the
    algorithm and a compressed run's compression (``None``: full states)."""

    layout: StateLayout
    initial: torch.Tensor
    algorithm: Algorithm
    compression: Compression | None

    @property
    def tensors(self) -> dict[str, tuple[int, ...]]:
        """The tensors of a full state: each exchanged vector, flat."""
        return {name: (self.layout.numel,) for name in self.algorithm.exchanged}

    @property
    def compressed(self) -> dict[str, tuple[torch.dtype, tuple[int, ...]]] | None:
        """The tensors of a compressed message (``None``: an uncompressed run)."""
        if self.compression is None:
            return None
        return wire_parts(self.compression, self.algorithm.exchanged, self.layout.numel)


def run_parts(run: RunConfig, algorithm: str, model: torch.nn.Module) -> RunParts:
    """The parts of a run of ``algorithm`` whose nodes all start from ``model`` (made from
    ``run.seed``, not trained yet)."""
    layout = StateLayout.from_module(model)
    initial = layout.flatten_module(model)
    mixing = run.mixing_rule(initial)
    made = make_algorithm(algorithm, run.fodac_variant, mixing)
    compression = compression_for(run.compression, mixing.gamma, run.seed)
    if (compression is None) != (mixing.rule != CHOCO):
        raise ValueError(f"a compressed run mixes with CHOCO-Gossip: compression "
                         f"{run.compression!r} with mixing {mixing.rule!r}")
    return RunParts(layout, initial, made, compression)


def node_setup(
    run: RunConfig, parts: RunParts, waits: DaemonSettings, node_id: str,
    neighbours: Sequence[str], *, trainer: NodeTrainer, data: DataInfo | None,
    active_neighbours: Callable[[int], Sequence[str]] | None = None,
    mixing: MixingPolicy | None = None, view: ModelView | None = None,
    executor: Executor | None = None, state_dir: Path | None = None, checkpoints: bool = True,
    run_info: dict[str, str] | None = None, guard: bool = True,
    faults: FaultPlan | None = None, join: bool = False,
) -> NodeSetup:
    """Node ``node_id``'s setup. ``waits``: the daemon's settings (round deadline, Hello
    timeout, ``gone_after``, ``anchor_delay`` over ``members``). ``mixing`` and ``view``
    default to a daemon's (Metropolis weights, the node's own model); ``guard``: refuse absurd
    and stale states (:mod:`dacflnode.wire.state_guard`)."""
    return NodeSetup(
        node_id=node_id, neighbours=list(neighbours), algorithm=parts.algorithm,
        trainer=trainer, layout=parts.layout, rounds=run.rounds, eval_every=run.eval_every,
        round_deadline=waits.round_deadline, hello_timeout=waits.hello_timeout,
        active_neighbours=active_neighbours,
        mixing=Metropolis() if mixing is None else mixing,
        view=OwnModel() if view is None else view,
        state_dir=state_dir, checkpoints=checkpoints, executor=executor,
        run_info={} if run_info is None else run_info,
        absurd_ratio=ABSURD_RATIO if guard else None, gone_after=waits.gone_after,
        anchor_delay=anchor_delay(waits.anchor_delay, len(waits.members)),
        faults=faults, join=join, data=data, compression=parts.compression,
        schedule=run.schedule, staleness=run.staleness, max_duration=run.max_duration,
    )


def build_runner(setup: NodeSetup, make_transport: Callable[[Inbox], Transport],
                 state: NodeState, resume: Checkpoint | None = None) -> NodeRunner:
    """The node of ``setup``, ready to run from ``state`` (``resume``: the checkpoint it
    holds); ``make_transport`` makes its transport around the inbox the runner builds."""
    return NodeRunner(setup, make_transport, state, resume=resume)


# ---------------------------------------------------------------------- the daemon's node
@dataclass
class BuiltNode:
    """A daemon's node ready to run; ``checkpoint`` is the one it resumes from (``None``: a
    fresh start)."""

    setup: NodeSetup
    state: NodeState
    identity: Identity
    device: str
    parts: RunParts
    checkpoint: Checkpoint | None = None


def build_node(pf: PeersFile, faults: FaultPlan | None = None) -> BuiltNode:
    """A daemon's node from its peers file: data, model, trainer, checkpoint (everything heavy:
    run it in a thread). ``faults``: injected faults to play (tests and demonstrations,
    docs/faults.md)."""
    run, node = pf.run, pf.node.id
    run.apply_threads()
    data = (own_node_data(run, cache_dir_in(pf.node.state_dir)) if run.own_data
            else builtin_node_data(run, pf.node.share))
    torch.manual_seed(run.seed)
    model = build_model(data.default_model, data.input_shape, data.num_classes)
    parts = run_parts(run, run.algorithm[0], model)
    if parts.algorithm.mixing.radius is not None:
        log.info("clipped mixing, radius %.6g", parts.algorithm.mixing.radius,
                 extra={"event": "clipped_mixing", "node": node})
    if parts.compression is not None:
        log.info("compression %s, CHOCO step %g", parts.compression.spec,
                 parts.compression.gamma, extra={"event": "compression", "node": node})
    device = pick_device(run.device)
    trainer = LocalTrainer(model, data.train_x, data.train_y, run.train_config(),
                           seed=run.seed, node_index=pf.node.share, device=device)
    identity = Identity(node, parts.layout.fingerprint(), pf.run_fingerprint(data.contract),
                        data_contract=data.contract)
    if data.contract:
        log.info("%d training samples (%s), %d test samples; data contract: %s",
                 data.info.size, ", ".join(f"{k}: {v}" for k, v in data.info.class_counts.items()),
                 data.info.test_size, contract_summary(data.contract),
                 extra={"event": "data_loaded", "node": node})
    run_info = {"run_fingerprint": identity.run_fingerprint,
                "model_fingerprint": identity.model_fingerprint, "node": node}
    make_dir(pf.node.state_dir)
    checkpoint = load_checkpoint(pf.node.state_dir, run_info, parts.layout.numel)
    if checkpoint is not None:
        state = checkpoint.state
        trainer.local.update(checkpoint.local)
        log.info("resuming from round %d", state.round,
                 extra={"event": "resuming", "node": node, "round": state.round})
    else:
        state = NodeState.initial(parts.initial)
    threaded = ThreadedTrainer(trainer, data.test_x, data.test_y)
    setup = node_setup(
        run, parts, pf.daemon, node, pf.neighbour_ids(),
        trainer=slowed(threaded, run.slowdown), data=data.info,
        active_neighbours=pf.active_neighbour_ids if run.time_varying > 0 else None,
        state_dir=pf.node.state_dir, run_info=run_info, faults=faults)
    if data.moments is not None:
        def scale_tensors(scale: FeatureScale) -> None:
            scale.apply(trainer.data_x)  # (the rows as the trainer holds them, on its device)
            scale.apply(threaded.test_x)

        setup.scale = ScaleAgreement(
            node, data.scaling, data.moments, scale_tensors,
            context=identity.run_fingerprint.encode(), state_dir=pf.node.state_dir,
            saved=None if checkpoint is None else checkpoint.meta.get("feature_scale"))
    return BuiltNode(setup, state, identity, str(device), parts, checkpoint)


def with_shared_decodes(parts: RunParts, nodes: int) -> RunParts:
    """``parts`` for ``nodes`` nodes in one process, whose senders' decodes serve their
    neighbours too (the same tensors: the simulator's)."""
    if parts.compression is None:
        return parts
    keep = 4 * nodes * len(parts.algorithm.exchanged)
    return replace(parts, compression=replace(parts.compression,
                                              decodes=SharedDecodes(keep=keep)))
