"""Every benchmark script takes ``--quick`` and ``--json``; ``emit_result`` prints one result."""

import json
import runpy
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import _common  # type: ignore[import-not-found]  # noqa: E402

pytestmark = pytest.mark.slow

# benchmarks/_*.py are modules the scripts share, not scripts
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))


def test_the_benchmarks_folder_holds_the_scripts():
    names = {p.name for p in SCRIPTS}
    assert {"bench_scale.py", "bench_round_overhead.py", "bench_training.py"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_lists_quick_and_json_in_its_help(script, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_.value.code in (0, None)
    out = capsys.readouterr().out
    assert "--quick" in out
    assert "--json" in out


@pytest.mark.parametrize(("ratio", "target", "higher", "met"), [
    (1.2, 1.0, True, True), (0.8, 1.0, True, False),
    (1.04, 1.05, False, True), (1.2, 1.05, False, False),
])
def test_emit_result_prints_one_json_object_last(capsys, ratio, target, higher, met):
    print("a table line before the result")
    returned = _common.emit_result("demo", ratio, target, higher, as_json=True, rows=[1, 2])
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert result == returned
    assert result["name"] == "demo"
    assert result["ratio"] == pytest.approx(ratio)
    assert result["target"] == target
    assert result["higher_is_better"] is higher
    assert result["met"] is met
    assert len(result["machine"]["loadavg"]) == 3
    assert result["rows"] == [1, 2]


def test_emit_result_without_json_prints_a_verdict_not_json(capsys):
    _common.emit_result("demo", 0.4, 0.5, True, as_json=False)
    out = capsys.readouterr().out.strip()
    assert "NOT met" in out
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)
