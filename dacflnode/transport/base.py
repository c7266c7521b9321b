"""What a node needs from a network, independent of how bytes move.

A :class:`Transport` delivers this node's round messages to neighbours (:meth:`Transport.push`)
and puts the neighbours' messages into an :class:`Inbox`. Two implementations share one test
suite: :mod:`dacflnode.transport.memory` (in-process) and :mod:`dacflnode.transport.grpc_transport`
(gRPC, the only module family that imports grpc).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode.transport.errors import PeerUnavailable as PeerUnavailable
from dacflnode.transport.pulling import pull_expectation
from dacflnode.wire.agreement import AgreeItem, AgreePhase
from dacflnode.wire.errors import Reason, Refusal, WireError
from dacflnode.wire.message import PROTOCOL_VERSION, RoundMessage
from dacflnode.wire.state_guard import StateGuard
from dacflnode.wire.validation import CompressedSpec, Expectation

#: How long a :meth:`Transport.pull` waits by default, in seconds.
DEFAULT_PULL_TIMEOUT = 30.0


class HandshakeRefused(ConnectionError):
    """The neighbour answered but will not talk to this node.

    ``reason`` says why: :attr:`~dacflnode.wire.errors.Reason.MISMATCH` (model, run settings or
    protocol differ), :attr:`~dacflnode.wire.errors.Reason.NOT_NEIGHBOUR` (it does not list this
    node), :attr:`~dacflnode.wire.errors.Reason.NOT_AUTHENTICATED` (this node's certificate does
    not carry the id it claimed), or :attr:`~dacflnode.wire.errors.Reason.OTHER`.
    """

    def __init__(self, message: str, reason: Reason = Reason.OTHER) -> None:
        super().__init__(message)
        self.reason = reason


class TransportClosed(RuntimeError):
    """A call on a transport whose :meth:`Transport.stop` has begun.

    A stopped transport refuses new calls instead of quietly reopening connections, so a task
    that outlived its node fails loudly rather than talking to the network after shutdown.
    """


def cancelled_by_caller() -> bool:
    """Whether the running task itself is being cancelled.

    A call can also end in ``CancelledError`` because :meth:`Transport.stop` cancelled the work
    it waited on (grpc cancels the calls of a channel it closes); the transports turn that into
    :class:`TransportClosed`, and let only the caller's own cancellation through as
    ``CancelledError``.
    """
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


#: The most bytes of data contract a Hello may carry (a contract is a class list, a shape and a
#: table's feature names: kilobytes); a longer one is refused before it is parsed.
MAX_CONTRACT_BYTES = 64 * 1024


@dataclass(frozen=True)
class Identity:
    """What two nodes compare in the handshake.

    ``data_contract`` is the run's data contract as canonical JSON when the nodes bring their
    own data (:class:`~dacflnode.learning.owndata.contract.DataContract`), else empty. The run
    fingerprint hashes it already; it travels as well so that a refusal can name what differs.
    """

    node_id: str
    model_fingerprint: str
    run_fingerprint: str
    protocol_version: int = PROTOCOL_VERSION
    round: int = 0  # the round the node was in when it answered (not compared)
    data_contract: str = ""

    def mismatch(self, other: Identity) -> str | None:
        """Why ``other`` cannot be this node's neighbour (a phrase about ``other``), or
        ``None``."""
        if other.protocol_version != self.protocol_version:
            return (f"it runs protocol version {other.protocol_version} "
                    f"(this node speaks {self.protocol_version}): run the same dacflnode "
                    "release on every node of the run")
        data = contract_difference(self.data_contract, other.data_contract, other.node_id)
        if data is not None:
            return data
        if other.model_fingerprint != self.model_fingerprint:
            return "it runs a different model (parameter names, shapes or dtypes differ)"
        if other.run_fingerprint != self.run_fingerprint:
            return "it runs different run settings (algorithm, data, schedule or seed differ)"
        return None


def contract_difference(mine: str, theirs: str, name: str) -> str | None:
    """What differs between this node's data contract ``mine`` and neighbour ``name``'s
    ``theirs`` (JSON texts, empty for a built-in data set), in one line such as
    ``node-3 has classes ['a', 'b'], this run ['a', 'b', 'c']``; ``None`` when they agree."""
    if mine == theirs:
        return None
    if not theirs:
        return f"{name} trains on a built-in data set, this run on own data"
    if len(theirs.encode()) > MAX_CONTRACT_BYTES:
        return f"{name} sent a data contract of over {MAX_CONTRACT_BYTES} bytes"
    from dacflnode.learning.owndata.contract import DataContract

    try:
        other = DataContract.from_json(theirs)
    except ValueError as exc:
        return f"{name} sent a data contract this node cannot read ({exc})"
    if not mine:
        return f"{name} trains on own data ({other.form}), this run on a built-in data set"
    return DataContract.from_json(mine).difference(other, name)


def _loop_time() -> float:
    """The running event loop's clock (the round's deadlines are on it), or the monotonic
    clock it reads by default when called outside one."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


