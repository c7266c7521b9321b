"""Fault schedules: which edge-rounds are lost, and when nodes crash, leave or join.

One plan drives the simulator (``dacflnode simulate --faults FILE``) and every daemon of a
cluster (``dacflnode start --faults FILE``, which ``dacflnode launch --faults FILE`` passes to
each node), so a run with an injected fault is deterministic and the same on both.

.. code-block:: yaml

    faults:
      - {drop: node-2, rounds: [5, 7]}             # node-2 stalls in rounds 5..7
      - {drop: [node-0, node-1], rounds: [3, 3]}   # node-0's round-3 state never reaches node-1
      - {cut: [node-1, node-2], round: 4, heal: 9} # the edge is down in rounds 4..8
      - {crash: node-3, round: 6, restart: 10}     # simulator only
      - {leave: node-1, round: 12}                 # simulator only
      - {join: node-4, round: 3}                   # simulator only
      - {poison: node-2, rounds: [10, 12], scale: 5.0, to: [node-1]}  # a misbehaving member

The file is either that mapping or the bare list. Rounds are the runner's round numbers, the
ones states carry on the wire: round ``t`` is the exchange that follows ``t`` completed rounds
(its metrics line says ``"round": t + 1``).

``drop: NODE`` with ``rounds: [a, b]`` (or one round, ``rounds: a``)
    In rounds ``a..b`` (both included) NODE's states reach nobody and it receives none: a stall
    as its neighbours see it, on both ends of every edge of NODE.
``drop: [FROM, TO]``
    Only FROM's states to TO are lost (one direction), so TO mixes without FROM while FROM
    still mixes TO: a one-sided edge use.
``cut: [A, B]`` with ``round: a`` and ``heal: b``
    Both directions of the edge, from round ``a`` until round ``b`` (excluded); without ``heal``
    for the rest of the run.
``crash: NODE`` with ``round: a`` and ``restart: b``
    NODE stops at the start of round ``a`` and resumes from its last completed round when the
    others reach round ``b`` (``b = a``: at once); without ``restart`` it is gone for good.
``leave: NODE`` with ``round: a``
    NODE drains: it leaves the network at round ``a``, handing its share on.
``join: NODE`` with ``round: a``
    NODE is not started with the others; it starts, as a joining node, when they reach
    round ``a``.
``poison: NODE`` with ``rounds: [a, b]`` (or one round), ``scale: S`` and optionally ``to: [..]``
    In rounds ``a..b`` NODE multiplies every tensor it sends (pushes and pulls it serves) by
    ``S`` (``-1``: a sign flip), to every neighbour or only to those listed in ``to``. Its own
    state stays honest and the checksum is correct: a member that misbehaves, not a corrupted
    link. A run whose plan has a poison entry turns the receivers' state guard on in the
    simulator too (docs/security.md).

:meth:`FaultPlan.drops` answers, for one edge-round, whether the sender's state is lost: a
dropped edge-round is neither pushed by the sender nor waited for by the receiver. A node that
is down (crashed and not yet restarted, or not yet joined) counts as stalled in those rounds.
Crash, leave and join need someone to start and stop nodes, which the simulator does;
:func:`check_for_daemons` refuses them for real daemons, where a crash is a ``kill -9``, a leave
is ``dacflnode stop --drain`` and a join is starting the daemon later.

Every problem is a :class:`~dacflnode.errors.ConfigError` whose ``field`` is the dotted key
(``faults[2].rounds``) and whose message names the file: a node id not in the run, and a drop,
cut or poison of a pair that is not an edge of the run's graph (which would never happen), too.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dacflnode.config.reader import FileErrors, describe, read_yaml
from dacflnode.security.certs import NODE_ID_RE

__all__ = [
    "Crash",
    "Cut",
    "Drop",
    "Event",
    "FaultPlan",
    "Join",
    "Leave",
    "Poison",
    "Stall",
    "check_for_daemons",
    "load_fault_plan",
    "parse_fault_plan",
]


@dataclass(frozen=True)
class Stall:
    """``node`` neither sends nor receives in rounds ``first..last`` (both included)."""

    node: str
    first: int
    last: int


@dataclass(frozen=True)
class Drop:
    """``sender``'s states to ``receiver`` are lost in rounds ``first..last`` (both included)."""

    sender: str
    receiver: str
    first: int
    last: int


