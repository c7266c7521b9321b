"""Loading Fashion-MNIST, MNIST, CIFAR-10 and the synthetic dataset."""

from __future__ import annotations

import gzip
import struct
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from dacflnode.errors import ConfigError
from dacflnode.learning import datasets
from dacflnode.learning.datasets import (
    DATASETS,
    DEFAULT_FASHION_MNIST_ROOT,
    NORMALIZATION,
    Dataset,
    load_dataset,
    read_idx,
)

IDX_CODES = {np.uint8: 0x08, np.int8: 0x09, np.int16: 0x0B, np.int32: 0x0C, np.float32: 0x0D}


def idx_bytes(arr: np.ndarray) -> bytes:
    """``arr`` in the IDX on-disk format: 0, 0, dtype code, ndim, big-endian dims and data."""
    code = IDX_CODES[arr.dtype.type]
    header = struct.pack(">BBBB", 0, 0, code, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


def write_idx(path: Path, arr: np.ndarray, *, compress: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = idx_bytes(arr)
    if compress:
        path = path.with_name(path.name + ".gz")
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


def write_idx_dataset(
    directory: Path, *, compress: bool, n_train: int = 12, n_test: int = 5, seed: int = 0
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    for name, arr in arrays.items():
        write_idx(directory / name, arr, compress=compress)
    return arrays


def expected_images(raw: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """uint8 ``[n, C, H, W]`` normalised the straightforward way."""
    m = np.asarray(mean, dtype=np.float64).reshape(1, -1, 1, 1)
    s = np.asarray(std, dtype=np.float64).reshape(1, -1, 1, 1)
    return (raw.astype(np.float64) / 255.0 - m) / s


def check_idx_dataset(ds: Dataset, arrays: dict[str, np.ndarray], key: str) -> None:
    mean, std = NORMALIZATION[key]
    assert ds.name == key
    assert ds.num_classes == 10
    assert ds.input_shape == (1, 28, 28)
    assert ds.train_x.dtype == torch.float32 and ds.test_x.dtype == torch.float32
    assert ds.train_y.dtype == torch.int64 and ds.test_y.dtype == torch.int64
    train_raw = arrays["train-images-idx3-ubyte"][:, None]
    test_raw = arrays["t10k-images-idx3-ubyte"][:, None]
    np.testing.assert_allclose(ds.train_x.numpy(), expected_images(train_raw, mean, std), atol=1e-5)
    np.testing.assert_allclose(ds.test_x.numpy(), expected_images(test_raw, mean, std), atol=1e-5)
    np.testing.assert_array_equal(ds.train_y.numpy(), arrays["train-labels-idx1-ubyte"])
    np.testing.assert_array_equal(ds.test_y.numpy(), arrays["t10k-labels-idx1-ubyte"])


# --------------------------------------------------------------------------------------------
# IDX reader


@pytest.mark.parametrize("compress", [False, True], ids=["raw", "gzip"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32])
def test_read_idx_round_trips_every_dtype_raw_and_gzipped(
    tmp_path: Path, dtype: type, compress: bool
) -> None:
    arr: np.ndarray = (np.arange(2 * 3 * 4) - 7).reshape(2, 3, 4).astype(dtype)
    path = write_idx(tmp_path / "x-idx3", arr, compress=compress)
    out = read_idx(path)
    assert out.dtype == np.dtype(dtype)
    assert out.dtype.isnative
    np.testing.assert_array_equal(out, arr)


def test_read_idx_rejects_a_bad_magic_number(tmp_path: Path) -> None:
    path = tmp_path / "bad"
    path.write_bytes(b"\x01\x00\x08\x01" + struct.pack(">I", 3) + b"abc")
    with pytest.raises(ValueError, match="magic number"):
        read_idx(path)


def test_read_idx_rejects_an_unknown_dtype_code(tmp_path: Path) -> None:
    path = tmp_path / "bad"
    path.write_bytes(b"\x00\x00\x07\x01" + struct.pack(">I", 3) + b"abc")
    with pytest.raises(ValueError, match="dtype code 0x07"):
        read_idx(path)


@pytest.mark.parametrize("delta", [-1, 1], ids=["truncated", "trailing-bytes"])
def test_read_idx_rejects_a_file_whose_size_does_not_match_its_header(
    tmp_path: Path, delta: int
) -> None:
    data = idx_bytes(np.zeros((4, 5), dtype=np.int16))
    data = data[:delta] if delta < 0 else data + b"\x00" * delta
    path = tmp_path / "bad"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=r"4x5 int16 .* but the file has"):
        read_idx(path)


def test_read_idx_rejects_a_truncated_header(tmp_path: Path) -> None:
    path = tmp_path / "bad"
    path.write_bytes(b"\x00\x00\x08\x03" + struct.pack(">I", 3))
    with pytest.raises(ValueError, match="truncated IDX header"):
        read_idx(path)


def test_read_idx_rejects_a_corrupt_gzip_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.gz"
    path.write_bytes(b"this is not gzip")
    with pytest.raises(ValueError, match="cannot read IDX file"):
        read_idx(path)


# --------------------------------------------------------------------------------------------
# Fashion-MNIST and MNIST


@pytest.mark.parametrize("compress", [False, True], ids=["raw", "gzip"])
def test_fashion_mnist_loads_idx_files_from_data_root(tmp_path: Path, compress: bool) -> None:
    arrays = write_idx_dataset(tmp_path, compress=compress)
    ds = load_dataset("fashion-mnist", tmp_path)
    check_idx_dataset(ds, arrays, "fashion-mnist")


@pytest.mark.parametrize("compress", [False, True], ids=["raw", "gzip"])
def test_mnist_loads_idx_files_from_data_root(tmp_path: Path, compress: bool) -> None:
    arrays = write_idx_dataset(tmp_path, compress=compress, seed=1)
    ds = load_dataset("mnist", str(tmp_path))
    check_idx_dataset(ds, arrays, "mnist")


def test_mnist_loads_torchvision_raw_layout(tmp_path: Path) -> None:
    arrays = write_idx_dataset(tmp_path / "MNIST" / "raw", compress=False, seed=2)
    ds = load_dataset("mnist", tmp_path)
    check_idx_dataset(ds, arrays, "mnist")


def test_fashion_mnist_loads_torchvision_raw_layout(tmp_path: Path) -> None:
    arrays = write_idx_dataset(tmp_path / "FashionMNIST" / "raw", compress=True, seed=3)
    ds = load_dataset("fashion-mnist", tmp_path)
    check_idx_dataset(ds, arrays, "fashion-mnist")


def test_uncompressed_files_are_preferred_when_both_forms_exist(tmp_path: Path) -> None:
    raw = write_idx_dataset(tmp_path, compress=False, seed=4)
    write_idx_dataset(tmp_path, compress=True, seed=5)
    check_idx_dataset(load_dataset("mnist", tmp_path), raw, "mnist")


def test_dataset_name_is_case_insensitive(tmp_path: Path) -> None:
    write_idx_dataset(tmp_path, compress=False)
    assert load_dataset(" Fashion-MNIST ", tmp_path).name == "fashion-mnist"


def test_missing_fashion_mnist_names_data_root_and_says_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_dataset("fashion-mnist", tmp_path / "nowhere")
    err = info.value
    assert err.field == "data_root"
    assert str(tmp_path / "nowhere") in err.message
    assert "train-images-idx3-ubyte.gz" in err.message
    assert "apt-get install dataset-fashion-mnist" in err.message
    assert "--data-root" in err.message and "--download" in err.message


def test_missing_mnist_names_data_root(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_dataset("mnist", tmp_path)
    assert info.value.field == "data_root"
    assert "MNIST" in info.value.message and "--download" in info.value.message


def test_mnist_without_data_root_names_data_root() -> None:
    with pytest.raises(ConfigError) as info:
        load_dataset("mnist")
    assert info.value.field == "data_root"


def test_incomplete_idx_set_counts_as_missing(tmp_path: Path) -> None:
    write_idx_dataset(tmp_path, compress=True)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(ConfigError) as info:
        load_dataset("fashion-mnist", tmp_path)
    assert info.value.field == "data_root"


def test_corrupted_idx_header_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    write_idx_dataset(tmp_path, compress=False)
    path = tmp_path / "train-images-idx3-ubyte"
    data = bytearray(path.read_bytes())
    data[0] = 0x42
    path.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match="magic number") as info:
        load_dataset("fashion-mnist", tmp_path)
    assert info.value.field == "data_root"
    assert str(path) in info.value.message


def test_truncated_idx_file_is_a_config_error(tmp_path: Path) -> None:
    write_idx_dataset(tmp_path, compress=False)
    path = tmp_path / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ConfigError, match="but the file has") as info:
        load_dataset("mnist", tmp_path)
    assert info.value.field == "data_root"


def test_idx_label_count_must_match_image_count(tmp_path: Path) -> None:
    write_idx_dataset(tmp_path, compress=False)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(11, np.uint8), compress=False)
    with pytest.raises(ConfigError, match="11 labels for 12 images"):
        load_dataset("mnist", tmp_path)


def test_idx_images_must_be_uint8_with_three_dimensions(tmp_path: Path) -> None:
    write_idx_dataset(tmp_path, compress=False)
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((12, 784), np.uint8), compress=False)
    with pytest.raises(ConfigError, match="expected uint8 images"):
        load_dataset("mnist", tmp_path)


