"""The copy book: one interface for full states and for CHOCO's public copies."""

from __future__ import annotations

import asyncio

import torch

from dacflnode.protocol.copies import compression_for
from dacflnode.protocol.copybook import CopyUpdates, FullStates
from dacflnode.transport.memory import MemoryNetwork
from dacflnode.wire.message import Kind, RoundMessage
from tests.protocol.test_runner import make_runner


def test_full_states_are_mixed_as_they_came_and_the_guard_follows_the_pushed_state() -> None:
    a = make_runner(MemoryNetwork(), "a", ["b"])
    book = a.book
    assert isinstance(book, FullStates) and book.guard is not None and book.copy_of is None
    own = asyncio.run(book.message(0, 1, Kind.STATE, a.state, (), ()))
    assert book.reference is own.tensors
    closing = asyncio.run(book.message(1, 1, Kind.FINAL, a.state, (), ()))
    assert book.reference is own.tensors  # a closing message is not what states are judged by
    theirs = RoundMessage("b", 0, 1, {k: v + 1 for k, v in own.tensors.items()})
    given = book.mix_input({"b": theirs}, own)
    assert given.copies is None and given.scale == 1.0
    assert given.neighbours == {"b": theirs.tensors}
    assert given.theirs["b"] is theirs.tensors["x"] and given.mine is own.tensors["x"]
    assert closing.kind is Kind.FINAL


def test_public_copies_are_mixed_with_chocos_step_and_served_by_id() -> None:
    a = make_runner(MemoryNetwork(), "a", ["b"], compression=compression_for("int8", 0.5, 0))
    book = a.book
    assert isinstance(book, CopyUpdates) and a.copies is book.copies
    assert a.transport.inbox.copy_of is not None
    own = asyncio.run(book.message(0, 1, Kind.STATE, a.state, (), ()))
    served = a.transport.inbox.copy_of(own.copy_next)
    assert served is not None and served.copy_next == own.copy_next
    given = book.mix_input({}, own)
    assert given.scale == 0.5 and given.neighbours == {} and given.copies is not None
    assert torch.equal(given.copies["a"]["x"], book.copies.own["x"])  # type: ignore[union-attr]
