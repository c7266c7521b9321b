"""The order of a node's steps: the synchronous schedule (docs/algorithm.md).

A round is five steps, each a component of its own with its own state (the node runner holds
them and exposes each step as a method of :class:`RoundSteps`):

1. *exchange* (:mod:`dacflnode.protocol.exchange`, and the
   :mod:`~dacflnode.protocol.copybook`'s usable senders);
2. *mix* (:mod:`dacflnode.protocol.mix`);
3. *train* (the :class:`~dacflnode.protocol.training.NodeTrainer`);
4. *complete*: :meth:`Algorithm.complete <dacflnode.algorithms.rounds.Algorithm.complete>` and
   what the round's messages settled (FODAC's update, the fold of one-sided uses);
5. *record*: evaluation, the round's report, its metrics line and checkpoint
   (:mod:`dacflnode.protocol.outputs`).

A closing exchange (after the last round, or before leaving) is an exchange and a fold, without
mixing or training. :class:`SyncSchedule` runs the steps of a round one after the other, each
round after the one before: the schedule of DACFL as the paper states it. What the steps hand
each other is a :class:`RoundWork`, so another schedule (an asynchronous one, overlapping one
round's training with the next exchange) orders the same steps without changing them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from dacflnode.algorithms.rounds import Prepared
from dacflnode.learning.train import TrainResult
from dacflnode.protocol.edges import Absorbed
from dacflnode.protocol.exchange import Exchanged
from dacflnode.protocol.setup import RoundReport
from dacflnode.wire.message import Kind, RoundMessage


@dataclass
class RoundWork:
    """One exchange's round, as the steps fill it in."""

    round: int
    kind: Kind
    #: when the round began, on the node's clock (:func:`~dacflnode.protocol.clock.now`:
    #: virtual seconds in a virtual-time simulation)
    started: float
    #: the neighbours mixed in the round, and those whose handover was due
    active: list[str]
    handovers: Sequence[str]
    #: this node's message of the round
    message: RoundMessage
    exchanged: Exchanged
    #: the senders whose message can be mixed (in a compressed run: their copy matches it)
    usable: set[str]
    #: what the round's messages settled (one-sided uses, anchors, leaves, handovers)
    absorbed: Absorbed
    # filled in by the mix and train steps
    used: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    prepared: Prepared | None = None
    trained: TrainResult | None = None
    exchange_s: float = 0.0
    train_s: float = 0.0


class RoundSteps(Protocol):
    """The steps a schedule orders (the node runner implements them)."""

    async def exchange(self, t: int, kind: Kind = Kind.STATE,
                       skip: Collection[str] = ()) -> RoundWork:
        """Round ``t``'s exchange of messages of ``kind`` (not with ``skip``)."""
        ...

    async def mix(self, work: RoundWork) -> None: ...

    async def train(self, work: RoundWork) -> None: ...

    async def complete(self, work: RoundWork) -> None: ...

    async def record(self, work: RoundWork) -> RoundReport: ...

    async def fold(self, work: RoundWork) -> list[str]:
        """Close an exchange that mixes nothing; returns the neighbours heard from."""
        ...


class SyncSchedule:
    """Each round's steps in order, one round after the other."""

    async def round(self, steps: RoundSteps, t: int) -> RoundReport:
        """Round ``t``: exchange → mix → train → complete → record."""
        work = await steps.exchange(t)
        await steps.mix(work)
        await steps.train(work)
        await steps.complete(work)
        return await steps.record(work)

    async def closing(self, steps: RoundSteps, t: int, kind: Kind,
                      skip: Collection[str] = ()) -> list[str]:
        """A closing exchange of round ``t`` (``kind`` ``FINAL`` or ``LEAVING``): exchange →
        fold. Returns the neighbours heard from."""
        return await steps.fold(await steps.exchange(t, kind, skip))
