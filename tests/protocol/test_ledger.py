"""The one-sided-use ledger and the edge book on their own: what a header settles, what a
checkpoint keeps, how a Hello proposal is answered."""

from __future__ import annotations

from pathlib import Path

import torch

from dacflnode.algorithms.rounds import NodeState
from dacflnode.protocol.edges import EdgeBook
from dacflnode.protocol.ledger import Ledger
from dacflnode.records.checkpoint import read_checkpoint, save_checkpoint
from dacflnode.records.membership import PeerState
from dacflnode.wire.message import Kind, RoundMessage


def msg(sender: str, round_: int, log_: tuple[tuple[int, tuple[str, ...]], ...],
        kind: Kind = Kind.STATE, x: torch.Tensor | None = None) -> RoundMessage:
    x = torch.zeros(3) if x is None else x
    return RoundMessage(sender, round_, 2, {"x": x, "omega": x}, log_, kind)


def test_a_use_the_other_end_confirms_is_dropped_and_one_it_denies_is_returned_to_undo():
    ledger = Ledger()
    mine = torch.tensor([1.0, 1.0, 1.0])
    theirs = {"b": torch.tensor([3.0, 1.0, 1.0]), "c": torch.tensor([1.0, 5.0, 1.0])}
    ledger.record(4, "a", {"a": 0.5, "b": 0.25, "c": 0.25}, theirs, mine)
    assert len(ledger) == 2
    confirmed = ledger.resolve("a", msg("b", 5, ((4, ("a",)),)))
    assert (confirmed.subtract, confirmed.confirmed) == ([], 1)
    denied = ledger.resolve("a", msg("c", 5, ((4, ("d",)),)))
    assert len(denied.subtract) == 1
    key, vector = denied.subtract[0]
    assert key == (4, "c") and torch.equal(vector, torch.tensor([0.0, 1.0, 0.0]))
    assert len(ledger) == 0


def test_a_later_header_that_no_longer_covers_the_round_gives_the_use_up():
    ledger = Ledger()
    ledger.record(4, "a", {"b": 0.5}, {"b": torch.ones(3)}, torch.zeros(3))
    assert ledger.resolve("a", msg("b", 4, ())).uncovered == []  # its own round: not yet
    settled = ledger.resolve("a", msg("b", 9, ((7, ()), (8, ()))))
    assert (settled.subtract, settled.uncovered) == ([], [(4, "b")])


def test_pending_uses_survive_a_checkpoint_and_settle_after_the_restart(tmp_path: Path):
    book = EdgeBook("a", ["b", "c"], gone_after=2)
    book.record_round(4, ["b", "c"], {"a": 0.5, "b": 0.25, "c": 0.25},
                      {"b": torch.full((3,), 3.0), "c": torch.ones(3)}, torch.ones(3))
    book.peers["c"].missed = 2
    anchor = book.propose_anchor(4)
    state = NodeState(5, torch.ones(3), torch.ones(3), torch.ones(3))
    save_checkpoint(tmp_path, state, {}, {"node": "a"}, tracked="omega_prev",
                    **book.checkpoint_fields())
    ckpt = read_checkpoint(tmp_path / "checkpoint.safetensors")
    again = EdgeBook("a", ["b", "c"], gone_after=2, peers=ckpt.peers,
                     ledger=Ledger.from_tensors(ckpt.pending), used_log=ckpt.used_log,
                     anchors=ckpt.anchors, round_=ckpt.state.round)
    assert again.anchors == {anchor} and again.peers["c"].missed == 2
    assert again.header(5)[0] == ((4, ("b", "c")),)
    absorbed = again.absorb(5, {"b": msg("b", 5, ((4, ()),))})
    assert absorbed.corrections == 1 and absorbed.adjust is not None
    assert torch.equal(absorbed.adjust, torch.full((3,), -0.5))


def test_a_hello_without_a_proposal_changes_nothing_and_a_proposal_is_agreed_once():
    book = EdgeBook("a", ["b"])

    def state() -> PeerState:
        return book.peers["b"].state

    assert book.on_join("b", 0, current=7) == 0  # mixed as always
    book.peers["b"].state = PeerState.GONE
    assert book.on_join("b", 0, current=7) == 8  # a counter-proposal only
    assert state() is PeerState.GONE
    assert book.on_join("b", 5, current=7) == 8  # never a round this node is already in
    assert state() is PeerState.ACTIVE and book.peers["b"].active_from == 8
    assert not book.peers["b"].mixes_in(7) and book.peers["b"].mixes_in(8)
    assert book.on_join("b", 0, current=7) == 8  # the agreed round, until it is reached


def test_a_share_handed_over_in_an_anchor_round_is_not_added():
    book = EdgeBook("a", ["b"])
    book.anchors.add(6)
    book.anchored(6)
    absorbed = book.absorb(6, {"b": msg("b", 6, (), Kind.HANDOVER, torch.ones(3))})
    assert absorbed.adjust is None and book.peers["b"].state is PeerState.LEFT


def test_an_anchor_heard_too_late_makes_the_node_propose_a_new_one():
    book = EdgeBook("a", ["b"], anchor_delay=4)
    book.absorb(9, {"b": RoundMessage("b", 9, 1, {"x": torch.zeros(3)}, (), Kind.STATE, (8,))})
    assert book.anchors == {14}
    book.absorb(10, {"b": RoundMessage("b", 10, 1, {"x": torch.zeros(3)}, (), Kind.STATE,
                                       (8, 14))})
    assert book.anchors == {14}  # the late one is proposed for only once
