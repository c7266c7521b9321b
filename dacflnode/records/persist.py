"""Writing a node's per-round files (metrics line, checkpoint) without dying of an I/O error.

The files a node writes after each round are bookkeeping: losing one write must not end a run
that its neighbours depend on, and a node that cannot write at all must stop cleanly, saying
what to do, instead of ending with a traceback. :class:`Persister` runs one write and sorts its
``OSError``:

* **transient** (any error not listed below: out of file descriptors ``EMFILE``/``ENFILE``,
  ``EIO``, ``EAGAIN``, ``EINTR``, ...): logged in one line (what, path, error) and tried again
  after a growing pause, up to ``tries`` times in all (by default 3 tries over 3 seconds); a
  descriptor freed by a closing connection, or a storage hiccup, heals within that time;
* **permanent**: a full disk (``ENOSPC``) or quota (``EDQUOT``), a read-only file system
  (``EROFS``), no permission (``EACCES``, ``EPERM``). Trying again would only delay the stop.

A permanent error, or a transient one still there after the last try, raises
:class:`PersistError`, whose message names the file and the remedy (free space in the state
directory, raise the open-files limit, fix its permissions). The node turns it into a clean stop
(exit status 1): it resumes from its last good checkpoint once the cause is fixed.

``safetensors`` reports an I/O error as ``SafetensorError("... (os error N)")``, not as an
``OSError``; :func:`os_error` reads the errno back from its text, so a checkpoint's full disk is
recognised like a metrics line's.

Retrying is safe for what a node writes: a checkpoint is written to a temporary file and renamed
(:func:`~dacflnode.learning.files.atomic_save`), and a metrics line is appended by one ``open``
and one short ``write``, which fail before writing anything when descriptors run out. (A full
disk can cut a line short; that error is permanent, and the reader skips a broken line.)

:meth:`Persister.write` blocks (it sleeps between tries): the caller runs it in a worker thread.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from safetensors import SafetensorError

log = logging.getLogger(__name__)

#: Errors that no retry within seconds can fix.
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
NOT_ALLOWED = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
PERMANENT = DISK_FULL | NOT_ALLOWED
#: Out of file descriptors: the process's (EMFILE) or the system's (ENFILE).
NO_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})

#: Defaults: 3 tries, pausing 1 s then 2 s between them.
TRIES = 3
PAUSE_S = 1.0

_OS_ERROR_IN_TEXT = re.compile(r"\(os error (\d+)\)")


class PersistError(Exception):
    """A node's per-round file cannot be written; the message says why and what to do.

    ``errno`` is the error number of the last failure (``None`` if unknown), ``path`` the file.
    """

    def __init__(self, message: str, errno_: int | None, path: str) -> None:
        super().__init__(message)
        self.errno = errno_
        self.path = path


def os_error(exc: BaseException) -> OSError | None:
    """``exc`` as an ``OSError``: itself, or the errno a ``SafetensorError`` quotes; ``None``
    for anything else (a bug, not an I/O error: it is not retried)."""
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, SafetensorError):
        found = _OS_ERROR_IN_TEXT.search(str(exc))
        if found is not None:
            number = int(found.group(1))
            return OSError(number, os.strerror(number))
    return None


def remedy(errno_: int | None, state_dir: Path) -> str:
    """What the operator should do about error ``errno_`` writing in ``state_dir``."""
    if errno_ in DISK_FULL:
        return (f"the disk (or quota) holding the state directory {state_dir} is full: free "
                "space there, or move state_dir, then start the node again (it resumes from "
                "its last checkpoint)")
    if errno_ in NO_DESCRIPTORS:
        return ("the process ran out of open files: raise its open-files limit (`ulimit -n`, "
                "or LimitNOFILE= in a systemd unit), then start the node again")
    if errno_ in NOT_ALLOWED:
        return (f"the node may not write in {state_dir}: make it writable by the user the node "
                "runs as, then start the node again")
    return (f"check the storage that holds {state_dir} (`dmesg` may say more), then start the "
            "node again")


class Persister:
    """Runs a node's file writes, retrying transient ``OSError`` (see the module docstring).

    ``tries`` counts every attempt (at least 1); the pause before attempt ``k + 1`` is
    ``pause * 2**(k - 1)`` seconds. ``sleep`` is how it pauses (tests pass a fake).
    :attr:`retried` counts the failed attempts that were tried again, since the node started.
    """

    def __init__(
        self,
        node_id: str,
        state_dir: Path,
        *,
        tries: int = TRIES,
        pause: float = PAUSE_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if tries < 1:
            raise ValueError(f"tries must be at least 1, got {tries}")
        self.node_id = node_id
        self.state_dir = state_dir
        self.tries = tries
        self.pause = pause
        self.sleep = sleep
        self.retried = 0

    def write(self, what: str, fn: Callable[[], object]) -> None:
        """Run ``fn`` (which writes ``what``, e.g. "checkpoint of round 7"; its result is
        dropped), retrying transient I/O errors; raises :class:`PersistError` when it cannot
        succeed. Any exception that is not an I/O error propagates unchanged."""
        for attempt in range(1, self.tries + 1):
            try:
                fn()
                return
            except Exception as exc:
                err = os_error(exc)
                if err is None:
                    raise
                path = err.filename or str(self.state_dir)
                reason = err.strerror or str(err)
                last = attempt == self.tries or err.errno in PERMANENT
                if last:
                    tried = "" if err.errno in PERMANENT else f" (tried {attempt} times)"
                    raise PersistError(
                        f"{self.node_id}: cannot write the {what} to {path}: {reason}{tried}; "
                        f"{remedy(err.errno, self.state_dir)}",
                        err.errno, str(path)) from exc
                wait = self.pause * 2 ** (attempt - 1)
                log.warning("writing the %s to %s failed: %s; trying again in %.1fs",
                            what, path, reason, wait,
                            extra={"event": "write_retry", "node": self.node_id})
                self.retried += 1
                self.sleep(wait)
