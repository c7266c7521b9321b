"""The torch-free lists of names agree with the modules that implement them."""

from dacflnode.algorithms import names
from dacflnode.algorithms.rounds import make_algorithm
from dacflnode.peers.algorithms import DAEMON_ALGORITHMS


def test_the_daemon_algorithms_are_the_decentralized_ones():
    decentralized = tuple(n for n in names.ALGORITHMS if make_algorithm(n).decentralized)
    assert names.DAEMON_ALGORITHMS == decentralized == DAEMON_ALGORITHMS


def test_every_topology_is_a_matrix_kind_or_a_graph_kind_not_both():
    assert set(names.MATRIX_KINDS).isdisjoint(names.GRAPH_KINDS)
    assert names.TOPOLOGIES == names.MATRIX_KINDS + names.GRAPH_KINDS
