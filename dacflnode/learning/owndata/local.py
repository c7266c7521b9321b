"""A device's own data, loaded from its files: :func:`load_local_data` and :class:`LocalData`.

The result is a :class:`~dacflnode.learning.datasets.Dataset` (so the trainer, the evaluation and
the partitioning code take it unchanged) with the run's data contract, the class histograms and
what was skipped.

Tensor layout: images ``float32 [n, C, H, W]``; a table's rows ``float32 [n, 1, 1, F]`` (a row as
a one-channel image one pixel high and ``F`` wide, so ``Dataset``'s 4-D form holds and the
``mlp`` model, which flattens, takes it as ``F`` inputs: see
:func:`~.contract.model_input_shape`).

Normalisation is fixed, never computed from a device's own files, so that every device feeds the
model the same transform of the same pixel: one-channel images use Fashion-MNIST's mean and std
(0.2860, 0.3530), three-channel images CIFAR-10's, both on the ``[0, 1]`` scale. So a folder
written from Fashion-MNIST by ``dacflnode data split`` loads to exactly the tensors of the
built-in loader. A table's numbers are kept as they are in its files (see :mod:`.tables`;
``numeric_features`` says which features the run's scaling applies to); a Python factory's tensors
are used as they are too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from dacflnode.errors import ConfigError
from dacflnode.learning.datasets import NORMALIZATION, Dataset
from dacflnode.learning.owndata import factory, images, tables
from dacflnode.learning.owndata.contract import FORMS, DataContract
from dacflnode.learning.owndata.holdout import holdout_split as holdout_split
from dacflnode.learning.owndata.tablescan import names_text

IMAGE_NORMALIZATION: dict[int, tuple[tuple[float, ...], tuple[float, ...]]] = {
    1: NORMALIZATION["fashion-mnist"],
    3: NORMALIZATION["cifar10"],
}
"""The fixed per-channel ``(mean, std)`` of image folders, by channel count."""

BAD_FILE_POLICIES = ("fail", "skip")


@dataclass(frozen=True)
class LocalData(Dataset):
    """One device's own data: a :class:`Dataset` (``name`` is the data's form, ``num_classes``
    the run's class count) and what describes it.

    ``contract``: the run's :class:`DataContract` as these files fulfil it. ``histogram`` and
    ``test_histogram``: samples per class name (every class of the run, zeros included), train
    and test. ``skipped``: files left out under the ``skip`` policy, the first of them in
    ``skipped_files`` as ``(file, reason)``. ``source``: where the data came from, in words;
    ``files``: how many files were read. ``from_cache``: the training images came from the cache.
    A table's ``numeric_features``: the indices of its numeric (not one-hot) features, which
    the run's scaling applies to; ``dropped``: its rows left out for a missing cell
    (``missing: drop``), training and test files together.
    """

    contract: DataContract
    histogram: dict[str, int]
    test_histogram: dict[str, int]
    skipped: int = 0
    skipped_files: tuple[tuple[str, str], ...] = ()
    source: str = ""
    files: int = 0
    from_cache: bool = False
    test_source: str = field(default="")
    numeric_features: tuple[int, ...] = ()
    dropped: int = 0

    @property
    def train_size(self) -> int:
        return int(self.train_y.shape[0])

    @property
    def test_size(self) -> int:
        return int(self.test_y.shape[0])

    def summary(self) -> dict[str, object]:
        """A JSON-able description (what ``dacflnode data check --json`` prints)."""
        return {
            "kind": self.contract.form,
            "source": self.source,
            "test_source": self.test_source,
            "classes": list(self.contract.classes),
            "input_shape": list(self.contract.input_shape),
            "feature_names": list(self.contract.feature_names),
            "train_size": self.train_size,
            "test_size": self.test_size,
            "histogram": dict(self.histogram),
            "test_histogram": dict(self.test_histogram),
            "files": self.files,
            "skipped": self.skipped,
            "skipped_files": [list(s) for s in self.skipped_files],
            "from_cache": self.from_cache,
            "numeric_features": list(self.numeric_features),
            "dropped": self.dropped,
            "contract": self.contract.to_dict(),
        }


def histogram(labels: torch.Tensor | np.ndarray, classes: Sequence[str]) -> dict[str, int]:
    """Samples per class name, in the run's class order, zeros included."""
    y = labels.numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    counts = np.bincount(y.astype(np.int64), minlength=len(classes)) if y.size else \
        np.zeros(len(classes), dtype=np.int64)
    return {name: int(counts[i]) for i, name in enumerate(classes)}


