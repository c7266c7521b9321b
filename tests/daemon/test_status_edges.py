"""``dacflnode status``'s view at the edges of what it shows: nothing is cut at 80 columns, and
a piped one is as wide as its content. The edges of a run (a watched node that finishes, a
stopped neighbour, no daemon at all) on real processes: tests/e2e/test_status_daemon.py."""

from __future__ import annotations

import io

from rich.console import Console

from dacflnode.cli.daemon_cmds import _status_view

LONG = "node-1.dacflnode-peers.federated-learning.svc.cluster.local:7000"


def status_data() -> dict[str, object]:
    nb = {"node_id": "node-1-with-a-long-name", "address": LONG, "connected": True,
          "state": "active", "last_round_received": 3, "bytes_received": 12_000_000,
          "bytes_sent": 12_000_000, "latency_ms": 3.5, "missed_rounds": 2, "late_states": 1,
          "refused": 0, "corrections": 1, "refused_states": 0}
    return {"node_id": "node-0", "algorithm": "dacfl", "round": 3, "rounds_total": 20,
            "phase": "training", "neighbours": [nb], "last_accuracy": 0.5, "last_loss": 1.0,
            "consensus_residual": 0.1, "device": "cpu", "uptime_s": 10.0}


def test_addresses_ids_and_titles_are_never_cut_on_an_80_column_terminal():
    out = io.StringIO()
    Console(file=out, width=80).print(_status_view(status_data()))
    text = out.getvalue()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    # each cell folded onto several lines, whole: read the first table's columns back
    neighbours = text.split("faults per neighbour")[0]
    first = [line.split("│") for line in neighbours.splitlines() if line.startswith("│")]
    assert "".join(cells[1].strip() for cells in first) == "node-1-with-a-long-name"
    assert "".join(cells[2].strip() for cells in first) == LONG


def test_piped_status_is_as_wide_as_its_content(monkeypatch):
    from dacflnode.cli import daemon_cmds

    out = io.StringIO()
    console = daemon_cmds._status_console()
    console.file = out
    console.print(_status_view(status_data()))
    lines = out.getvalue().splitlines()
    assert any(LONG in line and "last round" not in line for line in lines)
    header = next(line for line in lines if "address" in line and "latency" in line)
    assert "last round" in header  # the titles on one line each
