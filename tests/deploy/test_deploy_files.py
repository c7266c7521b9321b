"""The deployment files in deploy/, checked offline with the tools deploy/README.md names.

* Kubernetes manifests: kubernetes-validate --strict against the Kubernetes 1.30 schemas it
  ships (a resource whose schema it does not find is a failure here, not the tool's warning);
  the StatefulSet, the headless Service and the generated peers ConfigMap must agree with each
  other and with what the daemon accepts; the native gRPC probes check the port peers.py writes
  into node.health, which answers them in plaintext on a serving TLS node (and serves nothing
  else) and stops answering once the node stops.
* The compose file: check-jsonschema against the Compose Specification schema it vendors.
* The Dockerfile: hadolint, no finding at any level.
* The systemd unit: systemd-analyze verify, where it is installed, and systemd-analyze
  security --offline=yes, which must rate it (and it with the GPU drop-in) 3.0 or below;
  MemoryDenyWriteExecute stays off because torch's convolutions fail under it (shown).

Each checker also gets a file with a known mistake, so a checker that silently checks nothing
fails here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dacflnode._proto.dacfl.v1 import neighbor_pb2, neighbor_pb2_grpc
from dacflnode.cli.topology import topology_cmd as topology_command
from dacflnode.peers.addresses import CONTROL_PORT_OFFSET, METRICS_PORT_OFFSET
from dacflnode.peers.file import parse_peers
from dacflnode.records.checkpoint import FINAL_MODEL
from dacflnode.security.certs import tls_files, write_certs
from dacflnode.transport.base import Identity, Inbox
from dacflnode.transport.grpc_transport import GrpcTransport
from tests.harness.polling import until_blocking

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
MANIFESTS = [K8S / "service.yaml", K8S / "statefulset.yaml", K8S / "peers-configmap.yaml",
             K8S / "networkpolicy.yaml"]
JOB = K8S / "job"
JOB_MANIFESTS = [JOB / "job.yaml", JOB / "data-pvc.yaml", JOB / "results-pod.yaml"]
PODMONITOR = K8S / "monitoring" / "podmonitor.yaml"
COMPOSE = DEPLOY / "compose" / "docker-compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
UNIT = DEPLOY / "systemd" / "dacflnode.service"
#: the oldest Kubernetes the manifests are meant for is 1.28 (the pod-index label); 1.30 is the
#: oldest one still supported upstream when they were written
KUBERNETES = "1.30.0"


def run(*command: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in command], capture_output=True, text=True,
                          check=False, cwd=ROOT, timeout=120)


def kubernetes_validate(*files: Path) -> subprocess.CompletedProcess[str]:
    return run(sys.executable, "-m", "kubernetes_validate", "--strict", "-k", KUBERNETES, *files)


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def load(path: Path) -> dict[str, Any]:
    (doc,) = load_all(path)
    return doc


def named(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (item,) = [i for i in items if i.get("name") == name]
    return item


# ------------------------------------------------------------------------------ Kubernetes
@pytest.mark.slow
def test_kubernetes_manifests_validate_strictly_against_the_bundled_schemas():
    done = kubernetes_validate(*MANIFESTS)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    # WARN is how the tool says it found no schema for a kind: that checked nothing
    assert lines and all(line.startswith("INFO ") for line in lines), done.stdout
    assert len(lines) == sum(len(load_all(m)) for m in MANIFESTS)


@pytest.mark.slow
def test_kubernetes_validate_rejects_a_misspelt_field(tmp_path):
    sts = load(K8S / "statefulset.yaml")
    sts["spec"]["replica"] = sts["spec"].pop("replicas")
    bad = tmp_path / "statefulset.yaml"
    bad.write_text(yaml.safe_dump(sts))
    done = kubernetes_validate(bad)
    assert done.returncode != 0
    assert "'replica' was unexpected" in done.stdout


def test_kustomization_applies_every_manifest_with_one_image():
    kustomization = load(K8S / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == sorted(m.name for m in MANIFESTS)
    assert sorted(p.name for p in K8S.glob("*.yaml")) == sorted(
        [m.name for m in MANIFESTS] + ["kustomization.yaml"])
    (image,) = kustomization["images"]
    pod = load(K8S / "statefulset.yaml")["spec"]["template"]["spec"]
    assert {c["image"].split(":")[0] for c in pod["containers"] + pod["initContainers"]} == {
        image["name"]}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomize_renders_manifests_that_validate(tmp_path):
    done = run("kubectl", "kustomize", K8S)
    assert done.returncode == 0, done.stderr
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(done.stdout)
    checked = kubernetes_validate(rendered)
    assert checked.returncode == 0, checked.stdout
    assert len(checked.stdout.splitlines()) == len(MANIFESTS)
    assert all(line.startswith("INFO ") for line in checked.stdout.splitlines())


def test_statefulset_service_and_peers_configmap_agree():
    sts = load(K8S / "statefulset.yaml")
    svc = load(K8S / "service.yaml")
    configmap = load(K8S / "peers-configmap.yaml")
    name, spec = sts["metadata"]["name"], sts["spec"]
    pod = spec["template"]["spec"]
    node = named(pod["containers"], "node")
    mounts = {m["name"]: m["mountPath"] for m in node["volumeMounts"]}
    port = named(node["ports"], "peer")["containerPort"]

    # the headless Service names every pod, ready or not, and selects exactly these pods
    assert svc["metadata"]["name"] == spec["serviceName"]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    assert spec["selector"]["matchLabels"] == svc["spec"]["selector"]
    assert named(svc["spec"]["ports"], "peer")["port"] == port
    # Prometheus finds node.metrics on the port named metrics
    metrics = named(node["ports"], "metrics")["containerPort"]
    assert metrics == named(svc["spec"]["ports"], "metrics")["port"] == 9100
    annotations = spec["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(metrics)
    assert annotations["prometheus.io/scheme"] == "https"  # node.tls: HTTPS beyond loopback
    token_secret = named(pod["volumes"], "metrics-token")["secret"]
    assert token_secret["secretName"] == "dacflnode-metrics"
    assert token_secret["defaultMode"] & 0o007 == 0  # the daemon refuses a token others read
    # every container has requests and limits
    for container in pod["containers"] + pod["initContainers"]:
        for key in ("requests", "limits"):
            assert set(container["resources"][key]) == {"cpu", "memory"}, container["name"]

    # pod i runs node-i with the ConfigMap's node-i.yaml
    index = named(node["env"], "POD_INDEX")["valueFrom"]["fieldRef"]["fieldPath"]
    assert index == "metadata.labels['apps.kubernetes.io/pod-index']"
    assert node["args"] == ["start", "--peers", f"{mounts['peers']}/node-$(POD_INDEX).yaml"]
    assert named(pod["volumes"], "peers")["configMap"]["name"] == configmap["metadata"]["name"]
    files = configmap["data"]
    n = spec["replicas"]
    assert sorted(files) == sorted(f"node-{i}.yaml" for i in range(n))
    addresses = {f"node-{j}": f"{name}-{j}.{spec['serviceName']}:{port}" for j in range(n)}
    for i in range(n):
        node_id = f"node-{i}"
        pf = parse_peers(yaml.safe_load(files[f"{node_id}.yaml"]),
                         Path(mounts["peers"]) / f"{node_id}.yaml", check_run=i == 0)
        assert pf.node.id == node_id
        assert pf.node.listen == f"0.0.0.0:{port}"
        assert pf.node.state_dir == Path(mounts["data"]) / node_id
        assert pf.node.tls == tls_files(Path(mounts["tls"]), node_id)
        assert pf.node.metrics == f"0.0.0.0:{metrics}"
        # reachable from other hosts: the bearer token comes from the metrics Secret's file
        assert pf.node.metrics_token_file == Path(mounts["metrics-token"]) / "token"
        assert pf.node.health == f"0.0.0.0:{named(node['ports'], 'health')['containerPort']}"
        assert pf.run.nodes == n
        assert pf.neighbours and all(nb.address == addresses[nb.id] for nb in pf.neighbours)


@pytest.mark.slow
def test_peers_configmap_is_what_the_generator_writes_for_the_statefulset():
    done = run(sys.executable, K8S / "peers.py", "--check", "--json")
    result = json.loads(done.stdout)
    assert "error" not in result, result["error"]
    assert result["current"], result["diff"]
    assert done.returncode == 0


def test_peers_generator_refuses_an_option_the_statefulset_fixes(tmp_path):
    done = run(sys.executable, K8S / "peers.py", "--certs", tmp_path, "--out",
               tmp_path / "peers.yaml", "--json", "--", "--rounds", "5", "--hosts", "a,b,c")
    assert done.returncode == 2
    assert "--hosts is set from statefulset.yaml" in json.loads(done.stdout)["error"]
    assert not (tmp_path / "peers.yaml").exists()


def run_tls_init(tmp_path: Path, secret_files: list[str], pod_index: int,
                 ) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run the init container's script in ``sh`` as pod ``pod_index``, with a Secret of
    ``secret_files``; its two paths are replaced by folders under ``tmp_path``."""
    pod = load(K8S / "statefulset.yaml")["spec"]["template"]["spec"]
    init = named(pod["initContainers"], "tls")
    assert init["command"][:2] == ["sh", "-c"]
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    assert named(named(pod["containers"], "node")["volumeMounts"], "tls")["mountPath"] == (
        mounts["tls"])
    secret, tls = tmp_path / "secret", tmp_path / "tls"
    secret.mkdir(exist_ok=True)
    tls.mkdir(exist_ok=True)
    for name in secret_files:
        (secret / name).write_text(name)
    script = init["command"][2]
    for pod_path, here in ((mounts["tls-secret"], secret), (mounts["tls"], tls)):
        assert pod_path in script
        script = script.replace(pod_path, str(here))
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False,
                          env={**os.environ, "POD_INDEX": str(pod_index)}, timeout=30)
    return done, tls