@dataclass(frozen=True)
class Cut:
    """The edge ``a``–``b`` is down both ways from round ``start`` until ``heal`` (excluded;
    ``None``: for good)."""

    a: str
    b: str
    start: int
    heal: int | None = None


@dataclass(frozen=True)
class Crash:
    """``node`` stops at the start of round ``round``; it resumes from its last completed round
    when the others reach ``restart`` (``None``: never)."""

    node: str
    round: int
    restart: int | None = None


@dataclass(frozen=True)
class Leave:
    """``node`` leaves the network (drains) at round ``round``."""

    node: str
    round: int


@dataclass(frozen=True)
class Join:
    """``node`` starts late: when the others reach round ``round``, as a joining node."""

    node: str
    round: int


@dataclass(frozen=True)
class Poison:
    """``node`` multiplies what it sends in rounds ``first..last`` (both included) by ``scale``,
    to ``to`` only (empty: to every neighbour)."""

    node: str
    first: int
    last: int
    scale: float
    to: tuple[str, ...] = ()


Event = Stall | Drop | Cut | Crash | Leave | Join | Poison

#: What each kind of event is spelled as in YAML, with the keys it takes besides its own.
_KEYS: dict[str, tuple[str, ...]] = {
    "drop": ("rounds",),
    "cut": ("round", "heal"),
    "crash": ("round", "restart"),
    "leave": ("round",),
    "join": ("round",),
    "poison": ("rounds", "scale", "to"),
}
_REQUIRED: dict[str, tuple[str, ...]] = {
    "drop": ("rounds",),
    "cut": ("round",),
    "crash": ("round",),
    "leave": ("round",),
    "join": ("round",),
    "poison": ("rounds", "scale"),
}


def _name(event: Event) -> str:
    """What ``event`` is called in a plan file (``crash``, ``leave``, ...)."""
    return type(event).__name__.lower()


def _within(round_: int, start: int, end: int | None) -> bool:
    """``start <= round_ < end`` (``end`` None: no end)."""
    return start <= round_ and (end is None or round_ < end)


