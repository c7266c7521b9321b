"""N virtual nodes in one process, running the same round code as the daemon.

Each round, for every node: its neighbours' round-``t`` messages (:meth:`Algorithm.outgoing`) and
its row of ``W(t)`` go to :meth:`Algorithm.prepare`; all nodes then train (one engine call, see
:mod:`dacflnode.sim.engine`), and :meth:`Algorithm.complete` produces round ``t+1``.

Per round it records the paper's metrics: *Average of Acc* (mean over nodes of each node's test
accuracy of its evaluated model), *Var of Acc* (population variance of those accuracies), the mean
training loss, and the consensus error ``mean_i ‖x_i − ω̄‖`` where ``ω̄`` is the network average
that the node models estimate (see :meth:`Algorithm.tracked`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dacflnode.algorithms.rounds import Algorithm, NodeState, make_algorithm, network_average
from dacflnode.algorithms.topology import MixingSchedule
from dacflnode.config import RunConfig
from dacflnode.learning.datasets import Dataset, eval_subset
from dacflnode.learning.files import save_model
from dacflnode.learning.layout import StateLayout
from dacflnode.learning.models import build_model, default_model_for
from dacflnode.learning.train import pick_device
from dacflnode.sim.engine import Engine, NodeData, make_engine

ProgressFn = Callable[[str, int, int, "RoundRecord"], None]


def node_ids(n: int) -> list[str]:
    return [f"node-{i}" for i in range(n)]


@dataclass
class RoundRecord:
    round: int  # rounds completed (1-based)
    lr: float
    train_loss: list[float]
    consensus_error: list[float]
    accuracy: list[float] | None = None
    test_loss: list[float] | None = None
    seconds: float = 0.0

    @property
    def avg_acc(self) -> float | None:
        return None if self.accuracy is None else float(np.mean(self.accuracy))

    @property
    def var_acc(self) -> float | None:
        return None if self.accuracy is None else float(np.var(self.accuracy))


@dataclass
class AlgorithmResult:
    algorithm: str
    records: list[RoundRecord] = field(default_factory=list)
    engine: str = ""
    wall_s: float = 0.0
    samples: int = 0

    def summary(self) -> dict[str, Any]:
        evaluated = [r for r in self.records if r.accuracy is not None]
        last = evaluated[-1] if evaluated else None
        return {
            "engine": self.engine,
            "wall_s": round(self.wall_s, 3),
            "samples_per_s": round(self.samples / self.wall_s, 1) if self.wall_s else None,
            "final": {
                "round": last.round if last else None,
                "avg_acc": last.avg_acc if last else None,
                "var_acc": last.var_acc if last else None,
                "train_loss": float(np.mean(self.records[-1].train_loss)) if self.records else None,
                "consensus_error": (
                    float(np.mean(self.records[-1].consensus_error)) if self.records else None
                ),
            },
            "rounds": [r.round for r in evaluated],
            "avg_acc": [r.avg_acc for r in evaluated],
            "var_acc": [r.var_acc for r in evaluated],
            "train_loss": [float(np.mean(r.train_loss)) for r in self.records],
            "consensus_error": [float(np.mean(r.consensus_error)) for r in self.records],
        }


class Simulation:
    """One algorithm on one data set and topology; :meth:`run` executes every round."""

    def __init__(
        self,
        cfg: RunConfig,
        algorithm: str,
        dataset: Dataset,
        parts: Sequence[np.ndarray],
        *,
        out_dir: Path | None = None,
    ) -> None:
        self.cfg = cfg
        self.alg: Algorithm = make_algorithm(algorithm, cfg.fodac_variant)
        self.ids = node_ids(cfg.nodes)
        self.out_dir = out_dir
        self.schedule = MixingSchedule(cfg.topology_spec()) if algorithm != "fedavg" else None
        sizes = np.array([len(p) for p in parts], dtype=np.float64)
        self.data_weights = sizes / sizes.sum()
        model_name = cfg.model or default_model_for(dataset.name)

        def factory() -> torch.nn.Module:
            torch.manual_seed(cfg.seed)
            return build_model(model_name, dataset.input_shape, dataset.num_classes)

        model = factory()
        self.layout = StateLayout.from_module(model)
        self.initial = self.layout.flatten_module(model)
        test_x, test_y = eval_subset(dataset.test_x, dataset.test_y, cfg.eval_samples, cfg.seed)
        node_data = [
            NodeData(
                dataset.train_x[torch.from_numpy(np.asarray(p))],
                dataset.train_y[torch.from_numpy(np.asarray(p))],
            )
            for p in parts
        ]
        self.engine: Engine = make_engine(
            cfg.engine,
            factory,
            node_data,
            NodeData(test_x, test_y),
            cfg.train_config(),
            seed=cfg.seed,
            device=pick_device(cfg.device),
        )

    def weights(self, t: int, i: int) -> dict[str, float]:
        """Row ``i`` of the round-``t`` mixing matrix, as ``{node id: weight}`` (non-zeros)."""
        if self.schedule is None:  # FedAvg: the server averages everyone by data size
            return {self.ids[j]: float(p) for j, p in enumerate(self.data_weights)}
        row = self.schedule.matrix(t)[i]
        return {self.ids[j]: float(w) for j, w in enumerate(row) if w != 0.0}

    def step(self, states: list[NodeState], t: int) -> tuple[list[NodeState], list[float], int]:
        """Round ``t`` for every node; returns new states, training losses and samples seen."""
        messages = {self.ids[i]: self.alg.outgoing(s) for i, s in enumerate(states)}
        prepared = []
        for i, state in enumerate(states):
            weights = self.weights(t, i)
            inbox = {j: messages[j] for j in weights if j != self.ids[i]}
            prepared.append(self.alg.prepare(state, self.ids[i], weights, inbox))
        results = self.engine.train([p.train_from for p in prepared], t)
        new_states = [
            self.alg.complete(s, p, r.flat)
            for s, p, r in zip(states, prepared, results, strict=True)
        ]
        return new_states, [r.loss for r in results], sum(r.samples for r in results)

    def models(self, states: Sequence[NodeState]) -> list[torch.Tensor]:
        """The model each node is evaluated on (the network average for D-PSGD / FedAvg)."""
        own = [self.alg.model(s) for s in states]
        if not self.alg.global_model:
            return own
        weights = list(self.data_weights) if self.alg.name == "fedavg" else None
        avg = network_average(own, weights)
        return [avg] * len(own)

    def consensus_error(self, states: Sequence[NodeState]) -> list[float]:
        target = network_average([self.alg.tracked(s) for s in states])
        return [float(torch.linalg.vector_norm(self.alg.model(s) - target)) for s in states]

    def run(self, progress: ProgressFn | None = None) -> AlgorithmResult:
        cfg = self.cfg
        result = AlgorithmResult(self.alg.name, engine=self.engine.name)
        states = [NodeState.initial(self.initial) for _ in self.ids]
        writers = self._open_writers()
        start = time.perf_counter()
        try:
            for t in range(cfg.rounds):
                t0 = time.perf_counter()
                states, losses, samples = self.step(states, t)
                result.samples += samples
                record = RoundRecord(
                    round=t + 1,
                    lr=cfg.train_config().lr_at(t),
                    train_loss=losses,
                    consensus_error=self.consensus_error(states),
                )
                if (t + 1) % cfg.eval_every == 0 or t + 1 == cfg.rounds:
                    evals = self._evaluate(self.models(states))
                    record.accuracy = [a for a, _ in evals]
                    record.test_loss = [lo for _, lo in evals]
                record.seconds = time.perf_counter() - t0
                result.records.append(record)
                self._write_round(writers, record)
                if progress is not None:
                    progress(self.alg.name, t + 1, cfg.rounds, record)
        finally:
            for w in writers:
                w.close()
        result.wall_s = time.perf_counter() - start
        self.final_states = states
        self._write_models(states)
        return result

    def _evaluate(self, models: list[torch.Tensor]) -> list[tuple[float, float]]:
        if self.alg.global_model:  # one shared model: evaluate it once
            return [self.engine.evaluate_one(models[0])] * len(models)
        return self.engine.evaluate(models)

    # ------------------------------------------------------------------ output files
    def _open_writers(self) -> list[Any]:
        if self.out_dir is None:
            return []
        writers = []
        for node in self.ids:
            folder = self.out_dir / node
            folder.mkdir(parents=True, exist_ok=True)
            writers.append((folder / "metrics.jsonl").open("w"))
        return writers

    def _write_round(self, writers: list[Any], record: RoundRecord) -> None:
        for i, w in enumerate(writers):
            line = {
                "round": record.round,
                "node": self.ids[i],
                "algorithm": self.alg.name,
                "lr": record.lr,
                "train_loss": record.train_loss[i],
                "consensus_error": record.consensus_error[i],
                "accuracy": None if record.accuracy is None else record.accuracy[i],
                "test_loss": None if record.test_loss is None else record.test_loss[i],
                "seconds": round(record.seconds, 4),
            }
            w.write(json.dumps(line) + "\n")
            w.flush()

    def _write_models(self, states: Sequence[NodeState]) -> None:
        if self.out_dir is None:
            return
        for i, model in enumerate(self.models(states)):
            meta = {
                "algorithm": self.alg.name,
                "node": self.ids[i],
                "round": str(states[i].round),
                "fingerprint": self.layout.fingerprint(),
            }
            save_model(self.out_dir / self.ids[i] / "final.safetensors", self.layout, model,
                       self.engine.local_buffers(i), meta)
