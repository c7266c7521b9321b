"""A table's missing cells: the markers, and the policies fail (one line naming the rows), drop
(rows left out and counted) and mean (numbers kept as NaN, text as all-zero one-hot)."""

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dacflnode.errors import ConfigError
from dacflnode.learning.owndata import load_local_data
from dacflnode.learning.owndata.tables import MISSING_MARKERS, load_table

CATS = {"c": ["p", "q"]}


def _csv(tmp_path, text):
    path = tmp_path / "t.csv"
    path.write_text(text)
    return path


@pytest.mark.parametrize("marker", MISSING_MARKERS)
def test_every_marker_is_a_missing_cell_in_a_numeric_and_a_text_column(tmp_path, marker):
    path = _csv(tmp_path, f"x,c,y\n1,p,a\n{marker},q,a\n3,{marker},a\n")
    table = load_table(path, ["a"], "y", "data_root", categories=CATS, missing="mean")
    x = table.features
    assert math.isnan(x[1, 0]) and x[1, 1:].tolist() == [0, 1]
    assert x[2, 0] == 3 and x[2, 1:].tolist() == [0, 0]


def test_fail_names_the_file_the_column_the_first_five_rows_and_the_setting(tmp_path):
    rows = "".join(f"{'' if i in (2, 4, 5, 7, 8, 11) else i},p,a\n" for i in range(1, 13))
    path = _csv(tmp_path, "x,c,y\n" + rows)
    with pytest.raises(ConfigError) as err:
        load_table(path, ["a"], "y", "data_root", categories=CATS)
    text = str(err.value)
    assert err.value.field == "missing" and "\n" not in text
    assert str(path) in text and "'x'" in text
    assert "data rows 2, 4, 5, 7, 8 … (the first five)" in text and "6 in all" in text
    assert "missing: drop" in text and "mean" in text


def test_drop_leaves_incomplete_rows_out_and_counts_them(tmp_path):
    path = _csv(tmp_path, "x,c,y\n1,p,a\nNA,q,b\n3,,a\n4,q,\n5,q,b\n")
    table = load_table(path, ["a", "b"], "y", "data_root", categories=CATS, missing="drop")
    assert table.dropped == 3 and table.rows == 5
    assert table.features[:, 0].tolist() == [1, 5] and table.labels.tolist() == [0, 1]
    data = load_local_data("table", path, classes=["a", "b"], label_column="y",
                           categories=CATS, missing="drop")
    assert data.dropped == 3 and data.train_size == 2 and data.summary()["dropped"] == 3


def test_drop_with_a_holdout_splits_the_rows_kept(tmp_path):
    lines = [f"{'' if i % 5 == 0 else i},p,{'ab'[i % 2]}" for i in range(40)]
    path = _csv(tmp_path, "x,c,y\n" + "\n".join(lines) + "\n")
    data = load_local_data("table", path, classes=["a", "b"], label_column="y",
                           categories=CATS, missing="drop", holdout=0.25, seed=3)
    assert data.dropped == 8 and data.train_size + data.test_size == 32
    assert data.test_size == 8
    kept = sorted(data.train_x[:, 0, 0, 0].tolist() + data.test_x[:, 0, 0, 0].tolist())
    assert kept == [float(i) for i in range(40) if i % 5]


def test_mean_keeps_numeric_gaps_as_nan_and_leaves_filling_to_the_network(tmp_path):
    path = _csv(tmp_path, "x,z,y\n1,,a\nNaN,2,a\n3,4,a\n")
    data = load_local_data("table", path, classes=["a"], label_column="y", missing="mean")
    x = data.train_x.reshape(3, 2).numpy()
    assert x.dtype == np.float32
    assert np.isnan(x[0, 1]) and np.isnan(x[1, 0])
    assert x[2].tolist() == [3, 4] and data.dropped == 0


def test_a_missing_label_is_refused_unless_drop(tmp_path):
    path = _csv(tmp_path, "x,y\n1,a\n2,\n3,a\n")
    for policy in ("fail", "mean"):
        with pytest.raises(ConfigError) as err:
            load_table(path, ["a"], "y", "data_root", missing=policy)
        assert "label column 'y'" in str(err.value) and "data row 2" in str(err.value)
        assert "missing: drop" in str(err.value) and "\n" not in str(err.value)
    assert load_table(path, ["a"], "y", "data_root", missing="drop").dropped == 1


def test_parquet_nulls_nan_and_marker_text_are_missing(tmp_path):
    table = pa.table({"x": pa.array([1.0, None, float("nan"), 4.0]),
                      "c": pa.array(["p", "NA", "q", None]),
                      "y": pa.array(["a", "a", "a", "a"])})
    pq.write_table(table, tmp_path / "t.parquet")
    out = load_table(tmp_path / "t.parquet", ["a"], "y", "data_root", categories=CATS,
                     missing="drop")
    assert out.dropped == 3 and out.features.tolist() == [[1, 1, 0]]


def test_an_unknown_policy_and_inf_are_refused(tmp_path):
    path = _csv(tmp_path, "x,y\n1,a\ninf,a\n")
    with pytest.raises(ConfigError, match="fail, drop, mean"):
        load_table(path, ["a"], "y", "data_root", missing="zero")
    with pytest.raises(ConfigError, match=r"'x' holds inf or NaN \(data row 2\)"):
        load_table(path, ["a"], "y", "data_root")


def test_drop_that_leaves_no_row_says_so(tmp_path):
    path = _csv(tmp_path, "x,y\n,a\nNA,a\n")
    with pytest.raises(ConfigError, match="each of its 2 rows has a missing cell"):
        load_table(path, ["a"], "y", "data_root", missing="drop")