@dataclass
class PeerStats:
    """Per-neighbour counters shown by ``dacflnode status``.

    ``bytes_sent`` and ``bytes_received`` count the payload bytes (the tensors' bytes, as
    :attr:`~dacflnode.wire.message.RoundMessage.payload_bytes`) of every state moved with the
    neighbour: pushes out and in, pulls served and made (state and copy pulls), the same in
    every transport. :attr:`by_round` counts the same bytes again by the round they were
    moved for: a push by its message's round, a pull (served or made) by the round it asked
    for, whenever it lands; a node's round report takes them from there
    (:meth:`Transport.traffic`).
    """

    connected: bool = False
    last_round_received: int = -1
    bytes_received: int = 0
    bytes_sent: int = 0
    latency_ms: float = float("nan")
    #: round states accepted from the neighbour (pushed or pulled), and pushes it accepted
    messages_received: int = 0
    messages_sent: int = 0
    #: ``round -> [sent, received]`` payload bytes moved for that round and not yet taken by
    #: :meth:`take`
    by_round: dict[int, list[int]] = field(default_factory=dict)

    def received(self, nbytes: int, round_: int) -> None:
        """Count a state of ``nbytes`` payload bytes accepted from the neighbour for
        ``round_``."""
        self.bytes_received += nbytes
        self.messages_received += 1
        self.by_round.setdefault(round_, [0, 0])[1] += nbytes

    def sent(self, nbytes: int, round_: int) -> None:
        """Count ``nbytes`` payload bytes sent to the neighbour for ``round_`` (a push, or a
        pull it made)."""
        self.bytes_sent += nbytes
        self.by_round.setdefault(round_, [0, 0])[0] += nbytes

    def take(self, through: int) -> tuple[int, int]:
        """Bytes sent and received for the rounds up to ``through`` not taken before (then
        forgotten here; the totals keep them)."""
        sent = received = 0
        for r in [r for r in self.by_round if r <= through]:
            s, rec = self.by_round.pop(r)
            sent, received = sent + s, received + rec
        return sent, received

    def answered(self, started: float) -> None:
        """Count a call to the neighbour, begun at ``started`` (``time.perf_counter()``), that
        it answered: it is connected, and the call's round trip is its latency."""
        self.latency_ms = (time.perf_counter() - started) * 1000.0
        self.connected = True


