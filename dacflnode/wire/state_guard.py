"""The guard against absurd and stale states: what a neighbour's state may look like.

A well-formed, correctly checksummed state can still be poison: a neighbour that sends its model
scaled by 5, 50 or −1 (a bug, or a member that turned against the network) drives every model it
is mixed into, and within a few rounds the whole network, to meaningless values. NaN and
infinities are refused by the codec (:func:`~dacflnode.wire.validation.check_finite`); this guard
refuses finite states that no honest neighbour can have sent, and states that are an old state
of the same sender sent again for another round.

**The yardstick.** An earlier rule measured a neighbour's state against the receiver's own
(``‖m_j − m_i‖ ≤ 100 · ‖m_i‖``): the poison it let through was mixed into ``m_i``, which moved
the bound of the next round, so one member could inflate it without end. The rule here measures
against a norm ``R`` that one member cannot move: the *median* of the norms of the states this
node trusts, over its last :data:`HISTORY_ROUNDS` rounds — its own outgoing state of each round
and every neighbour state it accepted. A refused state never enters that pool; a member's
accepted states are one voice among the node's own and its other neighbours', so the median
stays among the honest norms as long as the honest voices are the majority of the pool (every
node with at least two neighbours, one of them honest, counts its own state as well). A state
``m_j`` is refused when either

* its norm is more than :data:`NORM_RATIO` (3) times ``R``, or less than ``R / 3`` (the norm
  test: scaling by 5, 50, 99 multiplies the norm by as much; honest neighbours differ by a few
  per cent, and by a factor of 2 in a run diverging at a learning rate of 0.5), or
* ``‖m_j − m_i‖ > DIRECTION_TOLERANCE · (‖m_j‖ + ‖m_i‖)`` with :data:`DIRECTION_TOLERANCE`
  0.8, ``m_i`` the node's own latest outgoing state (the direction test: the ratio is 0 for the
  same state and 1 for opposite ones; a sign flip keeps the norm but points the other way,
  ≈ 0.99; honest neighbours stay near 0.1, 0.6 in the diverging run).

Both limits are ratios, so no value depends on the model; norms are floored at 1 in them (a
model whose norm is near zero must not refuse everything). The honest margin is measured by
``benchmarks/guard_margin.py`` (docs/security.md): on a non-i.i.d. 4-ring at lr 0.05 honest
states use about a tenth of either limit. A 5× state exceeds the norm limit by 1.7, a 50× one by
17, a sign flip the direction limit by about 1.2. What passes: a state scaled by up to 3, or
turned by less than the direction limit; the norm test on the median keeps a member from
growing the bound (``tests/wire/test_state_guard.py``).

**Freshness.** A state that is bit for bit one the same sender sent for another round (a stale state
relabelled for the next round) is refused as :attr:`~dacflnode.wire.errors.Reason.STALE_STATE`: the
guard keeps the XXH3-128 digests of each sender's last :data:`REPLAY_MEMORY` states. Honest round
states never repeat (training and mixing change them every round); the closing exchanges
(``FINAL``), a leaving node's last state and a handover carry an unchanged state on purpose and are
exempt; a state sent again for the *same* round (a retried push, a pull after a restart) is not
relabelled and is not a replay (the inbox takes one state per sender and round).

Both refusals are ``INVALID_ARGUMENT``: the pusher stops retrying the round at once, and the
receiver goes on without that neighbour's state (docs/faults.md: a refusal is a one-sided use
the repair undoes; repeated refusals quarantine the edge).

Cost: one pass over the received state (its difference to ``m_i``, its norm and its digest, in
float32 per tensor), plus one pass over ``m_i`` when the node's own state changed. It runs in a
worker thread, never on the event loop (:meth:`~dacflnode.transport.base.Inbox.put`).

What it does not do: it bounds the damage of one state, it does not detect subtle poisoning.
A member can still send states that pass both tests (a state scaled by 1.3, or biased within a
fraction of ``R``); docs/security.md ("A member that misbehaves") says what that costs and what
bounds it.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections import deque
from collections.abc import Callable, Mapping

import torch

from dacflnode.wire.encoder import checksum
from dacflnode.wire.errors import Reason, Refusal
from dacflnode.wire.message import Kind, RoundMessage

#: The old rule's ratio; kept for callers that still pass one (``NodeSetup.absurd_ratio``:
#: ``None`` turns the guard off, any number turns it on).
ABSURD_RATIO = 100.0
#: How many times larger (or smaller) than the yardstick ``R`` a neighbour's norm may be.
NORM_RATIO = 3.0
#: ``‖m_j − m_i‖ / (‖m_j‖ + ‖m_i‖)`` (0: the same state, 1: opposite ones) a state may reach.
DIRECTION_TOLERANCE = 0.8
#: Rounds of trusted norms the yardstick is the median of: few, so that the median follows a
#: model whose norm grows fast early in training (it lags by about half of them).
HISTORY_ROUNDS = 3
#: States per sender whose digests are kept to refuse replays.
REPLAY_MEMORY = 8
#: The yardstick's floor.
FLOOR = 1.0

#: Judges a received message before it reaches the inbox: a refusal, or ``None`` to accept it.
#: It is called in a worker thread (it reads the whole payload), never on the event loop.
StateGuard = Callable[[RoundMessage], Refusal | None]

#: Kinds whose state may repeat a previous one of the same sender (see the module docstring).
_MAY_REPEAT = frozenset({Kind.FINAL, Kind.LEAVING, Kind.HANDOVER})


def norm(tensors: Mapping[str, torch.Tensor]) -> float:
    """The norm of all ``tensors`` together (per tensor in its own dtype, summed in floats)."""
    return math.sqrt(sum(float(torch.linalg.vector_norm(t.detach())) ** 2
                         for t in tensors.values()))


def distance(
    ours: Mapping[str, torch.Tensor], theirs: Mapping[str, torch.Tensor]
) -> tuple[float, float]:
    """``(‖theirs − ours‖, ‖ours‖)`` over the tensors both hold.

    Each tensor's norm is taken in its own dtype (float32: one pass, no float64 copy of a
    multi-megabyte state per message) and the squares are summed in Python floats. A forged
    state so large that its difference or norm overflows float32 gives ``inf``, which is
    farther than any limit: refused, as it should be.
    """
    dist_sq = norm_sq = 0.0
    for name, own in ours.items():
        other = theirs.get(name)
        if other is None or other.shape != own.shape:
            continue
        own_flat = own.detach().reshape(-1)
        diff = other.detach().to(own_flat.device).reshape(-1) - own_flat
        dist_sq += float(torch.linalg.vector_norm(diff)) ** 2
        norm_sq += float(torch.linalg.vector_norm(own_flat)) ** 2
    return math.sqrt(dist_sq), math.sqrt(norm_sq)


def digest(tensors: Mapping[str, torch.Tensor]) -> bytes:
    """XXH3-128 of the payload, tensor by tensor in name order (what a replay repeats)."""
    views = []
    for name in sorted(tensors):
        flat = tensors[name].detach().reshape(-1)
        if flat.device.type != "cpu":
            flat = flat.cpu()
        views.append(memoryview(flat.contiguous().numpy()).cast("B"))  # type: ignore[arg-type]
    return checksum(views)


class RobustGuard:
    """Refuses absurd and stale states (see the module docstring).

    ``reference()`` is the node's own latest outgoing state (``None``: nothing to compare with
    yet, accept). The guard is called from worker threads, one message at a time or several at
    once: its history is guarded by a lock.
    """

    def __init__(
        self,
        reference: Callable[[], Mapping[str, torch.Tensor] | None],
        norm_ratio: float = NORM_RATIO,
        direction_tolerance: float = DIRECTION_TOLERANCE,
        history_rounds: int = HISTORY_ROUNDS,
        replay_memory: int = REPLAY_MEMORY,
    ) -> None:
        if not (norm_ratio > 1 and 0 < direction_tolerance < 1):
            raise ValueError("the guard needs a norm ratio above 1 and a direction tolerance "
                             f"in (0, 1), not {norm_ratio}, {direction_tolerance}")
        self.reference = reference
        self.norm_ratio = norm_ratio
        self.direction_tolerance = direction_tolerance
        self.history_rounds = max(1, history_rounds)
        self._lock = threading.Lock()
        #: trusted norms by round: the node's own and the accepted neighbours'
        self._norms: dict[int, list[float]] = {}
        #: the reference whose norm is in the pool
        self._own: tuple[int, Mapping[str, torch.Tensor]] | None = None
        #: per sender: the digests of its last states, with their rounds
        self._seen: dict[str, deque[tuple[int, bytes]]] = {}
        self._replay_memory = max(1, replay_memory)

    def yardstick(self) -> float:
        """``R``: the median of the trusted norms of the last rounds (0 before any)."""
        with self._lock:
            pool = [n for norms in self._norms.values() for n in norms]
        return statistics.median(pool) if pool else 0.0

    def _note(self, round_: int, value: float) -> None:
        with self._lock:
            self._norms.setdefault(round_, []).append(value)
            for r in sorted(self._norms)[:-self.history_rounds]:
                del self._norms[r]

    def _own_state(self, round_: int) -> Mapping[str, torch.Tensor] | None:
        """The node's own state; its norm joins the pool once per state."""
        ours = self.reference()
        if ours is None:
            return None
        with self._lock:
            known = self._own is not None and self._own[1] is ours
        if not known:
            value = norm(ours)
            with self._lock:
                self._own = (round_, ours)
            self._note(round_, value)
        return ours

    def measure(
        self, message: RoundMessage
    ) -> tuple[float, float, float, float] | None:
        """``(‖m_j‖, R, ‖m_j − m_i‖, ‖m_i‖)`` of ``message`` (``None``: nothing to compare
        with); the own state's norm joins the pool when it is new."""
        ours = self._own_state(message.round)
        if ours is None:
            return None
        dist, own_norm = distance(ours, message.tensors)
        return norm(message.tensors), self.yardstick(), dist, own_norm

    def shares(self, measured: tuple[float, float, float, float]) -> tuple[float, float]:
        """How much of the norm limit and of the direction limit a state uses (above 1:
        refused); ``measured`` is :meth:`measure`'s answer."""
        their_norm, scale, dist, own_norm = measured
        high, low = max(their_norm, FLOOR), max(scale, FLOOR)
        norm_share = math.log(max(high, low) / min(high, low)) / math.log(self.norm_ratio)
        spread = max(their_norm + own_norm, 2 * FLOOR)
        return norm_share, dist / (self.direction_tolerance * spread)

    def __call__(self, message: RoundMessage, replay: bool = True) -> Refusal | None:
        """The refusal of ``message``, or ``None``; ``replay``: also refuse a state sent before
        for another round (off for a compressed run's public copies, which a zero update leaves
        as they were)."""
        measured = self.measure(message)
        if measured is None:
            return None
        their_norm, scale, dist, own_norm = measured
        if math.isnan(their_norm) or math.isnan(dist) or math.isinf(their_norm + dist):
            norm_share = dir_share = math.inf
        else:
            norm_share, dir_share = self.shares(measured)
        if norm_share > 1:
            return Refusal(
                Reason.ABSURD_STATE,
                f"the state's norm is {their_norm:.3g}, the states this node trusts have "
                f"{scale:.3g}; at most {self.norm_ratio:g} times more or less is accepted",
                "INVALID_ARGUMENT",
            )
        if dir_share > 1:
            return Refusal(
                Reason.ABSURD_STATE,
                f"the state is {dist:.3g} away from this node's own (norms {their_norm:.3g} "
                f"and {own_norm:.3g}); at most {self.direction_tolerance:g} of their sum is "
                "accepted",
                "INVALID_ARGUMENT",
            )
        theirs = message.tensors
        if replay and message.kind not in _MAY_REPEAT:
            mark = digest(theirs)
            with self._lock:
                seen = self._seen.setdefault(message.sender, deque(maxlen=self._replay_memory))
                earlier = next((r for r, d in seen if d == mark and r != message.round), None)
                if earlier is None and all(r != message.round for r, _ in seen):
                    seen.append((message.round, mark))
            if earlier is not None:
                return Refusal(
                    Reason.STALE_STATE,
                    f"the state of round {message.round} is the one {message.sender} sent for "
                    f"round {earlier}; a state is sent for one round only",
                    "INVALID_ARGUMENT",
                )
        self._note(message.round, their_norm)
        return None


#: The former name of the guard (tests and callers written against it).
DistanceGuard = RobustGuard