def normalize_images(u8: np.ndarray) -> torch.Tensor:
    """uint8 ``[n, C, H, W]`` -> float32 ``(x / 255 - mean) / std`` per channel, with the fixed
    constants and the same float32 operations as the built-in loaders (equal pixels give equal
    tensors, whichever loader made them); in place on the result, no other temporaries."""
    c = u8.shape[1]
    if c not in IMAGE_NORMALIZATION:
        raise ConfigError("channels", f"images must have 1 or 3 channels, got {c}")
    mean, std = IMAGE_NORMALIZATION[c]
    x = torch.from_numpy(np.ascontiguousarray(u8)).to(torch.float32)
    m = torch.tensor(mean, dtype=torch.float32).view(1, c, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, c, 1, 1)
    return x.div_(255.0).sub_(m).div_(s)


def _check_shape(form: str, input_shape: Sequence[int] | None) -> tuple[int, ...] | None:
    if input_shape is None:
        return None
    shape = tuple(int(s) for s in input_shape)
    if form == "folder":
        if len(shape) != 3 or shape[0] not in (1, 3) or min(shape) < 1:
            raise ConfigError("channels", f"an image folder's input shape is (C, H, W) with "
                                             f"C = 1 or 3, got {shape}")
    elif len(shape) not in (1, 3) or min(shape) < 1:
        raise ConfigError("input_shape", f"input shape must be (C, H, W) or (F,), got {shape}")
    return shape


def load_local_data(
    form: str,
    root: str | Path,
    *,
    classes: Sequence[str],
    input_shape: Sequence[int] | None = None,
    resize: bool = True,
    label_column: str | None = None,
    test_root: str | Path | None = None,
    holdout: float = 0.0,
    seed: int = 0,
    cache_dir: str | Path | None = None,
    on_bad: str = "fail",
    workers: int | None = None,
    progress: images.Progress | None = None,
    factory: str | None = None,
    categories: Mapping[str, Sequence[str]] | None = None,
    other_category: bool = False,
    missing: str = "fail",
) -> LocalData:
    """Load this device's own data.

    ``form``
        ``"folder"``, ``"table"`` or ``"python"`` (:data:`~.contract.FORMS`).
    ``root``
        The device's training data: a folder of class subfolders; a CSV/Parquet file or a folder
        of them; for ``python``, whatever the factory reads (passed to it as ``data_root``).
    ``classes``
        The run's ordered class names; labels are indices into it, found by name.
    ``input_shape``
        Images: the run's ``(C, H, W)`` (C = 1 → grayscale, 3 → RGB); ``None`` takes it from the
        first image. Tables: ``(F,)`` to check the feature count, or ``None``. Python: checked
        against the factory's samples when given.
    ``resize``
        Resize images to ``(H, W)`` (bilinear); off, an image of another size is an error.
    ``label_column``
        A table's label column.
    ``test_root``
        The device's test data, in the same form as ``root``. When ``None``, a deterministic
        held-out ``holdout`` fraction of the local data (by ``seed``) is the test set; with
        ``holdout`` 0 the test set is empty.
    ``cache_dir``
        Where decoded images are cached (the node's state folder); ``None``: no cache.
    ``on_bad``
        ``"fail"``: an unreadable image is an error naming the first five; ``"skip"``: such
        files are left out and counted in ``skipped``.
    ``workers``
        Decoding processes (``None``: one per CPU, at most 8; 1: in this process).
    ``progress``
        ``progress(done, total)`` while images decode.
    ``factory``
        ``python``: the ``package.module:function`` (:mod:`.factory`); ``None`` takes ``root``
        as the spec.
    ``categories``, ``other_category``, ``missing``
        A table's text columns and their values (one-hot encoded in that order), whether a value
        not listed goes to a ``column=<other>`` feature, and what a missing cell does
        (``fail``, ``drop`` or ``mean``): see :mod:`.tables`.

    Every bad input raises :class:`ConfigError` with one line naming the file and what to do.
    """
    if form not in FORMS:
        raise ConfigError("dataset", f"unknown data source {form!r} (choose from "
                                     f"{', '.join(FORMS)})")
    if on_bad not in BAD_FILE_POLICIES:
        raise ConfigError("bad_files", f"must be one of {', '.join(BAD_FILE_POLICIES)}, got "
                                          f"{on_bad!r}")
    class_names = tuple(str(c) for c in classes)
    if not class_names:
        raise ConfigError("classes", "an own-data run needs classes: the ordered class names "
                                     "(folder names, or a table's label values)")
    if len(set(class_names)) != len(class_names):
        raise ConfigError("classes", f"class names repeat: {list(class_names)}")
    shape = _check_shape(form, input_shape)
    if not 0.0 <= float(holdout) < 1.0:
        raise ConfigError("holdout", f"must be a fraction in [0, 1), got {holdout!r}")
    cache = Path(cache_dir) if cache_dir is not None else None
    if form == "folder":
        return _load_folder(Path(root), None if test_root is None else Path(test_root),
                            class_names, shape, resize, holdout, seed, cache, on_bad, workers,
                            progress)
    if form == "table":
        return _load_table(Path(root), None if test_root is None else Path(test_root),
                           class_names, shape, label_column, holdout, seed,
                           categories=categories, other_category=other_category,
                           missing=missing)
    spec = factory if factory is not None else str(root)
    return _load_python(spec, class_names, shape, holdout, seed,
                        {"data_root": None if factory is None else str(root),
                         "test_root": None if test_root is None else str(test_root)})


