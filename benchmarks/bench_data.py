#!/usr/bin/env python3
"""A device's own image folder: decoding, the cache, training from it, and its memory.

A folder of Fashion-MNIST training images is written as PNG files (``OUT/<class>/<i>.png``, with
the writer ``dacflnode data split`` uses; ``--images`` of them, 60 000 by default), then:

(a) decoding: the folder source (``owndata.images.load_folder``: listing, a process pool of
    ``--workers`` decoding chunks of files) against a plain single-process loop of
    ``np.asarray(Image.open(path).convert("L"))`` over the same sorted files; they alternate,
    ``--repeats`` times, best of each; both results are checked equal. Target ≥ 2.
(b) restart: ``load_local_data`` with a fresh cache folder (decode, write the cache), against
    the same call again (list and stat the files, hash, read the cache); median of three
    restarts. Target ≥ 20.
(c) training: ``LocalTrainer`` samples/s (``fmnist-cnn``, batch 20, ``--steps`` steps) on the
    folder's tensors against the built-in loader's tensors of the same images (alternating,
    medians). Target ≥ 0.95.
(d) memory: a fresh process warms PyTorch up (a throwaway model trained on random tensors),
    then loads the folder and trains; its RSS while training (sampled every 10 ms) above its
    RSS before loading, against the bytes of the decoded tensors plus the model (parameters,
    gradients). Target ≤ 1.5.

The result's ``ratio`` is the worst of the four margins (each figure over its target, inverted
for (d)), so ``met`` says that all four are; the four figures are in ``checks``.
``--quick``: 6 000 images, 1 repeat, 20 steps.

    python benchmarks/bench_data.py --json
    python benchmarks/bench_data.py --quick --json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import add_standard_args, emit_result, peak_rss_while, rss_bytes
from PIL import Image

from dacflnode.learning.datasets import DEFAULT_FASHION_MNIST_ROOT, load_dataset
from dacflnode.learning.layout import StateLayout
from dacflnode.learning.models import build_model
from dacflnode.learning.owndata import load_local_data
from dacflnode.learning.owndata.images import load_folder
from dacflnode.learning.owndata.split import CLASS_NAMES, write_png_folder
from dacflnode.learning.train import LocalTrainer, TrainConfig

CLASSES = CLASS_NAMES["fashion-mnist"]


def write_folder(root: Path, n: int) -> torch.Tensor:
    """The first ``n`` Fashion-MNIST training images as PNG files; returns the built-in
    loader's tensors of them."""
    ds = load_dataset("fashion-mnist")
    (mean,), (std,) = ((0.2860,), (0.3530,))
    x = ds.train_x[:n]
    u8 = np.clip(np.rint((x.numpy() * std + mean) * 255), 0, 255).astype(np.uint8)
    write_png_folder(root, CLASSES, u8, ds.train_y[:n].numpy(), np.arange(n))
    return x


def plain_loop(root: Path) -> tuple[np.ndarray, np.ndarray]:
    """What one would write without the project: one process, one file after another."""
    xs: list[np.ndarray] = []
    ys: list[int] = []
    for label, name in enumerate(sorted(os.listdir(root))):
        for f in sorted(os.listdir(root / name)):
            xs.append(np.asarray(Image.open(root / name / f).convert("L")))
            ys.append(label)
    return np.stack(xs)[:, None], np.asarray(ys)


def timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def decoding(root: Path, repeats: int, workers: int | None) -> dict[str, Any]:
    plain_s: list[float] = []
    ours_s: list[float] = []
    names = sorted(os.listdir(root))
    for _ in range(repeats):
        t, (px, _) = timed(lambda: plain_loop(root))
        plain_s.append(t)
        t, dec = timed(lambda: load_folder(root, names, (1, 28, 28), resize=True,
                                           field="data_root", cache_dir=None, workers=workers))
        ours_s.append(t)
        if not np.array_equal(dec.images, px):
            raise SystemExit("the folder source and the plain loop decoded different pixels")
    n = px.shape[0]
    return {"images": n, "plain_s": round(min(plain_s), 3), "ours_s": round(min(ours_s), 3),
            "plain_images_per_s": round(n / min(plain_s)),
            "ours_images_per_s": round(n / min(ours_s)),
            "ratio": min(plain_s) / min(ours_s)}


def restart(root: Path, workers: int | None) -> dict[str, Any]:
    cache = Path(tempfile.mkdtemp(prefix="bench-data-cache-"))
    try:
        cold, data = timed(lambda: load_local_data("folder", root, classes=CLASSES,
                                                   cache_dir=cache, workers=workers))
        warm = []
        for _ in range(3):
            t, again = timed(lambda: load_local_data("folder", root, classes=CLASSES,
                                                     cache_dir=cache, workers=workers))
            assert again.from_cache and torch.equal(again.train_x, data.train_x)
            warm.append(t)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return {"first_load_s": round(cold, 3), "restart_s": round(statistics.median(warm), 3),
            "ratio": cold / statistics.median(warm)}


def train_rate(x: torch.Tensor, y: torch.Tensor, steps: int) -> Any:
    torch.manual_seed(0)
    model = build_model("fmnist-cnn", (1, 28, 28), 10)
    start = StateLayout.from_module(model).flatten_module(model)
    trainer = LocalTrainer(model, x, y, TrainConfig(local_steps=steps), seed=0, node_index=0)

    def once() -> float:
        t0 = time.perf_counter()
        trainer.train(start, 0)
        return steps * 20 / (time.perf_counter() - t0)

    return once


