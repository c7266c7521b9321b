"""A table's text columns: one-hot encoded with the run's category lists, in the listed order,
named column=value where the column was; unknown values, unlisted columns and the other bucket."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dacflnode.config.own_data import MISSING, OTHER_CATEGORY
from dacflnode.errors import ConfigError
from dacflnode.learning.owndata import load_local_data
from dacflnode.learning.owndata.tables import MISSING_POLICIES, load_table
from dacflnode.learning.owndata.tables import OTHER_CATEGORY as TABLE_OTHER
from tests.harness.owndata import write_csv

HEADER = ["width", "colour", "size", "kind"]
ROWS = [[1.5, "red", 3, "a"], [2.5, "blue", 1, "b"], [0.5, "green", 3, "a"], [4.0, "red", 2, "b"]]


def test_a_text_column_is_one_hot_in_the_listed_order_where_the_column_was(tmp_path):
    path = write_csv(tmp_path / "t.csv", HEADER, ROWS)
    data = load_local_data("table", path, classes=["a", "b"], label_column="kind",
                           categories={"colour": ["red", "green", "blue"]})
    assert data.contract.feature_names == (
        "width", "colour=red", "colour=green", "colour=blue", "size")
    assert data.contract.input_shape == (5,)
    x = data.train_x.reshape(4, 5).numpy()
    np.testing.assert_array_equal(x[:, 1:4], [[1, 0, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0]])
    np.testing.assert_array_equal(x[:, 0], [1.5, 2.5, 0.5, 4.0])
    np.testing.assert_array_equal(x[:, 4], [3, 1, 3, 2])
    assert data.numeric_features == (0, 4)


def test_numeric_features_index_the_numbers_among_one_hot_groups(tmp_path):
    path = write_csv(tmp_path / "t.csv", ["c1", "n1", "c2", "n2", "n3", "y"],
                     [["u", 1, "p", 2, 3, "a"], ["v", 4, "q", 5, 6, "a"]])
    table = load_table(path, ["a"], "y", "data_root",
                       categories={"c1": ["u", "v"], "c2": ["q", "p", "r"]})
    assert table.feature_names == ("c1=u", "c1=v", "n1", "c2=q", "c2=p", "c2=r", "n2", "n3")
    assert table.numeric_features == (2, 6, 7)
    np.testing.assert_array_equal(table.features[:, table.numeric_features], [[1, 2, 3],
                                                                              [4, 5, 6]])


def test_a_numeric_column_listed_in_categories_is_one_hot_by_its_text(tmp_path):
    path = write_csv(tmp_path / "t.csv", HEADER, ROWS)
    table = load_table(path, ["a", "b"], "kind", "data_root",
                       categories={"colour": ["red", "green", "blue"], "size": ["1", "2", "3"]})
    assert table.feature_names[-3:] == ("size=1", "size=2", "size=3")
    np.testing.assert_array_equal(table.features[:, -3:], [[0, 0, 1], [1, 0, 0], [0, 0, 1],
                                                           [0, 1, 0]])
    assert table.numeric_features == (0,)


def test_parquet_text_and_dictionary_columns_encode_as_csv_does(tmp_path):
    csv = write_csv(tmp_path / "t.csv", HEADER, ROWS)
    columns = list(zip(*ROWS, strict=True))
    table = pa.table({"width": pa.array(columns[0], pa.float64()),
                      "colour": pa.array(columns[1]).dictionary_encode(),
                      "size": pa.array(columns[2], pa.int32()), "kind": pa.array(columns[3])})
    pq.write_table(table, tmp_path / "t.parquet")
    cats = {"colour": ["red", "green", "blue"]}
    a = load_table(csv, ["a", "b"], "kind", "data_root", categories=cats)
    b = load_table(tmp_path / "t.parquet", ["a", "b"], "kind", "data_root", categories=cats)
    assert a.feature_names == b.feature_names
    assert a.features.tobytes() == b.features.tobytes()
    assert a.labels.tolist() == b.labels.tolist() == [0, 1, 0, 1]


def test_a_value_not_listed_is_one_line_naming_file_column_value_and_setting(tmp_path):
    path = write_csv(tmp_path / "t.csv", HEADER, ROWS)
    with pytest.raises(ConfigError) as err:
        load_table(path, ["a", "b"], "kind", "data_root",
                   categories={"colour": ["red", "blue"]})
    text = str(err.value)
    assert err.value.field == "categories" and "\n" not in text
    assert str(path) in text and "'colour'" in text and "'green'" in text
    assert "categories" in err.value.message and "other_category" in err.value.message


def test_other_category_takes_the_values_not_listed(tmp_path):
    path = write_csv(tmp_path / "t.csv", HEADER, ROWS)
    table = load_table(path, ["a", "b"], "kind", "data_root",
                       categories={"colour": ["red", "blue"]}, other_category=True)
    assert table.feature_names[1:4] == ("colour=red", "colour=blue", f"colour={TABLE_OTHER}")
    np.testing.assert_array_equal(table.features[:, 1:4], [[1, 0, 0], [0, 1, 0], [0, 0, 1],
                                                           [1, 0, 0]])


def test_a_text_column_without_categories_names_it_and_says_where_to_list_it(tmp_path):
    path = write_csv(tmp_path / "t.csv", HEADER, ROWS)
    with pytest.raises(ConfigError) as err:
        load_local_data("table", path, classes=["a", "b"], label_column="kind")
    text = str(err.value)
    assert err.value.field == "categories" and "\n" not in text
    assert "'colour'" in text and "categories" in err.value.message
    assert "dacflnode data check" in text and str(path) in text


def test_text_found_only_in_a_late_block_still_makes_the_column_text(tmp_path):
    rows = [[i, "a"] for i in range(3000)] + [["n/a?", "a"]]
    path = write_csv(tmp_path / "t.csv", ["x", "y"], rows)
    with pytest.raises(ConfigError, match="'x' is not numeric"):
        load_table(path, ["a"], "y", "data_root", reading=_small())


def test_categories_naming_a_missing_or_the_label_column_are_refused(tmp_path):
    path = write_csv(tmp_path / "t.csv", HEADER, ROWS)
    cats = {"colour": ["red", "green", "blue"]}
    with pytest.raises(ConfigError, match=r"'shade'.*its columns: width, colour, size"):
        load_table(path, ["a", "b"], "kind", "data_root", categories={**cats, "shade": ["x"]})
    with pytest.raises(ConfigError, match="label column 'kind'"):
        load_table(path, ["a", "b"], "kind", "data_root", categories={**cats, "kind": ["a"]})


def test_the_settings_and_the_reader_name_the_same_policies_and_bucket():
    assert MISSING == MISSING_POLICIES
    assert OTHER_CATEGORY == TABLE_OTHER


def _small():
    from dacflnode.learning.owndata.tablescan import Reading

    return Reading(block_size=1 << 12, batch_rows=7)
