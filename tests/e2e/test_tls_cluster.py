"""A cluster of real daemons that speak mutual TLS, with certificates from ``dacflnode certs``:
TLS changes how states travel, never what the nodes compute."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from dacflnode.cluster.launcher import free_ports
from dacflnode.peers.file import load_peers
from dacflnode.peers.generate import generate_cluster
from dacflnode.records.metrics_log import read_metrics
from dacflnode.sim.experiment import run_experiment
from tests.harness.cluster import ENV, TINY, max_diff, run_nodes

pytestmark = pytest.mark.slow


def test_three_tls_daemons_finish_with_the_simulators_models(tmp_path):
    ids = ["node-0", "node-1", "node-2"]
    certs = tmp_path / "certs"
    made = subprocess.run([sys.executable, "-m", "dacflnode", "certs", "--out", str(certs), *ids],
                          capture_output=True, text=True, timeout=120, env=ENV)
    assert made.returncode == 0, made.stderr
    ports = free_ports(6)
    cfg = replace(TINY, nodes=3, rounds=3, topology="ring", engine="sequential")
    paths = generate_cluster("ring", 3, cfg, tmp_path / "peers", ports=ports[:3],
                             control_ports=ports[3:], state_root=tmp_path / "cluster",
                             round_deadline=60, hello_timeout=60, tls_dir=certs)
    for node, path in zip(ids, paths, strict=True):
        tls = load_peers(path).node.tls
        assert tls is not None and tls.cert == certs / f"{node}.crt"
    codes, outputs = run_nodes(paths, tmp_path, timeout=240)
    assert codes == [0, 0, 0], [out[-2000:] for out in outputs]
    run_experiment(cfg, tmp_path / "sim")
    for node in ids:
        state = tmp_path / "cluster" / node
        diff = max_diff(state / "final.safetensors",
                        tmp_path / "sim" / node / "final.safetensors")
        assert diff <= 1e-6, (node, diff)
        assert [m["round"] for m in read_metrics(state / "metrics.jsonl")] == [1, 2, 3]
        log = (state / "daemon.log").read_text()
        assert "with mutual TLS" in log and "not authenticated" not in log
