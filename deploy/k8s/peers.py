#!/usr/bin/env python3
"""Write the ConfigMap that holds the peers file of every pod of deploy/k8s/statefulset.yaml.

Pod ``<statefulset>-<i>`` runs node ``node-<i>`` and reads ``node-<i>.yaml`` from this ConfigMap.
The files come from ``dacflnode topology``, run with what the StatefulSet fixes: the number of
nodes (``spec.replicas``), each neighbour's stable DNS name ``<statefulset>-<j>.<service>``, the
peer port (the container port named ``peer``), the Prometheus endpoint (``node.metrics`` on all
addresses at the port named ``metrics``, its bearer token read from the file ``token`` of the
``metrics-token`` mount), the plaintext health port of the kubelet's gRPC probes
(``node.health`` on all addresses at the port named ``health``), the state folder (the ``data``
mount) and the certificates (the ``tls`` mount). The certificates themselves go into a Secret,
never into the ConfigMap: ``dacflnode topology --tls CERTS`` creates what is missing in CERTS (a
CA and one certificate per node), and the peers files name their in-pod copies instead of CERTS.

The run options (``--dataset``, ``--rounds``, ...) are recorded in the ConfigMap's annotation
``dacflnode/topology``, so ``--check`` can regenerate the file with a throwaway CA and say
whether the committed one is still what this script writes (CI runs it).

Examples:
  python deploy/k8s/peers.py --certs ~/dacfl-ca -- --dataset synthetic --rounds 50 --threads 2
  python deploy/k8s/peers.py --certs ~/dacfl-ca --kind complete -- --dataset fashion-mnist \\
      --data-root /datasets/fashion-mnist --rounds 200 --threads 2
  python deploy/k8s/peers.py --check --json
"""

from __future__ import annotations

import argparse
import difflib
import json
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
STATEFULSET = HERE / "statefulset.yaml"
CONFIGMAP = HERE / "peers-configmap.yaml"
ANNOTATION = "dacflnode/topology"
#: topology options this script sets from the StatefulSet; giving them too is an error
FIXED = (
    "--nodes", "--hosts", "--ports", "--base-port", "--listen-host", "--state-root", "--tls",
    "--insecure", "--out", "--json",
)


class Refused(Exception):
    """A problem the user must fix; the message says how."""


@dataclass(frozen=True)
class Pods:
    """What the StatefulSet fixes about every node's peers file."""

    statefulset: str
    service: str
    replicas: int
    port: int
    metrics_port: int
    health_port: int
    peers_dir: str
    tls_dir: str
    data_dir: str
    configmap: str
    secret: str
    metrics_token_dir: str

    def host(self, i: int) -> str:
        return f"{self.statefulset}-{i}.{self.service}"

    @property
    def metrics_address(self) -> str:
        """node.metrics in a pod: every address, so that Prometheus reaches it at the pod IP."""
        return f"0.0.0.0:{self.metrics_port}"

    @property
    def metrics_token_file(self) -> str:
        """node.metrics_token_file in a pod: the key ``token`` of the metrics Secret."""
        return f"{self.metrics_token_dir.rstrip('/')}/token"

    @property
    def health_address(self) -> str:
        """node.health in a pod: every address, so that the kubelet's probes reach it at the
        pod IP."""
        return f"0.0.0.0:{self.health_port}"


def _named(items: list[dict[str, Any]], name: str, what: str) -> dict[str, Any]:
    for item in items:
        if item.get("name") == name:
            return item
    raise Refused(f"{STATEFULSET}: no {what} named {name!r}")


