"""The Control service's status message: every field of a status crosses it."""

from __future__ import annotations

import dataclasses

from dacflnode._proto.dacfl.v1 import control_pb2 as pb
from dacflnode.transport.control_types import NeighbourInfo, NodeStatus
from dacflnode.transport.grpc_control import status_from_proto, status_to_proto


def busy_status() -> NodeStatus:
    """A status in which every field the reply carries differs from its default."""
    neighbour = NeighbourInfo(
        "n1", "10.0.0.2:7000", connected=True, last_round_received=6, bytes_received=11,
        bytes_sent=12, latency_ms=1.5, state="quarantined", missed_rounds=2, late_states=3,
        refused=4, corrections=5, refused_states=6, exchanges=7)
    return NodeStatus(
        "n0", "dacfl", 7, 10, "training",
        neighbours=[neighbour, NeighbourInfo("n2", "x:1", latency_ms=2.0)],
        last_accuracy=0.5, last_loss=0.25, consensus_residual=0.125, device="cpu",
        uptime_s=3.5, listen_address="0.0.0.0:7000", tls=True, refusals={"non-finite": 2},
        anchors=[12, 20], reanchored=1, leaving=True, data_size=40, test_size=8,
        class_counts={"cat": 30, "dog": 10}, skipped_files=2, alone_rounds=3,
        tls_handshake_failures={"plaintext": 1}, quarantines=1, refused_states=9,
        schedule="async", waited_s=4.5, ahead_of=["n2"], feature_scale='{"method":"none"}')


def test_every_field_of_a_status_comes_back_from_the_control_service_as_it_was_sent():
    status = busy_status()
    back = status_from_proto(pb.StatusReply.FromString(
        status_to_proto(status).SerializeToString()))
    assert back == status
    assert type(back.anchors) is list and type(back.refusals) is dict


def test_every_field_of_the_reply_is_filled_from_the_status():
    reply = status_to_proto(busy_status())
    for message in (reply, reply.neighbours[0]):
        unset = [f.name for f in message.DESCRIPTOR.fields
                 if f.name not in {s.name for s, _ in message.ListFields()}]
        assert unset == []


def test_what_the_reply_does_not_carry_comes_back_as_its_default():
    status = busy_status()
    status.neighbours[0].messages_received = 5
    back = status_from_proto(status_to_proto(status))
    assert back.neighbours[0] == dataclasses.replace(status.neighbours[0], messages_received=0)
