"""Writing models as safetensors files (never pickle), atomically and with a checksum.

Every file written here carries, in its safetensors metadata, ``checksum``: ``xxh3-128:<hex>``,
the XXH3-128 hash of its other metadata and of its tensors (each tensor's name, dtype, shape and
bytes, in name order).
:func:`read_verified` reads a file (or its bytes) back and recomputes it, so a flipped bit, a
truncated file or bytes written over a tensor are found before anything uses the values. A file
without the key (written before checksums existed) reads back unverified: the caller decides
what to say about it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
import xxhash
from safetensors import SafetensorError, deserialize
from safetensors.torch import save_file

from dacflnode.filemodes import SECRET_MODE, prepare_file
from dacflnode.learning.layout import StateLayout

#: The metadata key of the checksum, and the prefix of its value (names the hash).
CHECKSUM_KEY = "checksum"
CHECKSUM_PREFIX = "xxh3-128:"

#: safetensors' dtype names of the torch dtypes a node writes.
_DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}
_DTYPES = {name: dtype for dtype, name in _DTYPE_NAMES.items()}


class CorruptFile(ValueError):
    """A safetensors file that cannot be read, or whose tensors do not match its checksum."""


def _digest(meta: Mapping[str, str],
            items: Iterable[tuple[str, str, Iterable[int], memoryview]]) -> str:
    h = xxhash.xxh3_128()
    h.update(json.dumps(sorted((k, v) for k, v in meta.items() if k != CHECKSUM_KEY)).encode())
    for name, dtype, shape, data in sorted(items, key=lambda item: item[0]):
        h.update(json.dumps([name, dtype, list(shape), data.nbytes]).encode())
        h.update(data)
    return CHECKSUM_PREFIX + h.hexdigest()


def _raw(t: torch.Tensor) -> memoryview:
    flat = t.detach().cpu().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy().data)


def checksum(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, str]) -> str:
    """The checksum of ``tensors`` and ``meta`` as :func:`atomic_save` stores it (see the module
    docstring)."""
    items = []
    for name, t in tensors.items():
        dtype = _DTYPE_NAMES.get(t.dtype)
        if dtype is None:
            raise ValueError(f"tensor {name}: dtype {t.dtype} cannot be checksummed")
        items.append((name, dtype, t.shape, _raw(t)))
    return _digest(meta, items)


def atomic_save(tensors: Mapping[str, torch.Tensor], path: Path, meta: Mapping[str, str],
                *, keep_previous: Path | None = None) -> None:
    """Write ``tensors`` (and their :func:`checksum`) to ``path``: to a temporary file, flushed
    to disk, read back and verified, then renamed over ``path``. With ``keep_previous``, the
    file ``path`` held before becomes ``keep_previous`` first: hard-linked there, so ``path``
    names a verified file at every moment (a process killed between the steps leaves the old
    file at ``path``, never no file, though for the instant between the two renames both names
    are that one file); on a file system without hard links it is renamed, and for that
    instant only ``keep_previous`` holds one (:func:`read_verified` of either)."""
    contiguous = {k: v.contiguous() for k, v in tensors.items()}
    tmp = path.with_name(path.name + ".tmp")
    prepare_file(tmp, SECRET_MODE)  # save_file truncates it and keeps the mode
    save_file(contiguous, str(tmp), metadata={**meta, CHECKSUM_KEY: checksum(contiguous, meta)})
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    try:
        read_verified(tmp)
    except CorruptFile as exc:  # the storage did not keep what was written: an I/O error
        raise OSError(errno.EIO, f"did not read back as written ({exc})", str(tmp)) from exc
    if keep_previous is not None:
        _keep_as(path, keep_previous)
    os.replace(tmp, path)
    _sync_dir(path.parent)


def _keep_as(path: Path, previous: Path) -> None:
    """Make ``previous`` name the file ``path`` names, leaving ``path`` in place where the file
    system has hard links (see :func:`atomic_save`)."""
    link = previous.with_name(previous.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        link.unlink()
    try:
        os.link(path, link)
    except FileNotFoundError:
        return  # nothing to keep: the first save
    except OSError:  # no hard links here (FAT, some network file systems)
        with contextlib.suppress(FileNotFoundError):
            os.replace(path, previous)
        return
    os.replace(link, previous)


def _sync_dir(directory: Path) -> None:
    """Make the renames in ``directory`` durable (where the platform allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_verified(source: Path | bytes) -> tuple[dict[str, str], dict[str, torch.Tensor], bool]:
    """The metadata and tensors of a safetensors file (a path or its bytes), and whether a
    checksum was there to verify them. Raises :class:`CorruptFile` (naming the file) when it
    cannot be parsed or its tensors do not match the checksum it carries; ``OSError`` when the
    file cannot be read."""
    where = str(source) if isinstance(source, Path) else "the file"
    data = source.read_bytes() if isinstance(source, Path) else source
    try:
        header_len = int.from_bytes(data[:8], "little") if len(data) >= 8 else 0
        if header_len <= 0 or 8 + header_len > len(data):
            raise CorruptFile(f"{where}: not a safetensors file, or cut short "
                              f"({len(data)} bytes)")
        header = json.loads(data[8 : 8 + header_len])
        raw_meta = (header.get("__metadata__") or {}) if isinstance(header, dict) else None
        if not isinstance(raw_meta, dict):
            raise CorruptFile(f"{where}: malformed safetensors header")
        meta = {str(k): str(v) for k, v in raw_meta.items()}
        entries = deserialize(data)  # type: ignore[no-untyped-call]
    except (SafetensorError, ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, CorruptFile):
            raise
        reason = str(exc).removeprefix("Error while deserializing: ")
        raise CorruptFile(f"{where}: cut short or not a safetensors file ({reason})") from exc
    stored = meta.get(CHECKSUM_KEY)
    if stored is not None:
        found = _digest(meta, ((name, info["dtype"], info["shape"], memoryview(info["data"]))
                               for name, info in entries))
        if found != stored:
            raise CorruptFile(f"{where}: does not match its checksum (damaged or changed since "
                              "it was written)")
    tensors: dict[str, torch.Tensor] = {}
    for name, info in entries:
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise CorruptFile(f"{where}: tensor {name} has unsupported dtype {info['dtype']}")
        buffer = info["data"]
        t = (torch.frombuffer(buffer, dtype=dtype) if len(buffer) else
             torch.empty(0, dtype=dtype))
        tensors[name] = t.reshape(info["shape"])
    return meta, tensors, stored is not None


def save_model(
    path: Path,
    layout: StateLayout,
    model: torch.Tensor,
    local: Mapping[str, torch.Tensor],
    meta: Mapping[str, str],
) -> None:
    """A node's model as a full ``state_dict`` (loadable into the architecture)."""
    atomic_save(layout.state_dict(model, local), path, meta)
