"""How much memory a device has free for its data, and the refusal of data that would not fit.

:func:`available_memory` reads ``MemAvailable`` from ``/proc/meminfo`` (Linux: the memory that
can be taken without swapping, page cache counted as free); elsewhere the machine's physical
memory stands in. A loader checks its estimate with :func:`check_fits` *before* it allocates,
so a table larger than memory ends in one line, not in the kernel's out-of-memory killer.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from pathlib import Path

import pyarrow as pa

from dacflnode.errors import ConfigError

MEMINFO = Path("/proc/meminfo")

GIB = float(2**30)


def available_memory() -> int | None:
    """Bytes of memory available now; ``None`` when this platform does not say."""
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # the kernel counts in kiB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return None


def check_fits(where: Path, what: str, need: int, field: str, advice: str) -> None:
    """Refuse, with a :class:`ConfigError` on ``field``, ``need`` bytes (``what``, of the data
    at ``where``) that exceed the memory available; ``advice``: what to do instead."""
    have = available_memory()
    if have is not None and need > have:
        raise ConfigError(field, f"{where}: {what} needs {need / GIB:.2f} GiB in memory, more "
                                 f"than the {have / GIB:.2f} GiB available; {advice}")


def give_back_freed_memory() -> None:
    """Return what a load freed to the system: pyarrow's memory pool keeps freed blocks for
    reuse, and glibc's allocator keeps freed heap (in one arena per thread that allocated);
    neither shrinks the process on its own. After a table's two passes, that memory is half
    again the table's size, and would stay counted in the process for the whole run."""
    pa.default_memory_pool().release_unused()
    with contextlib.suppress(AttributeError, OSError):  # not glibc: it manages its own
        ctypes.CDLL(None).malloc_trim(0)
