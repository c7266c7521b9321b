"""Splitting the training set across nodes: iid, shards (the paper's non-iid) and Dirichlet."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dacflnode.errors import ConfigError
from dacflnode.learning.partition import PARTITIONS, label_counts, partition

BALANCED = np.repeat(np.arange(10), 600)  # 6000 samples, 600 per class, sorted by label


def shuffled_balanced(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).permutation(BALANCED)


def assert_disjoint_sorted_in_range(parts: list[np.ndarray], n: int) -> None:
    for part in parts:
        assert part.dtype == np.int64
        assert part.ndim == 1
        assert np.all(np.diff(part) > 0), "sorted, no repeats"
        if part.size:
            assert part[0] >= 0 and part[-1] < n
    joined = np.concatenate(parts) if parts else np.array([], dtype=np.int64)
    assert np.unique(joined).size == joined.size, "parts overlap"


# --------------------------------------------------------------------------------------------
# iid


def test_iid_gives_equal_disjoint_parts_covering_all_but_the_remainder() -> None:
    labels = shuffled_balanced()[:6007]
    parts = partition(labels, 10, "iid", seed=1)
    assert len(parts) == 10
    assert [p.size for p in parts] == [600] * 10
    assert_disjoint_sorted_in_range(parts, 6007)
    assert np.concatenate(parts).size == 6000  # the 7 left over are dropped


def test_iid_covers_everything_when_nodes_divide_the_samples() -> None:
    parts = partition(torch.from_numpy(BALANCED), 8, "iid", seed=0)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(6000))


def test_iid_parts_are_close_to_the_global_label_mix() -> None:
    parts = partition(BALANCED, 10, "iid", seed=2)
    counts = label_counts(BALANCED, parts, 10)
    assert counts.min() > 30 and counts.max() < 100  # expected 60 each


def test_iid_depends_on_the_seed() -> None:
    a = partition(BALANCED, 4, "iid", seed=0)
    b = partition(BALANCED, 4, "iid", seed=1)
    assert not all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


# --------------------------------------------------------------------------------------------
# shards


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("labels", [BALANCED, shuffled_balanced(7)], ids=["sorted", "shuffled"])
def test_shards_paper_setting_gives_every_node_exactly_two_labels(
    labels: np.ndarray, seed: int
) -> None:
    parts = partition(labels, 10, "shards", seed=seed)
    assert [p.size for p in parts] == [600] * 10
    assert_disjoint_sorted_in_range(parts, 6000)
    counts = label_counts(labels, parts, 10)
    assert ((counts > 0).sum(axis=1) == 2).all()
    assert set(counts[counts > 0].tolist()) == {300}
    # Every sample is used: 20 shards of 300 cover all 6000.
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(6000))


def test_shards_with_many_shards_per_node_still_avoid_repeated_labels() -> None:
    # 20 nodes x 5 shards over 10 classes: random draws rarely avoid repeats, the constructive
    # fallback must.
    labels = np.repeat(np.arange(10), 100)
    parts = partition(labels, 20, "shards", seed=3, shards_per_node=5)
    counts = label_counts(labels, parts, 10)
    assert ((counts > 0).sum(axis=1) == 5).all()
    assert [p.size for p in parts] == [50] * 20


def test_shards_allow_repeats_when_avoiding_them_is_impossible() -> None:
    labels = np.repeat(np.arange(2), 100)  # 2 classes, 3 shards per node
    parts = partition(labels, 2, "shards", seed=0, shards_per_node=3)
    assert [p.size for p in parts] == [99, 99]
    assert_disjoint_sorted_in_range(parts, 200)


def test_shards_one_per_node_gives_each_node_one_label() -> None:
    parts = partition(BALANCED, 10, "shards", seed=0, shards_per_node=1)
    counts = label_counts(BALANCED, parts, 10)
    assert ((counts > 0).sum(axis=1) == 1).all()
    assert sorted(counts.argmax(axis=1).tolist()) == list(range(10))


def test_shards_are_deterministic_and_seed_dependent() -> None:
    a = partition(BALANCED, 10, "shards", seed=11)
    b = partition(BALANCED, 10, "shards", seed=11)
    c = partition(BALANCED, 10, "shards", seed=12)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


# --------------------------------------------------------------------------------------------
# dirichlet


@pytest.mark.parametrize("alpha", [0.05, 0.5, 100.0])
def test_dirichlet_gives_every_node_a_minimum_and_uses_every_sample(alpha: float) -> None:
    labels = shuffled_balanced()
    parts = partition(labels, 20, "dirichlet", seed=0, alpha=alpha)
    assert len(parts) == 20
    assert min(p.size for p in parts) >= 10
    assert_disjoint_sorted_in_range(parts, 6000)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(6000))


def test_dirichlet_minimum_is_capped_by_the_samples_per_node() -> None:
    labels = np.repeat(np.arange(3), 10)  # 30 samples over 6 nodes: at least 5 each
    parts = partition(labels, 6, "dirichlet", seed=4, alpha=0.1)
    assert min(p.size for p in parts) >= 5


def test_dirichlet_skew_follows_alpha() -> None:
    labels = shuffled_balanced()

    def mean_labels_per_node(alpha: float) -> float:
        counts = label_counts(labels, partition(labels, 10, "dirichlet", seed=0, alpha=alpha), 10)
        share = counts / counts.sum(axis=1, keepdims=True)
        return float((share > 0.05).sum(axis=1).mean())

    assert mean_labels_per_node(0.05) < 4 < mean_labels_per_node(100.0)


def test_dirichlet_is_deterministic_in_its_seed() -> None:
    labels = shuffled_balanced()
    a = partition(labels, 10, "dirichlet", seed=5, alpha=0.3)
    b = partition(labels, 10, "dirichlet", seed=5, alpha=0.3)
    c = partition(labels, 10, "dirichlet", seed=6, alpha=0.3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_dirichlet_repairs_hopeless_draws_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    labels = np.repeat(np.arange(10), 60)  # 600 samples, 50 nodes, minimum 10 each
    with caplog.at_level(logging.WARNING, logger="dacflnode.learning.partition"):
        parts = partition(labels, 50, "dirichlet", seed=0, alpha=0.01)
    assert min(p.size for p in parts) >= 10
    assert sum(p.size for p in parts) == 600
    assert_disjoint_sorted_in_range(parts, 600)
    assert "moving samples" in caplog.text


# --------------------------------------------------------------------------------------------
# All schemes


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    n=st.integers(1, 120),
    num_classes=st.integers(1, 6),
    scheme=st.sampled_from(PARTITIONS),
    seed=st.integers(0, 2**32 - 1),
)
def test_every_scheme_returns_disjoint_in_range_parts_deterministically(
    data: st.DataObject, n: int, num_classes: int, scheme: str, seed: int
) -> None:
    labels = np.asarray(
        data.draw(st.lists(st.integers(0, num_classes - 1), min_size=n, max_size=n)),
        dtype=np.int64,
    )
    num_nodes = data.draw(st.integers(1, n))
    spn = data.draw(st.integers(1, 3))
    alpha = data.draw(st.floats(0.01, 10.0))
    assume(scheme != "shards" or num_nodes * spn <= n)
    parts = partition(labels, num_nodes, scheme, seed=seed, alpha=alpha, shards_per_node=spn)
    assert len(parts) == num_nodes
    assert_disjoint_sorted_in_range(parts, n)
    if scheme == "iid":
        assert {p.size for p in parts} == {n // num_nodes}
    elif scheme == "shards":
        assert {p.size for p in parts} == {spn * (n // (num_nodes * spn))}
    else:
        assert min(p.size for p in parts) >= min(10, n // num_nodes)
        assert sum(p.size for p in parts) == n
    again = partition(labels, num_nodes, scheme, seed=seed, alpha=alpha, shards_per_node=spn)
    assert all(np.array_equal(x, y) for x, y in zip(parts, again, strict=True))


def test_labels_need_not_be_contiguous_class_ids() -> None:
    labels = np.repeat(np.array([-3, 7, 42, 1000]), 25)
    for scheme in PARTITIONS:
        parts = partition(labels, 4, scheme, seed=0, shards_per_node=1)
        assert_disjoint_sorted_in_range(parts, 100)
    parts = partition(labels, 4, "shards", seed=0, shards_per_node=1)
    assert sorted(int(np.unique(labels[p]).size) for p in parts) == [1, 1, 1, 1]


def test_label_counts_tabulates_each_node() -> None:
    labels = np.array([0, 1, 1, 2, 2, 2])
    counts = label_counts(torch.from_numpy(labels), [np.array([0, 1]), np.array([2, 3, 4, 5])], 4)
    assert counts.dtype == np.int64
    assert counts.tolist() == [[1, 1, 0, 0], [0, 1, 3, 0]]


def test_label_counts_rejects_labels_beyond_num_classes() -> None:
    with pytest.raises(ValueError, match=r"0\.\.1"):
        label_counts(np.array([0, 2]), [np.array([0, 1])], 2)


# --------------------------------------------------------------------------------------------
# Errors


def test_unknown_scheme_names_field_partition() -> None:
    with pytest.raises(ConfigError) as info:
        partition(BALANCED, 10, "pathological", seed=0)
    assert info.value.field == "partition"
    assert info.value.message == (
        "unknown partition 'pathological' (choose from iid, shards, dirichlet)"
    )


@pytest.mark.parametrize("scheme", PARTITIONS)
@pytest.mark.parametrize("num_nodes", [0, -2])
def test_fewer_than_one_node_names_field_nodes(scheme: str, num_nodes: int) -> None:
    with pytest.raises(ConfigError) as info:
        partition(BALANCED, num_nodes, scheme, seed=0)
    assert info.value.field == "nodes"


@pytest.mark.parametrize("scheme", PARTITIONS)
def test_more_nodes_than_samples_names_field_nodes(scheme: str) -> None:
    with pytest.raises(ConfigError, match="use fewer nodes") as info:
        partition(np.arange(5) % 2, 6, scheme, seed=0, shards_per_node=1)
    assert info.value.field == "nodes"


def test_more_shards_than_samples_names_field_nodes() -> None:
    with pytest.raises(ConfigError, match="10 nodes x 2 shards") as info:
        partition(np.arange(19) % 3, 10, "shards", seed=0)
    assert info.value.field == "nodes"


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("nan"), float("inf")])
def test_non_positive_alpha_names_field_dirichlet_alpha(alpha: float) -> None:
    with pytest.raises(ConfigError) as info:
        partition(BALANCED, 10, "dirichlet", seed=0, alpha=alpha)
    assert info.value.field == "dirichlet_alpha"


def test_zero_shards_per_node_names_its_field() -> None:
    with pytest.raises(ConfigError) as info:
        partition(BALANCED, 10, "shards", seed=0, shards_per_node=0)
    assert info.value.field == "shards_per_node"


def test_labels_must_be_one_dimensional_integers() -> None:
    with pytest.raises(ValueError, match="one-dimensional"):
        partition(np.zeros((3, 2), dtype=np.int64), 2, "iid", seed=0)
    with pytest.raises(ValueError, match="integers"):
        partition(np.zeros(6), 2, "iid", seed=0)