def _bad_files_error(root: Path, bad: Sequence[tuple[str, str]], field: str) -> ConfigError:
    shown = "; ".join(f"{root / path}: {reason}" for path, reason in bad[:images.BAD_LISTED])
    return ConfigError(
        field,
        f"{len(bad)} image file(s) cannot be read ({shown}); replace or remove them, or set "
        "bad_files: skip to leave them out",
    )


def _decode(root: Path, classes: tuple[str, ...], shape: tuple[int, int, int] | None,
            resize: bool, cache: Path | None, on_bad: str, workers: int | None,
            progress: images.Progress | None, field: str) -> images.DecodedFolder:
    decoded = images.load_folder(root, classes, shape, resize=resize, field=field,
                                 cache_dir=cache, workers=workers, progress=progress)
    if decoded.bad and on_bad == "fail":
        raise _bad_files_error(root, decoded.bad, field)
    if decoded.labels.shape[0] == 0:
        raise ConfigError(field, f"{root}: none of its {decoded.files} images can be read")
    return decoded


def _load_folder(root: Path, test_root: Path | None, classes: tuple[str, ...],
                 shape: tuple[int, ...] | None, resize: bool, holdout: float, seed: int,
                 cache: Path | None, on_bad: str, workers: int | None,
                 progress: images.Progress | None) -> LocalData:
    image_shape = None if shape is None else (shape[0], shape[1], shape[2])
    train = _decode(root, classes, image_shape, resize, cache, on_bad, workers, progress,
                    "data_root")
    c, h, w = (int(s) for s in train.images.shape[1:])
    skipped = list(train.bad)
    if test_root is not None:
        test = _decode(test_root, classes, (c, h, w), resize, cache, on_bad, workers, progress,
                       "test_root")
        skipped += test.bad
        train_u8, train_y = train.images, train.labels
        test_u8, test_y = test.images, test.labels
        test_source = str(test_root)
    else:
        train_u8, train_y, test_u8, test_y, test_source = _hold_out(
            train.images, train.labels, root, holdout, seed)
    return _local_data(
        DataContract("folder", classes, (c, h, w)),
        (normalize_images(train_u8), train_y), (normalize_images(test_u8), test_y),
        source=str(root), test_source=test_source, files=train.files, skipped=skipped,
        from_cache=train.from_cache,
    )


