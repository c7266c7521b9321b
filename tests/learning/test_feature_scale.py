"""The network's feature scale: a device's moments, the scale of exact totals, the transform."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from dacflnode.learning.feature_scale import FeatureScale, LocalMoments


def table(seed: int, rows: int = 50) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.stack([rng.normal(100.0, 15.0, rows), rng.integers(0, 2, rows),
                  rng.uniform(-1e6, 1e6, rows), np.full(rows, 7.0)], axis=1).astype(np.float32)
    x[::7, 0] = np.nan  # missing cells
    return x


def exact_scale(method: str, parts: list[np.ndarray], columns=(0, 2, 3)) -> FeatureScale:
    moments = [LocalMoments.of(p, columns) for p in parts]
    k = len(columns)
    return FeatureScale.from_totals(
        method, columns, [sum(m.count[j] for m in moments) for j in range(k)],
        [sum((Fraction(m.total[j]) for m in moments), Fraction(0)) for j in range(k)],
        [sum((Fraction(m.squares[j]) for m in moments), Fraction(0)) for j in range(k)],
        [min(m.low[j] for m in moments) for j in range(k)],
        [max(m.high[j] for m in moments) for j in range(k)])


def test_the_moments_leave_missing_cells_out():
    x = table(0)
    m = LocalMoments.of(x, (0, 2))
    present = x[~np.isnan(x[:, 0]), 0].astype(np.float64)
    assert m.count == (present.size, 50)
    assert m.total[0] == pytest.approx(present.sum())
    assert m.squares[0] == pytest.approx((present ** 2).sum())
    assert (m.low[0], m.high[0]) == (present.min(), present.max())


def test_the_agreed_mean_and_std_are_those_of_the_union_of_the_devices():
    parts = [table(s) for s in range(3)]
    scale = exact_scale("standardize", parts)
    union = np.concatenate(parts).astype(np.float64)
    for j, c in enumerate(scale.columns):
        values = union[~np.isnan(union[:, c]), c]
        assert scale.mean[j] == pytest.approx(values.mean(), rel=1e-12)
        assert scale.std[j] == pytest.approx(values.std(), rel=1e-9, abs=1e-12)
    assert scale.count[0] == sum(int((~np.isnan(p[:, 0])).sum()) for p in parts)


def test_standardised_features_have_mean_zero_and_std_one_over_the_network():
    parts = [table(s) for s in range(3)]
    scale = exact_scale("standardize", parts)
    rows = [torch.from_numpy(p.copy()).reshape(-1, 1, 1, 4) for p in parts]
    for r in rows:
        scale.apply(r)
    union = torch.cat(rows).reshape(-1, 4).double()
    assert not torch.isnan(union).any()  # a missing cell became the mean: 0
    assert union[:, 2].mean().item() == pytest.approx(0.0, abs=1e-5)
    assert union[:, 2].std(unbiased=False).item() == pytest.approx(1.0, abs=1e-5)
    assert torch.equal(union[:, 1], torch.from_numpy(np.concatenate(parts)[:, 1]).double())
    assert torch.all(union[:, 3] == 0.0)  # a constant feature is centred only
    assert torch.all(torch.cat(rows).reshape(-1, 4)[::7, 0][:1] == 0.0)


def test_minmax_puts_the_network_range_on_zero_to_one():
    parts = [table(s) for s in range(3)]
    scale = exact_scale("minmax", parts)
    rows = [p.copy() for p in parts]
    for r in rows:
        scale.apply(r)
    union = np.concatenate(rows)
    assert np.nanmin(union[:, 2]) == 0.0 and np.nanmax(union[:, 2]) == pytest.approx(1.0)


def test_the_same_rows_give_the_same_bits_on_every_device():
    parts = [table(s) for s in range(2)]
    a = exact_scale("standardize", parts)
    b = FeatureScale.from_json(a.to_json())
    assert a == b and a.digest == b.digest
    one, two = parts[0].copy(), parts[0].copy()
    a.apply(one)
    b.apply(two)
    assert one.tobytes() == two.tobytes()


def test_a_scale_record_of_another_form_is_refused():
    with pytest.raises(ValueError, match="not a feature scale"):
        FeatureScale.from_json('{"method": "standardize"}')
    with pytest.raises(ValueError):
        FeatureScale.from_json("[1, 2]")


def test_none_leaves_the_features_as_they_are():
    x = table(1)
    before = x.copy()
    exact_scale("none", [x]).apply(x)
    assert np.array_equal(x, before, equal_nan=True)
