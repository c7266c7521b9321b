"""The exchange of one round: push, pull, probe and wait (docs/algorithm.md, step 1).

:class:`Exchange` pushes the node's message to the round's mixed neighbours (retrying until the
round's deadline), pulls the round's state of a neighbour already past it, asks the silent ones
whether they are there while the round waits, and waits for the neighbours' states in the
inbox. It owns the node's :class:`~dacflnode.protocol.fault_filter.FaultFilter`: the edge-rounds
an injected fault drops are neither pushed, waited for, pulled nor counted as alive, here and
nowhere else. What happened comes back as data, an :class:`Exchanged`: the states received and
the neighbours that showed they are alive. A refusal that is an offence goes to the node's
:class:`~dacflnode.protocol.quarantine.Quarantine` at once (the anchor it proposes counts from
the round the node is in), and a quarantine bars the sender in the inbox.

Every push ends with the exchange (delivered, given up at the deadline, or cancelled with it).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from dacflnode.protocol.clock import now
from dacflnode.protocol.edges import EdgeBook
from dacflnode.protocol.fault_filter import FaultFilter
from dacflnode.protocol.quarantine import OFFENCES, Quarantine
from dacflnode.transport.base import (
    DEFAULT_PULL_TIMEOUT,
    HandshakeRefused,
    PeerUnavailable,
    Transport,
    TransportClosed,
)
from dacflnode.wire.errors import Reason, WireError
from dacflnode.wire.message import Kind, RoundMessage

log = logging.getLogger(__name__)

#: While a round waits, the neighbours whose states have not come are asked whether they are
#: there after this many seconds, then at doubling intervals up to PROBE_MAX (daemons only: a
#: round deadline that is finite).
PROBE_AFTER = 1.0
PROBE_MAX = 8.0
#: How long such a question may take.
PROBE_TIMEOUT = 2.0


@dataclass
class Exchanged:
    """What one exchange gave."""

    round: int
    #: the neighbours' messages of the round (states, and handovers due)
    received: dict[str, RoundMessage]
    #: neighbours that showed in the exchange that they are alive: they refused this node's
    #: push as late, ahead or a duplicate, or answered a probe
    shown_alive: set[str] = field(default_factory=set)
    #: when the exchange began (the event loop's ``time()``)
    since: float = 0.0

    def alive(self, missing: Collection[str], heard: Mapping[str, float],
              faults: FaultFilter) -> set[str]:
        """Which of ``missing`` are alive, if late: they showed it in the exchange or called
        this node since it began (``heard``), unless a fault drops their state (an edge-round
        a fault drops is silent by definition)."""
        return {j for j in missing
                if (j in self.shown_alive or heard.get(j, -math.inf) >= self.since)
                and faults.hears(j, self.round)}


class Exchange:
    """The exchanges of node ``node`` over ``transport``; ``peer_rounds`` is the round each
    neighbour was in when it last answered a Hello (the handshakes keep it, the probes update
    it); ``resumed_at`` is the round the node restarted in (-1: it did not)."""

    def __init__(self, node: str, transport: Transport, faults: FaultFilter,
                 quarantine: Quarantine, edges: EdgeBook, peer_rounds: dict[str, int],
                 resumed_at: int = -1) -> None:
        self.node = node
        self.transport = transport
        self.faults = faults
        self.quarantine = quarantine
        self.edges = edges
        self.peer_rounds = peer_rounds
        self.resumed_at = resumed_at
        #: the ``(round, peer)`` states being pulled now (one pull each)
        self._pulling: set[tuple[int, str]] = set()
        self._alive: set[str] = set()

    async def run(self, t: int, active: Sequence[str], handovers: Sequence[str],
                  message: RoundMessage, deadline: float, probe: bool,
                  since: float) -> Exchanged:
        """Push ``message`` to ``active`` and hear from them (and any handover due), until
        all came or ``deadline``; ``probe``: ask the silent ones whether they are there;
        ``since``: when the round began (a neighbour that called since then is alive)."""
        self._alive = set()
        inbox = self.transport.inbox
        expected = [*active, *(j for j in handovers if j not in active)]
        for peer in expected:
            if not self.faults.hears(peer, t):
                await inbox.forgo(t, peer)
        async with asyncio.TaskGroup() as pushes:
            for peer in active:
                if self.faults.pushes(peer, t):
                    pushes.create_task(self.push(peer, message, deadline))
            for peer in active:
                # a neighbour already past round t (we restarted) no longer pushes it; one in
                # round t when this node restarted may have pushed it to the node's previous
                # process: pull its state
                seen = self.peer_rounds.get(peer, -1)
                if seen > t or (seen == t and t == self.resumed_at):
                    await self.pull(peer, t, deadline, past=seen > t)
            prober = None
            if probe:
                prober = asyncio.create_task(self._probe(t, active, deadline))
            try:
                received = await inbox.wait(t, expected, max(0.0, deadline - now()))
            finally:
                if prober is not None:
                    prober.cancel()
                    await asyncio.wait({prober})
        return Exchanged(t, received, set(self._alive), since)

    async def push_all(self, peers: Sequence[str], message: RoundMessage,
                       deadline: float) -> None:
        """Push ``message`` to each of ``peers`` (a fault may drop some), until delivered or
        ``deadline``."""
        async with asyncio.TaskGroup() as pushes:
            for peer in peers:
                if self.faults.pushes(peer, message.round):
                    pushes.create_task(self.push(peer, message, deadline))

    async def _probe(self, t: int, active: Sequence[str], deadline: float) -> None:
        """While the round waits, ask the neighbours whose state has not come whether they are
        there (a Hello, which changes nothing on their side): one that answers is alive (late,
        not gone: docs/faults.md), and one that has moved on past round ``t`` without this node
        is pulled from at once; one that does not answer shows as unreachable in ``status``."""
        inbox = self.transport.inbox
        me = self.node
        delay = PROBE_AFTER
        while True:
            await asyncio.sleep(min(delay, max(0.0, deadline - now())))
            for peer in active:
                if inbox.has(t, peer) or inbox.forgone(t, peer) or not self.faults.hears(peer, t):
                    continue
                try:
                    # in this task, not wait_for's: Python 3.11's wait_for returns the result
                    # when the Hello ends as the round cancels the probe, and the cancel is lost
                    # (the probe then ran on and the round waited for it forever)
                    async with asyncio.timeout(PROBE_TIMEOUT):
                        ident = await self.transport.hello(peer)
                except (PeerUnavailable, HandshakeRefused, TimeoutError):
                    continue
                except TransportClosed:
                    return  # the node is shutting down
                except Exception:  # background work: log it, never let it end the round
                    log.exception("asking %s whether it is there failed unexpectedly", peer,
                                  extra={"event": "probe_failed", "node": me, "neighbour": peer})
                    continue
                self._alive.add(peer)
                self.peer_rounds[peer] = ident.round
                if ident.round > t:  # it went on without this node: take its state of round t
                    await self.pull(peer, t, deadline)
            delay = min(2 * delay, PROBE_MAX)

    async def push(self, peer: str, message: RoundMessage, deadline: float) -> None:
        """Push ``message`` to ``peer``, retrying until ``deadline``; a refusal that says the
        peer is late, ahead or has it already ends the push (and shows the peer alive)."""
        me = self.node
        delay = 0.05
        while True:
            remaining = deadline - now()
            if remaining <= 0:
                log.warning("round %d state not delivered to %s by the deadline",
                            message.round, peer,
                            extra={"event": "push_timeout", "node": me,
                                   "round": message.round, "neighbour": peer})
                return
            try:
                await self.transport.push(peer, message, timeout=remaining)
                return
            except PeerUnavailable:
                pass
            except TransportClosed:
                return  # the node is shutting down
            except WireError as exc:
                if exc.reason in (Reason.ROUND_PASSED, Reason.ROUND_AHEAD, Reason.DUPLICATE):
                    self._alive.add(peer)  # late or ahead, not gone
                if exc.reason is Reason.ROUND_PASSED:
                    # the neighbour moved on without this node: take its state of the round
                    # (a one-sided use, undone once its header says so)
                    if message.kind is not Kind.HANDOVER and self.edges.peers[peer].mixes_in(
                            message.round):  # (not: the edge was re-agreed to a later round)
                        await self.pull(peer, message.round, deadline)
                    return
                if exc.reason is Reason.DUPLICATE:
                    return  # it already has this state (it pulled it)
                if exc.reason in OFFENCES:
                    # never retried: the neighbour goes on without it, and so does this node
                    if message.kind in (Kind.STATE, Kind.FINAL) and self.quarantine.offence(
                            peer, message.round, exc.reason, mine=True):
                        self.transport.inbox.bar(peer)
                    return
                if exc.reason is Reason.QUARANTINED:
                    if self.quarantine.quarantined_by(peer):
                        self.transport.inbox.bar(peer)
                    return
                if exc.reason is not Reason.ROUND_AHEAD:
                    log.warning("%s refused round %d: %s (%s): %s", peer,
                                message.round, exc.code, exc.reason, exc.message,
                                extra={"event": "push_refused", "node": me,
                                       "round": message.round, "neighbour": peer,
                                       "reason": exc.reason})
            except Exception:  # a transport failure nobody foresaw must not end the round
                log.exception("push of round %d to %s failed unexpectedly; retrying",
                              message.round, peer,
                              extra={"event": "push_failed", "node": me,
                                     "round": message.round, "neighbour": peer})
            await asyncio.sleep(min(delay, max(0.0, deadline - now())))
            delay = min(delay * 2, 1.0)

    async def pull(self, peer: str, t: int, deadline: float, past: bool = True) -> None:
        """Pull ``peer``'s round-``t`` state into the inbox, called when ``peer`` is past round
        ``t`` (``past``; else, it is in round ``t`` and may have pushed it to this node's
        previous process): it no longer pushes that round, so the pull cannot race a push of
        it (if one did land, the inbox keeps the first and refuses the second as a duplicate:
        no harm). The pulled state passes the inbox's guard like a pushed one.

        A neighbour past round ``t`` that no longer keeps it (it keeps its last two) will
        never send it: the round stops waiting for it (it is missed, and late, at once). A node
        two rounds or more behind its neighbours would otherwise wait out every round's
        deadline and, its neighbours waiting for it too, never catch up."""
        inbox = self.transport.inbox
        me = self.node
        key = (t, peer)
        # here already, dropped, or on its way: a restarted node pulls a state and its push of
        # the round, refused ROUND_PASSED, asks for the same one
        if inbox.has(t, peer) or key in self._pulling or inbox.forgone(t, peer) or (
                not self.faults.hears(peer, t)):
            return
        self._pulling.add(key)
        try:
            message = await self.transport.pull(
                peer, t, timeout=max(0.0, min(deadline - now(), DEFAULT_PULL_TIMEOUT)))
            await inbox.put(message)
            log.info("pulled round %d state of %s", t, peer,
                     extra={"event": "pulled", "node": me, "round": t, "neighbour": peer})
        except WireError as exc:
            if exc.reason is Reason.DUPLICATE:
                return  # its push of the state arrived while the pull was on its way
            if exc.reason is Reason.NOT_KEPT and past:
                await inbox.forgo(t, peer)
            level = logging.INFO if exc.reason is Reason.NOT_KEPT else logging.WARNING
            log.log(level, "pull of round %d from %s failed: %s", t, peer, exc,
                    extra={"event": "pull_failed", "node": me, "round": t, "neighbour": peer})
        except (PeerUnavailable, TransportClosed) as exc:
            log.warning("pull of round %d from %s failed: %s", t, peer, exc,
                        extra={"event": "pull_failed", "node": me, "round": t,
                               "neighbour": peer})
        except Exception:  # a transport failure nobody foresaw must not end the round
            log.exception("pull of round %d from %s failed unexpectedly", t, peer,
                          extra={"event": "pull_failed", "node": me, "round": t,
                                 "neighbour": peer})
        finally:
            self._pulling.discard(key)
