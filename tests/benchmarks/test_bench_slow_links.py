"""``bench_slow_links.py``'s figures from the daemons' metrics lines (the namespaces themselves
need root and minutes: the benchmark is run by hand, benchmarks/README.md)."""

import argparse
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import bench_slow_links as bench  # type: ignore[import-not-found]  # noqa: E402


def write_node(root: Path, node: int, rounds: list[tuple[float, float, int]]) -> None:
    """``rounds``: (seconds, exchange_s, bytes_sent) of rounds 1, 2, ..."""
    folder = root / f"node-{node}"
    folder.mkdir(parents=True)
    with (folder / "metrics.jsonl").open("w") as out:
        for r, (seconds, exchange, sent) in enumerate(rounds, start=1):
            last = r == len(rounds)
            out.write(json.dumps({
                "round": r, "seconds": seconds, "exchange_s": exchange, "train_s": 0.5,
                "bytes_sent": sent, "neighbours_missing": [],
                "accuracy": 0.5 if last else None,
            }) + "\n")


def args_for(rounds: int, nodes: int = 2) -> argparse.Namespace:
    return argparse.Namespace(nodes=nodes, rounds=rounds, rate="10mbit")


def test_round_one_and_the_evaluating_last_round_are_left_out_of_the_medians(tmp_path):
    mb = 1_250_000  # one second at 10 Mbit/s
    write_node(tmp_path, 0, [(60.0, 50.0, mb), (20.0, 18.0, mb), (22.0, 19.0, mb), (90.0, 9.0, mb)])
    write_node(tmp_path, 1, [(61.0, 51.0, mb), (24.0, 17.0, mb), (26.0, 20.0, mb), (95.0, 9.0, mb)])
    row = bench.summarize(args_for(4), "none", tmp_path, wall=300.0, tx=[4 * mb, 4 * mb])
    assert row["round_s"] == pytest.approx(23.0)  # median of 20, 22, 24, 26
    assert row["exchange_s"] == pytest.approx(18.5)
    assert row["bytes_sent_per_round"] == mb
    assert row["wire_s"] == pytest.approx(1.0)
    assert row["last_round_s"] == pytest.approx(92.5)
    assert row["link_bytes_per_payload_byte"] == pytest.approx(1.0)
    assert row["accuracy"] == pytest.approx(0.5)


def test_two_rounds_measure_round_two():
    assert bench.measured_last(2) == 2
    assert bench.measured_last(3) == 2
    assert bench.measured_last(6) == 5


def test_a_node_that_mixed_without_a_neighbour_fails_the_run_with_what_to_change(tmp_path):
    write_node(tmp_path, 0, [(1.0, 1.0, 10), (1.0, 1.0, 10), (1.0, 1.0, 10)])
    path = tmp_path / "node-0" / "metrics.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    lines[1]["neighbours_missing"] = ["node-1"]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(RuntimeError, match="--round-deadline"):
        bench.summarize(args_for(3, nodes=1), "int8", tmp_path, wall=10.0, tx=[30])


def test_a_node_that_stopped_early_fails_the_run(tmp_path):
    write_node(tmp_path, 0, [(1.0, 1.0, 10)])
    with pytest.raises(RuntimeError, match=r"not 1\.\.3"):
        bench.summarize(args_for(3, nodes=1), "int8", tmp_path, wall=10.0, tx=[10])


@pytest.mark.parametrize(("text", "bits"), [("10mbit", 1e7), ("500kbit", 5e5), ("1gbit", 1e9)])
def test_link_rates_read_as_tc_writes_them(text, bits):
    assert bench.rate_bits(text) == bits


def test_a_rate_without_a_unit_is_refused_with_an_example():
    with pytest.raises(argparse.ArgumentTypeError, match="10mbit"):
        bench.rate_bits("10")


def test_the_baseline_must_come_first(capsys):
    with pytest.raises(SystemExit):
        bench.parse(["--compressors", "int8,none"])
    assert "none" in capsys.readouterr().err
