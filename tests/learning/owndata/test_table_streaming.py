"""The streaming reader: batches of any size give the same arrays bit for bit, the held-out
split is the one of holdout_split, the rows share memory with their tensors, and a table larger
than the memory available is refused before it is allocated."""

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from dacflnode.errors import ConfigError
from dacflnode.learning.owndata import holdout_split, load_local_data, memory
from dacflnode.learning.owndata.tables import load_table
from dacflnode.learning.owndata.tablescan import Reading

WHOLE = Reading(block_size=1 << 26, batch_rows=1 << 20)
SMALL = Reading(block_size=1 << 12, batch_rows=37)
CATS = {"c": ["u", "v", "w"]}


def _table(n: int = 2000, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({
        "f": rng.normal(0, 3, n),
        "i": rng.integers(-1000, 1000, n),
        "c": pa.array(rng.choice(["u", "v", "w"], n)),
        "b": rng.random(n) > 0.5,
        "y": pa.array(rng.choice(["a", "b", "c"], n)),
    })


def _write(tmp_path, table):
    pa_csv.write_csv(table, tmp_path / "t.csv")
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=300)
    return tmp_path / "t.csv", tmp_path / "t.parquet"


@pytest.mark.parametrize("holdout", [0.0, 0.2])
def test_small_batches_give_the_whole_reads_arrays_bit_for_bit(tmp_path, holdout):
    csv, parquet = _write(tmp_path, _table())
    assert pa_csv.open_csv(csv, read_options=pa_csv.ReadOptions(block_size=1 << 12)) \
        .read_next_batch().num_rows < 2000  # really several batches
    for path in (csv, parquet):
        one = load_table(path, ["a", "b", "c"], "y", "data_root", categories=CATS,
                         holdout=holdout, seed=4, reading=WHOLE)
        many = load_table(path, ["a", "b", "c"], "y", "data_root", categories=CATS,
                          holdout=holdout, seed=4, reading=SMALL)
        assert one.features.tobytes() == many.features.tobytes()
        assert one.labels.tobytes() == many.labels.tobytes()
        if holdout:
            assert one.test_features is not None and many.test_features is not None
            assert one.test_features.tobytes() == many.test_features.tobytes()
    a = load_table(csv, ["a", "b", "c"], "y", "data_root", categories=CATS, reading=SMALL)
    b = load_table(parquet, ["a", "b", "c"], "y", "data_root", categories=CATS, reading=SMALL)
    assert a.features.tobytes() == b.features.tobytes()


def test_the_numbers_are_the_files_numbers_as_float32(tmp_path):
    table = _table(500)
    csv, _ = _write(tmp_path, table)
    got = load_table(csv, ["a", "b", "c"], "y", "data_root", categories=CATS, reading=SMALL)
    assert got.feature_names == ("f", "i", "c=u", "c=v", "c=w", "b")
    np.testing.assert_array_equal(got.features[:, 0],
                                  np.asarray(table["f"], dtype=np.float64).astype(np.float32))
    np.testing.assert_array_equal(got.features[:, 1], np.asarray(table["i"]).astype(np.float32))
    np.testing.assert_array_equal(got.features[:, 5], np.asarray(table["b"]).astype(np.float32))


def test_the_held_out_split_is_holdout_splits_on_the_whole_table(tmp_path):
    table = _table(999, seed=1)
    csv, parquet = _write(tmp_path, table)
    whole = load_table(csv, ["a", "b", "c"], "y", "data_root", categories=CATS)
    train, test = holdout_split(999, 0.2, 7)
    for path in (csv, parquet):
        data = load_local_data("table", path, classes=["a", "b", "c"], label_column="y",
                               categories=CATS, holdout=0.2, seed=7)
        x, y = data.train_x.reshape(-1, 6).numpy(), data.train_y.numpy()
        assert x.tobytes() == whole.features[train].tobytes()
        assert y.tolist() == whole.labels[train].tolist()
        assert data.test_x.reshape(-1, 6).numpy().tobytes() == whole.features[test].tobytes()
        assert data.test_source.startswith("0.2 of")


def test_rows_are_tensors_sharing_memory_with_the_arrays(tmp_path, monkeypatch):
    from dacflnode.learning.owndata import tables

    csv, _ = _write(tmp_path, _table(50))
    read: list[tables.TableData] = []
    load = tables.load_table

    def reading(*args, **kwargs):
        read.append(load(*args, **kwargs))
        return read[-1]

    monkeypatch.setattr(tables, "load_table", reading)
    data = load_local_data("table", csv, classes=["a", "b", "c"], label_column="y",
                           categories=CATS, holdout=0.2)
    (table,) = read
    assert tuple(data.train_x.shape) == (40, 1, 1, 6) and tuple(data.test_x.shape) == (10, 1, 1, 6)
    assert data.train_x.data_ptr() == table.features.ctypes.data
    assert table.test_features is not None
    assert data.test_x.data_ptr() == table.test_features.ctypes.data


def test_a_table_larger_than_the_memory_available_is_refused_before_it_is_read(
        tmp_path, monkeypatch):
    csv, _ = _write(tmp_path, _table(100))
    monkeypatch.setattr(memory, "available_memory", lambda: 1000)
    with pytest.raises(ConfigError) as err:
        load_table(csv, ["a", "b", "c"], "y", "data_root", categories=CATS)
    text = str(err.value)
    assert str(csv) in text and "100 rows x 6 features" in text
    assert "GiB available" in text and "\n" not in text


def test_available_memory_reads_mem_available(tmp_path, monkeypatch):
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       16000000 kB\nMemAvailable:    2048 kB\n")
    monkeypatch.setattr(memory, "MEMINFO", info)
    assert memory.available_memory() == 2048 * 1024
