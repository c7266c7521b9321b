#!/usr/bin/env python3
"""Run as much of the paper's Fashion-MNIST grid as fits in a time budget, on one GPU.

The grid is ``reproduce.py``'s (its settings, its paper figures); each job is one setting × one
algorithm × one precision, run by ``run_experiment`` with the batched engine in a subprocess of
its own, so that ``--parallel`` jobs share the one GPU. Jobs start in order of importance:

1. static-dense-iid × {DACFL, CDSGD, D-PSGD, FedAvg} at the first ``--precision`` (fp32);
2. static-dense-iid × {DACFL, CDSGD} at the other precisions (the bf16-vs-fp32 table);
3. DACFL and CDSGD on the other 7 settings (those the paper gives figures for first);
4. D-PSGD and FedAvg on them.

At ``--deadline`` seconds (minus ``--reserve`` for the report) the running jobs are stopped;
every round a stopped job completed is kept (its nodes write one ``metrics.jsonl`` line per
round) and the job is reported as partial, with its last round. The output folder then holds:

* ``results.md`` — per setting × algorithm × precision the final Average and Var of Acc, the
  rounds done, the wall time and the paper's figure; the bf16-vs-fp32 table;
* ``results.json`` — the same with the per-round curves;
* ``static-dense-iid.png`` — that setting's Average/Var-of-Acc plot;
* ``gpu_grid.tar.gz`` — all of these, the accuracy plot of each setting, the log (GPU, PyTorch,
  per-job wall times) and each job's summary, log and ``metrics.jsonl`` files.

The model files (``final.safetensors``) stay in ``--work``. When ``import cryptography`` fails
(the simulator imports it; a bare GPU machine may lack it), the wheels in ``--wheels`` (default
``.whl/``) are unpacked into a temporary folder first.

Examples:
    # on the GPU machine: 8 minutes, 6 jobs at once
    PYTHONPATH=. PYTHONUNBUFFERED=1 python3 examples/reproduce_paper/gpu_grid.py \\
        --data-root .fmnist --out "$OUT" --deadline 480
    # a CPU smoke test of the whole pipeline (2 rounds of 3 steps, the first 8 jobs)
    python examples/reproduce_paper/gpu_grid.py --quick --device cpu --parallel 2 --out runs/gq
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
FIRST_SETTING = "static-dense-iid"
PRIMARY_ALGORITHMS = ("dacfl", "cdsgd")
ALL_ALGORITHMS = ("dacfl", "cdsgd", "dpsgd", "fedavg")
PRECISIONS = ("fp32", "bf16")
ARCHIVE = "gpu_grid.tar.gz"
ARCHIVE_LIMIT = 15 * 2**20
#: the accuracy bound of the bf16-vs-fp32 table (percentage points)
BF16_BOUND_POINTS = 0.5


# ------------------------------------------------------------------------------ the jobs


@dataclass(frozen=True)
class Job:
    """One setting × one algorithm × one precision."""

    setting: str
    extra: dict[str, Any]
    algorithm: str
    precision: str
    engine: str = "batched"

    @property
    def name(self) -> str:
        tail = "" if self.engine == "batched" else f"/{self.engine}"
        return f"{self.setting}/{self.algorithm}/{self.precision}{tail}"

    @property
    def folder(self) -> str:
        tail = "" if self.engine == "batched" else f"-{self.engine}"
        return f"{self.setting}/{self.algorithm}-{self.precision}{tail}"

    def fallback(self) -> Job | None:
        """The same job on the sequential engine, once: for a batched job that failed."""
        return dataclasses.replace(self, engine="sequential") if self.engine == "batched" else None


def job_order(
    settings: Sequence[tuple[str, dict[str, Any]]],
    algorithms: Sequence[str] = ALL_ALGORITHMS,
    precisions: Sequence[str] = ("fp32", "bf16"),
    *,
    paper: Iterable[tuple[str, str]] = (),
    first: str = FIRST_SETTING,
    primary: Sequence[str] = PRIMARY_ALGORITHMS,
) -> list[Job]:
    """Every job, most important first (see the module's docstring).

    ``precisions[0]`` is the grid's precision; the others run only on ``first`` with the
    ``primary`` algorithms. The other settings come in order of how many figures the paper
    gives for them (``paper``: its ``(setting, algorithm)`` keys), ties in ``settings`` order.
    """
    if not precisions:
        raise ValueError("name at least one precision")
    by_name = dict(settings)
    main, others = precisions[0], list(precisions[1:])
    primary_algs = [a for a in algorithms if a in primary]
    secondary_algs = [a for a in algorithms if a not in primary]
    figures = [s for s, _ in paper]
    rest = sorted((s for s, _ in settings if s != first), key=lambda s: -figures.count(s))
    jobs: list[Job] = []
    if first in by_name:
        jobs += [Job(first, by_name[first], a, main) for a in algorithms]
        jobs += [Job(first, by_name[first], a, p) for p in others for a in primary_algs]
    jobs += [Job(s, by_name[s], a, main) for s in rest for a in primary_algs]
    jobs += [Job(s, by_name[s], a, main) for s in rest for a in secondary_algs]
    return jobs


# ------------------------------------------------------------------------------ scheduling


class Handle(Protocol):
    """What the scheduler needs of a started job (a :class:`subprocess.Popen` is one)."""

    def poll(self) -> int | None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


@dataclass
class JobState:
    job: Job
    #: pending, running, done (exit 0), failed (other exit), stopped (at the deadline),
    #: not-run (no time left), skipped (its configuration is not valid here)
    status: str = "pending"
    reason: str = ""
    started: float | None = None
    ended: float | None = None
    rc: int | None = None
    handle: Handle | None = None

    @property
    def wall_s(self) -> float | None:
        if self.started is None or self.ended is None:
            return None
        return self.ended - self.started


class Scheduler:
    """Run ``jobs`` through ``launch``, at most ``parallel`` at a time, until ``stop_at``.

    No job is started later than ``min_start`` seconds before ``stop_at`` (its start-up would
    eat its time). At ``stop_at`` every running job is terminated, killed if still alive after
    ``grace`` seconds, and marked ``stopped``; the jobs never started are ``not-run``.
    ``tick`` is called about every ``tick_every`` seconds with the running states, ``on_end``
    with each job that exited by itself. A job that failed is followed, next, by the job
    ``retry`` makes of it (if any), appended to the states.
    """

    def __init__(
        self,
        states: Sequence[JobState],
        launch: Callable[[Job], Handle],
        *,
        parallel: int,
        stop_at: float,
        min_start: float = 0.0,
        grace: float = 5.0,
        poll: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        log: Callable[[str], None] = print,
        tick: Callable[[list[JobState]], None] | None = None,
        tick_every: float = 30.0,
        on_end: Callable[[JobState], None] | None = None,
        retry: Callable[[Job], Job | None] | None = None,
    ) -> None:
        if parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {parallel}")
        self.states = list(states)
        self.launch = launch
        self.parallel = parallel
        self.stop_at = stop_at
        self.min_start = min_start
        self.grace = grace
        self.poll = poll
        self.clock = clock
        self.sleep = sleep
        self.log = log
        self.tick = tick
        self.tick_every = tick_every
        self.on_end = on_end
        self.retry = retry
        self._pending: list[JobState] = []

    def running(self) -> list[JobState]:
        return [s for s in self.states if s.status == "running"]

    def run(self) -> list[JobState]:
        pending = self._pending = [s for s in self.states if s.status == "pending"]
        last_tick = self.clock()
        while True:
            now = self.clock()
            self._reap(now)
            if now >= self.stop_at:
                self.stop_all()
                break
            while pending and len(self.running()) < self.parallel:
                if self.stop_at - now < self.min_start:
                    break
                self._start(pending.pop(0), now)
            if not self.running() and (not pending or self.stop_at - now < self.min_start):
                break
            if self.tick is not None and now - last_tick >= self.tick_every:
                last_tick = now
                self.tick(self.running())
            self.sleep(self.poll)
        for s in pending:
            s.status = "not-run"
            s.reason = "no time left"
        return self.states

    def _start(self, state: JobState, now: float) -> None:
        try:
            state.handle = self.launch(state.job)
        except Exception as exc:  # a job that cannot even start must not stop the grid
            state.status, state.reason = "failed", f"could not start: {exc}"
            self.log(f"FAILED to start {state.job.name}: {exc}")
            return
        state.status, state.started = "running", now
        self.log(f"start {state.job.name}")

    def _reap(self, now: float) -> None:
        for s in self.running():
            assert s.handle is not None
            rc = s.handle.poll()
            if rc is None:
                continue
            s.rc, s.ended = rc, now
            s.status = "done" if rc == 0 else "failed"
            if rc != 0:
                s.reason = f"exit code {rc}"
            self.log(f"end {s.job.name}: {s.status} after {now - (s.started or now):.0f} s")
            if self.on_end is not None:
                self.on_end(s)
            again = self.retry(s.job) if self.retry is not None and rc != 0 else None
            if again is not None:
                follow = JobState(again)
                self.states.append(follow)
                self._pending.insert(0, follow)
                self.log(f"retry {s.job.name} as {again.name}")

    def stop_all(self) -> None:
        running = self.running()
        for s in running:
            assert s.handle is not None
            with contextlib.suppress(ProcessLookupError):
                s.handle.terminate()
        until = self.clock() + self.grace
        alive = list(running)
        while alive and self.clock() < until:
            alive = [s for s in alive if s.handle is not None and s.handle.poll() is None]
            if alive:
                self.sleep(min(self.poll, 0.1))
        for s in alive:
            assert s.handle is not None
            with contextlib.suppress(ProcessLookupError):
                s.handle.kill()
        now = self.clock()
        for s in running:
            assert s.handle is not None
            s.rc = s.handle.poll()
            s.ended = now
            s.status = "stopped"
            s.reason = "stopped at the deadline"
            self.log(f"stopped {s.job.name} at the deadline after {now - (s.started or now):.0f} s")


# ------------------------------------------------------------------------------ results


def collect(state: JobState, folder: Path, rounds: int) -> dict[str, Any]:
    """One job's result: its ``summary.json`` when it finished, else the rounds its nodes wrote
    (``partial``: stopped with at least one evaluated round)."""
    from dacflnode.records.metrics_log import summarize

    job = state.job
    out: dict[str, Any] = {
        "setting": job.setting,
        "algorithm": job.algorithm,
        "precision": job.precision,
        "engine": job.engine,
        "status": state.status,
        "reason": state.reason,
        "rounds_total": rounds,
        "wall_s": None if state.wall_s is None else round(state.wall_s, 1),
    }
    summary_file = folder / "summary.json"
    result: dict[str, Any] | None = None
    if state.status == "done" and summary_file.exists():
        result = json.loads(summary_file.read_text())["algorithms"][job.algorithm]
    elif folder.is_dir():
        nodes = sorted(p for p in folder.glob("node-*") if p.is_dir())
        if nodes:
            result = summarize(nodes, job.algorithm, state.wall_s or 0.0, engine=job.engine)
            (folder / "summary.partial.json").write_text(json.dumps(result, indent=2) + "\n")
    if state.status == "done" and result is None:
        out["status"], out["reason"] = "failed", "exited without a summary.json"
    if result is not None:
        final = result["final"]
        out.update(
            rounds_done=final["round"] or 0,
            avg_acc=final["avg_acc"],
            var_acc=final["var_acc"],
            train_loss=final["train_loss"],
            sim_wall_s=result["wall_s"] if state.status == "done" else None,
            samples_per_s=result["samples_per_s"] if state.status == "done" else None,
            rounds=result["rounds"],
            avg_acc_curve=result["avg_acc"],
            var_acc_curve=result["var_acc"],
        )
        if state.status == "stopped":
            out["status"] = "partial" if out["rounds_done"] else "stopped"
    else:
        out["rounds_done"] = 0
    return out


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.2f} %"


def _var(x: float | None) -> str:
    return "—" if x is None else f"{1e4 * x:.2f}"


def _wall(x: float | None) -> str:
    return "—" if x is None else f"{x:.0f} s"


def seconds_per_round(r: dict[str, Any]) -> float | None:
    """Seconds per round of a job: the simulation's own wall time (a finished job) or the
    process's (a stopped one, start-up included), over its rounds."""
    wall = r.get("sim_wall_s") or r.get("wall_s")
    return float(wall) / r["rounds_done"] if wall and r.get("rounds_done") else None


def _per_round(r: dict[str, Any]) -> str:
    x = seconds_per_round(r)
    return "—" if x is None else f"{x:.2f}"


def grid_estimate(
    results: Sequence[dict[str, Any]], jobs: int, rounds: int, parallel: int
) -> dict[str, float] | None:
    """The whole grid's wall time at the mean seconds per round of the jobs that ran (each of
    those ran with up to ``parallel`` jobs beside it)."""
    rates = [x for x in (seconds_per_round(r) for r in results) if x is not None]
    if not rates:
        return None
    mean = sum(rates) / len(rates)
    return {"s_per_round": mean, "grid_min": jobs * rounds * mean / parallel / 60}


def bf16_table(results: Sequence[dict[str, Any]], base: str = "fp32") -> list[dict[str, Any]]:
    """Per setting × algorithm run at ``base`` and another precision: both accuracies at the
    last round both evaluated, the difference in points, and the time per round of each."""
    by_key = {(r["setting"], r["algorithm"], r["precision"]): r for r in results}
    rows = []
    for r in results:
        if r["precision"] == base or not r.get("rounds"):
            continue
        ref = by_key.get((r["setting"], r["algorithm"], base))
        if ref is None or not ref.get("rounds"):
            continue
        common = sorted(set(r["rounds"]) & set(ref["rounds"]))
        if not common:
            continue
        at = common[-1]
        acc = r["avg_acc_curve"][r["rounds"].index(at)]
        ref_acc = ref["avg_acc_curve"][ref["rounds"].index(at)]

        rows.append(
            {
                "setting": r["setting"],
                "algorithm": r["algorithm"],
                "precision": r["precision"],
                "round": at,
                "base_acc": ref_acc,
                "acc": acc,
                "diff_points": 100 * (acc - ref_acc),
                "within_bound": abs(100 * (acc - ref_acc)) <= BF16_BOUND_POINTS,
                "base_s_per_round": seconds_per_round(ref),
                "s_per_round": seconds_per_round(r),
            }
        )
    return rows


def write_results(
    out: Path,
    results: Sequence[dict[str, Any]],
    paper: dict[tuple[str, str], int],
    meta: dict[str, Any],
) -> str:
    """Write ``results.md`` and ``results.json`` into ``out``; return the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    for r in results:
        r["paper"] = paper.get((r["setting"], r["algorithm"]))
    lines = [
        f"# Fashion-MNIST grid on {meta.get('gpu', 'the device')}",
        "",
        f"{meta.get('summary', '')}",
        "",
        "| setting | algorithm | precision | status | rounds | Average of Acc | Var of Acc (%²) "
        "| paper | wall | s/round |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        status = r["status"] + (f" ({r['reason']})" if r["status"] in ("failed", "skipped") else "")
        if r.get("engine", "batched") != "batched":
            status += f", {r['engine']} engine"
        lines.append(
            f"| {r['setting']} | {r['algorithm']} | {r['precision']} | {status} | "
            f"{r['rounds_done']}/{r['rounds_total']} | {_pct(r.get('avg_acc'))} | "
            f"{_var(r.get('var_acc'))} | {'—' if r['paper'] is None else str(r['paper']) + ' %'}"
            f" | {_wall(r.get('wall_s'))} | {_per_round(r)} |"
        )
    table = bf16_table(results)
    lines += ["", "## bf16 against fp32 (same round)", ""]
    if table:
        lines += [
            "| setting | algorithm | round | fp32 | other | precision | difference (points) "
            f"| within {BF16_BOUND_POINTS} pt | s/round fp32 | s/round other |",
            "| --- | --- | ---: | ---: | ---: | --- | ---: | --- | ---: | ---: |",
        ]
        for t in table:
            fmt = "—" if t["base_s_per_round"] is None else f"{t['base_s_per_round']:.2f}"
            oth = "—" if t["s_per_round"] is None else f"{t['s_per_round']:.2f}"
            lines.append(
                f"| {t['setting']} | {t['algorithm']} | {t['round']} | {_pct(t['base_acc'])} | "
                f"{_pct(t['acc'])} | {t['precision']} | {t['diff_points']:+.2f} | "
                f"{'yes' if t['within_bound'] else 'no'} | {fmt} | {oth} |"
            )
    else:
        lines.append("No setting and algorithm ran at both precisions.")
    text = "\n".join(lines) + "\n"
    (out / "results.md").write_text(text)
    payload = {"meta": meta, "jobs": list(results), "bf16_vs_fp32": table}
    (out / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
    return text


def plot_settings(results: Sequence[dict[str, Any]], folder: Path) -> list[Path]:
    """One Average/Var-of-Acc figure per setting that has at least one evaluated round."""
    from dacflnode.sim.plots import plot_accuracy

    folder.mkdir(parents=True, exist_ok=True)
    curves: dict[str, dict[str, Any]] = {}
    for r in results:
        if not r.get("rounds"):
            continue
        label = f"{r['algorithm']} {r['precision']}" + (
            f" (partial, {r['rounds_done']})" if r["status"] == "partial" else ""
        )
        curves.setdefault(r["setting"], {})[label] = {
            "rounds": r["rounds"],
            "avg_acc": r["avg_acc_curve"],
            "var_acc": r["var_acc_curve"],
        }
    paths = []
    for setting, c in curves.items():
        path = folder / f"{setting}.png"
        plot_accuracy(c, path, title=f"FMNIST {setting}")
        paths.append(path)
    return paths


def make_archive(out: Path, members: Sequence[tuple[Path, str]], work: Path) -> Path:
    """``out/gpu_grid.tar.gz`` of ``members`` (path, name in the archive) and each job's
    ``summary*.json``, ``job.log`` and ``metrics.jsonl`` files; without the metrics files when
    the archive would exceed :data:`ARCHIVE_LIMIT`."""
    path = out / ARCHIVE
    for with_metrics in (True, False):
        with tarfile.open(path, "w:gz") as tar:
            for src, name in members:
                if src.exists():
                    tar.add(src, arcname=f"gpu_grid/{name}")
            for f in sorted(work.rglob("*")):
                if not f.is_file():
                    continue
                keep = f.name in ("job.log", "summary.json", "summary.partial.json") or (
                    with_metrics and f.name == "metrics.jsonl"
                )
                if keep:
                    tar.add(f, arcname=f"gpu_grid/jobs/{f.relative_to(work)}")
        if path.stat().st_size <= ARCHIVE_LIMIT:
            break
    return path


# ------------------------------------------------------------------------------ the worker


def build_config(spec: dict[str, Any]) -> Any:
    """The :class:`~dacflnode.config.RunConfig` of one job (raises ``ConfigError``)."""
    from dacflnode.config import RunConfig
    from dacflnode.errors import ConfigError

    names = {f.name for f in dataclasses.fields(RunConfig)}
    extra: dict[str, Any] = {}
    if "precision" in names:
        extra["precision"] = spec["precision"]
    elif spec["precision"] != "fp32":
        raise ConfigError("precision", "this dacflnode has no precision setting (fp32 only)")
    cfg = RunConfig(
        algorithm=(spec["algorithm"],),
        nodes=spec["nodes"],
        rounds=spec["rounds"],
        dataset="fashion-mnist",
        data_root=spec["data_root"],
        lr=spec["lr"],
        eval_every=spec["eval_every"],
        eval_samples=spec["eval_samples"],
        local_steps=spec["local_steps"],
        seed=spec["seed"],
        device=spec["device"],
        threads=spec["threads"],
        engine=spec.get("engine", "batched"),
        **spec["extra"],
        **extra,
    )
    return cfg.validate()


def worker(spec: dict[str, Any]) -> int:
    """Run one job (in its own process); print one line per round."""
    import torch

    from dacflnode.sim.experiment import run_experiment
    from dacflnode.sim.simulator import RoundRecord

    done = [0]

    def on_term(signum: int, _frame: object) -> None:
        print(f"stopped by signal {signum} after round {done[0]}", flush=True)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    if spec["device"].startswith("cuda"):
        torch.backends.cudnn.allow_tf32 = spec["tf32"]
        torch.backends.cuda.matmul.allow_tf32 = spec["tf32"]
    cfg = build_config(spec)
    started = time.perf_counter()
    print(f"job {spec['name']} pid {os.getpid()} device {cfg.device} torch {torch.__version__} "
          f"threads {cfg.threads} tf32 {spec['tf32']}", flush=True)
    last = [started]

    def progress(alg: str, rounds: int, total: int, record: RoundRecord) -> None:
        done[0] = rounds
        now = time.perf_counter()
        acc = "—" if record.avg_acc is None else f"{100 * record.avg_acc:.2f}%"
        print(f"round {rounds}/{total} acc {acc} loss {record.mean_train_loss:.4f} "
              f"{now - last[0]:.2f}s", flush=True)
        last[0] = now

    run_experiment(cfg, spec["folder"], progress)
    peak = ""
    if torch.cuda.is_available() and spec["device"].startswith("cuda"):
        peak = f" peak GPU memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB"
    print(f"finished in {time.perf_counter() - started:.1f}s{peak}", flush=True)
    return 0


# ------------------------------------------------------------------------------ the machine


def bootstrap(wheels: Path) -> str | None:
    """Make ``dacflnode`` and its imports importable: the repository on ``sys.path``, and the
    wheels in ``wheels`` unpacked into a temporary folder if a module they hold is missing (the
    GPU machine lacks ``cryptography``). Returns that folder, which children need too."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    try:
        import cryptography  # noqa: F401
    except ImportError:
        pass
    else:
        return None
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if not found:
        return None
    site = Path(tempfile.mkdtemp(prefix="gpu-grid-site-"))
    for whl in found:
        with zipfile.ZipFile(whl) as z:
            z.extractall(site)
    sys.path.insert(0, str(site))
    return str(site)


def machine_info(device: str) -> tuple[dict[str, Any], str]:
    """A summary of the GPU and PyTorch, and the log text (``nvidia-smi`` and more)."""
    import torch

    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpus": os.cpu_count(),
        "device": device,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            capability=f"{props.major}.{props.minor}",
            cudnn=torch.backends.cudnn.version(),
        )
    else:
        info["gpu"] = "no GPU (CPU run)"
    text = json.dumps(info, indent=2) + "\n"
    return info, text + nvidia_smi() + "\n"


