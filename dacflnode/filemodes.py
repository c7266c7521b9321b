"""The modes of every file and folder dacflnode writes, whatever the process umask.

A node's folders hold what another local user must neither read (checkpoints and models are the
node's training result; keys are its identity) nor replace (a swapped ``ca.crt`` or checkpoint
is read at the next start). The umask is the operator's, and under ``umask 000`` Python's
defaults make folders 0777 and files 0666. So nothing here trusts it: every folder and file is
created with its mode from the first byte (``os.mkdir``/``os.open`` with the mode, then
``chmod``/``fchmod``, since the umask can only narrow the creation mode) — the table of
docs/security.md ("Files and modes"):

=====================  ======  ===================================================================
what                   mode    examples
=====================  ======  ===================================================================
folders                0700    state folders, the certs folder, ``launch``/``simulate`` outputs
secrets                0600    ``*.key``, checkpoints, ``final.safetensors``, peers files that
                               hold a ``control_token``, the decoded-images cache
logs and data          0640    ``daemon.log`` (and its rotated files), ``metrics.jsonl``,
                               ``summary.json``, ``daemon.out``, peers files without a token
certificates           0640    ``ca.crt``, ``<id>.crt`` (public, but nobody else needs them)
=====================  ======  ===================================================================

A folder that already exists keeps its mode, except a node's state folder: the daemon takes
the group's write access and others' access away from it at start (:func:`tighten_dir`, with
one warning line).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import IO

__all__ = [
    "DIR_MODE",
    "LOG_MODE",
    "SECRET_MODE",
    "make_dir",
    "open_text",
    "others_can_write",
    "prepare_file",
    "tighten_dir",
    "write_bytes",
    "write_text",
]

#: Folders: the owner only.
DIR_MODE = 0o700
#: Keys, checkpoints and models, peers files holding a token: the owner only.
SECRET_MODE = 0o600
#: Logs, metrics and summaries: the owner writes, the owner's group reads.
LOG_MODE = 0o640


def make_dir(path: Path | str, mode: int = DIR_MODE) -> Path:
    """``path`` as a folder, with its missing parents; every folder created here gets ``mode``
    (existing ones are left as they are). Raises ``OSError`` as ``mkdir`` does."""
    path = Path(path)
    missing: list[Path] = []
    probe = path
    while not os.path.lexists(probe):
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, mode)
        except FileExistsError:
            if not folder.is_dir():
                raise
            continue  # made meanwhile by someone else: not ours to change
        os.chmod(folder, mode)
    if not path.is_dir():
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))
    return path


def others_can_write(path: Path) -> bool:
    """Whether users other than the owner may write ``path`` (group or other write bit)."""
    return bool(path.stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH))


#: What :func:`tighten_dir` takes away: the group's write access and every access of others.
OPEN_BITS = stat.S_IWGRP | stat.S_IRWXO


def tighten_dir(path: Path) -> bool:
    """Take the group's write access and all of others' away from the existing folder ``path``
    (a group that may read stays: it is how an operator shares the 0640 logs); whether there
    was any to take. Raises ``OSError`` when it may not (a folder of another user)."""
    current = stat.S_IMODE(path.stat().st_mode)
    if current & OPEN_BITS == 0:
        return False
    os.chmod(path, current & ~OPEN_BITS)
    return True


def _open_fd(path: Path, flags: int, mode: int) -> int:
    fd = os.open(path, flags | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_text(path: Path | str, mode: int, *, append: bool = False) -> IO[str]:
    """``path`` opened to write UTF-8 text (truncated, or appended to with ``append``), created
    with ``mode`` and given ``mode`` if it existed with another."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    return os.fdopen(_open_fd(Path(path), flags, mode), "a" if append else "w",
                     encoding="utf-8")


def prepare_file(path: Path | str, mode: int) -> None:
    """Create ``path`` empty with ``mode`` (or give an existing one ``mode``), so that a writer
    that opens it with truncation — a library's ``save`` — keeps that mode."""
    os.close(_open_fd(Path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode))


def write_bytes(path: Path | str, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` (replacing its contents), with ``mode`` from the first byte."""
    fd = _open_fd(Path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def write_text(path: Path | str, text: str, mode: int) -> None:
    """Write ``text`` (UTF-8) to ``path``, with ``mode`` from the first byte."""
    write_bytes(path, text.encode("utf-8"), mode)
