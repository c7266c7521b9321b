"""``kill -USR1 <pid>``: what every asyncio task of a running daemon is waiting on.

A node that stays in one round while its neighbours go on is waiting somewhere; this says where
without stopping it (docs/operations.md, "A node that seems stuck"). Like :mod:`faulthandler`,
the stacks go to stderr as they are (many lines, which the guarded log would escape, cut and
rate-limit); the log gets one ``task_dump`` line saying so.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any, TextIO

log = logging.getLogger(__name__)

STACK_LIMIT = 16  # frames per task: its await chain, not the whole interpreter


def awaits(task: asyncio.Task[object]) -> list[str]:
    """Where ``task`` waits: its coroutine and each one it awaits (``cr_await``, an async
    generator's ``ag_await``), outermost first, as ``file:line in function``; what is awaited
    last and has no frame (a future, a C-level awaitable) by its type."""
    out: list[str] = []
    obj: Any = task.get_coro()
    while obj is not None and len(out) < STACK_LIMIT:
        frame = getattr(obj, "cr_frame", None) or getattr(obj, "ag_frame", None)
        if frame is None:
            out.append(f"(awaiting {type(obj).__qualname__})")
            break
        line = frame.f_lineno if frame.f_lineno is not None else "?"
        out.append(f"{frame.f_code.co_filename}:{line} in {frame.f_code.co_qualname}")
        obj = getattr(obj, "cr_await", None) or getattr(obj, "ag_await", None)
    return out


def describe(task: asyncio.Task[object]) -> str:
    """``task``'s name and where it waits, outermost await first, one per line."""
    lines = awaits(task) or ["(not started, or done)"]
    return "\n".join([f"task {task.get_name()}:", *(f"  {line}" for line in lines)])


def dump_tasks(node: str, out: TextIO | None = None) -> int:
    """Write every task of the running loop to ``out`` (stderr); the number of tasks."""
    out = sys.stderr if out is None else out
    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    out.write(f"--- {node}: {len(tasks)} tasks ---\n")
    out.write("".join(describe(task) + "\n" for task in tasks))
    out.flush()
    log.warning("wrote the stacks of %d tasks to stderr", len(tasks),
                extra={"event": "task_dump", "node": node})
    return len(tasks)
