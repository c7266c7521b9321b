"""Mutual TLS between neighbours and the token of the Control service, on real servers on
127.0.0.1 with certificates from :func:`dacflnode.security.certs.write_certs`.

bob serves with TLS; alice and carol are his neighbours. Every refusal must leave bob's inbox
as it was.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dacflnode._proto.dacfl.v1 import control_pb2, control_pb2_grpc, neighbor_pb2_grpc
from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode.security.certs import tls_files, write_certs
from dacflnode.security.tls import TlsMaterial
from dacflnode.transport import channels, grpc_control
from dacflnode.transport.base import HandshakeRefused, Identity, Inbox, PeerUnavailable
from dacflnode.transport.control_types import ControlAuth, NeighbourInfo, NodeStatus
from dacflnode.transport.grpc_control import (
    ControlUnauthenticated,
    add_control_service,
    control_interceptors,
    fetch_checkpoint,
    fetch_status,
    request_stop,
    status_from_proto,
    status_to_proto,
)
from dacflnode.transport.grpc_transport import GrpcTransport
from dacflnode.wire.errors import WireError
from tests.harness.messages import message

P = 16
TENSORS = {"omega": (P,), "x": (P,)}
MODEL, RUN = "model-fingerprint-1", "run-fingerprint-1"
TOKEN = "s3cret-control-token-0123456789"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The run's CA with alice, bob and carol; and another CA that also made an "alice"."""
    run, other = tmp_path_factory.mktemp("pki"), tmp_path_factory.mktemp("other-pki")
    write_certs(run, ["alice", "bob", "carol"])
    write_certs(other, ["alice"])
    return {"run": run, "other": other}


def material(pki: dict[str, Path], node_id: str, ca: str = "run") -> TlsMaterial:
    return tls_files(pki[ca], node_id).load()


@dataclass
class Bob:
    transport: GrpcTransport
    inbox: Inbox
    address: str


@pytest.fixture
async def bob(pki: dict[str, Path]):
    inbox = Inbox(senders={"alice", "carol"}, current_round=lambda: 0)
    transport = GrpcTransport(Identity("bob", MODEL, RUN), "127.0.0.1:0",
                              {"alice": "", "carol": ""}, inbox, TENSORS,
                              tls=material(pki, "bob"))
    await transport.start()
    yield Bob(transport, inbox, f"127.0.0.1:{transport.port}")
    await transport.stop(grace=0)


def client(name: str, bob: Bob, tls: TlsMaterial | None) -> GrpcTransport:
    """A node called ``name`` with bob as its neighbour, presenting ``tls``."""
    return GrpcTransport(Identity(name, MODEL, RUN), "127.0.0.1:0", {"bob": bob.address},
                         Inbox(senders={"bob"}, current_round=lambda: 0), TENSORS,
                         hello_call_timeout=3.0, tls=tls)


async def test_a_tls_neighbour_handshakes_and_its_push_reaches_the_inbox(pki, bob):
    alice = client("alice", bob, material(pki, "alice"))
    try:
        assert (await alice.hello("bob")).node_id == "bob"
        sent = message("alice")
        await alice.push("bob", sent, timeout=5.0)
    finally:
        await alice.stop(grace=0)
    got = bob.inbox.get(0)["alice"]
    assert torch.equal(got.tensors["x"], sent.tensors["x"])


async def test_a_plaintext_client_is_refused(bob):
    async with grpc.aio.insecure_channel(bob.address) as channel:
        stub = neighbor_pb2_grpc.NeighborStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Hello(pb.HelloRequest(node_id="alice"), timeout=3.0)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    plain = client("alice", bob, None)
    try:
        with pytest.raises(PeerUnavailable):
            await plain.push("bob", message("alice"), timeout=3.0)
    finally:
        await plain.stop(grace=0)
    assert bob.inbox.get(0) == {}


async def test_a_certificate_from_another_ca_is_refused(pki, bob):
    # it trusts bob's CA, so only bob's check of the client certificate can fail the handshake
    forged = material(pki, "alice", ca="other")
    mallory = client("alice", bob, TlsMaterial(material(pki, "bob").ca, forged.cert, forged.key))
    try:
        with pytest.raises(PeerUnavailable):
            await mallory.hello("bob")
        with pytest.raises(PeerUnavailable):
            await mallory.push("bob", message("alice"), timeout=3.0)
    finally:
        await mallory.stop(grace=0)
    assert bob.inbox.get(0) == {}


