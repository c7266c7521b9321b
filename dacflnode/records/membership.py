"""What a node knows about each neighbour: whether the edge takes part in the mix, from when,
and how often the neighbour failed it (docs/faults.md).

An edge is mixed in round ``t`` when the neighbour is :attr:`PeerState.ACTIVE` and
``t >= active_from``. The states:

* ``active``: it takes part (from ``active_from``; 0 for a neighbour that started with the run);
* ``absent``: it did not answer the handshake at start; it joins when it comes up;
* ``gone``: it missed ``gone_after`` rounds in a row; the node re-anchors, and tries every
  round to agree on a round from which the edge comes back (a restart, a healed partition);
* ``left``: it drained out of the network, after handing over its share of the FODAC mass;
* ``quarantined``: its states were refused as absurd or stale (:mod:`dacflnode.wire.state_guard`)
  :data:`QUARANTINE_OFFENCES` times within ``gone_after + 2`` rounds: declared gone for the
  rest of the run (never greeted, its calls refused), the node re-anchors.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any


class PeerState(enum.StrEnum):
    ACTIVE = "active"
    ABSENT = "absent"
    GONE = "gone"
    LEFT = "left"
    QUARANTINED = "quarantined"


#: Refused states (in distinct rounds, within ``gone_after + 2`` rounds) that quarantine an edge.
QUARANTINE_OFFENCES = 2


@dataclass
class PeerTrack:
    """One neighbour as this node sees it; counters count since the run started (they are kept
    in the checkpoint)."""

    state: PeerState = PeerState.ACTIVE
    #: first round whose mix includes the edge
    active_from: int = 0
    #: rounds whose deadline passed without its state, in all and in a row
    missed: int = 0
    consecutive: int = 0
    #: missed rounds in which it showed it was alive (a refusal, a Hello, a late push): late,
    #: not silent, so they do not count towards declaring it gone
    late: int = 0
    #: one-sided uses of the edge by this node, undone (docs/faults.md)
    corrections: int = 0
    #: the round of the HANDOVER it announced (``left`` only), until it is applied
    handover_round: int | None = None
    #: its states refused as absurd or stale (by this node, or this node's by it), and the
    #: rounds of the recent ones
    refused_states: int = 0
    offence_rounds: tuple[int, ...] = ()

    def mixes_in(self, round_: int) -> bool:
        return self.state is PeerState.ACTIVE and round_ >= self.active_from

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["state"] = self.state.value
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PeerTrack:
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        fields["state"] = PeerState(fields.get("state", "active"))
        fields["offence_rounds"] = tuple(fields.get("offence_rounds", ()))
        return cls(**fields)
