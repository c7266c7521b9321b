"""Two real daemons run as the deployment files run them, as far as this machine allows: as a
uid with no account (`docker run --user`, a fresh image user), with umask 0077 (the systemd
unit's UMask=), no new privileges and no capabilities (NoNewPrivileges=,
CapabilityBoundingSet=), from ``/`` with HOME at the state folder (the unit's user's home) and
TMPDIR at a folder of their own (PrivateTmp=). They must finish their run and write nowhere but
their state folder (the unit's only writable path under ProtectSystem=strict) and that
temporary folder, no file open to other users.

systemd itself cannot start the unit here (no systemd as process 1 in this container), so the
sandbox is applied with util-linux's setpriv; it needs root to change to that uid.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from dacflnode.cluster.launcher import free_ports
from dacflnode.peers.generate import generate_cluster
from dacflnode.records.metrics_log import read_metrics
from tests.harness.cluster import TINY

#: a uid with no account, as `docker run --user 54321:54321` gives the node
UID = 54321
#: the folders any user may write, besides the state folder: the node must leave them alone
SHARED_WRITABLE = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))

#: ``python -m dacflnode`` with the umask systemd's UMask=0077 gives it before it starts
UMASK_0077_THEN_DACFLNODE = (
    "import os, runpy, sys; os.umask(0o077); sys.argv[0] = 'dacflnode'; "
    "runpy.run_module('dacflnode', run_name='__main__', alter_sys=True)")

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to run the daemon as another uid")]


def owned_by(uid: int, top: Path) -> list[Path]:
    """The entries of ``top`` (not below) that ``uid`` owns."""
    found = []
    for entry in top.iterdir():
        try:
            if entry.lstat().st_uid == uid:
                found.append(entry)
        except FileNotFoundError:  # removed meanwhile by another process
            continue
    return found


def test_a_node_without_privileges_account_or_umask_leeway_writes_only_its_state_folder():
    with pytest.raises(KeyError):
        pwd.getpwuid(UID)
    assert not any(owned_by(UID, top) for top in SHARED_WRITABLE if top.is_dir())
    # outside pytest's tmp_path, whose parent only root may enter
    base = Path(tempfile.mkdtemp(prefix="dacflnode-sandbox-"))
    try:
        base.chmod(0o755)
        state = base / "state"  # /var/lib/dacflnode: StateDirectory=, owned by User=, 0700
        state.mkdir(mode=0o700)
        os.chown(state, UID, UID)
        ports = free_ports(4)
        cfg = replace(TINY, nodes=2, rounds=2)
        paths = generate_cluster("complete", 2, cfg, base / "peers", ports=ports[:2],
                                 control_ports=ports[2:], state_root=state,
                                 round_deadline=30, hello_timeout=60)
        for path in [base / "peers", *paths]:  # /etc/dacflnode: root's, readable
            path.chmod(0o755 if path.is_dir() else 0o644)
        # PrivateTmp=: the service's own /tmp (PyTorch makes torchinductor_<user> there)
        private_tmp = base / "private-tmp"
        private_tmp.mkdir(mode=0o700)
        os.chown(private_tmp, UID, UID)
        env = {"PATH": os.environ["PATH"], "HOME": str(state), "TMPDIR": str(private_tmp),
               "OMP_NUM_THREADS": "1", "LANG": "C.UTF-8"}
        sandbox = ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups",
                   "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all",
                   sys.executable, "-c", UMASK_0077_THEN_DACFLNODE]
        procs = [subprocess.Popen([*sandbox, "start", "--peers", str(p)], cwd="/", env=env,
                                  text=True,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for p in paths]
        errors = [p.communicate(timeout=300)[1] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], errors

        for i in range(2):
            node = state / f"node-{i}"
            assert len(read_metrics(node / "metrics.jsonl")) == 2
            assert (node / "final.safetensors").is_file()
        # everything the nodes wrote is below the state folder and theirs: nothing for other
        # users, nothing the group may change (the modes of docs/security.md, "Files and
        # modes": 0640 for logs, 0600 for secrets, 0700 for folders)
        written = [p for p in base.rglob("*") if p.lstat().st_uid == UID]
        assert written and all(p.is_relative_to(state) or p.is_relative_to(private_tmp)
                               for p in written)
        for path in written:
            mode = stat.S_IMODE(path.lstat().st_mode)
            assert mode & 0o027 == 0, (path, oct(mode))
        for secret in ("final.safetensors", "control.token"):
            assert stat.S_IMODE((state / "node-0" / secret).stat().st_mode) == 0o600
        assert not any(owned_by(UID, top) for top in SHARED_WRITABLE if top.is_dir())
    finally:
        shutil.rmtree(base)