async def test_a_server_without_the_expected_id_in_its_certificate_is_refused(pki, bob):
    # alice thinks bob's address is carol's: bob's certificate does not name carol
    alice = GrpcTransport(Identity("alice", MODEL, RUN), "127.0.0.1:0", {"carol": bob.address},
                          Inbox(senders={"carol"}, current_round=lambda: 0), TENSORS,
                          hello_call_timeout=3.0, tls=material(pki, "alice"))
    try:
        with pytest.raises(PeerUnavailable):
            await alice.push("carol", message("alice"), timeout=3.0)
    finally:
        await alice.stop(grace=0)
    assert bob.inbox.get(0) == {}


async def test_a_valid_certificate_of_one_member_cannot_speak_as_another(pki, bob, caplog):
    # carol's own certificate, but every message says it comes from alice
    spoof = client("alice", bob, material(pki, "carol"))
    try:
        with caplog.at_level(logging.WARNING, logger="dacflnode.transport.receiver"):
            with pytest.raises(HandshakeRefused):
                await spoof.hello("bob")
            with pytest.raises(WireError) as err:
                await spoof.push("bob", message("alice"), timeout=5.0)
    finally:
        await spoof.stop(grace=0)
    assert err.value.code == "PERMISSION_DENIED"
    assert bob.inbox.get(0) == {}
    assert "refused" in caplog.text
    honest = client("carol", bob, material(pki, "carol"))  # the same certificate as itself
    try:
        await honest.push("bob", message("carol"), timeout=5.0)
    finally:
        await honest.stop(grace=0)
    assert set(bob.inbox.get(0)) == {"carol"}


async def test_a_member_cannot_pull_as_another_node(pki, bob):
    mine = message("bob")
    bob.transport.receiver.publish(mine, None)
    thief = client("alice", bob, material(pki, "carol"))  # carol asking for alice's copy
    try:
        with pytest.raises(WireError) as err:
            await thief.pull("bob", 0, timeout=5.0)
    finally:
        await thief.stop(grace=0)
    assert err.value.code == "PERMISSION_DENIED"
    carol = client("carol", bob, material(pki, "carol"))
    try:
        got = await carol.pull("bob", 0, timeout=5.0)
    finally:
        await carol.stop(grace=0)
    assert torch.equal(got.tensors["omega"], mine.tensors["omega"])


class Provider:
    def __init__(self) -> None:
        self.stopped = False
        self.drained = False
        self.checkpoint: bytes | None = None

    def status(self) -> NodeStatus:
        return NodeStatus("bob", "dacfl", 3, 10, "training", tls=True)

    def metrics(self, fmt: str) -> tuple[str, str]:
        return "application/json", "{}"

    def stop(self, drain: bool = False) -> None:
        self.stopped = True
        self.drained = drain

    async def checkpoint_bytes(self) -> bytes | None:
        return self.checkpoint


async def serve_control(tls: TlsMaterial | None, token: str | None
                        ) -> tuple[grpc.aio.Server, Provider, str]:
    provider = Provider()
    server = channels.create_server(interceptors=control_interceptors(token))
    add_control_service(server, provider)
    port = channels.bind(server, "127.0.0.1:0", tls, require_client_auth=False)
    await server.start()
    return server, provider, f"127.0.0.1:{port}"


async def test_a_control_call_without_its_token_is_unauthenticated(caplog):
    server, provider, address = await serve_control(None, TOKEN)
    try:
        with caplog.at_level(logging.WARNING, logger="dacflnode.transport.grpc_control"):
            with pytest.raises(ControlUnauthenticated) as missing:
                await request_stop(address)
            with pytest.raises(ControlUnauthenticated) as wrong:
                await request_stop(address, auth=ControlAuth(token=TOKEN + "x"))
        assert not missing.value.token_sent and wrong.value.token_sent
        assert "wants a control token" in str(missing.value)
        assert not provider.stopped
        assert "refused: missing or wrong token" in caplog.text
        async with grpc.aio.insecure_channel(address) as channel:
            stub = control_pb2_grpc.ControlStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as raw:
                await stub.Status(control_pb2.StatusRequest(), timeout=3.0,
                                  metadata=(("authorization", f"Basic {TOKEN}"),))
        assert raw.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert await request_stop(address, auth=ControlAuth(token=TOKEN))
        assert provider.stopped
    finally:
        await server.stop(0)


