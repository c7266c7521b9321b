"""peers.yaml: loading, defaults, errors naming the dotted field and the file, fingerprints."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from dacflnode.algorithms.rounds import ALGORITHMS, make_algorithm
from dacflnode.algorithms.topology import MixingSchedule, TopologySpec
from dacflnode.config import DaemonSettings, RunConfig, schema
from dacflnode.config.node import NodeSettings, TlsSettings
from dacflnode.errors import ConfigError
from dacflnode.peers.addresses import parse_address
from dacflnode.peers.algorithms import DAEMON_ALGORITHMS, SIMULATION_ONLY
from dacflnode.peers.file import load_peers
from dacflnode.peers.generate import generate_cluster
from dacflnode.peers.yaml_form import dump_peers

FULL = """\
node:
  id: node-1
  listen: 0.0.0.0:7001
  control: 127.0.0.1:9001
  state_dir: state/node-1
  share: 1
  insecure: true
neighbours:
  - {id: node-0, address: 127.0.0.1:7000}
  - {id: node-2, address: "[::1]:7002"}
run:
  algorithm: cdsgd
  dataset: synthetic
  model: tiny-cnn
  lr: 0.05
  rounds: 7
  partition: dirichlet
  dirichlet-alpha: 0.3
  time_varying: 2
  drop_prob: 0.4
  round_deadline: 30
  hello_timeout: 120
  members: [node-0, node-1, node-2, node-3]
  edges: [[node-0, node-1], [node-2, node-1], [node-2, node-3], [node-3, node-0]]
