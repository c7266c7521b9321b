"""The one place a node consults its injected fault plan (docs/faults.md).

A :class:`FaultFilter` answers, for the node's exchange and handshakes, what the plan changes:
which edge-rounds are neither pushed nor waited for (:meth:`FaultFilter.pushes`,
:meth:`FaultFilter.hears`), which neighbours are down at the start, and what a poisoning node
sends in place of its state (:meth:`FaultFilter.sent_to`). Without a plan it lets everything
through, so the round code never branches on whether faults are injected.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from dacflnode.wire.message import RoundMessage

if TYPE_CHECKING:
    from dacflnode.protocol.faults import FaultPlan


class FaultFilter:
    """The fault plan ``plan`` (``None``: no fault) as node ``node`` plays it."""

    def __init__(self, node: str, plan: FaultPlan | None) -> None:
        self.node = node
        self.plan = plan
        #: whether the plan makes this node send poisoned states
        self.poisons = plan is not None and any(
            p.node == node for p in getattr(plan, "poisons", ()))  # (a test plan may hold none)
        self._poisoned: dict[tuple[int, int, float], RoundMessage] = {}

    def pushes(self, peer: str, round_: int) -> bool:
        """Whether this node's state of ``round_`` goes to ``peer`` (not dropped)."""
        return self.plan is None or not self.plan.drops(self.node, peer, round_)

    def hears(self, peer: str, round_: int) -> bool:
        """Whether ``peer``'s state of ``round_`` can reach this node: a dropped one is not
        waited for, pulled or asked after, and its sender counts as silent in that round (so
        a plan plays the same whatever the timing, in the simulator and on daemons)."""
        return self.plan is None or not self.plan.drops(peer, self.node, round_)

    def linked(self, peer: str, round_: int) -> bool:
        """Whether the edge to ``peer`` carries anything in ``round_`` (a handshake too): an
        edge-round that loses states in either direction loses a handshake as well."""
        return self.pushes(peer, round_) and self.hears(peer, round_)

    def down(self, peer: str, round_: int) -> bool:
        """Whether ``peer`` is crashed or not started yet in ``round_`` (not waited for at
        the start)."""
        return self.plan is not None and self.plan.down(peer, round_)

    def sent_to(self, peer: str, message: RoundMessage) -> RoundMessage:
        """What this node sends ``peer`` instead of ``message`` (pushed and pulled): the
        plan's poison, made once per message and scale; ``message`` itself otherwise."""
        scale = None if self.plan is None else self.plan.poison(self.node, peer, message.round)
        if scale is None:
            return message
        key = (message.round, id(message), scale)
        poisoned = self._poisoned.get(key)
        if poisoned is None or poisoned.round != message.round:
            # a compressed message's integer parts (int8 codes, indices) stay: its floats scale
            tensors = {name: t * scale if t.is_floating_point() else t
                       for name, t in message.tensors.items()}
            poisoned = replace(message, tensors=tensors)
            for old in [k for k in self._poisoned if k[0] < message.round - 1]:
                del self._poisoned[old]
            self._poisoned[key] = poisoned
        return poisoned
