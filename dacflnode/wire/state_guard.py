"""The guard against absurd states: how far a neighbour's state may be from this node's own.

A well-formed, correctly checksummed state can still be poison: one neighbour that sends a model
of all-1e6 values (a bug, or an attacker who can speak as a neighbour) drives every model it is
mixed into, and within a few rounds the whole network, to meaningless values. NaN and infinities
are refused by the codec (:func:`~dacflnode.wire.codec.check_finite`); this guard refuses finite
states that no honest neighbour can have sent.

The rule (:class:`DistanceGuard`): a state ``m_j`` for some round is refused when

    ``‖m_j − m_i‖ > ratio · max(‖m_i‖, 1)``

where ``m_i`` is the receiving node's own most recent outgoing state (the same tensors, the
norms taken over all of them together), and ``ratio`` is :data:`ABSURD_RATIO`
(100) by default. The refusal is ``INVALID_ARGUMENT`` with reason
:attr:`~dacflnode.wire.errors.Reason.ABSURD_STATE`, the pusher gets it as its status, and
nothing reaches the inbox.

Why a distance relative to the node's own state, and why 100: every node of a run starts from
the same model and mixes with its neighbours every round, so neighbours' states stay close to
each other; their distance is a small fraction of a model's norm for the whole run (the
training step of one round moves a model by a learning rate times a gradient, and mixing pulls
the states together again). A ratio of 100 is therefore four orders of magnitude of margin
above anything an honest run produces, while the forged all-1e6 state of a model whose norm is
a few tens is ~1e5 norms away and refused. The ``max(…, 1)`` floor keeps a model whose norm is
near zero from refusing everything. An absolute maximum norm would need a value per model; a
relative rule needs none.

What it does not do: it bounds the damage of one state, it does not detect subtle poisoning.
A neighbour that sends a state 50 norms away is accepted, and a neighbour that can speak at all
can still bias the mix within that bound; only the identity checks (mutual TLS) decide who can
speak. The daemon's node runner installs the guard by default with :data:`ABSURD_RATIO`
(``NodeSetup.absurd_ratio``; ``None`` turns it off), comparing against the outgoing state of
its latest round, including states it pulls.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch

from dacflnode.wire.codec import RoundMessage
from dacflnode.wire.errors import Reason, Refusal

#: How many of its own norms (at least 1) a neighbour's state may be from a node's own.
ABSURD_RATIO = 100.0

#: Judges a received message before it reaches the inbox: a refusal, or ``None`` to accept it.
#: It is called in a worker thread (it reads the whole payload), never on the event loop.
StateGuard = Callable[[RoundMessage], Refusal | None]


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


class DistanceGuard:
    """Refuses a message farther than ``ratio · max(‖own‖, 1)`` from ``reference()``, the
    node's own outgoing state (``None``: nothing to compare with yet, accept)."""

    def __init__(
        self,
        reference: Callable[[], Mapping[str, torch.Tensor] | None],
        ratio: float = ABSURD_RATIO,
    ) -> None:
        if not ratio > 0:
            raise ValueError(f"the absurd-state ratio must be positive, not {ratio}")
        self.reference = reference
        self.ratio = ratio

    def __call__(self, message: RoundMessage) -> Refusal | None:
        ours = self.reference()
        if ours is None:
            return None
        dist, norm = distance(ours, message.tensors)
        limit = self.ratio * max(norm, 1.0)
        if dist > limit or math.isnan(dist):
            return Refusal(
                Reason.ABSURD_STATE,
                f"the state is {dist:.3g} away from this node's own (norm {norm:.3g}); "
                f"at most {limit:.3g} is accepted",
                "INVALID_ARGUMENT",
            )
        return None
