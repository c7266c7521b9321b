"""The feature agreement over real transports: every node ends with the scale of the exact
totals, bit for bit, and no node's own statistics are in anything another node receives."""

from __future__ import annotations

import asyncio
import struct

import numpy as np
import pytest

from dacflnode.algorithms import secure_sum
from dacflnode.learning.feature_scale import FeatureScale, LocalMoments
from dacflnode.protocol.scale_agreement import (
    SCALE_FILE,
    AgreementFailed,
    ScaleAgreement,
    scale_of,
)
from dacflnode.security.pair_keys import PairKeys
from dacflnode.wire.agreement import AgreeItem, AgreePhase
from tests.transport.test_protocol import Cluster

RING = {"a": ["b", "d"], "b": ["a", "c"], "c": ["b", "d"], "d": ["a", "c"]}
LINE = {"a": ["b"], "b": ["a", "c"], "c": ["b"]}


def rows(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.normal(10.0 * (seed + 1), 3.0, 40), rng.uniform(0, 255, 40)],
                    axis=1).astype(np.float32)


class Wire:
    """Every agreement reply a node receives, as the bytes that came over the wire."""

    def __init__(self) -> None:
        self.received: dict[str, list[bytes]] = {}

    def tap(self, node: str, transport) -> None:
        ask = transport.agree

        async def agree(peer, phase, have, timeout):
            items = await ask(peer, phase, have, timeout)
            self.received.setdefault(node, []).extend(i.payload for i in items)
            return items

        transport.agree = agree


@pytest.fixture(params=["memory", "grpc"])
async def cluster(request):
    c = Cluster(request.param)
    yield c
    await c.close()


async def agree_all(cluster, topology, method="standardize", wire=None, state=None):
    nodes = await cluster.build(topology)
    data = {n: rows(i) for i, n in enumerate(sorted(topology))}
    applied: dict[str, FeatureScale] = {}
    agreements = {}
    def keep(node: str):
        return lambda scale: applied.__setitem__(node, scale)

    for n, node in nodes.items():
        moments = LocalMoments.of(data[n], (0, 1))
        agreements[n] = ScaleAgreement(
            n, method, moments, keep(n), context=b"run-1",
            state_dir=None if state is None else state / n)
        if state is not None:
            (state / n).mkdir(parents=True, exist_ok=True)
        node.transport.serve_agreement(agreements[n].serve)
        if wire is not None:
            wire.tap(n, node.transport)
    scales = await asyncio.gather(*(agreements[n].settle(nodes[n].transport, topology[n], 30.0)
                                    for n in nodes))
    return data, dict(zip(nodes, scales, strict=True)), applied, agreements


async def test_every_node_ends_with_the_scale_of_the_exact_totals(cluster):
    data, scales, applied, _ = await agree_all(cluster, RING)
    expected = scale_of("standardize", [LocalMoments.of(data[n], (0, 1)) for n in sorted(data)])
    assert {s.to_json() for s in scales.values()} == {expected.to_json()}
    assert applied == scales
    union = np.concatenate(list(data.values())).astype(np.float64)
    assert expected.mean[0] == pytest.approx(union[:, 0].mean(), rel=1e-12)


async def test_a_line_with_a_leaf_agrees_too_and_minmax_takes_the_network_range(cluster):
    data, scales, _, _ = await agree_all(cluster, LINE, method="minmax")
    (scale,) = {s.to_json() for s in scales.values()}
    union = np.concatenate(list(data.values()))
    got = FeatureScale.from_json(scale)
    assert got.low == tuple(float(v) for v in union.min(axis=0))
    assert got.high == tuple(float(v) for v in union.max(axis=0))


def own_figures(x: np.ndarray) -> list[bytes]:
    """Every form a node's own mean or sums could take on the wire."""
    m = LocalMoments.of(x, (0, 1))
    out = []
    for j in range(2):
        mean = m.total[j] / m.count[j]
        out += [struct.pack("<d", mean), struct.pack("<f", mean), repr(mean).encode(),
                float(mean).hex().encode(), struct.pack("<d", m.total[j]),
                secure_sum.exact_int(m.total[j]).to_bytes(secure_sum.WIDTH, "little")]
    return out


async def test_no_node_receives_another_nodes_own_mean_or_sums(cluster):
    wire = Wire()
    data, _, _, _ = await agree_all(cluster, LINE, wire=wire)
    for receiver, payloads in wire.received.items():
        seen = b"".join(payloads)
        assert seen, receiver
        for other in data:
            if other != receiver:
                for figure in own_figures(data[other]):
                    assert figure not in seen, (receiver, other)


