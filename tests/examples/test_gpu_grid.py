"""examples/reproduce_paper/gpu_grid.py: the job order, the deadline, and what a stopped job
keeps (no training: fake processes on a fake clock, metrics files written by hand)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from dacflnode.records.metrics_log import MetricsLine, append_line
from tests.learning.test_datasets import write_idx_dataset

FOLDER = Path(__file__).resolve().parents[2] / "examples" / "reproduce_paper"


def _load(name: str) -> ModuleType:
    if str(FOLDER) not in sys.path:
        sys.path.insert(0, str(FOLDER))
    spec = importlib.util.spec_from_file_location(name, FOLDER / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


grid = _load("gpu_grid")
reproduce = _load("reproduce")


# ------------------------------------------------------------------------------ job order


def test_static_dense_iid_comes_first_then_its_bf16_then_dacfl_cdsgd_then_the_rest():
    jobs = grid.job_order(reproduce.settings(), paper=reproduce.PAPER)
    names = [j.name for j in jobs]
    assert names[:6] == [
        "static-dense-iid/dacfl/fp32",
        "static-dense-iid/cdsgd/fp32",
        "static-dense-iid/dpsgd/fp32",
        "static-dense-iid/fedavg/fp32",
        "static-dense-iid/dacfl/bf16",
        "static-dense-iid/cdsgd/bf16",
    ]
    primary, secondary = jobs[6:20], jobs[20:]
    assert {j.algorithm for j in primary} == {"dacfl", "cdsgd"}
    assert {j.algorithm for j in secondary} == {"dpsgd", "fedavg"}
    assert all(j.precision == "fp32" for j in jobs[6:])
    assert len({j.setting for j in primary}) == 7 and len(secondary) == 14
    # the settings the paper gives most figures for (3 each) come first
    assert {primary[0].setting, primary[2].setting} == {"static-sparse-iid", "varying-dense-iid"}
    assert primary[4].setting == "static-dense-shards"
    assert len(set(names)) == len(names) == 34


def test_one_precision_runs_the_grid_without_a_comparison():
    jobs = grid.job_order(reproduce.settings(), precisions=["fp32"], paper=reproduce.PAPER)
    assert len(jobs) == 32 and {j.precision for j in jobs} == {"fp32"}


def test_the_job_settings_are_reproduce_py_s():
    jobs = grid.job_order(reproduce.settings(), paper=reproduce.PAPER)
    settings = dict(reproduce.settings())
    assert all(j.extra == settings[j.setting] for j in jobs)


# ------------------------------------------------------------------------------ scheduler


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, dt: float) -> None:
        self.t += dt


class FakeProcess:
    """Exits with ``rc`` after ``runtime`` seconds; on terminate, exits unless ``stubborn``."""

    def __init__(self, clock: Clock, runtime: float, rc: int = 0, stubborn: bool = False):
        self.clock, self.end, self.rc, self.stubborn = clock, clock.t + runtime, rc, stubborn
        self.terminated = self.killed = False

    def poll(self) -> int | None:
        if self.killed:
            return -9
        if self.terminated and not self.stubborn:
            return -15
        return self.rc if self.clock.t >= self.end else None

    def terminate(self) -> None:
        self.terminated = True

    def kill(self) -> None:
        self.killed = True


def _jobs(n: int) -> list[Any]:
    return [grid.Job(f"s{i}", {}, "dacfl", "fp32") for i in range(n)]


def _scheduler(clock: Clock, states: list[Any], runtimes: dict[str, float], **kw: Any) -> Any:
    started: list[str] = []
    peak = [0]
    procs: dict[str, FakeProcess] = {}

    def launch(job: Any) -> FakeProcess:
        started.append(job.setting)
        running = sum(1 for s in states if s.status == "running") + 1
        peak[0] = max(peak[0], running)
        proc = FakeProcess(clock, runtimes.get(job.setting, 10.0),
                           rc=1 if job.setting == "bad" else 0,
                           stubborn=job.setting == "stubborn")
        procs[job.setting] = proc
        return proc

    sched = grid.Scheduler(states, launch, clock=clock, sleep=clock.sleep, log=lambda _m: None,
                           poll=1.0, **kw)
    sched.started, sched.peak, sched.procs = started, peak, procs
    return sched


def test_jobs_start_in_order_never_more_than_parallel_at_once():
    clock = Clock()
    states = [grid.JobState(j) for j in _jobs(7)]
    sched = _scheduler(clock, states, {"s0": 30, "s1": 5, "s2": 5}, parallel=3, stop_at=1000)
    sched.run()
    assert sched.started == [f"s{i}" for i in range(7)]
    assert sched.peak[0] == 3
    assert [s.status for s in states] == ["done"] * 7
    assert states[0].wall_s == pytest.approx(30, abs=1.0)
    assert states[3].started == pytest.approx(5, abs=1.0)  # took s1's slot when it ended


def test_the_deadline_stops_running_jobs_kills_stubborn_ones_and_leaves_the_rest_unrun():
    clock = Clock()
    jobs = _jobs(4)
    jobs[1] = grid.Job("stubborn", {}, "cdsgd", "fp32")
    states = [grid.JobState(j) for j in jobs]
    sched = _scheduler(clock, states, {"s0": 500, "stubborn": 500}, parallel=2, stop_at=60,
                       grace=5.0)
    sched.run()
    assert [s.status for s in states] == ["stopped", "stopped", "not-run", "not-run"]
    assert sched.procs["s0"].terminated and not sched.procs["s0"].killed
    assert sched.procs["stubborn"].terminated and sched.procs["stubborn"].killed
    assert 60 <= clock.t <= 60 + 5 + 2  # the grace period, not more
    assert all(s.wall_s is not None and s.wall_s >= 59 for s in states[:2])


def test_no_job_starts_too_close_to_the_deadline():
    clock = Clock()
    states = [grid.JobState(j) for j in _jobs(3)]
    sched = _scheduler(clock, states, {"s0": 50, "s1": 80}, parallel=1, stop_at=100,
                       min_start=45)
    sched.run()
    # s1 would start at 50 with 50 s left (>= 45); s2 at 130 is past the stop
    assert [s.status for s in states] == ["done", "stopped", "not-run"]
    assert sched.started == ["s0", "s1"]


def test_a_failing_job_is_reported_and_the_grid_goes_on():
    clock = Clock()
    jobs = [grid.Job("bad", {}, "dacfl", "fp32"), *_jobs(1)]
    states = [grid.JobState(j) for j in jobs]
    ended: list[str] = []
    sched = _scheduler(clock, states, {"bad": 2}, parallel=1, stop_at=100,
                       on_end=lambda s: ended.append(s.status))
    sched.run()
    assert [s.status for s in states] == ["failed", "done"]
    assert states[0].reason == "exit code 1" and ended == ["failed", "done"]


def test_a_failed_batched_job_runs_next_on_the_sequential_engine_once():
    clock = Clock()
    jobs = [grid.Job("bad", {}, "dacfl", "bf16"), *_jobs(1)]
    states = [grid.JobState(j) for j in jobs]
    sched = _scheduler(clock, states, {"bad": 2}, parallel=1, stop_at=100,
                       retry=grid.Job.fallback)
    sched.run()
    assert [s.job.name for s in sched.states] == [
        "bad/dacfl/bf16", "s0/dacfl/fp32", "bad/dacfl/bf16/sequential"]
    assert [s.status for s in sched.states] == ["failed", "done", "failed"]
    assert sched.started == ["bad", "bad", "s0"]  # the retry went before the pending job
    assert sched.states[2].job.folder == "bad/dacfl-bf16-sequential"


def test_skipped_jobs_are_not_started():
    clock = Clock()
    states = [grid.JobState(j) for j in _jobs(2)]
    states[0].status = "skipped"
    sched = _scheduler(clock, states, {}, parallel=2, stop_at=100)
    sched.run()
    assert sched.started == ["s1"] and states[0].status == "skipped"


# ------------------------------------------------------------------------------ results


def _line(rnd: int, node: str, acc: float | None) -> MetricsLine:
    values: dict[str, Any] = {
        "round": rnd, "node": node, "algorithm": "dacfl", "lr": 0.001, "train_loss": 0.5,
        "samples": 100, "accuracy": acc, "test_loss": 0.4, "consensus_residual": 0.1,
        "neighbours_used": 9, "neighbours_missing": 0, "alone_rounds": 0,
        "refused_states": 0, "bytes_sent": 0, "bytes_received": 0, "exchange_s": 0.0,
        "train_s": 1.0, "seconds": 1.0, "data_size": 6000, "class_counts": {"0": 6000},
        "time": 1_800_000_000.0 + rnd}
    return MetricsLine(**values)


def _write_nodes(folder: Path, rounds: dict[str, int]) -> None:
    for node, n in rounds.items():
        (folder / node).mkdir(parents=True)
        for r in range(1, n + 1):
            append_line(folder / node / "metrics.jsonl", _line(r, node, 0.5 + 0.01 * r))


def _stopped(wall: float = 100.0) -> Any:
    state = grid.JobState(grid.Job("static-dense-iid", {}, "dacfl", "fp32"), status="stopped")
    state.started, state.ended = 0.0, wall
    return state


def test_a_stopped_job_keeps_the_rounds_every_node_completed(tmp_path):
    _write_nodes(tmp_path, {"node-0": 4, "node-1": 3, "node-2": 4})
    with (tmp_path / "node-1" / "metrics.jsonl").open("a") as f:
        f.write('{"round": 4, "node": "node-1", "acc')  # the line being written when killed
    res = grid.collect(_stopped(), tmp_path, rounds=100)
    assert res["status"] == "partial" and res["rounds_done"] == 3
    assert res["avg_acc"] == pytest.approx(0.53)
    assert res["rounds"] == [1, 2, 3] and res["wall_s"] == 100.0
    assert (tmp_path / "summary.partial.json").exists()


def test_a_job_stopped_before_its_first_round_has_no_result(tmp_path):
    (tmp_path / "node-0").mkdir()
    res = grid.collect(_stopped(), tmp_path, rounds=100)
    assert res["status"] == "stopped" and res["rounds_done"] == 0 and res["avg_acc"] is None


def test_a_job_that_exits_0_without_a_summary_failed(tmp_path):
    state = _stopped()
    state.status = "done"
    res = grid.collect(state, tmp_path, rounds=100)
    assert res["status"] == "failed" and "summary" in res["reason"]


def _result(precision: str, rounds: list[int], accs: list[float], status: str = "done",
            setting: str = "static-dense-iid") -> dict[str, Any]:
    return {"setting": setting, "algorithm": "dacfl", "precision": precision, "status": status,
            "reason": "", "rounds_total": 100, "rounds_done": rounds[-1], "wall_s": 50.0,
            "sim_wall_s": 40.0 if status == "done" else None, "avg_acc": accs[-1],
            "var_acc": 1e-5, "rounds": rounds, "avg_acc_curve": accs,
            "var_acc_curve": [1e-5] * len(accs)}


def test_bf16_is_compared_with_fp32_at_the_last_round_both_reached():
    fp32 = _result("fp32", [1, 2, 3, 4], [0.5, 0.6, 0.7, 0.8])
    bf16 = _result("bf16", [1, 2, 3], [0.5, 0.6, 0.694], status="partial")
    (row,) = grid.bf16_table([fp32, bf16])
    assert row["round"] == 3
    assert row["diff_points"] == pytest.approx(-0.6)
    assert row["within_bound"] is False
    assert row["base_s_per_round"] == pytest.approx(10.0)  # 40 s over 4 rounds
    assert row["s_per_round"] == pytest.approx(50.0 / 3)  # stopped: the process's wall time


def test_results_files_hold_every_job_the_paper_and_the_precision_table(tmp_path):
    results = [
        _result("fp32", [1, 2], [0.80, 0.86]),
        _result("bf16", [1, 2], [0.80, 0.858], status="partial"),
    ]
    text = grid.write_results(tmp_path, results, {("static-dense-iid", "dacfl"): 86},
                              {"gpu": "test GPU", "summary": "two jobs"})
    assert "| static-dense-iid | dacfl | bf16 | partial | 2/100 | 85.80 % |" in text
    assert "| 86 % |" in text
    assert "| static-dense-iid | dacfl | 2 | 86.00 % | 85.80 % | bf16 | -0.20 | yes |" in text
    data = json.loads((tmp_path / "results.json").read_text())
    assert len(data["jobs"]) == 2 and data["bf16_vs_fp32"][0]["round"] == 2
    assert data["meta"]["gpu"] == "test GPU"


# ------------------------------------------------------------------------------ end to end


@pytest.mark.slow  # runs the script: a real 2-round simulation in a child process
def test_quick_cpu_run_writes_the_results_and_the_archive(tmp_path):
    write_idx_dataset(tmp_path / "data", compress=True, n_train=200, n_test=40)
    out, work = tmp_path / "out", tmp_path / "work"
    cmd = [sys.executable, str(FOLDER / "gpu_grid.py"), "--quick", "--device", "cpu",
           "--parallel", "1", "--only", "static-dense-iid", "--algorithms", "dacfl",
           "--precision", "fp32", "--local-steps", "1", "--eval-samples", "20",
           "--data-root", str(tmp_path / "data"), "--out", str(out), "--work", str(work)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "start static-dense-iid/dacfl/fp32" in run.stdout
    data = json.loads((out / "results.json").read_text())
    (job,) = data["jobs"]
    assert (job["status"], job["rounds_done"], job["rounds"]) == ("done", 2, [1, 2])
    assert 0.0 <= job["avg_acc"] <= 1.0 and job["paper"] == 86
    with tarfile.open(out / grid.ARCHIVE) as tar:
        names = set(tar.getnames())
    assert {"gpu_grid/results.md", "gpu_grid/gpu_grid.log", "gpu_grid/plots/static-dense-iid.png",
            "gpu_grid/jobs/static-dense-iid/dacfl-fp32/summary.json",
            "gpu_grid/jobs/static-dense-iid/dacfl-fp32/node-0/metrics.jsonl"} <= names
    assert not any(n.endswith(".safetensors") for n in names)


def test_the_grid_estimate_spreads_the_measured_rounds_over_the_parallel_jobs():
    done = _result("fp32", [1, 2, 3, 4], [0.5] * 4)  # 40 s / 4 rounds
    partial = _result("bf16", [1, 2], [0.5] * 2, status="partial")  # 50 s / 2 rounds
    est = grid.grid_estimate([done, partial], jobs=34, rounds=100, parallel=6)
    assert est["s_per_round"] == pytest.approx(17.5)
    assert est["grid_min"] == pytest.approx(34 * 100 * 17.5 / 6 / 60)
    assert grid.grid_estimate([], jobs=34, rounds=100, parallel=6) is None
