"""The daemon's own keys of a peers file's ``run:`` section (:class:`DaemonSettings`).

They sit beside the :class:`~dacflnode.config.run.RunConfig` keys in ``run:`` and are declared
the same way (:mod:`dacflnode.config.schema`), so their defaults exist here only. ``members``
and ``edges`` are the whole graph and must match on every node; the deadlines are each node's
own. Their structure (ids, pairs, a connected graph) is checked by
:mod:`dacflnode.peers.file`, which knows the file they came from.
"""

from __future__ import annotations

from dataclasses import dataclass

from dacflnode.config import schema
from dacflnode.config.schema import Scope, setting


@schema.declared
@dataclass(frozen=True)
class DaemonSettings:
    """How long a node waits, and the graph of the whole run."""

    round_deadline: float = setting(
        600.0,
        help="Seconds a node waits for its neighbours' state each round; a neighbour that"
        " misses it is left out of that round's mix.",
        scope=Scope.NODE,
        group="runtime",
        above=0.0,
    )
    hello_timeout: float = setting(
        3600.0,
        help="Seconds a node waits for its neighbours to come up at start.",
        scope=Scope.NODE,
        group="runtime",
        above=0.0,
    )
    stream_idle_timeout: float = setting(
        30.0,
        help="Seconds a neighbour's push stream may send nothing before this node cuts it and"
        " frees its buffer (a stalled sender cannot hold memory).",
        scope=Scope.NODE,
        above=0.0,
        cli=False,
    )
    first_message_timeout: float = setting(
        5.0,
        help="Seconds a neighbour's call may take to send its first message (a push stream's"
        " header, a pull or Hello request) before this node cuts it; a stalled call in a"
        " neighbour's name gives way to a new one after as long (docs/security.md).",
        scope=Scope.NODE,
        above=0.0,
        cli=False,
    )
    stream_timeout: float = setting(
        300.0,
        help="Seconds a whole push stream may take before this node cuts it; raise it for big"
        " models on slow links.",
        scope=Scope.NODE,
        above=0.0,
        cli=False,
    )
    gone_after: int = setting(
        3,
        help="Consecutive rounds a neighbour may miss before this node declares it gone, drops"
        " the edge and schedules a re-anchor (docs/faults.md).",
        scope=Scope.NODE,
        group="runtime",
        minimum=1,
    )
    anchor_delay: int = setting(
        0,
        help="Rounds between declaring a neighbour gone and the re-anchor round, so that the"
        " news reaches every node first; 0: the number of run.members (at least 4).",
        scope=Scope.NODE,
        minimum=0,
        cli=False,
    )
    drain_on_sigterm: bool = setting(
        False,
        help="SIGTERM makes the node leave the network (as `dacflnode stop --drain`) instead of"
        " stopping to resume later.",
        scope=Scope.NODE,
        cli=False,
    )
    members: tuple[str, ...] = setting(
        (),
        help="Every node id of the run, in partition order (members[i] is node i of the"
        " simulator).",
        scope=Scope.RUN,
        fingerprint=lambda d: list(d.members),
        cli=False,
    )
    edges: tuple[tuple[str, str], ...] = setting(
        (),
        help="The whole graph as [id, id] pairs over run.members.",
        scope=Scope.RUN,
        fingerprint=lambda d: [list(e) for e in d.edges],
        cli=False,
    )


#: The least rounds between declaring a neighbour gone and the re-anchor round.
MIN_ANCHOR_DELAY = 4


def anchor_delay(setting: int, nodes: int) -> int:
    """``anchor_delay`` as a node uses it: the setting, or when it is 0 (auto) the number of
    nodes, at least :data:`MIN_ANCHOR_DELAY`. News of a re-anchor needs up to the graph's
    diameter in rounds to reach every node, and the diameter is less than the number of
    nodes."""
    return setting or max(MIN_ANCHOR_DELAY, nodes)


#: The defaults, for code that takes a deadline as an argument.
DAEMON_DEFAULTS = DaemonSettings()
