"""The one builder: the daemon and the simulator make their nodes through
:mod:`dacflnode.assembly.build`, agree on every setting a node of the run must share, and carry
CHOCO's step once."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from dacflnode.algorithms.rounds import Mixing
from dacflnode.assembly import build
from dacflnode.config import RunConfig
from dacflnode.learning.datasets import load_dataset
from dacflnode.learning.models import build_model
from dacflnode.learning.partition import partition
from dacflnode.peers.file import load_peers
from dacflnode.peers.generate import generate_cluster
from dacflnode.protocol.faults import FaultPlan, Poison
from dacflnode.protocol.runner import NodeRunner
from dacflnode.protocol.setup import NodeSetup
from dacflnode.sim.simulator import Simulation
from dacflnode.wire.state_guard import ABSURD_RATIO
from tests.harness.cluster import TINY

#: A compressed ring of three (CHOCO with a step of its own), one round, a poison to play.
RUN = replace(TINY, nodes=3, rounds=1, topology="ring", compression="topk:0.1",
              consensus_step=0.3, eval_every=2, synthetic_train=300, synthetic_test=60)
PLAN = FaultPlan([Poison("node-1", 1, 1, 10.0)])


class Spy:
    """Wraps a function of the builder and keeps what each call returned."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.made: list[Any] = []
        real: Callable[..., Any] = getattr(build, name)

        def spy(*args: Any, **kwargs: Any) -> Any:
            out = real(*args, **kwargs)
            self.made.append(out)
            return out

        monkeypatch.setattr(build, name, spy)

    def holds(self, obj: object) -> bool:
        return any(obj is made for made in self.made)


def simulation(cfg: RunConfig, faults: FaultPlan | None = None) -> Simulation:
    data = load_dataset("synthetic", synthetic_train=cfg.synthetic_train,
                        synthetic_test=cfg.synthetic_test, seed=cfg.seed)
    parts = partition(data.train_y, cfg.nodes, cfg.partition, seed=cfg.seed)
    return Simulation(cfg, cfg.algorithm[0], data, parts, faults=faults)


def daemon_setup(tmp_path: Path, cfg: RunConfig, faults: FaultPlan | None = None
                 ) -> NodeSetup:
    path = generate_cluster("ring", cfg.nodes, cfg, tmp_path / "peers",
                            state_root=tmp_path)[0]
    return build.build_node(load_peers(path), faults).setup


def test_the_daemon_and_the_simulator_build_their_nodes_through_the_builder_and_agree(
        tmp_path, monkeypatch):
    setups, runners = Spy(monkeypatch, "node_setup"), Spy(monkeypatch, "build_runner")
    daemon = daemon_setup(tmp_path, RUN, PLAN)
    assert setups.holds(daemon)
    sim = simulation(RUN, PLAN)
    sim.run()
    assert sim.runners and all(runners.holds(r) and setups.holds(r.setup) for r in sim.runners)
    node = next(r.setup for r in sim.runners if r.setup.node_id == daemon.node_id)

    assert type(node.algorithm) is type(daemon.algorithm)
    assert node.algorithm.name == daemon.algorithm.name == "dacfl"
    assert node.algorithm.mixing == daemon.algorithm.mixing == Mixing("choco", gamma=0.3)
    assert node.compression is not None and daemon.compression is not None
    assert (node.compression.spec, node.compression.gamma, node.compression.seed) == (
        daemon.compression.spec, daemon.compression.gamma, daemon.compression.seed)
    for name in ("rounds", "eval_every", "hello_timeout", "anchor_delay", "gone_after",
                 "absurd_ratio", "repair", "neighbours"):
        assert getattr(node, name) == getattr(daemon, name), name
    assert node.absurd_ratio == ABSURD_RATIO  # the poison has every node guard, as a daemon
    assert node.layout.fingerprint() == daemon.layout.fingerprint()
    # what one process of nodes injects instead of a daemon's
    assert daemon.round_deadline == load_peers(
        tmp_path / "peers" / "node-0.yaml").daemon.round_deadline
    assert math.isinf(node.round_deadline) and not node.checkpoints and daemon.checkpoints


def test_the_simulator_makes_the_algorithm_once(monkeypatch):
    from dacflnode.algorithms.rounds import make_algorithm as real

    made: list[str] = []

    def counting(name: str, *args: Any) -> Any:
        made.append(name)
        return real(name, *args)

    monkeypatch.setattr(build, "make_algorithm", counting)
    sim = simulation(replace(RUN, compression="none", consensus_step=None, mixing="clipped"))
    assert made == ["dacfl"]
    assert sim.alg.mixing.rule == "clipped"


def test_chocos_step_is_the_mixings_and_the_compression_is_made_from_it(monkeypatch):
    model = build_model("tiny-cnn", (1, 28, 28), 10)
    parts = build.run_parts(RUN, "dacfl", model)
    assert parts.compression is not None and parts.algorithm.mixing.gamma == 0.3
    assert parts.compression.gamma == parts.algorithm.mixing.gamma
    # one source: a mixing rule with another step makes a compression with that step
    monkeypatch.setattr(RunConfig, "mixing_rule", lambda self, initial: Mixing("choco", gamma=0.25))
    parts = build.run_parts(RUN, "dacfl", model)
    assert parts.compression is not None and parts.compression.gamma == 0.25
    # and a compressed run that would not mix with CHOCO is refused
    monkeypatch.setattr(RunConfig, "mixing_rule", lambda self, initial: Mixing())
    with pytest.raises(ValueError, match="CHOCO"):
        build.run_parts(RUN, "dacfl", model)


def test_run_parts_describe_the_wire_tensors_of_a_full_and_a_compressed_run():
    model = build_model("tiny-cnn", (1, 28, 28), 10)
    full = build.run_parts(replace(RUN, compression="none", consensus_step=None), "dacfl", model)
    numel = full.layout.numel
    assert full.compression is None and full.compressed is None
    assert full.tensors == {"x": (numel,), "omega": (numel,)}
    assert torch.equal(full.initial, full.layout.flatten_module(model))
    compressed = build.run_parts(RUN, "dacfl", model)
    assert compressed.compressed is not None
    assert {name.split(".")[0] for name in compressed.compressed} == {"x", "omega"}
    shared = build.with_shared_decodes(compressed, 3)
    assert shared.compression is not None and shared.compression.decodes is not None
    assert build.with_shared_decodes(full, 3) is full


async def test_the_daemons_runner_comes_out_of_the_builder(tmp_path, monkeypatch):
    from dacflnode.cluster.launcher import free_ports
    from dacflnode.daemon.service import Daemon

    runners = Spy(monkeypatch, "build_runner")
    ports = free_ports(6)
    path = generate_cluster("ring", 3, RUN, tmp_path / "peers", state_root=tmp_path,
                            ports=ports[:3], control_ports=ports[3:])[0]
    daemon = Daemon(load_peers(path))
    daemon.stop()  # asked before the runner exists: it stops before its first handshake
    assert await daemon._serve(None) == 0
    assert isinstance(daemon.runner, NodeRunner) and runners.holds(daemon.runner)
    assert daemon.runner.phase == "stopped"
