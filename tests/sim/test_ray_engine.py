"""``simulate --ray``: the nodes on the workers of a local Ray give the local engines' results,
bit for bit, and a bad cluster address is a one-line error.

One local Ray with 2 CPUs serves the whole module (starting it takes seconds).
"""

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch
from click.testing import CliRunner

pytest.importorskip("ray")

import ray

from dacflnode.cli.main import cli
from dacflnode.config import RunConfig
from dacflnode.errors import ConfigError
from dacflnode.learning.datasets import load_dataset
from dacflnode.learning.partition import partition
from dacflnode.sim.engines.base import RayTarget
from dacflnode.sim.engines.ray import RayEngine, connect
from dacflnode.sim.round_records import SimulationResult
from dacflnode.sim.simulator import Simulation

pytestmark = pytest.mark.slow

WORKERS = 2


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    connect(RayTarget("local", WORKERS))
    yield
    ray.shutdown()


@pytest.fixture
def two_threads() -> Iterator[None]:
    """The local batched engine splits its nodes over as many threads as PyTorch has: 2 here,
    as the Ray engine splits them over its 2 workers (and the sequential engine's workers use
    the driver's thread count)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(WORKERS)
    yield
    torch.set_num_threads(saved)


def small(**kw: Any) -> RunConfig:
    base = RunConfig(
        dataset="synthetic", nodes=5, rounds=3, model="tiny-cnn", lr=0.05, momentum=0.5,
        batch_size=10, local_steps=4, synthetic_train=400, synthetic_test=100,
        topology="dense", device="cpu",
    )
    return replace(base, **kw)


def run(cfg: RunConfig, algorithm: str, ray_target: RayTarget | None
        ) -> tuple[Simulation, SimulationResult]:
    data = load_dataset("synthetic", synthetic_train=cfg.synthetic_train,
                        synthetic_test=cfg.synthetic_test, seed=cfg.seed)
    parts = partition(data.train_y, cfg.nodes, cfg.partition, seed=cfg.seed)
    sim = Simulation(cfg, algorithm, data, parts, ray=ray_target)
    return sim, sim.run()


@pytest.mark.parametrize(("engine", "algorithm", "precision"), [
    ("batched", "dacfl", "fp32"),
    ("sequential", "dacfl", "fp32"),
    ("batched", "dpsgd", "fp32"),  # evaluates the network average with the first node's buffers
    ("batched", "dacfl", "bf16"),
    ("sequential", "dacfl", "bf16"),  # each node evaluated on its worker, in bf16
    ("batched", "dpsgd", "bf16"),  # the network average evaluated in the driver, in bf16
])
def test_ray_workers_give_the_local_engines_results_bit_for_bit(
    local_ray: None, two_threads: None, engine: str, algorithm: str, precision: str
) -> None:
    cfg = small(engine=engine, precision=precision)
    local_sim, local = run(cfg, algorithm, None)
    ray_sim, remote = run(cfg, algorithm, RayTarget("local", WORKERS))
    assert local_sim.engine.name == engine
    assert ray_sim.engine.name == f"ray-{engine}"
    # one contiguous slice per worker, as BatchedTrainer(workers=2) splits the nodes
    assert isinstance(ray_sim.engine, RayEngine) and ray_sim.engine.bounds == [0, 2, 5]
    assert [r.round for r in remote.records] == [1, 2, 3]
    for mine, theirs in zip(remote.records, local.records, strict=True):
        assert mine.train_loss == theirs.train_loss
        assert mine.accuracy == theirs.accuracy and mine.accuracy is not None
        assert mine.residual == theirs.residual
        assert mine.samples == theirs.samples
    for remote_node, local_node in zip(ray_sim.runners, local_sim.runners, strict=True):
        assert remote_node.state.round == local_node.state.round == 3
        # the last evaluation's test loss: the precision shows in its bits
        assert remote_node.last_loss == local_node.last_loss
        for field in ("x", "omega", "omega_prev"):
            assert torch.equal(getattr(remote_node.state, field),
                               getattr(local_node.state, field)), field
        # the batch-norm step counters: 3 rounds of 4 steps
        buffers = remote_node.setup.trainer.local_buffers()
        assert buffers == local_node.setup.trainer.local_buffers()
        assert int(buffers["1.num_batches_tracked"]) == 12


def test_own_tables_of_unequal_sizes_train_on_ray_as_locally(
    local_ray: None, two_threads: None, tmp_path
) -> None:
    from dacflnode.assembly.data import own_node_data
    from tests.harness.owndata import CLASSES, write_csv_nodes

    train, test = write_csv_nodes(tmp_path)
    cfg = RunConfig(dataset="table", classes=CLASSES, label_column="kind", nodes=3, rounds=2,
                    lr=0.1, batch_size=8, topology="ring", device="cpu",
                    data_root=str(train), test_root=str(test))
    shares = [own_node_data(cfg.for_node(f"node-{i}"), None) for i in range(3)]
    local = Simulation(cfg, "dacfl", None, None, own=shares)
    remote = Simulation(cfg, "dacfl", None, None, own=shares, ray=RayTarget("local", WORKERS))
    assert remote.engine.name == "ray-sequential"  # unequal sizes: not batchable
    mine, theirs = remote.run(), local.run()
    assert [r.accuracy for r in mine.records] == [r.accuracy for r in theirs.records]
    for a, b in zip(remote.runners, local.runners, strict=True):
        assert torch.equal(a.state.x, b.state.x) and torch.equal(a.state.omega, b.state.omega)


def test_more_workers_than_the_cluster_has_cpus_is_refused(local_ray: None) -> None:
    with pytest.raises(ConfigError, match="--ray-workers 2 or fewer"):
        run(small(rounds=1), "dacfl", RayTarget("local", WORKERS + 1))


def test_an_address_where_no_cluster_answers_is_a_one_line_error(tmp_path) -> None:
    result = CliRunner().invoke(cli, [
        "simulate", "--dataset", "synthetic", "--nodes", "2", "--rounds", "1",
        "--synthetic-train", "40", "--synthetic-test", "20", "--model", "tiny-cnn",
        "--quiet", "--ray", "127.0.0.1:1",
    ])
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert line.startswith("error: ray: no Ray cluster answers at 127.0.0.1:1")
    assert "ray start --head --port=1" in line and "Traceback" not in result.output


def test_an_address_that_is_not_host_and_port_is_refused() -> None:
    with pytest.raises(ConfigError, match="not HOST:PORT"):
        connect(RayTarget("head-without-port"))


def test_ray_workers_without_ray_is_refused() -> None:
    result = CliRunner().invoke(cli, ["simulate", "--ray-workers", "2"])
    assert result.exit_code == 2
    assert "error: ray_workers: needs --ray" in result.output
