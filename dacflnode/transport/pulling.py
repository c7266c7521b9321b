"""What a node accepts when it pulls a neighbour's state, shared by both transports.

A pull asks one neighbour for the state it published for one round; the answer must be that
neighbour's state for exactly that round, with this node's tensor set, and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping

from dacflnode.wire.codec import Decoder, Expectation
from dacflnode.wire.errors import Reason, Refusal


def pull_expectation(
    peer: str, round_: int, tensors: Mapping[str, tuple[int, ...]]
) -> Expectation:
    """Accept only ``peer``'s state for ``round_`` with the tensors ``tensors``."""

    def only(r: int) -> Refusal | None:
        if r == round_:
            return None
        return Refusal(Reason.BAD_HEADER, f"round {round_} was asked for", "INVALID_ARGUMENT")

    return Expectation(senders={peer}, tensors=tensors, accept_round=only)


def pull_decoder(peer: str, round_: int, tensors: Mapping[str, tuple[int, ...]]) -> Decoder:
    """A decoder that accepts only ``peer``'s state for ``round_``."""
    return Decoder(pull_expectation(peer, round_, tensors))
