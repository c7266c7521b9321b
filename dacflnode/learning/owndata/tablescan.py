"""Reading a table in batches, and the first of the two passes over it (:func:`scan_table`).

A table is read by pyarrow's streaming readers, one batch at a time: CSV with
``pyarrow.csv.open_csv`` (blocks of :data:`CSV_BLOCK_BYTES`), Parquet with
``ParquetFile.iter_batches``. Nothing holds the whole file: memory stays near one batch.

Every CSV column is read as text, and its kind is decided over the whole file: a column whose
every present cell parses as a number (or as ``true``/``false``) is numeric, any other is text.
So a column with text in its last block is found to be text (pyarrow's own inference looks at the
first block only), and the second pass parses the cells exactly as the first one did. A Parquet
column keeps its own type: numbers (integers, floats, booleans, decimals) or text.

A cell is missing when it is empty or one of :data:`MISSING_MARKERS` (pyarrow's ``null_values``
for CSV; a Parquet null, NaN or a text cell equal to a marker alike).

The scan counts the rows (Parquet: from the file's metadata), checks that every file has the same
columns in the same order and the label column, checks the labels against the run's classes, and
gathers per column what the encoding and ``dacflnode data check`` need: the kind, the missing
cells and their first rows, the range of a numeric column and the distinct values of a text one.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
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

#: The cells that mean "missing" (besides a Parquet null or NaN).
MISSING_MARKERS = ("", "NA", "N/A", "NaN", "nan", "null", "NULL", "None")
#: Bytes of CSV text per batch (pyarrow's default; the reader reads a few dozen ahead).
CSV_BLOCK_BYTES = 1 << 20
#: About the bytes of float32 features per Parquet batch (rows per batch follow from the width).
BATCH_BYTES = 4 << 20
#: Distinct text values a column's scan keeps (a longer list is no category list).
VALUES_KEPT = 1000
#: Rows, and column names, a message lists.
ROWS_LISTED = 5
NAMES_LISTED = 10

_MARKERS = pa.array(MISSING_MARKERS, pa.string())


def names_text(names: Sequence[str], limit: int = NAMES_LISTED) -> str:
    """``a, b, c``, or the first ``limit`` names and ``… and N more``."""
    shown = ", ".join(str(n) for n in names[:limit])
    return shown if len(names) <= limit else f"{shown} … and {len(names) - limit} more"


def rows_text(rows: Sequence[int], total: int) -> str:
    """``data rows 2, 5, 9`` (1-based, header not counted), marked when cut."""
    shown = ", ".join(str(r) for r in rows)
    word = "data row" if total == 1 else "data rows"
    return f"{word} {shown}" + (" … (the first five)" if total > len(rows) else "")


def value_order(value: str) -> tuple[int, float, str]:
    """Sort key of values found in a file: numbers in numeric order, then text."""
    try:
        return (0, float(value), value)
    except ValueError:
        return (1, 0.0, value)


@dataclass(frozen=True)
class Reading:
    """How a table is cut into batches: ``block_size`` bytes of CSV text, ``batch_rows`` rows of
    Parquet (``None``: about :data:`BATCH_BYTES` of float32 features per batch)."""

    block_size: int = CSV_BLOCK_BYTES
    batch_rows: int | None = None


#: The batches a node reads in.
DEFAULT_READING = Reading()


def is_csv(path: Path) -> bool:
    return path.suffix.lower() in CSV_SUFFIXES


def _unreadable(path: Path, err: Exception, field: str) -> ConfigError:
    reason = (str(err).splitlines() or [type(err).__name__])[0][:200]
    return ConfigError(field, f"cannot read table {path}: {reason}")


def column_names(path: Path, field: str) -> list[str]:
    """The columns of one CSV or Parquet file, in file order."""
    try:
        if is_csv(path):
            with pa_csv.open_csv(path, read_options=pa_csv.ReadOptions(block_size=1 << 16),
                                 convert_options=pa_csv.ConvertOptions(
                                     null_values=list(MISSING_MARKERS),
                                     strings_can_be_null=True)) as reader:
                return list(reader.schema.names)
        return list(pq.ParquetFile(path).schema_arrow.names)
    except (pa.ArrowException, OSError) as err:
        raise _unreadable(path, err, field) from err


def _supported(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return _supported(t.value_type)
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
                or pa.types.is_decimal(t) or pa.types.is_null(t) or pa.types.is_string(t)
                or pa.types.is_large_string(t))


def _clean(col: pa.Array) -> pa.Array:
    """A Parquet column as the CSV reader gives it: decoded, text as ``string``, the missing
    markers and NaN as nulls."""
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if pa.types.is_large_string(col.type):
        col = pc.cast(col, pa.string())
    if pa.types.is_string(col.type):
        marked = pc.is_in(col, value_set=_MARKERS)
        if pc.any(marked).as_py():
            col = pc.if_else(marked, pa.scalar(None, pa.string()), col)
    elif pa.types.is_floating(col.type):
        nan = pc.is_nan(col)
        if pc.any(nan).as_py():
            col = pc.if_else(nan, pa.scalar(None, col.type), col)
    return col


def batches(path: Path, names: Sequence[str], reading: Reading, field: str
            ) -> Iterator[pa.RecordBatch]:
    """The rows of ``path`` in batches: CSV columns as text, Parquet ones in their own type;
    missing cells as nulls either way."""
    try:
        if is_csv(path):
            convert = pa_csv.ConvertOptions(
                column_types={name: pa.string() for name in names},
                null_values=list(MISSING_MARKERS), strings_can_be_null=True,
                quoted_strings_can_be_null=True)
            with pa_csv.open_csv(path, read_options=pa_csv.ReadOptions(
                    block_size=reading.block_size), convert_options=convert) as reader:
                yield from reader
            return
        parquet = pq.ParquetFile(path, pre_buffer=False)  # pre-buffering holds whole files
        for name, t in zip(parquet.schema_arrow.names, parquet.schema_arrow.types, strict=True):
            if not _supported(t):
                raise ConfigError(field, f"{path}: column {name!r} has type {t}; a table's "
                                         "columns must hold numbers or text: convert or drop it")
        rows = reading.batch_rows or max(1024, BATCH_BYTES // (4 * max(1, len(names))))
        for batch in parquet.iter_batches(batch_size=rows):
            yield pa.RecordBatch.from_arrays([_clean(c) for c in batch.columns],
                                             names=batch.schema.names)
    except (pa.ArrowException, OSError) as err:
        raise _unreadable(path, err, field) from err


def missing_mask(batch: pa.RecordBatch, features: Sequence[str], label: str) -> np.ndarray:
    """The rows of ``batch`` with a missing feature or label."""
    mask = np.zeros(batch.num_rows, dtype=bool)
    for name in (*features, label):
        col = batch.column(name)
        if col.null_count:
            mask |= col.is_null().to_numpy(zero_copy_only=False)
    return mask


def is_text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t))


def as_text(col: pa.Array) -> pa.Array:
    """A column's cells as text (numbers as pyarrow prints them)."""
    return col if is_text(col.type) else pc.cast(col, pa.string())


