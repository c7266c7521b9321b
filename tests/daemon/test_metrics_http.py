"""The Prometheus endpoint: series names and types by the conventions, ``node.metrics`` in peers
files and generated clusters, the message counters of both transports, and a live daemon's
``/metrics`` over HTTP (the same exposition as the Control service's; ``promtool check metrics``
finds nothing to say about it)."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from dacflnode.cluster.launcher import free_ports
from dacflnode.daemon.prometheus import MetricsServer, NeighbourInfo, NodeMetrics, NodeStatus
from dacflnode.errors import ConfigError
from dacflnode.peers.file import load_peers, parse_peers, read_metrics_token
from dacflnode.peers.generate import generate_cluster
from dacflnode.peers.yaml_form import dump_peers
from dacflnode.protocol.phase import Phase
from dacflnode.transport.base import Identity, Inbox, Transport
from dacflnode.transport.grpc_control import fetch_metrics
from dacflnode.transport.grpc_transport import GrpcTransport
from dacflnode.transport.memory import MemoryNetwork, MemoryTransport
from dacflnode.wire.message import RoundMessage
from tests.harness import preloaded
from tests.harness.cluster import ENV, TINY, Cluster, cluster

#: urllib without the environment's proxies: every address here is on loopback
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))

Families = dict[str, tuple[str, frozenset[str]]]


def families(text: str) -> Families:
    """name -> (type, label names of its samples) of an exposition."""
    return {f.name: (f.type, frozenset(k for s in f.samples for k in s.labels))
            for f in text_string_to_metric_families(text)}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def get(url: str, timeout: float = 10) -> str:
    with HTTP.open(url, timeout=timeout) as reply:
        return str(reply.read().decode())


def busy_status() -> NodeStatus:
    return NodeStatus(
        "n0", "dacfl", 3, 10, "training", refusals={"non-finite": 2}, last_accuracy=0.5,
        last_loss=1.25, consensus_residual=0.01, reanchored=1, data_size=120, test_size=30,
        class_counts={"cat": 100, "dog": 20}, skipped_files=1,
        neighbours=[NeighbourInfo("n1", "a:1", True, 2, 100, 200, 1.5, messages_received=2,
                                  messages_sent=3, missed_rounds=1),
                    NeighbourInfo("n2", "a:2")])


# ------------------------------------------------------------------------------ names and types
def test_series_follow_the_prometheus_naming_conventions():
    metrics = NodeMetrics("n0", process=False)
    metrics.update(busy_status())
    metrics.observe_round(0.3, 0.1, 0.2, 0.9)
    got = families(metrics.prometheus())
    assert {name for name in got if not name.startswith("dacfl_")} == set()
    for name, (kind, labels) in got.items():
        assert "node" in labels, name
        if kind == "counter":  # the family name is the counter's name without _total
            assert f"{name}_total" in {s for s, _ in samples(metrics.prometheus())}, name
        if kind == "histogram":
            assert name.endswith("_seconds"), name
        if name.startswith("dacfl_peer_"):
            assert "peer" in labels, name
    counters = {name for name, (kind, _) in got.items() if kind == "counter"}
    assert counters == {
        "dacfl_refusals", "dacfl_reanchored", "dacfl_peer_received_bytes", "dacfl_peer_sent_bytes",
        "dacfl_peer_received_messages", "dacfl_peer_sent_messages", "dacfl_peer_missed_rounds",
        "dacfl_peer_late_states", "dacfl_peer_refused", "dacfl_peer_corrections",
        "dacfl_peer_refused_states", "dacfl_peer_quarantines", "dacfl_rounds_alone",
        "dacfl_peer_exchanges"}
    histograms = {name for name, (kind, _) in got.items() if kind == "histogram"}
    assert histograms == {"dacfl_round_seconds", "dacfl_exchange_seconds", "dacfl_train_seconds"}
    assert got["dacfl_phase"] == ("gauge", frozenset({"node", "phase"}))
    assert got["dacfl_refusals"] == ("counter", frozenset({"node", "reason"}))
    assert got["dacfl_data_samples"] == ("gauge", frozenset({"node", "split"}))
    assert got["dacfl_data_class_samples"] == ("gauge", frozenset({"node", "class"}))
    for gauge in ("dacfl_round", "dacfl_test_accuracy_ratio", "dacfl_test_loss",
                  "dacfl_train_loss", "dacfl_consensus_residual", "dacfl_data_skipped_files"):
        assert got[gauge][0] == "gauge", gauge


def test_the_exposition_shows_the_status_it_was_given():
    metrics = NodeMetrics("n0", process=False)
    metrics.update(busy_status())
    metrics.observe_round(0.3, 0.1, 0.2, 0.9)
    got = samples(metrics.prometheus())
    node, peer = (("node", "n0"),), (("node", "n0"), ("peer", "n1"))
    assert got[("dacfl_round", node)] == 3
    assert got[("dacfl_test_accuracy_ratio", node)] == 0.5
    assert got[("dacfl_train_loss", node)] == 0.9
    assert got[("dacfl_peer_received_bytes_total", peer)] == 100
    assert got[("dacfl_peer_sent_bytes_total", peer)] == 200
    assert got[("dacfl_peer_received_messages_total", peer)] == 2
    assert got[("dacfl_peer_sent_messages_total", peer)] == 3
    assert got[("dacfl_peer_missed_rounds_total", peer)] == 1
    assert got[("dacfl_peer_push_latency_seconds", peer)] == 0.0015
    assert got[("dacfl_refusals_total", (("node", "n0"), ("reason", "non-finite")))] == 2
    assert got[("dacfl_exchange_seconds_count", node)] == 1
    assert got[("dacfl_train_seconds_sum", node)] == 0.2
    phases = {dict(labels)["phase"]: v for (name, labels), v in got.items()
              if name == "dacfl_phase"}
    assert phases == {p.value: float(p is Phase.TRAINING) for p in Phase}


def test_what_is_not_measured_yet_is_absent_rather_than_nan():
    metrics = NodeMetrics("n0", process=False)
    metrics.update(NodeStatus("n0", "dacfl", 0, 10, "waiting-for-peers"))
    got = samples(metrics.prometheus())
    names = {name for name, _ in got}
    assert "dacfl_test_accuracy_ratio" not in names and "dacfl_train_loss" not in names
    assert got[("dacfl_round", (("node", "n0"),))] == 0
    assert got[("dacfl_round_seconds_count", (("node", "n0"),))] == 0  # empty, but there


def test_the_process_collectors_are_in_the_nodes_registry_only():
    from prometheus_client import REGISTRY

    before = {f.name for f in REGISTRY.collect()}
    text = NodeMetrics("n0").prometheus()
    assert "process_cpu_seconds_total" in text and "python_info" in text
    assert {f.name for f in REGISTRY.collect()} == before


# ------------------------------------------------------------------------------ HTTP server
async def test_the_http_server_refreshes_before_each_scrape_and_serves_only_metrics():
    metrics = NodeMetrics("n0", process=False)
    scrapes: list[int] = []

    def refresh() -> None:
        scrapes.append(1)
        metrics.update(NodeStatus("n0", "dacfl", len(scrapes), 10, "training"))

    server = MetricsServer(metrics.registry, "127.0.0.1", 0, refresh, render_interval=0)
    port = await server.start()
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        assert 'dacfl_round{node="n0"} 1.0' in await asyncio.to_thread(get, url)
        assert 'dacfl_round{node="n0"} 2.0' in await asyncio.to_thread(get, url)
        with pytest.raises(urllib.error.HTTPError) as err:
            await asyncio.to_thread(get, f"http://127.0.0.1:{port}/")
        assert err.value.code == 404
    finally:
        await server.stop()
    with pytest.raises(urllib.error.URLError):
        await asyncio.to_thread(get, f"http://127.0.0.1:{port}/metrics", 2)


async def test_a_failing_refresh_serves_the_last_status():
    metrics = NodeMetrics("n0", process=False)
    metrics.update(NodeStatus("n0", "dacfl", 7, 10, "training"))

    def refresh() -> None:
        raise RuntimeError("the loop is gone")

    server = MetricsServer(metrics.registry, "127.0.0.1", 0, refresh)
    port = await server.start()
    try:
        text = await asyncio.to_thread(get, f"http://127.0.0.1:{port}/metrics")
        assert 'dacfl_round{node="n0"} 7.0' in text
    finally:
        await server.stop()


# ------------------------------------------------------------------------------ node.metrics
def peers_data(**node: object) -> dict[str, object]:
    return {"node": {"id": "a", "listen": "127.0.0.1:7000", "share": 0, **node},
            "neighbours": [{"id": "b", "address": "127.0.0.1:7001"}],
            "run": {"nodes": 2, "dataset": "synthetic"}}


def test_node_metrics_is_optional_and_round_trips_through_the_written_file(tmp_path):
    assert parse_peers(peers_data(), tmp_path / "a.yaml").node.metrics is None
    pf = parse_peers(peers_data(metrics="0.0.0.0:9100", metrics_token="m" * 16),
                     tmp_path / "a.yaml")
    assert pf.node.metrics == "0.0.0.0:9100"  # another host's reach, asked for explicitly
    back = parse_peers(yaml.safe_load(dump_peers(pf)), pf.path)
    assert back.node == pf.node


@pytest.mark.parametrize(("value", "message"), [
    ("127.0.0.1:7000", "node.listen address"),
    ("127.0.0.1:8000", "node.control address"),
    ("127.0.0.1", "host:port"),
    ("127.0.0.1:70000", "0..65535"),
])
def test_a_bad_node_metrics_is_refused_naming_the_key(tmp_path, value, message):
    with pytest.raises(ConfigError, match=message) as err:
        parse_peers(peers_data(metrics=value), tmp_path / "a.yaml")
    assert err.value.field == "node.metrics"


def test_a_non_loopback_node_metrics_without_a_token_is_refused_saying_what_to_add(tmp_path):
    for host in ("0.0.0.0", "10.1.2.3", "::"):
        with pytest.raises(ConfigError, match=r"set node\.metrics_token") as err:
            parse_peers(peers_data(metrics=f"[{host}]:9100" if ":" in host else f"{host}:9100"),
                        tmp_path / "a.yaml")
        assert err.value.field == "node.metrics_token"
    # loopback stays open: the Prometheus of the same host
    assert parse_peers(peers_data(metrics="127.0.0.1:9100"), tmp_path / "a.yaml").node.metrics


def test_node_metrics_token_follows_the_control_token_rules_and_is_never_echoed(tmp_path):
    pf = parse_peers(peers_data(metrics="0.0.0.0:9100", metrics_token="t" * 16),
                     tmp_path / "a.yaml")
    assert pf.node.metrics_token == "t" * 16 and "t" * 16 not in repr(pf)
    for bad in ("short-token", "has a space in it ok", 1234567890123456789):
        with pytest.raises(ConfigError) as err:
            parse_peers(peers_data(metrics="0.0.0.0:9100", metrics_token=bad),
                        tmp_path / "a.yaml")
        assert err.value.field == "node.metrics_token" and str(bad) not in str(err.value)


def test_node_metrics_token_file_is_read_at_start_and_must_not_be_open_to_others(tmp_path):
    token = tmp_path / "metrics.token"
    pf = parse_peers(peers_data(metrics="0.0.0.0:9100", metrics_token_file="metrics.token"),
                     tmp_path / "a.yaml")  # the file need not exist where the file is checked
    assert pf.node.metrics_token is None and pf.node.metrics_token_file == token
    assert parse_peers(yaml.safe_load(dump_peers(pf)), pf.path).node == pf.node
    with pytest.raises(ConfigError, match="cannot read") as err:
        read_metrics_token(token, pf.path)
    assert err.value.field == "node.metrics_token_file"
    token.write_text("k" * 24 + "\n")
    token.chmod(0o640)
    assert read_metrics_token(token, pf.path) == "k" * 24
    token.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        read_metrics_token(token, pf.path)
    token.write_text("short\n")
    token.chmod(0o600)
    with pytest.raises(ConfigError, match="at least 16") as err:
        read_metrics_token(token, pf.path)
    assert "short" not in str(err.value)
    with pytest.raises(ConfigError, match="keep one"):
        parse_peers(peers_data(metrics_token="k" * 16, metrics_token_file="metrics.token"),
                    tmp_path / "a.yaml")


def test_topology_puts_metrics_on_loopback_at_the_listen_port_plus_2000(tmp_path):
    paths = generate_cluster("ring", 3, TINY, tmp_path / "a", base_port=7100)
    assert [load_peers(p).node.metrics for p in paths] == [
        "127.0.0.1:9100", "127.0.0.1:9101", "127.0.0.1:9102"]


def test_generated_clusters_take_metrics_ports_and_host_as_given(tmp_path):
    paths = generate_cluster("ring", 3, TINY, tmp_path / "a", ports=[7100, 7101, 7102],
                             control_ports=[7200, 7201, 7202],
                             metrics_ports=[7300, 7301, 7302], metrics_host="0.0.0.0")
    assert [load_peers(p).node.metrics for p in paths] == [
        "0.0.0.0:7300", "0.0.0.0:7301", "0.0.0.0:7302"]
    # reachable from other hosts: one token for the cluster, and a file for the scraper
    token = (tmp_path / "a" / "metrics.token").read_text().strip()
    assert (tmp_path / "a" / "metrics.token").stat().st_mode & 0o777 == 0o600
    assert {load_peers(p).node.metrics_token for p in paths} == {token}
    # control ports picked one by one (free ones) leave the metrics to be picked the same way
    paths = generate_cluster("ring", 3, TINY, tmp_path / "b", ports=[7100, 7101, 7102],
                             control_ports=[7200, 7201, 7202])
    assert [load_peers(p).node.metrics for p in paths] == [None] * 3
    with pytest.raises(ConfigError, match="taken twice"):
        generate_cluster("ring", 3, TINY, tmp_path / "c", ports=[7100, 7101, 7102],
                         control_ports=[7200, 7201, 7202], metrics_ports=[7300, 7300, 7100])


# ------------------------------------------------------------------------------ message counts
@pytest.mark.parametrize("kind", ["memory", "grpc"])
async def test_both_transports_count_the_states_they_exchange(kind):
    import torch

    tensors = {"x": (8,)}
    inboxes = {n: Inbox(senders=frozenset({o}), current_round=lambda: 0)
               for n, o in (("a", "b"), ("b", "a"))}
    network = MemoryNetwork()
    nodes: dict[str, Transport] = {}
    for n, other in (("a", "b"), ("b", "a")):
        identity = Identity(n, "model", "run")
        nodes[n] = (MemoryTransport(network, identity, [other], inboxes[n], tensors)
                    if kind == "memory" else
                    GrpcTransport(identity, "127.0.0.1:0", {other: ""}, inboxes[n], tensors))
        await nodes[n].start()
    try:
        for n, other in (("a", "b"), ("b", "a")):
            transport = nodes[n]
            if isinstance(transport, GrpcTransport):
                peer = nodes[other]
                assert isinstance(peer, GrpcTransport)
                transport.peers[other] = f"127.0.0.1:{peer.port}"
        a, b = nodes["a"], nodes["b"]
        await a.push("b", RoundMessage("a", 0, 1, {"x": torch.ones(8)}), timeout=5)
        await a.push("b", RoundMessage("a", 1, 1, {"x": torch.ones(8)}), timeout=5)
        await b.pull("a", 1)
        assert (a.stats["b"].messages_sent, a.stats["b"].messages_received) == (2, 0)
        assert (b.stats["a"].messages_sent, b.stats["a"].messages_received) == (0, 3)
    finally:
        for t in nodes.values():
            await t.stop(grace=0)


# ------------------------------------------------------------------------------ live daemons
def scrape(c: Cluster, i: int) -> str:
    """Node ``i``'s ``/metrics``, over HTTP."""
    return get(f"http://{c.metrics_addresses[i]}/metrics")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two daemons serving ``/metrics`` that have done two rounds (of many more)."""
    with cluster(tmp_path_factory.mktemp("live"), 2, 100_000, metrics=True,
                 eval_every=1) as c:
        c.start()
        c.wait_for_rounds(2, timeout=90)
        yield c
        assert c.stop() == [0, 0], c.logs(range(2))


@pytest.mark.slow
def test_promtool_finds_nothing_to_say_about_a_live_daemons_exposition(live, tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    text = scrape(live, 0)
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                           text=True, timeout=60)
    assert (check.returncode, check.stdout, check.stderr) == (0, "", "")


@pytest.mark.slow
async def test_http_and_the_control_service_serve_the_same_exposition(live):
    over_http = scrape(live, 0)
    over_control = await fetch_metrics(live.control_address(0), "prometheus",
                                       auth=live.control_auth(0))
    assert families(over_http) == families(over_control)
    assert samples(over_http).keys() == samples(over_control).keys()


@pytest.mark.slow
def test_a_live_daemon_counts_what_it_exchanges_per_neighbour(live):
    got = samples(scrape(live, 0))
    node, peer = (("node", "node-0"),), (("node", "node-0"), ("peer", "node-1"))
    assert got[("dacfl_round", node)] >= 2
    for name in ("dacfl_peer_received_bytes_total", "dacfl_peer_sent_bytes_total",
                 "dacfl_peer_received_messages_total", "dacfl_peer_sent_messages_total"):
        assert got[(name, peer)] >= 1, name
    # each state is one message of the same size: bytes per message are the same both ways
    per_message = got[("dacfl_peer_received_bytes_total", peer)] / \
        got[("dacfl_peer_received_messages_total", peer)]
    assert per_message == got[("dacfl_peer_sent_bytes_total", peer)] / \
        got[("dacfl_peer_sent_messages_total", peer)]
    assert got[("dacfl_round_seconds_count", node)] >= 2
    assert 0 <= got[("dacfl_test_accuracy_ratio", node)] <= 1
    assert sum(v for (name, _), v in got.items() if name == "dacfl_phase") == 1
    assert got[("dacfl_peer_missed_rounds_total", peer)] == 0


@pytest.mark.slow
def test_a_taken_metrics_port_stops_the_start_with_a_message_naming_node_metrics(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = free_ports(4)
        path = generate_cluster("complete", 2, TINY, tmp_path / "peers", ports=ports[:2],
                                control_ports=ports[2:], metrics_ports=[port, port + 1],
                                state_root=tmp_path)[0]
        run = preloaded.run("start", "--peers", str(path), env=ENV, timeout=120)
    assert run.returncode == 2, run.stderr
    assert "node.metrics" in run.stderr and f"127.0.0.1:{port}" in run.stderr
