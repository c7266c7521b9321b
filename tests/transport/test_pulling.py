"""What a pull accepts: one neighbour's state for exactly the round asked for."""

from __future__ import annotations

import pytest
import torch

from dacflnode.transport.pulling import pull_expectation
from dacflnode.wire.decoder import Decoder
from dacflnode.wire.encoder import encode
from dacflnode.wire.errors import Reason, WireError
from dacflnode.wire.message import RoundMessage

TENSORS = {"x": (8,)}


def state(sender: str, round_: int) -> RoundMessage:
    return RoundMessage(sender, round_, 1, {"x": torch.arange(8, dtype=torch.float32)})


def test_the_state_asked_for_is_accepted() -> None:
    decoder = Decoder(pull_expectation("a", 3, TENSORS))
    for chunk in encode(state("a", 3)):
        decoder.take(chunk)
    assert decoder.finish().round == 3


@pytest.mark.parametrize(
    ("sent", "code", "reason"),
    [(state("a", 2), "INVALID_ARGUMENT", Reason.BAD_HEADER),
     (state("b", 3), "PERMISSION_DENIED", Reason.UNKNOWN_SENDER)],
    ids=["another round", "another sender"],
)
def test_another_round_or_sender_is_refused_at_the_header(
    sent: RoundMessage, code: str, reason: Reason
) -> None:
    decoder = Decoder(pull_expectation("a", 3, TENSORS))
    with pytest.raises(WireError) as err:
        decoder.take(next(encode(sent)))
    assert (err.value.code, err.value.reason) == (code, reason)
