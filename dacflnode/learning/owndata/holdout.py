"""The held-out test split of a device's own data: which samples it evaluates on when it has no
test files (``holdout`` of them, drawn by the run's ``seed``)."""

from __future__ import annotations

import numpy as np

from dacflnode.errors import ConfigError


def holdout_split(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic ``(train, test)`` index arrays: a seeded permutation's first
    ``round(fraction * n)`` indices (at least one when ``fraction > 0``) are the test set. Both
    are sorted; the same ``n``, ``fraction`` and ``seed`` always give the same split."""
    if not 0.0 <= fraction < 1.0:
        raise ConfigError("holdout", f"must be a fraction in [0, 1), got {fraction!r}")
    if fraction == 0.0:
        return np.arange(n, dtype=np.int64), np.zeros(0, dtype=np.int64)
    n_test = max(1, round(fraction * n))
    if n_test >= n:
        raise ConfigError("holdout", f"holding out {fraction} of {n} samples leaves none to "
                                     "train on; use a smaller fraction or more data")
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[n_test:]).astype(np.int64), np.sort(perm[:n_test]).astype(np.int64)


def holdout_slots(n: int, fraction: float, seed: int) -> tuple[np.ndarray, int, int]:
    """Where each of ``n`` samples goes under :func:`holdout_split`: ``slots[i] >= 0`` is its
    row in the training array, ``-1 - slots[i]`` its row in the test array; with the two sizes.
    Filling two arrays through the slots gives exactly ``x[train]`` and ``x[test]``, without a
    copy of the whole."""
    train, test = holdout_split(n, fraction, seed)
    slots = np.empty(n, dtype=np.int64)
    slots[train] = np.arange(train.size, dtype=np.int64)
    slots[test] = -1 - np.arange(test.size, dtype=np.int64)
    return slots, int(train.size), int(test.size)
