"""One feature scale for a table run, agreed by the nodes before their first round, with no
server and without revealing any node's own statistics (docs/data.md, "One scale for the
network").

Each node contributes its :class:`~dacflnode.learning.feature_scale.LocalMoments`: per
numeric feature the count of its values, their sum and sum of squares (and, for ``minmax``, its
minimum and maximum). The network needs only their totals. The agreement floods items through
the neighbours (every node asks each neighbour for the items of a phase it lacks, and serves what
it holds, until it holds one item from every node of the run):

1. **keys**: each node's X25519 public key and its neighbours (from which every node learns who
   the run's nodes are: the closure of the neighbour lists);
2. **sums**: each node's statistics as exact integers plus its pairwise masks with every other
   node (:mod:`dacflnode.algorithms.secure_sum`), and the member list it masked for. A masked
   vector is uniformly random to any node without all of its masks; the masks cancel in the
   sum, so every node adds the same vectors to the same exact totals, and builds the same
   :class:`FeatureScale` from them, bit for bit. ``minmax``'s extremes cannot be masked in a
   sum: they travel in the clear (each node's minimum and maximum are then known to the network;
   ``standardize`` reveals nothing of a node's own).

A node that starts after the others agreed (a late joiner), or again (a restart: the scale is in
its state folder and checkpoint), asks its neighbours for the agreed scale itself (phase 3) or
reads its file, and takes no part in a flood. The simulator, which holds every node's data in
one process, adds the same totals directly (:func:`scale_of`): the same scale, bit for bit.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from dacflnode.algorithms import secure_sum
from dacflnode.filemodes import SECRET_MODE, write_bytes
from dacflnode.learning.feature_scale import FeatureScale, LocalMoments
from dacflnode.security.pair_keys import PUBLIC_KEY_BYTES, PairKeys
from dacflnode.transport.base import PeerUnavailable, Transport, TransportClosed
from dacflnode.wire.agreement import AgreeItem, AgreePhase
from dacflnode.wire.errors import WireError

log = logging.getLogger(__name__)

#: The agreed scale in a node's state folder (read back by a restart).
SCALE_FILE = "feature-scale.json"
#: Deadline of one Agree call, in seconds.
CALL_TIMEOUT = 5.0


class AgreementFailed(RuntimeError):
    """The nodes could not agree on a feature scale (the message says why and what to do)."""


def _vector(moments: LocalMoments) -> list[int]:
    """The integers a node contributes: counts, then exact sums, then exact sums of squares."""
    return ([int(n) for n in moments.count] + [secure_sum.exact_int(t) for t in moments.total]
            + [secure_sum.exact_int(q) for q in moments.squares])


def _extremes(moments: LocalMoments) -> bytes:
    return np.asarray(moments.low + moments.high, dtype="<f8").tobytes()


def _scale(method: str, columns: Sequence[int], totals: Sequence[int],
           low: Sequence[float], high: Sequence[float]) -> FeatureScale:
    k = len(columns)
    return FeatureScale.from_totals(
        method, columns, totals[:k], [secure_sum.exact_value(t) for t in totals[k:2 * k]],
        [secure_sum.exact_value(t) for t in totals[2 * k:]], low, high)


def scale_of(method: str, moments: Sequence[LocalMoments]) -> FeatureScale:
    """The scale of ``moments`` (every node's) added up directly: what the flood agrees on."""
    columns = moments[0].columns
    vectors = [_vector(m) for m in moments]
    totals = [sum(column) for column in zip(*vectors, strict=True)]
    low = [min(m.low[j] for m in moments) for j in range(len(columns))]
    high = [max(m.high[j] for m in moments) for j in range(len(columns))]
    if method != "minmax":
        low, high = [math.inf] * len(columns), [-math.inf] * len(columns)
    return _scale(method, columns, totals, low, high)


class ScaleAgreement:
    """One node's side of the agreement: what it serves (:meth:`serve`, which the transport's
    receiver calls for every ``Agree`` request) and what it does (:meth:`settle`).

    ``apply`` transforms the node's tensors in place with the agreed scale; ``state_dir`` keeps
    it (:data:`SCALE_FILE`) for a restart, as the checkpoints do (``saved``: the one a restart's
    checkpoint holds); ``context`` (the run's fingerprint) keys the masks.
    """

    def __init__(self, node_id: str, method: str, moments: LocalMoments,
                 apply: Callable[[FeatureScale], None], *, context: bytes,
                 state_dir: Path | None = None, saved: str | None = None) -> None:
        self.node_id = node_id
        self.method = method
        self.moments = moments
        self._apply = apply
        self.context = context + b"/" + method.encode()
        self.state_dir = state_dir
        #: the scale a restart's checkpoint holds (its meta ``feature_scale``)
        self._saved_json = saved
        self.scale: FeatureScale | None = None
        #: how this node got its scale: "agreed", "asked" (a neighbour's), "saved" (its file)
        self.source = ""
        self._keys = PairKeys()
        self._items: dict[AgreePhase, dict[str, AgreeItem]] = {p: {} for p in AgreePhase}

    @property
    def length(self) -> int:
        return 3 * len(self.moments.columns)

    # ------------------------------------------------------------------ serving
    def serve(self, sender: str, phase: AgreePhase, have: frozenset[str]) -> list[AgreeItem]:
        """The items of ``phase`` this node holds and ``sender`` lacks."""
        if phase is AgreePhase.SCALE:
            if self.scale is None:
                return []
            return [AgreeItem(self.node_id, (), self.scale.to_json().encode())]
        held = self._items[phase]
        return [held[o] for o in sorted(held) if o not in have]

    def _take(self, phase: AgreePhase, item: AgreeItem, peer: str) -> None:
        """Keep ``item`` (relayed by ``peer``) unless it is malformed or a second one."""
        expected = {AgreePhase.KEYS: PUBLIC_KEY_BYTES,
                    AgreePhase.SUMS: secure_sum.payload_bytes(self.length)
                    + (16 * len(self.moments.columns) if self.method == "minmax" else 0)}
        held = self._items[phase]
        if item.origin in held:
            if held[item.origin] != item:
                log.warning("%s relayed an agreement item of %s that differs from the one "
                            "held; kept the first", peer, item.origin,
                            extra={"event": "agreement_item_differs", "neighbour": peer})
            return
        if len(item.payload) != expected[phase]:
            log.warning("%s relayed an agreement item of %s of %d bytes (expected %d); "
                        "ignored", peer, item.origin, len(item.payload), expected[phase],
                        extra={"event": "agreement_item_refused", "neighbour": peer})
            return
        held[item.origin] = item

    # ------------------------------------------------------------------ settling
    async def settle(self, transport: Transport, neighbours: Sequence[str],
                     timeout: float) -> FeatureScale:
        """This node's scale: its saved one, a neighbour's agreed one, or the flood's; applied
        to its tensors and saved. Raises :class:`AgreementFailed` after ``timeout`` seconds
        without one."""
        scale = self._saved()
        if scale is not None:
            return await self._adopt(scale, "saved")
        deadline = time.monotonic() + timeout
        asked = await self._ask_scale(transport, neighbours)
        if asked is not None:
            return await self._adopt(asked, "asked")
        self._items[AgreePhase.KEYS][self.node_id] = AgreeItem(
            self.node_id, tuple(sorted(neighbours)), self._keys.public)
        await self._flood(transport, neighbours, AgreePhase.KEYS, deadline, self._keys_closed)
        members = self._members()
        if not any(self.node_id in self._items[AgreePhase.KEYS][n].members
                   for n in neighbours if n in self._items[AgreePhase.KEYS]) and neighbours:
            # the others agreed without this node (it started late): take their scale
            return await self._adopt(
                await self._wait_for_scale(transport, neighbours, deadline), "asked")
        # the big-integer work (masks, sums) and the transform of the rows run in a thread:
        # the event loop keeps serving the neighbours' Agree calls meanwhile
        self._items[AgreePhase.SUMS][self.node_id] = AgreeItem(
            self.node_id, members, await asyncio.to_thread(self._masked, members))
        await self._flood(transport, neighbours, AgreePhase.SUMS, deadline,
                          lambda: set(members) <= set(self._items[AgreePhase.SUMS]))
        return await self._adopt(await asyncio.to_thread(self._combine, members), "agreed")

    def _members(self) -> tuple[str, ...]:
        keys = self._items[AgreePhase.KEYS]
        return tuple(sorted(set(keys) | {m for item in keys.values() for m in item.members}))

    def _keys_closed(self) -> bool:
        return set(self._members()) <= set(self._items[AgreePhase.KEYS])

    def _masked(self, members: Sequence[str]) -> bytes:
        keys = self._items[AgreePhase.KEYS]
        secrets = {}
        for other in members:
            if other == self.node_id:
                continue
            try:
                secrets[other] = self._keys.secret_with(keys[other].payload, self.context)
            except ValueError as err:
                raise AgreementFailed(f"feature agreement: {other}'s public key is not one "
                                      f"({err}); restart the run") from err
        payload = secure_sum.masked(_vector(self.moments), self.node_id, secrets, self.context)
        return payload + (_extremes(self.moments) if self.method == "minmax" else b"")

    def _combine(self, members: Sequence[str]) -> FeatureScale:
        sums = self._items[AgreePhase.SUMS]
        differ = [o for o in members if sums[o].members != tuple(members)]
        if differ:
            raise AgreementFailed(
                f"feature agreement: {differ[0]} masked for nodes {list(sums[differ[0]].members)}"
                f", this node for {list(members)}; the nodes disagree on who takes part: start "
                "them together (within hello_timeout)")
        cut = secure_sum.payload_bytes(self.length)
        totals = secure_sum.combine((sums[o].payload[:cut] for o in members), self.length)
        k = len(self.moments.columns)
        low, high = [math.inf] * k, [-math.inf] * k
        if self.method == "minmax":
            for o in members:
                ext = np.frombuffer(sums[o].payload[cut:], dtype="<f8")
                low = [min(a, float(b)) for a, b in zip(low, ext[:k], strict=True)]
                high = [max(a, float(b)) for a, b in zip(high, ext[k:], strict=True)]
        if any(not 0 <= n < 1 << 63 for n in totals[:k]):  # masks that did not cancel
            raise AgreementFailed("feature agreement: the masked sums do not add up (a key or "
                                  "a vector was altered on its way); restart the run")
        return _scale(self.method, self.moments.columns, totals, low, high)

    async def _ask(self, transport: Transport, peer: str, phase: AgreePhase
                   ) -> list[AgreeItem]:
        try:
            return await transport.agree(peer, phase, self._items[phase], CALL_TIMEOUT)
        except (PeerUnavailable, WireError, TransportClosed) as err:
            log.debug("agreement with %s: %s", peer, err,
                      extra={"event": "agreement_call_failed", "neighbour": peer})
            return []

    async def _flood(self, transport: Transport, neighbours: Sequence[str], phase: AgreePhase,
                     deadline: float, done: Callable[[], bool]) -> None:
        delay = 0.02
        while not done():
            replies = await asyncio.gather(*(self._ask(transport, p, phase) for p in neighbours))
            for peer, items in zip(neighbours, replies, strict=True):
                for item in items:
                    self._take(phase, item, peer)
            if done():
                return
            if time.monotonic() > deadline:
                missing = sorted(set(self._members()) - set(self._items[phase]))
                raise AgreementFailed(
                    f"feature agreement ({phase.name.lower()}): nothing from "
                    f"{', '.join(missing[:5])} in time; start every node of the run (the "
                    "agreement needs them all before the first round)")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _checked(self, payload: bytes, peer: str) -> FeatureScale | None:
        try:
            scale = FeatureScale.from_json(payload)
        except ValueError as err:
            log.warning("%s sent a feature scale that is not one: %s", peer, err,
                        extra={"event": "agreement_item_refused", "neighbour": peer})
            return None
        if scale.method != self.method or scale.columns != self.moments.columns:
            log.warning("%s sent a feature scale of another run (%s over %d features)", peer,
                        scale.method, len(scale.columns),
                        extra={"event": "agreement_item_refused", "neighbour": peer})
            return None
        return scale

    async def _ask_scale(self, transport: Transport, neighbours: Sequence[str]
                         ) -> FeatureScale | None:
        replies = await asyncio.gather(*(self._ask(transport, p, AgreePhase.SCALE)
                                         for p in neighbours))
        for peer, items in zip(neighbours, replies, strict=True):
            for item in items:
                scale = self._checked(item.payload, peer)
                if scale is not None:
                    return scale
        return None

    async def _wait_for_scale(self, transport: Transport, neighbours: Sequence[str],
                              deadline: float) -> FeatureScale:
        while time.monotonic() < deadline:
            scale = await self._ask_scale(transport, neighbours)
            if scale is not None:
                return scale
            await asyncio.sleep(0.5)
        raise AgreementFailed("feature agreement: the network agreed without this node and no "
                              "neighbour has sent the scale; start it again")

    # ------------------------------------------------------------------ the result
    def _saved(self) -> FeatureScale | None:
        if self._saved_json is not None:
            scale = self._checked(self._saved_json.encode(), "its checkpoint")
            if scale is not None:
                return scale
        if self.state_dir is None or not (self.state_dir / SCALE_FILE).is_file():
            return None
        scale = self._checked((self.state_dir / SCALE_FILE).read_bytes(), "its state folder")
        if scale is None:
            log.warning("%s does not hold this run's feature scale; agreeing again",
                        self.state_dir / SCALE_FILE, extra={"event": "feature_scale_stale"})
        return scale

    async def _adopt(self, scale: FeatureScale, source: str) -> FeatureScale:
        await asyncio.to_thread(self._apply, scale)
        self.scale, self.source = scale, source
        if self.state_dir is not None and source != "saved":
            await asyncio.to_thread(self._save, scale)
        log.info("feature scale %s (%s over %d features, %s)", scale.digest, scale.method,
                 len(scale.columns), source,
                 extra={"event": "feature_scale", "node": self.node_id})
        return scale

    def _save(self, scale: FeatureScale) -> None:
        assert self.state_dir is not None
        tmp = self.state_dir / (SCALE_FILE + ".tmp")
        write_bytes(tmp, scale.to_json().encode(), SECRET_MODE)
        os.replace(tmp, self.state_dir / SCALE_FILE)

