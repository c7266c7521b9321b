"""Tables: CSV or Parquet files, one row per sample, a label column and feature columns.

Read with pyarrow (one typed reader for both formats, without pandas' weight), in two streaming
passes over the files (:mod:`.tablescan`), so that memory stays near the encoded table
(``n x F x 4`` bytes) whatever the files' size:

1. the scan counts the rows, decides each column's kind, checks the labels and gathers the
   missing cells and the text values found; every refusal comes here, before anything big is
   allocated, and so does the memory check (:func:`~.memory.check_fits`);
2. the fill reads the batches again straight into preallocated float32 arrays: the training
   rows and, with a ``holdout``, the held-out rows, each row to its place in one of the two
   (:func:`~.holdout.holdout_slots`), so the whole table is never copied.

The label column (named by the run) is read as text and compared with the run's class names.
Every other column is a feature, in file order:

* a **numeric** column (every present cell a number, or ``true``/``false``) is one feature;
* a **text** column is categorical and **one-hot encoded**, with the values the run lists for it
  in ``categories`` (a numeric column listed there too, by its text): the features
  ``column=value`` in the listed order, where the column was. One-hot needs no trainable state
  (an embedding would have to reach consensus of its own), the lists are short, and the layout
  is the same on every device, which the data contract checks through the feature names. A
  value the list lacks is refused, or with ``other_category`` goes to ``column=<other>``.

A missing cell (:data:`~.tablescan.MISSING_MARKERS`) is refused (``missing: fail``), its row
left out (``drop``), or kept (``mean``): a number as NaN, for the network's mean to fill later, a
text column's features as all zeros. A missing label is refused, or its row dropped under
``drop``.

The numbers are kept as they are in the files: :attr:`TableData.numeric_features` says which
features the run's scaling (the ``scaling`` setting) applies to; the one-hot ones are left alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dacflnode.errors import ConfigError
from dacflnode.learning.owndata.holdout import holdout_slots
from dacflnode.learning.owndata.memory import check_fits, give_back_freed_memory
from dacflnode.learning.owndata.tablescan import (
    CSV_SUFFIXES,
    DEFAULT_READING,
    MISSING_MARKERS,
    PARQUET_SUFFIXES,
    TABLE_SUFFIXES,
    Reading,
    TableScan,
    as_text,
    batches,
    missing_mask,
    names_text,
    numbers,
    rows_text,
    scan_table,
    table_files,
    value_order,
)

__all__ = [
    "CSV_SUFFIXES",
    "MISSING_MARKERS",
    "MISSING_POLICIES",
    "OTHER_CATEGORY",
    "PARQUET_SUFFIXES",
    "TABLE_SUFFIXES",
    "Encoding",
    "Reading",
    "TableData",
    "encode",
    "load_table",
    "table_files",
]

#: What a missing cell does (the run setting ``missing``).
MISSING_POLICIES = ("fail", "drop", "mean")
#: The one-hot bucket of ``other_category``: ``column=<other>``.
OTHER_CATEGORY = "<other>"


@dataclass(frozen=True)
class TableData:
    """Features ``float32 [n, F]``, labels ``int64 [n]`` and the feature names in order.

    With a held-out fraction, ``features``/``labels`` are the training rows and
    ``test_features``/``test_labels`` the held-out ones (``None`` without). ``numeric_features``:
    the indices of the numeric (not one-hot) features; ``dropped``: rows left out for a missing
    cell (``missing: drop``); ``rows``: the rows of the files."""

    features: np.ndarray
    labels: np.ndarray
    feature_names: tuple[str, ...]
    files: tuple[Path, ...]
    numeric_features: tuple[int, ...] = ()
    test_features: np.ndarray | None = None
    test_labels: np.ndarray | None = None
    dropped: int = 0
    rows: int = 0


@dataclass(frozen=True)
class EncodedColumn:
    """One column's place among the features: ``offset``, and its one-hot ``values`` (the
    ``<other>`` bucket last when ``other``) or ``None`` for a numeric column (``boolean``: read
    as ``true``/``false``)."""

    name: str
    offset: int
    values: tuple[str, ...] | None = None
    other: bool = False
    boolean: bool = False

    @property
    def width(self) -> int:
        return 1 if self.values is None else len(self.values) + int(self.other)


@dataclass(frozen=True)
class Encoding:
    """How a table's feature columns become the feature vector."""

    columns: tuple[EncodedColumn, ...]

    @property
    def width(self) -> int:
        return sum(c.width for c in self.columns)

    @property
    def feature_names(self) -> tuple[str, ...]:
        names: list[str] = []
        for c in self.columns:
            if c.values is None:
                names.append(c.name)
            else:
                names += [f"{c.name}={v}" for v in c.values]
                names += [f"{c.name}={OTHER_CATEGORY}"] if c.other else []
        return tuple(names)

    @property
    def numeric_features(self) -> tuple[int, ...]:
        return tuple(c.offset for c in self.columns if c.values is None)


