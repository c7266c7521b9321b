"""The ``compression`` run setting, parsed (no torch here: the settings schema imports it, and the
CLI builds its help without importing torch). The compressors are in
:mod:`dacflnode.algorithms.compression`."""

from __future__ import annotations

import math
from dataclasses import dataclass

#: The compressor kinds; ``topk`` and ``randk`` take a fraction: ``topk:0.01``.
COMPRESSIONS = ("none", "fp16", "bf16", "int8", "topk", "randk")
#: The kinds that take a fraction.
FRACTIONED = ("topk", "randk")


@dataclass(frozen=True)
class CompressionSpec:
    """A parsed ``compression`` setting: the kind and, for ``topk``/``randk``, the fraction of
    entries sent."""

    kind: str
    fraction: float | None = None

    def __str__(self) -> str:
        return self.kind if self.fraction is None else f"{self.kind}:{self.fraction:g}"

    @property
    def compressed(self) -> bool:
        return self.kind != "none"


def parse_compression(text: str) -> CompressionSpec:
    """``none``, ``fp16``, ``bf16``, ``int8``, ``topk:F`` or ``randk:F`` with ``0 < F ≤ 1``;
    raises ``ValueError`` with a message that says what is accepted."""
    accepted = "none, fp16, bf16, int8, topk:F or randk:F (0 < F <= 1, e.g. topk:0.01)"
    kind, sep, rest = str(text).strip().partition(":")
    if kind not in COMPRESSIONS:
        raise ValueError(f"unknown compression {text!r}: choose {accepted}")
    if kind in FRACTIONED:
        if not sep:
            raise ValueError(f"{kind} needs the fraction of entries to send: {kind}:F, "
                             f"e.g. {kind}:0.01")
        try:
            fraction = float(rest)
        except ValueError:
            raise ValueError(f"{text!r}: the fraction must be a number in (0, 1]") from None
        if not (0.0 < fraction <= 1.0) or not math.isfinite(fraction):
            raise ValueError(f"{text!r}: the fraction must be in (0, 1]")
        return CompressionSpec(kind, fraction)
    if sep:
        raise ValueError(f"{kind} takes no parameter (got {text!r}): choose {accepted}")
    return CompressionSpec(kind)
