"""Your own model and data set, trained by dacflnode's simulator with DACFL and a baseline.

The model is ``my_model.OrientationNet`` beside this file, named ``"my_model:OrientationNet"``
(the spelling ``--model`` takes on the command line too). The data set is made here: images of
stripes at one of four angles, with random phase and noise. The command line's ``--dataset``
knows only its built-in sets, so a data set of your own goes through the Python API: wrap the
tensors in :class:`~dacflnode.learning.datasets.Dataset`, split them with
:func:`~dacflnode.learning.partition.partition`, and run a
:class:`~dacflnode.sim.simulator.Simulation` per algorithm. Each writes the layout ``simulate``
writes (``OUT/<algorithm>/<node-id>/metrics.jsonl``), so ``dacflnode report OUT`` draws it.

    python examples/custom-model/run.py --out runs/custom-model
    dacflnode report runs/custom-model
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from dacflnode.config import RunConfig
from dacflnode.learning.datasets import Dataset
from dacflnode.learning.partition import partition
from dacflnode.records.metrics_log import summarize
from dacflnode.sim.simulator import Simulation

sys.path.insert(0, str(Path(__file__).resolve().parent))  # makes "my_model" importable

ANGLES = (0.0, 45.0, 90.0, 135.0)
SIZE = 16


def stripes(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` noisy 1×16×16 images of stripes; the label is the stripes' angle (one of 4)."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(len(ANGLES), (n,), generator=g)
    theta = torch.tensor([math.radians(a) for a in ANGLES])[labels].view(n, 1, 1)
    phase = torch.rand(n, 1, 1, generator=g) * 2 * math.pi
    yy, xx = torch.meshgrid(torch.arange(SIZE, dtype=torch.float32),
                            torch.arange(SIZE, dtype=torch.float32), indexing="ij")
    waves = torch.sin(0.9 * (xx * torch.cos(theta) + yy * torch.sin(theta)) + phase)
    images = waves + 1.2 * torch.randn(n, SIZE, SIZE, generator=g)
    return images.unsqueeze(1), labels


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/custom-model"))
    ap.add_argument("--nodes", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--algorithms", default="dacfl,cdsgd")
    ap.add_argument("--partition", default="shards", choices=("iid", "shards", "dirichlet"))
    ap.add_argument("--train", type=int, default=3000, help="training images")
    ap.add_argument("--json", action="store_true", help="print the summaries as JSON")
    args = ap.parse_args()

    train_x, train_y = stripes(args.train, seed=1)
    test_x, test_y = stripes(args.train // 5, seed=2)
    data = Dataset("stripes", train_x, train_y, test_x, test_y, num_classes=len(ANGLES))
    # cfg.dataset is not read when the data set is handed over; everything else is the run
    cfg = RunConfig(nodes=args.nodes, rounds=args.rounds, model="my_model:OrientationNet",
                    lr=0.05, lr_decay=0.99, batch_size=32, topology="ring",
                    partition=args.partition, device="cpu")
    parts = partition(data.train_y, cfg.nodes, cfg.partition, seed=cfg.seed)
    results = {}
    for name in args.algorithms.split(","):
        folder = args.out / name
        result = Simulation(cfg, name, data, parts, out_dir=folder).run()
        summary = summarize([folder / f"node-{i}" for i in range(cfg.nodes)], name,
                            result.wall_s, engine=result.engine)
        results[name] = summary
        final = summary["final"]
        if not args.json:
            print(f"{name}: Average of Acc {100 * final['avg_acc']:.2f}%, Var of Acc "
                  f"{1e4 * final['var_acc']:.3f} %² after {final['round']} rounds "
                  f"({result.wall_s:.0f} s)")
    if args.json:
        print(json.dumps({k: v["final"] for k, v in results.items()}))
    else:
        print(f"metrics in {args.out}/<algorithm>/<node-id>/metrics.jsonl; "
              f"plot them: dacflnode report {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
