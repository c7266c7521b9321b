"""``dacflnode status|stop`` against a live daemon whose Control service wants a token, and what
``status`` says about how neighbours are authenticated.

Each test starts node-0 of a two-node cluster alone: it serves its Control service while it
waits for node-1, which never comes, until ``stop`` ends it.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

from dacflnode.algorithms.rounds import NodeState
from dacflnode.cli.daemon_cmds import load_for_start
from dacflnode.cluster.launcher import free_ports
from dacflnode.errors import ConfigError
from dacflnode.peers.file import load_peers
from dacflnode.peers.generate import generate_cluster
from dacflnode.records.checkpoint import save_checkpoint
from tests.harness import preloaded
from tests.harness.cluster import TINY, Process, set_node, start_node
from tests.harness.polling import until_blocking

pytestmark = pytest.mark.slow

TWO = replace(TINY, nodes=2, rounds=2)
TOKEN = "control-token-for-tests-0123456789"
ENV = {k: v for k, v in os.environ.items() if k != "DACFLNODE_CONTROL_TOKEN"}
ENV["OMP_NUM_THREADS"] = "1"
WARNING = "neighbours are not authenticated"


def start_alone(tmp_path: Path, token: str | None = None, tls_dir: Path | None = None
                ) -> tuple[Path, Process]:
    ports = free_ports(4)
    path = generate_cluster("complete", 2, TWO, tmp_path / "peers", ports=ports[:2],
                            control_ports=ports[2:], state_root=tmp_path, hello_timeout=120,
                            tls_dir=tls_dir)[0]
    if token is not None:
        set_node(path, control_token=token)
    return path, start_node(path, env=ENV)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return preloaded.run(*args, env=env or ENV, timeout=60)


def wait_for_status(*args: str, timeout: float = 60) -> dict[str, object]:
    """What ``dacflnode status --json ARGS`` says once the node answers it."""
    tries: list[subprocess.CompletedProcess[str]] = []

    def answered() -> subprocess.CompletedProcess[str] | None:
        tries.append(cli("status", "--json", *args))
        return tries[-1] if tries[-1].returncode == 0 else None

    result = until_blocking(answered, timeout, interval=0.5, what=lambda: tries[-1].stderr)
    data: dict[str, object] = json.loads(result.stdout)
    return data


def stop(path: Path, proc: Process) -> int:
    cli("stop", "--peers", str(path))
    return proc.wait(timeout=60)


def test_a_control_token_is_required_and_read_from_the_peers_file_or_the_environment(tmp_path):
    path, proc = start_alone(tmp_path, token=TOKEN)
    try:
        status = wait_for_status("--peers", str(path))  # the token of the peers file
        assert status["node_id"] == "node-0" and status["tls"] is False
        address = load_peers(path).node.control
        missing = cli("status", "--target", address)
        assert missing.returncode == 1
        assert f"the daemon at {address} wants a control token" in missing.stderr
        assert "--token" in missing.stderr and "DACFLNODE_CONTROL_TOKEN" in missing.stderr
        wrong = cli("stop", "--target", address, "--token", TOKEN + "-wrong")
        assert wrong.returncode == 1 and "refused the control token" in wrong.stderr
        from_env = cli("status", "--json", "--target", address,
                       env={**ENV, "DACFLNODE_CONTROL_TOKEN": TOKEN})
        assert from_env.returncode == 0, from_env.stderr
        assert proc.poll() is None  # the refused stop stopped nothing
        table = cli("status", "--peers", str(path))
        assert "NOT authenticated (no TLS)" in " ".join(table.stdout.split())
        assert "no missed, late or refused rounds" in " ".join(table.stdout.split())
        neighbour = status["neighbours"][0]  # type: ignore[index]
        assert {"state", "missed_rounds", "late_states", "refused", "corrections"} <= set(
            neighbour)
        assert status["leaving"] is False and status["reanchored"] == 0
    finally:
        code = stop(path, proc)
    assert code == 0
    log = (tmp_path / "node-0" / "daemon.log").read_text()
    assert log.count(WARNING) == 1
    assert "refused: missing or wrong token" in log


def test_invariant_live_fetches_a_running_nodes_checkpoint_with_its_token(tmp_path):
    path, proc = start_alone(tmp_path, token=TOKEN)
    try:
        wait_for_status("--peers", str(path))
        before = cli("invariant", "--live", str(path))  # the token of the peers file
        assert before.returncode == 1 and "no checkpoint yet" in before.stderr
        # the node waits for node-1 and writes nothing: give it a checkpoint to serve
        x = torch.arange(3.0)
        save_checkpoint(tmp_path / "node-0", NodeState(4, x, x.clone(), x.clone()), {},
                        {"node": "node-0"}, tracked="omega_prev")
        live = cli("invariant", "--live", "--json", str(path))
        assert live.returncode == 0, live.stderr
        data = json.loads(live.stdout)
        assert data["nodes"] == ["node-0"] and data["rounds"] == {"node-0": 4}
        assert data["raw_residual"] == 0.0
        refused = cli("invariant", "--live", "--token", TOKEN + "-wrong", str(path))
        assert refused.returncode == 1 and "refused the control token" in refused.stderr
    finally:
        code = stop(path, proc)
    assert code == 0


def test_status_shows_a_tls_node_and_it_logs_no_warning(tmp_path):
    path, proc = start_alone(tmp_path, tls_dir=tmp_path / "certs")
    try:
        status = wait_for_status("--peers", str(path))
        assert status["tls"] is True
        table = cli("status", "--peers", str(path))
        assert table.returncode == 0
        assert "authenticated by mutual TLS" in " ".join(table.stdout.split())  # caption wraps
    finally:
        code = stop(path, proc)
    assert code == 0
    assert WARNING not in (tmp_path / "node-0" / "daemon.log").read_text()


def exposed_peers_file(tmp_path: Path, tls_dir: Path | None = None) -> Path:
    """node-0's peers file, listening on every interface (nothing is started)."""
    path = generate_cluster("complete", 2, TWO, tmp_path / "peers", state_root=tmp_path,
                            tls_dir=tls_dir)[0]
    data = yaml.safe_load(path.read_text())
    data["node"]["listen"] = "0.0.0.0:7000"
    data["node"]["control"] = "127.0.0.1:8000"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_start_insecure_allows_a_plaintext_listen_address_that_others_can_reach(tmp_path):
    path = exposed_peers_file(tmp_path)
    with pytest.raises(ConfigError) as refused:
        load_for_start(str(path), insecure=False)
    assert refused.value.field == "node.listen"
    node = load_for_start(str(path), insecure=True).node
    assert node.insecure and node.listen == "0.0.0.0:7000"


def test_start_insecure_contradicts_tls(tmp_path):
    path = exposed_peers_file(tmp_path, tls_dir=tmp_path / "certs")
    result = cli("start", "--insecure", "--peers", str(path))
    assert result.returncode == 2
    assert "--insecure contradicts node.tls" in result.stderr
