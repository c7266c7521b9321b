"""The simulator's engines on the workers of a Ray cluster (``simulate --ray ADDRESS|local``).

The only module of dacflnode that imports Ray (an import-linter contract in ``pyproject.toml``
holds it). The nodes' runners, the exchange, the mixing and the bookkeeping stay in this process
(the driver); only local training and per-node evaluation go to the workers.

**Layout.** The N nodes are cut into W contiguous slices, nodes ``i*N//W .. (i+1)*N//W - 1``
for worker ``i``: one Ray actor that reserves one CPU. At the start of a run every node's data
and the test set are put into Ray's object store once (``ray.put``) and each worker copies its
own nodes' into its memory; per round a worker receives its nodes' start vectors (``[n, P]``
float32) and sends back the trained vectors, the losses and the nodes' batch-norm step
counters, which the driver keeps (so the files and a god node's evaluation use the same
counters as the local engine). A round therefore moves ``2·N·P`` floats between the driver and
the workers, against the training of ``N/W`` nodes on each worker: the more local steps per
round, the closer the speed-up is to W.

**Equality with the local engine, bit for bit** (``tests/sim/test_ray_engine.py``):

* ``batched``: a worker trains its slice as one stacked model
  (:class:`~dacflnode.sim.batched.trainer.BatchedTrainer` with ``first_node``, one group) with
  single-threaded kernels. That is exactly what the local batched engine does on each of its
  worker threads when it splits the nodes into W groups, which it does with W PyTorch threads
  (``--threads W``, or PyTorch's default where that is W). The split must be the same: stacked
  kernels vectorise over the nodes' channels, so a node's last bits can depend on where it sits
  in its group (different splits agree to float32 rounding, about 1e-7, not bit for bit).
  Evaluation uses the local engine's test chunks (``EVAL_BATCH // N`` samples per node and
  step).
* ``sequential``: a worker runs its nodes' :class:`~dacflnode.learning.train.LocalTrainer` s,
  one call at a time, each with the driver's number of PyTorch threads (a convolution's sums
  depend on it): the daemon's training code, so results equal ``--engine sequential`` with the
  same ``--threads``, whatever W. Each node's calls go to its worker as they come, so a run with
  a fault plan (crashes, leaves, joins) works too.

Both hold where every worker runs the same torch build on the same kind of CPU as the run they
are compared with (oneDNN chooses its kernels by instruction set).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import logging
import os
import socket
import time
from typing import Any

import numpy as np
import ray
import torch
from torch import nn

from dacflnode.errors import ConfigError
from dacflnode.learning.layout import FLAT_DTYPE, StateLayout
from dacflnode.learning.train import EVAL_BATCH, LocalTrainer, TrainConfig, TrainResult
from dacflnode.sim.batched.threads import split_bounds
from dacflnode.sim.batched.trainer import BatchedTrainer
from dacflnode.sim.engines.base import GatheredEngine, NodeSet, RayTarget

#: how long the workers may take to start (import torch, copy their data) before the run fails
START_TIMEOUT_S = 300.0
#: how long an address may take to answer a TCP connection before it is refused as unreachable
CONNECT_TIMEOUT_S = 5.0
_CPU = torch.device("cpu")


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A writable tensor of its own from an array (those from the object store are read-only)."""
    return torch.from_numpy(np.array(array))


def _split_address(address: str) -> tuple[str, int]:
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(
            "ray", f"{address!r} is not HOST:PORT (the head's `ray start --head --port=PORT`) "
            "or local"
        )
    return host.strip("[]"), int(port)


def connect(target: RayTarget) -> None:
    """Join the cluster of ``target`` (or start a local one), unless Ray is already initialised
    in this process; quiet logs, no dashboard. An address is checked first either way."""
    if target.address == "local":
        if not ray.is_initialized():
            ray.init(num_cpus=target.workers or os.cpu_count() or 1, include_dashboard=False,
                     log_to_driver=False, logging_level=logging.ERROR)
        return
    host, port = _split_address(target.address)
    hint = (f"start the cluster's head there with `ray start --head --port={port}`, "
            "or use --ray local")
    try:  # ray.init itself retries an unreachable address for minutes
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ConfigError(
            "ray", f"no Ray cluster answers at {host}:{port} ({exc.strerror or exc}); {hint}"
        ) from None
    if ray.is_initialized():
        return
    try:
        ray.init(address=target.address, log_to_driver=False, logging_level=logging.ERROR)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        raise ConfigError(
            "ray", f"could not join the Ray cluster at {target.address} ({exc}); {hint}"
        ) from None


def cluster_cpus() -> int:
    """The CPUs of the connected cluster, all machines together."""
    resources: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
    return int(resources.get("CPU", 0))


