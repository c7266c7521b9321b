"""Tables: CSV or Parquet files, one row per sample, a label column and numeric features.

Read with pyarrow: one columnar, typed reader for both formats (CSV type inference, Parquet's own
types), multi-threaded, without pandas' weight. The label column (named by the run) is read as
text and compared with the run's class names; every other column is a feature, in file order, and
must be numeric (integers, floats or booleans) with no missing values.

Features are used as they are in the file: no per-device scaling, since statistics computed on
each device's own rows would differ between devices and so would the inputs the one model sees.
Put features on a common scale before they reach the devices (the same units and transform on
every one); ``dacflnode data check`` prints each feature's range to help spot the need.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from dacflnode.errors import ConfigError
from dacflnode.learning.owndata.contract import class_labels

CSV_SUFFIXES = (".csv",)
PARQUET_SUFFIXES = (".parquet", ".pq")
TABLE_SUFFIXES = CSV_SUFFIXES + PARQUET_SUFFIXES


@dataclass(frozen=True)
class TableData:
    """Features ``float32 [n, F]``, labels ``int64 [n]`` and the feature names in file order."""

    features: np.ndarray
    labels: np.ndarray
    feature_names: tuple[str, ...]
    files: tuple[Path, ...]


def table_files(root: Path, field: str) -> list[Path]:
    """``root`` itself when it is a CSV/Parquet file, else the CSV/Parquet files in it (sorted)."""
    if not root.exists():
        raise ConfigError(field, f"{root} does not exist; point {field} at a CSV or Parquet file "
                                 "or a folder of them")
    if root.is_file():
        if root.suffix.lower() not in TABLE_SUFFIXES:
            raise ConfigError(field, f"{root} is not a .csv, .parquet or .pq file")
        return [root]
    found = sorted(p for p in root.iterdir()
                   if p.is_file() and p.suffix.lower() in TABLE_SUFFIXES
                   and not p.name.startswith("."))
    if not found:
        raise ConfigError(field, f"{root} holds no .csv, .parquet or .pq file")
    return found


def _read(path: Path, label_column: str) -> pa.Table:
    try:
        if path.suffix.lower() in CSV_SUFFIXES:
            return pa_csv.read_csv(
                path, convert_options=pa_csv.ConvertOptions(column_types={label_column:
                                                                          pa.string()}))
        return pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as err:
        reason = str(err).splitlines()[0][:200]
        raise ConfigError("data_root", f"cannot read table {path}: {reason}") from err


def _is_numeric(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
                or pa.types.is_decimal(t))


def read_table_file(
    path: Path, classes: Sequence[str], label_column: str
) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """One file's features, labels (indices into ``classes``) and feature names."""
    table = _read(path, label_column)
    if label_column not in table.column_names:
        raise ConfigError(
            "label_column",
            f"{path} has no label column {label_column!r} (its columns: "
            f"{', '.join(table.column_names[:10])}); set label_column to the column that holds "
            "the class",
        )
    if table.num_rows == 0:
        raise ConfigError("data_root", f"{path} holds no rows")
    names = tuple(c for c in table.column_names if c != label_column)
    if not names:
        raise ConfigError("data_root", f"{path} has no feature column besides {label_column!r}")
    for name in names:
        column = table.column(name)
        if not _is_numeric(column.type):
            raise ConfigError(
                "data_root",
                f"{path}: column {name!r} is not numeric ({column.type}); features must be "
                f"numbers: convert or drop it (or name it as label_column if it is the label)",
            )
        if column.null_count:
            raise ConfigError("data_root", f"{path}: column {name!r} has {column.null_count} "
                                           "missing values; fill or drop those rows")
    label_col = table.column(label_column)
    if label_col.null_count:
        raise ConfigError("data_root", f"{path}: label column {label_column!r} has "
                                       f"{label_col.null_count} missing values; drop those rows")
    label_text = pc.cast(label_col, pa.string()).to_numpy(zero_copy_only=False).astype(str)
    values, inverse = np.unique(label_text, return_inverse=True)
    index = class_labels(classes, values, lambda label: (
        f"{path}: label {label!r} (column {label_column!r}) is not in classes {list(classes)}; "
        f"add it to the run's classes or drop those rows"))
    labels = np.array([index[v] for v in values], dtype=np.int64)[inverse.reshape(-1)]
    features = np.empty((table.num_rows, len(names)), dtype=np.float32)
    for j, name in enumerate(names):
        col = table.column(name)
        if pa.types.is_boolean(col.type) or pa.types.is_decimal(col.type):
            col = pc.cast(col, pa.float64())
        features[:, j] = col.to_numpy()
    if not np.isfinite(features).all():
        bad = names[int(np.flatnonzero(~np.isfinite(features).all(axis=0))[0])]
        raise ConfigError("data_root", f"{path}: column {bad!r} holds inf or NaN; features must "
                                       "be finite numbers")
    return features, labels, names


def load_table(root: Path, classes: Sequence[str], label_column: str | None,
               field: str) -> TableData:
    """All rows of the CSV/Parquet file ``root`` (or of the files in the folder ``root``, which
    must have the same columns in the same order)."""
    if not label_column:
        raise ConfigError("label_column", "a table source needs label_column: the name of the "
                                          "column that holds each row's class")
    paths = table_files(root, field)
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    names: tuple[str, ...] | None = None
    for path in paths:
        x, y, file_names = read_table_file(path, classes, label_column)
        if names is not None and file_names != names:
            raise ConfigError(
                field,
                f"{path} has feature columns {list(file_names)} but {paths[0]} has "
                f"{list(names)}; every file of a table must have the same columns in the same "
                "order",
            )
        names = file_names
        xs.append(x)
        ys.append(y)
    assert names is not None
    features = np.concatenate(xs) if len(xs) > 1 else xs[0]
    labels = np.concatenate(ys) if len(ys) > 1 else ys[0]
    if features.shape[0] == 0:
        raise ConfigError(field, f"{root} holds no rows")
    return TableData(features, labels, names, tuple(paths))
