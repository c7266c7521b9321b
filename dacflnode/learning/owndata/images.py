"""Image folders: one subfolder per class of PNG/JPEG files, decoded in parallel and cached.

Labels come from the class folder's *name* and its index in the run's class list, never from the
order of the folders on disk. A folder may lack some classes; a folder whose name is not a class
is an error. Files are decoded by a process pool (:mod:`dacflnode.learning.imagedecode`) in chunks,
converted to the run's channels (L or RGB) and resized to its height and width.

The decoded ``uint8`` array is cached in ``cache_dir/data-cache/`` as ``.npy`` files (read with
``allow_pickle=False``) next to a small JSON file holding the cache key: a SHA-256 of the sorted
relative file list with every file's size and modification time, the target shape, the resize
switch and the class list. A restart with an unchanged folder reads the cache instead of decoding;
any added, removed, replaced or touched file changes the key and the folder is decoded again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import stat
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dacflnode.errors import ConfigError
from dacflnode.filemodes import SECRET_MODE, make_dir, prepare_file, write_text
from dacflnode.learning import imagedecode
from dacflnode.learning.owndata.contract import class_labels

logger = logging.getLogger(__name__)

CACHE_VERSION = 1
CACHE_FOLDER = "data-cache"

CHUNK_FILES = 512
"""Files per task handed to a worker process."""

PARALLEL_MIN_FILES = 2048
"""Below this many files a folder is decoded in the calling process (a pool costs more)."""

MAX_WORKERS = 8

BAD_LISTED = 5
"""How many bad files an error message names."""

Progress = Callable[[int, int], None]
"""``progress(done, total)``, called as decoding goes (files)."""


@dataclass(frozen=True)
class FolderListing:
    """The image files of a folder source, by class folder name, then relative path (``/``
    separators) within it: their
    sizes, modification times (ns) and labels (indices into the run's classes)."""

    relpaths: list[str]
    sizes: np.ndarray  # int64
    mtimes_ns: np.ndarray  # int64
    labels: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.relpaths)


@dataclass(frozen=True)
class DecodedFolder:
    """A folder decoded: ``images`` uint8 ``[n, C, H, W]`` and ``labels`` int64 ``[n]`` of the
    files that decoded, and the ones that did not as ``(relative path, reason)``."""

    images: np.ndarray
    labels: np.ndarray
    bad: tuple[tuple[str, str], ...]
    files: int
    from_cache: bool


def _scan(base: str, prefix: str, relpaths: list[str], sizes: list[int],
          mtimes: list[int]) -> None:
    """Append the image files under ``base`` (recursively, by name; hidden entries skipped):
    relative path, size and mtime (ns). One ``listdir`` per folder and one ``stat`` per entry,
    which says both whether it is a folder and what the cache key needs."""
    for name in sorted(os.listdir(base)):
        if name.startswith("."):
            continue
        path = base + name
        is_image = name.lower().endswith(imagedecode.IMAGE_EXTENSIONS)
        st = os.stat(path)
        if is_image and stat.S_ISREG(st.st_mode):
            relpaths.append(prefix + name)
            sizes.append(st.st_size)
            mtimes.append(st.st_mtime_ns)
        elif stat.S_ISDIR(st.st_mode):
            _scan(path + os.sep, f"{prefix}{name}/", relpaths, sizes, mtimes)


def list_folder(root: Path, classes: Sequence[str], field: str) -> FolderListing:
    """The image files under ``root``'s class subfolders, sorted by relative path.

    Raises :class:`ConfigError` for a missing root or a class folder not in ``classes``.
    """
    if not root.exists():
        raise ConfigError(field, f"{root} does not exist; point {field} at a folder of class "
                                 "subfolders")
    if not root.is_dir():
        raise ConfigError(field, f"{root} is not a folder; a folder source needs one subfolder "
                                 "of images per class")
    with os.scandir(root) as entries:
        folders = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
    index = class_labels(classes, folders, lambda name: (
        f"{root / name} is a class folder not in classes {list(classes)}; add {name!r} to the "
        f"run's classes or move the folder out of {root}"))
    relpaths: list[str] = []
    sizes: list[int] = []
    mtimes: list[int] = []
    labels: list[int] = []
    for name in folders:
        before = len(relpaths)
        try:
            _scan(f"{root / name}{os.sep}", f"{name}/", relpaths, sizes, mtimes)
        except OSError as err:
            raise ConfigError(field, f"cannot read {err.filename or root / name}: "
                                     f"{err.strerror}") from err
        labels += [index[name]] * (len(relpaths) - before)
    # ordered by class folder name, then by name within the folder: the same on every load
    return FolderListing(
        relpaths=relpaths,
        sizes=np.asarray(sizes, dtype=np.int64),
        mtimes_ns=np.asarray(mtimes, dtype=np.int64),
        labels=np.asarray(labels, dtype=np.int64),
    )


