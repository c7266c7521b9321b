"""One scale for a table's numeric features, the same on every device: the statistics a device
contributes (:class:`LocalMoments`) and the transform the network agrees on (:class:`FeatureScale`).

A device computes, per numeric feature, its count of values, their float64 sum and sum of
squares, its minimum and maximum (missing cells, ``NaN``, left out). The nodes add those up
without revealing any device's own (:mod:`dacflnode.protocol.scale_agreement`), exactly, so every
node builds the same :class:`FeatureScale` from the same totals, bit for bit, and applies it with
the same float32 operations: the one model sees one transform of the same row everywhere.

``standardize``: ``(x - mean) / std`` (population standard deviation; a constant feature is
only centred). ``minmax``: ``(x - min) / (max - min)`` (a constant feature: ``x - min``). A
missing cell (``missing: mean``) becomes the agreed mean, transformed like any value.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import torch

#: The choices of the run setting ``scaling``.
SCALINGS = ("standardize", "minmax", "none")

#: Rows per block when the moments are summed and the transform applied (bounded temporaries).
BLOCK_ROWS = 16_384


def _matrix(features: np.ndarray | torch.Tensor) -> torch.Tensor:
    """``[n, F]`` view of ``[n, F]`` or ``[n, 1, 1, F]`` rows, as a tensor (no copy)."""
    x = torch.from_numpy(features) if isinstance(features, np.ndarray) else features
    return x.reshape(x.shape[0], x.shape[-1]) if x.ndim != 2 else x


@dataclass(frozen=True)
class LocalMoments:
    """One device's contribution, per scaled feature (``columns``, indices into the row):
    ``count`` of values, float64 ``total`` and ``squares``, ``low`` and ``high`` (``inf`` and
    ``-inf`` where it has no value)."""

    columns: tuple[int, ...]
    count: tuple[int, ...]
    total: tuple[float, ...]
    squares: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]

    @classmethod
    def of(cls, features: np.ndarray | torch.Tensor, columns: Sequence[int]) -> LocalMoments:
        """The moments of ``features`` (rows ``[n, F]`` or ``[n, 1, 1, F]``, ``NaN`` for a
        missing cell) over ``columns``, summed in blocks of :data:`BLOCK_ROWS` rows (the same
        rows always give the same float64 sums)."""
        x = _matrix(features)
        cols = np.asarray(columns, dtype=np.int64)
        k = len(cols)
        count = np.zeros(k, dtype=np.int64)
        total = np.zeros(k, dtype=np.float64)
        squares = np.zeros(k, dtype=np.float64)
        low = np.full(k, np.inf)
        high = np.full(k, -np.inf)
        for start in range(0, x.shape[0], BLOCK_ROWS):
            block = x[start:start + BLOCK_ROWS].cpu().numpy()[:, cols].astype(np.float64)
            present = ~np.isnan(block)
            count += present.sum(axis=0)
            values = np.where(present, block, 0.0)
            total += values.sum(axis=0)
            squares += (values * values).sum(axis=0)
            if present.any():
                low = np.minimum(low, np.where(present, block, np.inf).min(axis=0))
                high = np.maximum(high, np.where(present, block, -np.inf).max(axis=0))
        return cls(tuple(int(c) for c in cols), tuple(int(c) for c in count),
                   tuple(float(t) for t in total), tuple(float(s) for s in squares),
                   tuple(float(v) for v in low), tuple(float(v) for v in high))


@dataclass(frozen=True)
class FeatureScale:
    """The agreed transform of the numeric features ``columns``: the network's ``count``,
    ``mean`` and ``std`` (float64), ``low`` and ``high`` per feature, and the ``method``."""

    method: str
    columns: tuple[int, ...]
    count: tuple[int, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]

    def __post_init__(self) -> None:
        if self.method not in SCALINGS:
            raise ValueError(f"unknown scaling {self.method!r}")
        sizes = {len(f) for f in (self.columns, self.count, self.mean, self.std, self.low,
                                  self.high)}
        if len(sizes) != 1:
            raise ValueError("a feature scale's fields must have one entry per column")

    @classmethod
    def from_totals(cls, method: str, columns: Sequence[int], count: Sequence[int],
                    total: Sequence[Fraction], squares: Sequence[Fraction],
                    low: Sequence[float], high: Sequence[float]) -> FeatureScale:
        """The scale of the network's exact totals: the mean ``total / count`` and the variance
        ``squares / count - mean**2`` are computed as fractions and rounded once to float64,
        so equal totals give equal scales on every machine."""
        means: list[float] = []
        stds: list[float] = []
        for n, s, q in zip(count, total, squares, strict=True):
            if n <= 0:
                means.append(0.0)
                stds.append(1.0)
                continue
            mean = Fraction(s) / n
            variance = max(Fraction(q) / n - mean * mean, Fraction(0))
            means.append(float(mean))
            stds.append(math.sqrt(float(variance)))
        return cls(method, tuple(int(c) for c in columns), tuple(int(n) for n in count),
                   tuple(means), tuple(stds), tuple(float(v) for v in low),
                   tuple(float(v) for v in high))

    def _shift_divisor(self) -> tuple[np.ndarray, np.ndarray]:
        if self.method == "minmax":
            low = np.array([v if math.isfinite(v) else 0.0 for v in self.low])
            span = np.array([h - lo if math.isfinite(h - lo) and h > lo else 1.0
                             for lo, h in zip(self.low, self.high, strict=True)])
            return low.astype(np.float32), span.astype(np.float32)
        std = np.array([s if s > 0.0 else 1.0 for s in self.std])
        return np.array(self.mean).astype(np.float32), std.astype(np.float32)

    def apply(self, features: torch.Tensor | np.ndarray) -> None:
        """Transform ``features`` (rows ``[n, F]`` or ``[n, 1, 1, F]``, float32) in place, a
        block of rows at a time; a missing cell (``NaN``) becomes the agreed mean, transformed."""
        if self.method == "none" or not self.columns:
            return
        x = _matrix(features)
        cols = torch.tensor(self.columns, dtype=torch.int64, device=x.device)
        shift, divisor = (torch.from_numpy(a).to(x.device) for a in self._shift_divisor())
        fill = (torch.tensor(self.mean, dtype=torch.float64).to(torch.float32).to(x.device)
                - shift) / divisor
        for start in range(0, x.shape[0], BLOCK_ROWS):
            rows = x[start:start + BLOCK_ROWS]
            block = rows.index_select(1, cols)
            block.sub_(shift).div_(divisor)
            block = torch.where(torch.isnan(block), fill, block)
            rows.index_copy_(1, cols, block)

    # ------------------------------------------------------------------ records
    def to_dict(self) -> dict[str, Any]:
        """JSON-able, floats as ``float.hex`` strings (read back bit for bit)."""
        def hexes(values: tuple[float, ...]) -> list[str]:
            return [float(v).hex() for v in values]

        return {"method": self.method, "columns": list(self.columns), "count": list(self.count),
                "mean": hexes(self.mean), "std": hexes(self.std), "low": hexes(self.low),
                "high": hexes(self.high)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> FeatureScale:
        """Parse :meth:`to_json`'s output; ``ValueError`` on anything else."""
        try:
            raw = json.loads(text)
            if not isinstance(raw, dict) or set(raw) != {"method", "columns", "count", "mean",
                                                         "std", "low", "high"}:
                raise ValueError("not a feature scale")

            def floats(key: str) -> tuple[float, ...]:
                return tuple(float.fromhex(str(v)) for v in raw[key])

            return cls(str(raw["method"]), tuple(int(c) for c in raw["columns"]),
                       tuple(int(n) for n in raw["count"]), floats("mean"), floats("std"),
                       floats("low"), floats("high"))
        except (TypeError, ValueError, json.JSONDecodeError) as err:
            raise ValueError(f"not a feature scale: {err}") from err

    @property
    def digest(self) -> str:
        """SHA-256 of :meth:`to_json`, 16 hex digits: equal on every node of a run."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def summary(self, names: Sequence[str] = ()) -> dict[str, Any]:
        """For ``status`` and logs: the method, the digest and each feature's agreed figures."""
        def name(c: int) -> str:
            return names[c] if c < len(names) else str(c)

        return {"method": self.method, "digest": self.digest, "features": {
            name(c): {"count": n, "mean": m, "std": s, "min": lo, "max": hi}
            for c, n, m, s, lo, hi in zip(self.columns, self.count, self.mean, self.std,
                                          self.low, self.high, strict=True)}}
