"""data split: one device folder (or table) per node; split then load gives back the source."""

import struct

import numpy as np
import pytest
import torch
import yaml

from dacflnode.errors import ConfigError
from dacflnode.learning.owndata import load_local_data
from dacflnode.learning.owndata.split import CLASS_NAMES, split_data
from tests.harness.owndata import pixels_of, write_csv, write_images


def write_idx(path, array):
    codes = {np.dtype(np.uint8): 0x08}
    header = struct.pack(">BBBB", 0, 0, codes[array.dtype], array.ndim)
    path.write_bytes(header + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes())


@pytest.fixture
def tiny_mnist(tmp_path):
    """A 60-image MNIST-shaped data set in IDX files (train) and 10 test images."""
    rng = np.random.default_rng(0)
    root = tmp_path / "mnist"
    root.mkdir()
    x = rng.integers(0, 256, (60, 28, 28), dtype=np.uint8)
    y = (np.arange(60) % 10).astype(np.uint8)
    tx = rng.integers(0, 256, (10, 28, 28), dtype=np.uint8)
    ty = np.arange(10, dtype=np.uint8)
    for name, arr in (("train-images-idx3-ubyte", x), ("train-labels-idx1-ubyte", y),
                      ("t10k-images-idx3-ubyte", tx), ("t10k-labels-idx1-ubyte", ty)):
        write_idx(root / name, arr)
    return root, x, y


def test_a_built_in_data_set_splits_into_node_folders_that_load_back_exactly(
    tmp_path, tiny_mnist
):
    root, x, y = tiny_mnist
    out = tmp_path / "devices"
    result = split_data("mnist", out, nodes=3, scheme="shards", seed=1, data_root=root)
    assert result.nodes == ("node-0", "node-1", "node-2")
    assert result.test_count == 10
    settings = yaml.safe_load((out / "run-data.yaml").read_text())
    assert settings == {"dataset": "folder", "classes": list(CLASS_NAMES["mnist"]),
                        "channels": 1, "image_size": 28}
    seen: list[int] = []
    for node, counts in zip(result.nodes, result.counts, strict=True):
        data = load_local_data("folder", out / node, classes=settings["classes"])
        assert data.histogram == counts
        # files are named by their index in the source: pixels and labels come back as they were
        files = sorted((out / node).rglob("*.png"), key=lambda p: (p.parent.name, p.name))
        index = [int(p.stem) for p in files]
        seen += index
        assert np.array_equal(pixels_of(data.train_x)[:, 0], x[index])
        assert data.train_y.tolist() == y[index].tolist()
    assert sorted(seen) == list(range(60))
    test = load_local_data("folder", out / "test", classes=settings["classes"])
    assert test.train_size == 10


def test_an_image_folder_is_copied_into_node_folders(tmp_path):
    written = write_images(tmp_path / "src", {"b": 6, "a": 6})
    out = tmp_path / "out"
    result = split_data(str(tmp_path / "src"), out, nodes=2, scheme="iid", seed=0)
    assert result.classes == ("a", "b") and result.test_count == 0
    total = 0
    for node in result.nodes:
        data = load_local_data("folder", out / node, classes=["a", "b"])
        total += data.train_size
        for path in (out / node / "a").iterdir():
            src = (tmp_path / "src" / "a" / path.name).read_bytes()
            assert path.read_bytes() == src
    assert total == 12 and written


def test_a_table_splits_into_node_tables_with_the_same_rows(tmp_path):
    rows = [[i, i * 0.5, ["x", "y", "z"][i % 3]] for i in range(30)]
    src = write_csv(tmp_path / "t.csv", ["a", "b", "kind"], rows)
    out = tmp_path / "out"
    result = split_data(str(src), out, nodes=3, scheme="dirichlet", alpha=1.0, fmt="table",
                        label_column="kind", seed=2)
    assert result.run_settings == {"dataset": "table", "classes": ["x", "y", "z"],
                                   "label_column": "kind"}
    got = []
    for node in result.nodes:
        data = load_local_data("table", out / node / "data.csv", classes=["x", "y", "z"],
                               label_column="kind")
        assert data.contract.feature_names == ("a", "b")
        got += data.train_x[:, 0, 0, 0].tolist()
    assert sorted(got) == [float(i) for i in range(30)]


def test_a_built_in_set_splits_into_parquet_tables(tmp_path):
    out = tmp_path / "out"
    split_data("synthetic", out, nodes=2, fmt="table", table_format="parquet")
    data = load_local_data("table", out / "node-0" / "data.parquet",
                           classes=list(CLASS_NAMES["synthetic"]), label_column="label",
                           test_root=out / "test")
    assert data.contract.input_shape == (64,) and data.train_size == 1000
    assert data.test_size == 500
    assert torch.isfinite(data.train_x).all()


def test_split_never_writes_into_a_folder_that_holds_something(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError) as err:
        split_data("synthetic", tmp_path / "out", nodes=2, fmt="table")
    assert err.value.field == "out"
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_feature_rows_cannot_be_written_as_image_folders(tmp_path):
    with pytest.raises(ConfigError, match="use --format table"):
        split_data("synthetic", tmp_path / "out", nodes=2, fmt="folder")


def test_an_unknown_source_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="neither a built-in data set"):
        split_data(str(tmp_path / "nothing"), tmp_path / "out", nodes=2)


def test_a_folder_written_from_fashion_mnist_loads_to_the_built_in_tensors_bit_for_bit(
    tmp_path, tiny_mnist
):
    from dacflnode.learning.datasets import load_dataset

    root, _, _ = tiny_mnist  # the same IDX layout serves as Fashion-MNIST files
    builtin = load_dataset("fashion-mnist", root)
    out = tmp_path / "devices"
    split_data("fashion-mnist", out, nodes=2, scheme="iid", seed=0, data_root=root)
    for node in ("node-0", "node-1"):
        data = load_local_data("folder", out / node,
                               classes=list(CLASS_NAMES["fashion-mnist"]))
        files = sorted((out / node).rglob("*.png"), key=lambda p: (p.parent.name, p.name))
        index = [int(p.stem) for p in files]
        assert torch.equal(data.train_x, builtin.train_x[index])
