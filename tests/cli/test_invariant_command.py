"""``dacflnode invariant``: from state directories, checkpoint files and peers files, or from
running nodes' Control services (``--live``); its table, its JSON and its exit status."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result

from dacflnode.algorithms.rounds import NodeState
from dacflnode.cli.main import cli
from dacflnode.cluster.launcher import free_ports
from dacflnode.peers.generate import generate_cluster
from dacflnode.records.checkpoint import save_checkpoint
from dacflnode.transport import channels
from dacflnode.transport.control_types import NodeStatus
from dacflnode.transport.grpc_control import add_control_service, control_interceptors
from tests.harness.cluster import TINY

PAIR = replace(TINY, nodes=2, rounds=2)
TOKEN = "control-token-for-tests-0123456789"


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"DACFLNODE_CONTROL_TOKEN": None})


def write_pair(root: Path) -> tuple[Path, Path]:
    """node-0 and node-1 of round 3; node-0 mixed node-1's round-2 state one-sidedly and
    keeps the correction pending, node-1's log says it did not mix node-0's."""
    t0, t1 = torch.arange(4.0), torch.ones(4)
    c = (t1 - t0) / 3
    paths = []
    for node, x, tracked, log, pending in (
        ("node-0", t0 + c, t0, ((2, ("node-1",)),), {"pending.2.node-1": c}),
        ("node-1", t1.clone(), t1, ((2, ()),), {}),
    ):
        state_dir = root / node
        state_dir.mkdir(parents=True, exist_ok=True)
        paths.append(save_checkpoint(
            state_dir, NodeState(3, x, tracked.clone(), tracked), {},
            {"node": node, "run_fingerprint": "r"}, used_log=log, pending=pending,
            tracked="omega_prev"))
    return paths[0], paths[1]


def test_state_directories_give_a_table_and_both_residuals(tmp_path):
    write_pair(tmp_path)
    result = run("invariant", str(tmp_path / "node-0"), str(tmp_path / "node-1"))
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "node-0" in out and "node-1" in out
    assert "residual |Σx − Σtracked| / |Σtracked|: raw " in out
    assert "(0 unresolved correction(s))" in out and "warning" not in out


def write_launch_summary(root: Path) -> None:
    """The summary.json ``launch --out DIR`` writes beside the node folders (daemons' engine)."""
    (root / "peers").mkdir(parents=True, exist_ok=True)
    (root / "summary.json").write_text(json.dumps(
        {"algorithms": {"dacfl": {"engine": "daemon"}}}))


def test_a_launch_output_folder_stands_for_its_node_folders(tmp_path):
    write_pair(tmp_path)
    write_launch_summary(tmp_path)
    whole = run("invariant", "--json", str(tmp_path))
    each = run("invariant", "--json", str(tmp_path / "node-0"), str(tmp_path / "node-1"))
    assert whole.exit_code == each.exit_code == 0, whole.output
    got, expected = json.loads(whole.output), json.loads(each.output)
    assert got["nodes"] == ["node-0", "node-1"]
    assert got == expected


def test_a_launch_folder_of_several_algorithms_reads_every_algorithms_nodes(tmp_path):
    write_pair(tmp_path / "dacfl")
    write_launch_summary(tmp_path)
    result = run("invariant", "--json", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["nodes"] == ["node-0", "node-1"]


def test_a_node_of_a_launch_folder_without_a_checkpoint_yet_is_named(tmp_path):
    write_pair(tmp_path)
    write_launch_summary(tmp_path)
    (tmp_path / "node-2").mkdir()
    (tmp_path / "node-2" / "daemon.log").write_text("started\n")
    result = run("invariant", str(tmp_path))
    assert result.exit_code == 1
    assert f"skipped {tmp_path / 'node-2'}: no checkpoint yet" in result.output


def test_json_is_one_object_and_an_undecidable_correction_is_counted(tmp_path):
    first, _ = write_pair(tmp_path)
    (tmp_path / "empty").mkdir()
    result = run("invariant", "--json", str(first), str(tmp_path / "empty"))
    assert result.exit_code == 1, result.output  # the correction is left open: not settled
    data = json.loads(result.stdout)
    assert data["nodes"] == ["node-0"] and data["unresolved"] == 1
    assert data["resolved_residual"] == data["raw_residual"] > 0
    assert data["skipped"] == [{"source": str(tmp_path / "empty"),
                                "reason": "no checkpoint yet"}]
    assert data["holds"] is False and data["verdict"].startswith("BROKEN: ")
    assert "1 pending correction(s) unresolved" in data["verdict"]
    assert f"{tmp_path / 'empty'}: no checkpoint yet" in data["verdict"]

    settled = run("invariant", "--json", str(tmp_path / "node-0"), str(tmp_path / "node-1"))
    assert settled.exit_code == 0, settled.output
    both = json.loads(settled.stdout)
    assert both["unresolved"] == 0 and both["per_node"]["node-0"]["applied"] == 1
    assert both["resolved_residual"] < 1e-6 < both["raw_residual"]
    assert both["holds"] is True and both["tolerance"] == 2e-6
    assert both["verdict"] == f"holds: {both['resolved_residual']:.2g} ≤ 2e-06"


def test_the_verdict_is_the_last_line_and_a_residual_above_the_tolerance_breaks_it(tmp_path):
    write_pair(tmp_path)
    dirs = [str(tmp_path / "node-0"), str(tmp_path / "node-1")]
    holds = run("invariant", *dirs)
    assert holds.exit_code == 0 and holds.output.splitlines()[-1].startswith("holds: ")
    strict = run("invariant", "--tolerance", "0", *dirs)
    resolved = json.loads(run("invariant", "--json", *dirs).stdout)["resolved_residual"]
    if resolved > 0:  # float32 rounding left something: a zero tolerance refuses it
        assert strict.exit_code == 1
        assert strict.output.splitlines()[-1] == f"BROKEN: residual {resolved:.2g} > 0"
    else:
        assert strict.exit_code == 0
    # node-0 alone: its correction cannot be settled, and its sum is off
    alone = run("invariant", dirs[0])
    last = alone.output.splitlines()[-1]
    assert alone.exit_code == 1 and last.startswith("BROKEN: ")
    assert "1 pending correction(s) unresolved" in last and "> 2e-06" in last


def test_an_unreadable_checkpoint_among_readable_ones_breaks_the_verdict(tmp_path):
    _, second = write_pair(tmp_path)
    data = bytearray(second.read_bytes())
    data[-3] ^= 0x10  # one flipped bit in node-1's file
    second.write_bytes(bytes(data))
    result = run("invariant", "--json", str(tmp_path / "node-0"), str(tmp_path / "node-1"))
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["nodes"] == ["node-0"] and report["holds"] is False
    assert "does not match its checksum" in report["skipped"][0]["reason"]
    assert f"{tmp_path / 'node-1'}: " in report["verdict"]


def test_peers_files_are_read_for_their_state_directories(tmp_path):
    write_pair(tmp_path)
    peers = generate_cluster("complete", 2, PAIR, tmp_path / "peers", state_root=tmp_path)
    as_option = run("invariant", "--json", "--peers", str(peers[0]), "--peers", str(peers[1]))
    as_paths = run("invariant", "--json", *map(str, peers))  # what a shell glob gives
    for result in (as_option, as_paths):
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["nodes"] == ["node-0", "node-1"]


def test_nothing_readable_exits_1_and_says_why(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b.safetensors").write_bytes(b"garbage")
    result = run("invariant", str(tmp_path / "a"), str(tmp_path / "b.safetensors"))
    assert result.exit_code == 1
    assert "no checkpoint could be read" in result.output
    assert "no checkpoint yet" in result.output


def test_live_needs_peers_files_and_some_path_is_needed(tmp_path):
    (tmp_path / "a").mkdir()
    assert run("invariant", "--live", str(tmp_path / "a")).exit_code == 2
    assert run("invariant").exit_code == 2


class CheckpointProvider:
    def __init__(self, data: bytes | None) -> None:
        self.data = data

    def status(self) -> NodeStatus:
        return NodeStatus("node-0", "dacfl", 3, 10, "training")

    def metrics(self, fmt: str) -> tuple[str, str]:
        return "application/json", "{}"

    def stop(self, drain: bool = False) -> None:
        pass

    async def checkpoint_bytes(self) -> bytes | None:
        return self.data


@pytest.fixture
def control_server() -> Iterator[tuple[CheckpointProvider, int]]:
    """A Control service with a token, served from its own thread (the command under test runs
    its own event loop)."""
    provider = CheckpointProvider(None)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    port: list[int] = []
    done = asyncio.Event()

    async def serve() -> None:
        server = channels.create_server(interceptors=control_interceptors(TOKEN))
        add_control_service(server, provider)
        port.append(channels.bind(server, "127.0.0.1:0", None, require_client_auth=False))
        await server.start()
        started.set()
        await done.wait()
        await server.stop(0)

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(10)
    yield provider, port[0]
    loop.call_soon_threadsafe(done.set)
    thread.join(10)
    loop.close()


def test_live_fetches_each_nodes_checkpoint_and_skips_those_that_do_not_answer(
        tmp_path, control_server):
    provider, port = control_server
    first, _ = write_pair(tmp_path / "files")
    peers = generate_cluster("complete", 2, PAIR, tmp_path / "peers", state_root=tmp_path,
                             control_ports=[port, free_ports(1)[0]])
    provider.data = None
    none_yet = run("invariant", "--live", "--token", TOKEN, *map(str, peers))
    assert none_yet.exit_code == 1
    assert "no checkpoint yet" in none_yet.output and "no dacflnode daemon answers" in \
        none_yet.output

    provider.data = first.read_bytes()
    result = run("invariant", "--live", "--json", "--token", TOKEN, *map(str, peers))
    assert result.exit_code == 1, result.output  # node-1 did not answer: no verdict of holding
    data = json.loads(result.stdout)
    assert data["nodes"] == ["node-0"] and data["unresolved"] == 1
    assert [s["source"].split(" ")[0] for s in data["skipped"]] == [str(peers[1])]
    assert data["holds"] is False and "no dacflnode daemon answers" in data["verdict"]

    refused = run("invariant", "--live", "--token", TOKEN + "-wrong", str(peers[0]))
    assert refused.exit_code == 1 and "refused the control token" in refused.output


# ---------------------------------------------------------------- simulator output
SIM = ["simulate", "--dataset", "synthetic", "--nodes", "3", "--rounds", "2", "--model",
       "tiny-cnn", "--synthetic-train", "300", "--synthetic-test", "60", "--topology", "ring"]


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished two-algorithm simulator run (dacfl keeps the invariant, cdsgd does not)."""
    out = tmp_path_factory.mktemp("sim") / "run"
    result = CliRunner().invoke(cli, [*SIM, "--algorithm", "dacfl,cdsgd", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.slow
def test_a_finished_simulator_output_gets_a_verdict_instead_of_no_checkpoint(simulated):
    for paths in ([simulated], [simulated / "dacfl" / "node-0", simulated / "dacfl" / "node-1"]):
        result = run("invariant", *map(str, paths))
        assert result.exit_code == 0, result.output
        assert "no checkpoint yet" not in result.output
        lines = result.output.splitlines()
        assert lines[-1].startswith("holds: ") and lines[-1].endswith(" ≤ 2e-06")
        assert any(x.startswith("dacfl: residual ") and "over the 3 node(s)" in x for x in lines)
        assert "cdsgd: tracks its own x, no invariant to check" in lines
    data = json.loads(run("invariant", "--json", str(simulated)).stdout)
    assert data["holds"] is True and data["verdict"].startswith("holds: ")
    assert data["source"] == "simulator" and data["untracked"] == ["cdsgd"]
    assert 0 <= data["residuals"]["dacfl"] <= 2e-6 and data["tolerance"] == 2e-6


@pytest.mark.slow
def test_a_simulator_residual_above_the_tolerance_breaks_the_verdict(simulated, tmp_path):
    summary = json.loads((simulated / "summary.json").read_text())
    summary["invariant"]["dacfl"]["final"] = 3e-4
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    result = run("invariant", str(tmp_path))
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == "BROKEN: dacfl: residual 0.0003 > 2e-06"
    assert run("invariant", "--tolerance", "1e-3", str(tmp_path)).exit_code == 0


@pytest.mark.slow  # reads the module's simulated run
def test_a_simulator_summary_without_the_invariant_says_to_run_it_again(simulated, tmp_path):
    summary = json.loads((simulated / "summary.json").read_text())
    del summary["invariant"]  # as an older dacflnode wrote it
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    result = run("invariant", "--json", str(tmp_path))
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["holds"] is False and "holds no invariant" in data["error"]
    assert "run `dacflnode simulate` again" in data["error"]


@pytest.mark.slow  # reads the module's simulated run
def test_a_run_of_algorithms_without_a_tracker_has_no_invariant_to_hold(simulated, tmp_path):
    summary = json.loads((simulated / "summary.json").read_text())
    summary["algorithms"] = {"cdsgd": summary["algorithms"]["cdsgd"]}
    summary["invariant"] = {}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    result = run("invariant", str(tmp_path))
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == ("not applicable: no algorithm of this run keeps "
                                              "the invariant (cdsgd track their own x)")
