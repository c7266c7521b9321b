"""``dacflnode launch``: a real cluster of N daemon processes on 127.0.0.1.

Writes the peers files (``DIR/peers/<node-id>.yaml``), starts ``dacflnode start`` for each node
with its state directory at ``DIR/<node-id>/`` — the layout ``simulate`` writes — follows their
``metrics.jsonl`` files for progress, and summarises the per-round Average/Var of Acc like the
simulator does.

The daemons are started as a user starts one, through the command line
(:func:`daemon_args`): the launcher relies on the ``start`` command's options, in the CLI a
layer above, across a process boundary and never by an import; ``tests/cluster/test_launcher.py``
checks that ``start`` accepts the command line built here. Each daemon is a process of its own,
forked from a server that has imported torch and gRPC once (:mod:`dacflnode.cluster.forked`), so
that N daemons do not import them N times; where the platform has no fork server, each is a
fresh ``python -m dacflnode start``.

With a fault plan (``launch --faults FILE``) every daemon gets a copy of the file
(``DIR/faults.yaml``, passed as ``dacflnode start --faults``), so the whole cluster drops the
same edge-rounds, and the run ends with the models ``simulate --faults FILE`` computes. Daemons
play only drop and cut events (:func:`~dacflnode.protocol.faults.check_for_daemons`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

import numpy as np

from dacflnode import __version__
from dacflnode.algorithms.topology import GRAPH_KINDS
from dacflnode.assembly.data import cache_dir_in
from dacflnode.cluster import forked
from dacflnode.cluster.precheck import check_own_data, copy_cache
from dacflnode.config import DAEMON_DEFAULTS, RunConfig
from dacflnode.errors import ConfigError
from dacflnode.filemodes import LOG_MODE, make_dir, open_text, prepare_file, write_text
from dacflnode.learning.names import node_ids
from dacflnode.logs import LOG_FILE_BACKUPS
from dacflnode.peers.algorithms import check_algorithm
from dacflnode.peers.file import load_peers
from dacflnode.peers.generate import cluster_graph, generate_cluster
from dacflnode.protocol.faults import check_for_daemons, load_fault_plan
from dacflnode.records.checkpoint import (
    CHECKPOINT,
    CHECKPOINT_DAMAGED,
    CHECKPOINT_PREV,
    FINAL_MODEL,
)
from dacflnode.records.metrics_log import METRICS_FILE, read_metrics, summarize

LaunchProgress = Callable[[str, int, int, float | None], None]

#: ``dacflnode`` as a fresh interpreter runs it: this Python, the package's command line.
INTERPRETER = (sys.executable, "-m", "dacflnode")

#: What a run leaves in each node's folder: an earlier run is found by them, ``--fresh``
#: deletes them (nothing else: the folder may hold the user's own files, or a data cache).
NODE_OUTPUTS = (METRICS_FILE, CHECKPOINT, CHECKPOINT_PREV, CHECKPOINT_DAMAGED, FINAL_MODEL,
                "daemon.out", "daemon.log",
                *(f"daemon.log.{i}" for i in range(1, LOG_FILE_BACKUPS + 1)))
#: The files of an earlier run that show it got somewhere (logs alone do not).
RESULTS = (METRICS_FILE, CHECKPOINT, CHECKPOINT_PREV, FINAL_MODEL)
#: What ``--fresh`` says, in every refusal to resume.
FRESH_HINT = ("run the same command with --fresh to start over (it deletes that run's metrics, "
              "checkpoints, final models and logs)")


def daemon_args(peers: Path, faults: Path | None = None) -> list[str]:
    """The ``dacflnode`` arguments of the daemon of peers file ``peers``, playing fault plan
    ``faults``."""
    plan = ["--faults", str(faults)] if faults is not None else []
    return ["start", "--peers", str(peers), *plan]


def daemon_argv(peers: Path, faults: Path | None = None) -> list[str]:
    """The command line of that daemon in an interpreter of its own."""
    return [*INTERPRETER, *daemon_args(peers, faults)]


class DaemonProcess(Protocol):
    """A started daemon: a fork (:class:`forked.ForkedCommand`) or an interpreter
    (:class:`asyncio.subprocess.Process`)."""

    @property
    def returncode(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...

    async def wait(self) -> int: ...


async def start_daemon(peers: Path, faults: Path | None, output: Path,
                       env: Mapping[str, str]) -> DaemonProcess:
    """The daemon of peers file ``peers``, its stdout and stderr in ``output`` (created anew):
    forked from the preloaded fork server where the platform has one, so that N daemons
    import torch and gRPC once, not N times; else ``python -m dacflnode start``."""
    if forked.available():
        prepare_file(output, LOG_MODE)
        return forked.ForkedCommand(daemon_args(peers, faults), env, stdout=output)
    log = open_text(output, LOG_MODE)
    try:
        return await asyncio.create_subprocess_exec(
            *daemon_argv(peers, faults), stdout=log, stderr=asyncio.subprocess.STDOUT,
            env=dict(env))
    finally:
        log.close()


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports the OS reports free (bind(0)), all held until chosen."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


async def _follow(
    name: str, node_dirs: list[Path], rounds: int, procs: Sequence[DaemonProcess],
    progress: LaunchProgress | None,
) -> None:
    while any(p.returncode is None for p in procs):
        done = [read_metrics(d / METRICS_FILE) for d in node_dirs]
        finished = min(len(m) for m in done)
        accs = [m[-1]["accuracy"] for m in done if m and m[-1]["accuracy"] is not None]
        if progress is not None:
            progress(name, finished, rounds, float(np.mean(accs)) if accs else None)
        await asyncio.sleep(0.5)


async def _terminate(procs: Sequence[DaemonProcess]) -> None:
    """SIGTERM every daemon still running (each checkpoints and exits 0) and wait for them."""
    for p in procs:
        if p.returncode is None:
            p.send_signal(signal.SIGTERM)
    await asyncio.gather(*(p.wait() for p in procs))


async def _wait_all_or_first_failure(procs: Sequence[DaemonProcess]) -> list[int]:
    """The exit codes of all daemons; when one fails, the others are stopped at once instead of
    waiting for it until their hello timeout or round deadline runs out."""
    waits = {asyncio.ensure_future(p.wait()): p for p in procs}
    pending = set(waits)
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if any(task.result() != 0 for task in done):
                await _terminate(procs)
                break
    finally:
        for task in pending:
            task.cancel()
    return [p.returncode if p.returncode is not None else -1 for p in procs]


@contextlib.contextmanager
def _noting_interrupts() -> Iterator[list[int]]:
    """A list that gets an entry for each SIGINT received inside the block; the handler that
    was there (``asyncio.run``'s, which cancels the main task) still runs. Outside the main
    thread, where signals cannot be handled, the list stays empty."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    before = signal.getsignal(signal.SIGINT)

    def note(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        if callable(before):
            before(signum, frame)

    signal.signal(signal.SIGINT, note)
    try:
        yield received
    finally:
        signal.signal(signal.SIGINT, before)


def write_peers(
    run: RunConfig, out_dir: Path, *, algorithm: str, topology: str, round_deadline: float,
    hello_timeout: float, tls_dir: Path | None, daemon_settings: Mapping[str, Any] | None,
    slowdown: Mapping[str, float] | None,
) -> list[Path]:
    """Write the peers files of a cluster of ``algorithm`` to ``out_dir/peers/`` (free ports on
    127.0.0.1, each node's state folder ``out_dir/<node-id>``), each checked as its daemon
    reads it before any is written; their paths."""
    n = run.nodes
    ports = free_ports(3 * n)
    cfg = replace(run, algorithm=(algorithm,), topology=topology)
    return generate_cluster(
        topology, n, cfg, out_dir / "peers", ports=ports[:n], control_ports=ports[n:2 * n],
        metrics_ports=ports[2 * n:],
        state_root=out_dir, edge_list=run.edge_list, round_deadline=round_deadline,
        hello_timeout=hello_timeout, daemon_settings=daemon_settings, tls_dir=tls_dir,
        slowdown=slowdown,
    )


def check_nodes(
    run: RunConfig, scratch: Path, earlier: Path, *, topology: str, round_deadline: float,
    hello_timeout: float, daemon_settings: Mapping[str, Any] | None,
    slowdown: Mapping[str, float] | None,
) -> None:
    """Check every node of every algorithm's cluster as its daemon would start, writing only
    in the folder ``scratch``: its peers file (settings), then its own data
    (:func:`~dacflnode.cluster.precheck.check_own_data`, decoded images cached in
    ``scratch/data/<node-id>``, seeded from the node caches of ``earlier``, the first
    algorithm's run folder). The first problem is a :class:`ConfigError`."""
    paths: list[Path] = []
    for name in run.algorithm:
        paths = write_peers(run, scratch / "settings" / name, algorithm=name,
                            topology=topology, round_deadline=round_deadline,
                            hello_timeout=hello_timeout, tls_dir=None,
                            daemon_settings=daemon_settings, slowdown=slowdown)
    runs = {p.stem: load_peers(p).run for p in paths}
    if run.own_data:
        for node in runs:
            copy_cache(cache_dir_in(earlier / node), scratch / "data" / node)
    check_own_data(runs, scratch / "data")


async def run_cluster(
    run: RunConfig,
    out_dir: Path,
    *,
    algorithm: str,
    topology: str,
    progress: LaunchProgress | None = None,
    round_deadline: float = DAEMON_DEFAULTS.round_deadline,
    hello_timeout: float = DAEMON_DEFAULTS.hello_timeout,
    tls_dir: Path | None = None,
    faults: Path | None = None,
    daemon_settings: Mapping[str, Any] | None = None,
    slowdown: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Start one daemon per node, wait for all of them; raise RuntimeError if one fails.

    ``faults``: a checked fault plan file that every daemon plays; ``daemon_settings``: further
    daemon settings by name for every peers file."""
    n = run.nodes
    paths = write_peers(run, out_dir, algorithm=algorithm, topology=topology,
                        round_deadline=round_deadline, hello_timeout=hello_timeout,
                        tls_dir=tls_dir, daemon_settings=daemon_settings, slowdown=slowdown)
    node_dirs = [out_dir / p.stem for p in paths]
    for d in node_dirs:
        make_dir(d)
    prepare_resume(node_dirs, {p.stem: p for p in paths})
    env = dict(os.environ)
    if run.threads is None:  # share the cores instead of oversubscribing them
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
    started = time.perf_counter()
    procs: list[DaemonProcess] = []
    try:
        for path, d in zip(paths, node_dirs, strict=True):
            procs.append(await start_daemon(path, faults, d / "daemon.out", env))
    except BaseException:
        await _terminate(procs)
        raise
    follower = asyncio.ensure_future(_follow(algorithm, node_dirs, run.rounds, procs, progress))
    with _noting_interrupts() as interrupted:
        try:
            codes = await _wait_all_or_first_failure(procs)
        except asyncio.CancelledError:
            await _terminate(procs)
            raise
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
    if interrupted:
        # Ctrl-C reached the daemons too (one process group): they stopped at a checkpoint
        # with exit 0, and may have done so before the event loop cancelled this wait
        raise KeyboardInterrupt
    failed = [f"{d.name} (exit {c}, see {d / 'daemon.out'})"
              for d, c in zip(node_dirs, codes, strict=True) if c != 0]
    if failed:
        raise RuntimeError(f"node(s) failed: {', '.join(failed)}")
    summary = summarize(node_dirs, algorithm, time.perf_counter() - started, engine="daemon")
    if progress is not None:
        progress(algorithm, run.rounds, run.rounds, summary["final"]["avg_acc"])
    return summary


def checkpoint_round(path: Path) -> tuple[int, dict[str, str]]:
    """The round and the metadata of the checkpoint file ``path``, read from its header alone;
    ``ValueError`` when it is not a checkpoint."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            meta = dict(f.metadata() or {})
        return int(meta["round"]), meta
    except (SafetensorError, OSError, KeyError, ValueError) as exc:
        raise ValueError(f"{path} is not a readable checkpoint ({exc})") from exc


def earlier_run(node_dirs: list[Path]) -> dict[str, int] | None:
    """The round each node of an earlier run in ``node_dirs`` checkpointed (``None``: no
    earlier run there). Raises :class:`ConfigError` naming ``--fresh`` when that run cannot
    be resumed: a node has results but no readable checkpoint."""
    if not any((d / name).exists() for d in node_dirs for name in RESULTS):
        return None
    without = [d for d in node_dirs
               if not (d / CHECKPOINT).exists() and not (d / CHECKPOINT_PREV).exists()]
    if without:
        found = {d.name: [name for name in RESULTS if (d / name).exists()] for d in without}
        why = "; ".join(f"{node} has {', '.join(names)} but no checkpoint"
                        for node, names in found.items() if names)
        if not why:
            others = [d.name for d in node_dirs if d not in without]
            why = (f"no checkpoint of {', '.join(found)}, while {', '.join(others)} "
                   f"checkpointed")
        raise ConfigError("--out", f"{node_dirs[0].parent} holds an earlier run that cannot "
                                   f"be resumed: {why}; {FRESH_HINT}")
    rounds = {}
    for d in node_dirs:
        path = d / CHECKPOINT if (d / CHECKPOINT).exists() else d / CHECKPOINT_PREV
        try:
            rounds[d.name] = checkpoint_round(path)[0]
        except ValueError as exc:
            raise ConfigError("--out", f"{d.parent} holds an earlier run that cannot be "
                                       f"resumed: {exc}; {FRESH_HINT}") from exc
    return rounds


def prepare_resume(node_dirs: list[Path], peers: Mapping[str, Path]) -> dict[str, int] | None:
    """Get ``node_dirs`` ready for the daemons of peers files ``peers`` (by node id) to resume
    an earlier run from its checkpoints: refuse (:class:`ConfigError` naming ``--fresh``) one
    they could not resume, a checkpoint of other settings included; cut each node's
    ``metrics.jsonl`` back to its checkpoint's round (a round it logged but did not
    checkpoint is run again, and logged once). The rounds of the earlier run, or ``None``."""
    rounds = earlier_run(node_dirs)
    if rounds is None:
        return None
    for d in node_dirs:
        pf = load_peers(peers[d.name])
        path = d / CHECKPOINT if (d / CHECKPOINT).exists() else d / CHECKPOINT_PREV
        meta = checkpoint_round(path)[1]
        # own data: the fingerprint holds the data's contract, known once the daemon reads the
        # data; the daemon refuses a checkpoint of another run itself
        if not pf.run.own_data and meta.get("run_fingerprint") != pf.run_fingerprint():
            raise ConfigError("--out", f"{d.parent} holds an earlier run with other settings "
                                       f"({d.name} checkpointed round {rounds[d.name]}); resume "
                                       f"it with the options it was started with, or "
                                       f"{FRESH_HINT}")
    for d in node_dirs:
        lines = read_metrics(d / METRICS_FILE)
        kept = [line for line in lines if int(line.get("round", 0)) <= rounds[d.name]]
        if len(kept) != len(lines):
            write_text(d / METRICS_FILE, "".join(json.dumps(x) + "\n" for x in kept),
                       LOG_MODE)
    return rounds


def clear_outputs(root: Path, nodes: int, algorithms: tuple[str, ...]) -> list[Path]:
    """Delete what a run of ``algorithms`` over ``nodes`` nodes left in ``root`` (``--fresh``):
    each node's :data:`NODE_OUTPUTS` and the summary; the files deleted."""
    folders = [root / name for name in algorithms] if len(algorithms) > 1 else [root]
    deleted = []
    for folder in folders:
        for path in [folder / node / name for node in node_ids(nodes) for name in NODE_OUTPUTS]:
            if path.is_file():
                path.unlink()
                deleted.append(path)
    for path in (root / "summary.json",):
        if path.is_file():
            path.unlink()
            deleted.append(path)
    return deleted


def checkpointed_rounds(root: Path, nodes: int, algorithms: tuple[str, ...]
                        ) -> dict[str, dict[str, int]]:
    """Per algorithm, the round each node's checkpoint in ``root`` holds (nodes without a
    readable checkpoint left out): what a resumed launch starts from."""
    out: dict[str, dict[str, int]] = {}
    for name in algorithms:
        folder = root / name if len(algorithms) > 1 else root
        rounds = {}
        for node in node_ids(nodes):
            with contextlib.suppress(ValueError):
                rounds[node] = checkpoint_round(folder / node / CHECKPOINT)[0]
        out[name] = rounds
    return out


def launch(
    run: RunConfig, out_dir: str | Path, progress: LaunchProgress | None = None,
    round_deadline: float = DAEMON_DEFAULTS.round_deadline,
    hello_timeout: float = DAEMON_DEFAULTS.hello_timeout,
    tls_dir: Path | None = None,
    faults: str | Path | None = None,
    daemon_settings: Mapping[str, Any] | None = None,
    slowdown: Mapping[str, float] | None = None,
    fresh: bool = False,
    checked: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run every algorithm of ``run`` as a real cluster; write and return the summary.

    An earlier run in ``out_dir`` (stopped by Ctrl-C, or finished) is resumed from its nodes'
    checkpoints, or refused with a :class:`ConfigError` naming ``--fresh`` where it cannot be
    (other settings, a node without a checkpoint): its files are never overwritten silently.
    ``fresh``: delete what an earlier run left there first, and start over.

    ``tls_dir``: the nodes talk mutual TLS with the certificates there (created when missing).
    ``faults``: a fault plan file (drop and cut events) that every daemon plays; it is checked
    here, before any daemon starts, and copied to ``out_dir/faults.yaml``.
    ``daemon_settings``: further daemon settings by name (``gone_after``, ...).
    ``slowdown``: nodes that train slower on purpose, by factor (``launch --slowdown``).

    Before anything is written or started, every node is checked as its daemon would start
    (:func:`check_nodes`: its peers file's settings, its own data read as the daemon reads it):
    the first problem is a :class:`ConfigError` naming the node, with ``out_dir`` as it was.
    ``checked`` is called once every check has passed, before anything is written.
    """
    topology = run.topology
    if topology not in GRAPH_KINDS:
        raise ConfigError(
            "topology",
            f"launch runs Metropolis weights over a graph; '{topology}' needs a global view "
            f"(choose from {', '.join(GRAPH_KINDS)})",
        )
    for name in run.algorithm:
        check_algorithm(name)
    root = Path(out_dir)
    folders = [root / name if len(run.algorithm) > 1 else root for name in run.algorithm]
    ids = node_ids(run.nodes)
    if not fresh:  # an earlier run this one cannot resume: refused before anything else
        for folder in folders:
            earlier_run([folder / node for node in ids])
    if faults is not None:
        graph = cluster_graph(topology, run.nodes, run, run.edge_list)
        check_for_daemons(load_fault_plan(faults, ids, run.rounds,
                                          [(ids[i], ids[j]) for i, j in graph]),
                          "`dacflnode launch`")
    plan_file: Path | None = None
    with tempfile.TemporaryDirectory(prefix="dacfl-launch-") as scratch:
        check_nodes(run, Path(scratch), folders[0], topology=topology,
                    round_deadline=round_deadline, hello_timeout=hello_timeout,
                    daemon_settings=daemon_settings, slowdown=slowdown)
        if checked is not None:
            checked()
        if fresh:
            clear_outputs(root, run.nodes, run.algorithm)
        make_dir(root)
        if faults is not None:
            plan_file = (root / "faults.yaml").absolute()
            if Path(faults).expanduser().absolute() != plan_file:
                prepare_file(plan_file, LOG_MODE)  # copyfile truncates it and keeps the mode
                shutil.copyfile(Path(faults).expanduser(), plan_file)
        for folder in folders:  # the images the check decoded: no daemon decodes them again
            for node in ids:
                copy_cache(Path(scratch) / "data" / node, cache_dir_in(folder / node))
    started = time.perf_counter()
    results = {}
    for name, folder in zip(run.algorithm, folders, strict=True):
        results[name] = asyncio.run(run_cluster(
            run, folder, algorithm=name, topology=topology, progress=progress,
            round_deadline=round_deadline, hello_timeout=hello_timeout, tls_dir=tls_dir,
            faults=plan_file, daemon_settings=daemon_settings, slowdown=slowdown))
    # (the round deadline is a daemon setting, recorded so that a report tells arms apart)
    config = {**run.to_json(), "slowdown": dict(slowdown or {}) or run.slowdown,
              "round_deadline": round_deadline}
    summary: dict[str, Any] = {"version": __version__, "config": config,
                               "algorithms": results,
                               "wall_s": round(time.perf_counter() - started, 3)}
    if plan_file is not None:
        summary["faults"] = str(plan_file)
    make_dir(root)
    write_text(root / "summary.json", json.dumps(summary, indent=2) + "\n", LOG_MODE)
    return summary
