"""The public copies of a compressed run: both ends of an edge hold the same bits, a copy that
is not an update's base is refused, and a pulled copy must be the one its id names."""

import pytest
import torch

from dacflnode.protocol.copies import KEEP, PublicCopies, compression_for, copy_id, wire_parts
from dacflnode.wire.message import RoundMessage

FIELDS = ("omega", "x")
N = 5000


def start(node, neighbours, spec="int8", initial=None, shared=True):
    compression = compression_for(spec, None, seed=7)
    assert compression is not None
    initial = initial or {f: torch.zeros(N) for f in FIELDS}
    return PublicCopies(node, neighbours, FIELDS, compression, initial, shared)


def send(copies, round_, state):
    parts, update = copies.encode(round_, state)
    base = copies.own_id
    copies.commit(update)
    return RoundMessage(copies.node, round_, 1, parts, copy_base=base, copy_next=update.id)


@pytest.mark.parametrize("spec", ["fp16", "bf16", "int8", "topk:0.05", "randk:0.05"])
def test_both_ends_hold_the_same_bits_round_after_round(spec):
    a, b = start("a", ["b"], spec), start("b", ["a"], spec)
    gen = torch.Generator().manual_seed(1)
    for t in range(6):
        state = {f: torch.randn(N, generator=gen) for f in FIELDS}
        message = send(a, t, state)
        assert set(message.tensors) == set(wire_parts(a.compression, FIELDS, N))
        assert b.applies(message)
        b.commit(b.decode(message))
        held_id, held = b.theirs["a"]
        assert held_id == a.own_id == copy_id(held, FIELDS)
        for f in FIELDS:
            assert torch.equal(held[f], a.own[f])


def test_a_missed_update_leaves_the_copy_behind_and_a_pulled_copy_catches_up():
    a, b = start("a", ["b"]), start("b", ["a"])
    gen = torch.Generator().manual_seed(2)
    send(a, 0, {f: torch.randn(N, generator=gen) for f in FIELDS})  # b never gets it
    message = send(a, 1, {f: torch.randn(N, generator=gen) for f in FIELDS})
    assert not b.applies(message)
    full = a.served(message.copy_next)
    assert full is not None
    b.commit(b.adopt("a", message.copy_next, full))
    assert b.at("a", message.copy_next)
    with pytest.raises(ValueError, match="hashes to"):
        b.adopt("a", message.copy_next, {f: full[f] + 1 for f in FIELDS})


def test_a_node_keeps_its_last_copies_for_pulls_and_no_more():
    a = start("a", [])
    ids = [a.own_id]
    for t in range(KEEP + 2):
        ids.append(send(a, t, {f: torch.full((N,), float(t + 1)) for f in FIELDS}).copy_next)
    assert all(a.served(i) is not None for i in ids[-KEEP:])
    assert all(a.served(i) is None for i in ids[:-KEEP])


def test_a_restarted_node_starts_a_new_lineage_and_holds_no_neighbour_copy():
    state = {f: torch.ones(N) for f in FIELDS}
    fresh = start("a", ["b"], shared=True)
    restarted = start("a", ["b"], initial=state, shared=False)
    assert restarted.theirs == {} and "b" in fresh.theirs
    assert restarted.own_id != fresh.own_id


def test_a_hostile_update_is_refused():
    a, b = start("a", ["b"], "topk:0.05"), start("b", ["a"], "topk:0.05")
    message = send(a, 0, {f: torch.randn(N) for f in FIELDS})
    bad = dict(message.tensors)
    bad["x.indices"] = torch.full_like(bad["x.indices"], N + 5)
    hostile = RoundMessage("a", 0, 1, bad, copy_base=message.copy_base,
                           copy_next=message.copy_next)
    with pytest.raises(ValueError):
        b.decode(hostile)