def read_pods(path: Path = STATEFULSET) -> Pods:
    """The StatefulSet's names, size, port and mount paths (container ``node``)."""
    sts = yaml.safe_load(path.read_text())
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    node = _named(pod["containers"], "node", "container")
    mounts = {m["name"]: m["mountPath"] for m in node["volumeMounts"]}
    volumes = pod["volumes"]
    for needed in ("peers", "tls", "data", "metrics-token"):
        if needed not in mounts:
            raise Refused(f"{path}: container node mounts no volume named {needed!r}")
    replicas = spec["replicas"]
    if not isinstance(replicas, int) or replicas < 2:
        raise Refused(f"{path}: spec.replicas must be a whole number >= 2, got {replicas!r}")
    return Pods(
        statefulset=sts["metadata"]["name"],
        service=spec["serviceName"],
        replicas=replicas,
        port=int(_named(node["ports"], "peer", "container port")["containerPort"]),
        metrics_port=int(_named(node["ports"], "metrics", "container port")["containerPort"]),
        health_port=int(_named(node["ports"], "health", "container port")["containerPort"]),
        peers_dir=mounts["peers"],
        tls_dir=mounts["tls"],
        data_dir=mounts["data"],
        configmap=_named(volumes, "peers", "volume")["configMap"]["name"],
        secret=_named(volumes, "tls-secret", "volume")["secret"]["secretName"],
        metrics_token_dir=mounts["metrics-token"],
    )


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, so the peers files stay readable."""


_Dumper.add_representer(
    str,
    lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", v, style="|" if "\n" in v else None),
)


def generate(pods: Pods, kind: str, options: list[str], certs: Path) -> str:
    """The ConfigMap's YAML text: ``dacflnode topology`` for ``pods``, with ``options``."""
    for option in options:
        if option.split("=", 1)[0] in FIXED:
            raise Refused(
                f"{option.split('=', 1)[0]} is set from {STATEFULSET.name}; leave it out"
                " (change the StatefulSet instead)"
            )
    certs = certs.expanduser().absolute()
    n = pods.replicas
    with tempfile.TemporaryDirectory(prefix="dacflnode-peers-") as out:
        command = [
            sys.executable, "-m", "dacflnode", "topology", kind, "--nodes", str(n),
            "--hosts", ",".join(pods.host(i) for i in range(n)),
            "--ports", ",".join([str(pods.port)] * n),
            "--listen-host", "0.0.0.0", "--state-root", pods.data_dir,
            "--tls", str(certs), "--out", out, *options,
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise Refused(f"dacflnode topology failed:\n{done.stderr.strip()}")
        files: dict[str, str] = {}
        for i in range(n):
            node = f"node-{i}"
            text = (Path(out) / f"{node}.yaml").read_text()
            text = text.replace(f"{certs}/", f"{pods.tls_dir.rstrip('/')}/")
            text = _set_node_key(text, "metrics", pods.metrics_address, after="control")
            text = _set_node_key(text, "metrics_token_file", pods.metrics_token_file,
                                 after="metrics")
            text = _set_node_key(text, "health", pods.health_address, after="metrics_token_file")
            _check_file(yaml.safe_load(text), node, pods)
            files[f"{node}.yaml"] = text if text.endswith("\n") else text + "\n"
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": pods.configmap,
            "labels": {"app.kubernetes.io/name": pods.statefulset},
            "annotations": {ANNOTATION: shlex.join([kind, *options])},
        },
        "data": files,
    }
    header = (
        f"# The peers file of every pod of the StatefulSet {pods.statefulset}: pod"
        f" {pods.statefulset}-<i> reads node-<i>.yaml.\n"
        "# Written by deploy/k8s/peers.py: dacflnode topology with the options in the\n"
        f"# annotation {ANNOTATION}. Do not edit: run it again;\n"
        "# `python deploy/k8s/peers.py --check` says whether this file is current.\n"
    )
    body: str = yaml.dump(configmap, Dumper=_Dumper, sort_keys=False, width=100)
    return header + body


def _set_node_key(text: str, key: str, address: str, after: str) -> str:
    """``text`` with ``node.<key>: address`` (placed after ``node.<after>`` when new), replacing
    the address topology writes: it puts node.metrics on loopback and writes no node.health nor
    node.metrics_token_file (it never exposes an endpoint on its own)."""
    lines = text.splitlines(keepends=True)
    start = lines.index("node:\n") + 1
    end = next((k for k in range(start, len(lines)) if not lines[k].startswith(" ")), len(lines))
    entry = f"  {key}: {address}\n"
    keys = [line.split(":", 1)[0].strip() for line in lines[start:end]]
    if key in keys:
        lines[start + keys.index(key)] = entry
    else:
        lines.insert(start + keys.index(after) + 1, entry)
    return "".join(lines)


