"""Splitting the training set across nodes.

Three schemes, each a pure function of the labels, the number of nodes and a seed:

``iid``
    A seeded random permutation cut into ``n // num_nodes`` samples per node (the remainder is
    dropped): every node holds the same number of samples drawn uniformly at random.
``shards``
    The paper's non-iid split: sort the samples by label (stable), cut them into
    ``num_nodes * shards_per_node`` equal shards and give each node ``shards_per_node`` of them
    at random. When it is achievable, no node gets two shards of the same label, so with 10 nodes,
    2 shards each and 10 balanced classes every node holds exactly 2 labels.
``dirichlet``
    For every class, proportions over the nodes drawn from ``Dirichlet(alpha)``; small ``alpha``
    is very skewed, large ``alpha`` close to iid. Every node gets at least
    ``min(10, n // num_nodes)`` samples.

Each node's part is a sorted ``int64`` array of indices into the training set; parts are
disjoint. The same arguments always give the same parts.
"""

from __future__ import annotations

import logging
import math
import operator

import numpy as np
import torch

from dacflnode.errors import ConfigError
from dacflnode.learning.names import PARTITIONS as PARTITIONS

_SHARD_TRIES = 100
"""Random shard assignments drawn before falling back to a constructive (still seeded) one."""

_DIRICHLET_TRIES = 1000
"""Dirichlet draws before the last one is repaired to reach the minimum node size."""

_DIRICHLET_MIN_SIZE = 10

logger = logging.getLogger(__name__)


def partition(
    labels: torch.Tensor | np.ndarray,
    num_nodes: int,
    scheme: str,
    *,
    seed: int,
    alpha: float = 0.5,
    shards_per_node: int = 2,
) -> list[np.ndarray]:
    """Split the training set with ``labels`` across ``num_nodes`` nodes.

    Returns one sorted ``int64`` array of training-set indices per node; the arrays are
    disjoint. ``alpha`` only applies to ``dirichlet``, ``shards_per_node`` only to ``shards``.
    Raises :class:`ConfigError` (field ``partition``, ``nodes``, ``dirichlet_alpha`` or
    ``shards_per_node``) for arguments that cannot work.
    """
    # Labels as codes 0..K-1 of their distinct values, so any integer labels work.
    _, y = np.unique(_as_label_array(labels), return_inverse=True)
    y = y.reshape(-1).astype(np.int64)
    key = scheme.strip().lower() if isinstance(scheme, str) else scheme
    if key not in PARTITIONS:
        raise ConfigError(
            "partition", f"unknown partition {scheme!r} (choose from {', '.join(PARTITIONS)})"
        )
    nodes = _check_nodes(num_nodes)
    n = y.shape[0]
    rng = np.random.default_rng(seed)
    if key == "iid":
        _check_enough(nodes, n, "training samples")
        return _iid(n, nodes, rng)
    if key == "shards":
        spn = _check_shards_per_node(shards_per_node)
        _check_enough(nodes * spn, n, "training samples", what=f"{nodes} nodes x {spn} shards")
        return _shards(y, nodes, spn, rng)
    _check_alpha(alpha)
    _check_enough(nodes, n, "training samples")
    return _dirichlet(y, nodes, float(alpha), rng)


def label_counts(
    labels: torch.Tensor | np.ndarray, parts: list[np.ndarray], num_classes: int
) -> np.ndarray:
    """``[num_nodes, num_classes]`` int64 matrix: how many samples of each class each node holds."""
    y = _as_label_array(labels)
    if y.size and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ValueError(f"labels must lie in 0..{num_classes - 1}, got {y.min()}..{y.max()}")
    counts = np.zeros((len(parts), num_classes), dtype=np.int64)
    for i, part in enumerate(parts):
        counts[i] = np.bincount(y[np.asarray(part, dtype=np.int64)], minlength=num_classes)
    return counts


# --------------------------------------------------------------------------------------------
# Validation


