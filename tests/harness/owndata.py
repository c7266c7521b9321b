"""Small own-data sets written the way a device would hold them, with PIL and the csv module
(not the project's own writers): per-node PNG class folders and per-node CSV tables for the
cluster and simulator tests; single image folders, CSV files and bad files for the readers'."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from dacflnode.learning.owndata import IMAGE_NORMALIZATION

CLASSES = ("cat", "dog", "eel")
#: Samples per class of each node: unequal sizes, and each node lacks or nearly lacks a class.
MIX: dict[str, dict[str, int]] = {
    "node-0": {"cat": 14, "dog": 4},
    "node-1": {"cat": 2, "dog": 12, "eel": 8},
    "node-2": {"eel": 16, "cat": 6},
}
FEATURES = ("f0", "f1", "f2", "f3")


def _prototypes(size: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {c: rng.integers(0, 256, (size, size)).astype(np.float64) for c in CLASSES}


def _image(proto: np.ndarray, rng: np.random.Generator) -> Image.Image:
    pixels = np.clip(proto + rng.normal(0, 40, proto.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(pixels, "L")


def write_png_nodes(root: Path, mix: Mapping[str, Mapping[str, int]] = MIX, size: int = 8,
                    seed: int = 0, test_per_class: int = 6) -> tuple[Path, Path]:
    """``root/train/<node>/<class>/*.png`` per node and one shared ``root/test/<class>/``;
    returns the two folders."""
    protos = _prototypes(size, seed)
    rng = np.random.default_rng(seed + 1)
    for node, counts in mix.items():
        for cls, n in counts.items():
            folder = root / "train" / node / cls
            folder.mkdir(parents=True, exist_ok=True)
            for k in range(n):
                _image(protos[cls], rng).save(folder / f"{k:03d}.png")
    for cls in CLASSES:
        folder = root / "test" / cls
        folder.mkdir(parents=True, exist_ok=True)
        for k in range(test_per_class):
            _image(protos[cls], rng).save(folder / f"{k:03d}.png")
    return root / "train", root / "test"


def _rows(counts: Mapping[str, int], rng: np.random.Generator,
          centres: Mapping[str, np.ndarray]) -> list[list[str]]:
    rows = []
    for cls, n in counts.items():
        for _ in range(n):
            x = centres[cls] + rng.normal(0, 0.5, len(FEATURES))
            rows.append([f"{v:.5f}" for v in x] + [cls])
    return rows


def write_csv_nodes(root: Path, mix: Mapping[str, Mapping[str, int]] = MIX, seed: int = 0,
                    test_per_class: int = 10) -> tuple[Path, Path]:
    """``root/train/<node>/data.csv`` per node (features f0..f3, label column ``kind``) and one
    shared ``root/test.csv``; returns the train folder and the test file."""
    rng = np.random.default_rng(seed)
    centres = {c: rng.normal(0, 2, len(FEATURES)) for c in CLASSES}

    def write(path: Path, rows: list[list[str]]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow([*FEATURES, "kind"])
            writer.writerows(rows)

    for node, counts in mix.items():
        write(root / "train" / node / "data.csv", _rows(counts, rng, centres))
    write(root / "test.csv", _rows(dict.fromkeys(CLASSES, test_per_class), rng, centres))
    return root / "train", root / "test.csv"


def pixels_of(x: torch.Tensor) -> np.ndarray:
    """Normalised one-channel images back to their uint8 pixels."""
    (mean,), (std,) = IMAGE_NORMALIZATION[1]
    return np.rint((x.numpy() * std + mean) * 255).astype(np.uint8)


def write_images(root: Path, counts: dict[str, int], *, size: int = 8, mode: str = "L",
                 seed: int = 0, value: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """``root/<class>/<i>.png`` with ``counts[class]`` random images (or constant ``value``)
    each; returns every class's pixels as ``uint8 [n, H, W(, 3)]`` in file-name order."""
    rng = np.random.default_rng(seed)
    written: dict[str, np.ndarray] = {}
    for name, n in counts.items():
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        shape = (n, size, size) if mode == "L" else (n, size, size, 3)
        if value is not None:
            pixels = np.full(shape, value[name], dtype=np.uint8)
        else:
            pixels = rng.integers(0, 256, shape, dtype=np.uint8)
        for i in range(n):
            Image.fromarray(pixels[i], mode).save(folder / f"{i:04d}.png")
        written[name] = pixels
    return written


def corrupt(path: Path) -> Path:
    """Write bytes that are no image to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n but then nothing an image needs")
    return path


def write_csv(path: Path, header: list[str], rows: Sequence[Sequence[object]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [",".join(header)] + [",".join(str(v) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path
