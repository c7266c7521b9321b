"""The Control service's default credential: a node with no ``node.control_token`` draws a token at
every start, writes it to ``STATE_DIR/control.token`` (0600 whatever the umask) and refuses every
Control call without it; the node's user finds it from the peers file, another local user gets
nothing (``dacflnode.peers.control_token``).

The daemon tests start node-0 of a two-node run alone: it serves its Control service while it
waits for node-1, which never comes, until it is stopped.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from dacflnode.cli.main import cli as dacflnode_cli
from dacflnode.cluster.launcher import free_ports
from dacflnode.peers.control_token import (
    TOKEN_FILE,
    client_token,
    read_token_file,
    token_file,
    write_token_file,
)
from dacflnode.peers.file import load_peers
from dacflnode.peers.generate import generate_cluster
from dacflnode.transport.control_types import ControlAuth
from dacflnode.transport.grpc_control import (
    ControlUnauthenticated,
    fetch_checkpoint,
    fetch_status,
    request_stop,
)
from tests.harness import preloaded
from tests.harness.cluster import TINY, Process, start_node
from tests.harness.polling import until, until_blocking

pytestmark = pytest.mark.timeout(240)

ENV = {k: v for k, v in os.environ.items() if k != "DACFLNODE_CONTROL_TOKEN"}
ENV["OMP_NUM_THREADS"] = "1"
START_S = 90.0


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ------------------------------------------------------------------------------ the file
def test_the_token_file_is_0600_under_umask_000_and_replaces_what_was_there(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    loose = token_file(state)
    loose.write_text("old\n")
    loose.chmod(0o666)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("not a token\n")
    old = os.umask(0)
    try:
        write_token_file(state, "first")
        assert mode(loose) == 0o600 and read_token_file(state) == "first"
        loose.unlink()
        loose.symlink_to(elsewhere)  # a link of that name is replaced, never written through
        write_token_file(state, "second")
    finally:
        os.umask(old)
    assert not loose.is_symlink() and mode(loose) == 0o600
    assert read_token_file(state) == "second"
    assert elsewhere.read_text() == "not a token\n"
    assert sorted(p.name for p in state.iterdir()) == [TOKEN_FILE]  # no temporary file left


def test_a_missing_state_folder_is_created_private_and_a_missing_file_reads_as_none(tmp_path):
    state = tmp_path / "new" / "state"
    assert read_token_file(state) is None
    old = os.umask(0)
    try:
        write_token_file(state, "t0k3n")
    finally:
        os.umask(old)
    assert mode(state) == 0o700 and read_token_file(state) == "t0k3n"


def test_a_configured_control_token_wins_over_the_file(tmp_path):
    path = peers_file(tmp_path, control_token="configured-token-0123456789")
    node = load_peers(path).node
    write_token_file(node.state_dir, "from-the-file")
    assert client_token(node) == "configured-token-0123456789"


def test_a_client_that_cannot_read_the_token_file_says_so_and_what_to_do(tmp_path):
    path = peers_file(tmp_path)
    token_file(load_peers(path).node.state_dir).mkdir(parents=True)  # unreadable as a file
    result = CliRunner().invoke(dacflnode_cli, ["status", "--peers", str(path)], env={
        "DACFLNODE_CONTROL_TOKEN": ""})
    assert result.exit_code == 1
    said = " ".join(result.output.split())
    assert f"cannot read the control token {token_file(load_peers(path).node.state_dir)}" in said
    assert "run as the node's user" in said and "--token" in said


# ------------------------------------------------------------------------------ live daemons
def peers_file(root: Path, tls: bool = False, **node: object) -> Path:
    """node-0's peers file of a two-node run (``tls``: as ``topology --tls`` writes it)."""
    import yaml

    ports = free_ports(4)
    path = generate_cluster("complete", 2, replace(TINY, nodes=2, rounds=2), root / "peers",
                            ports=ports[:2], control_ports=ports[2:], state_root=root,
                            hello_timeout=120, tls_dir=root / "certs" if tls else None)[0]
    if node:
        data = yaml.safe_load(path.read_text())
        data["node"].update(node)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def start(path: Path) -> Process:
    """``dacflnode start --peers PATH`` under umask 000."""
    return start_node(path, umask=0o000, env=ENV)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return preloaded.run(*args, env=ENV, timeout=60)


