"""Datasets the nodes train on: Fashion-MNIST, MNIST, CIFAR-10 and a synthetic stand-in.

Every dataset is loaded whole into memory as normalised ``float32`` tensors of shape
``[n, C, H, W]`` plus ``int64`` labels, so that partitioning and per-node batching are plain
tensor indexing.

Reading is done here with numpy rather than through torchvision's dataset classes:

* MNIST and Fashion-MNIST come as four IDX files (``train-images-idx3-ubyte[.gz]``, ...). They
  are looked up in ``data_root`` itself and in torchvision's layout
  (``data_root/FashionMNIST/raw`` resp. ``data_root/MNIST/raw``). Fashion-MNIST defaults to
  :data:`DEFAULT_FASHION_MNIST_ROOT`, where Debian's ``dataset-fashion-mnist`` package installs
  it.
* CIFAR-10 is read from the official *binary* version (``data_root/cifar-10-batches-bin``) when
  present. Otherwise torchvision's :class:`~torchvision.datasets.CIFAR10` reads the python
  version (``data_root/cifar-10-batches-py``).

torchvision is only imported, lazily, to download a dataset (``download=True``) or to read
CIFAR-10's python version.
"""

from __future__ import annotations

import gzip
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dacflnode.errors import ConfigError
from dacflnode.learning.names import DATASETS as DATASETS

DEFAULT_FASHION_MNIST_ROOT = Path("/usr/share/datasets/fashion-mnist")
"""Where Debian's ``dataset-fashion-mnist`` package installs the four IDX ``.gz`` files."""

NORMALIZATION: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "mnist": ((0.1307,), (0.3081,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}
"""Per-channel ``(mean, std)`` of each real dataset's training images, on the ``[0, 1]`` scale."""

NUM_CLASSES = 10

SYNTHETIC_SHAPE = (1, 8, 8)
SYNTHETIC_NOISE_STD = 2.5
"""Per-pixel gaussian noise around unit-variance class prototypes. A 64-32-10 MLP with plain SGD
reaches about 70% test accuracy after one epoch and levels off near 87%: well above chance,
yet not saturated, so that differences between training schemes stay visible."""


@dataclass(frozen=True)
class Dataset:
    """A whole dataset in memory: normalised images and integer labels, train and test split."""

    name: str
    train_x: torch.Tensor  # float32 [n, C, H, W], normalised with the per-channel mean/std
    train_y: torch.Tensor  # int64 [n]
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int

    def __post_init__(self) -> None:
        for split, x, y in (
            ("train", self.train_x, self.train_y),
            ("test", self.test_x, self.test_y),
        ):
            if x.ndim != 4:
                raise ValueError(f"{split}_x must be [n, C, H, W], got shape {tuple(x.shape)}")
            if y.ndim != 1 or y.shape[0] != x.shape[0]:
                raise ValueError(
                    f"{split}_y must be [n] with n = {x.shape[0]}, got shape {tuple(y.shape)}"
                )
        if self.train_x.shape[1:] != self.test_x.shape[1:]:
            raise ValueError(
                f"train and test images differ in shape: {tuple(self.train_x.shape[1:])} "
                f"vs {tuple(self.test_x.shape[1:])}"
            )

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of one image."""
        c, h, w = self.train_x.shape[1:]
        return (int(c), int(h), int(w))


def load_dataset(
    name: str,
    data_root: str | Path | None = None,
    *,
    download: bool = False,
    synthetic_train: int = 2000,
    synthetic_test: int = 500,
    seed: int = 0,
) -> Dataset:
    """Load dataset ``name`` (one of :data:`DATASETS`) whole into memory.

    ``data_root`` is where the dataset's files are (ignored for ``synthetic``); Fashion-MNIST
    defaults to :data:`DEFAULT_FASHION_MNIST_ROOT`. With ``download`` true, missing files are
    fetched with torchvision into ``data_root``. ``synthetic_train``, ``synthetic_test`` and
    ``seed`` only apply to ``synthetic``.

    Raises :class:`ConfigError` (field ``dataset`` or ``data_root``) for an unknown name, missing
    files, or files that are not what they should be.
    """
    key = name.strip().lower() if isinstance(name, str) else name
    if key == "fashion-mnist":
        root = Path(data_root) if data_root is not None else DEFAULT_FASHION_MNIST_ROOT
        return _load_idx_dataset(key, root, download)
    if key == "mnist":
        if data_root is None:
            raise ConfigError(
                "data_root",
                "MNIST has no default location; pass --data-root DIR "
                "(add --download to fetch it there)",
            )
        return _load_idx_dataset(key, Path(data_root), download)
    if key == "cifar10":
        if data_root is None:
            raise ConfigError(
                "data_root",
                "CIFAR-10 has no default location; pass --data-root DIR "
                "(add --download to fetch it there)",
            )
        return _load_cifar10(Path(data_root), download)
    if key == "synthetic":
        return make_synthetic(synthetic_train, synthetic_test, seed=seed)
    raise ConfigError("dataset", f"unknown dataset {name!r} (choose from {', '.join(DATASETS)})")


# --------------------------------------------------------------------------------------------
# IDX (MNIST, Fashion-MNIST)

_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (raw, or gzip-compressed when its name ends in ``.gz``).

    The header is validated: two zero bytes, a known dtype code, the number of dimensions and
    the dimensions themselves, and the payload must be exactly as long as they say. Raises
    :class:`ValueError` naming the file otherwise. Returns a native-endian array.
    """
    path = Path(path)
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            data = path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        raise ValueError(f"{path}: cannot read IDX file: {err}") from err
    if len(data) < 4:
        raise ValueError(f"{path}: not an IDX file: only {len(data)} bytes, no header")
    zero0, zero1, code, ndim = data[0], data[1], data[2], data[3]
    if zero0 != 0 or zero1 != 0:
        raise ValueError(
            f"{path}: not an IDX file: magic number {data[:4].hex()} does not start with 0000"
        )
    if code not in _IDX_DTYPES:
        raise ValueError(f"{path}: unknown IDX dtype code 0x{code:02x}")
    if ndim == 0:
        raise ValueError(f"{path}: IDX header declares 0 dimensions")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(
            f"{path}: truncated IDX header: {ndim} dimensions need {header} bytes, "
            f"file has {len(data)}"
        )
    dims = struct.unpack(f">{ndim}I", data[4:header])
    dtype = _IDX_DTYPES[code]
    expected = header + math.prod(dims) * dtype.itemsize
    if len(data) != expected:
        raise ValueError(
            f"{path}: IDX header says {'x'.join(map(str, dims))} {dtype.name} values "
            f"({expected} bytes with header) but the file has {len(data)} bytes"
        )
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=False)


_IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)

_IDX_INFO = {
    # key: (display name, torchvision class name = subfolder, apt hint)
    "fashion-mnist": (
        "Fashion-MNIST",
        "FashionMNIST",
        "install them with `apt-get install dataset-fashion-mnist`, ",
    ),
    "mnist": ("MNIST", "MNIST", ""),
}


def _find_idx_files(root: Path, subfolder: str) -> list[Path] | None:
    """The four IDX files in ``root`` or ``root/<subfolder>/raw``, raw preferred over ``.gz``."""
    for directory in (root, root / subfolder / "raw"):
        found: list[Path] = []
        for base in _IDX_FILES:
            for candidate in (directory / base, directory / f"{base}.gz"):
                if candidate.is_file():
                    found.append(candidate)
                    break
            else:
                break
        if len(found) == len(_IDX_FILES):
            return found
    return None


def _download_torchvision_idx(key: str, root: Path) -> None:
    try:
        from torchvision import datasets as tv_datasets
    except ImportError as err:  # pragma: no cover - torchvision is a dependency
        raise ConfigError("data_root", f"--download needs torchvision: {err}") from err
    cls = tv_datasets.FashionMNIST if key == "fashion-mnist" else tv_datasets.MNIST
    try:
        cls(str(root), train=True, download=True)
    except (OSError, RuntimeError) as err:
        raise ConfigError(
            "data_root", f"could not download {_IDX_INFO[key][0]} into {root}: {err}"
        ) from err


