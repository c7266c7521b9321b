"""The mix of one round (docs/algorithm.md, steps 2 and 3): settle who took part, then mix.

:class:`Mixer` takes what the round's exchange gave (the states received, the usable senders
of the :class:`~dacflnode.protocol.copybook.CopyBook`, what the messages settled), counts the
missing neighbours in the :class:`~dacflnode.protocol.edges.EdgeBook` (late or silent), takes
the weights from the :class:`~dacflnode.protocol.policies.MixingPolicy`, runs
:meth:`Algorithm.prepare <dacflnode.algorithms.rounds.Algorithm.prepare>` off the event loop and
records the round's uses in the ledger.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping, Sequence

from dacflnode.algorithms.rounds import NodeState, Prepared
from dacflnode.protocol.copybook import CopyBook
from dacflnode.protocol.edges import Absorbed, EdgeBook
from dacflnode.protocol.setup import NodeSetup
from dacflnode.wire.message import Kind, RoundMessage

log = logging.getLogger(__name__)


class Mixer:
    """Mixes the rounds of the node of ``setup``, recording them in ``edges``."""

    def __init__(self, setup: NodeSetup, edges: EdgeBook, book: CopyBook) -> None:
        self.setup = setup
        self.edges = edges
        self.book = book

    def missing(self, t: int, active: Sequence[str], received: Mapping[str, RoundMessage],
                usable: Collection[str], absorbed: Absorbed
                ) -> tuple[dict[str, RoundMessage], tuple[str, ...]]:
        """The states mixed in round ``t`` (received from an active neighbour, usable), and the
        active neighbours missing (not left, and not re-agreed to a later round)."""
        mixed = {j: received[j] for j in active if j in received
                 and received[j].kind is Kind.STATE and j in usable}
        missing = tuple(j for j in active if j not in mixed and j not in absorbed.left
                        and self.edges.peers[j].mixes_in(t))
        return mixed, missing

    def settle(self, t: int, mixed: Mapping[str, RoundMessage], missing: Sequence[str],
               handovers: Sequence[str], received: Mapping[str, RoundMessage],
               alive: Collection[str], refused: Collection[str]) -> None:
        """Count the round's missing neighbours (``alive``: late, not silent), the handovers
        that did not come, and log the late ones (``refused``: missing for a refused state,
        logged as such already)."""
        self.edges.note_round(t, list(mixed), missing,
                              [j for j in handovers if j not in received], alive)
        late = [j for j in missing if j not in refused and j not in received]
        if late:
            node = self.setup.node_id
            log.warning("round %d: no state from %s by the deadline; mixing without them",
                        t, ", ".join(late),
                        extra={"event": "state_missing", "node": node, "round": t,
                               "neighbour": late})

    async def mix(self, t: int, state: NodeState, active: Sequence[str],
                  mixed: Mapping[str, RoundMessage], own: RoundMessage) -> Prepared:
        """Mix ``mixed`` into ``state`` (off the event loop: it touches every parameter of
        every neighbour) and record the round's uses in the ledger."""
        setup = self.setup
        weights = setup.mixing.weights(setup.node_id, t, len(active),
                                       {j: mixed[j].degree for j in mixed})
        given = self.book.mix_input(mixed, own)
        loop = asyncio.get_running_loop()
        prepare = setup.algorithm.prepare
        if given.copies is None:
            prepared = await loop.run_in_executor(setup.executor, prepare, state,
                                                  setup.node_id, weights, given.neighbours)
        else:
            prepared = await loop.run_in_executor(setup.executor, prepare, state,
                                                  setup.node_id, weights, given.neighbours,
                                                  given.copies)
        recorded = (weights if given.copies is None
                    else {j: given.scale * w for j, w in weights.items()})
        self.edges.record_round(t, active, recorded, given.theirs, given.mine)
        return prepared
