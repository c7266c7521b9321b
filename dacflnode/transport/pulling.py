"""What a node accepts when it pulls a neighbour's state, for both transports (see
:meth:`~dacflnode.transport.base.Transport.pull`).

A pull asks one neighbour for the state it published for one round; the answer must be that
neighbour's state for exactly that round, with this node's tensor set (full, or compressed in a
compressed run), and nothing else. A copy pull (``copy_id`` not 0) asks for the neighbour's
public copy of that id instead: the answer must carry that id in ``copy_next`` and the full
float32 tensors, whatever its round.
"""

from __future__ import annotations

from collections.abc import Mapping

from dacflnode.wire.errors import Reason, Refusal
from dacflnode.wire.validation import CompressedSpec, Expectation


def pull_expectation(
    peer: str, round_: int, tensors: Mapping[str, tuple[int, ...]],
    compressed: CompressedSpec | None = None, copy_id: int = 0,
) -> Expectation:
    """Accept only ``peer``'s state for ``round_`` with the tensors ``tensors`` (or
    ``compressed``), or, for a copy pull, only ``peer``'s copy ``copy_id`` in full."""
    if copy_id:
        return Expectation(senders={peer}, tensors=tensors, copy_next=copy_id)

    def only(r: int) -> Refusal | None:
        if r == round_:
            return None
        return Refusal(Reason.BAD_HEADER, f"round {round_} was asked for", "INVALID_ARGUMENT")

    return Expectation(senders={peer}, tensors=tensors, accept_round=only,
                       compressed=compressed)