async def serving_token(path: Path, proc: Process, not_token: str | None = None
                  ) -> str:
    """The token of the node started as ``proc`` once its Control service answers with it
    (``not_token``: the one of an earlier start, to be replaced first)."""
    node = load_peers(path).node

    async def answered() -> str | None:
        assert proc.poll() is None, f"the node exited with {proc.returncode}"
        token = read_token_file(node.state_dir)
        if token is None or token == not_token:
            return None
        try:
            await fetch_status(node.control, auth=ControlAuth(token=token))
        except Exception:  # not serving yet
            return None
        return token

    return await until(answered, START_S, interval=0.2,
                       what="the node's Control service never answered its token")


@pytest.fixture
def alone(tmp_path: Path) -> Iterator[tuple[Path, Process]]:
    path = peers_file(tmp_path)
    proc = start(path)
    try:
        yield path, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=60)


@pytest.mark.slow
async def test_a_default_node_refuses_control_calls_without_its_token_and_answers_with_it(alone):
    path, proc = alone
    node = load_peers(path).node
    token = await serving_token(path, proc)
    assert mode(token_file(node.state_dir)) == 0o600  # started under umask 000
    with pytest.raises(ControlUnauthenticated) as missing:
        await fetch_status(node.control)
    assert not missing.value.token_sent
    with pytest.raises(ControlUnauthenticated):
        await fetch_checkpoint(node.control)
    with pytest.raises(ControlUnauthenticated):
        await request_stop(node.control, auth=ControlAuth(token=token[:-1]))
    status = await fetch_status(node.control, auth=ControlAuth(token=token))
    assert status.node_id == "node-0" and status.refusals.get("control-token") == 3
    # an address alone is refused, and told where a credential comes from
    bare = cli("status", "--target", node.control)
    assert bare.returncode == 1
    said = " ".join(bare.stderr.split())
    assert f"the daemon at {node.control} wants a control token" in said
    assert "--peers" in said and "--token" in said
    # the node's user needs nothing but the peers file, as before
    table = cli("status", "--json", "--peers", str(path))
    assert table.returncode == 0, table.stderr
    assert json.loads(table.stdout)["node_id"] == "node-0"
    assert proc.poll() is None  # the refused stop stopped nothing
    # a second start of the running node fails on its port and leaves the running one's token
    again = cli("start", "--peers", str(path))
    assert again.returncode == 2 and "node.control" in again.stderr
    assert read_token_file(node.state_dir) == token
    assert cli("status", "--peers", str(path)).returncode == 0
    stopped = cli("stop", "--peers", str(path))
    assert stopped.returncode == 0, stopped.stderr
    assert proc.wait(timeout=60) == 0
    log = (node.state_dir / "daemon.log").read_text()
    assert f"token required: {token_file(node.state_dir)}" in log
    assert "refused: missing or wrong token" in log
    assert token not in log


@pytest.mark.slow
async def test_a_tls_cluster_from_topology_has_a_credential_and_a_restart_refuses_the_old_token(
        tmp_path):
    path = peers_file(tmp_path, tls=True)  # `topology --tls` writes no node.control_token
    node = load_peers(path).node
    assert node.control_token is None and node.tls is not None
    proc = start(path)
    try:
        first = await serving_token(path, proc)
        with pytest.raises(ControlUnauthenticated):
            await fetch_status(node.control)
        assert cli("stop", "--peers", str(path)).returncode == 0
        assert proc.wait(timeout=60) == 0
        proc = start(path)
        second = await serving_token(path, proc, not_token=first)
        assert second != first
        with pytest.raises(ControlUnauthenticated) as stale:
            await fetch_status(node.control, auth=ControlAuth(token=first))
        assert stale.value.token_sent
        assert cli("status", "--peers", str(path)).returncode == 0
    finally:
        if proc.poll() is None:
            cli("stop", "--peers", str(path))
        assert proc.wait(timeout=60) == 0


