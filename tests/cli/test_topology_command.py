"""``dacflnode topology``: a cluster's peers files from one graph."""

import json

import pytest
from click.testing import CliRunner

from dacflnode.algorithms import graphs
from dacflnode.cli.main import cli
from dacflnode.peers.file import load_peers
from dacflnode.security.certs import check_node_files


def run(args):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def neighbour_sets(out):
    files = {p.stem: load_peers(p) for p in sorted(out.glob("*.yaml"))}
    return files, {k: set(pf.neighbour_ids()) for k, pf in files.items()}


def test_ring_of_four_writes_loadable_symmetric_files(tmp_path):
    result = run(["topology", "ring", "--nodes", "4", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 4 and lines[0].split()[:2] == ["node-0", "127.0.0.1:7000"]
    files, adj = neighbour_sets(tmp_path)
    assert sorted(files) == [f"node-{i}" for i in range(4)]
    ring = graphs.neighbours(4, graphs.ring(4))
    for i in range(4):
        assert adj[f"node-{i}"] == {f"node-{j}" for j in ring[i]}
        for j in adj[f"node-{i}"]:
            assert f"node-{i}" in adj[j]
        pf = files[f"node-{i}"]
        assert pf.node.share == i and pf.node.control == f"127.0.0.1:{8000 + i}"
        assert pf.node.state_dir == tmp_path / f"node-{i}"
        assert pf.daemon.members == tuple(f"node-{k}" for k in range(4))
    assert len({pf.run_fingerprint() for pf in files.values()}) == 1


@pytest.mark.slow
def test_random_regular_is_reproducible_by_seed(tmp_path):
    def draw(seed, name):
        out = tmp_path / name
        args = ["topology", "random-regular", "--nodes", "8", "--degree", "3", "--seed", seed]
        result = run([*args, "--out", str(out), "--json"])
        assert result.exit_code == 0, result.output
        listing = json.loads(result.stdout)
        assert [n["path"] for n in listing] == [str(out / f"node-{i}.yaml") for i in range(8)]
        return {n["id"]: tuple(n["neighbours"]) for n in listing}

    first, again, other = draw("3", "a"), draw("3", "b"), draw("4", "c")
    assert first == again
    assert first != other
    assert all(len(v) == 3 for v in first.values())


def test_hosts_cycle_and_neighbours_are_reached_at_their_host(tmp_path):
    result = run(
        [
            "topology",
            "complete",
            "--nodes",
            "5",
            "--hosts",
            "h0,h1",
            "--listen-host",
            "0.0.0.0",
            "--insecure",
            "--base-port",
            "7100",
            "--control-base-port",
            "9100",
            "--out",
            str(tmp_path),
        ]
    )
    assert result.exit_code == 0, result.output
    files, _ = neighbour_sets(tmp_path)
    for i in range(5):
        pf = files[f"node-{i}"]
        assert pf.node.listen == f"0.0.0.0:{7100 + i}"
        assert pf.node.insecure and pf.node.tls is None
        assert pf.node.control == f"127.0.0.1:{9100 + i}"
        for n in pf.neighbours:
            j = int(n.id.split("-")[1])
            assert n.address == f"h{j % 2}:{7100 + j}"


def test_bad_kind_is_one_line_and_exit_2(tmp_path):
    result = CliRunner().invoke(cli, ["topology", "star", "--nodes", "4", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0
    assert result.stderr.startswith("error: kind: unknown graph kind 'star'")
    assert not list(tmp_path.glob("*.yaml"))


def test_simulation_only_algorithm_is_refused(tmp_path):
    args = ["topology", "ring", "--nodes", "4", "--algorithm", "fedavg", "--out", str(tmp_path)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and "simulation-only" in result.stderr


def test_tls_creates_the_certificates_and_names_them_in_every_file(tmp_path):
    certs = tmp_path / "certs"
    args = ["topology", "ring", "--nodes", "3", "--listen-host", "0.0.0.0", "--tls", str(certs)]
    result = run([*args, "--out", str(tmp_path / "peers"), "--json"])
    assert result.exit_code == 0, result.output
    listing = json.loads(result.stdout)
    assert [n["tls"] for n in listing] == [str(certs / f"node-{i}.crt") for i in range(3)]
    files, _ = neighbour_sets(tmp_path / "peers")
    for node, pf in files.items():
        tls = pf.node.tls
        assert tls is not None and not pf.node.insecure
        assert (tls.ca, tls.cert, tls.key) == (
            certs / "ca.crt",
            certs / f"{node}.crt",
            certs / f"{node}.key",
        )
        check_node_files(tls, node)
        text = (tmp_path / "peers" / f"{node}.yaml").read_text()
        assert f"cert: {certs / node}.crt" in text  # absolute in the file


def test_a_tls_cluster_keeps_control_on_loopback_and_says_where_each_token_will_be(tmp_path):
    # no token in the files: each node writes its own at every start (the daemon's refusal of a
    # call without it: tests/peers/test_control_token.py, on a --tls cluster)
    args = ["topology", "ring", "--nodes", "3", "--listen-host", "0.0.0.0",
            "--tls", str(tmp_path / "certs"), "--out", str(tmp_path / "peers")]
    result = run(args)
    assert result.exit_code == 0, result.output
    files, _ = neighbour_sets(tmp_path / "peers")
    for pf in files.values():
        assert pf.node.control.startswith("127.0.0.1:") and pf.node.control_token is None
    assert "STATE_DIR/control.token (mode 0600)" in " ".join(result.stderr.split())


def test_tls_with_an_existing_folder_keeps_its_ca_and_adds_the_missing_nodes(tmp_path):
    certs = tmp_path / "certs"
    assert run(["certs", "--out", str(certs), "node-0"]).exit_code == 0
    before = {p.name: p.read_bytes() for p in certs.iterdir()}
    args = ["topology", "complete", "--nodes", "3", "--tls", str(certs), "--out", str(tmp_path)]
    result = run(args)
    assert result.exit_code == 0, result.output
    assert {n: (certs / n).read_bytes() for n in before} == before
    assert sorted(p.name for p in certs.glob("*.crt")) == [
        "ca.crt", "node-0.crt", "node-1.crt", "node-2.crt"
    ]
    for i in range(3):
        tls = load_peers(tmp_path / f"node-{i}.yaml").node.tls
        assert tls is not None
        check_node_files(tls, f"node-{i}")


def test_a_listen_others_can_reach_needs_tls_or_insecure(tmp_path):
    args = ["topology", "ring", "--nodes", "3", "--hosts", "10.0.0.1,10.0.0.2,10.0.0.3"]
    result = CliRunner().invoke(cli, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: tls: node-0 listens on 10.0.0.1")
    assert "--tls DIR" in result.stderr and "--insecure" in result.stderr
    assert not list(tmp_path.glob("*.yaml"))


def test_tls_and_insecure_together_are_refused_before_anything_is_written(tmp_path):
    certs = tmp_path / "certs"
    args = ["topology", "ring", "--nodes", "3", "--tls", str(certs), "--insecure"]
    result = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "peers")])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: insecure: contradicts --tls")
    assert not certs.exists() and not (tmp_path / "peers").exists()


def test_topology_data_root_writes_each_nodes_own_folder_and_the_shared_test_folder(tmp_path):
    data, test = tmp_path / "data", tmp_path / "test"
    for i in range(3):
        (data / f"node-{i}" / "cat").mkdir(parents=True)
    (test / "cat").mkdir(parents=True)  # class subfolders: one test folder for every node
    out = tmp_path / "peers"
    result = run(["topology", "ring", "--nodes", "3", "--out", str(out), "--dataset", "folder",
                  "--classes", "cat,Dog", "--data-root", str(data), "--test-root", str(test)])
    assert result.exit_code == 0, result.output
    for i in range(3):
        pf = load_peers(out / f"node-{i}.yaml")
        assert pf.run.data_root == str(data / f"node-{i}")
        assert pf.run.test_root == str(test)
        assert pf.run.classes == ("cat", "Dog")  # names keep their case
        assert f"data_root: {data / f'node-{i}'}" in (out / f"node-{i}.yaml").read_text()


def test_topology_test_root_with_a_folder_per_node_gives_each_node_its_own(tmp_path):
    data, test = tmp_path / "data", tmp_path / "test"
    for i in range(2):
        (data / f"node-{i}").mkdir(parents=True)
        (test / f"node-{i}").mkdir(parents=True)
    result = run(["topology", "complete", "--nodes", "2", "--out", str(tmp_path / "p"),
                  "--dataset", "table", "--classes", "a,b", "--label-column", "y",
                  "--data-root", str(data), "--test-root", str(test)])
    assert result.exit_code == 0, result.output
    pf = load_peers(tmp_path / "p" / "node-1.yaml")
    assert pf.run.test_root == str(test / "node-1")


def test_topology_data_root_without_a_nodes_folder_names_it(tmp_path):
    (tmp_path / "data" / "node-0").mkdir(parents=True)
    result = CliRunner().invoke(cli, [
        "topology", "complete", "--nodes", "2", "--out", str(tmp_path / "p"), "--dataset",
        "folder", "--classes", "a", "--data-root", str(tmp_path / "data")])
    assert result.exit_code == 2
    assert f"{tmp_path / 'data' / 'node-1'} does not exist" in result.output
    assert not (tmp_path / "p").exists()  # nothing written
