"""Decoding image files into one ``uint8`` array: the work a folder source hands to its process
pool.

This module imports only numpy and Pillow (no torch), so that a worker process starts in
milliseconds; :mod:`dacflnode.learning.owndata.images` lists, caches and schedules.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
from PIL import Image, PngImagePlugin

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
"""File endings (any case) a class folder's images may have; other files are ignored."""

_GRAY_MODES = frozenset({"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F"})


def channels_of_mode(mode: str) -> int:
    """1 for Pillow's grayscale modes, 3 for everything else (converted to RGB)."""
    return 1 if mode in _GRAY_MODES else 3


def peek(path: str) -> tuple[int, int, int]:
    """``(C, H, W)`` an image file would decode to without resizing (header only)."""
    with open_image(path) as im:
        w, h = im.size
        return (channels_of_mode(im.mode), int(h), int(w))


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

_PNG_MODES = {0: "L", 2: "RGB", 4: "LA", 6: "RGBA"}
"""PNG colour types the fast path reads (8 bits per sample), as Pillow modes."""


def _fast_png(data: bytes) -> Image.Image | None:
    """A plain PNG (8-bit gray, gray+alpha, RGB or RGBA, not interlaced) decoded by Pillow's
    zlib/PNG-filter decoder straight from its IDAT chunks, without Pillow's chunk-by-chunk
    Python reader; ``None`` for anything else (palette, 16 bits, interlaced, odd chunks), which
    goes the usual way. Sizes are checked against Pillow's pixel limit before allocating; a
    truncated or corrupt stream raises as Pillow does."""
    n = len(data)
    if n < 33 or data[12:16] != b"IHDR":
        return None
    width, height, depth, colour, _, _, interlace = struct.unpack_from(">IIBBBBB", data, 16)
    mode = _PNG_MODES.get(colour)
    if mode is None or depth != 8 or interlace != 0 or width == 0 or height == 0:
        return None
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and width * height > 2 * limit:
        raise Image.DecompressionBombError(
            f"{width}x{height} pixels is over Pillow's limit of {2 * limit}"
        )
    pos = 8
    idat: list[bytes] = []
    while pos + 8 <= n:
        length, chunk_type = struct.unpack_from(">I4s", data, pos)
        if chunk_type == b"IDAT":
            idat.append(data[pos + 8:pos + 8 + length])
        elif chunk_type == b"IEND":
            break
        elif chunk_type in (b"PLTE", b"tRNS", b"fdAT", b"acTL"):
            return None  # transparency or animation: Pillow's reader knows what they mean
        pos += 12 + length
    else:
        raise SyntaxError("truncated PNG: no IEND chunk")
    if not idat:
        raise SyntaxError("PNG without image data")
    return Image.frombytes(mode, (width, height), b"".join(idat), "zip", mode, 0)


def open_image(path: str) -> Image.Image:
    """Open ``path`` with Pillow. A ``.png`` file that starts with the PNG signature is read in
    one go and, when plain, decoded by Pillow's PNG decoder without its Python chunk reader
    (:func:`_fast_png`; half the time per small file); otherwise, and for every other file,
    :func:`PIL.Image.open`. Pillow's decompression-bomb limit holds for both."""
    if path[-4:].lower() == ".png":
        with open(path, "rb") as fh:
            data = fh.read()
        if data[:8] == _PNG_SIGNATURE:
            fast = _fast_png(data)
            if fast is not None:
                return fast
            im = PngImagePlugin.PngImageFile(io.BytesIO(data))
            limit = Image.MAX_IMAGE_PIXELS
            if limit is not None and im.size[0] * im.size[1] > 2 * limit:
                raise Image.DecompressionBombError(
                    f"{im.size[0]}x{im.size[1]} pixels is over Pillow's limit of {2 * limit}"
                )
            return im
    return Image.open(path)


class SizeMismatch(Exception):
    """An image is not the target size and resizing is off."""


def decode_one(path: str, channels: int, height: int, width: int, resize: bool) -> np.ndarray:
    """One file as ``uint8 [C, H, W]``: converted to L (1 channel) or RGB (3), resized with
    bilinear filtering to ``(height, width)`` when ``resize`` (else :class:`SizeMismatch`)."""
    mode = "L" if channels == 1 else "RGB"
    with open_image(path) as opened:
        im: Image.Image = opened
        if im.size != (width, height):
            if not resize:
                raise SizeMismatch(f"{im.size[0]}x{im.size[1]}")
            if opened.format == "JPEG":
                opened.draft(mode, (width, height))  # let libjpeg scale down while decoding
        if im.mode != mode:
            im = im.convert(mode)
        if im.size != (width, height):
            im = im.resize((width, height), Image.Resampling.BILINEAR)
        arr = np.asarray(im, dtype=np.uint8)
    if channels == 1:
        return arr[None]
    return arr.transpose(2, 0, 1)


def decode_files(
    paths: list[str], channels: int, height: int, width: int, resize: bool
) -> tuple[np.ndarray, list[tuple[int, str]], list[tuple[int, str]]]:
    """Decode ``paths`` into ``uint8 [len(paths), C, H, W]``.

    Returns the array, the files that could not be decoded as ``(index, reason)`` (their rows are
    zeros), and, with ``resize`` off, the files of another size as ``(index, "WxH")``.
    """
    out = np.zeros((len(paths), channels, height, width), dtype=np.uint8)
    bad: list[tuple[int, str]] = []
    mismatched: list[tuple[int, str]] = []
    for i, path in enumerate(paths):
        try:
            out[i] = decode_one(path, channels, height, width, resize)
        except SizeMismatch as size:
            mismatched.append((i, str(size)))
        except Exception as err:
            bad.append((i, _reason(err, path)))
    return out, bad, mismatched


def _reason(err: Exception, path: str) -> str:
    """The first line of ``err``, without the file's name (messages name it already)."""
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    text = text.replace(f" {path!r}", "").replace(f" {path}", "")
    return text[:200]


def relative(path: str, root: Path) -> str:
    """``path`` relative to ``root`` when under it, for messages."""
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return path
