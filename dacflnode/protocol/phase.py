"""The phases a node goes through: what ``dacflnode status`` shows and ``dacfl_phase{phase}``
exposes (docs/operations.md).

The runner sets every phase but ``failed``, which the daemon sets when the node cannot go on.
A phase is a :class:`str`: it compares equal to, and serialises as, its text.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """One phase of a node, in the order a run goes through them (the exposition's order)."""

    STARTING = "starting"
    WAITING_FOR_PEERS = "waiting-for-peers"
    AGREEING = "agreeing"  # a table run's feature scale (docs/data.md), before the first round
    JOINING = "joining"
    EXCHANGING = "exchanging"
    TRAINING = "training"
    EVALUATING = "evaluating"
    CLOSING = "closing"
    LEAVING = "leaving"
    DONE = "done"
    STOPPED = "stopped"
    LEFT = "left"
    FAILED = "failed"
