"""The daemon's line per round and its summary line as a real pair of daemons writes them, one
node in text and one in JSON, to its log file and its console. The lines' parts on their own:
tests/daemon/test_round_log.py."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from dacflnode import logs
from dacflnode.cluster.launcher import free_ports
from dacflnode.peers.generate import generate_cluster
from tests.harness.cluster import TINY, run_nodes

pytestmark = pytest.mark.slow

#: more round lines than the log's rate limit lets through of one format string in a window,
#: should the rounds come that fast: none may be dropped (the exemption itself is pinned down by
#: tests/daemon/test_round_log.py)
ROUNDS = logs.RATE_LIMIT_COUNT + 2
TEXT_ROUND = re.compile(
    rf" INFO dacflnode\.daemon\.round_log: node-0: round (\d+)/{ROUNDS}: (accuracy [0-9.]+, loss "
    r"[0-9.]+|not evaluated); exchange [0-9.]+s, train [0-9.]+s; neighbours used 1 "
    r"\(node-1\), missing 0, late 0; sent \d+(\.\d)? k?M?B, received \d+(\.\d)? k?M?B$")


def test_a_pair_logs_one_line_per_round_in_text_and_json_none_rate_limited(tmp_path):
    ports = free_ports(4)
    cfg = replace(TINY, nodes=2, rounds=ROUNDS, eval_every=2)
    paths = generate_cluster("complete", 2, cfg, tmp_path / "peers", ports=ports[:2],
                             control_ports=ports[2:], state_root=tmp_path, round_deadline=30,
                             hello_timeout=60)
    codes, outputs = run_nodes(paths, tmp_path, timeout=300,
                               args=([], ["--log-format", "json"]))
    assert codes == [0, 0], outputs

    text = (tmp_path / "node-0" / "daemon.log").read_text().splitlines()
    rounds = [m for m in map(TEXT_ROUND.search, text) if m]
    assert [int(m[1]) for m in rounds] == list(range(1, ROUNDS + 1)), text
    assert all(m[2].startswith("accuracy") == (int(m[1]) % 2 == 0) for m in rounds)
    assert len([x for x in text if ": round " in x]) == ROUNDS  # no other line looks like one
    (summary,) = [x for x in text if f"node-0: finished {ROUNDS}/{ROUNDS} rounds in " in x]
    assert re.search(r"; final accuracy 0\.\d{4}; sent \S+ \S+, received \S+ \S+$", summary)

    lines = [json.loads(x) for x in
             (tmp_path / "node-1" / "daemon.log").read_text().splitlines()]
    per_round = [x for x in lines if x["event"] == "round"]
    assert [x["round"] for x in per_round] == list(range(1, ROUNDS + 1))
    for x in per_round:
        assert list(x)[: len(logs.JSON_KEYS)] == list(logs.JSON_KEYS)
        assert x["node"] == "node-1" and x["rounds"] == ROUNDS
        assert x["message"].startswith(f"round {x['round']}/{ROUNDS}: ")  # the node is a field
        assert x["used"] == ["node-0"] and x["missing"] == [] and x["late"] == []
        assert x["exchange_s"] >= 0 and x["train_s"] > 0
        assert x["bytes_sent"] > 0  # its model, to node-0
        evaluated = x["round"] % 2 == 0
        assert (x.get("accuracy") is not None, x.get("loss") is not None) == (evaluated,) * 2
    (end,) = [x for x in lines if x["event"] == "summary"]
    assert (end["round"], end["rounds"]) == (ROUNDS, ROUNDS)
    assert end["accuracy"] == per_round[-1]["accuracy"] and end["seconds"] > 0
    # each round counts the bytes moved for it, and the summary adds the rounds up
    assert end["bytes_received"] == sum(x["bytes_received"] for x in per_round) > 0
    assert end["bytes_sent"] == sum(x["bytes_sent"] for x in per_round)
    assert not any(x["message"].startswith("node-1: ") for x in lines)
    # the console carries the same lines
    assert [json.loads(x) for x in outputs[1].splitlines()] == lines
