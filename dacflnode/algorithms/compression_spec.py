"""The ``compression`` run setting, parsed (no torch here: the settings schema imports it, and the
CLI builds its help without importing torch). The compressors are in
:mod:`dacflnode.algorithms.compression`."""

from __future__ import annotations

import math
from dataclasses import dataclass

#: The compression methods; ``topk`` and ``randk`` take a fraction: ``topk:0.01``.
COMPRESSIONS = ("none", "fp16", "bf16", "int8", "topk", "randk")
#: The methods that take a fraction.
FRACTIONED = ("topk", "randk")


@dataclass(frozen=True)
class CompressionSpec:
    """A parsed ``compression`` setting: the method and, for ``topk``/``randk``, the fraction of
    entries sent."""

    method: str
    fraction: float | None = None

    def __str__(self) -> str:
        return self.method if self.fraction is None else f"{self.method}:{self.fraction:g}"

    @property
    def compressed(self) -> bool:
        return self.method != "none"


def parse_compression(text: str) -> CompressionSpec:
    """``none``, ``fp16``, ``bf16``, ``int8``, ``topk:F`` or ``randk:F`` with ``0 < F ≤ 1``;
    raises ``ValueError`` with a message that says what is accepted."""
    accepted = "none, fp16, bf16, int8, topk:F or randk:F (0 < F <= 1, e.g. topk:0.01)"
    method, sep, rest = str(text).strip().partition(":")
    if method not in COMPRESSIONS:
        raise ValueError(f"unknown compression {text!r}: choose {accepted}")
    if method in FRACTIONED:
        if not sep:
            raise ValueError(f"{method} needs the fraction of entries to send: {method}:F, "
                             f"e.g. {method}:0.01")
        try:
            fraction = float(rest)
        except ValueError:
            raise ValueError(f"{text!r}: the fraction must be a number in (0, 1]") from None
        if not (0.0 < fraction <= 1.0) or not math.isfinite(fraction):
            raise ValueError(f"{text!r}: the fraction must be in (0, 1]")
        return CompressionSpec(method, fraction)
    if sep:
        raise ValueError(f"{method} takes no parameter (got {text!r}): choose {accepted}")
    return CompressionSpec(method)