def _load_idx_dataset(key: str, root: Path, download: bool) -> Dataset:
    display, subfolder, apt_hint = _IDX_INFO[key]
    files = _find_idx_files(root, subfolder)
    if files is None and download:
        _download_torchvision_idx(key, root)
        files = _find_idx_files(root, subfolder)
    if files is None:
        expected = ", ".join(f"{base}.gz" for base in _IDX_FILES)
        raise ConfigError(
            "data_root",
            f"no {display} IDX files in {root} (expected {expected}, raw or gzip-compressed, "
            f"there or in {root / subfolder / 'raw'}); {apt_hint}pass --data-root DIR, "
            "or add --download",
        )
    try:
        train_images, train_labels, test_images, test_labels = (read_idx(p) for p in files)
        train_x, train_y = _check_idx_split(files[0], files[1], train_images, train_labels)
        test_x, test_y = _check_idx_split(files[2], files[3], test_images, test_labels)
    except ValueError as err:
        raise ConfigError("data_root", f"bad {display} files: {err}") from err
    if train_x.shape[1:] != test_x.shape[1:]:
        raise ConfigError(
            "data_root",
            f"bad {display} files: train images are {train_x.shape[1:]} but test images "
            f"are {test_x.shape[1:]}",
        )
    mean, std = NORMALIZATION[key]
    return Dataset(
        name=key,
        train_x=_normalize(train_x[:, None], mean, std),
        train_y=torch.from_numpy(train_y.astype(np.int64)),
        test_x=_normalize(test_x[:, None], mean, std),
        test_y=torch.from_numpy(test_y.astype(np.int64)),
        num_classes=NUM_CLASSES,
    )


def _check_idx_split(
    images_path: Path, labels_path: Path, images: np.ndarray, labels: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    if images.dtype != np.uint8 or images.ndim != 3:
        raise ValueError(
            f"{images_path}: expected uint8 images [n, rows, cols], "
            f"got {images.dtype} with shape {images.shape}"
        )
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise ValueError(
            f"{labels_path}: expected uint8 labels [n], "
            f"got {labels.dtype} with shape {labels.shape}"
        )
    if labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"{labels_path}: {labels.shape[0]} labels for {images.shape[0]} images in {images_path}"
        )
    _check_labels(labels_path, labels)
    return images, labels


def _check_labels(path: Path, labels: np.ndarray) -> None:
    if labels.size and int(labels.max()) >= NUM_CLASSES:
        raise ValueError(f"{path}: label {int(labels.max())} out of range 0..{NUM_CLASSES - 1}")


# --------------------------------------------------------------------------------------------
# CIFAR-10

_CIFAR_RECORD = 1 + 3 * 32 * 32
_CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
_CIFAR_TEST_FILES = ("test_batch.bin",)