def numbers(col: pa.Array, boolean: bool) -> pa.Array:
    """A numeric column as float64 (nulls kept): text parsed as numbers or, ``boolean``, as
    ``true``/``false``; booleans as 0/1."""
    if boolean and is_text(col.type):
        col = pc.cast(col, pa.bool_())
    return pc.cast(col, pa.float64())


class _Column:
    """What the scan gathers of one feature column of one file."""

    def __init__(self, name: str, listed: bool) -> None:
        self.name = name
        self.listed = listed
        self.text_source = True
        self.as_float = True
        self.as_bool = True
        self.missing = 0
        self.missing_rows: list[int] = []
        self.low = np.inf
        self.high = -np.inf
        self.nonfinite_row: int | None = None
        self.values: set[str] = set()
        self.overflow = False

    def add(self, col: pa.Array, row0: int) -> None:
        if col.null_count:
            self.missing += col.null_count
            if len(self.missing_rows) < ROWS_LISTED:
                idx = np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))
                self.missing_rows += [row0 + int(i) + 1 for i in
                                      idx[:ROWS_LISTED - len(self.missing_rows)]]
        if not is_text(col.type):
            self.text_source = self.as_bool = False
        parsed = self._parse(col)
        if parsed is not None and len(parsed) > parsed.null_count:
            low, high = pc.min_max(parsed).values()
            self.low, self.high = min(self.low, low.as_py()), max(self.high, high.as_py())
            finite = pc.is_finite(parsed).fill_null(True).to_numpy(zero_copy_only=False)
            bad = np.flatnonzero(~finite)
            if bad.size and self.nonfinite_row is None:
                self.nonfinite_row = row0 + int(bad[0]) + 1
        if (self.text_source or self.listed) and not self.overflow:
            self.values.update(str(v) for v in pc.unique(as_text(col).drop_null()).to_pylist())
            if len(self.values) > VALUES_KEPT:
                self.overflow = True
                self.values = set(sorted(self.values, key=value_order)[:VALUES_KEPT])

    def _parse(self, col: pa.Array) -> pa.Array | None:
        if not is_text(col.type):
            return numbers(col, False)
        parsed: pa.Array | None = None
        for boolean in (False, True):
            if not (self.as_bool if boolean else self.as_float):
                continue
            try:
                result = numbers(col, boolean)
            except pa.ArrowInvalid:
                if boolean:
                    self.as_bool = False
                else:
                    self.as_float = False
                continue
            parsed = result if parsed is None else parsed
        return parsed

    def result(self) -> ColumnScan:
        found = self.low <= self.high
        return ColumnScan(
            self.name, self.text_source, self.as_float or self.as_bool,
            not self.as_float and self.as_bool, self.missing, tuple(self.missing_rows),
            float(self.low) if found else None, float(self.high) if found else None,
            frozenset(self.values), self.overflow, self.nonfinite_row)


