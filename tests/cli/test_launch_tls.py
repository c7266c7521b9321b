"""``dacflnode launch --tls DIR``: the local cluster makes its certificates and talks mutual TLS."""

import json

import pytest
from click.testing import CliRunner

from dacflnode.cli.main import cli
from dacflnode.peers.file import load_peers
from dacflnode.security.certs import check_node_files

pytestmark = pytest.mark.slow


def test_launch_with_tls_creates_the_certificates_and_runs_over_mutual_tls(tmp_path):
    certs, out = tmp_path / "certs", tmp_path / "run"
    args = ["launch", "--dataset", "synthetic", "--model", "mlp", "--nodes", "3", "--rounds", "2",
            "--lr", "0.05", "--out", str(out), "--tls", str(certs), "--json", "--quiet"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["algorithms"]["dacfl"]["rounds"] == [1, 2]
    for i in range(3):
        node = f"node-{i}"
        tls = load_peers(out / "peers" / f"{node}.yaml").node.tls
        assert tls is not None and tls.cert == certs / f"{node}.crt"
        check_node_files(tls, node)
        log = (out / node / "daemon.log").read_text()
        assert "with mutual TLS" in log and "not authenticated" not in log
        assert (out / node / "final.safetensors").exists()