"""

MINIMAL = """\
node: {id: a, listen: 10.0.0.1:7005, insecure: true}
neighbours: [{id: b, address: 10.0.0.2:7005}]
run: {members: [b, a, c], edges: [[a, b], [b, c]]}
"""


def write(tmp_path: Path, text: str, name: str = "peers.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_full_file_round_trips_through_dump_and_load(tmp_path):
    pf = load_peers(write(tmp_path, FULL))
    assert pf.node.id == "node-1" and pf.node.share == 1
    assert pf.node.listen == "0.0.0.0:7001" and pf.node.control == "127.0.0.1:9001"
    assert pf.node.state_dir == tmp_path / "state" / "node-1"
    assert pf.neighbour_ids() == ["node-0", "node-2"]
    assert pf.neighbours[1].address == "[::1]:7002"
    assert pf.run.algorithm == ("cdsgd",) and pf.run.nodes == 4 and pf.run.lr == 0.05
    assert pf.run.dirichlet_alpha == 0.3
    assert pf.daemon.round_deadline == 30.0 and pf.daemon.hello_timeout == 120.0
    assert pf.daemon.edges == (
        ("node-0", "node-1"),
        ("node-0", "node-3"),
        ("node-1", "node-2"),
        ("node-2", "node-3"),
    )
    again = write(tmp_path, dump_peers(pf))
    assert load_peers(again) == pf
    # Defaults come back equal too (lr unset, no members), from a file elsewhere.
    other = tmp_path / "sub"
    other.mkdir()
    plain = load_peers(write(other, MINIMAL.replace("run: {", "run: {lr: null, ")))
    assert load_peers(write(other, dump_peers(plain))) == plain


def test_defaults_control_state_dir_share_and_nodes(tmp_path):
    pf = load_peers(write(tmp_path, MINIMAL))
    assert pf.node.control == "127.0.0.1:8005"
    assert pf.node.state_dir == tmp_path / "a"
    assert pf.node.share == 1  # position of "a" in members
    assert pf.run.nodes == 3
    assert pf.run.algorithm == ("dacfl",)
    assert pf.daemon.round_deadline == 600.0 and pf.daemon.hello_timeout == 3600.0


def test_time_varying_neighbours_follow_the_simulators_graph(tmp_path):
    pf = load_peers(write(tmp_path, FULL))
    sched = MixingSchedule(TopologySpec(topology="ring", nodes=4, time_varying=2, drop_prob=0.4))
    assert pf.base_edges() == sched.base_edges()
    for t in range(12):
        expected = sorted(f"node-{j if i == 1 else i}" for i, j in sched.edges(t) if 1 in (i, j))
        assert pf.active_neighbour_ids(t) == expected


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (MINIMAL + "extra: 1\n", "extra"),
        (MINIMAL.replace("listen:", "colour: red, listen:"), "node.colour"),
        (MINIMAL.replace("run: {", "run: {colour: red, "), "run.colour"),
        (
            MINIMAL.replace("address: 10.0.0.2:7005}", "address: 10.0.0.2:7005, x: 1}"),
            "neighbours[0].x",
        ),
        (MINIMAL.replace("id: a, ", ""), "node.id"),
        (MINIMAL.replace("10.0.0.1:7005", "abc"), "node.listen"),
        (MINIMAL.replace("10.0.0.1:7005", "10.0.0.1:70000"), "node.listen"),
        (MINIMAL.replace("10.0.0.2:7005", "'::1:7005'"), "neighbours[0].address"),
        (MINIMAL.replace("}]", "}, {id: b, address: 10.0.0.3:1}]"), "neighbours[1].id"),
        (MINIMAL.replace("{id: b,", "{id: a,"), "neighbours[0].id"),
        (MINIMAL.replace("run: {", "run: {algorithm: dpsgd, "), "run.algorithm"),
        (MINIMAL.replace("run: {", "run: {algorithm: 'dacfl,cdsgd', "), "run.algorithm"),
        (MINIMAL.replace("run: {", "run: {lr_decay: 2, "), "run.lr_decay"),
        (MINIMAL.replace("run: {", "run: {nodes: 5, "), "run.nodes"),
        (MINIMAL.replace("run: {", "run: {round_deadline: -1, "), "run.round_deadline"),
        (MINIMAL.replace("run: {", "run: {hello-timeout: soon, "), "run.hello_timeout"),
        (MINIMAL.replace("run: {", "run: {dataset: imagenet, "), "run.dataset"),
        (MINIMAL.replace("run: {", "run: {partition: skewed, "), "run.partition"),
        (
            MINIMAL.replace("run: {", "run: {time_varying: 3, ").replace(
                ", edges: [[a, b], [b, c]]", ""
            ),
            "run.edges",
        ),
        (
            "node: {id: a, listen: 'h:1', share: 0}\nneighbours: [{id: b, address: 'h:2'}]\n"
            "run: {time_varying: 3}\n",
            "run.members",
        ),
        (MINIMAL.replace("[[a, b], [b, c]]", "[[a, c], [b, c]]"), "run.edges"),
        (MINIMAL.replace("[[a, b], [b, c]]", "[[a, b]]"), "run.edges"),
        (
            MINIMAL.replace("run: {members: [b, a, c], edges: [[a, b], [b, c]]}", "run: {}"),
            "node.share",
        ),
    ],
)
def test_each_error_names_its_dotted_field_and_the_file(tmp_path, text, field):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_peers(path)
    assert err.value.field == field, err.value
    assert str(path) in err.value.message


def test_messages_say_what_is_wrong(tmp_path):
    with pytest.raises(ConfigError, match="simulation-only"):
        load_peers(write(tmp_path, MINIMAL.replace("run: {", "run: {algorithm: fedavg, ")))
    with pytest.raises(ConfigError, match="expected host:port, got 'abc'"):
        load_peers(write(tmp_path, MINIMAL.replace("10.0.0.1:7005", "abc")))
    with pytest.raises(ConfigError, match="not connected"):
        load_peers(
            write(
                tmp_path, MINIMAL.replace("run: {members: [b, a, c]", "run: {members: [b, a, c, d]")
            )
        )


def test_parse_address_accepts_names_v4_and_bracketed_v6():
    f = Path("/x/peers.yaml")
    assert parse_address("node-3.example:7000", "f", f) == ("node-3.example", 7000)
    assert parse_address("10.1.2.3:0", "f", f) == ("10.1.2.3", 0)
    assert parse_address("[fe80::1]:65535", "f", f) == ("fe80::1", 65535)
    for bad in ("abc", ":7000", "h:", "h:-1", "h:65536", "[zz]:1", "[::1]7000", "a b:1"):
        with pytest.raises(ConfigError) as err:
            parse_address(bad, "node.listen", f)
        assert err.value.field == "node.listen" and "/x/peers.yaml" in err.value.message


def test_fingerprint_is_shared_by_a_cluster_and_tracks_run_settings(tmp_path):
    run = RunConfig(dataset="synthetic", rounds=3)
    paths = generate_cluster("ring", 4, run, tmp_path / "a")
    prints = {load_peers(p).run_fingerprint() for p in paths}
    assert len(prints) == 1

    other_lr = generate_cluster("ring", 4, dataclasses.replace(run, lr=0.5), tmp_path / "b")
    assert load_peers(other_lr[0]).run_fingerprint() not in prints

    local = dataclasses.replace(run, device="cpu", data_root=str(tmp_path), eval_every=5)
    same = generate_cluster("ring", 4, local, tmp_path / "c", base_port=9000)
    assert load_peers(same[2]).run_fingerprint() in prints


def test_a_written_run_section_lists_every_declared_setting(tmp_path):
    pf = load_peers(write(tmp_path, FULL))
    run = yaml.safe_load(dump_peers(pf))["run"]
    assert list(run) == [*schema.names_of(RunConfig), *schema.names_of(DaemonSettings)]


def test_the_daemon_runs_the_algorithms_that_need_no_god_node():
    assert DAEMON_ALGORITHMS == ("dacfl", "cdsgd")
    assert SIMULATION_ONLY == ("dpsgd", "fedavg")
    for name in ALGORITHMS:
        assert (name in DAEMON_ALGORITHMS) == make_algorithm(name).decentralized
        assert make_algorithm(name).decentralized != make_algorithm(name).global_model


# ---------------------------------------------------------------------------------- security
TOKEN = "s3cret-token-0123456789"
TLS = f"""\
node:
  id: a
  listen: 0.0.0.0:7005
  control: 10.0.0.1:8005
  control_token: {TOKEN}
  tls: {{ca: certs/ca.crt, cert: certs/a.crt, key: /etc/keys/a.key}}
