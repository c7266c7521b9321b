"""``launch``'s check of every node's own data before anything is written or started.

A daemon reads its own data (:func:`~dacflnode.assembly.data.own_node_data`) once it runs: a bad
table there (a ``label_column`` the file lacks, a class the run does not name) would stop that
daemon, and the launch with it, after the run folder was made and every daemon started. So
``launch`` reads each node's data first, from the run settings of the node's peers file (its own
``DIR/<node-id>`` folder, as its daemon sees it), checks that every node's data fulfils the same
contract (what the daemons' handshake compares) and that the model can be built for it, and
refuses the run on the first problem with a :class:`~dacflnode.errors.ConfigError` naming the
node.

Cost: each node's data is read twice, here and by its daemon. Tables are read in parallel
threads, a node's tensors dropped once its contract is kept: on 2 cores, 3 devices of 200,000
rows by 21 columns take 7 s to check (one of them alone 4 s), about what their daemons then
spend reading them. Image folders are decoded once: the check decodes them
into a scratch cache that :func:`copy_cache` hands over to each node's state folder before its
daemon starts, where the daemon finds them (a resumed launch seeds the scratch cache from the
nodes' caches, so nothing is decoded again). A ``python`` factory is called twice.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from dacflnode.config import RunConfig
from dacflnode.errors import ConfigError
from dacflnode.filemodes import SECRET_MODE, make_dir, prepare_file


@dataclass(frozen=True)
class CheckedData:
    """What the check keeps of one node's data: enough to compare nodes and build the model."""

    contract: str
    input_shape: tuple[int, int, int]
    num_classes: int
    model: str


def check_node(node: str, run: RunConfig, cache_dir: Path | None) -> CheckedData:
    """Load node ``node``'s own data as its daemon does, with run settings ``run`` (its peers
    file's), and throw it away; a :class:`ConfigError` on the first problem, its field prefixed
    with the node (``node-1: label_column``)."""
    from dacflnode.assembly.data import own_node_data

    try:
        data = own_node_data(run, cache_dir)
    except ConfigError as exc:
        raise ConfigError(f"{node}: {exc.field}", exc.message) from exc
    except OSError as exc:
        raise ConfigError(f"{node}: data_root", f"cannot read {run.data_root}: {exc}") from exc
    return CheckedData(data.contract, data.input_shape, data.num_classes, data.default_model)


def check_own_data(runs: Mapping[str, RunConfig], cache_root: Path) -> None:
    """Check every node's own data (``runs``: each node's run settings by node id, in node
    order): readable, the same contract on every node, a model that takes it. Decoded images
    are cached in ``cache_root/<node-id>`` (:func:`copy_cache` hands them over). Built-in data
    sets need no check here: nothing is read. The first problem, in node order, is raised as a
    :class:`ConfigError` naming the node."""
    from dacflnode.assembly.data import contract_difference_all
    from dacflnode.learning.models import build_model

    ids = list(runs)
    if not ids or not runs[ids[0]].own_data:
        return

    def check(node: str) -> CheckedData:
        return check_node(node, runs[node], cache_root / node)

    if runs[ids[0]].dataset == "table" and len(ids) > 1:
        # an image folder decodes in a process pool of its own (forked: not from threads); a
        # python factory is the user's code, called as its daemon calls it, one at a time
        pool = ThreadPoolExecutor(max_workers=min(len(ids), os.cpu_count() or 1),
                                  thread_name_prefix="launch-check")
        try:
            futures = [pool.submit(check, node) for node in ids]
            checked = [f.result() for f in futures]
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    else:
        checked = [check(node) for node in ids]
    why = contract_difference_all(ids, [c.contract for c in checked])
    if why is not None:
        raise ConfigError("data_root", f"{why}; every node's data must have the same kind, "
                                       f"classes, input shape and feature names")
    first = checked[0]
    build_model(first.model, first.input_shape, first.num_classes)


def copy_cache(source: Path, target: Path) -> int:
    """Copy the decoded images cached in cache folder ``source`` into cache folder ``target``
    (each a node's :func:`~dacflnode.assembly.data.cache_dir_in`, or the check's scratch one):
    hard links where the file system allows, else copies, owner-only as the cache writes them,
    each entry's key file last (a cache without its key is never read). The files copied."""
    from dacflnode.learning.owndata.images import CACHE_FOLDER

    src = source / CACHE_FOLDER
    if not src.is_dir():
        return 0
    files = sorted((f for f in src.iterdir() if f.is_file() and not f.name.endswith(".tmp")),
                   key=lambda f: (f.suffix == ".json", f.name))
    if not files:
        return 0
    dst = make_dir(target / CACHE_FOLDER)
    for f in files:
        to = dst / f.name
        if to.exists() and os.path.samefile(f, to):
            continue
        to.unlink(missing_ok=True)
        try:
            os.link(f, to)
        except OSError:
            prepare_file(to, SECRET_MODE)  # copyfile truncates it and keeps the mode
            shutil.copyfile(f, to)
    return len(files)
