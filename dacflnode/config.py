"""Run settings shared by the simulator and the daemon, loaded from YAML and command-line flags.

Every problem is reported as :class:`~dacflnode.errors.ConfigError` naming the option, spelled as
in YAML (``snake_case``; ``kebab-case`` is accepted too).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dacflnode.algorithms.rounds import ALGORITHMS, FODAC_VARIANTS
from dacflnode.algorithms.topology import (
    TOPOLOGIES,
    MixingSchedule,
    TopologySpec,
    load_matrix_file,
)
from dacflnode.errors import ConfigError
from dacflnode.learning.train import TrainConfig

ENGINES = ("auto", "batched", "sequential")


@dataclass
class RunConfig:
    """One experiment (simulator) or one run of a cluster (daemon).

    Defaults follow the paper's Table 1 (10 nodes, 100 rounds, batch 20, one local epoch,
    learning-rate decay 0.995, lr 0.001 for (F)MNIST and 0.005 for CIFAR-10).
    """

    algorithm: tuple[str, ...] = ("dacfl",)
    nodes: int = 10
    rounds: int = 100
    dataset: str = "fashion-mnist"
    data_root: str | None = None
    download: bool = False
    partition: str = "iid"
    dirichlet_alpha: float = 0.5
    shards_per_node: int = 2
    model: str | None = None
    topology: str = "dense"
    degree: int = 3
    edge_prob: float = 0.3
    zero_fraction: float = 0.5
    drop_prob: float = 0.5
    edge_list: str | None = None
    mixing_matrix: str | None = None
    time_varying: int = 0
    lr: float | None = None
    lr_decay: float = 0.995
    momentum: float = 0.0
    weight_decay: float = 0.0
    batch_size: int = 20
    local_epochs: int = 1
    local_steps: int | None = None
    fodac_variant: str = "lagged"
    seed: int = 0
    eval_every: int = 1
    eval_samples: int | None = None
    device: str = "auto"
    threads: int | None = None
    engine: str = "auto"
    synthetic_train: int = 2000
    synthetic_test: int = 500
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------------ derived values
    @property
    def learning_rate(self) -> float:
        if self.lr is not None:
            return self.lr
        return 0.005 if self.dataset == "cifar10" else 0.001

    def train_config(self) -> TrainConfig:
        """The local-training settings of this run (one SGD per round per node)."""
        return TrainConfig(
            lr=self.learning_rate,
            lr_decay=self.lr_decay,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
            batch_size=self.batch_size,
            local_epochs=self.local_epochs,
            local_steps=self.local_steps,
        )

    def topology_spec(self) -> TopologySpec:
        kind = (
            "custom"
            if self.mixing_matrix and self.topology in ("dense", "custom")
            else self.topology
        )
        matrix = (
            load_matrix_file(self.mixing_matrix)
            if kind == "custom" and self.mixing_matrix
            else None
        )
        return TopologySpec(
            kind=kind,
            nodes=self.nodes,
            seed=self.seed,
            time_varying=self.time_varying,
            degree=self.degree,
            edge_prob=self.edge_prob,
            zero_fraction=self.zero_fraction,
            drop_prob=self.drop_prob,
            edge_list=self.edge_list,
            matrix=matrix,
        )

    # ------------------------------------------------------------------ validation
    def validate(self) -> RunConfig:
        if not self.algorithm:
            raise ConfigError("algorithm", "name at least one algorithm")
        for name in self.algorithm:
            if name not in ALGORITHMS:
                raise ConfigError(
                    "algorithm", f"unknown algorithm '{name}' (choose from {', '.join(ALGORITHMS)})"
                )
        if len(set(self.algorithm)) != len(self.algorithm):
            raise ConfigError("algorithm", "an algorithm is named twice")
        if self.topology not in TOPOLOGIES:
            raise ConfigError(
                "topology",
                f"unknown topology '{self.topology}' (choose from {', '.join(TOPOLOGIES)})",
            )
        _positive("nodes", self.nodes, minimum=2)
        _positive("rounds", self.rounds)
        _positive("batch_size", self.batch_size)
        _positive("local_epochs", self.local_epochs)
        _positive("eval_every", self.eval_every)
        if self.local_steps is not None:
            _positive("local_steps", self.local_steps)
        if self.eval_samples is not None:
            _positive("eval_samples", self.eval_samples)
        if self.threads is not None:
            _positive("threads", self.threads)
        if self.learning_rate <= 0:
            raise ConfigError("lr", f"must be > 0, got {self.learning_rate}")
        if not 0 < self.lr_decay <= 1:
            raise ConfigError("lr_decay", f"must be in (0, 1], got {self.lr_decay}")
        if not 0 <= self.momentum < 1:
            raise ConfigError("momentum", f"must be in [0, 1), got {self.momentum}")
        if self.weight_decay < 0:
            raise ConfigError("weight_decay", f"must be >= 0, got {self.weight_decay}")
        if self.time_varying < 0:
            raise ConfigError("time_varying", f"must be >= 0 rounds, got {self.time_varying}")
        if self.fodac_variant not in FODAC_VARIANTS:
            raise ConfigError(
                "fodac_variant",
                f"unknown variant '{self.fodac_variant}' (choose from lagged, fresh)",
            )
        if self.engine not in ENGINES:
            raise ConfigError(
                "engine", f"unknown engine '{self.engine}' (choose from {', '.join(ENGINES)})"
            )
        if self.data_root is not None and not Path(self.data_root).is_dir() and not self.download:
            raise ConfigError("data_root", f"{self.data_root} is not a directory")
        if self.mixing_matrix is not None and not Path(self.mixing_matrix).is_file():
            raise ConfigError("mixing_matrix", f"{self.mixing_matrix} is not a file")
        if "fedavg" not in self.algorithm or len(self.algorithm) > 1:
            MixingSchedule(self.topology_spec())  # builds round 0: graph and matrix checks
        return self

    def apply_threads(self) -> None:
        """Set PyTorch's intra-op threads when ``threads`` is given.

        Results are bit-identical only between runs with the same thread count: a different
        count changes the order of floating-point sums inside convolutions.
        """
        if self.threads is not None:
            import torch

            torch.set_num_threads(self.threads)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("extra")
        out["algorithm"] = list(self.algorithm)
        out["lr"] = self.learning_rate
        return out


def _positive(name: str, value: int, minimum: int = 1) -> None:
    if value < minimum:
        raise ConfigError(name, f"must be >= {minimum}, got {value}")


_FIELDS = {f.name: f for f in dataclasses.fields(RunConfig) if f.name != "extra"}
_HINTS = typing.get_type_hints(RunConfig)


def _coerce(name: str, value: Any) -> Any:
    hint = _HINTS[name]
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None:
        if type(None) in options:
            return None
        raise ConfigError(name, "must not be empty")
    if name == "algorithm":
        items = value.split(",") if isinstance(value, str) else list(value)
        return tuple(str(v).strip().lower() for v in items if str(v).strip())
    for kind in options:
        if kind is type(None):
            continue
        if kind is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("true", "yes", "1", "on"):
                return True
            if str(value).lower() in ("false", "no", "0", "off"):
                return False
            raise ConfigError(name, f"expected true or false, got {value!r}")
        if kind is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ConfigError(name, f"expected an integer, got {value!r}")
            try:
                return int(value)
            except (TypeError, ValueError):
                raise ConfigError(name, f"expected an integer, got {value!r}") from None
        if kind is float:
            try:
                return float(value)
            except (TypeError, ValueError):
                raise ConfigError(name, f"expected a number, got {value!r}") from None
        if kind is str:
            return str(value)
    raise ConfigError(name, f"unsupported value {value!r}")


def config_from_mapping(values: Mapping[str, Any], base: RunConfig | None = None) -> RunConfig:
    """Apply ``values`` (YAML keys or CLI options; ``None`` means "not given") over ``base``."""
    cfg = dataclasses.replace(base) if base is not None else RunConfig()
    for raw_key, value in values.items():
        key = str(raw_key).replace("-", "_")
        if key not in _FIELDS:
            raise ConfigError(str(raw_key), "unknown option")
        setattr(cfg, key, _coerce(key, value))
    return cfg


def load_yaml_config(path: str | Path) -> RunConfig:
    """Read a run configuration; a top-level ``run:`` section is accepted too."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError("config", f"cannot read {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError("config", f"{path} is not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if isinstance(data, dict) and isinstance(data.get("run"), dict) and len(data) == 1:
        data = data["run"]
    if not isinstance(data, dict):
        raise ConfigError("config", f"{path} must hold a mapping of option: value")
    return config_from_mapping(data)
