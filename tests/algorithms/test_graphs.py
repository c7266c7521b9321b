import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dacflnode.algorithms import graphs
from dacflnode.errors import ConfigError


def test_ring_has_n_edges_and_degree_two():
    edges = graphs.ring(6)
    assert len(edges) == 6
    assert graphs.degrees(6, edges) == [2] * 6
    assert graphs.is_connected(6, edges)


def test_complete_graph_has_all_pairs():
    assert len(graphs.complete(5)) == 10


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=4, max_value=20), st.integers(min_value=0, max_value=10**6))
def test_random_regular_graph_is_regular_and_connected(n, seed):
    degree = 3 if n % 2 == 0 else 2
    edges = graphs.random_regular(n, degree, np.random.default_rng(seed))
    assert graphs.degrees(n, edges) == [degree] * n
    assert graphs.is_connected(n, edges)


def test_erdos_renyi_graph_is_connected():
    edges = graphs.erdos_renyi(12, 0.3, np.random.default_rng(1))
    assert graphs.is_connected(12, edges)


def test_graph_that_needs_more_nodes_names_the_nodes_field():
    with pytest.raises(ConfigError) as err:
        graphs.ring(2)
    assert err.value.field == "nodes"


def test_random_regular_with_odd_stub_count_names_degree():
    with pytest.raises(ConfigError) as err:
        graphs.random_regular(5, 3, np.random.default_rng(0))
    assert err.value.field == "degree"


def test_edge_list_file_is_read_with_comments(tmp_path):
    path = tmp_path / "g.txt"
    path.write_text("# a square\n0 1\n1 2\n2,3\n3 0\n")
    n, edges = graphs.read_edge_list(path)
    assert n == 4
    assert edges == ((0, 1), (0, 3), (1, 2), (2, 3))


def test_disconnected_edge_list_is_refused(tmp_path):
    path = tmp_path / "g.txt"
    path.write_text("0 1\n2 3\n")
    with pytest.raises(ConfigError, match="not connected"):
        graphs.read_edge_list(path)


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(
    st.integers(min_value=3, max_value=120),
    st.integers(min_value=2, max_value=12),
    st.integers(min_value=0, max_value=10**6),
)
def test_random_regular_graph_of_high_degree_is_simple_regular_connected_and_seeded(n, d, seed):
    # Degrees of 7 and more are where the pairing model practically never draws a simple graph.
    degree = min(d, n - 1)
    if (n * degree) % 2:
        degree -= 1
    if degree < 2:
        return
    edges = graphs.random_regular(n, degree, np.random.default_rng(seed))
    assert all(i < j for i, j in edges)
    assert len(set(edges)) == len(edges)
    assert graphs.degrees(n, edges) == [degree] * n
    assert graphs.is_connected(n, edges)
    assert graphs.random_regular(n, degree, np.random.default_rng(seed)) == edges


def test_random_regular_graphs_of_degree_eight_differ_between_seeds():
    drawn = {graphs.random_regular(100, 8, np.random.default_rng(seed)) for seed in range(5)}
    assert len(drawn) == 5
