"""``python -m tests.harness.in_namespace NAME ARGS``: ``dacflnode ARGS`` in network namespace
``NAME``, as ``ip netns exec NAME dacflnode ARGS`` runs it, for a command forked from the
preloaded server (:mod:`tests.harness.preloaded`), which cannot be started through ``ip``.

Only the network namespace is entered (``setns``): the daemons read no per-namespace files
under ``/etc/netns``.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import sys

#: setns(2)'s flag for a network namespace.
CLONE_NEWNET = 0x40000000


def enter(name: str) -> None:
    """Move this process (single-threaded: a fresh fork) into network namespace ``name``."""
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


if __name__ == "__main__":
    enter(sys.argv[1])
    sys.argv = ["dacflnode", *sys.argv[2:]]
    runpy.run_module("dacflnode", run_name="__main__", alter_sys=True)
