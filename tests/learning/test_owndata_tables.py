"""Tables: CSV and Parquet through pyarrow, labels by name, numeric features only."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from dacflnode.errors import ConfigError
from dacflnode.learning.models import build_model, default_model_for_shape
from dacflnode.learning.owndata import load_local_data, model_input_shape
from tests.learning.owndata_files import write_csv

ROWS = [[1.5, 2, "setosa"], [0.5, 3, "virginica"], [2.5, 4, "setosa"], [3.0, -1, "versicolor"]]


def test_a_csv_loads_with_labels_by_name_and_features_in_file_order(tmp_path):
    path = write_csv(tmp_path / "d.csv", ["width", "height", "species"], ROWS)
    data = load_local_data("table", path, classes=["virginica", "setosa", "versicolor"],
                           label_column="species")
    assert data.contract.form == "table"
    assert data.contract.input_shape == (2,)
    assert data.contract.feature_names == ("width", "height")
    assert tuple(data.train_x.shape) == (4, 1, 1, 2)
    assert data.train_y.tolist() == [1, 0, 1, 2]
    torch.testing.assert_close(data.train_x[:, 0, 0, 1], torch.tensor([2.0, 3.0, 4.0, -1.0]))
    assert data.histogram == {"virginica": 1, "setosa": 2, "versicolor": 1}


def test_numeric_labels_are_compared_as_strings(tmp_path):
    path = write_csv(tmp_path / "d.csv", ["x", "y"], [[0.1, 1], [0.2, 0], [0.3, 1]])
    data = load_local_data("table", path, classes=["0", "1"], label_column="y")
    assert data.train_y.tolist() == [1, 0, 1]


def test_parquet_and_a_folder_of_files_give_the_same_rows_as_csv(tmp_path):
    csv = write_csv(tmp_path / "one.csv", ["width", "height", "species"], ROWS)
    table = pa.table({"width": [r[0] for r in ROWS], "height": [r[1] for r in ROWS],
                      "species": [r[2] for r in ROWS]})
    pq.write_table(table, tmp_path / "one.parquet")
    classes = ["setosa", "versicolor", "virginica"]
    from_csv = load_local_data("table", csv, classes=classes, label_column="species")
    from_pq = load_local_data("table", tmp_path / "one.parquet", classes=classes,
                              label_column="species")
    assert torch.equal(from_csv.train_x, from_pq.train_x)
    assert torch.equal(from_csv.train_y, from_pq.train_y)
    folder = tmp_path / "parts"
    write_csv(folder / "a.csv", ["width", "height", "species"], ROWS[:2])
    write_csv(folder / "b.csv", ["width", "height", "species"], ROWS[2:])
    from_folder = load_local_data("table", folder, classes=classes, label_column="species")
    assert torch.equal(from_folder.train_x, from_csv.train_x)
    assert from_folder.files == 2


def test_a_missing_label_column_is_one_line_naming_the_file(tmp_path):
    path = write_csv(tmp_path / "d.csv", ["width", "height", "kind"], ROWS)
    with pytest.raises(ConfigError) as err:
        load_local_data("table", path, classes=["setosa"], label_column="species")
    assert err.value.field == "label_column"
    assert str(path) in str(err.value) and "'species'" in str(err.value)
    assert "\n" not in str(err.value)


def test_no_label_column_setting_is_an_error():
    with pytest.raises(ConfigError) as err:
        load_local_data("table", "x.csv", classes=["a"])
    assert err.value.field == "label_column"


def test_a_non_numeric_feature_is_one_line_naming_column_and_file(tmp_path):
    path = write_csv(tmp_path / "d.csv", ["width", "colour", "species"],
                     [[1, "red", "setosa"], [2, "blue", "setosa"]])
    with pytest.raises(ConfigError) as err:
        load_local_data("table", path, classes=["setosa"], label_column="species")
    assert "'colour'" in str(err.value) and str(path) in str(err.value)
    assert "not numeric" in str(err.value) and "\n" not in str(err.value)


def test_missing_feature_values_are_an_error(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("x,y\n1,a\n,a\n")
    with pytest.raises(ConfigError, match="missing values"):
        load_local_data("table", path, classes=["a"], label_column="y")


def test_a_label_not_in_classes_is_an_error(tmp_path):
    path = write_csv(tmp_path / "d.csv", ["width", "height", "species"], ROWS)
    with pytest.raises(ConfigError) as err:
        load_local_data("table", path, classes=["setosa", "virginica"], label_column="species")
    assert err.value.field == "classes" and "'versicolor'" in str(err.value)


def test_files_of_one_table_must_have_the_same_columns(tmp_path):
    write_csv(tmp_path / "a.csv", ["x", "y", "label"], [[1, 2, "a"]])
    write_csv(tmp_path / "b.csv", ["y", "x", "label"], [[1, 2, "a"]])
    with pytest.raises(ConfigError, match="same columns in the same order"):
        load_local_data("table", tmp_path, classes=["a"], label_column="label")


def test_an_empty_table_and_a_folder_without_tables_are_errors(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("x,label\n")
    with pytest.raises(ConfigError, match="no rows"):
        load_local_data("table", path, classes=["a"], label_column="label")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"holds no \.csv"):
        load_local_data("table", tmp_path / "empty", classes=["a"], label_column="label")


def test_held_out_rows_and_a_test_file(tmp_path):
    rows = [[i, i % 2] for i in range(20)]
    train = write_csv(tmp_path / "train.csv", ["x", "label"], rows)
    test = write_csv(tmp_path / "test.csv", ["x", "label"], rows[:3])
    held = load_local_data("table", train, classes=["0", "1"], label_column="label",
                           holdout=0.2, seed=1)
    assert held.train_size == 16 and held.test_size == 4
    assert sorted(held.train_x.flatten().tolist() + held.test_x.flatten().tolist()) == \
        [float(i) for i in range(20)]
    with_test = load_local_data("table", train, classes=["0", "1"], label_column="label",
                                test_root=test, holdout=0.2)
    assert with_test.train_size == 20 and with_test.test_size == 3


def test_the_default_model_for_a_table_is_an_mlp_over_its_features(tmp_path):
    path = write_csv(tmp_path / "d.csv", ["width", "height", "species"], ROWS)
    data = load_local_data("table", path, classes=["setosa", "versicolor", "virginica"],
                           label_column="species")
    name = default_model_for_shape(data.contract.input_shape)
    assert name == "mlp"
    model = build_model(name, data.contract.input_shape, data.num_classes)
    assert tuple(model(data.train_x).shape) == (4, 3)
    assert model_input_shape(data.contract.input_shape) == data.input_shape


def test_default_models_for_image_shapes():
    assert default_model_for_shape((1, 28, 28)) == "fmnist-cnn"
    assert default_model_for_shape((3, 32, 32)) == "cifar-cnn"
    assert default_model_for_shape((1, 1, 7)) == "mlp"
    assert default_model_for_shape((1, 2, 2)) == "mlp"
