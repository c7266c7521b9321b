"""Two real daemons run as the deployment files run them, as far as this machine allows: as a
uid with no account (`docker run --user`, a fresh image user), with umask 0077 (the systemd
unit's UMask=), no new privileges and no capabilities (NoNewPrivileges=,
CapabilityBoundingSet=), from ``/`` with HOME at the state folder (the unit's user's home) and
TMPDIR at a folder of their own (PrivateTmp=). They must finish their run and write nowhere but
their state folder (the unit's only writable path under ProtectSystem=strict) and that
temporary folder, no file open to other users.

systemd itself cannot start the unit here (no systemd as process 1 in this container), so the
sandbox is applied with util-linux's setpriv; it needs root to change to that uid.

A deployed node's program lies where its user can read it (the image's /opt, a venv the unit's
ExecStart names); a checkout need not: cloned into a folder only root may enter (``mktemp -d``,
``/root``), the package, the venv and even the interpreter (pyenv's, under /root) are out of that
uid's reach. The daemons then run in a mount namespace of their own in which exactly the paths
they need are reachable again, at the same absolute paths (each blocking folder is covered by an
empty world-searchable tmpfs into which only the needed entries are bound back), so the test
holds wherever the checkout lies and hides the rest of those folders, as ProtectHome= would.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import pytest

import dacflnode
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

needs_root_and_setpriv = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to run the daemon as another uid")


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


def searchable_by(uid: int, gid: int, folder: Path) -> bool:
    """Whether ``uid`` (in group ``gid`` only) may pass through ``folder``, by its mode bits."""
    st = folder.stat()
    bit = (stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid == gid
           else stat.S_IXOTH)
    return bool(st.st_mode & bit)


def blocked_folders(needed: Iterable[Path], uid: int, gid: int) -> dict[Path, set[str]]:
    """Each folder on the way to a ``needed`` path that ``uid`` cannot pass through, with the
    names inside it that lead on to the needed paths (all of its entries when a needed folder
    is itself blocked)."""
    blocked: dict[Path, set[str]] = {}
    for path in needed:
        way = [*reversed(path.parents), path]  # "/" first, ``path`` last
        for folder, entry in itertools.pairwise(way):
            if not searchable_by(uid, gid, folder):
                blocked.setdefault(folder, set()).add(entry.name)
        if path.is_dir() and not searchable_by(uid, gid, path):
            blocked.setdefault(path, set()).update(os.listdir(path))
    return blocked


def reachable_again(blocked: dict[Path, set[str]], stage: Path) -> str:
    """A shell script for a fresh mount namespace that makes the ``blocked`` folders passable
    with only their needed entries in them, then executes its arguments. Every folder is first
    bound into a folder of its own under ``stage`` (root's), so that the entries are bound back
    from the originals even where one blocked folder lies inside another."""
    order = sorted(blocked, key=lambda folder: len(folder.parts))
    q = shlex.quote
    lines = ["set -e", f"stage=$(mktemp -d -p {q(str(stage))})"]
    for i, folder in enumerate(order):
        lines += [f'mkdir "$stage/{i}"', f'mount --bind {q(str(folder))} "$stage/{i}"']
    for i, folder in enumerate(order):
        lines.append(f"mount -t tmpfs -o mode=0755,size=1m dacflnode-test {q(str(folder))}")
        for name in sorted(blocked[folder]):
            target = folder / name  # still the original: no mount is made out here
            made = "mkdir -m 0755" if target.is_dir() else "touch"
            lines += [f"{made} {q(str(target))}",
                      f'mount --bind "$stage/{i}"/{q(name)} {q(str(target))}']
    lines.append('exec "$@"')
    return "\n".join(lines)


def test_only_the_folders_the_uid_cannot_pass_are_opened_with_only_what_leads_on(tmp_path):
    tree = tmp_path / "tree"
    (tree / "closed" / "wanted" / "deep").mkdir(parents=True)
    (tree / "closed" / "private").mkdir()
    (tree / "open" / "shut").mkdir(parents=True)
    (tree / "open" / "shut" / "file").touch()
    tree.chmod(0o755)
    (tree / "closed").chmod(0o700)
    (tree / "open").chmod(0o755)
    (tree / "open" / "shut").chmod(0o700)
    uid = os.getuid() + 1  # not the owner, nor in the group
    gid = os.getgid() + 1
    blocked = blocked_folders([tree / "closed" / "wanted" / "deep", tree / "open" / "shut"],
                              uid, gid)
    ours = {folder: names for folder, names in blocked.items() if folder.is_relative_to(tree)}
    assert ours == {tree / "closed": {"wanted"}, tree / "open" / "shut": {"file"}}
    # what the uid owns it may pass by the owner's bit: nothing to open
    assert not searchable_by(uid, gid, tree / "closed")
    assert searchable_by(os.stat(tree).st_uid, gid, tree / "closed")
    assert blocked_folders([Path("/")], uid, gid) == {}


@pytest.mark.slow
@needs_root_and_setpriv
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
        # the checkout under test, whatever an installed package points at
        package_root = Path(dacflnode.__file__).resolve().parent.parent
        env = {"PATH": os.environ["PATH"], "HOME": str(state), "TMPDIR": str(private_tmp),
               "OMP_NUM_THREADS": "1", "LANG": "C.UTF-8", "PYTHONPATH": str(package_root)}
        sandbox = ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups",
                   "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all",
                   sys.executable, "-c", UMASK_0077_THEN_DACFLNODE]
        needed = {base, package_root, Path(sys.executable), Path(sys.executable).resolve(),
                  Path(sys.prefix), Path(sys.base_prefix),
                  *(Path(entry).resolve() for entry in sys.path if entry and Path(entry).exists())}
        blocked = blocked_folders(needed, UID, UID)
        if blocked:
            unshare = ["unshare", "--mount", "--propagation", "private"]
            if subprocess.run([*unshare, "true"], capture_output=True).returncode != 0:
                pytest.skip(f"uid {UID} cannot pass through {', '.join(map(str, blocked))} "
                            "(on the way to this checkout, its Python or its packages) and no "
                            "mount namespace can be made here to open them")
            stage = base / "stage"  # root's, 0700: the originals, for the bind mounts
            stage.mkdir(mode=0o700)
            sandbox = [*unshare, "sh", "-c", reachable_again(blocked, stage), "sh", *sandbox]
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