def encode(scan: TableScan, categories: Mapping[str, Sequence[str]],
           other_category: bool = False) -> Encoding:
    """The encoding of the scanned table under the run's ``categories``; a :class:`ConfigError`
    on ``categories`` names a listed column the table lacks, a text column not listed, or a
    value found that its list lacks (unless ``other_category``)."""
    first = scan.files[0].path
    for name in categories:
        if name == scan.label_column:
            raise ConfigError("categories", f"lists the label column {name!r}, whose values are "
                                            "the classes: remove it from categories")
        if name not in scan.feature_names:
            raise ConfigError("categories", f"names the column {name!r}, which {first} does not "
                              f"have (its columns: {names_text(scan.feature_names)}); correct "
                              "or remove it in categories")
    columns: list[EncodedColumn] = []
    offset = 0
    for name in scan.feature_names:
        if name not in categories and scan.numeric(name):
            columns.append(EncodedColumn(name, offset, boolean=scan.boolean(name)))
        else:
            values = tuple(str(v) for v in categories.get(name, ()))
            if not values:
                raise _unlisted(scan, name)
            if not other_category:
                _check_values(scan, name, values)
            columns.append(EncodedColumn(name, offset, values, other_category))
        offset += columns[-1].width
    return Encoding(tuple(columns))


def _unlisted(scan: TableScan, name: str) -> ConfigError:
    j = scan.feature_names.index(name)
    text = next(f for f in scan.files if not f.columns[j].numeric)
    shown = sorted(text.columns[j].values, key=value_order)[:3]
    return ConfigError(
        "categories",
        f"{text.path}: column {name!r} is not numeric (text such as "
        f"{', '.join(repr(v) for v in shown)}); list its values under the run setting "
        f"categories ({name}: [...]) to one-hot encode it, or drop the column; dacflnode data "
        f"check {scan.root} prints them",
    )


def _check_values(scan: TableScan, name: str, values: tuple[str, ...]) -> None:
    known = set(values)
    for f, col in zip(scan.files, scan.of(name), strict=True):
        unknown = sorted(col.values - known, key=value_order)
        if unknown:
            raise _unknown(f.path, name, unknown[0], len(unknown) - 1, values)


def _unknown(path: Path, name: str, value: str, more: int, values: Sequence[str]
             ) -> ConfigError:
    others = f" (and {more} more)" if more else ""
    return ConfigError(
        "categories",
        f"{path}: column {name!r} has the value {value!r}{others}, which categories does not "
        f"list for it ({names_text(values)}); add it to the run setting categories ({name}: "
        f"[..., {value}]), or set other_category: true",
    )


def _check_cells(scan: TableScan, enc: Encoding, missing: str) -> None:
    """Refuse, per file, an inf/NaN number, a missing cell under ``fail``, and a missing
    label unless ``drop``."""
    numeric = {c.name for c in enc.columns if c.values is None}
    label = scan.label_column
    for f in scan.files:
        for col in f.columns:
            if col.name in numeric and col.nonfinite_row is not None:
                raise ConfigError("data_root", f"{f.path}: column {col.name!r} holds inf or NaN "
                                  f"(data row {col.nonfinite_row}); features must be finite "
                                  "numbers (leave a missing one empty)")
        gap = next((c for c in f.columns if c.missing), None) if missing == "fail" else None
        if gap is not None:
            raise ConfigError(
                "missing",
                f"{f.path}: column {gap.name!r} has missing values in "
                f"{rows_text(gap.missing_rows, gap.missing)} ({gap.missing} in all); fill "
                "them, or set missing: drop (leave those rows out) or mean (a number takes "
                "the network's mean)",
            )
        if f.label_missing and missing != "drop":
            raise ConfigError(
                "missing",
                f"{f.path}: the label column {label!r} has missing values in "
                f"{rows_text(f.label_missing_rows, f.label_missing)} ({f.label_missing} in "
                "all); a label cannot be filled: fill or remove those rows, or set missing: drop",
            )