def test_tls_init_container_gives_the_node_only_its_own_files(tmp_path):
    every = ["ca.crt", "ca.key"] + [f"node-{i}.{ext}" for i in range(3) for ext in ("crt", "key")]
    for _ in range(2):  # a rerun replaces the read-only copies of the first run
        done, tls = run_tls_init(tmp_path, every, pod_index=1)
        assert done.returncode == 0, done.stderr
        assert sorted(p.name for p in tls.iterdir()) == ["ca.crt", "node-1.crt", "node-1.key"]
        assert (tls / "node-1.key").read_text() == "node-1.key"
        assert (tls / "node-1.key").stat().st_mode & 0o777 == 0o400


def test_tls_init_container_fails_for_a_node_the_secret_lacks(tmp_path):
    done, _ = run_tls_init(tmp_path, ["ca.crt", "node-0.crt", "node-0.key"], pod_index=2)
    assert done.returncode != 0
    assert "Secret dacflnode-tls has no node-2.crt" in done.stderr


PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def grpc_probe() -> dict[str, Any]:
    """The ``grpc`` action of the node container's probes (all three are the same check)."""
    node = named(load(K8S / "statefulset.yaml")["spec"]["template"]["spec"]["containers"], "node")
    actions = [node[p] for p in PROBES]
    assert all(set(a) & {"exec", "httpGet", "tcpSocket"} == set() for a in actions)
    assert actions[0]["grpc"] == actions[1]["grpc"] == actions[2]["grpc"]
    action: dict[str, Any] = actions[0]["grpc"]
    return action


