"""Separate hosts on one machine for the multi-host tests: one network namespace per node, all
plugged into a bridge in a hub namespace (benchmarks/_netns.py, which bench_slow_links.py uses
too). Root and iproute2 are needed; the calling test skips where namespaces cannot be made."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

import pytest

from benchmarks import _netns
from benchmarks._netns import COMMAND_TIMEOUT, Hosts, link_bytes, sh, start_daemon

__all__ = ["COMMAND_TIMEOUT", "Hosts", "hosts", "link_bytes", "sh", "start_daemon"]


@contextmanager
def hosts(prefix: str, subnet: str, nodes: int, tools: Sequence[str] = ("ip",)
          ) -> Iterator[Hosts]:
    """``nodes`` namespaces ``{prefix}-n{i}`` at ``{subnet}.{i + 1}/24``, bridged in
    ``{prefix}-hub`` (:func:`benchmarks._netns.hosts`); every namespace is deleted on exit.
    Skips the calling test where network namespaces cannot be made."""
    with ExitStack() as stack:
        try:
            made = stack.enter_context(_netns.hosts(prefix, subnet, nodes, tools))
        except _netns.LabError as exc:
            pytest.skip(str(exc))
        yield made