def _as_label_array(labels: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    y = np.asarray(labels)
    if y.ndim != 1:
        raise ValueError(f"labels must be one-dimensional, got shape {y.shape}")
    if y.size and not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {y.dtype}")
    return y.astype(np.int64, copy=False)


def _check_nodes(num_nodes: int) -> int:
    try:
        nodes = operator.index(num_nodes)
    except TypeError:
        raise ConfigError("nodes", f"must be a whole number, got {num_nodes!r}") from None
    if isinstance(num_nodes, bool) or nodes < 1:
        raise ConfigError("nodes", f"need at least 1 node, got {num_nodes!r}")
    return nodes


def _check_shards_per_node(shards_per_node: int) -> int:
    try:
        spn = operator.index(shards_per_node)
    except TypeError:
        raise ConfigError(
            "shards_per_node", f"must be a whole number, got {shards_per_node!r}"
        ) from None
    if isinstance(shards_per_node, bool) or spn < 1:
        raise ConfigError("shards_per_node", f"need at least 1 shard per node, got {spn}")
    return spn


def _check_alpha(alpha: float) -> None:
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        raise ConfigError("dirichlet_alpha", f"must be a number, got {alpha!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(
            "dirichlet_alpha",
            f"must be a positive finite number (e.g. 0.5; smaller is more skewed), got {alpha!r}",
        )


def _check_enough(needed: int, n: int, unit: str, *, what: str | None = None) -> None:
    if needed > n:
        label = what if what is not None else f"{needed} nodes"
        raise ConfigError(
            "nodes",
            f"{label} but only {n} {unit}: every node needs samples; use fewer nodes"
            + (" or fewer shards per node" if what is not None else ""),
        )


# --------------------------------------------------------------------------------------------
# Schemes


def _iid(n: int, nodes: int, rng: np.random.Generator) -> list[np.ndarray]:
    per_node = n // nodes
    perm = rng.permutation(n)[: per_node * nodes].reshape(nodes, per_node)
    return [np.sort(row).astype(np.int64) for row in perm]


def _shards(y: np.ndarray, nodes: int, spn: int, rng: np.random.Generator) -> list[np.ndarray]:
    total = nodes * spn
    size = y.shape[0] // total
    order = np.argsort(y, kind="stable")
    shards = order[: total * size].reshape(total, size)
    # A shard's label is its most frequent one (shards are single-label when classes are
    # balanced and the shard size divides the class size, as in the paper).
    shard_label = np.array([np.bincount(y[s]).argmax() for s in shards], dtype=np.int64)

    assignment = _assign_shards(shard_label, nodes, spn, rng)
    return [np.sort(shards[row].ravel()).astype(np.int64) for row in assignment]


def _assign_shards(
    shard_label: np.ndarray, nodes: int, spn: int, rng: np.random.Generator
) -> np.ndarray:
    """``[nodes, spn]`` shard ids: random, without two same-label shards on a node if possible.

    Rejection sampling keeps the draw uniform over the valid assignments; after
    :data:`_SHARD_TRIES` failed draws (only likely with many shards per node) a random
    round-robin construction is used instead, which is always valid when any assignment is.
    """
    total = nodes * spn
    achievable = spn == 1 or int(np.bincount(shard_label).max()) <= nodes
    assignment = rng.permutation(total).reshape(nodes, spn)
    if spn == 1 or not achievable:
        return assignment
    for _ in range(_SHARD_TRIES):
        if _no_repeated_label(shard_label[assignment]):
            return assignment
        assignment = rng.permutation(total).reshape(nodes, spn)
    if _no_repeated_label(shard_label[assignment]):
        return assignment
    # Shuffle the labels' order and the shards within each label, then deal the shards
    # round-robin: a label's shards are consecutive and at most `nodes` of them, so they land
    # on distinct nodes. Finally shuffle which node gets which hand.
    label_order = rng.permutation(int(shard_label.max()) + 1)
    rank = np.empty_like(label_order)
    rank[label_order] = np.arange(label_order.size)
    tiebreak = rng.permutation(total)
    dealt = np.lexsort((tiebreak, rank[shard_label]))
    hands = dealt.reshape(spn, nodes).T
    return hands[rng.permutation(nodes)]


def _no_repeated_label(assigned_labels: np.ndarray) -> bool:
    ordered = np.sort(assigned_labels, axis=1)
    return not bool(np.any(ordered[:, 1:] == ordered[:, :-1]))


def _dirichlet(
    y: np.ndarray, nodes: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    n = y.shape[0]
    min_size = min(_DIRICHLET_MIN_SIZE, n // nodes)
    classes = np.unique(y)
    by_class = [np.flatnonzero(y == c) for c in classes]
    class_sizes = np.array([idx.size for idx in by_class], dtype=np.int64)

    def draw() -> np.ndarray:
        """``[classes, nodes]`` sample counts from one Dirichlet draw per class."""
        proportions = rng.dirichlet(np.full(nodes, alpha), size=classes.size)
        cuts = np.floor(np.cumsum(proportions, axis=1) * class_sizes[:, None]).astype(np.int64)
        cuts[:, -1] = class_sizes  # the cumulative sum may end a rounding error short of 1
        return np.diff(cuts, axis=1, prepend=0)

    for _ in range(_DIRICHLET_TRIES):
        counts = draw()
        if counts.sum(axis=0).min() >= min_size:
            break
    else:
        logger.warning(
            "no Dirichlet(%g) draw gave all %d nodes at least %d samples in %d tries; "
            "moving samples from the largest nodes to the smallest",
            alpha,
            nodes,
            min_size,
            _DIRICHLET_TRIES,
            extra={"event": "partition_rebalanced"},
        )
        counts = _repair_counts(counts, min_size)

    parts: list[list[np.ndarray]] = [[] for _ in range(nodes)]
    for idx, row in zip(by_class, counts, strict=True):
        shuffled = rng.permutation(idx)
        for node, chunk in enumerate(np.split(shuffled, np.cumsum(row)[:-1])):
            parts[node].append(chunk)
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def _repair_counts(counts: np.ndarray, min_size: int) -> np.ndarray:
    """Move single samples from the largest node to the smallest until all reach ``min_size``.

    Possible because ``min_size * nodes <= n``. Deterministic: it only depends on ``counts``.
    """
    counts = counts.copy()
    sizes = counts.sum(axis=0)
    while sizes.min() < min_size:
        small = int(sizes.argmin())
        large = int(sizes.argmax())
        cls = int(counts[:, large].argmax())  # the large node's most plentiful class
        counts[cls, large] -= 1
        counts[cls, small] += 1
        sizes[large] -= 1
        sizes[small] += 1
    return counts
