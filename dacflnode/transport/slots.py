"""Call slots: how many Neighbor calls one peer may have in flight on this node.

gRPC's ``maximum_concurrent_rpcs`` (:data:`~dacflnode.transport.channels.MAX_CONCURRENT_RPCS`)
bounds the calls of the whole server, not who holds them: streams that never send a message
could fill every slot, and a neighbour's real calls were then refused. :class:`CallSlots`
divides the slots between callers, counting each call from its start, before its first message
arrives (so calls that send nothing are counted too). A call belongs to a *pool*:

* with mutual TLS, the identity of the caller's verified certificate (from the call's start):
  at most ``per_peer`` calls (:data:`PER_PEER`);
* on plaintext, before its first message, the caller's address (host, without the port): at
  most ``per_address`` calls (:data:`PER_ADDRESS`); once the first message names who the caller
  claims to be, the pair (claimed id, host): at most ``per_peer``.

A call that would overfill its pool takes the place of the pool's *stalest* call when that one
has received nothing (or, for a pull, sent nothing) for ``stale_after`` seconds (the node's
``first_message_timeout``); in an address pool, where no call has sent anything yet, it takes
the oldest one's place at once. The displaced call is cut (:meth:`Call.cut`) with
``RESOURCE_EXHAUSTED`` and :attr:`~Reason.PREEMPTED`. When no call can give way, the new one is
refused with ``RESOURCE_EXHAUSTED`` and :attr:`~Reason.TOO_MANY_CALLS` (a sender retries it as
"busy"). So a caller that holds stalled calls in a neighbour's name (or from a neighbour's
host) delays that neighbour's next call by at most ``stale_after`` seconds, and a flood of
calls that send nothing costs each address at most ``per_address`` slots.

Honest need, and so the figures: a neighbour has at most a Hello, a push of the current round,
an early push of the next one and a pull in flight at once (4); :data:`PER_PEER` is twice that,
for calls its sender gave up on (a push retried after its deadline) that this node has not yet
seen end, and still an eighth of the server's 64 slots. Several honest
neighbours may share a host (every node of a test cluster is on 127.0.0.1), and an honest call
leaves its address pool within milliseconds, at its first message: :data:`PER_ADDRESS` is 16,
a quarter of the server's 64 slots.

No grpc here: :mod:`~dacflnode.transport.grpc_transport` opens a call's slot and moves it once
the first message is read; :class:`~dacflnode.transport.receiver.Receiver` uses the same
:class:`Call` to cut a stalled duplicate push.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from typing import TypeVar

from dacflnode.wire.errors import Reason, WireError

#: Calls in flight per verified identity (TLS) or per claimed id and host (plaintext).
PER_PEER = 8
#: Calls in flight per host that have not yet sent their first message (plaintext).
PER_ADDRESS = 16

#: A pool: ("cert", ids), ("address", host) or ("claim", id, host).
PoolKey = tuple[str, ...]


def peer_host(peer: str) -> str:
    """The host of a gRPC peer string (``ipv4:127.0.0.1:5000`` → ``ipv4:127.0.0.1``,
    ``ipv6:[::1]:5000`` → ``ipv6:[::1]``); other forms as they are."""
    scheme, sep, rest = peer.partition(":")
    if not sep or scheme not in ("ipv4", "ipv6"):
        return peer
    host, colon, port = rest.rpartition(":")
    return f"{scheme}:{host}" if colon and port.isdigit() else peer


class Call:
    """One incoming call: when it last received (or sent) a message, and how to cut it.

    ``task`` is the task serving the call; :meth:`cut` cancels it, and the code serving the
    call turns that cancellation into the refusal with :meth:`taken`.
    """

    def __init__(self, task: asyncio.Task[object] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.task = task if task is not None else asyncio.current_task()
        self.clock = clock
        self.started = self.last = clock()
        self.pool: PoolKey | None = None
        self.cut_error: WireError | None = None

    def touch(self) -> None:
        """The call received (or sent) a message now."""
        self.last = self.clock()

    def idle(self) -> float:
        """Seconds since the call last received or sent a message (or began)."""
        return self.clock() - self.last

    def cut(self, error: WireError) -> None:
        """End the call with ``error``: cancel its task (once)."""
        if self.cut_error is None:
            self.cut_error = error
            if self.task is not None and self.task is not asyncio.current_task():
                self.task.cancel()

    def taken(self) -> WireError | None:
        """In the call's own task, on :class:`asyncio.CancelledError`: the error :meth:`cut`
        ended it with (the cancellation is then withdrawn), or ``None`` when something else
        cancelled it (the caller went away, the server stops): re-raise then."""
        if self.cut_error is None:
            return None
        task = asyncio.current_task()
        if task is not None and task is self.task and task.uncancel() > 0:
            return None  # also cancelled from elsewhere
        return self.cut_error

    def raise_if_cut(self) -> None:
        """On :class:`asyncio.CancelledError` in the call's own task: raise the error
        :meth:`cut` ended it with; return when something else cancelled it (re-raise then)."""
        cut = self.taken()
        if cut is not None:
            raise cut from None


class CallSlots:
    """The calls in flight by pool (see the module docstring)."""

    def __init__(self, *, per_peer: int = PER_PEER, per_address: int = PER_ADDRESS,
                 stale_after: float = 5.0) -> None:
        if per_peer < 1 or per_address < 1:
            raise ValueError("per_peer and per_address must be at least 1")
        self.per_peer = per_peer
        self.per_address = per_address
        self.stale_after = stale_after
        self._pools: dict[PoolKey, list[Call]] = {}

    def __len__(self) -> int:
        return sum(len(calls) for calls in self._pools.values())

    def held(self, key: PoolKey) -> int:
        """Calls in flight in pool ``key``."""
        return len(self._pools.get(key, ()))

    def open(self, call: Call, key: PoolKey) -> None:
        """Count ``call`` in pool ``key``; raises :class:`WireError` (``RESOURCE_EXHAUSTED``,
        :attr:`~Reason.TOO_MANY_CALLS`) when it is full and no call in it can give way."""
        unidentified = key[0] == "address"
        cap = self.per_address if unidentified else self.per_peer
        calls = self._pools.setdefault(key, [])
        if len(calls) >= cap:
            victim = min(calls, key=lambda c: c.last)
            stalled = victim.idle()
            if not unidentified and stalled < self.stale_after:
                raise WireError(
                    "RESOURCE_EXHAUSTED",
                    f"{len(calls)} calls from {_who(key)} are in flight already (at most "
                    f"{cap}): retry when one has ended", Reason.TOO_MANY_CALLS)
            calls.remove(victim)
            victim.pool = None
            victim.cut(WireError(
                "RESOURCE_EXHAUSTED",
                f"this call sent nothing for {stalled:.3g}s and a newer call from {_who(key)} "
                "took its slot", Reason.PREEMPTED))
        calls.append(call)
        call.pool = key

    def move(self, call: Call, key: PoolKey) -> None:
        """Move ``call`` to pool ``key`` (its first message named who it claims to be); raises
        like :meth:`open`, and the call then holds no slot."""
        if call.pool == key:
            return
        self.close(call)
        self.open(call, key)

    def close(self, call: Call) -> None:
        """The call ended: free its slot."""
        key = call.pool
        if key is None:
            return
        call.pool = None
        release(self._pools, key, call)


_K = TypeVar("_K", bound=Hashable)


def release(calls: dict[_K, list[Call]], key: _K, call: Call) -> None:
    """Take ``call`` out of ``calls[key]``, and ``key`` out of ``calls`` once no call is left."""
    held = calls.get(key)
    if held is None:
        return
    if call in held:
        held.remove(call)
    if not held:
        del calls[key]


def _who(key: PoolKey) -> str:
    known_by = key[0]  # how the caller is known: its certificate, or the id it claimed
    if known_by == "cert":
        return f"the certificate of {key[1]!r}"
    if known_by == "claim":
        return f"{key[1]!r} at {key[2]!r}"
    return f"{key[1]!r}"
