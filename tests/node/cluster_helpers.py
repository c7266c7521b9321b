"""What the cluster tests share: a tiny run configuration, a quiet environment for daemons, the
largest difference between two model files, and what a failed start must look like."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from safetensors.torch import load_file

from dacflnode.config import RunConfig
from dacflnode.node.control_token import client_token
from dacflnode.node.peers import load_peers
from dacflnode.transport.control_types import ControlAuth

#: A run that takes seconds: synthetic data, the tiny CNN, on the CPU.
TINY = RunConfig(dataset="synthetic", model="tiny-cnn", lr=0.05, synthetic_train=600,
                 synthetic_test=200, device="cpu")
#: One thread per daemon, so that several daemons share the cores fairly.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def control_of(path: Path) -> tuple[str, ControlAuth]:
    """The control address of the node of peers file ``path`` and its token (read now: a node
    draws a new one at every start), as ``dacflnode status --peers`` finds them."""
    node = load_peers(path).node
    return node.control, ControlAuth(token=client_token(node))


def max_diff(a: Path, b: Path) -> float:
    """The largest absolute difference between two safetensors files with the same keys."""
    ta, tb = load_file(str(a)), load_file(str(b))
    assert ta.keys() == tb.keys()
    return max(float((ta[k].double() - tb[k].double()).abs().max()) for k in ta)


#: What a failed start must never print.
NOISE = ("Traceback", "never awaited", "Event loop is closed", "add_port.cc")


def assert_one_line_failure(run: subprocess.CompletedProcess[str], path: Path,
                            *said: str) -> None:
    """``run`` (``dacflnode start --peers path``) failed with exit 2 and one ERROR line that
    holds every ``said``, also written to the node's daemon.log, and nothing of :data:`NOISE`."""
    assert run.returncode == 2, run.stderr
    assert not any(n in run.stderr for n in NOISE), run.stderr
    errors = [line for line in run.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, run.stderr
    assert all(s in errors[0] for s in said), errors[0]
    log = (load_peers(path).node.state_dir / "daemon.log").read_text()
    assert errors[0].split(" ERROR ", 1)[1] in log
