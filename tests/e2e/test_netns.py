"""Daemons on separate (emulated) hosts over slow links.

Each ``dacflnode start`` runs in its own Linux network namespace with one interface, ``eth0``
(10.213.0.<i+1>/24), the end of a veth pair whose other end is a port of a bridge in a hub
namespace. Every node's ``eth0`` sends through ``netem delay 20ms rate 50mbit loss 0%``, so any
host-to-host packet waits 20 ms and a request/answer at least 40 ms. Control addresses stay on each
namespace's own 127.0.0.1. Only namespaces the test creates are touched (every link lives in one of
them, so deleting them removes the links too), their names carry the pid, and they are deleted
in the fixture's teardown whatever happens.

Needs root, ``ip`` and ``tc`` (iproute2), and a kernel that lets us create namespaces; the tests
skip, saying why, otherwise. On a kernel without ``sch_netem`` the links are shaped with ``tbf``
(rate only) instead and the test of the delay skips.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from safetensors.torch import load_file

from dacflnode.config import RunConfig
from dacflnode.peers.generate import generate_cluster
from dacflnode.records.metrics_log import read_metrics
from dacflnode.sim.experiment import run_experiment
from tests.harness.netns import COMMAND_TIMEOUT, hosts, link_bytes, sh, start_daemon

pytestmark = pytest.mark.slow

NODES = 3
ROUNDS = 3
KIND = "complete"
PORT, CONTROL_PORT = 7000, 8000
PREFIX = f"dacfl{os.getpid()}"
NETEM_DELAY_S = 0.020
NETEM = ["netem", "delay", "20ms", "rate", "50mbit", "loss", "0%"]
TBF = ["tbf", "rate", "50mbit", "burst", "32kbit", "latency", "400ms"]
CLUSTER_TIMEOUT = 200  # all daemons, from start to exit
CFG = RunConfig(dataset="synthetic", model="tiny-cnn", lr=0.05, synthetic_train=600,
                synthetic_test=200, device="cpu", nodes=NODES, rounds=ROUNDS)
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@dataclass
class Lab:
    hub: str
    namespaces: list[str]  # node i runs in namespaces[i] ...
    ips: list[str]  # ... at ips[i]
    netem: bool  # False: the kernel has no netem, links are shaped by tbf (rate only)


def shape(ns: str) -> bool:
    """Slow down ``eth0`` of ``ns`` with netem; tbf where the kernel lacks netem."""
    try:
        sh("tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", *NETEM)
        return True
    except RuntimeError as exc:
        if "unknown" not in str(exc).lower():
            raise
    sh("tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", *TBF)
    return False


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with hosts(PREFIX, "10.213.0", NODES, tools=("ip", "tc")) as made:
        netem = all([shape(ns) for ns in made.namespaces])
        yield Lab(made.hub, made.namespaces, made.ips, netem)


@dataclass
class Run:
    root: Path
    codes: list[int | None]  # None: still running at the deadline (then killed)
    wall_s: float
    link_bytes: list[tuple[int, int]]  # (tx, rx) of each node's eth0

    def node(self, i: int) -> Path:
        return self.root / f"node-{i}"

    def stderr(self, i: int) -> str:
        return (self.root / f"node-{i}.stderr").read_text()[-3000:]


@pytest.fixture(scope="module")
def cluster(lab: Lab, tmp_path_factory) -> Run:
    root = tmp_path_factory.mktemp("netns")
    paths = generate_cluster(KIND, NODES, CFG, root / "peers", hosts=lab.ips,
                             ports=[PORT] * NODES, control_ports=[CONTROL_PORT] * NODES,
                             state_root=root, round_deadline=60, hello_timeout=90, insecure=True)
    procs: list[subprocess.Popen[bytes]] = []
    started = time.monotonic()
    try:
        for i, (ns, path) in enumerate(zip(lab.namespaces, paths, strict=True)):
            procs.append(start_daemon(ns, path, root / f"node-{i}.stderr", ENV))
        codes: list[int | None] = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(0.1, started + CLUSTER_TIMEOUT - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=COMMAND_TIMEOUT)
    return Run(root, codes, time.monotonic() - started, [link_bytes(ns) for ns in lab.namespaces])


def max_diff(a: Path, b: Path) -> float:
    ta, tb = load_file(str(a)), load_file(str(b))
    assert ta.keys() == tb.keys()
    return max(float((ta[k].double() - tb[k].double()).abs().max()) for k in ta)


def test_daemons_on_separate_hosts_over_slow_links_end_with_the_simulators_models(
    cluster: Run, tmp_path
):
    for i, code in enumerate(cluster.codes):
        assert code == 0, f"node-{i} exited {code}:\n{cluster.stderr(i)}"
    sim = tmp_path / "sim"
    run_experiment(replace(CFG, engine="sequential", topology=KIND), sim)
    for i in range(NODES):
        node = cluster.node(i)
        assert (node / "final.safetensors").exists()
        metrics = read_metrics(node / "metrics.jsonl")
        assert [m["round"] for m in metrics] == list(range(1, ROUNDS + 1))
        assert all(m["neighbours_missing"] == [] for m in metrics), metrics
        diff = max_diff(node / "final.safetensors", sim / f"node-{i}" / "final.safetensors")
        assert diff <= 1e-6, (f"node-{i}", diff)


def test_model_states_cross_every_nodes_emulated_link(cluster: Run):
    assert cluster.codes == [0] * NODES
    model_bytes = (cluster.node(0) / "final.safetensors").stat().st_size
    for i, (tx, rx) in enumerate(cluster.link_bytes):
        # every round each node sends its state to, and gets one from, NODES - 1 neighbours
        assert min(tx, rx) >= ROUNDS * (NODES - 1) * model_bytes, (f"node-{i}", tx, rx)


def test_every_rounds_exchange_takes_at_least_the_netem_delay(lab: Lab, cluster: Run):
    if not lab.netem:
        pytest.skip("the kernel has no netem qdisc (sch_netem): links had a rate limit, no delay")
    assert cluster.codes == [0] * NODES
    for i in range(NODES):
        exchange = [m["exchange_s"] for m in read_metrics(cluster.node(i) / "metrics.jsonl")]
        assert len(exchange) == ROUNDS
        assert min(exchange) >= NETEM_DELAY_S, (f"node-{i}", exchange)
