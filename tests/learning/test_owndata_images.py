"""Image folders: labels by class name, the cache, parallel decoding, every bad input."""

import os

import numpy as np
import pytest
import torch
from PIL import Image

from dacflnode.errors import ConfigError
from dacflnode.learning import imagedecode
from dacflnode.learning.owndata import IMAGE_NORMALIZATION, images, load_local_data
from tests.harness.owndata import corrupt, pixels_of, write_images


def one_line(err: pytest.ExceptionInfo[ConfigError]) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_labels_map_by_class_name_not_folder_order(tmp_path):
    write_images(tmp_path, {"apple": 3, "zebra": 4}, value={"apple": 10, "zebra": 200})
    data = load_local_data("folder", tmp_path, classes=["zebra", "apple"])
    px = pixels_of(data.train_x)[:, 0, 0, 0]
    assert set(px[data.train_y.numpy() == 0]) == {200}  # zebra is class 0
    assert set(px[data.train_y.numpy() == 1]) == {10}
    assert data.histogram == {"zebra": 4, "apple": 3}
    assert data.contract.classes == ("zebra", "apple")
    assert data.num_classes == 2 and data.name == "folder"


def test_a_device_lacking_classes_loads_with_zero_counts(tmp_path):
    write_images(tmp_path, {"a": 2, "c": 3})
    data = load_local_data("folder", tmp_path, classes=["a", "b", "c", "d"])
    assert data.histogram == {"a": 2, "b": 0, "c": 3, "d": 0}
    assert data.contract.num_classes == 4
    assert set(data.train_y.tolist()) == {0, 2}


def test_pixels_are_normalised_with_the_fixed_grayscale_constants(tmp_path):
    written = write_images(tmp_path, {"a": 2})
    data = load_local_data("folder", tmp_path, classes=["a"])
    (mean,), (std,) = IMAGE_NORMALIZATION[1]
    expected = (written["a"].astype(np.float32) / 255 - mean) / std
    torch.testing.assert_close(data.train_x[:, 0], torch.from_numpy(expected))
    assert data.contract.input_shape == (1, 8, 8)


def test_images_are_converted_to_rgb_and_resized_to_the_run_shape(tmp_path):
    write_images(tmp_path, {"a": 2}, size=12)
    data = load_local_data("folder", tmp_path, classes=["a"], input_shape=(3, 6, 6))
    assert tuple(data.train_x.shape) == (2, 3, 6, 6)
    # gray pixels stay gray: the three channels hold the same value before normalisation
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in IMAGE_NORMALIZATION[3])
    raw = data.train_x * std + mean
    torch.testing.assert_close(raw[:, 0], raw[:, 1], atol=1e-5, rtol=0)


def test_a_class_folder_not_in_classes_is_one_line_naming_it(tmp_path):
    write_images(tmp_path, {"a": 1, "stray": 1})
    with pytest.raises(ConfigError) as err:
        load_local_data("folder", tmp_path, classes=["a", "b"])
    assert err.value.field == "classes"
    assert "stray" in one_line(err) and "add 'stray'" in str(err.value)


def test_an_empty_folder_is_an_error_naming_it(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "notes.txt").write_text("no images here")
    with pytest.raises(ConfigError) as err:
        load_local_data("folder", tmp_path, classes=["a"])
    assert err.value.field == "data_root" and str(tmp_path) in one_line(err)
    assert "no images" in str(err.value)


def test_a_missing_folder_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_local_data("folder", tmp_path / "nowhere", classes=["a"])


def test_corrupt_images_fail_listing_the_first_five(tmp_path):
    write_images(tmp_path, {"a": 2})
    for i in range(7):
        corrupt(tmp_path / "a" / f"bad{i}.png")
    with pytest.raises(ConfigError) as err:
        load_local_data("folder", tmp_path, classes=["a"])
    text = one_line(err)
    assert err.value.field == "data_root"
    assert "7 image file(s) cannot be read" in text
    assert sum(f"bad{i}.png" in text for i in range(7)) == 5
    assert text.count("bad0.png") == 1  # the reason does not repeat the file's name
    assert "bad_files: skip" in text


