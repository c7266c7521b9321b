"""bench_data's measurements run on a tiny generated folder and compare like with like."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_data  # type: ignore[import-not-found]

from dacflnode.learning.owndata import images
from tests.harness.owndata import write_images

pytestmark = pytest.mark.slow


def test_the_plain_loop_and_the_folder_source_decode_the_same_pixels(tmp_path, monkeypatch):
    write_images(tmp_path, {"b": 5, "a": 4}, size=28)
    monkeypatch.setattr(images, "PARALLEL_MIN_FILES", 1)  # the pool, as on 60 000 files
    x, y = bench_data.plain_loop(tmp_path)
    assert x.shape == (9, 1, 28, 28) and y.tolist() == [0] * 4 + [1] * 5
    figures = bench_data.decoding(tmp_path, repeats=1, workers=2)
    assert figures["images"] == 9 and figures["ratio"] > 0
    assert figures["ours_images_per_s"] > 0 and figures["plain_images_per_s"] > 0


def test_restart_reads_the_cache_and_times_both_loads(tmp_path, monkeypatch):
    write_images(tmp_path, {"bag": 3, "coat": 2}, size=28)
    monkeypatch.setattr(bench_data, "CLASSES", ("bag", "coat"))
    figures = bench_data.restart(tmp_path, workers=1)
    # restart() itself checks that the second load came from the cache with equal tensors
    assert figures["first_load_s"] > 0 and figures["restart_s"] > 0 and figures["ratio"] > 0


def test_the_rss_probe_counts_the_decoded_tensors_and_the_model(tmp_path, monkeypatch):
    write_images(tmp_path, {"bag": 20}, size=28)
    monkeypatch.setattr(bench_data, "CLASSES", ("bag", "coat"))
    figures = bench_data.rss_probe(tmp_path, steps=2, workers=1)
    assert figures["data_mb"] > 0 and figures["model_mb"] > 10  # fmnist-cnn: 1.66 M parameters
    assert figures["rss_training_mb"] >= figures["rss_before_mb"] > 0