class _Worker:
    """One Ray actor: a contiguous slice of the run's nodes, from node ``first`` on.

    ``engine`` ``batched``: one :class:`BatchedTrainer` over the slice; ``sequential``: one
    :class:`LocalTrainer` per node. PyTorch runs with ``threads`` intra-op threads here.
    """

    def __init__(
        self,
        engine: str,
        model: nn.Module,
        cfg: TrainConfig,
        seed: int,
        first: int,
        threads: int,
        test: tuple[np.ndarray, np.ndarray],
        *data: tuple[np.ndarray, np.ndarray],
    ) -> None:
        self.threads = threads
        torch.set_num_threads(threads)
        self.test_x, self.test_y = _tensor(test[0]), _tensor(test[1])
        nodes = [(_tensor(x), _tensor(y)) for x, y in data]
        self.batched: BatchedTrainer | None = None
        self.trainers: list[LocalTrainer] = []
        if engine == "batched":
            self.batched = BatchedTrainer(model, nodes, cfg, seed=seed, device=_CPU, workers=1,
                                          first_node=first)
        else:
            self.trainers = [
                LocalTrainer(copy.deepcopy(model), x, y, cfg, seed=seed, node_index=first + i,
                             device=_CPU)
                for i, (x, y) in enumerate(nodes)
            ]

    def ready(self) -> int:
        return os.getpid()

    def _threads(self) -> None:
        # per call: Ray may run an actor's methods on another thread than its constructor, and
        # an OpenMP thread count belongs to the thread that set it
        torch.set_num_threads(self.threads)

    def train_slice(
        self, flats: np.ndarray, round_: int
    ) -> tuple[np.ndarray, list[float], int, int, list[dict[str, torch.Tensor]]]:
        """Train the slice from ``flats`` ``[n, P]``: the new ``[n, P]``, each node's loss, the
        steps and samples per node, and each node's local buffers after the round."""
        assert self.batched is not None
        self._threads()
        results = self.batched.train(_tensor(flats), round_)
        out = np.stack([r.flat.numpy() for r in results])
        return (out, [r.loss for r in results], results[0].steps, results[0].samples,
                self.batched.local)

    def evaluate_slice(self, flats: np.ndarray, chunk: int) -> list[tuple[float, float]]:
        """``(accuracy, loss)`` of each of the slice's models, ``chunk`` test samples at a time."""
        assert self.batched is not None
        self._threads()
        return self.batched.evaluate(_tensor(flats), self.test_x, self.test_y,
                                     batch_size=chunk * self.batched.n)

    def train_node(
        self, slot: int, start: np.ndarray, round_: int
    ) -> tuple[np.ndarray, float, int, int, dict[str, torch.Tensor]]:
        self._threads()
        trainer = self.trainers[slot]
        result = trainer.train(_tensor(start), round_)
        return result.flat.numpy(), result.loss, result.steps, result.samples, trainer.local

    def evaluate_node(self, slot: int, model: np.ndarray) -> tuple[float, float]:
        self._threads()
        return self.trainers[slot].evaluate(_tensor(model), self.test_x, self.test_y)


def _array(flat: torch.Tensor) -> np.ndarray:
    return flat.detach().to(FLAT_DTYPE).cpu().numpy()