def test_idx_labels_out_of_range_are_rejected(tmp_path: Path) -> None:
    write_idx_dataset(tmp_path, compress=False)
    labels = np.zeros(5, np.uint8)
    labels[3] = 10
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", labels, compress=False)
    with pytest.raises(ConfigError, match="label 10 out of range"):
        load_dataset("mnist", tmp_path)


def install_fake_torchvision(
    monkeypatch: pytest.MonkeyPatch, **classes: type
) -> list[tuple[str, dict[str, object]]]:
    """Replace torchvision with a fake whose ``datasets`` holds ``classes``; records the calls."""
    calls: list[tuple[str, dict[str, object]]] = []
    module = types.ModuleType("torchvision.datasets")
    for cls_name, cls in classes.items():

        def factory(root: str, _cls: type = cls, _name: str = cls_name, **kwargs: object) -> object:
            calls.append((_name, {"root": root, **kwargs}))
            return _cls(root, **kwargs)

        setattr(module, cls_name, factory)
    package = types.ModuleType("torchvision")  # importing the real one takes seconds
    package.datasets = module  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torchvision", package)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", module)
    return calls


def test_download_fetches_with_torchvision_then_reads_its_raw_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: dict[str, np.ndarray] = {}

    class FakeFashionMNIST:
        def __init__(self, root: str, train: bool = True, download: bool = False) -> None:
            assert download
            written.update(write_idx_dataset(Path(root) / "FashionMNIST" / "raw", compress=True))

    calls = install_fake_torchvision(monkeypatch, FashionMNIST=FakeFashionMNIST)
    ds = load_dataset("fashion-mnist", tmp_path, download=True)
    assert [name for name, _ in calls] == ["FashionMNIST"]
    assert calls[0][1]["root"] == str(tmp_path)
    check_idx_dataset(ds, written, "fashion-mnist")