@dataclass
class Inbox:
    """Neighbours' round messages, buffered by round; rounds are never mixed.

    ``forgo(round, sender)`` tells :meth:`wait` not to wait for a message that will not come
    (an edge-round an injected fault drops).

    A message is accepted for the current round and the next one (a neighbour may finish a round
    before this node and push the next); anything older or further ahead is refused.
    The messages may hold the very tensors their sender pushed (the in-memory transport's
    no-copy mode): whoever reads them treats them as read-only.

    Each sender has at most one message per round: a second one is refused
    (``ALREADY_EXISTS``, :attr:`~Reason.DUPLICATE`) and the first is kept, so a replayed or
    forged second push cannot replace a state. ``guard``, when given (the node runner gives a
    :class:`~dacflnode.wire.state_guard.RobustGuard`), judges every message in a worker
    thread before it is buffered; its refusal is raised as a :class:`WireError`, and the inbox
    no longer waits for that sender's state of that round (:meth:`forgo`).

    The node runner builds its inbox with all of these, then its transport around it.
    """

    senders: Collection[str]
    current_round: Callable[[], int]
    window: int = 1
    guard: StateGuard | None = None
    #: Answers a neighbour's Hello: ``on_join(peer, proposed)`` is the round from which this
    #: node mixes with ``peer`` (0: as always), given the round ``peer`` proposed (0: none).
    #: ``None`` answers 0.
    on_join: Callable[[str, int], int] | None = None
    #: When (the event loop's ``time()``) each neighbour last called this node: a Hello, a pull, or
    #: a push, accepted or refused for its round. A neighbour heard from is alive, if late.
    heard: dict[str, float] = field(default_factory=dict)
    #: Told of every state the :attr:`guard` refused, with the refusal (on the event loop, after
    #: the inbox stopped waiting for that state); returns whether its sender is barred from now
    #: on (:meth:`bar`): the node's quarantine.
    on_refused: Callable[[RoundMessage, Refusal], bool] | None = None
    #: Senders whose edge this node quarantined: everything they push is refused
    #: (``PERMISSION_DENIED``, :attr:`~Reason.QUARANTINED`).
    barred: set[str] = field(default_factory=set)
    #: What this node sends a neighbour instead of ``message`` (pushed and pulled): a fault
    #: plan's poison (docs/faults.md); ``None``: the message itself.
    outgoing: Callable[[str, RoundMessage], RoundMessage] | None = None
    #: Answers a neighbour's copy pull: ``copy_of(copy_id)`` is this node's public copy of that
    #: id as a message of full float32 tensors with ``copy_next`` = the id, or ``None`` when it
    #: does not keep it (refused ``NOT_FOUND``, :attr:`~Reason.NOT_KEPT`): the node runner's
    #: in a compressed run (docs/compression.md); ``None``: no copy is kept.
    copy_of: Callable[[int], RoundMessage | None] | None = None
    #: Answers a neighbour's asynchronous exchange: ``on_exchange(request)`` applies the
    #: transfer (once per exchange id) and returns the reply, or raises a
    #: :class:`~dacflnode.wire.errors.WireError` refusing it; ``None`` (a node of the
    #: synchronous schedule) refuses every exchange (:mod:`dacflnode.transport.exchanging`).
    on_exchange: Callable[[RoundMessage], Awaitable[RoundMessage]] | None = None
    _messages: dict[int, dict[str, RoundMessage]] = field(default_factory=dict)
    _changed: asyncio.Condition | None = None
    _forgone: dict[int, set[str]] = field(default_factory=dict)
    _wakers: set[asyncio.Task[None]] = field(default_factory=set)

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    def refusal(self, round_: int) -> Refusal | None:
        """Why a message for ``round_`` cannot be accepted now, or ``None``.

        :attr:`~Reason.ROUND_PASSED` when this node is already past ``round_`` (the sender
        should stop offering it), :attr:`~Reason.ROUND_AHEAD` when ``round_`` is beyond the
        window (the sender may offer it again later).
        """
        current = self.current_round()
        if round_ < current:
            return Refusal(Reason.ROUND_PASSED, f"this node is already in round {current}")
        if round_ > current + self.window:
            return Refusal(Reason.ROUND_AHEAD, f"this node is only in round {current}")
        return None

    def heard_from(self, sender: str) -> None:
        """``sender`` called this node just now (see :attr:`heard`)."""
        if sender in self.senders:
            self.heard[sender] = _loop_time()

    def has(self, round_: int, sender: str) -> bool:
        """Whether ``sender``'s message for ``round_`` is buffered."""
        return sender in self._messages.get(round_, {})

    def sent_to(self, peer: str, message: RoundMessage) -> RoundMessage:
        """What this node sends ``peer`` for ``message`` (see :attr:`outgoing`)."""
        return message if self.outgoing is None else self.outgoing(peer, message)

    def forgone(self, round_: int, sender: str) -> bool:
        """Whether the node stopped waiting for ``sender``'s state of ``round_``."""
        return sender in self._forgone.get(round_, ())

    def _admissible(self, message: RoundMessage) -> None:
        if message.sender in self.barred:
            raise WireError("PERMISSION_DENIED", "this node quarantined the edge after repeated "
                            "absurd or stale states; it is not mixed again in this run",
                            Reason.QUARANTINED)
        refused = self.refusal(message.round)
        if refused is not None:
            raise WireError(refused.code,
                            f"round {message.round} refused: {refused.detail}", refused.reason)
        if self.has(message.round, message.sender):
            raise WireError("ALREADY_EXISTS",
                            f"the state of {message.sender} for round {message.round} was "
                            "received already", Reason.DUPLICATE)

    async def put(self, message: RoundMessage) -> None:
        """Buffer ``message``; raises :class:`~dacflnode.wire.errors.WireError`
        (``FAILED_PRECONDITION``, with the :meth:`refusal` reason) if its round is not accepted,
        (``ALREADY_EXISTS``, :attr:`~Reason.DUPLICATE`) if its sender's message for that round
        is here already, or the :attr:`guard`'s refusal."""
        self._admissible(message)
        if self.guard is not None:
            refused = await asyncio.to_thread(self.guard, message)
            if refused is not None:
                # the round goes on without this state at once (never waits for it)
                await self.forgo(message.round, message.sender)
                if self.on_refused is not None and self.on_refused(message, refused):
                    self.bar(message.sender)
                raise WireError(refused.code, refused.detail, refused.reason)
        async with self._condition():
            self._admissible(message)  # the round, or a concurrent push, may have moved on
            self._messages.setdefault(message.round, {})[message.sender] = message
            self._condition().notify_all()

    def get(self, round_: int) -> Mapping[str, RoundMessage]:
        return dict(self._messages.get(round_, {}))

    async def wait(
        self, round_: int, senders: Collection[str], timeout: float | None
    ) -> dict[str, RoundMessage]:
        """Messages of ``round_`` from ``senders``: all of them, or those present at ``timeout``."""
        wanted = set(senders)

        def ready() -> bool:
            return wanted - self._forgone.get(round_, set()) <= set(self._messages.get(round_, {}))

        cond = self._condition()
        async with cond:
            # asyncio.timeout, not wait_for: a cancel of the waiting task arriving as the last
            # message does must end it (Python 3.11's wait_for would return instead)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await cond.wait_for(ready)
            got = self._messages.get(round_, {})
            return {s: got[s] for s in wanted if s in got}

    async def forgo(self, round_: int, sender: str) -> None:
        """Stop waiting for ``sender``'s message of ``round_`` (it will not come)."""
        async with self._condition():
            self._forgone.setdefault(round_, set()).add(sender)
            self._condition().notify_all()

    def bar(self, sender: str) -> None:
        """Refuse everything ``sender`` pushes from now on (:attr:`barred`), and stop waiting
        for its states of the current round and the next."""
        self.barred.add(sender)
        current = self.current_round()
        for r in (current, current + 1):
            self.forgo_nowait(r, sender)

    def forgo_nowait(self, round_: int, sender: str) -> None:
        """:meth:`forgo` from synchronous code running on the event loop (a waiter is woken
        as soon as the loop gets to it)."""
        self._forgone.setdefault(round_, set()).add(sender)
        task = asyncio.get_running_loop().create_task(self._wake())
        self._wakers.add(task)
        task.add_done_callback(self._wakers.discard)

    async def _wake(self) -> None:
        async with self._condition():
            self._condition().notify_all()

    def discard_before(self, round_: int) -> None:
        for r in [r for r in self._messages if r < round_]:
            del self._messages[r]
        for r in [r for r in self._forgone if r < round_]:
            del self._forgone[r]


