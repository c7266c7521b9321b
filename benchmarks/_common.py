"""What every benchmark script shares: ``--quick`` and ``--json``, the machine it ran on, and
the one result object a ``--json`` run ends with.

    from _common import add_standard_args, emit_result, machine

``emit_result`` prints (with ``--json``) one JSON object, last on stdout::

    {"name": ..., "ratio": ..., "target": ..., "higher_is_better": ..., "machine": {...}, ...}

``ratio`` is always the subject against a baseline measured in the same process and run;
``target`` is the figure the project holds it to; ``met`` says whether it was reached.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any


def add_standard_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="a short run (under a minute on 2 cores): smaller sizes, fewer "
                             "repeats")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (the last line of stdout) instead of a table")


def machine() -> dict[str, Any]:
    """The machine and load a figure was measured on (load average at the time of the call)."""
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg": [round(v, 2) for v in os.getloadavg()],
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:  # pragma: no cover - every benchmark here has torch
        pass
    return info


def emit_result(
    name: str,
    ratio: float,
    target: float,
    higher_is_better: bool,
    *,
    as_json: bool,
    **details: Any,
) -> dict[str, Any]:
    """Build the result object; print it as the last line of stdout when ``as_json``, else print
    a one-line verdict. Returns the object."""
    met = ratio >= target if higher_is_better else ratio <= target
    result: dict[str, Any] = {
        "name": name,
        "ratio": round(float(ratio), 4),
        "target": target,
        "higher_is_better": higher_is_better,
        "met": met,
        "machine": machine(),
        **details,
    }
    if as_json:
        print(json.dumps(result), flush=True)
    else:
        sign = ">=" if higher_is_better else "<="
        print(f"{name}: ratio {ratio:.3f} (target {sign} {target}: "
              f"{'met' if met else 'NOT met'}), load average {result['machine']['loadavg']}",
              file=sys.stdout, flush=True)
    return result


def timed_into(inner: Callable[..., Any], seconds: list[float]) -> Callable[..., Any]:
    """``inner``, wrapped to append the wall time of every call to ``seconds``."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - started)

    return timed


def rss_bytes() -> int:
    """This process's resident memory now (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_while(work: Callable[[], Any]) -> int:
    """The highest :func:`rss_bytes` while ``work()`` runs, sampled every 10 ms."""
    import threading

    peak = [rss_bytes()]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_bytes())
            stop.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        work()
    finally:
        stop.set()
        sampler.join()
    return peak[0]
