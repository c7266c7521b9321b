"""The run's node ids and graph, defined once for the daemon's peers files, the simulator and a
data split."""

from dataclasses import replace

from dacflnode.algorithms.topology import MixingSchedule
from dacflnode.config import RunConfig
from dacflnode.learning.datasets import load_dataset
from dacflnode.learning.names import node_ids
from dacflnode.learning.owndata.split import split_data
from dacflnode.learning.partition import partition
from dacflnode.peers.file import load_peers
from dacflnode.peers.generate import generate_cluster
from dacflnode.peers.run_graph import RunGraph
from dacflnode.sim.simulator import Simulation, graph_edges

RUN = RunConfig(dataset="synthetic", nodes=12, rounds=3, topology="random-regular", degree=3,
                time_varying=2, drop_prob=0.4, seed=5)


def test_node_i_is_named_node_i():
    assert node_ids(3) == ["node-0", "node-1", "node-2"]
    assert node_ids(0) == []


def test_a_data_split_names_its_device_folders_as_the_run_names_its_nodes(tmp_path):
    result = split_data("synthetic", tmp_path / "devices", nodes=3, fmt="table")
    assert list(result.nodes) == node_ids(3)
    assert all((tmp_path / "devices" / node).is_dir() for node in node_ids(3))


def test_a_generated_cluster_and_the_simulator_name_the_same_nodes_and_edges(tmp_path):
    files = [load_peers(p) for p in generate_cluster("random-regular", RUN.nodes, RUN, tmp_path)]
    assert [pf.node.id for pf in files] == node_ids(RUN.nodes)
    assert files[0].daemon.members == tuple(node_ids(RUN.nodes))
    assert sorted(files[0].daemon.edges) == sorted(graph_edges(RUN) or [])


def test_each_daemon_exchanges_in_each_round_with_the_neighbours_the_run_graph_gives(tmp_path):
    files = [load_peers(p) for p in generate_cluster("random-regular", RUN.nodes, RUN, tmp_path)]
    base = MixingSchedule(RUN.topology_spec()).base_edges()
    assert base is not None
    graph = RunGraph.of(node_ids(RUN.nodes), base, RUN.time_varying, RUN.seed, RUN.drop_prob)
    changed = False
    for t in range(10):
        for pf in files:
            assert pf.active_neighbour_ids(t) == graph.active_neighbours(pf.node.id, t)
        changed |= graph.edges(t) != base
    assert changed  # the graph does vary, so the comparison covers dropped edges
    # ids sort as text: node-10 before node-2, on both sides
    assert graph.active_neighbours("node-1", 0) == sorted(graph.active_neighbours("node-1", 0))


def test_the_simulator_follows_the_same_rule():
    cfg = replace(RUN, model="tiny-cnn", synthetic_train=240, synthetic_test=40, device="cpu",
                  engine="sequential")
    data = load_dataset("synthetic", synthetic_train=cfg.synthetic_train,
                        synthetic_test=cfg.synthetic_test, seed=cfg.seed)
    sim = Simulation(cfg, "dacfl", data, partition(data.train_y, cfg.nodes, "iid", seed=cfg.seed))
    assert sim.ids == node_ids(cfg.nodes)
    base = MixingSchedule(cfg.topology_spec()).base_edges()
    assert base is not None
    graph = RunGraph.of(sim.ids, base, cfg.time_varying, cfg.seed, cfg.drop_prob)
    _, _, active = sim._topology()  # what each simulated node's setup is given
    assert active is not None
    for node in sim.ids:
        assert [active(node)(t) for t in range(10)] == \
            [graph.active_neighbours(node, t) for t in range(10)]


def test_a_static_run_graph_is_its_base_graph():
    graph = RunGraph.of(["a", "b", "c"], ((0, 1), (1, 2)), 0, 0, 0.9)
    assert [graph.edges(t) for t in range(3)] == [((0, 1), (1, 2))] * 3
    assert graph.active_neighbours("b", 7) == ["a", "c"]
    varying = replace(graph, time_varying=1)
    assert all(varying.active_neighbours("b", t) == ["a", "c"] for t in range(5))  # a path