def test_download_is_skipped_when_files_are_present(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_idx_dataset(tmp_path, compress=False)
    calls = install_fake_torchvision(monkeypatch, MNIST=object)
    load_dataset("mnist", tmp_path, download=True)
    assert calls == []


def test_failed_download_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class FailingMNIST:
        def __init__(self, root: str, **kwargs: object) -> None:
            raise RuntimeError("Error downloading train-images-idx3-ubyte.gz")

    install_fake_torchvision(monkeypatch, MNIST=FailingMNIST)
    with pytest.raises(ConfigError, match="could not download MNIST") as info:
        load_dataset("mnist", tmp_path, download=True)
    assert info.value.field == "data_root"


def test_unknown_dataset_names_field_dataset_and_lists_choices() -> None:
    with pytest.raises(ConfigError) as info:
        load_dataset("imagenet")
    assert info.value.field == "dataset"
    assert info.value.message == (
        "unknown dataset 'imagenet' (choose from fashion-mnist, mnist, cifar10, synthetic)"
    )
    assert DATASETS == ("fashion-mnist", "mnist", "cifar10", "synthetic")


# --------------------------------------------------------------------------------------------
# CIFAR-10


def write_cifar_bin(
    directory: Path, sizes: dict[str, int], seed: int = 0
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    out = {}
    for name, n in sizes.items():
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        images = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
        records = np.concatenate([labels[:, None], images.reshape(n, -1)], axis=1)
        (directory / name).write_bytes(records.tobytes())
        out[name] = (images, labels)
    return out


CIFAR_SIZES = {**{f"data_batch_{i}.bin": i for i in range(1, 6)}, "test_batch.bin": 4}


@pytest.mark.parametrize("nested", [True, False], ids=["data_root", "batches-folder"])
def test_cifar10_reads_the_binary_version(tmp_path: Path, nested: bool) -> None:
    folder = tmp_path / "cifar-10-batches-bin"
    written = write_cifar_bin(folder, CIFAR_SIZES)
    ds = load_dataset("cifar10", tmp_path if nested else folder)
    assert ds.name == "cifar10" and ds.num_classes == 10
    assert ds.input_shape == (3, 32, 32)
    assert ds.train_x.shape == (15, 3, 32, 32) and ds.test_x.shape == (4, 3, 32, 32)
    mean, std = NORMALIZATION["cifar10"]
    train_images = np.concatenate([written[f"data_batch_{i}.bin"][0] for i in range(1, 6)])
    train_labels = np.concatenate([written[f"data_batch_{i}.bin"][1] for i in range(1, 6)])
    np.testing.assert_allclose(
        ds.train_x.numpy(), expected_images(train_images, mean, std), atol=1e-5
    )
    np.testing.assert_array_equal(ds.train_y.numpy(), train_labels)
    test_images, test_labels = written["test_batch.bin"]
    np.testing.assert_allclose(
        ds.test_x.numpy(), expected_images(test_images, mean, std), atol=1e-5
    )
    np.testing.assert_array_equal(ds.test_y.numpy(), test_labels)


def test_cifar10_binary_channels_are_planar_red_green_blue(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    record = np.zeros(3073, np.uint8)
    record[0] = 7
    record[1 : 1 + 1024] = 255  # red plane all 255, green and blue 0
    for name in CIFAR_SIZES:
        (folder / name).write_bytes(record.tobytes())
    ds = load_dataset("cifar10", tmp_path)
    mean, std = NORMALIZATION["cifar10"]
    pixel = ds.train_x[0, :, 5, 9].numpy()
    np.testing.assert_allclose(
        pixel, [(1 - mean[0]) / std[0], -mean[1] / std[1], -mean[2] / std[2]], rtol=1e-5
    )
    assert ds.train_y.tolist() == [7] * 5


def test_cifar10_binary_file_with_partial_record_is_rejected(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-bin"
    write_cifar_bin(folder, CIFAR_SIZES)
    path = folder / "data_batch_3.bin"
    path.write_bytes(path.read_bytes() + b"\x00")
    with pytest.raises(ConfigError, match="3073-byte CIFAR-10") as info:
        load_dataset("cifar10", tmp_path)
    assert info.value.field == "data_root"
    assert "data_batch_3.bin" in info.value.message


def test_cifar10_binary_folder_missing_a_batch_is_rejected(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-bin"
    write_cifar_bin(folder, CIFAR_SIZES)
    (folder / "test_batch.bin").unlink()
    with pytest.raises(ConfigError, match=r"test_batch\.bin") as info:
        load_dataset("cifar10", tmp_path)
    assert info.value.field == "data_root"


def test_missing_cifar10_names_data_root(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_dataset("cifar10", tmp_path)
    assert info.value.field == "data_root"
    assert "cifar-10-batches-bin" in info.value.message
    with pytest.raises(ConfigError) as info:
        load_dataset("cifar10")
    assert info.value.field == "data_root"


def test_cifar10_falls_back_to_torchvision_for_the_python_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cifar-10-batches-py").mkdir()
    rng = np.random.default_rng(0)
    hwc = {
        True: rng.integers(0, 256, (6, 32, 32, 3), np.uint8),
        False: rng.integers(0, 256, (2, 32, 32, 3), np.uint8),
    }
    targets = {True: [0, 1, 2, 3, 4, 9], False: [5, 6]}

    class FakeCIFAR10:
        def __init__(self, root: str, train: bool = True, download: bool = False) -> None:
            self.data = hwc[train]
            self.targets = targets[train]

    calls = install_fake_torchvision(monkeypatch, CIFAR10=FakeCIFAR10)
    ds = load_dataset("cifar10", tmp_path)
    assert [kw["train"] for _, kw in calls] == [True, False]
    assert all(kw["download"] is False for _, kw in calls)
    mean, std = NORMALIZATION["cifar10"]
    chw = hwc[True].transpose(0, 3, 1, 2)
    np.testing.assert_allclose(ds.train_x.numpy(), expected_images(chw, mean, std), atol=1e-5)
    assert ds.train_y.tolist() == targets[True] and ds.test_y.tolist() == targets[False]
    assert ds.test_x.shape == (2, 3, 32, 32)


# --------------------------------------------------------------------------------------------
# Synthetic


def test_synthetic_is_deterministic_in_its_seed() -> None:
    a = load_dataset("synthetic", seed=3)
    b = load_dataset("synthetic", "/ignored/root", seed=3)
    c = load_dataset("synthetic", seed=4)
    for field in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(a, field), getattr(b, field))
    assert not torch.equal(a.train_x, c.train_x)


def test_synthetic_has_requested_sizes_shape_and_balanced_shuffled_labels() -> None:
    ds = load_dataset("synthetic", synthetic_train=1003, synthetic_test=250, seed=1)
    assert ds.name == "synthetic" and ds.num_classes == 10
    assert ds.input_shape == (1, 8, 8)
    assert ds.train_x.shape == (1003, 1, 8, 8) and ds.test_x.shape == (250, 1, 8, 8)
    assert ds.train_x.dtype == torch.float32 and ds.train_y.dtype == torch.int64
    train_counts = torch.bincount(ds.train_y, minlength=10)
    assert int(train_counts.max() - train_counts.min()) <= 1 and int(train_counts.sum()) == 1003
    assert torch.bincount(ds.test_y, minlength=10).tolist() == [25] * 10
    assert ds.train_y[:10].tolist() != list(range(10))  # shuffled, not round-robin
    assert abs(float(ds.train_x.mean())) < 1e-3 and abs(float(ds.train_x.std()) - 1) < 1e-2


def test_synthetic_test_set_does_not_depend_on_train_size() -> None:
    a = load_dataset("synthetic", synthetic_train=100, synthetic_test=50, seed=2)
    b = load_dataset("synthetic", synthetic_train=300, synthetic_test=50, seed=2)
    assert torch.equal(a.test_y, b.test_y)
    # Same raw samples, standardised with slightly different train statistics.
    assert float(torch.corrcoef(torch.stack([a.test_x.ravel(), b.test_x.ravel()]))[0, 1]) > 0.999


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Tiny models train ~100x faster on one thread when the 2 cores are busy with other work."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_torch_thread")
def test_synthetic_is_learnable_by_a_small_mlp() -> None:
    torch.manual_seed(0)
    ds = load_dataset("synthetic", seed=0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    # Plain SGD by hand: torch.optim's first step imports torch._dynamo, which takes seconds.
    for _ in range(3):
        for batch in torch.randperm(len(ds.train_y)).split(32):
            model.zero_grad()
            nn.functional.cross_entropy(model(ds.train_x[batch]), ds.train_y[batch]).backward()
            with torch.no_grad():
                for param in model.parameters():
                    assert param.grad is not None
                    param.sub_(0.1 * param.grad)
    with torch.no_grad():
        accuracy = (model(ds.test_x).argmax(1) == ds.test_y).float().mean().item()
    assert accuracy > 0.6


@pytest.mark.parametrize("field", ["synthetic_train", "synthetic_test"])
def test_synthetic_rejects_empty_splits(field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_dataset("synthetic", **{field: 0})  # type: ignore[arg-type]
    assert info.value.field == field


def test_dataset_rejects_mismatched_tensors() -> None:
    x = torch.zeros(3, 1, 2, 2)
    with pytest.raises(ValueError, match="train_y"):
        Dataset("d", x, torch.zeros(2, dtype=torch.int64), x, torch.zeros(3, dtype=torch.int64), 2)
    with pytest.raises(ValueError, match="train_x"):
        Dataset("d", x[0], torch.zeros(1), x, torch.zeros(3), 2)


# --------------------------------------------------------------------------------------------
# The real Fashion-MNIST


@pytest.mark.slow
@pytest.mark.skipif(
    datasets._find_idx_files(DEFAULT_FASHION_MNIST_ROOT, "FashionMNIST") is None,
    reason=f"Fashion-MNIST not installed in {DEFAULT_FASHION_MNIST_ROOT} "
    "(apt-get install dataset-fashion-mnist)",
)
def test_real_fashion_mnist_loads_from_the_default_root() -> None:
    ds = load_dataset("fashion-mnist")
    assert ds.train_x.shape == (60000, 1, 28, 28)
    assert ds.test_x.shape == (10000, 1, 28, 28)
    assert ds.train_y.shape == (60000,) and ds.test_y.shape == (10000,)
    assert torch.bincount(ds.train_y).tolist() == [6000] * 10
    assert torch.bincount(ds.test_y).tolist() == [1000] * 10
    # The normalisation constants are this dataset's own: train pixels end up ~N(0, 1).
    assert abs(float(ds.train_x.mean())) < 0.01
    assert abs(float(ds.train_x.std()) - 1.0) < 0.01
