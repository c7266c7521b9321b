#!/usr/bin/env python3
"""Tables as a new user brings them: raw Fashion-MNIST pixel values (0-255) as per-device CSV
files, real daemons with the default settings, with the network's agreed feature scale and
without it.

The CSV files are written here with numpy alone (the idx files read with ``gzip``, one file per
device, a header ``label,p0,...,p783``, integer cells), as any user's script would write them:
no project code touches them. ``--rows`` training images per device (20 000: the whole training
set over 3 devices; 2 000 with ``--quick``), dealt to the devices by a seeded permutation.

Arms, each ``dacflnode launch --nodes 3 --rounds 6 --dataset table --label-column label
--classes 0,...,9 --data-root OUT`` and nothing else (the defaults: the ``mlp``, the table
learning rate, the held-out fraction as test set):

* ``scaled``: the default ``scaling: standardize`` (the nodes agree on the union's mean and
  standard deviation before round 1);
* ``raw``: ``--scaling none``, the features as they are in the files (the baseline).

Then ``dacflnode simulate --topology ring --engine sequential --threads 1`` (launch's graph, a
daemon's training code and thread count) runs on the same files with the scaled arm's
settings, and the result reports the largest difference between its final models and the
daemons' (``sim_vs_launch_max_abs``) and how many distinct feature scales the daemons hold (1).

Memory (``memory``): a fresh process warms PyTorch up (a throwaway ``mlp`` trained on random
rows) and the reader (a two-row table through the same loader), then loads node-0's table
with the daemon's loader (two streaming passes into preallocated arrays), scales it in place
and trains 60 steps; its RSS while training (sampled every 10 ms) above its RSS before
loading, against the bytes of the encoded rows (train and test) plus the model (parameters
and gradients). Target ≤ 1.5.

The ratio is the scaled arm's final mean accuracy over the raw arm's (target 1: better);
``accuracy`` and ``accuracy_target`` (0.55) are the must-show.

    .venv/bin/python benchmarks/bench_tables.py --quick --json
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import add_standard_args, emit_result, peak_rss_while, rss_bytes

FMNIST = Path("/usr/share/datasets/fashion-mnist")
NODES, ROUNDS = 3, 6
CLASSES = ",".join(str(c) for c in range(10))


def read_idx(path: Path) -> np.ndarray:
    """An idx file (gzip) as a uint8 array: the format's own header, read by hand."""
    raw = gzip.decompress(path.read_bytes())
    dims = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def write_devices(out: Path, rows: int, seed: int) -> None:
    images = read_idx(FMNIST / "train-images-idx3-ubyte.gz").reshape(-1, 784)
    labels = read_idx(FMNIST / "train-labels-idx1-ubyte.gz")
    order = np.random.default_rng(seed).permutation(len(labels))[:rows * NODES]
    header = "label," + ",".join(f"p{i}" for i in range(784))
    for node in range(NODES):
        pick = order[node * rows:(node + 1) * rows]
        table = np.concatenate([labels[pick, None], images[pick]], axis=1).astype(np.int64)
        folder = out / f"node-{node}"
        folder.mkdir(parents=True, exist_ok=True)
        np.savetxt(folder / "train.csv", table, fmt="%d", delimiter=",", header=header,
                   comments="")