def test_corrupt_images_are_counted_and_left_out_when_skipped(tmp_path):
    write_images(tmp_path, {"a": 3})
    corrupt(tmp_path / "a" / "broken.png")
    data = load_local_data("folder", tmp_path, classes=["a"], on_bad="skip")
    assert data.skipped == 1 and data.train_size == 3
    assert data.skipped_files[0][0] == "a/broken.png"


def test_a_folder_of_only_corrupt_images_is_an_error_even_when_skipping(tmp_path):
    corrupt(tmp_path / "a" / "x.png")
    with pytest.raises(ConfigError, match="none of its 1 images"):
        load_local_data("folder", tmp_path, classes=["a"], on_bad="skip")


def test_mixed_sizes_with_resize_off_is_one_line_naming_a_file(tmp_path):
    root = tmp_path / "data"
    write_images(root, {"a": 2}, size=8)
    write_images(root, {"b": 1}, size=10)
    with pytest.raises(ConfigError) as err:
        load_local_data("folder", root, classes=["a", "b"], input_shape=(1, 8, 8),
                        resize=False)
    assert err.value.field == "resize"
    assert "b/0000.png is 10x10" in one_line(err)
    data = load_local_data("folder", root, classes=["a", "b"], input_shape=(1, 8, 8))
    assert data.train_size == 3


class CountingDecoder:
    def __init__(self, monkeypatch):
        self.files = 0
        real = imagedecode.decode_files

        def counting(paths, *args):
            self.files += len(paths)
            return real(paths, *args)

        monkeypatch.setattr(imagedecode, "decode_files", counting)