def test_grpc_probes_check_the_health_port_peers_py_writes_into_every_peers_file():
    node = named(load(K8S / "statefulset.yaml")["spec"]["template"]["spec"]["containers"], "node")
    probe = grpc_probe()
    assert probe == {"port": named(node["ports"], "health")["containerPort"], "service": ""}
    files = load(K8S / "peers-configmap.yaml")["data"]
    health = {yaml.safe_load(text)["node"]["health"] for text in files.values()}
    assert health == {f"0.0.0.0:{probe['port']}"}


async def kubelet_probe(port: int, service: str) -> str:
    """What the kubelet's native gRPC probe sees: Health/Check over a new plaintext channel
    (it has no client certificate). The status's name, or the failed call's code."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub: Any = health_pb2_grpc.HealthStub(channel)  # no async types shipped
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        except grpc.aio.AioRpcError as exc:
            return str(exc.code().name)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


async def test_health_port_answers_the_probe_on_a_serving_tls_node_and_fails_once_it_stops(
        tmp_path):
    service = grpc_probe()["service"]
    write_certs(tmp_path, ["node-0", "node-1"])
    inbox = Inbox(senders={"node-0"}, current_round=lambda: 0)
    transport = GrpcTransport(Identity("node-1", "model", "run"), "127.0.0.1:0",
                              {"node-0": ""}, inbox, {"x": (4,)},
                              tls=tls_files(tmp_path, "node-1").load(),
                              health_listen="127.0.0.1:0")
    await transport.start()
    assert transport.port is not None and transport.health_port is not None
    try:
        assert await kubelet_probe(transport.health_port, service) == "SERVING"
        # the peer port needs a client certificate: the reason the health port exists
        assert await kubelet_probe(transport.port, service) == "UNAVAILABLE"
        # the health port serves nothing but the status
        async with grpc.aio.insecure_channel(f"127.0.0.1:{transport.health_port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await neighbor_pb2_grpc.NeighborStub(channel).Hello(
                    neighbor_pb2.HelloRequest(node_id="node-0"), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await transport.stop(grace=0)
    assert await kubelet_probe(transport.health_port, service) == "UNAVAILABLE"


# ------------------------------------------------------------------------------ NetworkPolicy
def pod_labels() -> dict[str, str]:
    labels: dict[str, str] = load(K8S / "statefulset.yaml")["spec"]["template"]["metadata"][
        "labels"]
    return labels


def test_network_policy_lets_in_peers_from_the_pods_and_metrics_from_prometheus_only():
    policy = load(K8S / "networkpolicy.yaml")["spec"]
    node = named(load(K8S / "statefulset.yaml")["spec"]["template"]["spec"]["containers"], "node")
    port_names = {p["name"] for p in node["ports"]}
    labels = pod_labels()
    # it isolates the dacflnode pods, both ways
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    rules = {rule["ports"][0]["port"]: rule for rule in policy["ingress"]}
    assert len(rules) == len(policy["ingress"]) == 2
    # every rule names its ports: a rule without ports would open all of them, health included
    assert all(rule.get("ports") and rule.get("from") for rule in policy["ingress"])
    assert set(rules) == {"peer", "metrics"} and set(rules) <= port_names
    # peer: only from pods that carry the dacflnode pods' labels, in this namespace
    (peer_from,) = rules["peer"]["from"]
    assert set(peer_from) == {"podSelector"}
    assert peer_from["podSelector"]["matchLabels"].items() <= labels.items()
    # metrics: only from Prometheus pods of Prometheus's namespace (both in one entry: "and")
    (metrics_from,) = rules["metrics"]["from"]
    assert metrics_from["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"}
    assert metrics_from["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
    # health has no rule: the kubelet's probes come from the pod's node, which is always let in
    assert "health" in port_names and "health" not in rules
    # out: the neighbours' peer port and DNS, nothing else
    (peers_out, dns_out) = policy["egress"]
    assert peers_out["ports"] == [{"protocol": "TCP", "port": "peer"}]
    assert peers_out["to"] == [{"podSelector": policy["podSelector"]}]
    assert {(p["protocol"], p["port"]) for p in dns_out["ports"]} == {("UDP", 53), ("TCP", 53)}


# ------------------------------------------------------------------------------ PodMonitor
def test_podmonitor_scrapes_every_pod_with_the_metrics_token_and_its_node_certificate():
    monitor = load(PODMONITOR)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["kind"] == "PodMonitor"
    sts = load(K8S / "statefulset.yaml")
    svc = load(K8S / "service.yaml")
    pod = sts["spec"]["template"]["spec"]
    node = named(pod["containers"], "node")
    annotations = sts["spec"]["template"]["metadata"]["annotations"]
    assert monitor["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels().items()
    token_volume = named(pod["volumes"], "metrics-token")["secret"]["secretName"]
    tls_volume = named(pod["volumes"], "tls-secret")["secret"]["secretName"]
    files = load(K8S / "peers-configmap.yaml")["data"]
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    replicas = sts["spec"]["replicas"]
    assert len(endpoints) == replicas  # one per node: each checks another certificate name
    for i, endpoint in enumerate(endpoints):
        peers = yaml.safe_load(files[f"node-{i}.yaml"])["node"]
        named(node["ports"], endpoint["port"])  # a container port of that name
        assert endpoint["port"] == "metrics"
        assert f":{named(node['ports'], 'metrics')['containerPort']}" in peers["metrics"]
        assert endpoint["scheme"] == annotations["prometheus.io/scheme"] == "https"
        assert endpoint["path"] == annotations["prometheus.io/path"]
        # the bearer token: the key of the Secret the pods mount as node.metrics_token_file
        assert endpoint["authorization"] == {"type": "Bearer", "credentials": {
            "name": token_volume, "key": Path(peers["metrics_token_file"]).name}}
        # the node's certificate names node-<i>; the CA is that of the Secret dacflnode-tls
        assert endpoint["tlsConfig"] == {"ca": {"secret": {"name": tls_volume, "key": "ca.crt"}},
                                         "serverName": peers["id"]}
        assert peers["id"] == f"node-{i}"
        (keep,) = endpoint["relabelings"]
        assert keep["sourceLabels"] == ["__meta_kubernetes_pod_name"]
        assert keep["action"] == "keep"
        # Prometheus anchors the regex: pod i of the StatefulSet, or of the Job (whose pods
        # are named <job>-<index>-<suffix>), and no other
        name = sts["metadata"]["name"]
        kept = re.compile(keep["regex"])
        assert kept.fullmatch(f"{name}-{i}") and kept.fullmatch(f"{name}-{i}-x7k2q")
        assert not any(kept.fullmatch(other) for other in (
            f"{name}-{i + 1}", f"{name}-1{i}", f"{name}-{i + 1}-x7k2q", f"{name}-results"))


def test_podmonitor_is_left_out_of_the_kustomization():
    # a cluster without prometheus-operator has no PodMonitor kind: kubectl apply -k must work
    assert all("monitoring" not in r for r in load(K8S / "kustomization.yaml")["resources"])


# ------------------------------------------------------------------------------ the Job
@pytest.mark.slow
def test_job_manifests_validate_strictly_against_the_bundled_schemas():
    done = kubernetes_validate(*JOB_MANIFESTS)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(lines) == len(JOB_MANIFESTS)
    assert all(line.startswith("INFO ") for line in lines), done.stdout


def test_job_kustomization_applies_the_job_and_its_claim_with_the_image():
    kustomization = load(JOB / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == ["data-pvc.yaml", "job.yaml"]
    assert kustomization["images"] == load(K8S / "kustomization.yaml")["images"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_job_kustomization_renders_manifests_that_validate(tmp_path):
    done = run("kubectl", "kustomize", JOB)
    assert done.returncode == 0, done.stderr
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(done.stdout)
    checked = kubernetes_validate(rendered)
    assert checked.returncode == 0, checked.stdout
    lines = checked.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("INFO ") for line in lines), checked.stdout


def without(d: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k not in keys}


def test_job_runs_the_statefulsets_pods_as_an_indexed_job_that_ends():
    sts = load(K8S / "statefulset.yaml")
    job = load(JOB / "job.yaml")
    svc = load(K8S / "service.yaml")
    spec = job["spec"]
    # one pod per node, all at once, pod i named and reachable as the StatefulSet's pod i
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == sts["spec"]["replicas"]
    assert job["metadata"]["name"] == sts["metadata"]["name"]  # hostname <job name>-<index>
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == sts["spec"]["serviceName"] == svc["metadata"]["name"]
    assert svc["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    assert spec["template"]["metadata"] == sts["spec"]["template"]["metadata"]
    # nothing restarts a pod in place; exit 2 (a setting to fix) fails the Job at once
    assert pod["restartPolicy"] == "Never"
    (fail, ignore) = spec["podFailurePolicy"]["rules"]
    assert fail == {"action": "FailJob", "onExitCodes": {
        "containerName": "node", "operator": "In", "values": [2]}}
    assert ignore["action"] == "Ignore"
    assert ignore["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]

    # the rest of the pod is the StatefulSet's, but for the index, the command and the claim
    sts_pod = sts["spec"]["template"]["spec"]
    index = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert without(pod, "restartPolicy", "subdomain", "affinity", "initContainers",
                   "containers", "volumes") == without(sts_pod, "initContainers", "containers",
                                                       "volumes")
    for job_c, sts_c in zip(pod["initContainers"] + pod["containers"],
                            sts_pod["initContainers"] + sts_pod["containers"], strict=True):
        assert named(job_c["env"], "POD_INDEX")["valueFrom"]["fieldRef"]["fieldPath"] == index
        assert without(job_c, "env", "args", "command") == without(sts_c, "env", "args",
                                                                    "command")
    assert pod["initContainers"][0]["command"] == sts_pod["initContainers"][0]["command"]
    assert pod["volumes"][:-1] == [v for v in sts_pod["volumes"]]
    assert pod["volumes"][-1] == {"name": "data", "persistentVolumeClaim": {
        "claimName": load(JOB / "data-pvc.yaml")["metadata"]["name"]}}
    # one ReadWriteOnce claim: every pod on the same Kubernetes node
    assert load(JOB / "data-pvc.yaml")["spec"]["accessModes"] == ["ReadWriteOnce"]
    (term,) = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= pod_labels().items()
    # the results pod reads that claim
    results = load(JOB / "results-pod.yaml")["spec"]
    assert results["volumes"][0]["persistentVolumeClaim"]["claimName"] == "dacflnode-data"


def job_script() -> tuple[str, dict[str, str]]:
    """The node container's shell script of the Job and its mount paths."""
    node = named(load(JOB / "job.yaml")["spec"]["template"]["spec"]["containers"], "node")
    assert node["command"][:2] == ["sh", "-c"]
    mounts = {m["name"]: m["mountPath"] for m in node["volumeMounts"]}
    script: str = node["command"][2]
    return script, mounts


