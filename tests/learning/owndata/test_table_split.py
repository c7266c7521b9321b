"""data split of a table: the nodes' tables keep the source's columns, their order and types."""

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from dacflnode.errors import ConfigError
from dacflnode.learning.owndata.split import split_data

SOURCE = pa.table({
    "id": pa.array(range(12), pa.int64()),
    "kind": pa.array(["x", "y", "z"] * 4),
    "colour": pa.array(["red", "blue", None, "red"] * 3),
    "w": pa.array([0.5 * i for i in range(12)], pa.float64()),
})


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_a_split_table_keeps_its_columns_in_order_with_their_types(tmp_path, fmt):
    src = tmp_path / "src.parquet"
    pq.write_table(SOURCE, src)
    result = split_data(str(src), tmp_path / "out", nodes=3, fmt="table", table_format=fmt,
                        label_column="kind")
    parts = []
    for node in result.nodes:
        path = tmp_path / "out" / node / f"data.{'csv' if fmt == 'csv' else 'parquet'}"
        part = pq.read_table(path) if fmt == "parquet" else pa_csv.read_csv(
            path, convert_options=pa_csv.ConvertOptions(strings_can_be_null=True))
        assert part.column_names == ["id", "kind", "colour", "w"]
        parts.append(part)
    whole = pa.concat_tables(parts).sort_by("id")
    assert whole["id"].to_pylist() == list(range(12))
    assert whole["colour"].to_pylist() == SOURCE["colour"].to_pylist()
    assert whole["w"].to_pylist() == SOURCE["w"].to_pylist()
    if fmt == "parquet":
        assert whole.schema == SOURCE.schema
    else:
        assert whole.schema.field("id").type == pa.int64()
        assert whole.schema.field("colour").type == pa.string()


def test_a_table_without_the_label_column_is_one_line_naming_its_columns(tmp_path):
    src = tmp_path / "src.csv"
    pa_csv.write_csv(SOURCE, src)
    with pytest.raises(ConfigError) as err:
        split_data(str(src), tmp_path / "out", nodes=2, fmt="table")
    text = str(err.value)
    assert err.value.field == "label_column" and "\n" not in text
    assert str(src) in text and "'label'" in text and "id, kind, colour, w" in text
    assert "--label-column" in text


def test_a_source_row_without_a_label_is_one_line_naming_the_rows(tmp_path):
    src = tmp_path / "src.csv"
    src.write_text("w,kind\n1,x\n2,\n3,y\n4,NA\n")
    with pytest.raises(ConfigError) as err:
        split_data(str(src), tmp_path / "out", nodes=2, fmt="table", label_column="kind")
    text = str(err.value)
    assert "data rows 2, 4" in text and "(2 in all)" in text and "\n" not in text
    assert not (tmp_path / "out").exists()
