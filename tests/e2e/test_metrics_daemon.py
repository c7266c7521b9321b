"""The ``/metrics`` server of a real daemon (``dacflnode start`` in a child process, on
127.0.0.1). 1 100 slow connections under ``ulimit -n 1024``, the limit at which
prometheus-client's threaded server died ("Too many open files" after 1 008 connections): the
daemon lives, its descriptors and threads stay bounded, a scrape and ``dacflnode status`` answer
while the connections are held, and the head deadline closes the rest. The daemon and the
attack are those of ``benchmarks/attacks.py`` (its ``metrics`` scenario reports the same
figures). A token file that cannot be used stops the start with one line naming
``node.metrics_token_file``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dacflnode.cluster.launcher import free_ports
from dacflnode.daemon.metrics_http import HEAD_TIMEOUT_S, MAX_CONNECTIONS
from tests.e2e.test_daemon_startup import peers, start
from tests.harness.cluster import assert_one_line_failure

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import attacks  # type: ignore[import-not-found]

pytestmark = pytest.mark.slow

SLOW = 1100


def test_1100_slow_metrics_connections_leave_the_daemon_alive_and_answering(tmp_path):
    target = attacks.Target(tmp_path, state_mib=0.01, fd_limit=1024, metrics_port=True)
    target.start()
    try:
        # the hard limit is 1024: nothing to raise, the server's cap is what holds
        assert attacks.open_files_limit(target.pid) == (1024, 1024)
        r = attacks.slow_metrics(target, SLOW, hold=1.0, wait_closed=HEAD_TIMEOUT_S + 10)
        assert r["alive"] and r["connect_failed"] == 0, r
        assert r["scrape_while_held"] == 200 and r["status_answers_while_held"], r
        assert r["kept_open"] <= MAX_CONNECTIONS, r
        # at most the served connections, and the one being accepted
        bound = r["daemon_fds_before"] + MAX_CONNECTIONS + 8
        assert r["daemon_fds_max"] <= bound, r
        assert r["daemon_threads_max"] <= r["daemon_threads_before"] + 2, r
        assert r["rss_growth"] < 32 << 20, r
        # the ones that held a slot were closed by the head deadline, not by the test
        assert r["all_closed_after_s"] is not None, r
        assert "Too many open files" not in target.log_path.read_text()
        assert attacks.scrape(target.metrics)[0] == 200
    finally:
        assert target.stop() == 0


@pytest.mark.parametrize(("content", "mode", "said"), [
    (None, 0o600, "No such file"),
    ("k" * 24, 0o644, "chmod 600"),
    ("short", 0o600, "at least 16"),
])
def test_a_metrics_token_file_that_cannot_be_used_is_one_line_exit_2(tmp_path, content, mode,
                                                                     said):
    token = tmp_path / "metrics.token"
    if content is not None:
        token.write_text(content + "\n")
        token.chmod(mode)
    path = peers(tmp_path, metrics=f"127.0.0.1:{free_ports(1)[0]}",
                 metrics_token_file=str(token))
    run, _ = start(path)
    assert_one_line_failure(run, path, "node.metrics_token_file", str(token), said)
    assert "short" not in run.stderr
