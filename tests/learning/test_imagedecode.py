"""The decoder a folder's worker processes run: equal to Pillow, whatever the PNG holds."""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dacflnode.learning import imagedecode


def save(tmp_path, name, im, **kwargs):
    path = tmp_path / name
    im.save(path, **kwargs)
    return str(path)


def pillow_pixels(path, channels):
    with Image.open(path) as im:
        arr = np.asarray(im.convert("L" if channels == 1 else "RGB"))
    return arr[None] if channels == 1 else arr.transpose(2, 0, 1)


@pytest.mark.parametrize("mode", ["L", "LA", "RGB", "RGBA", "P", "I;16", "1"])
@pytest.mark.parametrize("channels", [1, 3])
def test_every_png_kind_decodes_as_pillow_decodes_it(tmp_path, mode, channels):
    rng = np.random.default_rng(0)
    base = Image.fromarray(rng.integers(0, 256, (9, 7, 4), dtype=np.uint8), "RGBA")
    if mode == "I;16":
        im = Image.fromarray(rng.integers(0, 65535, (9, 7), dtype=np.uint16))
    else:
        im = (base.convert("RGB") if mode == "P" else base).convert(mode)
    path = save(tmp_path, "x.png", im)
    got = imagedecode.decode_one(path, channels, 9, 7, resize=False)
    assert np.array_equal(got, pillow_pixels(path, channels))


def test_an_interlaced_png_and_a_jpeg_decode_as_pillow_decodes_them(tmp_path):
    rng = np.random.default_rng(1)
    im = Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8), "RGB")
    jpeg = save(tmp_path, "x.jpg", im, quality=90)
    assert np.array_equal(imagedecode.decode_one(jpeg, 3, 16, 16, resize=False),
                          pillow_pixels(jpeg, 3))
    png = save(tmp_path, "x.png", im, interlace=1)
    assert np.array_equal(imagedecode.decode_one(png, 3, 16, 16, resize=False),
                          pillow_pixels(png, 3))


def test_truncated_and_mislabelled_files_are_bad_files_not_crashes(tmp_path):
    im = Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8))
    good = save(tmp_path, "good.png", im)
    data = Path(good).read_bytes()
    (tmp_path / "cut.png").write_bytes(data[: len(data) - 20])
    (tmp_path / "junk.png").write_bytes(data[:40] + b"\0" * 30)
    (tmp_path / "text.png").write_text("hello")
    jpeg_named_png = save(tmp_path, "tmp.jpg", im)
    (tmp_path / "jpeg.png").write_bytes(Path(jpeg_named_png).read_bytes())
    paths = [str(tmp_path / n) for n in ("good.png", "cut.png", "junk.png", "text.png",
                                          "jpeg.png")]
    out, bad, mismatched = imagedecode.decode_files(paths, 1, 8, 8, resize=False)
    assert [i for i, _ in bad] == [1, 2, 3] and not mismatched
    assert np.array_equal(out[0, 0], np.asarray(im))
    assert np.array_equal(out[4], pillow_pixels(str(tmp_path / "jpeg.png"), 1))


def test_a_png_over_pillows_pixel_limit_is_refused_before_decoding(tmp_path, monkeypatch):
    path = save(tmp_path, "big.png", Image.new("L", (40, 40)))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(Image.DecompressionBombError):
        imagedecode.decode_one(path, 1, 40, 40, resize=False)
