"""What one node trains and evaluates on: its share of a built-in data set, or its own data.

The daemon (:func:`~dacflnode.assembly.build.build_node`) and the simulator
(:mod:`dacflnode.sim.simulator`) both get a node's data here, so that a simulated node and a
daemon on the same files train on the same tensors:

* a built-in data set (``fashion-mnist``, ``mnist``, ``cifar10``, ``synthetic``) is loaded whole
  and cut by ``run.partition``; the node takes part ``node.share`` and evaluates on the shared
  test set (``run.eval_samples`` of it);
* own data (``folder``, ``table``, ``python``) is read from the node's ``data_root`` by
  :func:`~dacflnode.learning.owndata.load_local_data` (decoded images cached in the node's state
  folder); it evaluates on its ``test_root`` or, without one, on the held-out fraction
  ``run.holdout`` of its data. Its :class:`~dacflnode.learning.owndata.contract.DataContract`
  goes into the handshake.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from dacflnode.config import RunConfig
from dacflnode.errors import ConfigError
from dacflnode.learning.datasets import eval_subset, load_dataset
from dacflnode.learning.feature_scale import FeatureScale, LocalMoments
from dacflnode.learning.models import default_model_for, default_model_for_shape
from dacflnode.learning.partition import partition
from dacflnode.records.metrics_log import DataInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeDataSet:
    """One node's training and test tensors, with what describes them."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    input_shape: tuple[int, int, int]
    num_classes: int
    #: the model a run without ``model`` trains
    default_model: str
    info: DataInfo
    #: the run's data contract as canonical JSON (own data), or "" (a built-in data set)
    contract: str = ""
    #: a table's statistics for the network's feature scale (``run.scaling``, not ``none``),
    #: over its numeric features; ``None``: nothing to agree on
    moments: LocalMoments | None = None
    scaling: str = "none"
    #: the table's feature names (what the agreed scale's figures are shown by)
    feature_names: tuple[str, ...] = ()


def class_counts(labels: torch.Tensor, names: list[str]) -> dict[str, int]:
    """Samples per class name (``names[i]`` is label ``i``)."""
    counts = torch.bincount(labels.to(torch.int64), minlength=len(names)).tolist()
    return {name: int(c) for name, c in zip(names, counts, strict=False)}


def builtin_node_data(run: RunConfig, share: int) -> NodeDataSet:
    """Part ``share`` of the run's built-in data set, cut by ``run.partition``."""
    dataset = load_dataset(run.dataset, run.data_root, download=run.download,
                           synthetic_train=run.synthetic_train,
                           synthetic_test=run.synthetic_test, seed=run.seed)
    parts = partition(dataset.train_y, run.nodes, run.partition, seed=run.seed,
                      alpha=run.dirichlet_alpha, shards_per_node=run.shards_per_node)
    index = torch.from_numpy(parts[share])
    train_x, train_y = dataset.train_x[index], dataset.train_y[index]
    test_x, test_y = eval_subset(dataset.test_x, dataset.test_y, run.eval_samples, run.seed)
    names = [str(i) for i in range(dataset.num_classes)]
    info = DataInfo(int(train_y.numel()), int(test_y.numel()), class_counts(train_y, names))
    return NodeDataSet(train_x, train_y, test_x, test_y, dataset.input_shape,
                       dataset.num_classes, run.model or default_model_for(dataset.name), info)


def cache_dir_in(state_dir: Path) -> Path:
    """Where a node caches its decoded images: a hidden folder of its state folder, so that a
    state folder that is (or lies in) the data folder itself adds no folder a class listing
    would see."""
    return state_dir / ".cache"


def own_node_data(run: RunConfig, cache_dir: Path | None) -> NodeDataSet:
    """The node's own data: ``run.data_root`` (and ``run.test_root``) as this node sees them;
    ``cache_dir`` (:func:`cache_dir_in` the state folder) keeps the decoded images."""
    from dacflnode.learning.owndata import load_local_data
    from dacflnode.learning.owndata.contract import model_input_shape

    if run.data_root is None and run.dataset != "python":
        raise ConfigError(
            "data_root",
            f"dataset {run.dataset} reads this device's own data: set data_root (a peers"
            " file's node: or run: section, or --data-root DIR with DIR/<node-id>/ per node)",
        )
    # a python source without a data_root: the factory is the whole spec (it gets no path)
    bare = run.dataset == "python" and run.data_root is None
    local = load_local_data(
        run.dataset, Path(run.data_root) if run.data_root else str(run.data_factory),
        classes=list(run.classes),
        input_shape=((run.channels, run.image_size, run.image_size)
                     if run.dataset == "folder" else None),
        resize=run.resize,
        label_column=run.label_column,
        test_root=Path(run.test_root) if run.test_root else None,
        holdout=run.holdout,
        seed=run.seed,
        cache_dir=cache_dir,
        on_bad=run.bad_files,
        factory=None if bare else run.data_factory,
        categories=run.categories,
        other_category=run.other_category,
        missing=run.missing,
    )
    if local.skipped:
        log.warning("%s: %d undecodable files skipped (bad_files: skip)", run.data_root,
                    local.skipped, extra={"event": "data_files_skipped"})
    shape = model_input_shape(local.contract.input_shape)
    test_x, test_y = eval_subset(local.test_x, local.test_y, run.eval_samples, run.seed)
    names = list(run.classes)
    info = DataInfo(local.train_size, int(test_y.numel()), dict(local.histogram),
                    int(local.skipped))
    scaled = run.dataset == "table" and run.scaling != "none"
    return NodeDataSet(local.train_x, local.train_y, test_x, test_y, shape, len(names),
                       run.model or default_model_for_shape(shape), info,
                       contract=local.contract.to_json(),
                       moments=(LocalMoments.of(local.train_x, local.numeric_features)
                                if scaled else None),
                       scaling=run.scaling if scaled else "none",
                       feature_names=local.contract.feature_names)


def scale_in_place(data: NodeDataSet, scale: FeatureScale) -> None:
    """Transform ``data``'s training and test rows with the network's ``scale``."""
    scale.apply(data.train_x)
    if data.test_x.data_ptr() != data.train_x.data_ptr():
        scale.apply(data.test_x)


def contract_summary(contract: str) -> str:
    """A short description of a contract for logs: ``folder, 3 classes, 1x28x28``."""
    data = json.loads(contract)
    shape = "x".join(str(s) for s in data["input_shape"])
    return f"{data['kind']}, {len(data['classes'])} classes, {shape}"


def contract_difference_all(ids: Sequence[str], contracts: Sequence[str]) -> str | None:
    """What differs between node ``ids[k]``'s contract and the first node's, for the first
    ``k`` where one does (a simulation's nodes, which have no handshake of their own)."""
    from dacflnode.learning.owndata.contract import DataContract

    first = DataContract.from_json(contracts[0])
    for node, text in zip(ids[1:], contracts[1:], strict=True):
        why = first.difference(DataContract.from_json(text), node)
        if why is not None:
            return f"{why} (this run: the data of {ids[0]})"
    return None
