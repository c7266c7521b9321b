"""The defaults of a run that follow its data set: the model and the learning rate.

The defaults follow the paper's Table 1 (lr 0.001 for (F)MNIST, 0.005 for CIFAR-10); the
synthetic data set, this project's own, and a device's own tables train the ``mlp`` at lr 0.05
(see :class:`~dacflnode.config.run.RunConfig`): at the paper's CNN rate an ``mlp`` on a table
barely moves (the Wine example's three devices, examples/own-data/tables, after 10 rounds: an
Average of Acc of 46.7% at 0.001, 100% at 0.05).
"""

from __future__ import annotations

from typing import Protocol

from dacflnode.errors import ConfigError

__all__ = ["DEFAULT_LR_TEXT", "default_lr", "resolved_model"]

#: The learning rate of a data set not in :data:`_DEFAULT_LR`: the paper's (F)MNIST rate.
_PAPER_LR = 0.001
# The default learning rate of the data sets that train at another rate.
_DEFAULT_LR = {"cifar10": 0.005, "synthetic": 0.05, "table": 0.05}

#: How the default ``lr`` reads in help texts and docs/configuration.md.
DEFAULT_LR_TEXT = f"{_PAPER_LR:g}; " + "; ".join(
    f"{lr:g} for {name}" for name, lr in _DEFAULT_LR.items())


def default_lr(dataset: str) -> float:
    """The learning rate of a run on ``dataset`` that sets no ``lr``."""
    return _DEFAULT_LR.get(dataset, _PAPER_LR)


class ModelSettings(Protocol):
    """The settings of a :class:`~dacflnode.config.run.RunConfig` that choose its model (a
    protocol, so that this module, which ``run.py`` imports, imports nothing of it)."""

    @property
    def model(self) -> str | None: ...
    @property
    def dataset(self) -> str: ...
    @property
    def channels(self) -> int: ...
    @property
    def image_size(self) -> int: ...


def resolved_model(run: ModelSettings) -> str:
    """The model ``run`` trains: ``model`` when set, else its data set's default (what the
    handshake fingerprint hashes, so that an unset and an explicit default agree)."""
    if run.model is not None:
        return run.model
    from dacflnode.learning.models import default_model_for, default_model_for_shape

    if run.dataset == "folder":
        return default_model_for_shape((run.channels, run.image_size, run.image_size))
    if run.dataset == "table":
        return "mlp"

    try:
        return default_model_for(run.dataset)
    except ConfigError:
        return f"default:{run.dataset}"