def dacflnode(*args: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "dacflnode", *args, "--json"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"dacflnode {' '.join(args)} failed ({proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def final_accuracy(folder: Path) -> float:
    accs = []
    for node in range(NODES):
        lines = (folder / f"node-{node}" / "metrics.jsonl").read_text().splitlines()
        accs.append(json.loads(lines[-1])["accuracy"])
    return float(np.mean(accs))


def max_abs_diff(a: Path, b: Path) -> float:
    from safetensors.numpy import load_file

    one, two = load_file(str(a)), load_file(str(b))
    return max(float(np.max(np.abs(one[k].astype(np.float64) - two[k]))) for k in one)


def rss_probe(table: Path) -> dict[str, Any]:
    """In a fresh process: RSS once PyTorch is up, then its peak while training on ``table``
    (loaded and scaled after that)."""
    import torch

    from dacflnode.learning.feature_scale import LocalMoments
    from dacflnode.learning.layout import StateLayout
    from dacflnode.learning.models import build_model
    from dacflnode.learning.owndata import load_local_data
    from dacflnode.learning.train import LocalTrainer, TrainConfig
    from dacflnode.protocol.scale_agreement import scale_of

    def trained(x: torch.Tensor, y: torch.Tensor) -> tuple[LocalTrainer, torch.nn.Module]:
        torch.manual_seed(0)
        model = build_model("mlp", (1, 1, x.shape[-1]), 10)
        return LocalTrainer(model, x, y, TrainConfig(local_steps=60, lr=0.05), seed=0,
                            node_index=0), model

    warm, _ = trained(torch.randn(200, 1, 1, 784), torch.randint(0, 10, (200,)))
    warm.train(StateLayout.from_module(warm.model).flatten_module(warm.model), 0)
    del warm
    # the reader's runtime too (pyarrow's libraries and thread pools), as torch's: a table of
    # two rows through the same loader
    tiny = table.with_name("warm-up.csv")
    tiny.write_text("label,a\n1,2\n3,4\n")
    load_local_data("table", tiny, classes=CLASSES.split(","), label_column="label")
    tiny.unlink()
    before = rss_bytes()
    data = load_local_data("table", table, classes=CLASSES.split(","), label_column="label",
                           holdout=0.2)
    scale_of("standardize", [LocalMoments.of(data.train_x, data.numeric_features)]).apply(
        data.train_x)
    trainer, model = trained(data.train_x, data.train_y)
    start = StateLayout.from_module(model).flatten_module(model)
    peak = peak_rss_while(lambda: trainer.train(start, 0))
    data_bytes = sum(t.nbytes for t in (data.train_x, data.train_y, data.test_x, data.test_y))
    model_bytes = 2 * sum(p.nbytes for p in model.parameters())
    return {"rss_before_mb": round(before / 2**20, 1), "rss_training_mb": round(peak / 2**20, 1),
            "data_mb": round(data_bytes / 2**20, 1), "model_mb": round(model_bytes / 2**20, 1),
            "ratio": round((peak - before) / (data_bytes + model_bytes), 3), "target": 1.5}


def memory(table: Path) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--rss-probe", str(table)], check=True,
                         capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_standard_args(parser)
    parser.add_argument("--rows", type=int, default=None,
                        help="training images per device (default 20000; 2000 with --quick)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rss-probe", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_probe is not None:
        print(json.dumps(rss_probe(args.rss_probe)))
        return 0
    rows = args.rows or (2000 if args.quick else 20000)
    common = ["--nodes", str(NODES), "--rounds", str(ROUNDS), "--dataset", "table",
              "--label-column", "label", "--classes", CLASSES]
    result: dict[str, Any] = {"rows_per_device": rows}
    with tempfile.TemporaryDirectory(prefix="bench-tables-") as scratch:
        root = Path(scratch)
        began = time.perf_counter()
        write_devices(root / "data", rows, args.seed)
        result["write_s"] = round(time.perf_counter() - began, 1)
        result["memory"] = memory(root / "data" / "node-0" / "train.csv")
        print(f"memory: {result['memory']}", file=sys.stderr, flush=True)
        data = ["--data-root", str(root / "data")]
        for arm, extra in (("scaled", []), ("raw", ["--scaling", "none"])):
            began = time.perf_counter()
            dacflnode("launch", *common, *data, *extra, "--out", str(root / arm))
            result[arm] = {"accuracy": round(final_accuracy(root / arm), 4),
                           "wall_s": round(time.perf_counter() - began, 1)}
            print(f"{arm}: accuracy {result[arm]['accuracy']:.3f} after {ROUNDS} rounds "
                  f"({result[arm]['wall_s']} s)", file=sys.stderr, flush=True)
        scales = {(root / "scaled" / f"node-{n}" / "feature-scale.json").read_text()
                  for n in range(NODES)}
        result["distinct_feature_scales"] = len(scales)  # 1: every daemon the same bits
        # launch's default graph and one thread, as each daemon (simulate's own defaults are
        # a dense graph and PyTorch's thread count, whose sums round otherwise)
        dacflnode("simulate", *common, *data, "--topology", "ring", "--engine", "sequential",
                  "--threads", "1", "--out", str(root / "sim"))
        diffs = [max_abs_diff(root / "scaled" / f"node-{n}" / "final.safetensors",
                              root / "sim" / f"node-{n}" / "final.safetensors")
                 for n in range(NODES)]
        result["sim_vs_launch_max_abs"] = max(diffs)
    accuracy = result["scaled"]["accuracy"]
    emit_result("tables_agreed_scale_accuracy_vs_raw", accuracy / result["raw"]["accuracy"],
                1.0, True, as_json=args.json, accuracy=accuracy, accuracy_target=0.55,
                accuracy_met=accuracy >= 0.55, **result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
