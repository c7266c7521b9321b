"""``dacflnode start`` on real processes: every start-up failure is one line naming the setting
or file and the fix, also in daemon.log, with exit code 2 and no traceback or asyncio warning;
a node started again after its last round exits 0 at once, its final model verified or
written again from the checkpoint. No neighbour is ever started: nothing here may wait."""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

from dacflnode.algorithms.rounds import NodeState
from dacflnode.cluster.launcher import free_ports
from dacflnode.daemon.service import build_node
from dacflnode.learning.files import read_verified
from dacflnode.peers.file import load_peers
from dacflnode.peers.generate import generate_cluster
from dacflnode.records.checkpoint import CHECKPOINT, FINAL_MODEL, save_checkpoint
from tests.harness import preloaded
from tests.harness.cluster import ENV, NOISE, TINY, assert_one_line_failure

pytestmark = pytest.mark.slow

ROUNDS = 2


def peers(tmp_path: Path, **node: object) -> Path:
    """node-0's peers file of a 2-node run whose neighbour never starts (hello_timeout 60 s:
    a node that waited for it would blow the tests' timeouts)."""
    ports = free_ports(4)
    cfg = replace(TINY, nodes=2, rounds=ROUNDS)
    path = generate_cluster("complete", 2, cfg, tmp_path / "peers", ports=ports[:2],
                            control_ports=ports[2:], state_root=tmp_path, hello_timeout=60)[0]
    if node:
        data = yaml.safe_load(path.read_text())
        data["node"].update(node)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def start(path: Path, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    began = time.monotonic()
    run = preloaded.run("start", "--peers", str(path), env=ENV, timeout=timeout)
    return run, time.monotonic() - began


@pytest.mark.parametrize("setting", ["node.listen", "node.control", "node.health"])
def test_a_taken_port_is_one_line_naming_the_setting_exit_2(tmp_path, setting):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        path = peers(tmp_path, **{setting.split(".")[1]: address})
        run, _ = start(path)
    assert_one_line_failure(run, path, setting, str(path), address, "Address already in use",
                            "choose a free address")


def test_unreadable_tls_files_are_one_line_naming_node_tls(tmp_path):
    missing = tmp_path / "nowhere"
    path = peers(tmp_path, tls={"ca": str(missing / "ca.crt"), "cert": str(missing / "n.crt"),
                                "key": str(missing / "n.key")})
    run, _ = start(path)
    assert_one_line_failure(run, path, "node.tls", str(missing / "ca.crt"), "No such file")


def own_checkpoint(path: Path, round_: int) -> Path:
    """A checkpoint of round ``round_`` that the node of ``path`` accepts as its own."""
    pf = load_peers(path)
    built = build_node(pf)
    g = torch.Generator().manual_seed(round_)
    model = torch.randn(built.setup.layout.numel, generator=g) * 0.01
    state = NodeState(round_, model.clone(), model.clone(), model.clone())
    save_checkpoint(pf.node.state_dir, state, built.setup.trainer.local_buffers(),
                    built.setup.run_info, tracked=built.setup.algorithm.tracked_field)
    return pf.node.state_dir


def test_a_damaged_checkpoint_is_one_line_naming_the_file_exit_2(tmp_path):
    path = peers(tmp_path)
    state_dir = own_checkpoint(path, 1)
    data = bytearray((state_dir / CHECKPOINT).read_bytes())
    data[-5] ^= 0x40  # one bit of the last tensor
    (state_dir / CHECKPOINT).write_bytes(bytes(data))
    run, _ = start(path)
    assert_one_line_failure(run, path, str(state_dir / CHECKPOINT), "checksum", "afresh")


def test_a_finished_node_started_again_exits_0_at_once_and_rewrites_a_cut_final_model(
        tmp_path):
    path = peers(tmp_path)
    state_dir = own_checkpoint(path, ROUNDS)
    final = state_dir / FINAL_MODEL
    first, seconds = start(path)  # no final model yet: written from the checkpoint
    assert first.returncode == 0, first.stderr
    assert seconds < 30  # the neighbour is never started: nothing is waited for
    assert f"run complete: {ROUNDS}/{ROUNDS} rounds" in first.stderr
    assert "is missing: writing it again from the checkpoint" in first.stderr
    meta, written, verified = read_verified(final)
    assert verified and meta["round"] == str(ROUNDS)
    cut = final.read_bytes()

    final.write_bytes(cut[: len(cut) // 2])  # a torn write
    again, seconds = start(path)
    assert again.returncode == 0 and seconds < 30, again.stderr
    assert "cut short" in again.stderr and "writing it again" in again.stderr
    meta_again, rewritten, verified = read_verified(final)
    assert verified and meta_again == meta and rewritten.keys() == written.keys()
    assert all(torch.equal(rewritten[k], written[k]) for k in written)

    quiet, _ = start(path)  # a sound final model is left as it is
    assert quiet.returncode == 0 and "writing it again" not in quiet.stderr
    assert f"run complete: {ROUNDS}/{ROUNDS} rounds" in quiet.stderr
    assert not any(n in quiet.stderr for n in NOISE)


def test_a_state_directory_that_cannot_be_made_is_one_line_naming_node_state_dir(tmp_path):
    """Before any log exists: the line goes to stderr alone."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    path = peers(tmp_path, state_dir=str(blocker / "node-0"))
    run, _ = start(path)
    assert run.returncode == 2, run.stderr
    assert not any(n in run.stderr for n in NOISE), run.stderr
    assert run.stderr.strip().splitlines() == [
        f"error: node.state_dir: in {path}: cannot write {blocker / 'node-0'}: Not a directory: "
        "make it a writable directory for the user the node runs as"]


def _bad_tls_file(tmp_path: Path, case: str) -> tuple[dict[str, str], Path, str]:
    """node-0's TLS files with one of them broken as ``case`` says: the node.tls section, the
    file at fault and what the one line must say about it."""
    from cryptography.hazmat.primitives import serialization

    from dacflnode.security.certs import tls_files, write_certs

    write_certs(tmp_path / "certs", ["node-0", "node-1"])
    write_certs(tmp_path / "other", ["node-0"])
    files = tls_files(tmp_path / "certs", "node-0")
    tls = {"ca": str(files.ca), "cert": str(files.cert), "key": str(files.key)}
    bad = tmp_path / "bad.pem"
    if case == "key-not-pem":
        bad.write_text("not a key\n")
        tls["key"], said = str(bad), "not a PEM private key"
    elif case == "key-encrypted":
        key = serialization.load_pem_private_key(files.key.read_bytes(), password=None)
        bad.write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret")))
        tls["key"], said = str(bad), "is encrypted"
    elif case == "key-of-another-cert":
        bad = tls_files(tmp_path / "certs", "node-1").key
        tls["key"], said = str(bad), f"is not the key of {files.cert}"
    elif case == "cert-not-pem":
        bad.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
        tls["cert"], said = str(bad), "is not the node's certificate in PEM"
    elif case == "cert-of-another-ca":
        other = tls_files(tmp_path / "other", "node-0")
        tls["cert"], tls["key"], bad = str(other.cert), str(other.key), other.cert
        said = f"is not a valid 'node-0' certificate under {files.ca}"
    else:
        raise AssertionError(case)
    return tls, bad, said


@pytest.mark.parametrize("case", ["key-not-pem", "key-encrypted", "key-of-another-cert",
                                  "cert-not-pem", "cert-of-another-ca"])
def test_a_bad_key_or_certificate_is_one_line_naming_the_file_not_a_port(tmp_path, case):
    tls, bad, said = _bad_tls_file(tmp_path, case)
    path = peers(tmp_path, tls=tls)
    run, _ = start(path)
    assert_one_line_failure(run, path, "node.tls", str(path), str(bad), said)
    assert "cannot listen" not in run.stderr and "port taken" not in run.stderr