def nvidia_smi(*args: str) -> str:
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi: not found"
    try:
        res = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi: {exc}"
    return (res.stdout + res.stderr).strip()


def rounds_written(folder: Path) -> int:
    """Rounds every node of a running job has written so far."""
    counts = []
    for node in folder.glob("node-*"):
        f = node / "metrics.jsonl"
        counts.append(f.read_bytes().count(b"\n") if f.exists() else 0)
    return min(counts, default=0)


# ------------------------------------------------------------------------------ main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--deadline", type=float, default=480.0,
                    help="seconds for the whole script, report included (default 480)")
    ap.add_argument("--reserve", type=float, default=25.0,
                    help="seconds kept for the report after the jobs stop (default 25)")
    ap.add_argument("--min-start", type=float, default=45.0,
                    help="start no job later than this many seconds before the stop (default 45)")
    ap.add_argument("--parallel", type=int, default=6,
                    help=f"jobs at once (default 6: the {FIRST_SETTING} jobs, fp32 and bf16)")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per job (default 1)")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    ap.add_argument("--out", default="runs/gpu_grid", help="output folder")
    ap.add_argument("--work", default=None,
                    help="folder of the jobs' full output (default: a temporary folder)")
    ap.add_argument("--data-root", default=None,
                    help="folder of the Fashion-MNIST IDX files (default: the library's)")
    ap.add_argument("--wheels", default=str(REPO / ".whl"),
                    help="wheels to unpack if cryptography is missing (default .whl)")
    ap.add_argument("--precision", default="fp32,bf16",
                    help="comma list; the first is the grid's, the others run on "
                    f"{FIRST_SETTING} for {'/'.join(PRIMARY_ALGORITHMS)} (default fp32,bf16)")
    ap.add_argument("--algorithms", default=",".join(ALL_ALGORITHMS))
    ap.add_argument("--only", default="", help="comma list of settings (default: all 8)")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--nodes", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--eval-every", type=int, default=1)
    ap.add_argument("--eval-samples", type=int, default=None,
                    help="default: the whole 10 000-image test set")
    ap.add_argument("--local-steps", type=int, default=None,
                    help="mini-batches per round (default: one epoch)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-jobs", type=int, default=None, help="run only the first N jobs")
    ap.add_argument("--no-fallback", dest="fallback", action="store_false",
                    help="do not rerun a failed job on the sequential engine")
    ap.add_argument("--tf32", action="store_true",
                    help="let fp32 convolutions and matmuls use TF32 on the GPU (default: off)")
    ap.add_argument("--quick", action="store_true",
                    help="CPU smoke test: 2 rounds of 3 steps, 200 test images, first 8 jobs")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    quick, _ = ap.parse_known_args(argv)
    if quick.quick:  # new defaults; options given explicitly still win
        ap.set_defaults(rounds=2, local_steps=3, eval_samples=200, max_jobs=8, min_start=5.0)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    site = bootstrap(Path(args.wheels))
    try:
        import dacflnode.sim.experiment  # noqa: F401
    except ImportError as exc:
        print(f"cannot import dacflnode's simulator: {exc}. Carry the wheels of the missing "
              f"packages in {args.wheels} (examples/reproduce_paper/README.md).", flush=True)
        return 2
    if args.worker is not None:
        return worker(json.loads(args.worker))

    t0 = time.monotonic()
    stop_at = t0 + args.deadline - args.reserve
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gpu-grid-"))
    work.mkdir(parents=True, exist_ok=True)
    log_path = work / "gpu_grid.log"
    log_file = log_path.open("a")

    def log(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')} +{time.monotonic() - t0:5.0f}s] {msg}"
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    sys.path.insert(0, str(HERE))
    import reproduce

    from dacflnode.errors import ConfigError

    info, text = machine_info(args.device)
    log_file.write(text)
    log(f"machine: {json.dumps(info)}")
    if site:
        log(f"unpacked the wheels of {args.wheels} into {site}")

    wanted = {s for s in args.only.split(",") if s}
    grid = [(n, e) for n, e in reproduce.settings() if not wanted or n in wanted]
    precisions = [p for p in args.precision.split(",") if p]
    jobs = job_order(grid, [a for a in args.algorithms.split(",") if a], precisions,
                     paper=reproduce.PAPER)
    if args.max_jobs is not None:
        jobs = jobs[: args.max_jobs]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (site, str(REPO), env.get("PYTHONPATH")) if p
    )
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(args.threads)

    def spec(job: Job) -> dict[str, Any]:
        return {
            "name": job.name, "algorithm": job.algorithm, "precision": job.precision,
            "extra": job.extra, "nodes": args.nodes, "rounds": args.rounds,
            "data_root": args.data_root and str(Path(args.data_root).resolve()),
            "lr": args.lr, "eval_every": args.eval_every,
            "eval_samples": args.eval_samples, "local_steps": args.local_steps,
            "seed": args.seed, "device": args.device, "threads": args.threads,
            "tf32": args.tf32, "folder": str(work / job.folder), "engine": job.engine,
        }

    states = []
    for job in jobs:
        state = JobState(job)
        try:
            build_config(spec(job))
        except ConfigError as exc:
            state.status, state.reason = "skipped", str(exc)
            log(f"skip {job.name}: {exc}")
        states.append(state)
    log(f"{len(jobs)} jobs, {args.parallel} at once, {args.rounds} rounds each; stop at "
        f"+{stop_at - t0:.0f}s; work folder {work}")

    def launch(job: Job) -> Handle:
        folder = work / job.folder
        folder.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec(job))]
        with (folder / "job.log").open("w") as job_log:
            return subprocess.Popen(cmd, stdout=job_log, stderr=subprocess.STDOUT, env=env,
                                    cwd=os.getcwd())

    gpu_samples: list[str] = []

    def tick(running: list[JobState]) -> None:
        parts = [f"{s.job.name} {rounds_written(work / s.job.folder)}/{args.rounds}"
                 for s in running]
        gpu = ""
        if args.device.startswith("cuda"):
            sample = nvidia_smi("--query-gpu=utilization.gpu,memory.used",
                                "--format=csv,noheader")
            gpu_samples.append(f"+{time.monotonic() - t0:.0f}s {len(running)} jobs: {sample}")
            gpu = f" | gpu {sample}"
        log("running: " + ", ".join(parts) + gpu)

    def on_end(state: JobState) -> None:
        lines = (work / state.job.folder / "job.log").read_text(errors="replace").splitlines()
        for line in lines[-20:] if state.status == "failed" else lines[-2:]:
            log(f"  {state.job.name} | {line}")

    scheduler = Scheduler(states, launch, parallel=args.parallel, stop_at=stop_at,
                          min_start=args.min_start, log=log, tick=tick, on_end=on_end,
                          retry=Job.fallback if args.fallback else None)

    def on_term(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)  # stopped from outside: report what ran
    interrupted = False
    try:
        scheduler.run()
    except KeyboardInterrupt:
        log("interrupted: stopping the running jobs")
        interrupted = True
        scheduler.stop_at = time.monotonic()
        scheduler.stop_all()
    states = scheduler.states  # with the retries
    for s in states:
        if s.status == "pending":
            s.status, s.reason = "not-run", "interrupted"

    results = [collect(s, work / s.job.folder, args.rounds) for s in states]
    for r, s in zip(results, states, strict=True):
        if s.started is not None:
            log(f"job {s.job.name}: {r['status']}, rounds {r['rounds_done']}/{args.rounds}, "
                f"acc {_pct(r.get('avg_acc'))}, wall {_wall(r.get('wall_s'))}"
                + (f" ({s.reason})" if r["status"] == "failed" else ""))
    counts: dict[str, int] = {}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    elapsed = time.monotonic() - t0
    last_end = max((s.ended for s in states if s.ended is not None), default=t0) - t0
    meta = {
        **info,
        "summary": (
            f"{len(jobs)} jobs ({', '.join(f'{v} {k}' for k, v in counts.items())}), "
            f"{args.parallel} at once, deadline {args.deadline:.0f} s (jobs stopped at "
            f"+{stop_at - t0:.0f} s{', interrupted before' if interrupted else ''}), last job "
            f"ended at +{last_end:.0f} s; {args.rounds} rounds of "
            f"{'one epoch' if args.local_steps is None else f'{args.local_steps} steps'}, "
            f"test set {'10 000 images' if args.eval_samples is None else args.eval_samples}, "
            f"batched engine, {args.threads} CPU thread(s) per job, TF32 "
            f"{'on' if args.tf32 else 'off'}."
        ),
        "command": sys.argv,
        "elapsed_s": round(elapsed, 1),
        "gpu_samples": gpu_samples,
    }
    estimate = grid_estimate(results, len(jobs), args.rounds, args.parallel)
    if estimate is not None:
        meta["summary"] += (
            f" At the {estimate['s_per_round']:.2f} s per round the jobs measured "
            f"({args.parallel} at once), all {len(jobs)} jobs of {args.rounds} rounds would take "
            f"about {estimate['grid_min']:.0f} min."
        )
        meta["grid_estimate"] = estimate
    text = write_results(out, results, reproduce.PAPER, meta)
    plots = plot_settings(results, work / "plots")
    for p in plots:
        if p.stem == FIRST_SETTING:
            shutil.copy(p, out / f"{FIRST_SETTING}.png")
    if args.device.startswith("cuda"):
        log_file.write("\nnvidia-smi at the end:\n" + nvidia_smi() + "\n")
    log(f"results written; elapsed {time.monotonic() - t0:.0f}s")
    log_file.close()
    members = [(out / "results.md", "results.md"), (out / "results.json", "results.json"),
               (log_path, "gpu_grid.log")] + [(p, f"plots/{p.name}") for p in plots]
    archive = make_archive(out, members, work)
    print(text, flush=True)
    print(f"archive {archive} ({archive.stat().st_size / 2**20:.1f} MiB); "
          f"total {time.monotonic() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
