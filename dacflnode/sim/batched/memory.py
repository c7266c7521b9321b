"""The C library's allocator, told once per process to keep the memory a stacked model frees."""

from __future__ import annotations

import ctypes
import platform
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_malloc_tuned = False


def keep_freed_memory() -> None:
    """Make glibc's ``malloc`` keep freed memory for reuse instead of returning it to the OS.

    PyTorch allocates every activation and gradient afresh with ``malloc``. By default glibc
    serves blocks above a (dynamic, at most 32 MiB) threshold with ``mmap`` and gives freed heap
    memory back once more than twice that lies unused at its top, so the megabyte-sized tensors
    of a stacked model are re-faulted into memory page by page at every step. That costs as much
    as some of the layers' arithmetic. Raising both thresholds once per process makes such
    blocks come from, and stay in, the heap; the price is that the process keeps up to the trim
    threshold of freed memory. A no-op where the C library is not glibc.
    """
    global _malloc_tuned
    if _malloc_tuned:
        return
    _malloc_tuned = True
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if not mallopt(_M_MMAP_THRESHOLD, 256 << 20):
        mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # older glibc caps the threshold
    mallopt(_M_TRIM_THRESHOLD, 1 << 30)