def test_job_script_starts_the_node_with_its_peers_file_and_checks_its_final_model():
    script, mounts = job_script()
    # the paths peers.py writes: the peers file and node.state_dir of node-<i>
    assert 'dacflnode start --peers "$peers"' in script
    assert f'peers="{mounts["peers"]}/node-${{POD_INDEX}}.yaml"' in script
    assert f'final="{mounts["data"]}/node-${{POD_INDEX}}/{FINAL_MODEL}"' in script
    files = load(K8S / "peers-configmap.yaml")["data"]
    for i in range(len(files)):
        state_dir = yaml.safe_load(files[f"node-{i}.yaml"])["node"]["state_dir"]
        assert state_dir == f"{mounts['data']}/node-{i}"


STUB_NODE = """#!/bin/sh
# a stand-in for dacflnode: $STUB says what it does
echo "$@" > "$WORK/args"
case "$STUB" in
  done) mkdir -p "$WORK/data/node-1" && : > "$WORK/data/node-1/final.safetensors"; exit 0 ;;
  stopped) exit 0 ;;
  refused) exit 2 ;;
  sigterm)
    trap 'echo TERM > "$WORK/term"; exit 0' TERM
    : > "$WORK/ready"
    while :; do sleep 0.05; done ;;
esac
"""