@dataclass(frozen=True)
class ColumnScan:
    """One feature column of one file: whether its cells are text (``text_source``), whether
    every present one is a number (``numeric``; ``boolean``: read as ``true``/``false``), the
    missing cells and their first data rows, the range of its numbers, the distinct text values
    found (at most :data:`VALUES_KEPT`; ``overflow``: more) and the first row of an inf/NaN."""

    name: str
    text_source: bool
    numeric: bool
    boolean: bool
    missing: int
    missing_rows: tuple[int, ...]
    low: float | None
    high: float | None
    values: frozenset[str]
    overflow: bool
    nonfinite_row: int | None


@dataclass(frozen=True)
class FileScan:
    """One file: its rows, those with a missing feature or label (``incomplete``), its label
    values and missing labels, and its feature columns in file order."""

    path: Path
    rows: int
    incomplete: int
    labels: frozenset[str]
    label_missing: int
    label_missing_rows: tuple[int, ...]
    columns: tuple[ColumnScan, ...]


@dataclass(frozen=True)
class TableScan:
    """The first pass over a table (a file or a folder of them)."""

    root: Path
    label_column: str
    files: tuple[FileScan, ...]
    feature_names: tuple[str, ...] = ()

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def incomplete(self) -> int:
        return sum(f.incomplete for f in self.files)

    @property
    def labels(self) -> tuple[str, ...]:
        """The label values found, numbers in numeric order."""
        return tuple(sorted(set().union(*(f.labels for f in self.files)), key=value_order))

    def of(self, name: str) -> list[ColumnScan]:
        """Column ``name`` of every file."""
        j = self.feature_names.index(name)
        return [f.columns[j] for f in self.files]

    def numeric(self, name: str) -> bool:
        return all(c.numeric for c in self.of(name))

    def boolean(self, name: str) -> bool:
        """Whether numeric column ``name`` is read as ``true``/``false`` (in some file)."""
        return any(c.boolean for c in self.of(name))

    def values(self, name: str) -> tuple[tuple[str, ...], bool]:
        """The distinct text values of ``name`` found in every file (sorted) and whether there
        are more than :data:`VALUES_KEPT`."""
        cols = self.of(name)
        found = sorted(set().union(*(c.values for c in cols)), key=value_order)
        more = any(c.overflow for c in cols) or len(found) > VALUES_KEPT
        return tuple(found[:VALUES_KEPT]), more


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


