"""What a node sends and mixes: its full states, or CHOCO's public copies (docs/compression.md).

One interface, :class:`CopyBook`, with two strategies, chosen once when the node is built
(:func:`make_copy_book`):

* :class:`FullStates`: the node pushes :meth:`Algorithm.outgoing
  <dacflnode.algorithms.rounds.Algorithm.outgoing>` of its state and mixes its neighbours'
  states as they came; the inbox's guard measures a state against the node's own latest one.
* :class:`CopyUpdates`: the node pushes the compressed update of its public copy (committed as
  it is made), applies each neighbour's update to its copy of that neighbour, or pulls the full
  copy by id when its copy is not the one the update was made for, and mixes the copies with
  CHOCO's step ``γ`` (which the ledger's recorded weights carry). Its guard judges a
  neighbour's copy against the node's own copy, once the update is applied.

Both return what happened as data: :meth:`CopyBook.usable` says which senders can be mixed
and which states were refused (offences for the node's quarantine).
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import torch

from dacflnode.algorithms.rounds import Algorithm, NodeState
from dacflnode.protocol.clock import now
from dacflnode.protocol.copies import PublicCopies, Vectors, is_compressed
from dacflnode.protocol.setup import NodeSetup
from dacflnode.transport.base import DEFAULT_PULL_TIMEOUT, PeerUnavailable, Transport
from dacflnode.wire.errors import Reason, WireError
from dacflnode.wire.message import Kind, RoundMessage, UsedLog
from dacflnode.wire.state_guard import RobustGuard

log = logging.getLogger(__name__)


@dataclass
class Usable:
    """Which of a round's senders can be mixed, and the states refused on the way (``(peer,
    round, reason)``: offences of the edge)."""

    senders: set[str]
    refused: list[tuple[str, int, Reason]] = field(default_factory=list)


@dataclass
class MixInput:
    """What :meth:`Algorithm.prepare` mixes, and what the ledger records of it."""

    #: the neighbours' states (full states), or ``{}`` (copies)
    neighbours: dict[str, Mapping[str, torch.Tensor]]
    #: the public copies of the node and of the mixed neighbours (``None``: full states)
    copies: dict[str, Vectors] | None
    #: the factor of each recorded weight: CHOCO's edge ``ij`` added ``γ w_ij (x̂_j − x̂_i)``
    scale: float
    #: the ``x`` of each mixed neighbour, and the node's own, as the ledger records them
    theirs: dict[str, torch.Tensor]
    mine: torch.Tensor | None


class CopyBook(ABC):
    """What the node of ``setup`` sends each round and mixes (see the module docstring)."""

    def __init__(self, setup: NodeSetup) -> None:
        self.setup = setup
        self.algorithm: Algorithm = setup.algorithm
        #: the inbox's guard (``None``: states are not judged on arrival)
        self.guard: RobustGuard | None = None
        #: a compressed run's public copies
        self.copies: PublicCopies | None = None

    @abstractmethod
    async def message(self, t: int, degree: int, kind: Kind, state: NodeState,
                      used_log: UsedLog, anchors: tuple[int, ...]) -> RoundMessage:
        """The node's round-``t`` message of ``kind`` from ``state`` (encoding, if any, runs
        off the event loop)."""

    def joined(self, state: NodeState) -> None:  # noqa: B027 (a copy's guard needs nothing)
        """The node joined with ``state``: what its neighbours' states are judged against."""

    async def usable(self, t: int, received: Mapping[str, RoundMessage], deadline: float,
                     pull: bool = True) -> Usable:
        """Which senders of ``received`` can be mixed (``pull``: a copy may be pulled in
        full, not in a closing exchange)."""
        return Usable(set(received))

    @abstractmethod
    def mix_input(self, mixed: Mapping[str, RoundMessage], own: RoundMessage) -> MixInput:
        """What the round mixes of the senders of ``mixed`` (the node's message: ``own``)."""

    copy_of: Callable[[int], RoundMessage | None] | None = None
    """Answers a neighbour's copy pull (:attr:`~dacflnode.transport.base.Inbox.copy_of`);
    ``None``: no copy is kept."""


class FullStates(CopyBook):
    """Full states (an uncompressed run)."""

    def __init__(self, setup: NodeSetup, state: NodeState) -> None:
        super().__init__(setup)
        #: the node's latest outgoing state: what the guard measures neighbours' states against
        self.reference: Mapping[str, torch.Tensor] = self.algorithm.outgoing(state)
        if setup.absurd_ratio is not None:
            self.guard = RobustGuard(lambda: self.reference)

    async def message(self, t: int, degree: int, kind: Kind, state: NodeState,
                      used_log: UsedLog, anchors: tuple[int, ...]) -> RoundMessage:
        message = RoundMessage(self.setup.node_id, t, max(1, degree),
                               self.algorithm.outgoing(state), used_log, kind, anchors)
        if kind is Kind.STATE:
            self.reference = message.tensors
        return message

    def joined(self, state: NodeState) -> None:
        self.reference = self.algorithm.outgoing(state)

    def mix_input(self, mixed: Mapping[str, RoundMessage], own: RoundMessage) -> MixInput:
        neighbours = {j: mixed[j].tensors for j in mixed}
        return MixInput(neighbours, None, 1.0,
                        {j: neighbours[j]["x"] for j in neighbours if "x" in neighbours[j]},
                        own.tensors.get("x"))


