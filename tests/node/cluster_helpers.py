"""What the cluster tests share: a tiny run configuration, a quiet environment for daemons, and
the largest difference between two model files."""

from __future__ import annotations

import os
from pathlib import Path

from safetensors.torch import load_file

from dacflnode.config import RunConfig

#: A run that takes seconds: synthetic data, the tiny CNN, on the CPU.
TINY = RunConfig(dataset="synthetic", model="tiny-cnn", lr=0.05, synthetic_train=600,
                 synthetic_test=200, device="cpu")
#: One thread per daemon, so that several daemons share the cores fairly.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def max_diff(a: Path, b: Path) -> float:
    """The largest absolute difference between two safetensors files with the same keys."""
    ta, tb = load_file(str(a)), load_file(str(b))
    assert ta.keys() == tb.keys()
    return max(float((ta[k].double() - tb[k].double()).abs().max()) for k in ta)
