"""The test of record for the metrics endpoint: a real Prometheus server (Debian's ``prometheus``
package, which CI installs) scrapes a 3-node cluster on 127.0.0.1 every second, and its HTTP API
returns ``dacfl_round`` of all three targets."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import urllib.error
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from dacflnode.cluster.launcher import free_ports
from dacflnode.transport.grpc_control import fetch_status
from tests.daemon.test_metrics_http import get
from tests.harness.cluster import Cluster
from tests.harness.polling import until_blocking

PROMETHEUS = shutil.which("prometheus")
TOKEN = "prometheus-scrapes-with-this-token"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus is not installed (Debian: apt-get install prometheus)")]


def scrape_config(targets: list[str], jobs: list[dict[str, Any]] | None = None
                  ) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": jobs or [{"job_name": "dacfl", "static_configs": [{"targets": targets}]}],
    }


class Prometheus:
    """A Prometheus server on a free loopback port, its data and log in ``root``."""

    def __init__(self, root: Path, targets: list[str],
                 jobs: list[dict[str, Any]] | None = None) -> None:
        assert PROMETHEUS is not None
        root.mkdir(parents=True, exist_ok=True)
        config = root / "prometheus.yml"
        config.write_text(yaml.safe_dump(scrape_config(targets, jobs)))
        self.address = f"127.0.0.1:{free_ports(1)[0]}"
        self.log = root / "prometheus.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={root / 'data'}",
                 f"--web.listen-address={self.address}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT)

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector ``promql`` gives now ([] while Prometheus is not ready)."""
        url = f"http://{self.address}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        try:
            reply = json.loads(get(url, timeout=5))
        except (urllib.error.URLError, ConnectionError):
            return []
        assert reply["status"] == "success", reply
        return list(reply["data"]["result"])

    def wait_for(self, promql: str, count: int, timeout: float = 60) -> list[dict[str, Any]]:
        """Poll until ``promql`` has ``count`` series."""

        def series() -> list[dict[str, Any]] | None:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            result = self.query(promql)
            return result if len(result) >= count else None

        return until_blocking(series, timeout, interval=0.5,
                              what=lambda: f"{promql}: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def test_a_real_prometheus_scrapes_the_round_of_every_node_of_a_cluster(tmp_path):
    cluster = Cluster(tmp_path / "cluster", 3, 100_000, metrics=True)
    prometheus = Prometheus(tmp_path / "prometheus", cluster.metrics_addresses)
    cluster.start()
    try:
        rounds = prometheus.wait_for("dacfl_round >= 1", 3)
        by_target = {r["metric"]["instance"]: r for r in rounds}
        assert sorted(by_target) == sorted(cluster.metrics_addresses)
        for i, target in enumerate(cluster.metrics_addresses):
            labels = by_target[target]["metric"]
            assert (labels["__name__"], labels["job"], labels["node"]) == (
                "dacfl_round", "dacfl", f"node-{i}")
            value = float(by_target[target]["value"][1])
            assert value == int(value) >= 1
        up = prometheus.query('up{job="dacfl"}')
        assert sorted(float(r["value"][1]) for r in up) == [1.0, 1.0, 1.0]
        # the counters arrive as counters: every node has received bytes from both neighbours
        received = prometheus.wait_for("dacfl_peer_received_bytes_total > 0", 6)
        assert {(r["metric"]["node"], r["metric"]["peer"]) for r in received} == {
            ("node-0", "node-1"), ("node-0", "node-2"), ("node-1", "node-0"),
            ("node-1", "node-2"), ("node-2", "node-0"), ("node-2", "node-1")}
        # what Prometheus holds is what the nodes said: never ahead of their round now
        scraped = {r["metric"]["node"]: float(r["value"][1])
                   for r in prometheus.query("dacfl_round")}
        for i in range(3):
            now = (await fetch_status(cluster.control_address(i),
                                      auth=cluster.control_auth(i))).round
            assert 1 <= scraped[f"node-{i}"] <= now
    finally:
        prometheus.stop()
        codes = cluster.stop()
        cluster.close()
    assert codes == [0, 0, 0]


async def test_a_real_prometheus_scrapes_with_the_bearer_token_and_is_refused_without_it(
        tmp_path):
    cluster = Cluster(tmp_path / "cluster", 2, 100_000, metrics=True)
    cluster.set_node(metrics_token=TOKEN)  # required of every scrape, even on loopback
    credentials = tmp_path / "metrics.token"
    credentials.write_text(TOKEN + "\n")
    credentials.chmod(0o600)
    prometheus = Prometheus(tmp_path / "prometheus", cluster.metrics_addresses, jobs=[
        # as docs/operations.md tells: the token from a file, sent as Authorization: Bearer
        {"job_name": "dacfl", "static_configs": [{"targets": cluster.metrics_addresses}],
         "authorization": {"type": "Bearer", "credentials_file": str(credentials)}},
        {"job_name": "anonymous", "static_configs": [{"targets": cluster.metrics_addresses}]},
    ])
    cluster.start()
    try:
        rounds = prometheus.wait_for('dacfl_round{job="dacfl"} >= 1', 2)
        assert sorted(r["metric"]["node"] for r in rounds) == ["node-0", "node-1"]
        refused = prometheus.wait_for('up{job="anonymous"} == 0', 2)
        assert len(refused) == 2
        assert prometheus.query('dacfl_round{job="anonymous"}') == []
        # the refusals are counted by reason, as Control's are
        counted = prometheus.wait_for(
            'dacfl_refusals_total{job="dacfl",reason="metrics-token"} > 0', 2)
        assert len(counted) == 2
        statuses = [await fetch_status(cluster.control_address(i), auth=cluster.control_auth(i))
                    for i in range(2)]
        assert all(s.refusals.get("metrics-token", 0) >= 1 for s in statuses)
    finally:
        prometheus.stop()
        codes = cluster.stop()
        cluster.close()
    assert codes == [0, 0]
