"""An asynchronous node's edges as nodes restart and leave (docs/algorithm.md, "Asynchronous
DACFL": "A restart", "Leaving").

Both rest on the edges' transfer totals (:class:`~dacflnode.algorithms.edge_flows.EdgeFlows`):
every exchange adds ``+c`` to the answering end's total of the edge and ``−c`` to the asking
end's, so ``Σ x − Σ τ`` over any set of nodes is the sum of their totals on the edges that
leave the set.

**A restart.** A node started again from a checkpoint lost what its exchanges did after it, its
neighbours did not. Before it mixes an edge again it asks that neighbour for its total of the
edge (``RECONCILE``) and adopts its opposite: the edge cancels again, whatever was lost. Its
exchange ids begin a new epoch (the high 32 bits: one more than any its journal or checkpoint
names); a neighbour that answered its ``RECONCILE`` refuses the ids of earlier epochs, so that
a request of the lost process can never be applied after the totals were read. Until an edge
is reconciled, the node neither asks on it nor answers on it; it trains meanwhile. When both
ends of an edge restarted, the end whose id sorts first adopts, and the other only answers.

**Leaving** (``dacflnode stop --drain``). The node settles what it asked, refuses new
exchanges, and hands each neighbour its own total of their edge (a ``HANDOVER`` state in an
exchange call), which the neighbour adds to ``ω`` and ``x``: the edge's two totals then
cancel, so ``Σ x = Σ τ`` holds over the nodes that stay, and the neighbour mixes without the
node from then on. The node's own training leaves with it (its ``τ``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch

from dacflnode.algorithms.edge_flows import EdgeFlows
from dacflnode.algorithms.rounds import NodeState
from dacflnode.protocol.async_compression import EdgeCodec
from dacflnode.protocol.async_parts import Kept
from dacflnode.protocol.setup import NodeSetup
from dacflnode.records.checkpoint import Checkpoint
from dacflnode.transport.base import PeerUnavailable, Transport
from dacflnode.wire.errors import Reason, WireError
from dacflnode.wire.message import Kind, RoundMessage

log = logging.getLogger(__name__)

#: The journal of a node's state changes under ``schedule: async``.
JOURNAL_FILE = "exchanges.jsonl"
#: The bits of an exchange id below its epoch (the process of the node that chose it).
EPOCH_SHIFT = 32
#: Seconds between two tries of a reconciliation or a handover.
RETRY_S = 0.5


def journal_epoch(folder: Path | None) -> int | None:
    """The latest epoch ``folder``'s journal names (``None``: no journal, the node never ran
    there); 0 when it ran but never restarted."""
    if folder is None or not (folder / JOURNAL_FILE).exists():
        return None
    epoch = 0
    with open(folder / JOURNAL_FILE, encoding="utf-8", errors="replace") as lines:
        for raw in lines:
            if '"restart"' in raw:
                try:
                    epoch = max(epoch, int(json.loads(raw).get("epoch", 0)))
                except (ValueError, TypeError, AttributeError):
                    continue
    return epoch


class _Runner(Protocol):
    state: NodeState

    @property
    def transport(self) -> Transport: ...
    @property
    def round(self) -> int: ...


class AsyncNode(Protocol):
    """What membership reads and calls of its node
    (:class:`~dacflnode.protocol.async_schedule.AsyncNode`)."""

    me: str
    setup: NodeSetup
    neighbours: list[str]
    answered: dict[str, RoundMessage]
    asked: dict[str, Any]
    done_peers: set[str]
    done_asking: bool
    codec: EdgeCodec | None

    @property
    def runner(self) -> _Runner: ...
    @property
    def degree(self) -> int: ...
    async def step(self, entry: dict[str, Any], change: Callable[[], Any]) -> Any: ...
    def timeout(self) -> float: ...
    def new_id(self) -> int: ...
    def last_id(self) -> int: ...
    def peer_done(self, peer: str) -> None: ...
    def drop_neighbour(self, peer: str) -> None: ...


class Membership:
    """The edge totals, restart epoch and departures of one :class:`AsyncNode`."""

    def __init__(self, node: AsyncNode, resume: Checkpoint | None) -> None:
        self.node = node
        self.me = node.me
        #: each edge's transfer totals
        self.flows = EdgeFlows() if resume is None else EdgeFlows.from_tensors(resume.flows)
        ran = journal_epoch(node.setup.state_dir)
        #: whether this process restarts the node: it reconciles each edge before it mixes it
        self.restarted = resume is not None or ran is not None
        saved = 0 if resume is None else int(resume.meta.get("exchange_epoch", "0") or 0)
        #: the epoch of this process's exchange ids
        self.epoch = max(saved, ran or 0) + 1 if self.restarted else 0
        #: per neighbour, the reconciliations it asked of this node (its restarts)
        self.reconciliations: dict[str, int] = {}
        #: the neighbours that left the network (their totals handed over)
        self.left: set[str] = set() if resume is None else set(
            json.loads(resume.meta.get("left_peers", "[]")))
        #: the edges to reconcile before they are used again
        self.unreconciled: set[str] = (set(node.neighbours) - self.left if self.restarted
                                       else set())
        #: per neighbour, the first exchange id of its current epoch: lower ones are refused
        self.floor: dict[str, int] = {}
        #: whether this node is leaving: it answers no more exchanges
        self.leaving = False
        #: whether the run ended settled, as the last checkpoint says (a restart then exits)
        self.was_settled = resume is not None and resume.meta.get("settled") == "1"
        self._tasks: dict[str, asyncio.Task[None]] = {}

    @property
    def first_id(self) -> int:
        """The first exchange id of this process."""
        return (self.epoch << EPOCH_SHIFT) + 1

    def check(self, request: RoundMessage) -> None:
        """Refuse an exchange this node must not apply now (run under the node's lock, in the
        step that would apply it, so that nothing changes between the check and the step)."""
        peer = request.sender
        if self.leaving or peer in self.left:
            raise WireError("FAILED_PRECONDITION", f"{self.me} is leaving the network"
                            if self.leaving else f"{peer} has left", Reason.FINISHED)
        self._refuse_unreconciled(peer)
        if request.exchange_id < self.floor.get(peer, 0):
            raise WireError("FAILED_PRECONDITION", f"exchange {request.exchange_id} was asked "
                            "before a restart (of its asker or of this node)",
                            Reason.RESTARTED)

    def _refuse_unreconciled(self, peer: str) -> None:
        if peer in self.unreconciled:
            raise WireError("UNAVAILABLE", f"{self.me} restarted and has not reconciled the "
                            f"edge to {peer} yet", Reason.RECONCILING)

    def meta(self, finished: bool) -> dict[str, str]:
        """What a checkpoint adds to its metadata for a restart."""
        return {"exchange_epoch": str(self.epoch), "settled": "1" if finished else "0",
                "left_peers": json.dumps(sorted(self.left))}

    async def cancel(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ a restart
    async def answer_reconcile(self, request: RoundMessage) -> RoundMessage:
        """Answer a restarted neighbour's ``RECONCILE``: this node's totals of the edge; from
        now on that neighbour's exchange ids of earlier epochs are refused."""
        node, peer = self.node, request.sender
        if peer in self.unreconciled and self.me < peer:
            raise WireError("UNAVAILABLE", f"{self.me} restarted too: it reconciles the edge "
                            f"to {peer} itself", Reason.RECONCILING)
        runner = node.runner

        def change() -> RoundMessage:
            self.unreconciled.discard(peer)  # (both restarted: the asking end adopts)
            self.reconciliations[peer] = self.reconciliations.get(peer, 0) + 1
            self.floor[peer] = max(self.floor.get(peer, 0), request.exchange_id)
            node.answered.pop(peer, None)
            node.done_peers.discard(peer)  # its new process tells again when it is done
            if node.codec is not None:  # its references are lost: snapshots go whole again
                node.codec.forget(peer)
            kind = Kind.EXCHANGE_DONE if node.done_asking else Kind.EXCHANGED
            # copy_next: the last id this node asked with; the restarted node refuses those
            # (an answer of its lost process to one of them is dropped here, see AsyncNode)
            return RoundMessage(self.me, runner.state.round, node.degree,
                                self.flows.of(peer, runner.state.x), kind=kind,
                                exchange_id=request.exchange_id, copy_next=node.last_id())

        reply: RoundMessage = await node.step(
            {"event": "reconcile", "peer": peer, "floor": request.exchange_id}, change)
        return reply

    async def reconcile(self) -> None:
        """After a restart, reconcile every edge in the background: the node trains meanwhile
        and mixes each edge once it is reconciled (a neighbour that is down costs only its own
        edge)."""
        node = self.node
        if not self.unreconciled:
            return
        await node.step({"event": "restart", "epoch": self.epoch,
                         "blocks": node.runner.round}, lambda: None)
        log.info("restarted at block %d: reconciling the edges to %s", node.runner.round,
                 ", ".join(sorted(self.unreconciled)),
                 extra={"event": "reconciling", "node": self.me, "round": node.runner.round})
        for peer in sorted(self.unreconciled):
            self._tasks[peer] = asyncio.create_task(self._reconcile(peer),
                                                    name=f"{self.me}-reconcile-{peer}")

    async def reconciled(self) -> None:
        """Until every edge is reconciled."""
        await asyncio.gather(*self._tasks.values())

    async def _reconcile(self, peer: str) -> None:
        node = self.node
        request = RoundMessage(self.me, node.runner.round, node.degree, {},
                               kind=Kind.RECONCILE, exchange_id=self.epoch << EPOCH_SHIFT)
        told = False
        while peer in self.unreconciled:
            try:
                reply = await node.runner.transport.exchange(peer, request, node.timeout())
            except (PeerUnavailable, WireError) as exc:
                if not told and not (isinstance(exc, WireError)
                                     and exc.reason is Reason.RECONCILING):
                    log.warning("cannot reconcile the edge to %s yet (%s): retrying; the run "
                                "stays exact only once it is", peer, exc,
                                extra={"event": "reconcile_waiting", "node": self.me,
                                       "neighbour": peer})
                    told = True
                await asyncio.sleep(RETRY_S)
                continue
            entry: dict[str, Any] = {"event": "adopt", "peer": peer,
                                     "peer_blocks": reply.round}
            await node.step(entry, partial(self._adopt, peer, dict(reply.tensors), entry,
                                           reply.copy_next))
            if reply.kind is Kind.EXCHANGE_DONE:
                node.peer_done(peer)

    def _adopt(self, peer: str, theirs: dict[str, torch.Tensor], entry: dict[str, Any],
               asked_up_to: int) -> None:
        # the neighbour's exchanges asked before now were asked of the lost process: refused
        self.floor[peer] = max(self.floor.get(peer, 0), asked_up_to + 1)
        if peer in self.unreconciled:  # (not settled meanwhile by the other end)
            runner = self.node.runner
            before = runner.state.x
            runner.state = self.flows.adopt(runner.state, peer, theirs)
            self.unreconciled.discard(peer)
            # how far the repair moved x: what the lost process's exchanges had done
            entry["moved"] = float(torch.linalg.vector_norm(runner.state.x - before))

    # ------------------------------------------------------------------ leaving
    async def answer_handover(self, request: RoundMessage) -> RoundMessage:
        """A neighbour leaves: add its total of the edge (so the edge cancels) and mix without
        it from now on. A retry of the same handover is acknowledged, not applied again."""
        node, peer = self.node, request.sender
        ack = RoundMessage(self.me, node.runner.round, node.degree, {}, kind=Kind.EXCHANGED,
                           exchange_id=request.exchange_id)
        runner = node.runner
        theirs = dict(request.tensors)

        def change() -> None:
            if peer in self.left:  # a retry (checked in the step: one may wait for the first)
                raise Kept(ack)
            self._refuse_unreconciled(peer)
            if peer in node.asked:  # (its answer may be applied at the leaver already)
                raise WireError("ABORTED", f"{self.me} has an exchange with {peer} in flight: "
                                "answer it, then hand over", Reason.IN_PROGRESS)
            runner.state = self.flows.handed(runner.state, peer, theirs)
            self.left.add(peer)
            node.drop_neighbour(peer)

        try:
            await node.step({"event": "handed", "peer": peer, "id": request.exchange_id},
                            change)
        except Kept:
            return ack
        log.info("%s left the network: its share of the edge handed over", peer,
                 extra={"event": "neighbour_left", "node": self.me, "neighbour": peer})
        return ack

    async def hand_over(self, peers: list[str]) -> list[str]:
        """This node leaves: hand each of ``peers`` its total of their edge (retrying while a
        neighbour is unreachable); returns those that took it."""
        node = self.node
        took: list[str] = []

        async def one(peer: str, exchange_id: int) -> None:
            totals = self.flows.of(peer, node.runner.state.x)
            request = RoundMessage(self.me, node.runner.round, node.degree, totals,
                                   kind=Kind.HANDOVER, exchange_id=exchange_id)
            while True:
                try:
                    await node.runner.transport.exchange(peer, request, node.timeout())
                except PeerUnavailable:
                    await asyncio.sleep(RETRY_S)
                    continue
                except WireError as exc:
                    if exc.reason in (Reason.IN_PROGRESS, Reason.RECONCILING):  # (retry)
                        await asyncio.sleep(RETRY_S)
                        continue
                    log.warning("%s did not take this node's handover: %s", peer, exc,
                                extra={"event": "handover_refused", "node": self.me,
                                       "neighbour": peer})
                    return
                took.append(peer)
                await node.step({"event": "handover", "peer": peer, "id": exchange_id},
                                lambda: None)
                return

        await asyncio.gather(*(one(peer, node.new_id()) for peer in peers))
        return sorted(took)