async def test_an_exposed_control_service_speaks_tls_and_wants_no_client_certificate(pki):
    bob_tls = material(pki, "bob")
    server, _, address = await serve_control(bob_tls, TOKEN)
    try:
        auth = ControlAuth(token=TOKEN, ca=bob_tls.ca, server_name="bob")
        status = await fetch_status(address, auth=auth)
        assert status.node_id == "bob" and status.tls
        with pytest.raises(PeerUnavailable):  # plaintext on a TLS port
            await fetch_status(address, timeout=3.0, auth=ControlAuth(token=TOKEN))
        with pytest.raises(PeerUnavailable):  # a certificate that does not name "carol"
            await fetch_status(address, timeout=3.0,
                               auth=ControlAuth(token=TOKEN, ca=bob_tls.ca, server_name="carol"))
        with pytest.raises(ControlUnauthenticated):  # TLS is no substitute for the token
            await fetch_status(address, auth=ControlAuth(ca=bob_tls.ca, server_name="bob"))
    finally:
        await server.stop(0)


def test_status_carries_whether_neighbours_are_authenticated():
    for tls in (True, False):
        status = NodeStatus("n", "dacfl", 1, 2, "done", tls=tls)
        assert status_from_proto(status_to_proto(status)).tls is tls
        assert status.to_json()["tls"] is tls


def test_status_carries_the_fault_counters_of_each_neighbour():
    status = NodeStatus(
        "n", "dacfl", 7, 9, "exchanging",
        neighbours=[NeighbourInfo("m", "127.0.0.1:1", True, 6, 10, 20, 1.5, state="gone",
                                  missed_rounds=4, late_states=2, refused=3, corrections=1)],
        anchors=[12, 15], reanchored=2, leaving=True, last_accuracy=0.5, last_loss=1.0,
        consensus_residual=0.1)
    back = status_from_proto(status_to_proto(status))
    assert back == status
    assert back.to_json()["neighbours"][0]["missed_rounds"] == 4


async def test_stop_with_drain_reaches_the_node():
    server, provider, address = await serve_control(None, TOKEN)
    try:
        assert await request_stop(address, auth=ControlAuth(token=TOKEN))
        assert provider.stopped and not provider.drained
        assert await request_stop(address, auth=ControlAuth(token=TOKEN), drain=True)
        assert provider.drained
    finally:
        await server.stop(0)


async def test_the_checkpoint_streams_in_chunks_and_wants_the_token(monkeypatch):
    monkeypatch.setattr(grpc_control, "CHECKPOINT_CHUNK_BYTES", 10)
    server, provider, address = await serve_control(None, TOKEN)
    auth = ControlAuth(token=TOKEN)
    try:
        assert await fetch_checkpoint(address, auth=auth) is None  # none written yet
        provider.checkpoint = bytes(range(35))
        assert await fetch_checkpoint(address, auth=auth) == bytes(range(35))
        async with grpc.aio.insecure_channel(address) as channel:
            stub = control_pb2_grpc.ControlStub(channel)
            chunks = [c.data async for c in stub.Checkpoint(
                control_pb2.CheckpointRequest(), timeout=3.0,
                metadata=(("authorization", f"Bearer {TOKEN}"),))]
            assert [len(c) for c in chunks] == [10, 10, 10, 5]
            with pytest.raises(grpc.aio.AioRpcError) as raw:  # a streaming call is refused too
                _ = [c async for c in stub.Checkpoint(control_pb2.CheckpointRequest(),
                                                      timeout=3.0)]
        assert raw.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(ControlUnauthenticated):
            await fetch_checkpoint(address, auth=ControlAuth(token=TOKEN + "x"))
    finally:
        await server.stop(0)


async def test_the_health_port_answers_a_plaintext_probe_and_serves_nothing_else(pki):
    inbox = Inbox(senders={"alice"}, current_round=lambda: 0)
    node = GrpcTransport(Identity("bob", MODEL, RUN), "127.0.0.1:0", {"alice": ""}, inbox,
                         TENSORS, tls=material(pki, "bob"), health_listen="127.0.0.1:0")
    await node.start()
    probe_address = f"127.0.0.1:{node.health_port}"
    try:
        async with grpc.aio.insecure_channel(probe_address) as channel:
            health: Any = health_pb2_grpc.HealthStub(channel)  # no async types shipped
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=3.0)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await neighbor_pb2_grpc.NeighborStub(channel).Hello(
                    pb.HelloRequest(node_id="alice"), timeout=3.0)
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await node.stop(grace=0)
    async with grpc.aio.insecure_channel(probe_address) as channel:
        stopped: Any = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.aio.AioRpcError):
            await stopped.Check(
                health_pb2.HealthCheckRequest(service=""), timeout=2.0)