async def test_a_node_that_starts_after_the_agreement_asks_for_the_scale(cluster, tmp_path):
    _, scales, _, _ = await agree_all(cluster, LINE, state=tmp_path)
    assert (tmp_path / "a" / SCALE_FILE).read_text() == scales["a"].to_json()
    late = ScaleAgreement("a", "standardize", LocalMoments.of(rows(9), (0, 1)),
                          lambda s: None, context=b"run-1")
    got = await late.settle(cluster.nodes["a"].transport, ["b"], 10.0)
    assert got == scales["a"] and late.source == "asked"
    again = ScaleAgreement("c", "standardize", LocalMoments.of(rows(9), (0, 1)),
                           lambda s: None, context=b"run-1", state_dir=tmp_path / "c")
    assert await again.settle(cluster.nodes["c"].transport, ["b"], 10.0) == scales["c"]
    assert again.source == "saved"


async def test_a_missing_node_ends_the_agreement_with_a_clear_error():
    c = Cluster("memory")
    try:
        nodes = await c.build({"a": ["b"], "b": ["a", "c"]})  # c never starts
        agreements = {n: ScaleAgreement(n, "standardize", LocalMoments.of(rows(0), (0, 1)),
                                        lambda s: None, context=b"r") for n in nodes}
        for n, node in nodes.items():
            node.transport.serve_agreement(agreements[n].serve)
        with pytest.raises(AgreementFailed, match="nothing from c"):
            await asyncio.gather(agreements["a"].settle(nodes["a"].transport, ["b"], 1.0),
                                 agreements["b"].settle(nodes["b"].transport, ["a", "c"], 1.0))
    finally:
        await c.close()


async def test_an_item_of_the_wrong_size_is_not_kept():
    agreement = ScaleAgreement("a", "standardize", LocalMoments.of(rows(0), (0, 1)),
                               lambda s: None, context=b"r")
    agreement._take(AgreePhase.KEYS, AgreeItem("b", ("a",), b"short"), "b")
    assert agreement.serve("c", AgreePhase.KEYS, frozenset()) == []


async def test_a_forged_key_makes_the_agreement_fail_instead_of_a_wrong_scale():
    c = Cluster("memory")
    try:
        nodes = await c.build(LINE)
        agreements = {n: ScaleAgreement(n, "standardize", LocalMoments.of(rows(i), (0, 1)),
                                        lambda s: None, context=b"r")
                      for i, n in enumerate(nodes)}
        for n, node in nodes.items():
            node.transport.serve_agreement(agreements[n].serve)
        serve = agreements["b"].serve
        forged = PairKeys().public

        def relay(sender, phase, have):  # b hands c another key in a's name
            items = serve(sender, phase, have)
            return [AgreeItem(i.origin, i.members, forged)
                    if phase is AgreePhase.KEYS and i.origin == "a" else i for i in items]

        nodes["b"].transport.serve_agreement(relay)
        with pytest.raises(AgreementFailed, match="do not add up"):
            await asyncio.gather(*(agreements[n].settle(nodes[n].transport, LINE[n], 10.0)
                                   for n in nodes))
    finally:
        await c.close()


async def test_a_restart_takes_the_scale_its_checkpoint_holds_before_its_file():
    held = scale_of("standardize", [LocalMoments.of(rows(1), (0, 1))])
    applied: list[FeatureScale] = []
    agreement = ScaleAgreement("a", "standardize", LocalMoments.of(rows(2), (0, 1)),
                               applied.append, context=b"r", saved=held.to_json())
    c = Cluster("memory")
    try:
        nodes = await c.build({"a": ["b"]})  # b is down: a restart needs no neighbour
        assert await agreement.settle(nodes["a"].transport, ["b"], 1.0) == held
    finally:
        await c.close()
    assert applied == [held] and agreement.source == "saved"


async def test_a_saved_scale_of_other_settings_is_not_taken(tmp_path):
    other = scale_of("minmax", [LocalMoments.of(rows(1), (0, 1))])
    (tmp_path / SCALE_FILE).write_text(other.to_json())
    agreement = ScaleAgreement("a", "standardize", LocalMoments.of(rows(2), (0, 1)),
                               lambda s: None, context=b"r", state_dir=tmp_path)
    c = Cluster("memory")
    try:
        nodes = await c.build({"a": []})  # alone: it agrees with itself
        got = await agreement.settle(nodes["a"].transport, [], 5.0)
    finally:
        await c.close()
    assert got.method == "standardize" and agreement.source == "agreed"
    assert FeatureScale.from_json((tmp_path / SCALE_FILE).read_text()) == got