def cache_key(
    files: FolderListing, classes: Sequence[str], shape: tuple[int, int, int], resize: bool,
) -> str:
    """SHA-256 over everything the decoded array depends on: the sorted relative paths, every
    file's size and mtime, the labels, the target shape, the resize switch and the classes."""
    h = hashlib.sha256()
    h.update(json.dumps({"version": CACHE_VERSION, "classes": list(classes),
                         "shape": list(shape), "resize": resize, "n": len(files)}).encode())
    h.update("\0".join(files.relpaths).encode())
    for arr in (files.sizes, files.mtimes_ns, files.labels):
        h.update(np.ascontiguousarray(arr, dtype="<i8").tobytes())
    return h.hexdigest()


def _cache_paths(cache_dir: Path, root: Path) -> tuple[Path, Path, Path]:
    slot = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
    base = cache_dir / CACHE_FOLDER / f"folder-{slot}"
    return (base.with_suffix(".json"), base.with_name(base.name + ".x.npy"),
            base.with_name(base.name + ".y.npy"))


def _read_cache(cache_dir: Path, root: Path, key: str, files: int) -> DecodedFolder | None:
    meta_path, x_path, y_path = _cache_paths(cache_dir, root)
    try:
        meta = json.loads(meta_path.read_text())
        if not isinstance(meta, dict) or meta.get("key") != key:
            return None
        images = np.load(x_path, allow_pickle=False)
        labels = np.load(y_path, allow_pickle=False)
    except (OSError, ValueError):
        return None
    bad = tuple((str(p), str(r)) for p, r in meta.get("bad", []))
    if (images.dtype != np.uint8 or images.ndim != 4 or labels.dtype != np.int64
            or labels.shape != (images.shape[0],) or images.shape[0] + len(bad) != files):
        return None
    return DecodedFolder(images, labels, bad, files, from_cache=True)


def _write_cache(cache_dir: Path, root: Path, key: str, decoded: DecodedFolder) -> None:
    meta_path, x_path, y_path = _cache_paths(cache_dir, root)
    try:
        make_dir(meta_path.parent)
        meta_path.unlink(missing_ok=True)  # the key goes last: a torn write is never a hit
        for path, arr in ((x_path, decoded.images), (y_path, decoded.labels)):
            tmp = path.with_name(path.name + ".tmp")
            prepare_file(tmp, SECRET_MODE)  # the node's data: the owner only
            with open(tmp, "wb") as fh:
                np.save(fh, arr, allow_pickle=False)
            os.replace(tmp, path)
        tmp = meta_path.with_name(meta_path.name + ".tmp")
        write_text(tmp, json.dumps({"key": key, "bad": [list(b) for b in decoded.bad]}),
                   SECRET_MODE)
        os.replace(tmp, meta_path)
    except OSError as err:
        logger.warning("could not cache the decoded images in %s: %s", meta_path.parent, err,
                       extra={"event": "data_cache_unwritable"})


def _pool_context() -> multiprocessing.context.BaseContext:
    """Forked workers on Linux: they start in milliseconds, inherit the decoder already imported
    and only run Pillow and numpy, never torch or the event loop (a spawned or fork-server worker
    would run the caller's ``__main__`` again). Elsewhere, spawned workers."""
    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def default_workers() -> int:
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


