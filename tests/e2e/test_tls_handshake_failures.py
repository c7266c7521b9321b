"""A real TLS daemon probed by clients that fail the handshake: each failure is counted under its
reason in ``status`` and ``/metrics`` (``dacfl_tls_handshake_failures_total``), and logged as
the node's own rate-limited WARNING line instead of gRPC core's raw line. The daemon's
neighbour never starts, so it serves while it waits; the test stops it through Control."""

from __future__ import annotations

import asyncio
import datetime
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from dacflnode.cluster.launcher import free_ports
from dacflnode.peers.file import load_peers
from dacflnode.peers.generate import generate_cluster
from dacflnode.security.certs import tls_files, write_certs
from dacflnode.security.tls import TlsMaterial
from dacflnode.transport import channels
from dacflnode.transport.control_types import NodeStatus
from dacflnode.transport.grpc_control import fetch_metrics, fetch_status, request_stop
from tests.harness.cluster import TINY, control_of, start_node
from tests.harness.polling import until

pytestmark = pytest.mark.slow

DEADLINE_S = 60.0


def expired_certificate(certs: Path, node_id: str) -> tuple[bytes, bytes]:
    """A certificate (PEM) and key for ``node_id`` signed by the CA in ``certs``, which expired
    yesterday."""
    ca_cert = x509.load_pem_x509_certificate((certs / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((certs / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    good = x509.load_pem_x509_certificate(tls_files(certs, node_id).cert.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(good.subject)
               .issuer_name(ca_cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(days=10))
               .not_valid_after(now - datetime.timedelta(days=1)))
    for ext in good.extensions:
        if not isinstance(ext.value, x509.SubjectKeyIdentifier):
            builder = builder.add_extension(ext.value, ext.critical)
    cert = builder.sign(ca_key, hashes.SHA256())
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


async def handshake(address: str, channel: grpc.aio.Channel) -> None:
    """Try to connect once (the channel retries within the second: one or more failures)."""
    try:
        await asyncio.wait_for(channel.channel_ready(), 1.0)
    except TimeoutError:
        pass
    finally:
        await channel.close()


def counted(reason: str) -> Callable[[NodeStatus], bool]:
    """Whether a status counts a failed TLS handshake of ``reason``."""
    return lambda s: s.tls_handshake_failures.get(reason, 0) > 0


async def wait_for(peers: Path, check: Callable[[NodeStatus], bool], what: str) -> NodeStatus:
    """The node's status once ``check`` holds for it."""
    last: list[NodeStatus | None] = [None]

    async def checked() -> NodeStatus | None:
        try:  # the token is read anew: the node writes it as it starts
            control, auth = control_of(peers)
            last[0] = await fetch_status(control, timeout=2.0, auth=auth)
        except Exception:  # not serving yet
            last[0] = None
        return last[0] if last[0] is not None and check(last[0]) else None

    return await until(checked, DEADLINE_S, interval=0.2,
                       what=lambda: f"{what}; last status {last[0]}")


async def test_failed_handshakes_are_counted_by_reason_and_logged_by_the_node(tmp_path):
    certs, other = tmp_path / "certs", tmp_path / "other"
    ports = free_ports(4)
    cfg = replace(TINY, nodes=2, rounds=2)
    path = generate_cluster("complete", 2, cfg, tmp_path / "peers", ports=ports[:2],
                            control_ports=ports[2:], state_root=tmp_path, hello_timeout=60,
                            tls_dir=certs)[0]
    write_certs(other, ["node-1"])
    pf = load_peers(path)
    address = pf.node.listen
    member = tls_files(certs, "node-1").load()
    stranger = tls_files(other, "node-1").load()
    exp_cert, exp_key = expired_certificate(certs, "node-1")
    attacks = {  # reason: a channel whose handshake the node refuses for that reason
        "plaintext": lambda: grpc.aio.insecure_channel(address),
        "unknown-ca": lambda: channels.create_channel(
            address, TlsMaterial(member.ca, stranger.cert, stranger.key), "node-0"),
        "no-certificate": lambda: channels.create_channel(address, None, "node-0",
                                                          ca=member.ca),
        "bad-certificate": lambda: channels.create_channel(
            address, TlsMaterial(member.ca, exp_cert, exp_key), "node-0"),
    }
    err = tmp_path / "stderr.txt"
    proc = start_node(path, stderr=err)

    async def probe() -> tuple[NodeStatus, str]:
        await wait_for(path, lambda s: s.phase == "waiting-for-peers", "serving")
        for reason, make in attacks.items():
            await handshake(address, make())
            await wait_for(path, counted(reason), f"a {reason} failure counted")
        # a member's own certificate still gets through, and is not counted
        good = channels.create_channel(address, member, "node-0")
        await asyncio.wait_for(good.channel_ready(), 10.0)
        await good.close()
        control, auth = control_of(path)
        status = await fetch_status(control, auth=auth)
        text = await fetch_metrics(control, "prometheus", auth=auth)
        assert await request_stop(control, auth=auth)
        return status, text

    try:
        status, prometheus = await probe()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    counts = status.tls_handshake_failures
    assert set(counts) == {"plaintext", "unknown-ca", "bad-certificate", "no-certificate",
                           "other"}
    assert counts["other"] == 0 and all(counts[r] >= 1 for r in attacks), counts
    for reason in attacks:
        found = re.search(rf'^dacfl_tls_handshake_failures_total{{node="node-0",'
                          rf'reason="{reason}"}} (\S+)$', prometheus, re.M)
        assert found is not None and float(found.group(1)) >= 1, prometheus
    logged = err.read_text()
    assert "Handshake failed with error" not in logged  # gRPC's raw line is replaced ...
    log = (pf.node.state_dir / "daemon.log").read_text()
    for reason in attacks:  # ... by the node's own line, on stderr and in daemon.log
        line = f"WARNING dacflnode.daemon.service: node-0: TLS handshake failed ({reason})"
        assert line in logged and line in log, logged
