"""Receive buffers, reused from one round to the next (:class:`BufferPool`)."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch


class BufferPool:
    """Receive buffers, reused once nothing refers to them any more.

    A node receives states of the same size every round. A fresh buffer costs a page fault
    for every 4 KiB the first time it is written, which takes longer than copying the bytes
    into it; a buffer written before does not. So a receiver keeps the buffers of the states it
    received and lends one out again once the last tensor that views it is gone (its lease, a
    ``memoryview`` the tensors hold, has died). A buffer is never lent twice at once, and a
    decoder writes every byte of it before anything reads it. At most ``keep`` buffers are
    held; beyond that a free one is dropped, or, when none is free, a new one is not kept.
    """

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._held: list[tuple[np.ndarray[Any, np.dtype[np.uint8]],
                               weakref.ref[memoryview] | None]] = []

    def __len__(self) -> int:
        return len(self._held)

    def _free(self, at: int) -> bool:
        lease = self._held[at][1]
        return lease is None or lease() is None

    def take(self, nbytes: int) -> torch.Tensor:
        """A uint8 tensor of ``nbytes`` bytes (contents undefined), 16-byte aligned."""
        for at, (array, _) in enumerate(self._held):
            if array.size == nbytes and self._free(at):
                return self._lend(at)
        array = _byte_array(nbytes)
        if len(self._held) >= self.keep:
            free = [at for at in range(len(self._held)) if self._free(at)]
            if not free:
                return torch.from_numpy(array)
            del self._held[free[0]]
        self._held.append((array, None))
        return self._lend(len(self._held) - 1)

    def _lend(self, at: int) -> torch.Tensor:
        array = self._held[at][0]
        lease = memoryview(array)  # type: ignore[arg-type]  # the tensors hold it
        self._held[at] = (array, weakref.ref(lease))
        return _bytes_tensor(lease, array.size)


def _byte_array(nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """``nbytes`` uninitialised bytes (numpy aligns them for any dtype the wire carries)."""
    return np.empty(nbytes, dtype=np.uint8)


def _bytes_tensor(buffer: memoryview, nbytes: int) -> torch.Tensor:
    if nbytes == 0:  # torch.frombuffer refuses an empty buffer
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(buffer, dtype=torch.uint8)
