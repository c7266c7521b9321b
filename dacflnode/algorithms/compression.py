"""Compressors of the consensus messages (the run setting ``compression``).

A compressed run mixes with CHOCO-Gossip (docs/compression.md): each node sends
``q = Q(v − v̂)`` for every exchanged vector ``v`` and its public copy ``v̂``, and both ends of
an edge add the *decoded* ``q`` to their copy of ``v̂``. The copies stay equal only if decoding
gives the same bits wherever it runs, so :meth:`Compressor.decode` uses only exactly
representable or correctly rounded float32 arithmetic (casts, one multiplication, scatter).

A compressor turns a flat float32 vector into named wire *parts* (``{"q": int8 tensor,
"scale": float32 tensor}`` and the like); a message carries them as ``<field>.<part>`` tensors.
Their dtypes and shapes depend only on the vector's length, so a receiver knows exactly what
to accept before it allocates anything (:meth:`Compressor.parts`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping

import numpy as np
import torch
import xxhash

from dacflnode.algorithms.compression_spec import (
    COMPRESSIONS,
    FRACTIONED,
    CompressionSpec,
    parse_compression,
)

__all__ = [
    "COMPRESSIONS",
    "FRACTIONED",
    "INT8_BLOCK",
    "BFloat16Compressor",
    "CompressionSpec",
    "Compressor",
    "Float16Compressor",
    "Int8Compressor",
    "RandKCompressor",
    "TopKCompressor",
    "make_compressor",
    "parse_compression",
    "randk_gamma",
    "random_indices",
    "sparse_count",
    "stable_seed",
    "top_indices",
    "topk_gamma",
]

Tensor = torch.Tensor

class Compressor(ABC):
    """``Q``: a flat float32 vector → named wire parts, and back, bit-exactly."""

    spec: CompressionSpec
    #: CHOCO's consensus step γ when the run does not set ``consensus_step``
    default_gamma: float = 1.0

    @abstractmethod
    def parts(self, numel: int) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        """The wire parts of a vector of ``numel`` elements: ``part -> (dtype, shape)``."""

    @abstractmethod
    def encode(self, delta: Tensor, seed: int) -> dict[str, Tensor]:
        """``Q(delta)`` as its wire parts (``delta``: flat float32, on the CPU). ``seed``
        drives any randomness (stochastic rounding, the random-k indices), so that a run is
        reproducible and both ends of an edge derive the same indices."""

    @abstractmethod
    def decode(self, parts: Mapping[str, Tensor], numel: int, seed: int) -> Tensor:
        """The flat float32 vector ``parts`` stand for, the same bits on every host; raises
        ``ValueError`` for parts no honest encoder makes (indices out of range or repeated,
        a non-finite scale or value)."""

    def wire_bytes(self, numel: int) -> int:
        """Payload bytes of one compressed vector of ``numel`` elements."""
        return sum(math.prod(shape) * torch.empty((), dtype=dtype).element_size()
                   for dtype, shape in self.parts(numel).values())


#: Entries per int8 block: each block carries one float32 scale.
INT8_BLOCK = 512
#: The largest finite float16 and bfloat16 values: the casts clamp to them, never producing inf.
FP16_MAX = float(torch.finfo(torch.float16).max)
BF16_MAX = float(torch.finfo(torch.bfloat16).max)

#: The longest vector topk and randk take (their indices are int32).
MAX_SPARSE_NUMEL = 2**31 - 1

_MASK64 = (1 << 64) - 1
_MASK63 = (1 << 63) - 1


def stable_seed(*parts: str | int) -> int:
    """A deterministic 63-bit seed from ``parts`` (e.g. the run seed, the sender's id, the round
    and the field name), the same on every host and Python process: xxh3-64 over a tagged,
    length-prefixed encoding, so that ``("1", 2)`` and ``(1, "2")`` or ``("ab", "c")`` and
    ``("a", "bc")`` hash different bytes."""
    h = xxhash.xxh3_64()
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, (int, str)):
            raise TypeError(f"stable_seed takes str and int parts, not {type(part).__name__}")
        data = (b"i" + str(part).encode()) if isinstance(part, int) else b"s" + part.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.intdigest() & _MASK63


def sparse_count(fraction: float, numel: int) -> int:
    """``k`` of ``topk:F`` and ``randk:F``: ``max(1, ceil(F·n))`` entries (never more than
    ``n``). ``F·n`` is rounded to 9 decimals first, so that 0.07 · 100 sends 7 entries, not the
    8 that the binary rounding of 0.07 would give; the arithmetic is IEEE double, the same on
    every host."""
    if numel <= 0:
        return 0
    if numel > MAX_SPARSE_NUMEL:
        raise ValueError(f"topk and randk index vectors of at most {MAX_SPARSE_NUMEL} entries"
                         f" (int32 indices), got {numel}: split the vector")
    return min(numel, max(1, math.ceil(round(fraction * numel, 9))))


def _check_parts(compressor: Compressor, parts: Mapping[str, Tensor], numel: int) -> None:
    expected = compressor.parts(numel)
    if set(parts) != set(expected):
        raise ValueError(f"{compressor.spec} parts must be {sorted(expected)}, got {sorted(parts)}")
    for name, (dtype, shape) in expected.items():
        tensor = parts[name]
        if tensor.dtype != dtype or tuple(tensor.shape) != shape:
            raise ValueError(
                f"{compressor.spec} part {name!r} must be {dtype} of shape {shape}, got"
                f" {tensor.dtype} of shape {tuple(tensor.shape)}")


def _check_delta(delta: Tensor) -> None:
    if delta.dtype != torch.float32 or delta.dim() != 1:
        raise ValueError(f"a compressor encodes a flat float32 vector, got {delta.dtype}"
                         f" of shape {tuple(delta.shape)}")


def _all_finite(tensor: Tensor) -> bool:
    """True when no entry is NaN or ±inf (min and max propagate NaN: one pass, no mask)."""
    if tensor.numel() == 0:
        return True
    low, high = torch.aminmax(tensor)
    return math.isfinite(float(low)) and math.isfinite(float(high))


class _Cast(Compressor):
    """A cast to a 16-bit float type, clamped to its finite range; decoding is the exact cast
    back to float32 (every float16 and bfloat16 value is a float32 value)."""

    dtype: torch.dtype
    limit: float

    def __init__(self, spec: CompressionSpec) -> None:
        self.spec = spec
        self.default_gamma = 1.0

    def parts(self, numel: int) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        return {"q": (self.dtype, (numel,))}

    def encode(self, delta: Tensor, seed: int) -> dict[str, Tensor]:
        _check_delta(delta)
        return {"q": delta.clamp(-self.limit, self.limit).to(self.dtype)}

    def decode(self, parts: Mapping[str, Tensor], numel: int, seed: int) -> Tensor:
        _check_parts(self, parts, numel)
        q = parts["q"]
        if not _all_finite(q):
            raise ValueError(f"{self.spec} payload holds a NaN or infinite value")
        return q.to(torch.float32)


class Float16Compressor(_Cast):
    """``fp16``: 2 bytes per entry, about 3 significant decimal digits, values clamped to
    ±65504. CHOCO sends differences that shrink as the copies catch up, and the relative
    precision of a float is the same at every scale, so γ = 1 converges."""

    dtype = torch.float16
    limit = FP16_MAX


class BFloat16Compressor(_Cast):
    """``bf16``: 2 bytes per entry, float32's range with 8 bits of mantissa (rounded to
    nearest even, clamped to the largest finite bfloat16). γ = 1 converges."""

    dtype = torch.bfloat16
    limit = BF16_MAX


def _rounding_noise(seed: int, n: int) -> Tensor:
    """``n`` uniform offsets ``(j + ½) / 2¹⁶`` (j uniform in 0 … 65535, mean exactly ½) from
    NumPy's PCG64 seeded by ``seed``: four 16-bit draws per 64-bit output, read little-endian
    (the same offsets on every host), 3× faster than drawing float32s. The 2⁻¹⁶ grid biases
    a stochastic rounding by at most 2⁻¹⁶ of a step."""
    raw = np.random.PCG64(seed).random_raw(-(-n // 4)).astype("<u8", copy=False)
    draws = raw.view("<u2")[:n].astype(np.float32)
    return torch.from_numpy(draws).mul_(2.0**-16).add_(2.0**-17)


class Int8Compressor(Compressor):
    """``int8``: per block of :data:`INT8_BLOCK` entries (the last one may be short), the
    scale ``max|block| / 127`` (0 for an all-zero block) as float32, and each entry as
    ``q = stochastic_round(delta / scale)`` in [-127, 127]: ``floor(v + u)`` with ``u``
    uniform in [0, 1), which is ``v`` on average (unbiased) and off by less than one step, so
    the error of an entry is below its block's scale. ``u`` comes from NumPy's PCG64 seeded by
    ``seed`` on a 2⁻¹⁶ grid (:func:`_rounding_noise`: 10× faster than torch's Mersenne twister
    for a model-sized vector; only the sender draws it, so the receiver's result does not
    depend on it).

    Decoding is ``float32(q) · scale``: one correctly rounded float32 multiplication per entry,
    no fused or wider arithmetic, hence the same bits on every host. 1 + 4/512 bytes per entry,
    3.97× fewer than float32. γ = 1 converges (docs/compression.md)."""

    def __init__(self, spec: CompressionSpec) -> None:
        self.spec = spec
        self.default_gamma = 1.0

    def parts(self, numel: int) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        return {"q": (torch.int8, (numel,)),
                "scale": (torch.float32, (-(-numel // INT8_BLOCK),))}

    def encode(self, delta: Tensor, seed: int) -> dict[str, Tensor]:
        _check_delta(delta)
        n = delta.numel()
        full = n // INT8_BLOCK
        head = full * INT8_BLOCK
        flat = delta.detach().contiguous()
        noise = _rounding_noise(seed, n)
        q = torch.empty(n, dtype=torch.int8)
        scales = []
        # the full blocks as a (blocks, 512) view, then the short last block: no padded copy
        for start, stop, rows in ((0, head, full), (head, n, 1 if head < n else 0)):
            if rows == 0:
                continue
            grid = flat[start:stop].view(rows, -1)
            scale = grid.abs().amax(dim=1).div_(127.0)
            # an all-zero block (or one whose scale underflows to 0) sends zeros
            safe = torch.where(scale > 0, scale, torch.ones_like(scale))
            v = (grid / safe[:, None]).view(-1)
            v.add_(noise[start:stop]).floor_().clamp_(-127.0, 127.0)
            q[start:stop] = v
            scales.append(scale)
        scale = torch.cat(scales) if scales else torch.zeros(0)
        return {"q": q, "scale": scale}

    def decode(self, parts: Mapping[str, Tensor], numel: int, seed: int) -> Tensor:
        _check_parts(self, parts, numel)
        q, scale = parts["q"], parts["scale"]
        if not _all_finite(scale):
            raise ValueError("int8 payload holds a NaN or infinite scale")
        if numel and float(scale.min()) < 0:
            raise ValueError("int8 payload holds a negative scale")
        if numel and int(q.min()) == -128:
            raise ValueError("int8 payload holds -128, outside the encoder's [-127, 127]")
        out = torch.empty(numel, dtype=torch.float32)
        full = numel // INT8_BLOCK
        head = full * INT8_BLOCK
        out[:head].view(full, INT8_BLOCK).copy_(q[:head].reshape(full, INT8_BLOCK)).mul_(
            scale[:full, None])
        if head < numel:
            out[head:].copy_(q[head:]).mul_(scale[full])
        if not _all_finite(out):
            raise ValueError("int8 payload decodes to infinite values: its scales are too large")
        return out


def topk_gamma(fraction: float) -> float:
    """CHOCO's default γ of ``topk:F``: ``F^(2/3) / 2`` (0.023 at F = 0.01, 0.068 at 0.05, 0.108
    at 0.1), and 1 at F = 1, where nothing is dropped.

    From ``benchmarks/gamma_sweep.py`` (10 nodes, ring and dense matrices, d = 100 000): the γ
    of the lowest error after 100 steps was 0.05, 0.1 and 0.2 for F = 0.01, 0.05 and 0.1 (about
    ``F^(2/3)``), and the error grew from γ = 0.4 on; over 800 steps γ = 0.046 for F = 0.01 turned
    back up after 400 steps on the dense matrix while 0.025 kept converging, hence half of
    ``F^(2/3)``: stability first (docs/compression.md)."""
    return 1.0 if fraction >= 1.0 else fraction ** (2.0 / 3.0) / 2.0


def randk_gamma(fraction: float) -> float:
    """CHOCO's default γ of ``randk:F``: ``F / 2``, and 1 at F = 1, where nothing is dropped.

    CHOCO's analysis makes γ proportional to the compressor's contraction δ, which is F for
    random-k. In ``benchmarks/gamma_sweep.py`` the error after 100 steps was lowest at γ ≈ 2F
    for F = 0.01 and between F and 2F for 0.05 and 0.1, and grew from 5F on; over 400 to 800
    steps γ = 2F for F = 0.01 grew back (0.77 at step 100, 1.14 at 400, dense matrix), γ = F
    for F = 0.1 rose from 0.13 to 0.29 between steps 200 and 400, and γ = F for F = 0.01
    slowed down (0.34 at step 800) while γ = F / 2 converged steadily (0.25):
    stability first (docs/compression.md)."""
    return 1.0 if fraction >= 1.0 else fraction / 2.0


def _check_sparse(values: Tensor, indices: Tensor | None, numel: int, method: str) -> None:
    if not _all_finite(values):
        raise ValueError(f"{method} payload holds a NaN or infinite value")
    if indices is None or indices.numel() == 0:
        return
    if int(indices[0]) < 0 or int(indices[-1]) >= numel:
        raise ValueError(f"{method} payload holds an index outside [0, {numel})")
    if indices.numel() > 1 and not bool((indices[1:] > indices[:-1]).all()):
        raise ValueError(f"{method} payload indices are not strictly increasing")


class _SparseCompressor(Compressor):
    """What ``topk:F`` and ``randk:F`` share: the fraction ``F`` of the entries sent, and the
    consensus step ``gamma(F)`` that goes with it."""

    fraction: float

    def __init__(self, spec: CompressionSpec, gamma: Callable[[float], float]) -> None:
        if spec.fraction is None:
            raise ValueError(f"{spec.method} needs a fraction: {spec.method}:F")
        self.spec = spec
        self.fraction = spec.fraction
        self.default_gamma = gamma(spec.fraction)


class TopKCompressor(_SparseCompressor):
    """``topk:F``: the ``k = max(1, ceil(F·n))`` entries of largest magnitude, as float32
    values and int32 indices sorted ascending (8·k bytes). Ties at the k-th magnitude go to
    the lowest indices, so the choice is a function of the vector alone. Decoding is a scatter
    into zeros (exact). The copies ``x̂`` of CHOCO carry what was not sent to the next round,
    which is the error feedback this compressor needs."""

    def __init__(self, spec: CompressionSpec) -> None:
        super().__init__(spec, topk_gamma)

    def parts(self, numel: int) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        k = sparse_count(self.fraction, numel)
        return {"values": (torch.float32, (k,)), "indices": (torch.int32, (k,))}

    def encode(self, delta: Tensor, seed: int) -> dict[str, Tensor]:
        _check_delta(delta)
        indices = top_indices(delta, sparse_count(self.fraction, delta.numel()))
        return {"values": delta[indices], "indices": indices.to(torch.int32)}

    def decode(self, parts: Mapping[str, Tensor], numel: int, seed: int) -> Tensor:
        _check_parts(self, parts, numel)
        values, indices = parts["values"], parts["indices"]
        _check_sparse(values, indices, numel, "topk")
        out = torch.zeros(numel, dtype=torch.float32)
        out[indices.long()] = values
        return out


def top_indices(delta: Tensor, k: int) -> Tensor:
    """The ascending int64 indices of the ``k`` entries of ``delta`` of largest magnitude,
    ties at the k-th magnitude broken towards the lowest index.

    A strided sample of the magnitudes gives a threshold a little below the k-th largest; the
    exact selection then runs on the few entries above it (falling back to the whole vector
    when the sample misjudged), about 5× faster than ``torch.topk`` over a model-sized vector.
    The result does not depend on the sample."""
    n = delta.numel()
    if k <= 0:
        return torch.zeros(0, dtype=torch.int64)
    if k >= n:
        return torch.arange(n)
    # NumPy's comparison and flatnonzero are several times faster than torch.nonzero here
    magnitude_np = np.abs(delta.detach().cpu().numpy())
    magnitude = torch.from_numpy(magnitude_np)
    candidates: Tensor | None = None
    sample_size = 32_768
    if n > 4 * sample_size and k * 8 < n:
        stride = n // sample_size
        sample = magnitude[::stride]
        # the sample's expected count above the k-th magnitude, plus four standard deviations
        expected = k / n * sample.numel()
        rank = min(sample.numel(), int(expected + 4.0 * math.sqrt(expected)) + 32)
        estimate = torch.topk(sample, rank, sorted=False).values.min()
        candidates = torch.from_numpy(
            np.flatnonzero(magnitude_np >= np.float32(float(estimate))))
        if candidates.numel() < k:
            candidates = None
    if candidates is None:
        candidates = torch.arange(n)
    values = magnitude[candidates]
    # the k-th largest of m values is the (m − k + 1)-th smallest: select the shorter side
    rest = values.numel() - k + 1
    if k <= rest:
        threshold = torch.topk(values, k, sorted=False).values.min()
    else:
        threshold = torch.topk(values, rest, largest=False, sorted=False).values.max()
    above = values > threshold
    ties = values == threshold
    missing = k - int(above.sum())
    keep = above | (ties & (torch.cumsum(ties, 0) <= missing))
    return candidates[keep]


def _splitmix64(counters: np.ndarray) -> np.ndarray:
    """SplitMix64's output function over uint64 counters (wrapping arithmetic, exact on every
    host). A bijection of the 64-bit integers."""
    z = counters * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    result: np.ndarray = z ^ (z >> np.uint64(31))
    return result


def random_indices(seed: int, numel: int, k: int) -> Tensor:
    """``k`` distinct indices in [0, numel), ascending int64, a function of ``seed`` alone
    (every k-subset equally likely), computed with integer arithmetic only, so the two ends of
    an edge derive the same ones whatever their library versions.

    For ``k ≤ n/2``: the first ``k`` distinct values of the stream ``SplitMix64(base + c) mod
    n``, c = 0, 1, …, where ``base`` is the seed times an odd constant mod 2⁶⁴ (about ``k``
    draws, extended while too few are distinct; the result does not depend on how many are
    drawn). Above that, the ``k`` indices whose hash ``SplitMix64(base + i)`` is smallest
    (a bijection, so no ties)."""
    if k <= 0:
        return torch.zeros(0, dtype=torch.int64)
    if k >= numel:
        return torch.arange(numel)
    if numel > MAX_SPARSE_NUMEL:
        raise ValueError(f"random_indices takes at most {MAX_SPARSE_NUMEL} entries, got {numel}")
    base = np.uint64((seed * 0x2545F4914F6CDD1D) & _MASK64)
    with np.errstate(over="ignore"):
        if 2 * k <= numel:
            # expected distinct values among m draws: n(1 − e^(−m/n)); draw a little more
            draws = int(-numel * math.log1p(-k / numel) * 1.02) + 64
            while True:
                counters = base + np.arange(draws, dtype=np.uint64)
                stream = _splitmix64(counters) % np.uint64(numel)
                # one sort of (value, draw) pairs packed in a uint64 (n and the draws < 2³²)
                # finds each value's first draw, much faster than a stable argsort
                packed = np.sort((stream << np.uint64(32)) | np.arange(draws, dtype=np.uint64))
                values = packed >> np.uint64(32)
                first = np.empty(packed.size, dtype=bool)
                first[0] = True
                np.not_equal(values[1:], values[:-1], out=first[1:])
                unique = values[first]
                if unique.size >= k:
                    order = packed[first] & np.uint64(0xFFFFFFFF)
                    cutoff = np.partition(order, k - 1)[k - 1]
                    return torch.from_numpy(unique[order <= cutoff].astype(np.int64))
                draws = draws * 5 // 4 + 64
        keys = _splitmix64(base + np.arange(numel, dtype=np.uint64))
        chosen = np.sort(np.argpartition(keys, k - 1)[:k])
        return torch.from_numpy(chosen.astype(np.int64))


class RandKCompressor(_SparseCompressor):
    """``randk:F``: the values (float32, 4·k bytes) of ``k = max(1, ceil(F·n))`` entries whose
    indices both ends derive from ``seed`` (:func:`random_indices`), so no index travels.

    The values are *not* rescaled by n/k: CHOCO-Gossip needs a contraction
    (``E‖Q(v) − v‖² ≤ (1 − δ)‖v‖²``, here δ = k/n), not an unbiased estimate, whose variance
    would grow the copies' error instead of shrinking it. Decoding is a scatter into zeros
    (exact)."""

    def __init__(self, spec: CompressionSpec) -> None:
        super().__init__(spec, randk_gamma)

    def parts(self, numel: int) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        return {"values": (torch.float32, (sparse_count(self.fraction, numel),))}

    def encode(self, delta: Tensor, seed: int) -> dict[str, Tensor]:
        _check_delta(delta)
        n = delta.numel()
        return {"values": delta[random_indices(seed, n, sparse_count(self.fraction, n))]}

    def decode(self, parts: Mapping[str, Tensor], numel: int, seed: int) -> Tensor:
        _check_parts(self, parts, numel)
        values = parts["values"]
        _check_sparse(values, None, numel, "randk")
        out = torch.zeros(numel, dtype=torch.float32)
        out[random_indices(seed, numel, values.numel())] = values
        return out


_COMPRESSORS: dict[str, Callable[[CompressionSpec], Compressor]] = {
    "fp16": Float16Compressor,
    "bf16": BFloat16Compressor,
    "int8": Int8Compressor,
    "topk": TopKCompressor,
    "randk": RandKCompressor,
}


def make_compressor(spec: CompressionSpec | str) -> Compressor | None:
    """The compressor of a ``compression`` setting, or ``None`` for ``none`` (the full float32
    states, mixed without copies). Raises ``ValueError`` for a malformed setting."""
    parsed = parse_compression(spec) if isinstance(spec, str) else spec
    if not parsed.compressed:
        return None
    return _COMPRESSORS[parsed.method](parsed)
