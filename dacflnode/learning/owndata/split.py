"""``dacflnode data split``: one device folder per node, cut from a built-in data set, an image
folder or a table with :func:`dacflnode.learning.partition.partition`.

``format="folder"`` writes ``OUT/<node-id>/<class>/<n>.png`` (``n`` the sample's index in the
source; an image folder's own files are copied as they are); ``format="table"`` writes
``OUT/<node-id>/data.csv`` (or ``data.parquet``) with the features and a ``label`` column (a
table source keeps its columns, in their order and with their types: its rows are taken as they
are, text columns and missing cells included). A source with a test split (the built-in data
sets) also gets ``OUT/test/`` in the same form. Node ids are ``node-0`` ... ``node-{N-1}``,
as ``dacflnode topology`` names them. ``OUT/run-data.yaml`` holds the run settings that read
the result (``dataset``, ``classes``, ``label_column``).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import yaml
from PIL import Image

from dacflnode.errors import ConfigError
from dacflnode.filemodes import LOG_MODE, make_dir, write_text
from dacflnode.learning.datasets import DATASETS, NORMALIZATION, load_dataset
from dacflnode.learning.names import node_ids
from dacflnode.learning.owndata import images, tables, tablescan
from dacflnode.learning.owndata.contract import class_labels
from dacflnode.learning.partition import partition

FORMATS = ("folder", "table")
TABLE_FILE_FORMATS = ("csv", "parquet")

CLASS_NAMES: dict[str, tuple[str, ...]] = {
    "fashion-mnist": ("t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt",
                      "sneaker", "bag", "ankle-boot"),
    "mnist": tuple(str(i) for i in range(10)),
    "cifar10": ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                "truck"),
    "synthetic": tuple(str(i) for i in range(10)),
}
"""Class folder names of the built-in data sets, in label order (names safe as folder names)."""

LABEL_COLUMN = "label"
RUN_FILE = "run-data.yaml"

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Source:
    """A split source in memory: ``x`` uint8 ``[n, C, H, W]`` images or float ``[n, F]``
    features (``None`` for an image folder, whose files are copied, and for a table, whose rows
    are in ``table`` as read), labels, and the test split when there is one."""

    form: str  # "builtin" | "folder" | "table"
    classes: tuple[str, ...]
    labels: np.ndarray
    x: np.ndarray | None
    test_x: np.ndarray | None = None
    test_labels: np.ndarray | None = None
    files: tuple[str, ...] = ()  # an image folder's files, relative to root
    root: Path | None = None
    feature_names: tuple[str, ...] = ()
    label_column: str = LABEL_COLUMN
    table: pa.Table | None = None


@dataclass(frozen=True)
class SplitResult:
    out: Path
    nodes: tuple[str, ...]
    classes: tuple[str, ...]
    counts: tuple[dict[str, int], ...]  # per node: samples per class
    test_count: int
    format: str
    run_settings: dict[str, object]

    def to_dict(self) -> dict[str, object]:
        return {
            "out": str(self.out),
            "format": self.format,
            "classes": list(self.classes),
            "nodes": [{"id": node, "samples": sum(c.values()), "histogram": c}
                      for node, c in zip(self.nodes, self.counts, strict=True)],
            "test_samples": self.test_count,
            "run_settings": self.run_settings,
        }


def _to_uint8(x: np.ndarray, dataset: str) -> np.ndarray:
    """A built-in data set's normalised images back to their uint8 pixels (exact: the
    normalisation is affine and the pixels were integers)."""
    mean, std = NORMALIZATION[dataset]
    c = x.shape[1]
    m = np.asarray(mean, dtype=np.float64).reshape(1, c, 1, 1)
    s = np.asarray(std, dtype=np.float64).reshape(1, c, 1, 1)
    return np.clip(np.rint((x.astype(np.float64) * s + m) * 255.0), 0, 255).astype(np.uint8)


def read_source(
    source: str, *, data_root: str | Path | None = None, classes: Sequence[str] | None = None,
    label_column: str | None = None, seed: int = 0,
) -> Source:
    """A built-in data set's name (files under ``data_root``), an image folder, or a table."""
    key = source.strip().lower()
    if key in DATASETS and not Path(source).exists():
        ds = load_dataset(key, data_root, seed=seed)
        names = CLASS_NAMES[key]
        if key == "synthetic":
            x, tx = ds.train_x.flatten(1).numpy(), ds.test_x.flatten(1).numpy()
        else:
            x, tx = _to_uint8(ds.train_x.numpy(), key), _to_uint8(ds.test_x.numpy(), key)
        return Source("builtin", names, ds.train_y.numpy(), x, tx, ds.test_y.numpy())
    path = Path(source)
    if not path.exists():
        raise ConfigError("source", f"{source} is neither a built-in data set "
                                    f"({', '.join(DATASETS)}) nor an existing folder or file")
    if path.is_dir() and not any(p.suffix.lower() in tables.TABLE_SUFFIXES
                                 for p in path.iterdir() if p.is_file()):
        names = tuple(classes) if classes else _folder_classes(path)
        listed = images.list_folder(path, names, "source")
        if not listed:
            raise ConfigError("source", f"{path} holds no images in class subfolders")
        return Source("folder", names, listed.labels, None, files=tuple(listed.relpaths),
                      root=path)
    column = label_column or LABEL_COLUMN
    table = _read_table(path, column)
    text = tablescan.as_text(table.column(column).combine_chunks())
    if text.null_count:
        rows = np.flatnonzero(text.is_null().to_numpy(zero_copy_only=False))[:5] + 1
        where = tablescan.rows_text([int(r) for r in rows], text.null_count)
        raise ConfigError("source", f"{path}: the label column {column!r} has missing values "
                                    f"in {where} of the table ({text.null_count} in all); fill "
                                    "or remove those rows")
    found = sorted({str(v) for v in pc.unique(text).to_pylist()}, key=tablescan.value_order)
    names = tuple(classes) if classes else tuple(found)
    class_labels(names, found, lambda value: (
        f"{path}: label {value!r} (column {column!r}) is not in classes {list(names)}; add it "
        "to --classes or leave --classes out"))
    labels = pc.index_in(text, value_set=pa.array(names, pa.string()))
    return Source("table", names, np.asarray(labels.to_numpy(), dtype=np.int64), None,
                  feature_names=tuple(c for c in table.column_names if c != column),
                  label_column=column, table=table)


