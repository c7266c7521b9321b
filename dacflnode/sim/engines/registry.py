"""The engines by name, and :func:`make_engine`, which picks one for a run.

The engines of this process are always there. The Ray engines are registered only where Ray is
installed (found, not imported: importing Ray takes seconds, and only a run with ``--ray`` pays
them); a run that asks for Ray where it is missing is told how to install it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence

import torch
from torch import nn

from dacflnode.errors import ConfigError
from dacflnode.learning.train import TrainConfig
from dacflnode.sim.batched.layers import can_batch
from dacflnode.sim.engines.base import Engine, NodeData, NodeSet, RayTarget
from dacflnode.sim.engines.local import BatchedEngine, SequentialEngine

#: the engines that train in this process, by the name ``--engine`` gives
LOCAL_ENGINES: dict[str, type[BatchedEngine | SequentialEngine]] = {
    "batched": BatchedEngine,
    "sequential": SequentialEngine,
}

RemoteEngine = Callable[..., Engine]
#: the engines that train elsewhere, by back-end: each loads its module when a run asks for it
REMOTE_ENGINES: dict[str, Callable[[], RemoteEngine]] = {}


def _ray_engine() -> RemoteEngine:
    from dacflnode.sim.engines.ray import RayEngine

    return RayEngine


if importlib.util.find_spec("ray") is not None:
    REMOTE_ENGINES["ray"] = _ray_engine


def _load_remote(backend: str, install: str) -> RemoteEngine:
    load = REMOTE_ENGINES.get(backend)
    try:
        if load is None:
            raise ModuleNotFoundError(f"No module named {backend!r}", name=backend)
        return load()
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != backend:
            raise
        raise ConfigError(
            backend, f"{backend.capitalize()} is not installed here ({exc}); pip install {install}"
        ) from None


def make_engine(
    choice: str,
    ids: Sequence[str],
    model_factory: Callable[[], nn.Module],
    data: Sequence[NodeData],
    test: NodeData,
    cfg: TrainConfig,
    *,
    seed: int,
    device: torch.device,
    ray: RayTarget | None = None,
    tests: Sequence[NodeData] | None = None,
) -> Engine:
    """The engine ``choice`` (``auto``, ``batched`` or ``sequential``) for these nodes, local or,
    with ``ray``, on the workers of a Ray cluster. ``tests``: each node's own test set (nodes
    on their own data), instead of the one ``test`` set they all share."""
    model = model_factory()
    equal = len({int(d.y.numel()) for d in data}) == 1
    if choice == "auto":
        choice = "batched" if can_batch(model) and equal else "sequential"
    if choice not in LOCAL_ENGINES:
        raise ConfigError("engine", f"unknown engine {choice!r}; use one of auto, "
                          f"{', '.join(sorted(LOCAL_ENGINES))}")
    if choice == "batched":
        if not can_batch(model):
            raise ConfigError(
                "engine", "the batched engine supports the built-in models only; use sequential"
            )
        if not equal:
            raise ConfigError(
                "engine", "the batched engine needs equal data sizes on every node (partition"
                " sizes, or each node's own data); use sequential"
            )
    if ray is not None:
        if tests is not None:
            raise ConfigError(
                "ray", "--ray evaluates every node on one shared test set; nodes with test sets"
                " of their own train on the local engines (leave out --ray)")
        if device.type != "cpu":
            raise ConfigError(
                "device", f"--ray trains on the workers' CPUs, not {device}; use --device cpu"
            )
        engine = _load_remote("ray", "'dacflnode[ray]'")
        return engine(choice, NodeSet(ids, data, test), model, cfg, seed=seed, target=ray)
    return LOCAL_ENGINES[choice](NodeSet(ids, data, test, tests), model, cfg, seed=seed,
                                 device=device)