def check_label_column(path: Path, names: Sequence[str], label_column: str | None) -> str:
    """``label_column`` when ``path`` (whose columns are ``names``) has it; else one line naming
    the file, its columns and the setting."""
    if not label_column:
        raise ConfigError("label_column", f"{path}: no label column is set (its columns: "
                          f"{names_text(names)}); set label_column (--label-column NAME) to "
                          "the column that holds each row's class")
    if label_column not in names:
        raise ConfigError("label_column", f"{path} has no label column {label_column!r} (its "
                          f"columns: {names_text(names)}); set label_column (--label-column "
                          "NAME) to the column that holds each row's class")
    return label_column


def scan_table(root: Path, label_column: str | None, field: str, *,
               classes: Sequence[str] | None = None, listed: Collection[str] = (),
               reading: Reading = DEFAULT_READING) -> TableScan:
    """The first pass over the table ``root``: every file's rows, columns and cells.

    ``classes``: the run's class names (a label outside them is an error naming it); ``None``
    collects the label values found instead. ``listed``: the columns of ``categories``, whose
    values are gathered as text even where they are numbers. Refuses (one line naming the file)
    an unreadable file, one without the label column or without a feature, and files whose
    columns differ; missing cells and text columns are the caller's to judge."""
    if not label_column and not root.exists():
        raise ConfigError("label_column", "a table source needs label_column: the name of the "
                                          "column that holds each row's class")
    paths = table_files(root, field)
    scans: list[FileScan] = []
    first: list[str] | None = None
    for path in paths:
        names = column_names(path, field)
        label = check_label_column(path, names, label_column)
        if first is not None and names != first:
            raise ConfigError(field, f"{path} has columns {names_text(names)} but {paths[0]} "
                                     f"has {names_text(first)}; every file of a table must have "
                                     "the same columns in the same order")
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ConfigError(field, f"{path}: column {dup!r} appears twice; rename one")
        first = names
        features = [n for n in names if n != label]
        if not features:
            raise ConfigError(field, f"{path} has no feature column besides {label!r}")
        scans.append(_scan_file(path, features, label, field, classes, listed, reading))
    assert first is not None
    return TableScan(root, str(label_column), tuple(scans),
                     tuple(n for n in first if n != label_column))


def _scan_file(path: Path, features: Sequence[str], label: str, field: str,
               classes: Sequence[str] | None, listed: Collection[str],
               reading: Reading) -> FileScan:
    cols = [_Column(name, name in listed) for name in features]
    labels: set[str] = set()
    label_missing_rows: list[int] = []
    rows = incomplete = label_missing = 0
    for batch in batches(path, [*features, label], reading, field):
        for col, name in zip(cols, features, strict=True):
            col.add(batch.column(name), rows)
        label_col = batch.column(label)
        if label_col.null_count:
            label_missing += label_col.null_count
            idx = np.flatnonzero(label_col.is_null().to_numpy(zero_copy_only=False))
            label_missing_rows += [rows + int(i) + 1 for i in idx[:ROWS_LISTED]]
        found = {str(v) for v in pc.unique(as_text(label_col).drop_null()).to_pylist()}
        if classes is not None:
            class_labels(classes, sorted(found - labels, key=value_order), lambda value: (
                f"{path}: label {value!r} (column {label!r}) is not in classes "
                f"{list(classes)}; add it to the run's classes or drop those rows"))
        labels |= found
        if classes is None and len(labels) > VALUES_KEPT:
            raise ConfigError("label_column", f"{path}: label column {label!r} holds over "
                              f"{VALUES_KEPT} distinct values; is it the column of the class?")
        incomplete += int(missing_mask(batch, features, label).sum())
        rows += batch.num_rows
    return FileScan(path, rows, incomplete, frozenset(labels), label_missing,
                    tuple(label_missing_rows[:ROWS_LISTED]), tuple(c.result() for c in cols))