def training(root: Path, builtin_x: torch.Tensor, steps: int, repeats: int) -> dict[str, Any]:
    own = load_local_data("folder", root, classes=CLASSES)
    ds = load_dataset("fashion-mnist")
    n = builtin_x.shape[0]
    # the same images: equal as multisets of tensors (the folder is ordered by class and name)
    if not torch.allclose(own.train_x.sum(0), builtin_x.sum(0), rtol=1e-4, atol=1e-2):
        raise SystemExit("the folder's tensors are not the built-in loader's")
    own_once = train_rate(own.train_x, own.train_y, steps)
    builtin_once = train_rate(builtin_x, ds.train_y[:n], steps)
    own_once()
    builtin_once()  # warm-up
    own_rates, builtin_rates = [], []
    for _ in range(repeats):
        builtin_rates.append(builtin_once())
        own_rates.append(own_once())
    o, b = statistics.median(own_rates), statistics.median(builtin_rates)
    return {"own_samples_per_s": round(o), "builtin_samples_per_s": round(b), "ratio": o / b,
            "steps": steps, "repeats": repeats}


def rss_probe(root: Path, steps: int, workers: int | None) -> dict[str, Any]:
    """In a fresh process: RSS once PyTorch's runtime is up (a throwaway model trained on 200
    random images: kernels, thread pools, allocator), then its peak while training on the
    folder, which was loaded after that."""
    warm_x, warm_y = torch.randn(200, 1, 28, 28), torch.randint(0, 10, (200,))
    train_rate(warm_x, warm_y, steps)()
    del warm_x, warm_y
    before = rss_bytes()
    data = load_local_data("folder", root, classes=CLASSES, workers=workers)
    torch.manual_seed(0)
    model = build_model("fmnist-cnn", data.contract.input_shape, data.num_classes)
    start = StateLayout.from_module(model).flatten_module(model)
    trainer = LocalTrainer(model, data.train_x, data.train_y, TrainConfig(local_steps=steps),
                           seed=0, node_index=0)
    peak = peak_rss_while(lambda: trainer.train(start, 0))
    data_bytes = sum(t.nbytes for t in (data.train_x, data.train_y, data.test_x, data.test_y))
    model_bytes = 2 * sum(p.nbytes for p in model.parameters()) + sum(
        b.nbytes for b in model.buffers())
    return {"rss_before_mb": round(before / 2**20, 1), "rss_training_mb": round(peak / 2**20, 1),
            "data_mb": round(data_bytes / 2**20, 1), "model_mb": round(model_bytes / 2**20, 1),
            "ratio": (peak - before) / (data_bytes + model_bytes)}


def memory(root: Path, steps: int, workers: int | None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--rss-probe", str(root), "--steps", str(steps)]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=60_000, help="PNG files in the folder")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60, help="training steps per timing")
    ap.add_argument("--workers", type=int, default=None,
                    help="decoding processes [default: one per CPU]")
    ap.add_argument("--folder", type=Path,
                    help="write the PNG folder here and keep it (reused when it exists)")
    ap.add_argument("--rss-probe", type=Path, help=argparse.SUPPRESS)
    add_standard_args(ap)
    args = ap.parse_args()
    if args.rss_probe is not None:
        print(json.dumps(rss_probe(args.rss_probe, args.steps, args.workers)))
        return 0
    if args.quick:
        args.images, args.repeats, args.steps = 6_000, 1, 20
    if not (DEFAULT_FASHION_MNIST_ROOT / "train-images-idx3-ubyte.gz").exists():
        raise SystemExit(f"needs Fashion-MNIST in {DEFAULT_FASHION_MNIST_ROOT} "
                         "(apt-get install dataset-fashion-mnist)")
    keep = args.folder is not None
    root = args.folder if keep else Path(tempfile.mkdtemp(prefix="bench-data-"))
    try:
        t_write = time.perf_counter()
        if keep and root.is_dir() and any(root.iterdir()):
            ds = load_dataset("fashion-mnist")
            builtin_x = ds.train_x[:args.images]
        else:
            builtin_x = write_folder(root, args.images)
        t_write = time.perf_counter() - t_write
        checks = {
            "decode": {**decoding(root, args.repeats, args.workers), "target": 2.0},
            "restart": {**restart(root, args.workers), "target": 20.0},
            "training": {**training(root, builtin_x, args.steps, max(3, args.repeats)),
                        "target": 0.95},
            "memory": {**memory(root, args.steps, args.workers), "target": 1.5},
        }
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    margins = {k: (c["ratio"] / c["target"] if k != "memory" else c["target"] / c["ratio"])
               for k, c in checks.items()}
    for c in checks.values():
        c["ratio"] = round(c["ratio"], 3)
        c["met"] = (c["ratio"] <= c["target"]) if c is checks["memory"] else \
            (c["ratio"] >= c["target"])
    if not args.json:
        print(f"{args.images} PNG images written in {t_write:.1f} s")
        for k, c in checks.items():
            print(f"{k:9} {c['ratio']:8.3f}  target {'<=' if k == 'memory' else '>='} "
                  f"{c['target']}  {'met' if c['met'] else 'NOT met'}  "
                  + ", ".join(f"{kk}={v}" for kk, v in c.items()
                              if kk not in ("ratio", "target", "met")))
    emit_result("data", min(margins.values()), 1.0, True, as_json=args.json,
                images=args.images, workers=args.workers, write_s=round(t_write, 1),
                threads=torch.get_num_threads(), checks=checks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
