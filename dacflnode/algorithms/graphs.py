"""Undirected communication graphs on nodes ``0 … n-1``.

A graph is a sorted tuple of edges ``(i, j)`` with ``i < j``; no self loops, no duplicates.
Random graphs take a :class:`numpy.random.Generator`, so the same seed gives the same graph.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from dacflnode.errors import ConfigError

Edge = tuple[int, int]
Edges = tuple[Edge, ...]

#: Attempts before a random generator gives up finding a connected graph.
MAX_ATTEMPTS = 1000


def normalize_edges(n: int, edges: Iterable[tuple[int, int]]) -> Edges:
    """Sort, de-duplicate and orient edges as ``(min, max)``; reject self loops and bad ids."""
    out: set[Edge] = set()
    for a, b in edges:
        i, j = int(a), int(b)
        if not (0 <= i < n and 0 <= j < n):
            raise ConfigError("edges", f"edge ({i}, {j}) names a node outside 0..{n - 1}")
        if i == j:
            raise ConfigError("edges", f"edge ({i}, {j}) is a self loop")
        out.add((min(i, j), max(i, j)))
    return tuple(sorted(out))


def neighbours(n: int, edges: Edges) -> list[list[int]]:
    """Adjacency lists, each sorted."""
    adj: list[list[int]] = [[] for _ in range(n)]
    for i, j in edges:
        adj[i].append(j)
        adj[j].append(i)
    return [sorted(a) for a in adj]


def degrees(n: int, edges: Edges) -> list[int]:
    return [len(a) for a in neighbours(n, edges)]


def is_connected(n: int, edges: Edges) -> bool:
    if n <= 1:
        return True
    adj = neighbours(n, edges)
    seen = {0}
    stack = [0]
    while stack:
        for k in adj[stack.pop()]:
            if k not in seen:
                seen.add(k)
                stack.append(k)
    return len(seen) == n


def _need_nodes(topology: str, n: int, minimum: int) -> None:
    if n < minimum:
        raise ConfigError("nodes", f"topology '{topology}' needs at least {minimum} nodes, got {n}")


#: The fewest nodes of a ring (two nodes have one edge: a complete graph).
RING_MIN_NODES = 3


def ring(n: int) -> Edges:
    _need_nodes("ring", n, RING_MIN_NODES)
    return normalize_edges(n, ((i, (i + 1) % n) for i in range(n)))


def complete(n: int) -> Edges:
    _need_nodes("complete", n, 2)
    return tuple((i, j) for i in range(n) for j in range(i + 1, n))


def random_regular(n: int, degree: int, rng: np.random.Generator) -> Edges:
    """A connected random ``degree``-regular graph.

    First the pairing model with restarts (up to :data:`MAX_ATTEMPTS` draws). A draw is simple
    with probability about ``exp((1 − d²) / 4)``, so this finds a graph at once for small degrees
    but practically never for ``d ≥ 7`` or so; then the graph comes from
    :func:`_regular_by_switches` instead. Either way the same ``rng`` state gives the same graph.
    """
    _need_nodes("random-regular", n, 3)
    if not 2 <= degree < n:
        raise ConfigError("degree", f"random-regular needs 2 <= degree < nodes, got {degree}")
    if (n * degree) % 2:
        raise ConfigError("degree", f"nodes x degree must be even, got {n} x {degree}")
    for _ in range(MAX_ATTEMPTS):
        stubs = np.repeat(np.arange(n), degree)
        rng.shuffle(stubs)
        pairs = stubs.reshape(-1, 2)
        if np.any(pairs[:, 0] == pairs[:, 1]):
            continue
        edges = {(int(min(a, b)), int(max(a, b))) for a, b in pairs}
        if len(edges) != len(pairs):
            continue
        result = tuple(sorted(edges))
        if is_connected(n, result):
            return result
    return _regular_by_switches(n, degree, rng)


def _circulant(n: int, degree: int) -> set[Edge]:
    """A connected ``degree``-regular graph: ``i`` joined to ``i ± 1 … i ± ⌊d/2⌋`` and, for odd
    ``d`` (then ``n`` is even), to the opposite node ``i + n/2``."""
    offsets = list(range(1, degree // 2 + 1)) + ([n // 2] if degree % 2 else [])
    return {(min(i, (i + k) % n), max(i, (i + k) % n)) for i in range(n) for k in offsets}


def _regular_by_switches(n: int, degree: int, rng: np.random.Generator) -> Edges:
    """A random connected ``degree``-regular graph: a circulant graph randomised by
    ``10 · |E|`` double-edge switches ``{a, b}, {c, e} → {a, c}, {b, e}`` (or ``{a, e}, {b, c}``),
    each rejected if it would make a self loop or a second edge, so every degree stays ``d``;
    more rounds of switches follow while the graph is not connected."""
    edges = _circulant(n, degree)
    order = sorted(edges)
    for _ in range(MAX_ATTEMPTS):
        picks = rng.integers(0, len(order), size=(10 * len(order), 2))
        flips = rng.random(len(picks)) < 0.5
        for (p, q), flip in zip(picks.tolist(), flips.tolist(), strict=True):
            (a, b), (c, e) = order[p], order[q]
            if flip:
                c, e = e, c
            if len({a, b, c, e}) < 4:
                continue
            one, two = (min(a, c), max(a, c)), (min(b, e), max(b, e))
            if one in edges or two in edges:
                continue
            edges -= {order[p], order[q]}
            edges |= {one, two}
            order[p], order[q] = one, two
        result = tuple(sorted(edges))
        if is_connected(n, result):
            return result
    raise ConfigError("degree", f"could not draw a connected {degree}-regular graph on {n} nodes")


def erdos_renyi(n: int, edge_prob: float, rng: np.random.Generator) -> Edges:
    """A connected Erdős–Rényi G(n, p) graph (redrawn until connected)."""
    _need_nodes("erdos-renyi", n, 2)
    if not 0.0 < edge_prob <= 1.0:
        raise ConfigError("edge_prob", f"must be in (0, 1], got {edge_prob}")
    iu = np.triu_indices(n, k=1)
    for _ in range(MAX_ATTEMPTS):
        keep = rng.random(len(iu[0])) < edge_prob
        result = tuple((int(i), int(j)) for i, j in zip(iu[0][keep], iu[1][keep], strict=True))
        if is_connected(n, result):
            return result
    raise ConfigError(
        "edge_prob", f"no connected G({n}, {edge_prob}) found in {MAX_ATTEMPTS} draws: raise it"
    )


def read_edge_list(path: str | Path, n: int | None = None) -> tuple[int, Edges]:
    """Read ``i j`` pairs (one per line, ``#`` comments) from a text file.

    Returns ``(n, edges)``; ``n`` defaults to one more than the largest id.
    """
    pairs: list[tuple[int, int]] = []
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError("edge_list", f"cannot read {path}: {exc.strerror}") from exc
    for lineno, line in enumerate(text.splitlines(), 1):
        body = line.split("#", 1)[0].strip()
        if not body:
            continue
        parts = body.replace(",", " ").split()
        if len(parts) != 2 or not all(p.lstrip("-").isdigit() for p in parts):
            raise ConfigError("edge_list", f"{path}:{lineno}: expected two node ids, got {line!r}")
        pairs.append((int(parts[0]), int(parts[1])))
    if not pairs:
        raise ConfigError("edge_list", f"{path} holds no edges")
    size = n if n is not None else max(max(p) for p in pairs) + 1
    edges = normalize_edges(size, pairs)
    if not is_connected(size, edges):
        raise ConfigError("edge_list", f"the graph in {path} is not connected")
    return size, edges
