"""The nodes of a batched trainer cut into contiguous groups, each run on a thread of its own.

**One worker per core.** The nodes are split into as many groups as PyTorch has intra-op
threads, each a stacked model trained on its own thread with single-threaded kernels. On a quiet
machine that is as fast as one group using all cores per kernel; when other processes compete
for the cores it is much faster, as no kernel waits at a barrier for a descheduled thread
(``benchmarks/RESULTS.md``, "The batched engine: where its speed comes from"). Results do not
depend on the split.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import torch


def split_bounds(n: int, workers: int) -> list[int]:
    """Where ``n`` nodes are cut into ``workers`` contiguous groups: group ``i`` holds nodes
    ``bounds[i] .. bounds[i+1] - 1``. A node's last bits depend on its group, so every engine
    that must equal the batched engine bit for bit cuts its nodes here."""
    return [i * n // workers for i in range(workers + 1)]


def run_parallel(jobs: Sequence[Callable[[], None]]) -> None:
    """Run ``jobs`` on one CPU thread each, every thread's PyTorch ops single-threaded.

    The process-wide intra-op thread count is set to 1 while the jobs run and restored after.
    """
    if len(jobs) == 1:
        jobs[0]()
        return
    errors: list[BaseException] = []

    def work(job: Callable[[], None]) -> None:
        try:
            torch.set_num_threads(1)
            job()
        except BaseException as exc:  # re-raised in the calling thread
            errors.append(exc)

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        threads = [threading.Thread(target=work, args=(job,)) for job in jobs[1:]]
        for thread in threads:
            thread.start()
        work(jobs[0])
        for thread in threads:
            thread.join()
    finally:
        torch.set_num_threads(saved)
    if errors:
        raise errors[0]