class Transport(ABC):
    """Moves round messages between this node and its neighbours."""

    def __init__(self, identity: Identity, peers: Iterable[str], inbox: Inbox,
                 tensors: Mapping[str, tuple[int, ...]],
                 compressed: CompressedSpec | None) -> None:
        self.identity = identity
        self.inbox = inbox
        #: This node's tensor set (name -> shape, float32), and a compressed run's (part name
        #: -> dtype, shape): what pushes and state pulls carry.
        self.tensors = dict(tensors)
        self.compressed = None if compressed is None else dict(compressed)
        #: The counters of each neighbour, in the order of ``peers``.
        self.stats = {p: PeerStats() for p in peers}

    def _stats(self, peer: str) -> PeerStats:
        """The counters of ``peer`` (made for a neighbour added after the start)."""
        return self.stats.setdefault(peer, PeerStats())

    def traffic(self, through: int) -> tuple[int, int]:
        """Payload bytes sent to and received from all neighbours for the rounds up to
        ``through``, not taken by an earlier call: a round's report takes its round's traffic
        (and what was moved late for a round reported already), however early or late it
        landed."""
        sent = received = 0
        for stats in self.stats.values():
            s, r = stats.take(through)
            sent, received = sent + s, received + r
        return sent, received

    @abstractmethod
    async def start(self) -> None:
        """Start serving (neighbours can push to this node from now on)."""

    @abstractmethod
    async def stop(self, grace: float = 1.0) -> None:
        """Stop serving and close every connection; from the moment it begins, ``hello``,
        ``push`` and ``pull`` raise :class:`TransportClosed`."""

    @abstractmethod
    async def hello(self, peer: str, join_round: int = 0) -> Identity:
        """Handshake with ``peer``, proposing to mix with it from ``join_round`` (0: as
        always; see :attr:`Inbox.on_join`); raises :class:`PeerUnavailable`,
        :class:`HandshakeRefused` or :class:`TransportClosed`."""
        raise NotImplementedError

    @abstractmethod
    async def push(self, peer: str, message: RoundMessage, timeout: float) -> None:
        """Deliver ``message`` into ``peer``'s inbox; raises :class:`PeerUnavailable`,
        :class:`~dacflnode.wire.errors.WireError` (the peer refused it; see its ``reason``) or
        :class:`TransportClosed`."""
        raise NotImplementedError

    async def pull(
        self,
        peer: str,
        round_: int,
        expect_tensors: Mapping[str, tuple[int, ...]] | None = None,
        timeout: float = DEFAULT_PULL_TIMEOUT,
        copy_id: int = 0,
    ) -> RoundMessage:
        """The state ``peer`` published for ``round_`` (what it pushed, kept for a few rounds),
        full or, in a compressed run, compressed; or, when ``copy_id`` is not 0, ``peer``'s
        public copy of that id as full float32 tensors (its ``copy_next`` is ``copy_id``;
        ``round_`` is then only logged by the peer).

        Raises :class:`PeerUnavailable`, :class:`TransportClosed` or
        :class:`~dacflnode.wire.errors.WireError` (``NOT_FOUND`` with
        :attr:`~dacflnode.wire.errors.Reason.NOT_KEPT` if the peer does not keep that round
        or copy). ``expect_tensors`` defaults to this node's own tensor set.
        """
        tensors = self.tensors if expect_tensors is None else expect_tensors
        expect = pull_expectation(peer, round_, tensors, self.compressed, copy_id)
        request = pb.PullRequest(requester=self.identity.node_id, round=round_, copy_id=copy_id)
        return await self._pull(peer, request, expect, timeout)

    @abstractmethod
    async def exchange(self, peer: str, request: RoundMessage, timeout: float) -> RoundMessage:
        """One asynchronous exchange with ``peer`` (:mod:`dacflnode.transport.exchanging`):
        send ``request`` (``EXCHANGE`` or ``EXCHANGE_DONE``) and return ``peer``'s checked
        ``EXCHANGED`` answer. Raises :class:`PeerUnavailable` (it may or may not have been
        applied there: ask again with the same exchange id),
        :class:`~dacflnode.wire.errors.WireError` (refused, not applied) or
        :class:`TransportClosed`."""
        raise NotImplementedError

    def serve_agreement(
        self, serve: Callable[[str, AgreePhase, frozenset[str]], list[AgreeItem]]
    ) -> None:
        """Answer the neighbours' feature-agreement calls with ``serve(sender, phase, have)``
        (:attr:`Receiver.on_agree <dacflnode.transport.receiver.Receiver.on_agree>`)."""
        raise NotImplementedError(f"{type(self).__name__} has no feature agreement")

    async def agree(self, peer: str, phase: AgreePhase, have: Iterable[str],
                    timeout: float) -> list[AgreeItem]:
        """The items of the feature agreement's ``phase`` that ``peer`` holds and this node
        lacks (``have``: the origins it holds). Raises :class:`PeerUnavailable`,
        :class:`~dacflnode.wire.errors.WireError` or :class:`TransportClosed`."""
        raise NotImplementedError(f"{type(self).__name__} has no feature agreement")

    @abstractmethod
    async def _pull(self, peer: str, request: pb.PullRequest, expect: Expectation,
                    timeout: float) -> RoundMessage:
        """Ask ``peer`` for what ``request`` names and return the answer once ``expect``
        accepts it (see :meth:`pull`, which makes both)."""
        raise NotImplementedError
