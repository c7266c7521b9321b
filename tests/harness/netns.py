"""Separate hosts on one machine for the multi-host tests: one network namespace per node, all
plugged into a bridge in a hub namespace (root and iproute2 needed; the tests skip otherwise)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

COMMAND_TIMEOUT = 20  # one ip/tc command


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


@contextmanager
def hosts(
    prefix: str, subnet: str, nodes: int, tools: tuple[str, ...] = ("ip",)
) -> Iterator[Hosts]:
    """``nodes`` namespaces ``{prefix}-n{i}`` at ``{subnet}.{i + 1}/24``, bridged in
    ``{prefix}-hub``; every namespace is deleted on exit. Skips the calling test where network
    namespaces cannot be made."""
    if not sys.platform.startswith("linux"):
        pytest.skip("network namespaces are a Linux feature")
    if os.geteuid() != 0:
        pytest.skip("creating network namespaces needs root")
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.skip(f"'{tool}' (iproute2) is not installed")
    hub = f"{prefix}-hub"
    created: list[str] = []
    try:
        try:
            sh("ip", "netns", "add", hub)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"cannot create a network namespace here: {exc}")
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
