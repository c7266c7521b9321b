import numpy as np
import pytest

from dacflnode.algorithms import graphs
from dacflnode.algorithms.mixing import validate_mixing_matrix
from dacflnode.algorithms.topology import MixingSchedule, TopologySpec, active_edges
from dacflnode.errors import ConfigError


@pytest.mark.parametrize(
    "kind", ["dense", "sparse", "uniform", "ring", "complete", "random-regular", "erdos-renyi"]
)
def test_every_topology_kind_gives_valid_matrices_static_and_time_varying(kind):
    for k in (0, 3):
        sched = MixingSchedule(TopologySpec(topology=kind, nodes=10, seed=1, time_varying=k))
        for t in range(10):
            validate_mixing_matrix(sched.matrix(t))


def test_static_topology_never_changes():
    sched = MixingSchedule(TopologySpec(topology="dense", nodes=6, seed=2))
    assert np.array_equal(sched.matrix(0), sched.matrix(57))


def test_time_varying_matrix_is_rebuilt_every_k_rounds_and_deterministic():
    spec = TopologySpec(topology="dense", nodes=6, seed=2, time_varying=10)
    a, b = MixingSchedule(spec), MixingSchedule(spec)
    assert np.array_equal(a.matrix(0), a.matrix(9))
    assert not np.array_equal(a.matrix(9), a.matrix(10))
    assert np.array_equal(a.matrix(25), b.matrix(25))


def test_time_varying_graph_is_a_connected_subgraph_of_the_base_graph():
    sched = MixingSchedule(TopologySpec(topology="complete", nodes=8, seed=5, time_varying=2))
    base = set(sched.base_edges() or ())
    seen = set()
    for t in range(0, 20, 2):
        edges = sched.edges(t)
        assert set(edges) <= base
        assert graphs.is_connected(8, edges)
        seen.add(edges)
    assert len(seen) > 1


def test_active_edges_depends_only_on_seed_epoch_and_graph():
    base = graphs.complete(6)
    assert active_edges(6, base, 3, 4) == active_edges(6, base, 3, 4)
    assert len({active_edges(6, base, 3, e) for e in range(6)}) > 1
    ring = graphs.ring(7)
    assert graphs.is_connected(7, active_edges(7, ring, 0, 1, drop_prob=0.9))


def test_unknown_topology_names_the_topology_field():
    with pytest.raises(ConfigError) as err:
        MixingSchedule(TopologySpec(topology="star", nodes=4))
    assert err.value.field == "topology"


def test_custom_matrix_that_is_not_doubly_stochastic_names_mixing_matrix():
    bad = ((0.5, 0.5), (0.4, 0.6))
    with pytest.raises(ConfigError) as err:
        MixingSchedule(TopologySpec(topology="custom", nodes=2, matrix=bad))
    assert err.value.field == "mixing_matrix"
