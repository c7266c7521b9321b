"""Separate hosts on one machine: one Linux network namespace per node, all plugged into a bridge
in a hub namespace. Shared by ``bench_slow_links.py`` and the multi-host tests
(``tests/harness/netns.py``, which skips where this raises :class:`LabError`).

    from _netns import LabError, hosts, sh             # a benchmark script
    from benchmarks._netns import LabError, hosts, sh  # a test

Node ``i`` lives in namespace ``{prefix}-n{i}`` with one interface ``eth0`` at
``{subnet}.{i + 1}/24``, the end of a veth pair whose other end is port ``port{i}`` of bridge
``br0`` in ``{prefix}-hub``. Needs Linux, root and iproute2 (``ip``; ``tc`` to shape links).
Every namespace made is deleted on exit, whatever ends the block, and with it its links.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dacflnode.cluster.launcher import daemon_argv

COMMAND_TIMEOUT = 20  # one ip/tc command


class LabError(RuntimeError):
    """Network namespaces cannot be made here; the message says what is missing."""


def sh(*args: str) -> str:
    """Run one command; raise with its stderr when it fails."""
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


@dataclass
class Hosts:
    hub: str
    namespaces: list[str]  # node i runs in namespaces[i] ...
    ips: list[str]  # ... at ips[i], on eth0


def check_tools(tools: Sequence[str] = ("ip",)) -> None:
    """Raise :class:`LabError` where network namespaces cannot be made with ``tools``."""
    if not sys.platform.startswith("linux"):
        raise LabError("network namespaces are a Linux feature; run this on Linux")
    if os.geteuid() != 0:
        raise LabError("creating network namespaces needs root: run it with sudo")
    for tool in tools:
        if shutil.which(tool) is None:
            raise LabError(f"'{tool}' is missing: install iproute2")


@contextmanager
def hosts(prefix: str, subnet: str, nodes: int, tools: Sequence[str] = ("ip",)
          ) -> Iterator[Hosts]:
    """``nodes`` namespaces ``{prefix}-n{i}`` at ``{subnet}.{i + 1}/24``, bridged in
    ``{prefix}-hub``. Raises :class:`LabError` before anything is made where namespaces cannot
    be made (see :func:`check_tools`; ``tools``: the commands the caller needs too), and
    :class:`RuntimeError` when a later step fails."""
    check_tools(tools)
    hub = f"{prefix}-hub"
    created: list[str] = []
    try:
        try:
            sh("ip", "netns", "add", hub)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            raise LabError(f"cannot create a network namespace here: {exc}") from None
        created.append(hub)
        sh("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", hub, "link", "set", "br0", "up")
        namespaces, ips = [], []
        for i in range(nodes):
            ns, ip = f"{prefix}-n{i}", f"{subnet}.{i + 1}"
            sh("ip", "netns", "add", ns)
            created.append(ns)
            sh("ip", "link", "add", "eth0", "netns", ns, "type", "veth",
               "peer", "name", f"port{i}", "netns", hub)
            sh("ip", "-n", hub, "link", "set", f"port{i}", "master", "br0")
            sh("ip", "-n", hub, "link", "set", f"port{i}", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            namespaces.append(ns)
            ips.append(ip)
        yield Hosts(hub, namespaces, ips)
    finally:
        for ns in reversed(created):  # deleting a namespace deletes its veth ends and bridge
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True,
                           timeout=COMMAND_TIMEOUT, check=False)


def link_bytes(ns: str) -> tuple[int, int]:
    """The bytes ``eth0`` of ``ns`` has sent and received so far."""
    stats = json.loads(sh("ip", "-n", ns, "-j", "-s", "link", "show", "dev", "eth0"))[0]
    return int(stats["stats64"]["tx"]["bytes"]), int(stats["stats64"]["rx"]["bytes"])


def start_daemon(ns: str, peers: Path, stderr: Path, env: Mapping[str, str]
                 ) -> subprocess.Popen[bytes]:
    """The daemon of peers file ``peers`` (the launcher's command line), run in namespace
    ``ns``, its stderr written to the file ``stderr``."""
    with stderr.open("w") as err:
        return subprocess.Popen(["ip", "netns", "exec", ns, *daemon_argv(peers)],
                                stdout=subprocess.DEVNULL, stderr=err, env=env)
