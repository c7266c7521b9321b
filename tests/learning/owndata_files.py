"""Tiny own-data files for tests: image folders written with Pillow, CSV tables, bad files."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from dacflnode.learning.owndata import IMAGE_NORMALIZATION


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