def _check_file(peers: dict[str, Any], node: str, pods: Pods) -> None:
    """The generated file names the in-pod paths and port (a failed rewrite must not ship)."""
    tls = peers["node"].get("tls") or {}
    want = {
        "ca": f"{pods.tls_dir}/ca.crt",
        "cert": f"{pods.tls_dir}/{node}.crt",
        "key": f"{pods.tls_dir}/{node}.key",
    }
    if peers["node"]["id"] != node or tls != want:
        raise Refused(f"{node}: node.tls is {tls}, expected {want}: is --certs a plain folder?")
    for key, address in (("metrics", pods.metrics_address), ("health", pods.health_address),
                         ("metrics_token_file", pods.metrics_token_file)):
        if peers["node"].get(key) != address:
            raise Refused(f"{node}: node.{key} is {peers['node'].get(key)!r}, expected"
                          f" {address!r}")


def secret_command(pods: Pods, certs: Path) -> list[str]:
    """The kubectl command that makes the Secret: the CA certificate and every node's pair,
    never ca.key."""
    certs = certs.expanduser()
    files = [certs / "ca.crt"]
    for i in range(pods.replicas):
        files += [certs / f"node-{i}.crt", certs / f"node-{i}.key"]
    return ["kubectl", "create", "secret", "generic", pods.secret,
            *(f"--from-file={f}" for f in files)]


def check(pods: Pods, path: Path) -> tuple[bool, str]:
    """Regenerate ``path`` with the options it records; return (current, a diff)."""
    if not path.exists():
        return False, f"{path} does not exist"
    committed = path.read_text()
    recorded = yaml.safe_load(committed)["metadata"]["annotations"][ANNOTATION]
    kind, *options = shlex.split(recorded)
    with tempfile.TemporaryDirectory(prefix="dacflnode-ca-") as certs:
        fresh = generate(pods, kind, options, Path(certs))
    diff = "".join(difflib.unified_diff(
        committed.splitlines(keepends=True), fresh.splitlines(keepends=True),
        str(path), "regenerated", n=1))
    return not diff, diff


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python deploy/k8s/peers.py",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=__doc__[__doc__.index("Examples:"):] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--certs", type=Path, help="certificate folder: the CA and one"
                        " certificate per node are created there when missing (keep it, and"
                        " its ca.key, off the cluster)")
    parser.add_argument("--kind", default="ring", help="graph kind (dacflnode topology KIND);"
                        " default: ring")
    parser.add_argument("--out", type=Path, default=CONFIGMAP,
                        help=f"ConfigMap file to write; default: {CONFIGMAP.name} beside this"
                        " script")
    parser.add_argument("--check", action="store_true", help="regenerate --out with the options"
                        " it records and a throwaway CA; exit 1 if it differs")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("options", nargs="*", help="run options of dacflnode topology, after"
                        " --: --dataset, --rounds, --threads, ...")
    args = parser.parse_args(argv)
    try:
        pods = read_pods()
        if args.check:
            current, diff = check(pods, args.out)
            if args.json:
                print(json.dumps({"configmap": str(args.out), "current": current, "diff": diff}))
            elif current:
                print(f"{args.out} is current ({pods.replicas} nodes)")
            else:
                print(f"{args.out} is stale: run deploy/k8s/peers.py again\n{diff}",
                      file=sys.stderr)
            return 0 if current else 1
        if args.certs is None:
            raise Refused("give the certificate folder: --certs DIR (see --help)")
        text = generate(pods, args.kind, args.options, args.certs)
        args.out.write_text(text)
    except Refused as exc:
        if args.json:
            print(json.dumps({"error": str(exc)}))
        else:
            print(f"error: {exc}", file=sys.stderr)
        return 2
    secret = secret_command(pods, args.certs)
    nodes = [{"id": f"node-{i}", "pod": f"{pods.statefulset}-{i}",
              "address": f"{pods.host(i)}:{pods.port}"} for i in range(pods.replicas)]
    if args.json:
        print(json.dumps({"configmap": str(args.out), "nodes": nodes,
                          "certs": str(args.certs.expanduser().absolute()),
                          "secret_command": secret}))
        return 0
    for node in nodes:
        print(f"{node['id']}  pod {node['pod']}  {node['address']}")
    print(f"wrote {args.out} ({pods.replicas} peers files, ConfigMap {pods.configmap})",
          file=sys.stderr)
    print(f"make the Secret (or replace it, see deploy/README.md):\n  {shlex.join(secret)}",
          file=sys.stderr)
    print("and the metrics token's, once (Prometheus scrapes with the same file):\n"
          "  (umask 077; openssl rand -hex 32 > metrics.token) && kubectl create secret generic"
          " dacflnode-metrics --from-file=token=metrics.token", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
