"""The engine registry: the local engines by name, Ray registered where it is installed and
imported only by a run that asks for it, and a clear error where it is missing."""

import importlib.util
import subprocess
import sys

import pytest
import torch

from dacflnode.errors import ConfigError
from dacflnode.learning.models import build_model
from dacflnode.learning.train import TrainConfig
from dacflnode.sim.engines import registry
from dacflnode.sim.engines.base import Engine, GatheredEngine, NodeData, RayTarget
from dacflnode.sim.engines.local import BatchedEngine, SequentialEngine

IDS = ["a", "b"]


def tiny_data(samples: int) -> NodeData:
    gen = torch.Generator().manual_seed(samples)
    return NodeData(torch.rand(samples, 1, 28, 28, generator=gen),
                    torch.randint(0, 10, (samples,), generator=gen))


def engine(choice: str, sizes: tuple[int, int] = (20, 20), ray: RayTarget | None = None
           ) -> Engine:
    return registry.make_engine(
        choice, IDS, lambda: build_model("tiny-cnn", (1, 28, 28), 10),
        [tiny_data(n) for n in sizes], tiny_data(10), TrainConfig(), seed=0,
        device=torch.device("cpu"), ray=ray)


def test_auto_picks_the_batched_engine_for_equal_partitions_and_sequential_otherwise() -> None:
    batched = engine("auto")
    assert isinstance(batched, BatchedEngine) and isinstance(batched, GatheredEngine)
    assert isinstance(engine("auto", sizes=(20, 30)), SequentialEngine)
    assert isinstance(engine("sequential"), SequentialEngine)


def test_an_unknown_engine_name_is_refused_with_the_names_there_are() -> None:
    with pytest.raises(ConfigError, match="unknown engine 'fast'; use one of auto, batched"):
        engine("fast")


def test_ray_is_registered_exactly_where_it_is_installed() -> None:
    assert ("ray" in registry.REMOTE_ENGINES) == (importlib.util.find_spec("ray") is not None)


def test_a_ray_run_where_ray_is_missing_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(registry, "REMOTE_ENGINES", {})
    with pytest.raises(ConfigError, match=r"Ray is not installed here .*pip install "
                                          r"'dacflnode\[ray\]'"):
        engine("sequential", ray=RayTarget("local", 1))


@pytest.mark.slow  # a fresh interpreter in a child process
def test_choosing_an_engine_does_not_import_ray() -> None:
    code = ("import sys; from dacflnode.sim.engines.registry import make_engine; "
            "print('ray' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, check=True)
    assert result.stdout.strip() == "False"