class CopyUpdates(CopyBook):
    """Compressed updates of public copies (CHOCO-Gossip); ``transport`` gives the node's
    transport (for copy pulls), ``round_of`` its round; ``shared``: the node starts at round 0,
    where every copy is the common initial model."""

    def __init__(self, setup: NodeSetup, state: NodeState, transport: Callable[[], Transport],
                 round_of: Callable[[], int], shared: bool) -> None:
        super().__init__(setup)
        compression = setup.compression
        assert compression is not None
        self.gamma = compression.gamma
        copies = PublicCopies(setup.node_id, setup.neighbours, self.algorithm.exchanged,
                              compression, self.algorithm.outgoing(state), shared=shared)
        self.copies = copies
        self.transport = transport
        #: judges a neighbour's copy against the node's own copy
        self.copy_guard = (None if setup.absurd_ratio is None
                           else RobustGuard(lambda: copies.own))
        self.round_of = round_of
        self.copy_of = self._copy_of

    def _copy_of(self, id_: int) -> RoundMessage | None:
        """The node's own public copy ``id_`` as a full message (a neighbour's copy pull)."""
        assert self.copies is not None
        copy = self.copies.served(id_)
        if copy is None:
            return None
        return RoundMessage(self.setup.node_id, self.round_of(), 1, copy, copy_next=id_)

    async def message(self, t: int, degree: int, kind: Kind, state: NodeState,
                      used_log: UsedLog, anchors: tuple[int, ...]) -> RoundMessage:
        copies = self.copies
        assert copies is not None
        parts, update = await asyncio.get_running_loop().run_in_executor(
            self.setup.executor, copies.encode, t, self.algorithm.outgoing(state))
        base = copies.own_id
        copies.commit(update)
        return RoundMessage(self.setup.node_id, t, max(1, degree), parts, used_log, kind,
                            anchors, copy_base=base, copy_next=update.id)

    async def usable(self, t: int, received: Mapping[str, RoundMessage], deadline: float,
                     pull: bool = True) -> Usable:
        """Apply the round's compressed updates to the copies of their senders; a copy that
        is not the one an update was made for is pulled in full (``pull``). The senders whose
        copy now matches their message are usable (the others are not mixed this round: their
        one-sided uses are undone as any missed state's). An update that cannot be decoded,
        or a copy the guard refuses, is a refused state."""
        copies = self.copies
        assert copies is not None
        out = Usable(set())
        loop = asyncio.get_running_loop()
        executor = self.setup.executor
        me = self.setup.node_id
        for j in sorted(received):
            message = received[j]
            if message.kind is Kind.HANDOVER or not is_compressed(message):
                continue
            try:
                if copies.at(j, message.copy_next):
                    pass  # pulled in full already
                elif copies.applies(message):
                    copies.commit(await loop.run_in_executor(executor, copies.decode, message))
                elif pull and message.kind is Kind.STATE:  # (a leaving node's: never mixed)
                    full = await self.transport().pull(
                        j, message.round, timeout=max(0.0, min(deadline - now(),
                                                               DEFAULT_PULL_TIMEOUT)),
                        copy_id=message.copy_next)
                    copies.commit(await loop.run_in_executor(
                        executor, copies.adopt, j, message.copy_next, full.tensors))
                    copies.pulled += 1
                    log.info("round %d: pulled the full public copy of %s", t, j,
                             extra={"event": "copy_pulled", "node": me, "round": t, "neighbour": j})
                else:
                    continue
            except ValueError as exc:
                log.warning("round %d: the update of %s cannot be applied: %s", t, j,
                            exc,
                            extra={"event": "copy_update_refused", "node": me, "round": t,
                                   "neighbour": j})
                copies.forget(j)
                out.refused.append((j, message.round, Reason.ABSURD_STATE))
                continue
            except (WireError, PeerUnavailable) as exc:
                log.warning("round %d: could not pull the public copy of %s: %s; not mixed "
                            "this round", t, j, exc,
                            extra={"event": "copy_pull_failed", "node": me, "round": t,
                                   "neighbour": j})
                continue
            guard = self.copy_guard
            if guard is not None and message.kind is Kind.STATE:
                copy = copies.theirs[j][1]
                refused = await loop.run_in_executor(
                    executor, guard, replace(message, tensors=copy, copy_base=0), False)
                if refused is not None:
                    log.warning("round %d: the public copy of %s is refused: %s", t, j,
                                refused.detail,
                                extra={"event": "copy_refused", "node": me, "round": t,
                                       "neighbour": j})
                    out.refused.append((j, message.round, refused.reason))
                    continue
            out.senders.add(j)
        return out

    def mix_input(self, mixed: Mapping[str, RoundMessage], own: RoundMessage) -> MixInput:
        assert self.copies is not None
        copies = self.copies.copies(list(mixed))
        return MixInput({}, copies, self.gamma,
                        {j: copies[j]["x"] for j in mixed if "x" in copies[j]},
                        copies[self.setup.node_id].get("x"))


def make_copy_book(setup: NodeSetup, state: NodeState, transport: Callable[[], Transport],
                   round_of: Callable[[], int], shared: bool) -> CopyBook:
    """The copy book of the node of ``setup``: :class:`CopyUpdates` in a compressed run, else
    :class:`FullStates`. ``transport`` gives the node's transport (made after the book, around
    an inbox that asks the book for its guard and copies); ``round_of`` the node's round;
    ``shared``: the node starts at round 0."""
    if setup.compression is None:
        return FullStates(setup, state)
    return CopyUpdates(setup, state, transport, round_of, shared)