def test_the_cache_skips_decoding_on_restart_and_notices_a_changed_file(tmp_path, monkeypatch):
    root, cache = tmp_path / "data", tmp_path / "state"
    write_images(root, {"a": 3, "b": 2})
    counter = CountingDecoder(monkeypatch)
    first = load_local_data("folder", root, classes=["a", "b"], cache_dir=cache, workers=1)
    assert counter.files == 5 and not first.from_cache
    again = load_local_data("folder", root, classes=["a", "b"], cache_dir=cache, workers=1)
    assert counter.files == 5 and again.from_cache
    torch.testing.assert_close(again.train_x, first.train_x)
    assert torch.equal(again.train_y, first.train_y)
    # one file rewritten with other pixels (and so another size or mtime)
    Image.fromarray(np.full((8, 8), 7, dtype=np.uint8)).save(root / "b" / "0001.png")
    st = os.stat(root / "b" / "0001.png")
    os.utime(root / "b" / "0001.png", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    changed = load_local_data("folder", root, classes=["a", "b"], cache_dir=cache, workers=1)
    assert counter.files == 10 and not changed.from_cache
    assert set(pixels_of(changed.train_x)[-1].ravel()) == {7}


def test_the_cache_is_keyed_by_the_target_shape_and_classes(tmp_path, monkeypatch):
    root, cache = tmp_path / "data", tmp_path / "state"
    write_images(root, {"a": 2})
    counter = CountingDecoder(monkeypatch)
    load_local_data("folder", root, classes=["a"], cache_dir=cache, workers=1)
    load_local_data("folder", root, classes=["a"], input_shape=(1, 4, 4), cache_dir=cache,
                    workers=1)
    load_local_data("folder", root, classes=["a", "b"], input_shape=(1, 4, 4),
                    cache_dir=cache, workers=1)
    assert counter.files == 6
    files = sorted(p.name for p in (cache / images.CACHE_FOLDER).iterdir())
    assert all(name.endswith((".npy", ".json")) for name in files)


def test_skipped_files_are_remembered_by_the_cache(tmp_path):
    root, cache = tmp_path / "data", tmp_path / "state"
    write_images(root, {"a": 2})
    corrupt(root / "a" / "bad.png")
    load_local_data("folder", root, classes=["a"], cache_dir=cache, on_bad="skip")
    with pytest.raises(ConfigError, match="1 image file"):
        load_local_data("folder", root, classes=["a"], cache_dir=cache)
    again = load_local_data("folder", root, classes=["a"], cache_dir=cache, on_bad="skip")
    assert again.from_cache and again.skipped == 1


def test_parallel_decoding_equals_sequential_decoding(tmp_path, monkeypatch):
    write_images(tmp_path, {"a": 9, "b": 8, "c": 7}, size=10)
    corrupt(tmp_path / "b" / "bad.png")
    monkeypatch.setattr(images, "PARALLEL_MIN_FILES", 1)
    monkeypatch.setattr(images, "CHUNK_FILES", 5)
    def load(workers):
        return load_local_data("folder", tmp_path, classes=["c", "b", "a"],
                               input_shape=(1, 6, 6), on_bad="skip", workers=workers)

    sequential, parallel = load(1), load(2)
    assert torch.equal(parallel.train_x, sequential.train_x)
    assert torch.equal(parallel.train_y, sequential.train_y)
    assert parallel.skipped_files == sequential.skipped_files == (("b/bad.png",
                                                                    parallel.skipped_files[0][1]),)


def test_progress_reports_every_file(tmp_path):
    write_images(tmp_path, {"a": 4})
    seen: list[tuple[int, int]] = []
    load_local_data("folder", tmp_path, classes=["a"], progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (4, 4)


def test_the_held_out_split_is_deterministic_by_seed(tmp_path):
    write_images(tmp_path, {"a": 20, "b": 20})
    one = load_local_data("folder", tmp_path, classes=["a", "b"], holdout=0.25, seed=3)
    two = load_local_data("folder", tmp_path, classes=["a", "b"], holdout=0.25, seed=3)
    other = load_local_data("folder", tmp_path, classes=["a", "b"], holdout=0.25, seed=4)
    assert one.test_size == 10 and one.train_size == 30
    assert torch.equal(one.test_x, two.test_x) and torch.equal(one.train_y, two.train_y)
    assert not torch.equal(one.test_x, other.test_x)
    # train and test are disjoint and together all the data
    everything = {tuple(r) for r in pixels_of(one.train_x).reshape(30, -1).tolist()}
    held = {tuple(r) for r in pixels_of(one.test_x).reshape(10, -1).tolist()}
    assert not everything & held and len(everything | held) == 40
    assert sum(one.test_histogram.values()) == 10


def test_a_test_root_is_the_test_set(tmp_path):
    write_images(tmp_path / "train", {"a": 3, "b": 3})
    write_images(tmp_path / "test", {"b": 2}, size=16, seed=1)
    data = load_local_data("folder", tmp_path / "train", classes=["a", "b"],
                           test_root=tmp_path / "test", holdout=0.5)
    assert data.train_size == 6 and data.test_size == 2
    assert data.test_histogram == {"a": 0, "b": 2}
    assert tuple(data.test_x.shape[1:]) == (1, 8, 8)  # resized to the training shape


@pytest.mark.parametrize("holdout", [-0.1, 1.0])
def test_a_holdout_outside_zero_to_one_is_refused(tmp_path, holdout):
    write_images(tmp_path, {"a": 2})
    with pytest.raises(ConfigError) as err:
        load_local_data("folder", tmp_path, classes=["a"], holdout=holdout)
    assert err.value.field == "holdout"


def test_a_data_set_too_large_for_memory_is_refused_before_decoding(tmp_path, monkeypatch):
    write_images(tmp_path, {"a": 2})
    counter = CountingDecoder(monkeypatch)
    with pytest.raises(ConfigError) as err:
        load_local_data("folder", tmp_path, classes=["a"], input_shape=(3, 200_000, 200_000))
    assert err.value.field == "image_size" and "GiB" in one_line(err)
    assert counter.files == 0


def test_a_decoding_process_that_dies_is_one_line_naming_the_files(tmp_path, monkeypatch):
    write_images(tmp_path, {"a": 4})
    monkeypatch.setattr(images, "PARALLEL_MIN_FILES", 1)
    monkeypatch.setattr(imagedecode, "decode_files", _die)
    with pytest.raises(ConfigError) as err:
        load_local_data("folder", tmp_path, classes=["a"], workers=2)
    assert "a decoding process died" in one_line(err) and "--workers 1" in str(err.value)


def _die(*args):
    os._exit(3)