def decode_folder(
    root: Path, files: FolderListing, shape: tuple[int, int, int], resize: bool,
    *, workers: int | None = None, progress: Progress | None = None,
) -> tuple[np.ndarray, list[tuple[int, str]], list[tuple[int, str]]]:
    """Decode ``files`` (relative to ``root``) into ``uint8 [n, C, H, W]``, in parallel when
    there are enough of them; returns the array, the bad files and the ones of another size
    (indices into ``files``)."""
    c, h, w = shape
    base = f"{root}{os.sep}"
    paths = [base + rel for rel in files.relpaths]
    n_workers = default_workers() if workers is None else max(1, int(workers))
    if n_workers == 1 or len(paths) < PARALLEL_MIN_FILES:
        out = np.empty((len(paths), c, h, w), dtype=np.uint8)
        bad: list[tuple[int, str]] = []
        mismatched: list[tuple[int, str]] = []
        for start in range(0, len(paths), CHUNK_FILES):
            chunk, b, m = imagedecode.decode_files(paths[start:start + CHUNK_FILES], c, h, w,
                                                   resize)
            out[start:start + len(chunk)] = chunk
            bad += [(start + i, r) for i, r in b]
            mismatched += [(start + i, r) for i, r in m]
            if progress is not None:
                progress(start + len(chunk), len(paths))
        return out, bad, mismatched
    out = np.empty((len(paths), c, h, w), dtype=np.uint8)
    bad, mismatched = [], []
    starts = range(0, len(paths), CHUNK_FILES)
    done = 0
    with ProcessPoolExecutor(n_workers, mp_context=_pool_context()) as pool:
        futures = [
            pool.submit(imagedecode.decode_files, paths[s:s + CHUNK_FILES], c, h, w, resize)
            for s in starts
        ]
        for start, future in zip(starts, futures, strict=True):
            try:
                chunk, b, m = future.result()
            except BrokenProcessPool as err:
                raise ConfigError(
                    "data_root",
                    f"{root}: a decoding process died on one of {paths[start]} and the next "
                    f"{CHUNK_FILES - 1} files; run `dacflnode data check {root} --workers 1` "
                    "to find the file, then remove it",
                ) from err
            out[start:start + len(chunk)] = chunk
            bad += [(start + i, r) for i, r in b]
            mismatched += [(start + i, r) for i, r in m]
            done += len(chunk)
            if progress is not None:
                progress(done, len(paths))
    return out, bad, mismatched


def load_folder(
    root: Path, classes: Sequence[str], shape: tuple[int, int, int] | None, *, resize: bool,
    field: str, cache_dir: Path | None, workers: int | None = None,
    progress: Progress | None = None,
) -> DecodedFolder:
    """Decode (or read from the cache) the images under ``root``.

    ``shape`` is the run's ``(C, H, W)``; ``None`` takes it from the first file. Raises
    :class:`ConfigError` for an empty folder and for images of mixed sizes with ``resize`` off.
    Bad files are returned, not raised: the caller applies the run's policy.
    """
    files = list_folder(root, classes, field)
    if not files:
        raise ConfigError(
            field,
            f"{root} holds no images: expected PNG or JPEG files in one subfolder per class "
            f"(named as in classes {list(classes)})",
        )
    if shape is None:
        shape = _first_shape(root, files) or (1, 1, 1)
    _check_memory(root, len(files), shape)
    key = cache_key(files, classes, shape, resize)
    if cache_dir is not None:
        cached = _read_cache(cache_dir, root, key, len(files))
        if cached is not None:
            logger.info("%s: %d decoded images read from the cache", root, len(cached.labels),
                        extra={"event": "data_cache_hit"})
            return cached
    images, bad_idx, mismatched = decode_folder(root, files, shape, resize, workers=workers,
                                                progress=progress)
    if mismatched:
        _, h, w = shape
        shown = ", ".join(f"{files.relpaths[i]} is {size}" for i, size in mismatched[:BAD_LISTED])
        raise ConfigError(
            "resize",
            f"{root}: images of mixed sizes with resizing off ({len(mismatched)} not {w}x{h}: "
            f"{shown}); turn resizing on or resize the files to one size",
        )
    keep = np.ones(len(files), dtype=bool)
    keep[[i for i, _ in bad_idx]] = False
    labels = files.labels
    decoded = DecodedFolder(
        images=images if keep.all() else images[keep],
        labels=labels[keep],
        bad=tuple((files.relpaths[i], reason) for i, reason in bad_idx),
        files=len(files),
        from_cache=False,
    )
    if cache_dir is not None:
        _write_cache(cache_dir, root, key, decoded)
    return decoded


def _check_memory(root: Path, n: int, shape: tuple[int, int, int]) -> None:
    """Refuse, before allocating, a data set whose float32 tensors would not fit in memory."""
    c, h, w = shape
    need = n * c * h * w * 5  # the uint8 array while decoding, then the float32 tensors
    try:
        have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):  # not every platform says
        return
    if need > have:
        raise ConfigError(
            "image_size",
            f"{root}: {n} images of {c}x{h}x{w} need {need / 2**30:.1f} GiB in memory, more "
            f"than this machine's {have / 2**30:.1f} GiB; set a smaller image_size (and "
            "resize on)",
        )


def _first_shape(root: Path, files: FolderListing) -> tuple[int, int, int] | None:
    """The shape of the first file that opens (the data set's shape when the run names none);
    ``None`` when no file does (each is then reported as unreadable)."""
    for rel in files.relpaths:
        try:
            return imagedecode.peek(str(root / rel))
        except Exception:  # a bad file is reported by the decoding pass
            continue
    return None
