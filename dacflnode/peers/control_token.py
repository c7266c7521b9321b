"""The Control service's default credential: ``STATE_DIR/control.token``.

A node whose peers file sets no ``node.control_token`` draws a fresh random token at every start
(:func:`new_token`), writes it to ``STATE_DIR/control.token`` readable by the node's user only
(mode 0600 from the first byte, whatever the umask; :func:`write_token_file`), and its Control
service refuses every call without it. The node's user finds it from the peers file:
``dacflnode status|metrics|stop|invariant --live --peers FILE`` read it (:func:`client_token`);
another local user cannot read it, so every Control call of theirs (status, the model through
Checkpoint, stop) ends ``UNAUTHENTICATED``. A restart draws a new token: an old one is refused.

With ``node.control_token`` set, that token is the credential (it is in the peers file already)
and no token file is written; a file left by an earlier start without it is removed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from dacflnode.peers.model import NodeSection

#: The token file's name in the node's state folder.
TOKEN_FILE = "control.token"
#: Its mode: read and write for the node's user, nothing for anyone else.
TOKEN_MODE = 0o600


def token_file(state_dir: Path) -> Path:
    """Where a node with state folder ``state_dir`` writes its Control token."""
    return Path(state_dir) / TOKEN_FILE


def new_token() -> str:
    """A fresh random Control token (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


def write_token_file(state_dir: Path, token: str) -> Path:
    """Write ``token`` to ``STATE_DIR/control.token`` with mode 0600 (whatever the umask),
    atomically: a reader sees the old token or the new one, never a part; an existing file or
    link of that name is replaced, not followed. Creates ``state_dir`` (0700) if missing;
    raises :class:`OSError` when it cannot write."""
    state_dir = Path(state_dir)
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = token_file(state_dir)
    tmp = path.with_name(f".{TOKEN_FILE}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # left by a crashed start of the same pid: never write through it
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, TOKEN_MODE)
    try:
        try:
            os.fchmod(fd, TOKEN_MODE)  # the umask may have taken bits away; never adds any
            os.write(fd, f"{token}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


def remove_token_file(state_dir: Path) -> None:
    """Remove a token file an earlier start left (the node now uses ``node.control_token``)."""
    with contextlib.suppress(FileNotFoundError):
        token_file(state_dir).unlink()


def read_token_file(state_dir: Path) -> str | None:
    """The token in ``STATE_DIR/control.token``; ``None`` when there is no such file (the node
    never started, or uses ``node.control_token``). Raises :class:`OSError` when the file exists
    but cannot be read (another user's node: run as the node's user, or pass a token)."""
    try:
        text = token_file(state_dir).read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        return None
    token = text.strip()
    return token or None


def client_token(node: NodeSection) -> str | None:
    """The token a client of ``node`` presents: ``node.control_token``, else the one in its
    token file (see :func:`read_token_file`, which may raise :class:`OSError`)."""
    if node.control_token:
        return node.control_token
    return read_token_file(node.state_dir)