class FaultPlan:
    """A checked list of fault events, with the questions runners and the simulator ask of it.

    ``source`` is the file the plan was read from (for messages), ``None`` for a plan built in
    code. Build from events directly (``FaultPlan([Drop("a", "b", 3, 3)])``) or with
    :func:`load_fault_plan`; :meth:`check` validates events built in code the same way.
    """

    def __init__(self, events: Iterable[Event] = (), source: Path | None = None) -> None:
        self.events: tuple[Event, ...] = tuple(events)
        self.source = source
        self.poisons = tuple(e for e in self.events if isinstance(e, Poison))
        self.crashes = tuple(e for e in self.events if isinstance(e, Crash))
        self.leaves = tuple(e for e in self.events if isinstance(e, Leave))
        self.joins = tuple(e for e in self.events if isinstance(e, Join))
        #: per node: the rounds ``[start, end)`` in which it neither sends nor receives
        self._off: dict[str, list[tuple[int, int | None]]] = {}
        #: per directed edge: the rounds ``[start, end)`` in which its states are lost
        self._lost: dict[tuple[str, str], list[tuple[int, int | None]]] = {}
        for event in self.events:
            if isinstance(event, Stall):
                self._off.setdefault(event.node, []).append((event.first, event.last + 1))
            elif isinstance(event, Drop):
                self._lost.setdefault((event.sender, event.receiver), []).append(
                    (event.first, event.last + 1))
            elif isinstance(event, Cut):
                for pair in ((event.a, event.b), (event.b, event.a)):
                    self._lost.setdefault(pair, []).append((event.start, event.heal))
            elif isinstance(event, Crash):
                self._off.setdefault(event.node, []).append((event.round, event.restart))
            elif isinstance(event, Join):
                self._off.setdefault(event.node, []).append((0, event.round))

    def __bool__(self) -> bool:
        return bool(self.events)

    def __repr__(self) -> str:
        return f"FaultPlan({list(self.events)!r})"

    # ------------------------------------------------------------------ edge-rounds
    def drops(self, sender: str, receiver: str, round_: int) -> bool:
        """Whether ``sender``'s round-``round_`` state to ``receiver`` is lost: the sender does
        not push it and the receiver does not wait for it."""
        if self.down(sender, round_) or self.down(receiver, round_):
            return True
        return any(_within(round_, s, e) for s, e in self._lost.get((sender, receiver), ()))

    def down(self, node: str, round_: int) -> bool:
        """Whether ``node`` is cut off from everyone in round ``round_``: stalled, crashed and
        not yet restarted, or not yet joined."""
        return any(_within(round_, s, e) for s, e in self._off.get(node, ()))

    def poison(self, sender: str, receiver: str, round_: int) -> float | None:
        """The factor ``sender`` multiplies its round-``round_`` state to ``receiver`` by
        (several entries that overlap multiply), or ``None``."""
        factor: float | None = None
        for event in self.events:
            if (isinstance(event, Poison) and event.node == sender
                    and event.first <= round_ <= event.last
                    and (not event.to or receiver in event.to)):
                factor = event.scale * (1.0 if factor is None else factor)
        return factor

    # ------------------------------------------------------------------ node events
    def crashes_of(self, node: str) -> list[Crash]:
        """``node``'s crashes, earliest first."""
        return sorted((c for c in self.crashes if c.node == node), key=lambda c: c.round)

    def leave_round(self, node: str) -> int | None:
        return next((e.round for e in self.leaves if e.node == node), None)

    def join_round(self, node: str) -> int | None:
        return next((e.round for e in self.joins if e.node == node), None)

    @property
    def node_events(self) -> tuple[Crash | Leave | Join, ...]:
        """The events that start or stop a node (only the simulator plays them)."""
        return tuple(e for e in self.events if isinstance(e, Crash | Leave | Join))

    # ------------------------------------------------------------------ checks
    def check(
        self, ids: Collection[str] | None = None, rounds: int | None = None,
        edges: Iterable[tuple[str, str]] | None = None,
    ) -> FaultPlan:
        """Raise a ConfigError for an event that names a node not in ``ids``, an edge not in
        ``edges`` (the run's graph, either direction; ``None``: every pair of nodes may talk),
        starts at or after round ``rounds`` where that would never happen, or contradicts
        another event of the same node; return the plan."""
        errors = FileErrors(self.source)
        for i, event in enumerate(self.events):
            _check_event(event, f"faults[{i}]", errors, ids, rounds)
        if edges is not None:
            self._check_edges(errors, edges)
        self._check_node_events(errors)
        return self

    def _check_edges(self, errors: FileErrors, edges: Iterable[tuple[str, str]]) -> None:
        """Every edge an event drops, cuts or poisons is an edge of the graph: a plan entry on
        a non-edge would never happen."""
        adjacent: dict[str, set[str]] = {}
        for a, b in edges:
            adjacent.setdefault(a, set()).add(b)
            adjacent.setdefault(b, set()).add(a)
        for i, event in enumerate(self.events):
            pairs: list[tuple[str, str, str]]
            if isinstance(event, Drop):
                pairs = [(event.sender, event.receiver, "drop")]
            elif isinstance(event, Cut):
                pairs = [(event.a, event.b, "cut")]
            elif isinstance(event, Poison):
                pairs = [(event.node, to, f"to[{k}]") for k, to in enumerate(event.to)]
            else:
                continue
            for a, b, key in pairs:
                if b not in adjacent.get(a, ()):
                    near = ", ".join(sorted(adjacent.get(a, ()))) or "none"
                    raise errors.error(
                        f"faults[{i}].{key}",
                        f"{a} -- {b} is not an edge of this run's graph ({a}'s neighbours: "
                        f"{near}), so this entry would never happen: name an edge of the graph")

    def _check_node_events(self, errors: FileErrors) -> None:
        """Per node: one join, one leave, crashes that do not overlap, all while it runs."""
        first: dict[tuple[str, str], int] = {}
        for i, event in enumerate(self.events):
            if isinstance(event, Join | Leave):
                verb = "join" if isinstance(event, Join) else "leave"
                key = (verb, event.node)
                if key in first:
                    raise errors.error(f"faults[{i}]", f"{event.node} {verb}s twice (faults"
                                    f"[{first[key]}] already says when)")
                first[key] = i
        for node in sorted({e.node for e in self.node_events}):
            join = self.join_round(node)
            leave = self.leave_round(node)
            if join is not None and leave is not None and leave <= join:
                raise errors.error(f"faults[{first[('leave', node)]}].round",
                                f"{node} leaves in round {leave}, not after it joins ({join})")
            running_from = join if join is not None else 0
            gone = False
            for crash in self.crashes_of(node):
                i = self.events.index(crash)
                if gone:
                    raise errors.error(f"faults[{i}]", f"{node} has crashed for good before "
                                    f"round {crash.round}")
                if crash.round < running_from:
                    raise errors.error(f"faults[{i}].round",
                                    f"{node} crashes in round {crash.round}, before it runs "
                                    f"(again) in round {running_from}")
                if leave is not None and crash.round >= leave:
                    raise errors.error(f"faults[{i}].round",
                                    f"{node} crashes in round {crash.round}, after it leaves "
                                    f"(round {leave})")
                if crash.restart is None:
                    gone = True
                    if leave is not None:
                        raise errors.error(f"faults[{i}].restart", f"{node} crashes for good, so "
                                        f"it cannot leave in round {leave}: give a restart")
                else:
                    running_from = crash.restart


