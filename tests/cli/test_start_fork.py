"""``dacflnode start`` on an image folder: the workers it forks to decode the images while its
Control service runs leave no gRPC fork message on stderr."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dacflnode.cluster.launcher import free_ports
from dacflnode.config import RunConfig
from dacflnode.learning.owndata.images import PARALLEL_MIN_FILES
from dacflnode.peers.generate import generate_cluster

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def write_images(folder: Path, per_class: int) -> None:
    rng = np.random.default_rng(0)
    for cls in ("a", "b"):
        (folder / cls).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (8, 8), dtype=np.uint8)
            Image.fromarray(pixels, "L").save(folder / cls / f"{i}.png")


def test_a_daemon_decoding_an_image_folder_in_forked_workers_writes_no_grpc_fork_message(
        tmp_path):
    data = tmp_path / "data"
    write_images(data / "node-0", PARALLEL_MIN_FILES // 2 + 10)  # decoded in parallel
    write_images(data / "node-1", 2)
    write_images(data / "test", 5)
    run = RunConfig(dataset="folder", classes=("a", "b"), image_size=8, model="mlp",
                    data_root=str(data), test_root=str(data / "test"), nodes=2, rounds=1,
                    device="cpu")
    ports = free_ports(6)
    peers = generate_cluster("complete", 2, run, tmp_path / "peers", ports=ports[:2],
                             control_ports=ports[2:4], metrics_ports=ports[4:],
                             state_root=tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GRPC_ENABLE_FORK_SUPPORT", None)
    daemon = subprocess.Popen([sys.executable, "-m", "dacflnode", "start", "--peers",
                               str(peers[0])], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "node-0" / "daemon.log"
    try:
        deadline = time.monotonic() + 120
        while "serving neighbours on" not in (log.read_text() if log.exists() else ""):
            assert daemon.poll() is None, daemon.communicate()[1]
            assert time.monotonic() < deadline, "the daemon did not build its node in 120 s"
            time.sleep(0.2)
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, stderr = daemon.communicate(timeout=60)
    assert "training samples" in log.read_text()  # the folder was decoded
    assert "fork_posix" not in stderr and "skipping fork() handlers" not in stderr, stderr