def _folder_classes(root: Path) -> tuple[str, ...]:
    names = tuple(sorted(p.name for p in root.iterdir()
                         if p.is_dir() and not p.name.startswith(".")))
    if not names:
        raise ConfigError("source", f"{root} has no class subfolders")
    return names


def _read_table(root: Path, label_column: str) -> pa.Table:
    """The whole table ``root`` (a file or a folder of them) with its columns and their types;
    the label column as text, the missing-cell markers as nulls."""
    paths = tables.table_files(root, "source")
    parts: list[pa.Table] = []
    for path in paths:
        names = tablescan.column_names(path, "source")
        tablescan.check_label_column(path, names, label_column)
        if parts and names != parts[0].column_names:
            raise ConfigError("source", f"{path} has columns {tablescan.names_text(names)} but "
                                        f"{paths[0]} has "
                                        f"{tablescan.names_text(parts[0].column_names)}; every "
                                        "file of a table must have the same columns")
        try:
            if tablescan.is_csv(path):
                parts.append(pa_csv.read_csv(path, convert_options=pa_csv.ConvertOptions(
                    column_types={label_column: pa.string()},
                    null_values=list(tablescan.MISSING_MARKERS), strings_can_be_null=True)))
            else:
                parts.append(pq.read_table(path))
        except (pa.ArrowException, OSError) as err:
            raise ConfigError("source", f"cannot read table {path}: "
                                        f"{str(err).splitlines()[0][:200]}") from err
    try:
        return pa.concat_tables(parts, promote_options="permissive")
    except pa.ArrowException as err:
        raise ConfigError("source", f"the files of {root} hold different types in one column "
                                    f"({str(err).splitlines()[0][:200]}); give them one type") \
            from err


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError("out", f"{out} exists and is not an empty folder; choose a new folder "
                                 "(data split never overwrites)")


def write_png_folder(folder: Path, classes: Sequence[str], x: np.ndarray, labels: np.ndarray,
                     index: np.ndarray, progress: Progress | None = None,
                     done: list[int] | None = None, total: int = 0) -> None:
    """Write images ``x[index]`` (uint8 ``[n, C, H, W]``, C = 1 or 3) as
    ``folder/<class>/<i>.png``, ``i`` the index into ``x``."""
    done = [0] if done is None else done
    total = total or len(index)
    for name in {classes[int(lbl)] for lbl in labels[index]}:
        make_dir(folder / name)
    for i in index:
        img = x[int(i)]
        arr = img[0] if img.shape[0] == 1 else img.transpose(1, 2, 0)
        Image.fromarray(arr).save(folder / classes[int(labels[i])] / f"{int(i)}.png")
        done[0] += 1
        if progress is not None and done[0] % 1000 == 0:
            progress(done[0], total)


def _write_table(path: Path, columns: Sequence[str], x: np.ndarray, label_column: str,
                 label_values: list[str], file_format: str) -> None:
    flat = x.reshape(x.shape[0], -1)
    arrays = [pa.array(flat[:, j]) for j in range(flat.shape[1])]
    _write_rows(path, pa.table([*arrays, pa.array(label_values, pa.string())],
                               names=[*columns, label_column]), file_format)


