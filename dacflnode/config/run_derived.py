"""The values a run derives from its settings (:class:`DerivedValues`, the base of
:class:`~dacflnode.config.run.RunConfig`): the learning rate, the mixing rule, the training
and topology settings in the form the numerical code takes them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dacflnode.algorithms.compression_spec import parse_compression
from dacflnode.config.dataset_defaults import default_lr
from dacflnode.errors import ConfigError

if TYPE_CHECKING:  # the numerical stack loads when a run is built, not with the settings
    from dacflnode.algorithms.rounds import Mixing
    from dacflnode.algorithms.topology import TopologySpec
    from dacflnode.learning.train import TrainConfig


class DerivedValues:
    """Methods over a run's settings (declared on :class:`~dacflnode.config.run.RunConfig`)."""

    if TYPE_CHECKING:
        lr: float | None
        dataset: str
        compression: str
        consensus_step: float | None
        mixing: str
        clip_radius: float | None
        clip_fraction: float
        lr_decay: float
        momentum: float
        weight_decay: float
        batch_size: int
        local_epochs: int
        local_steps: int | None
        precision: str
        mixing_matrix: str | None
        topology: str
        nodes: int
        seed: int
        time_varying: int
        degree: int
        edge_prob: float
        zero_fraction: float
        drop_prob: float
        edge_list: str | None

    @property
    def learning_rate(self) -> float:
        if self.lr is not None:
            return self.lr
        return default_lr(self.dataset)

    def consensus_gamma(self) -> float | None:
        """CHOCO's step of a compressed run (``consensus_step``, else the compressor's
        default); ``None`` without compression."""
        if not parse_compression(self.compression).compressed:
            return None
        if self.consensus_step is not None:
            return self.consensus_step
        from dacflnode.algorithms.compression import make_compressor

        compressor = make_compressor(self.compression)
        assert compressor is not None
        return compressor.default_gamma

    def mixing_rule(self, initial: Any) -> Mixing:
        """How every node of this run mixes; ``initial``: the common initial model (a flat
        tensor), whose norm ``clip_fraction`` is a fraction of. A compressed run mixes with
        CHOCO-Gossip (docs/compression.md)."""
        from dacflnode.algorithms.rounds import Mixing

        gamma = self.consensus_gamma()
        if gamma is not None:
            return Mixing("choco", gamma=gamma)
        if self.mixing == "exact":
            return Mixing()
        if self.clip_radius is not None:
            return Mixing("clipped", self.clip_radius)
        norm = float(initial.double().norm())
        if not norm > 0:
            raise ConfigError("clip_fraction", "the initial model's norm is 0: set clip_radius")
        return Mixing("clipped", self.clip_fraction * norm)

    def train_config(self) -> TrainConfig:
        """The local-training settings of this run (one SGD per round per node)."""
        from dacflnode.learning.train import TrainConfig

        return TrainConfig(
            lr=self.learning_rate,
            lr_decay=self.lr_decay,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
            batch_size=self.batch_size,
            local_epochs=self.local_epochs,
            local_steps=self.local_steps,
            precision=self.precision,
        )

    def topology_spec(self) -> TopologySpec:
        from dacflnode.algorithms.topology import TopologySpec, load_matrix_file

        topology = (
            "custom"
            if self.mixing_matrix and self.topology in ("dense", "custom")
            else self.topology
        )
        matrix = (
            load_matrix_file(self.mixing_matrix)
            if topology == "custom" and self.mixing_matrix
            else None
        )
        return TopologySpec(
            topology=topology,
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
