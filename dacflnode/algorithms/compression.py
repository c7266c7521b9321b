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
from collections.abc import Mapping

import torch

from dacflnode.algorithms.compression_spec import (
    COMPRESSIONS,
    FRACTIONED,
    CompressionSpec,
    parse_compression,
)

__all__ = ["COMPRESSIONS", "FRACTIONED", "CompressionSpec", "Compressor", "parse_compression"]

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