def load_table(
    root: Path, classes: Sequence[str], label_column: str | None, field: str, *,
    categories: Mapping[str, Sequence[str]] | None = None, other_category: bool = False,
    missing: str = "fail", holdout: float = 0.0, seed: int = 0, reading: Reading = DEFAULT_READING,
) -> TableData:
    """All rows of the CSV/Parquet file ``root`` (or of the files in the folder ``root``, which
    must have the same columns in the same order), encoded (see the module's text).

    ``holdout``/``seed``: the held-out test rows (:func:`~.holdout.holdout_split` of the rows
    kept) go to ``test_features``; ``reading``: the batch sizes. Every refusal is one
    :class:`ConfigError` line naming the file and what to do."""
    if missing not in MISSING_POLICIES:
        raise ConfigError("missing", f"must be one of {', '.join(MISSING_POLICIES)}, got "
                                     f"{missing!r}")
    cats = {str(k): tuple(str(v) for v in vs) for k, vs in (categories or {}).items()}
    scan = scan_table(root, label_column, field, classes=classes, listed=cats, reading=reading)
    enc = encode(scan, cats, other_category)
    if scan.rows == 0:
        raise ConfigError(field, f"{root} holds no rows")
    _check_cells(scan, enc, missing)
    dropped = scan.incomplete if missing == "drop" else 0
    n, width = scan.rows - dropped, enc.width
    if n == 0:
        raise ConfigError("missing", f"{root}: each of its {scan.rows} rows has a missing cell, "
                                     "so missing: drop leaves none; fill them or set missing: "
                                     "mean")
    check_fits(root, f"the encoded table ({n} rows x {width} features, float32)",
               n * width * 4 + n * 24, field,
               "use fewer rows or columns on this device, or a machine with more memory")
    slots, n_train, n_test = holdout_slots(n, holdout, seed) if holdout else (None, n, 0)
    train = (np.zeros((n_train, width), dtype=np.float32), np.empty(n_train, dtype=np.int64))
    test = (np.zeros((n_test, width), dtype=np.float32), np.empty(n_test, dtype=np.int64))
    _fill(scan, enc, classes, missing == "drop", reading, field, slots, train, test)
    give_back_freed_memory()
    return TableData(
        train[0], train[1], enc.feature_names, tuple(f.path for f in scan.files),
        enc.numeric_features, test[0] if slots is not None else None,
        test[1] if slots is not None else None, dropped, scan.rows)


def _changed(path: Path) -> ConfigError:
    return ConfigError("data_root", f"{path} changed while it was read; read it again once "
                                    "nothing writes to it")


def _fill(scan: TableScan, enc: Encoding, classes: Sequence[str], drop: bool, reading: Reading,
          field: str, slots: np.ndarray | None, train: tuple[np.ndarray, np.ndarray],
          test: tuple[np.ndarray, np.ndarray]) -> None:
    """The second pass: every kept row encoded into its place in ``train`` or ``test``."""
    class_index = pa.array([str(c) for c in classes], pa.string())
    features, label = list(scan.feature_names), scan.label_column
    n, width = (train[0].shape[0] + test[0].shape[0]), enc.width
    done = 0
    for f in scan.files:
        for batch in batches(f.path, [*features, label], reading, field):
            sel = None
            if drop:
                keep = ~missing_mask(batch, features, label)
                sel = None if keep.all() else np.flatnonzero(keep)
            m = batch.num_rows if sel is None else int(sel.size)
            if done + m > n:
                raise _changed(f.path)
            if slots is None:
                block, ys = train[0][done:done + m], train[1][done:done + m]
            else:
                block, ys = np.zeros((m, width), np.float32), np.empty(m, np.int64)
            for col in enc.columns:
                _write(batch.column(col.name), col, block, sel, f.path)
            codes = _codes(batch.column(label), class_index, sel)
            if (codes < 0).any():
                raise _changed(f.path)
            ys[:] = codes
            if slots is not None:
                s = slots[done:done + m]
                to_train = s >= 0
                train[0][s[to_train]] = block[to_train]
                train[1][s[to_train]] = ys[to_train]
                held = -1 - s[~to_train]
                test[0][held] = block[~to_train]
                test[1][held] = ys[~to_train]
            done += m
    if done != n:
        raise _changed(scan.root)


def _codes(col: pa.Array, values: pa.Array, sel: np.ndarray | None) -> np.ndarray:
    """Each cell's index in ``values`` (-1: missing or not there), of the rows ``sel``."""
    codes = pc.index_in(as_text(col), value_set=values).fill_null(-1)
    out = np.asarray(codes.to_numpy(zero_copy_only=False), dtype=np.int64)
    return out if sel is None else out[sel]


def _write(col: pa.Array, enc: EncodedColumn, block: np.ndarray, sel: np.ndarray | None,
           path: Path) -> None:
    """Column ``col`` of a batch, rows ``sel``, into its features of ``block``."""
    if enc.values is None:
        x = numbers(col, enc.boolean).to_numpy(zero_copy_only=False)
        block[:, enc.offset] = x if sel is None else x[sel]
        return
    codes = _codes(col, pa.array(enc.values, pa.string()), sel)
    unknown = codes < 0
    if unknown.any():
        present = col.is_valid().to_numpy(zero_copy_only=False)
        unknown &= present if sel is None else present[sel]
        if unknown.any() and not enc.other:  # a value beyond the ones the scan keeps
            row = int(np.flatnonzero(unknown)[0])
            value = as_text(col)[row if sel is None else int(sel[row])].as_py()
            raise _unknown(path, enc.name, str(value), 0, enc.values)
        codes[unknown] = len(enc.values)
    rows = np.flatnonzero(codes >= 0)
    block[rows, enc.offset + codes[rows]] = 1.0
