"""Which mixing matrix is in force in round ``t``: static or rebuilt every ``k`` rounds.

Two families of topology:

* *matrix* kinds (``dense``, ``sparse``, ``uniform``, ``custom``): the paper's constructions, which
  need a global view of the network. Time-varying means a fresh matrix every ``k`` rounds, drawn
  from ``(seed, t // k)`` — exactly the paper's "reconstruct the mixing matrix every 10 rounds".
* *graph* kinds (``ring``, ``complete``, ``random-regular``, ``erdos-renyi``, ``edge-list``) with
  Metropolis–Hastings weights, the weights a daemon computes locally. Time-varying means a
  subgraph of the base graph: :func:`active_edges` decides each edge from
  ``(seed, t // k, edge)`` alone, so both ends of an edge agree without asking anyone, and the
  result is always connected.

Everything is a pure function of the seed: the same spec gives the same matrices.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dacflnode.algorithms import graphs
from dacflnode.algorithms.mixing import (
    dense_random_matrix,
    metropolis_matrix,
    sparse_random_matrix,
    uniform_matrix,
    validate_mixing_matrix,
)
from dacflnode.algorithms.names import GRAPH_KINDS as GRAPH_KINDS
from dacflnode.algorithms.names import MATRIX_KINDS as MATRIX_KINDS
from dacflnode.algorithms.names import TOPOLOGIES as TOPOLOGIES
from dacflnode.errors import ConfigError, MixingMatrixError

# Salts keep the random streams of different uses of one seed apart.
_SALT_BASE = 0x746F706F
_SALT_EPOCH = 0x65706F63


def edge_hash(seed: int, epoch: int, i: int, j: int) -> float:
    """A uniform number in [0, 1) that depends only on ``(seed, epoch, {i, j})``."""
    a, b = min(i, j), max(i, j)
    digest = hashlib.blake2b(f"{seed}:{epoch}:{a}:{b}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def active_edges(
    n: int, base: graphs.Edges, seed: int, epoch: int, drop_prob: float = 0.5
) -> graphs.Edges:
    """The edges of ``base`` active in ``epoch``: each is dropped with probability ``drop_prob``
    unless dropping it would disconnect the graph.

    Edges are visited in the order of their hash, so the decision for each edge is a function of
    ``(seed, epoch, base graph)`` only, and the result is always connected.
    """
    if not 0.0 <= drop_prob < 1.0:
        raise ConfigError("drop_prob", f"must be in [0, 1), got {drop_prob}")
    current = set(base)
    ranked = sorted(base, key=lambda e: (edge_hash(seed, epoch, *e), e))
    for edge in ranked:
        if edge_hash(seed ^ _SALT_EPOCH, epoch, *edge) >= drop_prob:
            continue
        trial = current - {edge}
        if graphs.is_connected(n, tuple(sorted(trial))):
            current = trial
    return tuple(sorted(current))


@dataclass(frozen=True)
class TopologySpec:
    """What the user asked for: ``topology`` is one of the kinds in the module docstring."""

    topology: str = "dense"
    nodes: int = 10
    seed: int = 0
    time_varying: int = 0  # rebuild every k rounds; 0 = static
    degree: int = 3  # random-regular
    edge_prob: float = 0.3  # erdos-renyi
    zero_fraction: float = 0.5  # sparse (the paper's ψ = 0.5)
    drop_prob: float = 0.5  # time-varying graph kinds
    edge_list: str | None = None  # edge-list
    matrix: tuple[tuple[float, ...], ...] | None = None  # custom

    def validate(self) -> None:
        if self.topology not in TOPOLOGIES:
            raise ConfigError("topology", f"unknown topology '{self.topology}' (choose from "
                                          f"{', '.join(TOPOLOGIES)})")
        if self.nodes < 2:
            raise ConfigError("nodes", f"a network needs at least 2 nodes, got {self.nodes}")
        if self.time_varying < 0:
            raise ConfigError("time_varying", f"must be >= 0 rounds, got {self.time_varying}")
        if self.topology == "custom" and self.matrix is None:
            raise ConfigError("mixing_matrix", "topology 'custom' needs a mixing matrix file")
        if self.topology == "edge-list" and not self.edge_list:
            raise ConfigError("edge_list", "topology 'edge-list' needs an edge list file")


@dataclass
class MixingSchedule:
    """``matrix(t)`` is the mixing matrix of round ``t`` (cached per epoch)."""

    spec: TopologySpec
    _cache: dict[int, np.ndarray] = field(default_factory=dict, repr=False)
    _base: graphs.Edges | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.spec.validate()
        if self.spec.topology in GRAPH_KINDS:
            self._base = self._base_graph()
        elif self.spec.topology == "custom":
            w = np.asarray(self.spec.matrix, dtype=np.float64)
            if w.shape != (self.spec.nodes, self.spec.nodes):
                raise ConfigError(
                    "mixing_matrix",
                    f"matrix is {w.shape[0]}x{w.shape[1] if w.ndim == 2 else '?'}"
                    f" but nodes = {self.spec.nodes}",
                )
            try:
                validate_mixing_matrix(w)
            except MixingMatrixError as exc:
                raise ConfigError("mixing_matrix", str(exc)) from exc
        self.matrix(0)  # fail early on impossible settings

    @property
    def n(self) -> int:
        return self.spec.nodes

    def epoch(self, t: int) -> int:
        return t // self.spec.time_varying if self.spec.time_varying else 0

    def base_edges(self) -> graphs.Edges | None:
        """The base graph of a graph kind (None for matrix kinds)."""
        return self._base

    def edges(self, t: int) -> graphs.Edges:
        """Edges active in round ``t``."""
        if self._base is not None:
            return self._graph_edges(self.epoch(t))
        w = self.matrix(t)
        return tuple((i, j) for i in range(self.n) for j in range(i + 1, self.n) if w[i, j] != 0.0)

    def _graph_edges(self, epoch: int) -> graphs.Edges:
        assert self._base is not None
        if not self.spec.time_varying:
            return self._base
        return active_edges(self.n, self._base, self.spec.seed, epoch, self.spec.drop_prob)

    def matrix(self, t: int) -> np.ndarray:
        e = self.epoch(t)
        cached = self._cache.get(e)
        if cached is None:
            cached = self._build(e)
            validate_mixing_matrix(cached)
            self._cache = {e: cached}  # one epoch at a time: rounds run in order
        return cached

    def _rng(self, epoch: int) -> np.random.Generator:
        return np.random.default_rng([_SALT_BASE, self.spec.seed, epoch])

    def _base_graph(self) -> graphs.Edges:
        s = self.spec
        rng = np.random.default_rng([_SALT_BASE, s.seed])
        if s.topology == "ring":
            return graphs.ring(s.nodes)
        if s.topology == "complete":
            return graphs.complete(s.nodes)
        if s.topology == "random-regular":
            return graphs.random_regular(s.nodes, s.degree, rng)
        if s.topology == "erdos-renyi":
            return graphs.erdos_renyi(s.nodes, s.edge_prob, rng)
        assert s.edge_list is not None
        n, edges = graphs.read_edge_list(Path(s.edge_list))
        if n != s.nodes:
            raise ConfigError("edge_list", f"{s.edge_list} has {n} nodes but nodes = {s.nodes}")
        return edges

    def _build(self, epoch: int) -> np.ndarray:
        s = self.spec
        if s.topology == "uniform":
            return uniform_matrix(s.nodes)
        if s.topology == "custom":
            return np.asarray(s.matrix, dtype=np.float64)
        if s.topology == "dense":
            return dense_random_matrix(s.nodes, self._rng(epoch))
        if s.topology == "sparse":
            return sparse_random_matrix(s.nodes, self._rng(epoch), s.zero_fraction)
        return metropolis_matrix(s.nodes, self._graph_edges(epoch))


def load_matrix_file(path: str | Path) -> tuple[tuple[float, ...], ...]:
    """Read a whitespace/comma separated square matrix (``#`` comments allowed)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError("mixing_matrix", f"cannot read {path}: {exc.strerror}") from exc
    rows: list[tuple[float, ...]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        body = line.split("#", 1)[0].replace(",", " ").split()
        if not body:
            continue
        try:
            rows.append(tuple(float(v) for v in body))
        except ValueError as exc:
            raise ConfigError("mixing_matrix", f"{path}:{lineno}: not a number: {exc}") from exc
    if not rows or any(len(r) != len(rows) for r in rows):
        raise ConfigError("mixing_matrix", f"{path} does not hold a square matrix")
    return tuple(rows)