def _check_event(
    event: Event, field: str, errors: FileErrors, ids: Collection[str] | None, rounds: int | None
) -> None:
    nodes: list[tuple[str, str]]
    if isinstance(event, Stall):
        nodes = [(event.node, "drop")]
    elif isinstance(event, Drop):
        nodes = [(event.sender, "drop[0]"), (event.receiver, "drop[1]")]
    elif isinstance(event, Cut):
        nodes = [(event.a, "cut[0]"), (event.b, "cut[1]")]
    elif isinstance(event, Poison):
        nodes = [(event.node, "poison"), *((n, f"to[{k}]") for k, n in enumerate(event.to))]
    else:
        nodes = [(event.node, _name(event))]
    for node, key in nodes:
        if not NODE_ID_RE.fullmatch(node):
            raise errors.error(f"{field}.{key}", f"not a node id: {node!r}")
        if ids is not None and node not in ids:
            close = difflib.get_close_matches(node, list(ids), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise errors.error(f"{field}.{key}", f"no node {node!r} in this run{hint}")
    if isinstance(event, Poison):
        if not 0 <= event.first <= event.last:
            raise errors.error(f"{field}.rounds", f"expected 0 <= first <= last, got "
                            f"[{event.first}, {event.last}]")
        if not math.isfinite(event.scale) or event.scale == 1.0:
            raise errors.error(f"{field}.scale", f"expected a finite factor other than 1 (-1 flips "
                            f"the sign), got {event.scale}")
        if event.node in event.to:
            raise errors.error(f"{field}.to", f"{event.node} does not send to itself")
        return
    if len(nodes) == 2 and nodes[0][0] == nodes[1][0]:
        raise errors.error(f"{field}.{nodes[0][1][:-3]}", f"an edge joins two nodes, got "
                        f"{nodes[0][0]} twice")
    if isinstance(event, Stall | Drop):
        if not 0 <= event.first <= event.last:
            raise errors.error(f"{field}.rounds", f"expected 0 <= first <= last, got "
                            f"[{event.first}, {event.last}]")
        return
    start = event.start if isinstance(event, Cut) else event.round
    if start < 0:
        raise errors.error(f"{field}.round", f"must be >= 0, got {start}")
    if isinstance(event, Cut) and event.heal is not None and event.heal <= event.start:
        raise errors.error(f"{field}.heal", f"must come after round {event.start}, got "
                        f"{event.heal}")
    if isinstance(event, Join) and event.round < 1:
        raise errors.error(f"{field}.round", "a node that joins in round 0 starts with the others: "
                        "leave the event out")
    if isinstance(event, Crash) and event.restart is not None and event.restart < event.round:
        raise errors.error(f"{field}.restart", f"must not come before round {event.round}, got "
                        f"{event.restart}")
    if rounds is not None and isinstance(event, Crash | Leave | Join) and event.round >= rounds:
        raise errors.error(f"{field}.round", f"the run has rounds 0..{rounds - 1}, so round "
                        f"{event.round} never comes")


# ---------------------------------------------------------------------------------------- files
def load_fault_plan(
    path: str | Path, ids: Collection[str] | None = None, rounds: int | None = None,
    edges: Iterable[tuple[str, str]] | None = None,
) -> FaultPlan:
    """Read and check a plan file (see the module docstring); node ids are checked against
    ``ids``, dropped, cut and poisoned edges against the graph's ``edges`` and node events
    against a run of ``rounds`` rounds when given."""
    file, data = read_yaml(path, "faults")
    return parse_fault_plan(data, file, ids, rounds, edges)


def parse_fault_plan(
    data: Any, source: Path | None = None, ids: Collection[str] | None = None,
    rounds: int | None = None, edges: Iterable[tuple[str, str]] | None = None,
) -> FaultPlan:
    """Check the parsed YAML ``data`` of a plan (``source``: the file, for messages)."""
    errors = FileErrors(source)
    if isinstance(data, Mapping):
        extra = [str(k) for k in data if k != "faults"]
        if extra:
            raise errors.error(extra[0], "unknown key (a fault plan has one key: faults)")
        data = data.get("faults")
    if data is None:
        data = []
    if not isinstance(data, list):
        raise errors.error("faults", f"expected a list of events, got {describe(data)}")
    events = [_parse_event(item, f"faults[{i}]", errors) for i, item in enumerate(data)]
    return FaultPlan(events, source).check(ids, rounds, edges)


def _parse_event(item: Any, field: str, errors: FileErrors) -> Event:
    if not isinstance(item, Mapping):
        raise errors.error(field, f"expected a mapping such as {{drop: node-1, rounds: [3, 5]}}, "
                        f"got {describe(item)}")
    keys = {str(k).replace("-", "_"): v for k, v in item.items()}
    names = [k for k in keys if k in _KEYS]
    if len(names) != 1:
        found = f"{', '.join(names)}" if names else "none"
        raise errors.error(field, f"give exactly one of {', '.join(_KEYS)} (found {found})")
    name = names[0]
    for key in keys:
        if key != name and key not in _KEYS[name]:
            allowed = ", ".join(_KEYS[name])
            raise errors.error(f"{field}.{key}", f"unknown key for a {name} event (it takes "
                            f"{allowed})")
    for key in _REQUIRED[name]:
        if key not in keys:
            raise errors.error(f"{field}.{key}", f"a {name} event needs it")
    target = keys[name]
    if name == "drop":
        first, last = _rounds(keys["rounds"], f"{field}.rounds", errors)
        if isinstance(target, list):
            sender, receiver = _pair(target, f"{field}.drop", errors)
            return Drop(sender, receiver, first, last)
        return Stall(_node(target, f"{field}.drop", errors), first, last)
    if name == "poison":
        first, last = _rounds(keys["rounds"], f"{field}.rounds", errors)
        to = keys.get("to", [])
        if isinstance(to, str | int) and not isinstance(to, bool):
            to = [to]
        if not isinstance(to, list):
            raise errors.error(f"{field}.to", f"expected a list of node ids, got {describe(to)}")
        return Poison(_node(target, f"{field}.poison", errors), first, last,
                      _scale(keys["scale"], f"{field}.scale", errors),
                      tuple(_node(n, f"{field}.to[{k}]", errors) for k, n in enumerate(to)))
    if name == "cut":
        a, b = _pair(target, f"{field}.cut", errors)
        heal = keys.get("heal")
        return Cut(a, b, _round(keys["round"], f"{field}.round", errors),
                   None if heal is None else _round(heal, f"{field}.heal", errors))
    node = _node(target, f"{field}.{name}", errors)
    round_ = _round(keys["round"], f"{field}.round", errors)
    if name == "crash":
        restart = keys.get("restart")
        return Crash(node, round_,
                     None if restart is None else _round(restart, f"{field}.restart", errors))
    return Leave(node, round_) if name == "leave" else Join(node, round_)


def _node(value: Any, field: str, errors: FileErrors) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise errors.error(field, f"expected a node id, got {describe(value)}")
    text = str(value).strip()
    if not NODE_ID_RE.fullmatch(text):
        raise errors.error(field, f"not a node id: {value!r}")
    return text


def _pair(value: Any, field: str, errors: FileErrors) -> tuple[str, str]:
    if not isinstance(value, list) or len(value) != 2:
        raise errors.error(field, f"expected two node ids [A, B], got {describe(value)}")
    return _node(value[0], f"{field}[0]", errors), _node(value[1], f"{field}[1]", errors)


def _round(value: Any, field: str, errors: FileErrors) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.error(field, f"expected a round number, got {describe(value)}")
    if value < 0:
        raise errors.error(field, f"must be >= 0, got {value}")
    return value


def _scale(value: Any, field: str, errors: FileErrors) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise errors.error(field, f"expected a number such as 5.0 or -1, got {describe(value)}")
    return float(value)


def _rounds(value: Any, field: str, errors: FileErrors) -> tuple[int, int]:
    """``[a, b]`` (rounds a..b) or one round ``a``."""
    if isinstance(value, list):
        if len(value) != 2:
            raise errors.error(field, f"expected [first, last], got {len(value)} values")
        first = _round(value[0], f"{field}[0]", errors)
        last = _round(value[1], f"{field}[1]", errors)
        if last < first:
            raise errors.error(field, f"the last round comes before the first: [{first}, {last}]")
        return first, last
    one = _round(value, field, errors)
    return one, one


# ---------------------------------------------------------------------------------------- daemons
def check_for_daemons(plan: FaultPlan, what: str = "a daemon") -> FaultPlan:
    """``plan`` if it only drops, cuts and poisons edge-rounds, else a ConfigError naming the first
    crash, leave or join, which only the simulator can play."""
    how = {Crash: "kill -9 the daemon and start it again",
           Leave: "`dacflnode stop --drain` it",
           Join: "start its daemon later"}
    for i, event in enumerate(plan.events):
        if isinstance(event, Crash | Leave | Join):
            name = _name(event)
            raise FileErrors(plan.source).error(
                f"faults[{i}].{name}",
                f"{what} plays only drop, cut and poison events; a {name} is played by "
                f"`dacflnode simulate --faults` (on real daemons, {how[type(event)]})")
    return plan