neighbours: [{{id: b, address: 10.0.0.2:7005}}]
run: {{members: [b, a, c], edges: [[a, b], [b, c]]}}
"""
PLAIN_LOCAL = MINIMAL.replace(", insecure: true", "")


def test_tls_paths_are_relative_to_the_file_and_round_trip(tmp_path):
    pf = load_peers(write(tmp_path, TLS))
    tls = pf.node.tls
    assert tls is not None
    assert (tls.ca, tls.cert, tls.key) == (
        tmp_path / "certs" / "ca.crt",
        tmp_path / "certs" / "a.crt",
        Path("/etc/keys/a.key"),
    )
    assert pf.node.control_token == TOKEN and not pf.node.insecure
    text = dump_peers(pf)
    assert yaml.safe_load(text)["node"]["tls"]["ca"] == str(tmp_path / "certs" / "ca.crt")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert load_peers(write(tmp_path, text)) == pf
    # written absolute: a copy in another folder names the same files
    assert load_peers(write(elsewhere, text)).node.tls == tls


def test_the_node_section_takes_the_declared_node_settings(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_peers(write(tmp_path, MINIMAL.replace("listen:", "colour: red, listen:")))
    for key in (*schema.names_of(NodeSettings), "data_root"):
        assert key in err.value.message
    written = yaml.safe_load(dump_peers(load_peers(write(tmp_path, TLS))))["node"]
    assert set(written) <= set(schema.names_of(NodeSettings))
    assert set(written["tls"]) == set(schema.names_of(TlsSettings))


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        (MINIMAL.replace("insecure: true", "insecure: true, share: '1'"), "node.share",
         "expected an integer, got '1'"),
        (MINIMAL.replace("insecure: true", "insecure: true, share: -1"), "node.share",
         "must be >= 0, got -1"),
        (TLS.replace("ca: certs/ca.crt", "ca: 5"), "node.tls.ca", "expected a string, got int"),
        (MINIMAL.replace("insecure: true", "insecure: true, state_dir: [a]"), "node.state_dir",
         "expected a string, got list"),
    ],
)
def test_a_node_value_of_the_wrong_type_names_its_key(tmp_path, text, field, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as err:
        load_peers(path)
    assert err.value.field == field and str(path) in err.value.message


def test_the_control_token_never_shows_in_repr(tmp_path):
    pf = load_peers(write(tmp_path, TLS))
    assert TOKEN not in repr(pf.node) and TOKEN not in repr(pf)


def test_insecure_is_written_back_only_when_set(tmp_path):
    insecure = load_peers(write(tmp_path, MINIMAL))
    assert insecure.node.insecure and insecure.node.tls is None
    assert yaml.safe_load(dump_peers(insecure))["node"]["insecure"] is True
    local = load_peers(write(tmp_path, PLAIN_LOCAL.replace("10.0.0.1:7005", "127.0.0.1:7005")))
    assert set(yaml.safe_load(dump_peers(local))["node"]) == {
        "id", "listen", "control", "state_dir", "share"
    }


@pytest.mark.parametrize("listen", ["127.0.0.1:7005", "127.3.2.1:7005", "'[::1]:7005'",
                                    "localhost:7005"])
def test_a_loopback_listen_needs_neither_tls_nor_insecure(tmp_path, listen):
    pf = load_peers(write(tmp_path, PLAIN_LOCAL.replace("10.0.0.1:7005", listen)))
    assert pf.node.tls is None and not pf.node.insecure


@pytest.mark.parametrize("listen", ["10.0.0.1:7005", "0.0.0.0:7005", "'[::]:7005'",
                                    "node-a.example:7005"])
def test_a_listen_others_can_reach_needs_tls_or_insecure(tmp_path, listen):
    path = write(tmp_path, PLAIN_LOCAL.replace("10.0.0.1:7005", listen))
    pattern = r"reachable from other hosts.*node\.insecure: true"
    with pytest.raises(ConfigError, match=pattern) as err:
        load_peers(path)
    assert err.value.field == "node.listen" and str(path) in err.value.message


def test_an_exposed_control_with_tls_and_token_is_accepted(tmp_path):
    pf = load_peers(write(tmp_path, TLS.replace("10.0.0.1:8005", "0.0.0.0:8005")))
    assert pf.node.control == "0.0.0.0:8005"


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        (TLS.replace("  tls: {ca: certs/ca.crt,", "  x: {ca: certs/ca.crt,").replace(
            "control_token", "colour"), "node.colour", "unknown key"),
        (TLS.replace("ca: certs/ca.crt, ", ""), "node.tls.ca", "required"),
        (TLS.replace("key: /etc/keys/a.key", "key: ''"), "node.tls.key", "expected a path"),
        (TLS.replace("{ca:", "{crl: x, ca:"), "node.tls.crl", "unknown key"),
        (TLS.replace("tls: {ca: certs/ca.crt, cert: certs/a.crt, key: /etc/keys/a.key}",
                     "tls: [a]"), "node.tls", "expected a mapping"),
        (MINIMAL.replace("insecure: true", "insecure: 'yes'"), "node.insecure",
         "expected true or false"),
        (TLS.replace("  tls:", "  insecure: true\n  tls:"), "node.insecure",
         "contradicts node.tls"),
        (TLS.replace("  tls: {ca: certs/ca.crt, cert: certs/a.crt, key: /etc/keys/a.key}\n",
                     "  insecure: true\n"),
         "node.control", "needs node.tls and node.control_token"),
        (TLS.replace(f"  control_token: {TOKEN}\n", ""), "node.control_token",
         "required: node.control 10.0.0.1:8005 is reachable"),
        (TLS.replace(TOKEN, "short"), "node.control_token", "at least 16 printable"),
        (TLS.replace(TOKEN, "'has a space in the middle'"), "node.control_token",
         "without spaces"),
        (TLS.replace(TOKEN, "12345"), "node.control_token", "expected a string, got int"),
        (TLS.replace("{id: b,", "{id: 10.0.0.9,").replace("[b, a, c]", "['10.0.0.9', a, c]")
         .replace("[[a, b], [b, c]]", "[[a, '10.0.0.9'], ['10.0.0.9', c]]"),
         "neighbours[0].id", "is an IP address"),
    ],
)
def test_each_security_error_names_its_dotted_key_and_the_file(tmp_path, text, field, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as err:
        load_peers(path)
    assert err.value.field == field, err.value
    assert str(path) in err.value.message


def test_a_bad_token_is_never_echoed(tmp_path):
    bad = "short\u00e9tok"
    with pytest.raises(ConfigError) as err:
        load_peers(write(tmp_path, TLS.replace(TOKEN, bad)))
    assert err.value.field == "node.control_token" and bad not in str(err.value)