@pytest.mark.slow
def test_a_configured_control_token_writes_no_token_file_and_removes_a_stale_one(tmp_path):
    path = peers_file(tmp_path, control_token="configured-token-0123456789")
    node = load_peers(path).node
    write_token_file(node.state_dir, "left-by-an-earlier-start")
    proc = start(path)
    try:

        def answers() -> bool:
            assert proc.poll() is None, f"the node exited with {proc.returncode}"
            return cli("status", "--peers", str(path)).returncode == 0

        until_blocking(answers, START_S, interval=0.2, what="the node never answered status")
        assert not token_file(node.state_dir).exists()
    finally:
        cli("stop", "--peers", str(path))
        assert proc.wait(timeout=60) == 0


# ------------------------------------------------------------------------------ another user
#: What the other user runs: everything is imported first (as root: the interpreter's files may
#: be private), then it becomes uid/gid ``nobody`` and tries what the node's user can do.
AS_NOBODY = textwrap.dedent("""
    import asyncio, json, os, pwd, sys
    from click.testing import CliRunner
    import dacflnode.peers.control_token as ct, dacflnode.peers.file as peers
    import dacflnode.transport.grpc_control as gc
    from dacflnode.cli.main import cli
    import dacflnode.cli.daemon_cmds, yaml, rich.console, rich.table
    path = sys.argv[1]
    node = peers.load_peers(path).node
    nobody = pwd.getpwnam("nobody")
    os.setgroups([])
    os.setgid(nobody.pw_gid)
    os.setuid(nobody.pw_uid)
    out = {"uid": os.getuid()}
    try:
        ct.token_file(node.state_dir).read_text()
        out["read"] = "read"
    except PermissionError:
        out["read"] = "denied"
    res = CliRunner().invoke(cli, ["status", "--peers", path], env={
        "DACFLNODE_CONTROL_TOKEN": ""})
    out["cli"] = [res.exit_code, res.output]
    async def calls():
        got = {}
        for name, call in (("status", gc.fetch_status(node.control)),
                           ("checkpoint", gc.fetch_checkpoint(node.control)),
                           ("stop", gc.request_stop(node.control))):
            try:
                await call
                got[name] = "answered"
            except gc.ControlUnauthenticated:
                got[name] = "unauthenticated"
        return got
    out["calls"] = asyncio.run(calls())
    print(json.dumps(out))
""")


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="becoming another user needs root")
async def test_another_local_user_gets_nothing_from_the_control_service():
    import pwd

    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody on this host")
    # a folder every user may enter: only the token file's own mode protects it here
    root = Path(tempfile.mkdtemp(prefix="dacfl-other-user-"))
    try:
        root.chmod(0o755)
        path = peers_file(root)
        node = load_peers(path).node
        for p in (path, path.parent):
            p.chmod(0o755 if p.is_dir() else 0o644)
        proc = start(path)
        try:
            token = await serving_token(path, proc)
            node.state_dir.chmod(0o755)
            run = subprocess.run([sys.executable, "-c", AS_NOBODY, str(path)],
                                 capture_output=True, text=True, timeout=120, env=ENV,
                                 cwd=Path(__file__).resolve().parents[2])
            assert run.returncode == 0, run.stderr
            out = json.loads(run.stdout.strip().splitlines()[-1])
            assert out["uid"] != 0 and out["read"] == "denied"
            code, said = out["cli"]
            assert code == 1 and "cannot read the control token" in said
            assert out["calls"] == {"status": "unauthenticated", "checkpoint": "unauthenticated",
                                    "stop": "unauthenticated"}
            assert proc.poll() is None  # still running
            status = await fetch_status(node.control, auth=ControlAuth(token=token))
            assert status.refusals.get("control-token") == 3
        finally:
            cli("stop", "--peers", str(path))
            assert proc.wait(timeout=60) == 0
    finally:
        shutil.rmtree(root, ignore_errors=True)
