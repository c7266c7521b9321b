"""Failed TLS handshakes, counted by reason: gRPC reports them only as a line on stderr.

gRPC's Python API says nothing when a connection fails its TLS handshake: the server just drops
it. gRPC core (its ``ssl_transport_security.cc``) logs one line per failure on the process's
stderr, file descriptor 2 — with grpcio 1.85, at the default verbosity::

    I1127 00:01:19.375259   30746 ssl_transport_security.cc:2563] Handshake failed with error
    SSL_ERROR_SSL: error:100000f7:SSL routines:OPENSSL_internal:WRONG_VERSION_NUMBER: ...

(one line; broken here). Measured against a server requiring client certificates, the error
names what the client did:

=================  =========================================================================
reason             what gRPC core logs (the OpenSSL error)
=================  =========================================================================
``plaintext``      ``WRONG_VERSION_NUMBER`` (a plaintext gRPC client, any non-TLS bytes),
                   ``HTTP_REQUEST`` (plain HTTP)
``unknown-ca``     ``CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate``
                   (a certificate from another CA, or self-signed); ``TLSV1_ALERT_UNKNOWN_CA``
``bad-certificate``  ``CERTIFICATE_VERIFY_FAILED`` for any other cause (expired, wrong
                   usage), ``*_ALERT_BAD_CERTIFICATE``, ``*_ALERT_CERTIFICATE_EXPIRED``, ...
``no-certificate`` ``PEER_DID_NOT_RETURN_A_CERTIFICATE`` (a TLS client without a certificate),
                   ``TLSV13_ALERT_CERTIFICATE_REQUIRED``
``other``          anything else (``EXCESSIVE_MESSAGE_SIZE`` for garbage that looks like TLS, ...)
=================  =========================================================================

So a daemon with ``node.tls`` sends its file descriptor 2 through a **relay**:
:class:`HandshakeWatch` starts ``python -m dacflnode.transport.tls_failures``, whose stdin
becomes the daemon's fd 2 and whose stderr is the daemon's real stderr. The relay passes every
line through unchanged except these; for each of them it reports ``<reason> <total> <detail>``
on its stdout, which a thread of the daemon reads to count and log (one rate-limited WARNING
line through the daemon's log instead of gRPC's unlimited lines). The relay is a process, not a
thread, so that what the daemon writes last before dying — a C library's abort message — still
reaches the terminal: the relay reads until the daemon's end of the pipe closes. It ignores
SIGINT and SIGTERM (a Ctrl-C reaches the whole process group) and exits at that end of file.

What it cannot tell: the line does not say which connection failed (no peer address), nor
whether the node was the server or the client — a neighbour whose certificate this node does
not trust fails this node's own calls with ``unknown-ca`` too. Lines appear only while gRPC
logs at INFO, its default: with ``GRPC_VERBOSITY`` set to ``ERROR`` or ``NONE`` nothing is
counted, and the daemon says so at start (:func:`verbosity_hides_failures`).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO

__all__ = ["MARKER", "REASONS", "HandshakeWatch", "classify", "relay",
           "verbosity_hides_failures"]

#: The reasons a failed handshake is counted under (see the module docstring).
REASONS = ("plaintext", "unknown-ca", "bad-certificate", "no-certificate", "other")
#: What gRPC core's line says (``ssl_transport_security.cc``).
MARKER = "Handshake failed with error"
#: The longest line kept whole; a longer one is passed on in pieces (and never counted).
MAX_LINE = 64 * 1024
#: The longest detail reported with a failure (the OpenSSL error's text).
MAX_DETAIL = 100

#: gRPC core's (absl's) prefix: severity and date, time, thread id, then the source file.
_GRPC_LINE = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ssl_transport_security\.cc:\d+\] "
                        + re.escape(MARKER))
_PLAINTEXT = ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "HTTPS_PROXY_REQUEST")
_UNKNOWN_CA = ("unable to get local issuer certificate", "self-signed certificate",
               "self signed certificate", "ALERT_UNKNOWN_CA")
_NO_CERTIFICATE = ("PEER_DID_NOT_RETURN_A_CERTIFICATE", "CERTIFICATE_REQUIRED")
_BAD_CERTIFICATE = ("CERTIFICATE_VERIFY_FAILED", "ALERT_BAD_CERTIFICATE",
                    "ALERT_CERTIFICATE_EXPIRED", "ALERT_CERTIFICATE_REVOKED",
                    "ALERT_UNSUPPORTED_CERTIFICATE", "ALERT_CERTIFICATE_UNKNOWN")


def classify(line: str) -> tuple[str, str] | None:
    """``(reason, detail)`` when ``line`` is gRPC core's report of a failed TLS handshake, else
    ``None``; ``detail`` is OpenSSL's reason (``WRONG_VERSION_NUMBER``, ``CERTIFICATE_VERIFY_FAILED:
    unable to get local issuer certificate``), cut at :data:`MAX_DETAIL` characters.

    Only a line that *starts* as gRPC core's does (its log prefix and source file) counts: a
    peer's value quoted in one of the node's own lines (a Hello's ``node_id`` reading "Handshake
    failed with error …") can neither add to the counts nor hide that line from stderr."""
    found = _GRPC_LINE.match(line)
    if found is None:
        return None
    detail = line[found.end():].strip()
    detail = detail.rpartition("OPENSSL_internal:")[2] or detail  # after BoringSSL's codes
    # gRPC appends the verification context's state, which says nothing about the client
    detail = detail.removesuffix(": Invalid certificate verification context").strip()
    detail = detail[:MAX_DETAIL]
    if any(k in line for k in _PLAINTEXT):
        return "plaintext", detail
    if any(k in line for k in _NO_CERTIFICATE):
        return "no-certificate", detail
    if any(k in line for k in _UNKNOWN_CA):
        return "unknown-ca", detail
    if any(k in line for k in _BAD_CERTIFICATE):
        return "bad-certificate", detail
    return "other", detail


def verbosity_hides_failures(env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Whether gRPC is told (``GRPC_VERBOSITY``) not to log the lines counted here."""
    return env.get("GRPC_VERBOSITY", "").strip().upper() in ("ERROR", "NONE")


# ---------------------------------------------------------------------------------- the relay
def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def relay(source: int = 0, out: int = 2, report: int = 1) -> None:
    """Copy ``source`` to ``out`` line by line until end of file, except gRPC's failed-handshake
    lines: for each, ``<reason> <total> <detail>`` goes to ``report`` (totals per reason since
    the start, so a report dropped because nobody reads fast enough is made up by the next)."""
    totals = dict.fromkeys(REASONS, 0)
    reporting = True
    try:
        os.set_blocking(report, False)  # the daemon being slow must never stop its stderr
    except OSError:
        reporting = False
    pending = b""
    in_long_line = False  # the start of the line being read was passed on already
    while True:
        try:
            chunk = os.read(source, 65536)
        except InterruptedError:
            continue
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        passed = []
        for raw in lines:
            found = (classify(raw.decode("utf-8", "replace"))
                     if MARKER.encode() in raw and not in_long_line else None)
            in_long_line = False
            if found is None:
                passed.append(raw + b"\n")
                continue
            reason, detail = found
            totals[reason] += 1
            if reporting:
                record = f"{reason} {totals[reason]} {detail}\n".encode("utf-8", "replace")
                try:
                    _write_all(report, record[:4000])  # at most PIPE_BUF: written whole or not
                except BlockingIOError:
                    pass  # the next record carries the total
                except OSError:  # the daemon is gone: keep relaying its stderr
                    reporting = False
        if len(pending) > MAX_LINE:  # no newline in sight: pass it on as it is, never counted
            passed.append(pending)
            pending, in_long_line = b"", True
        if passed and out >= 0:
            try:
                _write_all(out, b"".join(passed))
            except OSError:  # nobody reads the real stderr any more: drain, never block
                out = -1
    if pending and out >= 0:
        _write_all(out, pending)


def _main() -> None:
    # a Ctrl-C or a service manager's SIGTERM reaches the whole process group: the relay stays
    # until the daemon's last line has passed (its end of the pipe closes when it exits)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(OSError):  # the real stderr closed at the very end
        relay()


# ---------------------------------------------------------------------------------- the daemon
class HandshakeWatch:
    """Counts the daemon's failed TLS handshakes by reason (see the module docstring).

    :meth:`start` puts the relay between the process's fd 2 and its real stderr;
    ``on_failure(reason, detail)`` is called, from a thread of its own, for every failure
    reported (the daemon logs it); :meth:`counts` is safe from any thread.
    """

    def __init__(self, on_failure: Callable[[str, str], None] | None = None) -> None:
        self.on_failure = on_failure
        self._counts = dict.fromkeys(REASONS, 0)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None

    def counts(self) -> dict[str, int]:
        """Failed handshakes since :meth:`start`, by reason (every reason, 0 included)."""
        with self._lock:
            return dict(self._counts)

    def start(self) -> None:
        """Start the relay and send fd 2 through it. Raises ``OSError`` if it cannot start
        (the process's stderr is then unchanged)."""
        sys.stderr.flush()
        proc = subprocess.Popen(
            [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            close_fds=True)
        assert proc.stdin is not None and proc.stdout is not None
        os.dup2(proc.stdin.fileno(), 2)  # from now on fd 2 is the relay's stdin
        proc.stdin.close()  # fd 2 is its only write end: the relay ends when the process does
        self._proc = proc
        self._thread = threading.Thread(target=self._read, args=(proc.stdout,),
                                        name="tls-handshake-watch", daemon=True)
        self._thread.start()

    def _read(self, reports: IO[bytes]) -> None:
        for raw in reports:
            reason, _, rest = raw.decode("utf-8", "replace").rstrip("\n").partition(" ")
            total_text, _, detail = rest.partition(" ")
            if reason not in self._counts or not total_text.isdigit():
                continue
            with self._lock:
                self._counts[reason] = max(self._counts[reason], int(total_text))
            if self.on_failure is not None:
                with contextlib.suppress(Exception):  # a logging failure must not end counting
                    self.on_failure(reason, detail)


if __name__ == "__main__":
    _main()
