"""The issue's probe: under ``umask 000`` every command that writes — ``certs``, ``topology
--tls``, ``launch`` (real daemons: state folders, checkpoints, logs, metrics), ``simulate
--out``, ``report`` — leaves no file or folder that another user can read or write, and each
kind of file has its documented mode (docs/security.md "Files and modes")."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import pytest

from dacflnode.peers.file import load_peers
from dacflnode.peers.generate import peers_file_mode
from tests.harness import preloaded
from tests.harness.cluster import ENV

pytestmark = pytest.mark.slow


def dacflnode(*args: str, timeout: float = 300) -> None:
    run = preloaded.run(*args, env=ENV, timeout=timeout, umask=0o000)
    assert run.returncode == 0, run.stderr[-3000:]


def expected_mode(path: Path) -> int:
    if path.is_dir():
        return 0o700
    if path.suffix in (".key", ".safetensors") or path.name == "control.token":
        return 0o600
    return 0o640  # certificates, logs, metrics, summaries, peers files without a token


def test_nothing_written_under_umask_000_is_open_to_other_users(tmp_path):
    root = tmp_path / "out"  # made by the commands themselves, like every folder below it
    dacflnode("certs", "--out", str(root / "certs"), "node-0", "node-1", "node-2")
    dacflnode("topology", "ring", "--nodes", "3", "--dataset", "synthetic",
              "--out", str(root / "cluster"), "--tls", str(root / "cluster-certs"))
    dacflnode("launch", "--dataset", "synthetic", "--model", "mlp", "--nodes", "3",
              "--rounds", "2", "--lr", "0.05", "--out", str(root / "run"),
              "--tls", str(root / "certs"), "--quiet")
    dacflnode("simulate", "--dataset", "synthetic", "--model", "mlp", "--nodes", "3",
              "--rounds", "1", "--out", str(root / "sim"), "--quiet")
    dacflnode("report", str(root / "sim"), "--out", str(root / "report"))
    seen: dict[str, int] = {}
    wrong = []
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder) / name
            seen[path.name] = seen.get(path.name, 0) + 1
            mode = stat.S_IMODE(path.lstat().st_mode)
            if mode & 0o007 or mode != expected_mode(path):
                wrong.append(f"{mode:03o} {path.relative_to(root)}")
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert not wrong, wrong
    # what the probe found open is among what was checked
    for name in ("ca.crt", "ca.key", "node-0.key", "node-0.yaml", "daemon.log",
                 "metrics.jsonl", "checkpoint.safetensors", "final.safetensors",
                 "summary.json", "daemon.out", "accuracy.png", "nodes.svg"):
        assert seen.get(name, 0) >= 1, (name, sorted(seen))


def test_a_peers_file_that_holds_a_control_token_is_0600(tmp_path):
    dacflnode("topology", "ring", "--nodes", "3", "--dataset", "synthetic",
              "--out", str(tmp_path / "cluster"))
    pf = load_peers(tmp_path / "cluster" / "node-0.yaml")
    assert peers_file_mode(pf) == 0o640
    with_token = dataclasses.replace(pf, node=dataclasses.replace(pf.node,
                                                                  control_token="t" * 32))
    assert peers_file_mode(with_token) == 0o600
