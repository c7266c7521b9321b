"""The transfer totals of an asynchronous node's edges: what its exchanges added, per neighbour
(docs/algorithm.md, "Asynchronous DACFL", "A restart").

Every exchange adds ``+c`` at the answering end and ``−c`` at the asking end, so over a settled
edge the two ends' totals are exact opposites, and ``x_i − τ_i`` is the sum of node ``i``'s
totals over its edges: ``Σ x = Σ τ`` is the statement that every edge's two totals cancel.

A node that restarts from a checkpoint lost what its exchanges did after that checkpoint, but
its neighbours did not: each still holds its own total of the edge. The restarted node adopts
the opposite of the neighbour's total (:meth:`EdgeFlows.adopt`), adding the difference to its
state, and the edge cancels again, whatever was lost: an answer it gave after its checkpoint,
an answer it applied, or an answer that never reached the asking end.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from dacflnode.algorithms import pairwise
from dacflnode.algorithms.rounds import NodeState

Tensor = torch.Tensor

#: The checkpoint's tensor name prefix of the totals (``flow.<peer>.<vector>``).
PREFIX = "flow."


class EdgeFlows:
    """Per neighbour, the net amount this node's exchanges added to each exchanged vector
    (``ω`` and ``x``). Totals are replaced, never changed in place, so a checkpoint may hold
    references to them."""

    def __init__(self, totals: Mapping[str, Mapping[str, Tensor]] | None = None) -> None:
        self.totals: dict[str, dict[str, Tensor]] = {
            peer: dict(vectors) for peer, vectors in (totals or {}).items()}

    def added(self, peer: str, c: Mapping[str, Tensor], sign: float) -> None:
        """Record an exchange with ``peer`` that added ``sign · c`` (+1: this node answered,
        −1: it asked)."""
        old = self.totals.get(peer)
        self.totals[peer] = {
            name: (c[name] if sign > 0 else -c[name]) if old is None else
            (old[name] + c[name] if sign > 0 else old[name] - c[name])
            for name in pairwise.EXCHANGED}

    def of(self, peer: str, like: Tensor) -> dict[str, Tensor]:
        """This node's totals of the edge to ``peer`` (zeros, shaped as ``like``, if none)."""
        totals = self.totals.get(peer)
        if totals is None:
            return {name: torch.zeros_like(like) for name in pairwise.EXCHANGED}
        return dict(totals)

    def adopt(self, state: NodeState, peer: str,
              theirs: Mapping[str, Tensor]) -> NodeState:
        """``state`` after making this node's total of the edge to ``peer`` the opposite of
        ``theirs`` (the neighbour's): the difference is added to ``ω`` and ``x``; ``τ`` is not
        moved (it holds only the node's own steps)."""
        mine = self.of(peer, state.x)
        delta = {name: -theirs[name] - mine[name] for name in pairwise.EXCHANGED}
        self.totals[peer] = {name: -theirs[name] for name in pairwise.EXCHANGED}
        return NodeState(state.round, state.x + delta["x"], state.omega + delta["omega"],
                         state.omega_prev)

    def handed(self, state: NodeState, peer: str, theirs: Mapping[str, Tensor]) -> NodeState:
        """``state`` after ``peer``, leaving, handed over its total of the edge ``theirs``: it
        is added to ``ω`` and ``x``, so the edge's two totals cancel; the edge is dropped."""
        self.totals.pop(peer, None)
        return NodeState(state.round, state.x + theirs["x"], state.omega + theirs["omega"],
                         state.omega_prev)

    # ------------------------------------------------------------------ checkpoints
    def tensors(self) -> dict[str, Tensor]:
        """The totals as ``flow.<peer>.<vector>`` tensors (the checkpoint's)."""
        return {f"{PREFIX}{peer}.{name}": t.contiguous()
                for peer, vectors in sorted(self.totals.items())
                for name, t in sorted(vectors.items())}

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, Tensor]) -> EdgeFlows:
        """The totals a checkpoint holds (names as :meth:`tensors` writes them); an edge with
        one vector missing is taken as zero in it."""
        totals: dict[str, dict[str, Tensor]] = {}
        for key, tensor in tensors.items():
            if not key.startswith(PREFIX):
                continue
            peer, _, name = key[len(PREFIX):].rpartition(".")
            if name in pairwise.EXCHANGED and peer:
                totals.setdefault(peer, {})[name] = tensor
        for vectors in totals.values():
            like = next(iter(vectors.values()))
            for name in pairwise.EXCHANGED:
                vectors.setdefault(name, torch.zeros_like(like))
        return cls(totals)