def start_job_script(tmp_path: Path, stub: str) -> subprocess.Popen[str]:
    """The Job's script in ``sh`` as pod 1, its paths moved under ``tmp_path``, with a stub
    ``dacflnode`` that behaves as ``stub`` says."""
    script, mounts = job_script()
    for name in ("peers", "data"):
        script = script.replace(f"{mounts[name]}/", f"{tmp_path / name}/")
    (tmp_path / "bin").mkdir()
    binary = tmp_path / "bin" / "dacflnode"
    binary.write_text(STUB_NODE)
    binary.chmod(0o755)
    env = {**os.environ, "POD_INDEX": "1", "STUB": stub, "WORK": str(tmp_path),
           "PATH": f"{binary.parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.Popen(["sh", "-c", script], env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)


def finish(proc: subprocess.Popen[str]) -> str:
    """``proc``'s stderr once it ends; on a hang, its whole session is killed (the stand-in
    too, which holds the pipes) before the test fails."""
    try:
        return proc.communicate(timeout=30)[1]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise


@pytest.mark.parametrize(("stub", "status"), [("done", 0), ("stopped", 1), ("refused", 2)])
def test_job_script_keeps_the_nodes_exit_status_but_a_stop_before_the_end(tmp_path, stub,
                                                                          status):
    proc = start_job_script(tmp_path, stub)
    err = finish(proc)
    assert proc.returncode == status, err
    assert (tmp_path / "args").read_text().split() == [
        "start", "--peers", str(tmp_path / "peers" / "node-1.yaml")]
    if stub == "stopped":
        assert "node-1 stopped before its last round" in err
        assert "starts it again from its checkpoint" in err
    else:
        assert err == ""


def test_job_script_passes_sigterm_to_the_node_and_exits_1_when_it_was_not_done(tmp_path):
    proc = start_job_script(tmp_path, "sigterm")

    def ready() -> bool:  # the stub has set its trap
        if proc.poll() is not None:
            finish(proc)
            pytest.fail("the node did not start")
        return bool((tmp_path / "ready").exists())

    try:
        until_blocking(ready, 30, what="the node did not start")
    except AssertionError:
        finish(proc)
        raise
    proc.send_signal(signal.SIGTERM)
    err = finish(proc)
    assert (tmp_path / "term").read_text() == "TERM\n"  # the node got it, and checkpointed
    assert proc.returncode == 1, err
    assert "node-1 stopped before its last round" in err


# ------------------------------------------------------------------------------ compose
def check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    return run(sys.executable, "-m", "check_jsonschema", "--builtin-schema",
               "vendor.compose-spec", path)


@pytest.mark.slow
def test_compose_file_matches_the_compose_specification():
    done = check_compose(COMPOSE)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_compose_check_rejects_an_unknown_service_key(tmp_path):
    text = COMPOSE.read_text()
    assert "stop_grace_period:" in text
    bad = tmp_path / "docker-compose.yml"
    bad.write_text(text.replace("stop_grace_period:", "stop_grace_periods:"))
    done = check_compose(bad)
    assert done.returncode != 0
    assert "'stop_grace_periods' was unexpected" in done.stdout


# ------------------------------------------------------------------------------ Dockerfile
def hadolint(path: Path) -> tuple[int, list[dict[str, Any]]]:
    """hadolint's exit status and findings (of every level, style included) on ``path``."""
    binary = Path(sysconfig.get_path("scripts")) / "hadolint"
    done = run(binary, "--no-color", "--format", "json", path)
    findings: list[dict[str, Any]] = json.loads(done.stdout)
    return done.returncode, findings


@pytest.mark.slow
def test_dockerfile_has_no_hadolint_finding():
    assert hadolint(DOCKERFILE) == (0, [])


@pytest.mark.slow
def test_hadolint_flags_an_unpinned_pip_install(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text().replace('"torch==${TORCH_VERSION}"', "torch"))
    status, findings = hadolint(bad)
    assert status != 0
    assert "DL3013" in {f["code"] for f in findings}


def dockerfile_instructions(name: str) -> list[str]:
    """The arguments of every ``name`` instruction of the Dockerfile."""
    return [line.split(None, 1)[1] for line in DOCKERFILE.read_text().splitlines()
            if line.startswith(f"{name} ")]


def test_dockerfile_exposes_every_port_a_node_serves():
    (expose,) = dockerfile_instructions("EXPOSE")
    exposed = {int(port) for port in expose.split()}
    # dacflnode topology's numbering for the first node: listen, control, metrics
    listen = 7000
    assert listen == topology_command.params[  # the default of --base-port
        [p.name for p in topology_command.params].index("base_port")].default
    defaults = {listen, listen + CONTROL_PORT_OFFSET, listen + METRICS_PORT_OFFSET}
    # and every container port of the Kubernetes pods (peer, metrics, health)
    node = named(load(K8S / "statefulset.yaml")["spec"]["template"]["spec"]["containers"], "node")
    pod_ports = {p["containerPort"] for p in node["ports"]}
    assert {p["name"] for p in node["ports"]} == {"peer", "metrics", "health"}
    assert exposed == defaults | pod_ports


def test_dockerfile_run_example_runs_as_the_owner_of_the_mounted_folder():
    header = DOCKERFILE.read_text().split("\nFROM ", 1)[0]
    command = " ".join(line.removeprefix("#").strip().rstrip("\\")
                       for line in header.splitlines() if "docker run" in line or
                       "dacflnode:0.1.0 start" in line)
    assert '--user "$(id -u):$(id -g)"' in command
    assert '-v "$PWD/node-0:/data"' in command
    # the folder exists before docker run (else Docker makes it root's) and the alternative
    # without --user is spelt out with the image's uid
    assert "mkdir -p node-0" in header
    (user,) = dockerfile_instructions("USER")
    assert f"chown {user} node-0" in header
    # a uid without an account gets /data, the mounted folder, as its home
    assert "HOME=/data" in dockerfile_instructions("ENV")


# ------------------------------------------------------------------------------ systemd
def verify_unit(unit: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze verify`` of a copy of ``unit`` whose ExecStart runs a stub.

    verify refuses a unit whose ExecStart binary does not exist, and this machine has no
    /opt/dacflnode virtual environment. The copy differs from the unit in that one path only:
    the stub is an executable file in ``tmp_path``; the arguments and every other line are
    checked as they are. Nothing is installed or started.
    """
    stub = tmp_path / "bin" / "dacflnode"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    text = unit.read_text()
    exec_start = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    assert len(exec_start) == 1
    binary = exec_start[0].removeprefix("ExecStart=").split()[0]
    copy = tmp_path / unit.name
    copy.write_text(text.replace(f"ExecStart={binary} ", f"ExecStart={stub} "))
    assert copy.read_text() != text
    return run("systemd-analyze", "verify", copy)


needs_systemd_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")


@needs_systemd_analyze
def test_systemd_unit_verifies_without_a_warning(tmp_path):
    done = verify_unit(UNIT, tmp_path)
    # verify exits 0 on an unknown key or a bad value, and only says so
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


@needs_systemd_analyze
def test_systemd_verify_reports_a_bad_value(tmp_path):
    bad = tmp_path / "dacflnode.service"
    bad.write_text(UNIT.read_text().replace("MemoryMax=80%", "MemoryMax=lots"))
    (tmp_path / "stub").mkdir()
    done = verify_unit(bad, tmp_path / "stub")
    assert "Invalid memory limit 'lots'" in done.stdout + done.stderr


#: the most ``systemd-analyze security`` may rate the shipped unit (its "OK" band starts at 3.0)
MAX_EXPOSURE = 3.0
GPU_DROPIN = DEPLOY / "systemd" / "dacflnode-gpu.conf"


def exposure(unit: Path) -> float:
    """The overall exposure ``systemd-analyze security --offline=yes`` gives ``unit`` (0 to 10,
    lower is safer). Offline: the file is read as it is; nothing is installed or started."""
    done = run("systemd-analyze", "security", "--offline=yes", unit)
    assert done.returncode == 0, done.stdout + done.stderr
    match = re.search(rf"Overall exposure level for {re.escape(unit.name)}: (\d+\.\d+) ",
                      done.stdout)
    assert match, done.stdout
    return float(match.group(1))


def with_dropin(tmp_path: Path, dropin: Path) -> Path:
    """A copy of the unit with ``dropin`` appended: the [Service] section it opens again
    overrides the unit's settings as /etc/systemd/system/dacflnode.service.d/ would."""
    combined = tmp_path / UNIT.name
    combined.write_text(UNIT.read_text() + "\n" + dropin.read_text())
    return combined


@needs_systemd_analyze
def test_systemd_unit_exposure_is_at_most_3(tmp_path):
    assert exposure(UNIT) <= MAX_EXPOSURE


@needs_systemd_analyze
def test_systemd_unit_exposure_with_the_gpu_dropin_is_at_most_3(tmp_path):
    combined = with_dropin(tmp_path, GPU_DROPIN)
    assert "PrivateDevices=no" in combined.read_text()
    assert exposure(combined) <= MAX_EXPOSURE
    (tmp_path / "stub").mkdir()
    done = verify_unit(combined, tmp_path / "stub")
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


@needs_systemd_analyze
def test_systemd_exposure_check_fails_on_the_unit_without_its_sandboxing(tmp_path):
    # the unit as it was before the sandboxing: rated 8.8 EXPOSED
    sandbox = re.compile(r"^(Protect|Private|Restrict|SystemCall|Capability|Ambient|NoNew|UMask"
                         r"|Lock|Keyring|RemoveIPC|DevicePolicy|StateDirectoryMode)")
    bare = tmp_path / UNIT.name
    bare.write_text("\n".join(line for line in UNIT.read_text().splitlines()
                              if not sandbox.match(line)) + "\n")
    assert "StateDirectory=dacflnode" in bare.read_text()
    assert exposure(bare) > 8.0


def unit_settings(text: str) -> dict[str, list[str]]:
    """Every ``Key=value`` of a unit file, by key, in order (comments and sections left out)."""
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    return settings


def test_systemd_unit_lets_the_node_write_only_its_state_folder_privately():
    settings = unit_settings(UNIT.read_text())
    assert settings["ProtectSystem"] == ["strict"]  # everything read-only ...
    assert settings["StateDirectory"] == ["dacflnode"]  # ... but /var/lib/dacflnode
    assert settings["StateDirectoryMode"] == ["0700"]
    assert settings["UMask"] == ["0077"]
    assert "ReadWritePaths" not in settings
    # the paths the unit and its header name: /var/lib/dacflnode is the only writable one
    assert "--home-dir /var/lib/dacflnode" in UNIT.read_text()
    assert settings["ExecStart"][0].startswith("/opt/dacflnode/")
    assert settings["RestrictAddressFamilies"] == ["AF_INET AF_INET6 AF_UNIX"]
    assert settings["CapabilityBoundingSet"] == settings["AmbientCapabilities"] == [""]


def test_systemd_unit_leaves_memory_deny_write_execute_off():
    # PyTorch's CPU kernels need writable, executable memory (next test)
    assert "MemoryDenyWriteExecute" not in unit_settings(UNIT.read_text())


MDWE_PROBE = """
import ctypes, mmap, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(65, 1, 0, 0, 0) != 0:  # PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN
    print("no-mdwe"); sys.exit(0)
try:
    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    print("not-enforced"); sys.exit(0)
except OSError:
    pass
import torch
net = torch.nn.Conv2d(1, 4, 3)
try:
    net(torch.randn(2, 1, 28, 28)).sum().backward()
except RuntimeError as exc:
    print("refused:", exc); sys.exit(0)
print("trained")
"""


@pytest.mark.slow
def test_torch_convolution_fails_under_memory_deny_write_execute():
    """What MemoryDenyWriteExecute=yes applies (the kernel's PR_SET_MDWE, Linux 6.3 and later,
    which systemd uses where the kernel has it) breaks a convolution of the model: the reason
    the unit leaves it off. Run in a child process, which the setting cannot leave."""
    done = subprocess.run([sys.executable, "-c", MDWE_PROBE], capture_output=True, text=True,
                          check=False, timeout=300)
    assert done.returncode == 0, done.stderr
    if done.stdout.strip() in ("no-mdwe", "not-enforced"):
        pytest.skip(f"this kernel has no PR_SET_MDWE ({done.stdout.strip()})")
    assert done.stdout.startswith("refused: could not create a primitive"), done.stdout