def _read_cifar_bin(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One file of CIFAR-10's binary version: records of 1 label byte + 3072 CHW pixel bytes."""
    try:
        raw = np.fromfile(path, dtype=np.uint8)
    except OSError as err:
        raise ValueError(f"{path}: cannot read: {err}") from err
    if raw.size == 0 or raw.size % _CIFAR_RECORD:
        raise ValueError(
            f"{path}: {raw.size} bytes is not a whole number of {_CIFAR_RECORD}-byte CIFAR-10 "
            "records (1 label byte + 3072 pixel bytes); is this the binary version?"
        )
    records = raw.reshape(-1, _CIFAR_RECORD)
    labels = records[:, 0]
    _check_labels(path, labels)
    return records[:, 1:].reshape(-1, 3, 32, 32), labels


def _load_cifar10_bin(directory: Path) -> tuple[np.ndarray, ...]:
    missing = [
        name for name in _CIFAR_TRAIN_FILES + _CIFAR_TEST_FILES if not (directory / name).is_file()
    ]
    if missing:
        raise ConfigError(
            "data_root", f"incomplete CIFAR-10 binary version in {directory}: missing {missing}"
        )
    try:
        train = [_read_cifar_bin(directory / name) for name in _CIFAR_TRAIN_FILES]
        test = [_read_cifar_bin(directory / name) for name in _CIFAR_TEST_FILES]
    except ValueError as err:
        raise ConfigError("data_root", f"bad CIFAR-10 files: {err}") from err
    return (
        np.concatenate([x for x, _ in train]),
        np.concatenate([y for _, y in train]),
        np.concatenate([x for x, _ in test]),
        np.concatenate([y for _, y in test]),
    )


def _load_cifar10_torchvision(root: Path, download: bool) -> tuple[np.ndarray, ...]:
    if not download and not (root / "cifar-10-batches-py").is_dir():
        raise ConfigError(
            "data_root",
            f"no CIFAR-10 in {root} (expected the binary version in "
            f"{root / 'cifar-10-batches-bin'} or the python version in "
            f"{root / 'cifar-10-batches-py'}); pass --data-root DIR, or add --download",
        )
    try:
        from torchvision import datasets as tv_datasets
    except ImportError as err:  # pragma: no cover - torchvision is a dependency
        raise ConfigError("data_root", f"reading CIFAR-10 needs torchvision: {err}") from err
    splits: list[np.ndarray] = []
    for train in (True, False):
        try:
            ds = tv_datasets.CIFAR10(str(root), train=train, download=download)
        except (OSError, RuntimeError) as err:
            action = "download" if download else "read"
            raise ConfigError("data_root", f"could not {action} CIFAR-10 in {root}: {err}") from err
        images = np.asarray(ds.data, dtype=np.uint8)
        if images.ndim != 4 or images.shape[1:] != (32, 32, 3):
            raise ConfigError(
                "data_root", f"bad CIFAR-10 in {root}: images have shape {images.shape}"
            )
        labels = np.asarray(ds.targets, dtype=np.int64)
        try:
            _check_labels(root / "cifar-10-batches-py", labels)
        except ValueError as err:
            raise ConfigError("data_root", f"bad CIFAR-10 files: {err}") from err
        splits += [images.transpose(0, 3, 1, 2), labels]  # HWC -> CHW
    return tuple(splits)


def _load_cifar10(root: Path, download: bool) -> Dataset:
    bin_dir: Path | None = None
    if (root / "cifar-10-batches-bin").is_dir():
        bin_dir = root / "cifar-10-batches-bin"
    elif (root / _CIFAR_TRAIN_FILES[0]).is_file():  # data_root is the binary folder itself
        bin_dir = root
    if bin_dir is not None:
        train_x, train_y, test_x, test_y = _load_cifar10_bin(bin_dir)
    else:
        train_x, train_y, test_x, test_y = _load_cifar10_torchvision(root, download)
    mean, std = NORMALIZATION["cifar10"]
    return Dataset(
        name="cifar10",
        train_x=_normalize(train_x, mean, std),
        train_y=torch.from_numpy(train_y.astype(np.int64)),
        test_x=_normalize(test_x, mean, std),
        test_y=torch.from_numpy(test_y.astype(np.int64)),
        num_classes=NUM_CLASSES,
    )


# --------------------------------------------------------------------------------------------
# Synthetic


def make_synthetic(n_train: int, n_test: int, *, seed: int = 0) -> Dataset:
    """A small learnable 10-class dataset of ``1x8x8`` images, fully determined by ``seed``.

    Each class has a random unit-variance prototype image; a sample is its class's prototype plus
    gaussian noise (std :data:`SYNTHETIC_NOISE_STD`). Labels are balanced (class counts differ by
    at most one) and shuffled. Train and test share the prototypes but draw independent noise,
    and the test set does not depend on ``n_train``. Both are standardised with the training
    set's mean and std.
    """
    for field, n in (("synthetic_train", n_train), ("synthetic_test", n_test)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(field, f"must be a positive number of samples, got {n!r}")
    proto_seq, train_seq, test_seq = np.random.SeedSequence(seed).spawn(3)
    prototypes = np.random.default_rng(proto_seq).standard_normal((NUM_CLASSES, *SYNTHETIC_SHAPE))

    def draw(n: int, seq: np.random.SeedSequence) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seq)
        labels = rng.permutation(np.arange(n) % NUM_CLASSES)
        noise = rng.standard_normal((n, *SYNTHETIC_SHAPE))
        return prototypes[labels] + SYNTHETIC_NOISE_STD * noise, labels

    train_x, train_y = draw(n_train, train_seq)
    test_x, test_y = draw(n_test, test_seq)
    mean = float(train_x.mean())
    std = float(train_x.std()) or 1.0

    def to_tensor(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(((x - mean) / std).astype(np.float32))

    return Dataset(
        name="synthetic",
        train_x=to_tensor(train_x),
        train_y=torch.from_numpy(train_y.astype(np.int64)),
        test_x=to_tensor(test_x),
        test_y=torch.from_numpy(test_y.astype(np.int64)),
        num_classes=NUM_CLASSES,
    )


def _normalize(images: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """uint8 ``[n, C, H, W]`` -> float32 ``(x / 255 - mean) / std`` per channel."""
    x = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32))
    channels = x.shape[1]
    m = torch.tensor(mean, dtype=torch.float32).view(1, channels, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, channels, 1, 1)
    return x.div_(255.0).sub_(m).div_(s)


def eval_subset(
    x: torch.Tensor, y: torch.Tensor, size: int | None, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed, seeded subset of ``size`` test samples (all of them when ``size`` is None)."""
    if size is None or size >= len(y):
        return x, y
    pick = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    pick = pick[:size].sort().values
    return x[pick], y[pick]