class RayEngine(GatheredEngine):
    """The ``batched`` or ``sequential`` engine with its nodes spread over Ray workers.

    The workers start here (``close`` stops them; :class:`~dacflnode.sim.simulator.Simulation`
    closes its engine when its run ends). A worker reserves one CPU of the cluster.

    ``batched`` gathers a round's calls and sends each worker its slice of the stacked vectors;
    ``sequential`` replaces the gathered trainers with one per node whose calls go to its worker
    as they come. Either way the driver keeps every node's buffers, and evaluates one model
    (a god node's network average) here, as the local engines do.
    """

    def __init__(self, engine: str, nodes: NodeSet, model: nn.Module, cfg: TrainConfig, *,
                 seed: int, target: RayTarget) -> None:
        if engine not in ("batched", "sequential"):
            raise ValueError(f"unknown engine {engine!r}")
        connect(target)
        n = len(nodes.ids)
        cpus = cluster_cpus()
        if target.workers is not None and target.workers > cpus:
            raise ConfigError("ray_workers", f"the Ray cluster has {cpus} CPUs and a worker "
                              f"takes one; use --ray-workers {cpus} or fewer")
        workers = min(target.workers or cpus, n)
        if workers < 1:
            raise ConfigError("ray", "the Ray cluster has no CPUs to run workers on")
        super().__init__(nodes, model, cfg, _CPU)
        self.name = f"ray-{engine}"
        layout = StateLayout.from_module(self.template)
        #: each node's local buffers (batch-norm step counters) as its worker last reported them
        self.local = [layout.local_state(self.template) for _ in self.ids]
        self.bounds = split_bounds(n, workers)
        # batched: one single-threaded group per worker, as each of the local engine's threads;
        # sequential: the driver's thread count, as the local engine's LocalTrainers
        threads = 1 if engine == "batched" else torch.get_num_threads()
        test_ref = ray.put((nodes.test.x.numpy(), nodes.test.y.numpy()))
        data_refs = [ray.put((d.x.numpy(), d.y.numpy())) for d in nodes.data]
        model_ref = ray.put(model)
        remote: Any = ray.remote(num_cpus=1, max_restarts=0)(_Worker)
        self._actors: list[Any] = [
            remote.remote(engine, model_ref, cfg, seed, lo, threads, test_ref, *data_refs[lo:hi])
            for lo, hi in itertools.pairwise(self.bounds)
        ]
        self._wait_started(cpus)
        if engine == "sequential":
            self.trainers = {}
            for w, (lo, hi) in enumerate(itertools.pairwise(self.bounds)):
                for slot, i in enumerate(range(lo, hi)):
                    self.trainers[self.ids[i]] = _RemoteNode(self, self._actors[w], slot, i)

    @property
    def workers(self) -> int:
        return len(self.bounds) - 1

    def _wait_started(self, cpus: int) -> None:
        started = time.perf_counter()
        pending = [a.ready.remote() for a in self._actors]
        _, late = ray.wait(pending, num_returns=len(pending), timeout=START_TIMEOUT_S)
        try:
            if late:
                raise ConfigError(
                    "ray_workers", f"{len(late)} of {self.workers} Ray workers did not start "
                    f"within {time.perf_counter() - started:.0f} s: the cluster's {cpus} CPUs are "
                    "taken (by another run?); use fewer --ray-workers or free the cluster")
            ray.get(pending)
        except ray.exceptions.RayError as exc:
            self.close()
            first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            raise ConfigError(
                "ray", f"a Ray worker failed to start ({first}); every machine of the cluster "
                "needs the same Python, torch and dacflnode as this one "
                "(pip install 'dacflnode[ray]')") from None
        except ConfigError:
            self.close()
            raise

    def close(self) -> None:
        for actor in self._actors:
            ray.kill(actor)
        self._actors = []

    def _slices(self, flats: torch.Tensor) -> list[tuple[Any, np.ndarray]]:
        if not self._actors:
            raise RuntimeError("this engine's Ray workers were stopped when its run ended")
        array = _array(flats)
        return [(actor, array[lo:hi])
                for actor, (lo, hi) in zip(self._actors, itertools.pairwise(self.bounds),
                                           strict=True)]

    async def train_stacked(self, flats: torch.Tensor, round_: int) -> list[TrainResult]:
        parts = await asyncio.gather(
            *(actor.train_slice.remote(part, round_) for actor, part in self._slices(flats)))
        results: list[TrainResult] = []
        for (lo, _), (out, losses, steps, samples, local) in zip(
                itertools.pairwise(self.bounds), parts, strict=True):
            self.local[lo : lo + len(local)] = local
            results += [TrainResult(flat=_tensor(row), loss=loss, steps=steps, samples=samples)
                        for row, loss in zip(out, losses, strict=True)]
        return results

    async def evaluate_stacked(self, flats: torch.Tensor) -> list[tuple[float, float]]:
        chunk = max(1, EVAL_BATCH // len(self.ids))
        parts = await asyncio.gather(
            *(actor.evaluate_slice.remote(part, chunk) for actor, part in self._slices(flats)))
        return list(itertools.chain.from_iterable(parts))

    def local_buffers(self, index: int) -> dict[str, torch.Tensor]:
        return self.local[index]


class _RemoteNode:
    """One runner's trainer in a sequential :class:`RayEngine`: its own calls, to its worker."""

    def __init__(self, engine: RayEngine, actor: Any, slot: int, index: int) -> None:
        self.engine = engine
        self.actor = actor
        self.slot = slot
        self.index = index

    async def train(self, start: torch.Tensor, round_: int) -> TrainResult:
        flat, loss, steps, samples, local = await self.actor.train_node.remote(
            self.slot, _array(start), round_)
        self.engine.local[self.index] = local
        return TrainResult(flat=_tensor(flat), loss=loss, steps=steps, samples=samples)

    async def evaluate(self, model: torch.Tensor, round_: int) -> tuple[float, float]:
        result: tuple[float, float] = await self.actor.evaluate_node.remote(
            self.slot, _array(model))
        return result

    def local_buffers(self) -> dict[str, torch.Tensor]:
        return self.engine.local[self.index]

    def lr_at(self, round_: int) -> float:
        return self.engine.cfg.lr_at(round_)
