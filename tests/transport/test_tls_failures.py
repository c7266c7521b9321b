"""The stderr relay that counts failed TLS handshakes: gRPC core's lines (as grpcio 1.85 prints
them, measured) are sorted by reason and reported; every other line passes unchanged; a daemon
that does not read its reports never stops its stderr."""

from __future__ import annotations

import os
import threading

import pytest

from dacflnode.transport.tls_failures import classify, relay, verbosity_hides_failures

PREFIX = "I1127 00:01:19.375259   30746 ssl_transport_security.cc:2563] Handshake failed with " \
         "error SSL_ERROR_SSL: error:"
#: What a TLS server requiring client certificates logged for each client (measured).
MEASURED = {
    "plaintext": PREFIX + "100000f7:SSL routines:OPENSSL_internal:WRONG_VERSION_NUMBER: Invalid "
                          "certificate verification context",
    "unknown-ca": PREFIX + "1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: "
                           "unable to get local issuer certificate",
    "no-certificate": PREFIX + "100000c0:SSL routines:OPENSSL_internal:PEER_DID_NOT_RETURN_A_"
                               "CERTIFICATE: Invalid certificate verification context",
    "bad-certificate": PREFIX + "1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_"
                                "FAILED: certificate has expired",
    "other": PREFIX + "10000096:SSL routines:OPENSSL_internal:EXCESSIVE_MESSAGE_SIZE: Invalid "
                      "certificate verification context",
}


@pytest.mark.parametrize("reason", list(MEASURED))
def test_each_measured_line_is_counted_under_its_reason_with_a_short_detail(reason):
    found = classify(MEASURED[reason])
    assert found is not None and found[0] == reason
    assert len(found[1]) <= 100 and "verification context" not in found[1]
    assert found[1].split(":")[0] in MEASURED[reason]


def test_plain_http_is_plaintext_and_other_lines_are_not_handshakes():
    http = PREFIX + "1000009c:SSL routines:OPENSSL_internal:HTTP_REQUEST: Invalid certificate"
    assert classify(http) == ("plaintext", "HTTP_REQUEST: Invalid certificate")
    assert classify("E1127 chttp2_transport.cc:123] GOAWAY received") is None
    assert classify("Traceback (most recent call last):") is None


def test_a_peers_value_quoting_the_marker_is_neither_counted_nor_hidden():
    forged = ("2026-11-27 00:01:19,375 WARNING dacflnode.transport: hello from "
              "'x ssl_transport_security.cc:2563] Handshake failed with error WRONG_VERSION_"
              "NUMBER' refused")
    assert classify(forged) is None
    out, reports = run_relay((forged + "\n" + MEASURED["plaintext"][6:] + "\n").encode())
    assert out.decode() == forged + "\n" + MEASURED["plaintext"][6:] + "\n"
    assert reports == b""


def run_relay(data: bytes, read_reports: bool = True) -> tuple[bytes, bytes]:
    """Feed ``data`` through :func:`relay`; what it passed on and what it reported."""
    src_r, src_w = os.pipe()
    out_r, out_w = os.pipe()
    rep_r, rep_w = os.pipe()
    chunks: dict[int, list[bytes]] = {out_r: [], rep_r: []}

    def drain(fd: int) -> None:
        while block := os.read(fd, 65536):
            chunks[fd].append(block)

    readers = [threading.Thread(target=drain, args=(fd,))
               for fd in (out_r, *([rep_r] if read_reports else []))]
    worker = threading.Thread(target=relay, args=(src_r, out_w, rep_w))
    for t in (*readers, worker):
        t.start()
    view = memoryview(data)
    while view:
        view = view[os.write(src_w, view):]
    os.close(src_w)
    worker.join(timeout=30)
    assert not worker.is_alive(), "the relay did not end at end of file"
    for fd in (src_r, out_w, rep_w):
        os.close(fd)
    for t in readers:
        t.join(timeout=30)
    os.close(out_r)
    os.close(rep_r)
    return b"".join(chunks[out_r]), b"".join(chunks[rep_r])


def test_the_relay_passes_other_lines_unchanged_and_reports_running_totals():
    lines = ["2026-11-27 INFO dacflnode.daemon: node-0: serving", MEASURED["plaintext"],
             "E1127 some gRPC error", MEASURED["plaintext"], MEASURED["unknown-ca"],
             "an unfinished last line"]
    out, reports = run_relay("\n".join(lines).encode())
    assert out == (b"2026-11-27 INFO dacflnode.daemon: node-0: serving\n"
                   b"E1127 some gRPC error\nan unfinished last line")
    assert reports.decode().splitlines() == [
        "plaintext 1 WRONG_VERSION_NUMBER", "plaintext 2 WRONG_VERSION_NUMBER",
        "unknown-ca 1 CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate"]


def test_a_very_long_line_passes_whole_and_is_never_counted():
    long = ("x" * 200_000 + " Handshake failed with error WRONG_VERSION_NUMBER").encode()
    out, reports = run_relay(long + b"\nend\n")
    assert out == long + b"\nend\n"
    assert reports == b""


def test_reports_nobody_reads_never_block_the_stderr_they_come_with():
    flood = (MEASURED["no-certificate"] + "\n") * 20_000  # ~3 MB of reports, far over a pipe
    out, _ = run_relay((flood + "still here\n").encode(), read_reports=False)
    assert out == b"still here\n"


@pytest.mark.parametrize(("value", "hidden"), [(None, False), ("INFO", False), ("debug", False),
                                               ("ERROR", True), ("none", True)])
def test_a_verbosity_that_hides_the_lines_is_recognised(value, hidden):
    env = {} if value is None else {"GRPC_VERBOSITY": value}
    assert verbosity_hides_failures(env) is hidden