def _write_rows(path: Path, table: pa.Table, file_format: str) -> None:
    make_dir(path.parent)
    if file_format == "parquet":
        pq.write_table(table, path)
    else:
        pa_csv.write_csv(table, path)


def split_data(
    source: str, out: str | Path, *, nodes: int, scheme: str = "iid", seed: int = 0,
    alpha: float = 0.5, shards_per_node: int = 2, fmt: str = "folder",
    table_format: str = "csv", data_root: str | Path | None = None,
    classes: Sequence[str] | None = None, label_column: str | None = None,
    progress: Progress | None = None,
) -> SplitResult:
    """Cut ``source`` into ``nodes`` device folders under ``out`` (see the module docstring).

    Raises :class:`ConfigError` for a source that cannot be read, a format the source cannot be
    written in, or an ``out`` that is not a new or empty folder.
    """
    if fmt not in FORMATS:
        raise ConfigError("format", f"must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if table_format not in TABLE_FILE_FORMATS:
        raise ConfigError("table_format", f"must be csv or parquet, got {table_format!r}")
    out = Path(out)
    _check_out(out)
    src = read_source(source, data_root=data_root, classes=classes, label_column=label_column,
                      seed=seed)
    if fmt == "folder" and (src.form == "table" or (src.x is not None and src.x.ndim != 4)):
        raise ConfigError("format", f"{source} holds feature rows, not images: use --format "
                                    "table")
    parts = partition(src.labels, nodes, scheme, seed=seed, alpha=alpha,
                      shards_per_node=shards_per_node)
    ids = tuple(node_ids(nodes))
    make_dir(out)
    total = sum(len(p) for p in parts) + (0 if src.test_labels is None else len(src.test_labels))
    done = [0]
    ext = "csv" if table_format == "csv" else "parquet"
    columns = src.feature_names or tuple(f"x{j}" for j in range(
        int(np.prod(src.x.shape[1:])) if src.x is not None else 0))
    x_rows: np.ndarray | None = src.x
    if fmt == "table" and src.form == "folder":
        decoded = images.load_folder(src.root or Path(source), src.classes, None, resize=False,
                                     field="source", cache_dir=None)
        if decoded.bad:
            raise ConfigError("source", f"{src.root}: {len(decoded.bad)} image(s) cannot be "
                                        f"read, e.g. {decoded.bad[0][0]}")
        x_rows = decoded.images
        columns = tuple(f"x{j}" for j in range(int(np.prod(x_rows.shape[1:]))))
    for node, index in zip(ids, parts, strict=True):
        if fmt == "folder" and src.form == "folder":
            assert src.root is not None
            for i in index:
                rel = src.files[int(i)]
                target = out / node / rel
                make_dir(target.parent)
                shutil.copyfile(src.root / rel, target)
            done[0] += len(index)
        elif fmt == "folder":
            assert src.x is not None
            write_png_folder(out / node, src.classes, src.x, src.labels, index, progress, done,
                             total)
        elif src.table is not None:
            _write_rows(out / node / f"data.{ext}", src.table.take(pa.array(index)),
                        table_format)
            done[0] += len(index)
        else:
            assert x_rows is not None
            _write_table(out / node / f"data.{ext}", columns, x_rows[index], src.label_column,
                         [src.classes[int(v)] for v in src.labels[index]], table_format)
            done[0] += len(index)
        if progress is not None:
            progress(done[0], total)
    test_count = 0
    if src.test_x is not None and src.test_labels is not None:
        test_count = len(src.test_labels)
        every = np.arange(test_count)
        if fmt == "folder":
            write_png_folder(out / "test", src.classes, src.test_x, src.test_labels, every,
                             progress, done, total)
        else:
            _write_table(out / "test" / f"data.{ext}", columns, src.test_x, src.label_column,
                         [src.classes[int(v)] for v in src.test_labels], table_format)
    counts = tuple(
        {name: int(n) for name, n in zip(
            src.classes, np.bincount(src.labels[p], minlength=len(src.classes)), strict=True)}
        for p in parts
    )
    settings: dict[str, object] = {"dataset": fmt, "classes": list(src.classes)}
    if fmt == "table":
        settings["label_column"] = src.label_column
    elif src.x is not None and src.x.ndim == 4:
        settings["channels"] = int(src.x.shape[1])
        settings["image_size"] = int(src.x.shape[2])
    write_text(out / RUN_FILE, yaml.safe_dump(settings, sort_keys=False), LOG_MODE)
    return SplitResult(out, ids, src.classes, counts, test_count, fmt, settings)