def _hold_out(x: np.ndarray, y: np.ndarray, root: Path, holdout: float, seed: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    """Train inputs and labels, test inputs and labels, and the test set in words, of data
    without test files: a ``holdout`` fraction of ``(x, y)`` from ``root``, drawn by ``seed``
    (:func:`holdout_split`). Nothing held out, the train part is ``(x, y)`` itself, no copy."""
    keep, held = holdout_split(y.shape[0], holdout, seed)
    if not held.size:
        return x, y, x[held], y[held], ""
    return x[keep], y[keep], x[held], y[held], f"{holdout:g} of {root} held out (seed {seed})"


def _local_data(contract: DataContract, train: tuple[torch.Tensor, torch.Tensor | np.ndarray],
                test: tuple[torch.Tensor, torch.Tensor | np.ndarray], *, source: str,
                test_source: str, files: int = 0, skipped: Sequence[tuple[str, str]] = (),
                from_cache: bool = False) -> LocalData:
    """The :class:`LocalData` of inputs and labels ``train`` and ``test`` that fulfil
    ``contract``, with their histograms; ``skipped``: the files left out, as ``(file, why)``."""
    (train_x, train_y), (test_x, test_y) = train, test
    return LocalData(
        name=contract.form,
        train_x=train_x,
        train_y=_labels(train_y),
        test_x=test_x,
        test_y=_labels(test_y),
        num_classes=contract.num_classes,
        contract=contract,
        histogram=histogram(train_y, contract.classes),
        test_histogram=histogram(test_y, contract.classes),
        skipped=len(skipped),
        skipped_files=tuple(skipped[:images.BAD_LISTED]),
        source=source,
        files=files,
        from_cache=from_cache,
        test_source=test_source,
    )


def _labels(y: torch.Tensor | np.ndarray) -> torch.Tensor:
    return y if isinstance(y, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(y))


def _rows(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).reshape(
        x.shape[0], 1, 1, x.shape[1])


def _load_table(root: Path, test_root: Path | None, classes: tuple[str, ...],
                shape: tuple[int, ...] | None, label_column: str | None, holdout: float,
                seed: int, *, categories: Mapping[str, Sequence[str]] | None,
                other_category: bool, missing: str) -> LocalData:
    """A table, its held-out rows filled in place by the reader (no copy of the whole)."""
    train = tables.load_table(root, classes, label_column, "data_root",
                              holdout=0.0 if test_root is not None else holdout, seed=seed,
                              categories=categories, other_category=other_category,
                              missing=missing)
    n_features = len(train.feature_names)
    if shape is not None and tuple(shape) not in ((n_features,), (1, 1, n_features)):
        raise ConfigError("data_root", f"{root} has {n_features} features, the run expects "
                                         f"input shape {tuple(shape)}")
    dropped = train.dropped
    if test_root is not None:
        test = tables.load_table(test_root, classes, label_column, "test_root",
                                 categories=categories, other_category=other_category,
                                 missing=missing)
        if test.feature_names != train.feature_names:
            raise ConfigError("test_root", f"{test_root} has features "
                                           f"{names_text(test.feature_names)}, {root} has "
                                           f"{names_text(train.feature_names)}")
        test_x, test_y, test_source = test.features, test.labels, str(test_root)
        dropped += test.dropped
    elif train.test_features is not None and train.test_labels is not None:
        test_x, test_y = train.test_features, train.test_labels
        test_source = f"{holdout:g} of {root} held out (seed {seed})"
    else:
        test_x = np.zeros((0, n_features), dtype=np.float32)
        test_y, test_source = np.zeros(0, dtype=np.int64), ""
    data = _local_data(
        DataContract("table", classes, (n_features,), train.feature_names),
        (_rows(train.features), train.labels), (_rows(test_x), test_y),
        source=str(root), test_source=test_source, files=len(train.files),
    )
    return dataclasses.replace(data, numeric_features=train.numeric_features, dropped=dropped)


def _load_python(spec: str, classes: tuple[str, ...], shape: tuple[int, ...] | None,
                 holdout: float, seed: int, roots: dict[str, str | None]) -> LocalData:
    (train_x, train_y), test = factory.call_factory(spec, classes, seed, roots)
    sample = tuple(int(s) for s in train_x.shape[1:])
    if shape is not None and sample != shape:
        raise ConfigError("data_factory", f"data factory {spec!r} gives samples of shape "
                                         f"{sample}, the run expects {shape}")
    if test is None:
        keep, held = holdout_split(train_x.shape[0], holdout, seed)
        keep_t, held_t = torch.from_numpy(keep), torch.from_numpy(held)
        test_x, test_y = train_x[held_t], train_y[held_t]
        train_x, train_y = train_x[keep_t], train_y[keep_t]
        test_source = f"{holdout:g} held out (seed {seed})" if held.size else ""
    else:
        test_x, test_y = test
        test_source = spec
    if train_x.ndim == 2:
        train_x = train_x.reshape(train_x.shape[0], 1, 1, -1)
        test_x = test_x.reshape(test_x.shape[0], 1, 1, train_x.shape[-1])
    return _local_data(DataContract("python", classes, sample), (train_x, train_y),
                       (test_x, test_y), source=spec, test_source=test_source)
