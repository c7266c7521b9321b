"""An exact network sum that reveals no node's own term: pairwise masks that cancel in the sum,
as secure aggregation does, over integers so that they cancel *exactly*.

Every node holds a vector of numbers (its row count and its float64 sums per feature). It
encodes each number as an integer (:func:`exact_int`: a float64 times ``2**1074`` is an integer,
exactly), adds for every other node ``j`` a mask that only it and ``j`` can compute (``+`` when
its id sorts first, ``-`` otherwise), all modulo ``2**(8 * WIDTH)``, and sends the result. A
masked vector is uniformly random to anyone who lacks one of its masks, so a node's own sums
are never readable from what it sends; the masks cancel in the sum of all the nodes' vectors,
which is the exact integer sum of their terms. Every node adds the same integers, so every node
ends with the same totals whatever order it adds them in, and every later float computed from
them (:meth:`~dacflnode.learning.owndata.scaling.FeatureScale.from_totals`) is bit-identical.

The masks come from a secret per pair of nodes (:mod:`dacflnode.security.pair_keys`), expanded
with SHAKE-256 over the run's context; nothing here draws random numbers.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction

#: Bytes of one masked number: room for a float64 scaled by 2**1074 (below 2**2098) summed
#: over up to 2**64 nodes, and its sign.
WIDTH = 272
MODULUS = 1 << (8 * WIDTH)
#: A float64 times 2**SCALE_BITS is an integer (the smallest subnormal is 2**-1074).
SCALE_BITS = 1074


def exact_int(value: float) -> int:
    """``value * 2**1074`` as an exact integer (``value`` a finite float)."""
    if not math.isfinite(value):
        raise ValueError(f"cannot sum {value!r} exactly: not a finite number")
    numerator, denominator = float(value).as_integer_ratio()
    return numerator * ((1 << SCALE_BITS) // denominator)


def exact_value(total: int) -> Fraction:
    """The number an :func:`exact_int` (or a sum of them) stands for."""
    return Fraction(total, 1 << SCALE_BITS)


def _mask(secret: bytes, context: bytes, length: int) -> list[int]:
    stream = hashlib.shake_256(len(context).to_bytes(4, "little") + context + secret
                               ).digest(length * WIDTH)
    return [int.from_bytes(stream[k * WIDTH:(k + 1) * WIDTH], "little")
            for k in range(length)]


def masked(values: Sequence[int], me: str, secrets: Mapping[str, bytes],
           context: bytes) -> bytes:
    """``values`` (integers, see :func:`exact_int`) plus ``me``'s masks with every node of
    ``secrets`` (the pair's shared secret by the other node's id), packed as ``WIDTH``-byte
    little-endian words modulo :data:`MODULUS`."""
    out = [v % MODULUS for v in values]
    for other, secret in secrets.items():
        if other == me:
            raise ValueError("a node has no mask with itself")
        sign = 1 if me < other else -1
        for k, word in enumerate(_mask(secret, context, len(out))):
            out[k] = (out[k] + sign * word) % MODULUS
    return b"".join(v.to_bytes(WIDTH, "little") for v in out)


def payload_bytes(length: int) -> int:
    """The size of a masked vector of ``length`` numbers."""
    return length * WIDTH


def combine(payloads: Iterable[bytes], length: int) -> list[int]:
    """The sum of every node's masked vector: the exact integer sum of their values (signed)."""
    totals = [0] * length
    for payload in payloads:
        if len(payload) != payload_bytes(length):
            raise ValueError(f"a masked vector of {len(payload)} bytes, expected "
                             f"{payload_bytes(length)}")
        for k in range(length):
            totals[k] = (totals[k] + int.from_bytes(payload[k * WIDTH:(k + 1) * WIDTH],
                                                    "little")) % MODULUS
    return [t - MODULUS if t >= MODULUS // 2 else t for t in totals]
