"""The long-running node: ``dacflnode start --peers peers.yaml``.

Lifecycle: build the node from its peers file (data share, model, trainer — off the event loop),
resume from ``STATE_DIR/checkpoint.safetensors`` if it belongs to this run, serve the Neighbor
service on ``node.listen`` and the Control service on ``node.control``, handshake with every
neighbour, run the rounds, write ``final.safetensors``. SIGTERM/SIGINT abandon the round being
exchanged (or let the training in flight finish and complete it), checkpoint, and exit 0.

Shutdown order: the runner stops (a signal or the Control service's Stop) → the transport stops:
it refuses new calls, reports ``NOT_SERVING``, stops its server with a grace period and closes its
channels → the Control server stops (see docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dacflnode.algorithms.rounds import NodeState, make_algorithm
from dacflnode.learning.datasets import eval_subset, load_dataset
from dacflnode.learning.layout import StateLayout
from dacflnode.learning.models import build_model, default_model_for
from dacflnode.learning.partition import partition
from dacflnode.learning.train import LocalTrainer, pick_device
from dacflnode.node.checkpoint import load_checkpoint
from dacflnode.node.peers import PeersFile
from dacflnode.node.runner import NodeRunner, NodeSetup
from dacflnode.node.status import NeighbourInfo, NodeMetrics, NodeStatus
from dacflnode.node.training import ThreadedTrainer
from dacflnode.transport.base import Identity, Inbox

log = logging.getLogger("dacflnode.daemon")


@dataclass
class BuiltNode:
    setup: NodeSetup
    state: NodeState
    identity: Identity
    device: str
    used_prev: tuple[str, ...] = ()


def build_node(pf: PeersFile) -> BuiltNode:
    """Everything heavy: data, partition, model, trainer, checkpoint (run it in a thread)."""
    run = pf.run
    run.apply_threads()
    algorithm = make_algorithm(run.algorithm[0], run.fodac_variant)
    dataset = load_dataset(run.dataset, run.data_root, download=run.download,
                           synthetic_train=run.synthetic_train,
                           synthetic_test=run.synthetic_test, seed=run.seed)
    parts = partition(dataset.train_y, run.nodes, run.partition, seed=run.seed,
                      alpha=run.dirichlet_alpha, shards_per_node=run.shards_per_node)
    share = torch.from_numpy(parts[pf.node.share])
    torch.manual_seed(run.seed)
    model = build_model(run.model or default_model_for(dataset.name), dataset.input_shape,
                        dataset.num_classes)
    layout = StateLayout.from_module(model)
    initial = layout.flatten_module(model)
    device = pick_device(run.device)
    trainer = LocalTrainer(model, dataset.train_x[share], dataset.train_y[share],
                           run.train_config(), seed=run.seed, node_index=pf.node.share,
                           device=device)
    test_x, test_y = eval_subset(dataset.test_x, dataset.test_y, run.eval_samples, run.seed)
    identity = Identity(pf.node.id, layout.fingerprint(), pf.run_fingerprint())
    run_info = {"run_fingerprint": identity.run_fingerprint,
                "model_fingerprint": identity.model_fingerprint, "node": pf.node.id}
    pf.node.state_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = load_checkpoint(pf.node.state_dir, run_info, layout.numel)
    used_prev: tuple[str, ...] = ()
    if checkpoint is not None:
        state = checkpoint.state
        used_prev = checkpoint.used
        trainer.local.update(checkpoint.local)
        log.info("%s: resuming from round %d", pf.node.id, state.round)
    else:
        state = NodeState.initial(initial)
    active = pf.active_neighbour_ids if run.time_varying > 0 else None
    setup = NodeSetup(
        node_id=pf.node.id, neighbours=pf.neighbour_ids(), algorithm=algorithm,
        trainer=ThreadedTrainer(trainer, test_x, test_y), layout=layout, rounds=run.rounds,
        eval_every=run.eval_every, round_deadline=pf.daemon.round_deadline,
        hello_timeout=pf.daemon.hello_timeout, active_neighbours=active,
        state_dir=pf.node.state_dir, run_info=run_info,
    )
    return BuiltNode(setup, state, identity, str(device), used_prev)


class Daemon:
    """One node process: servers, runner, signals."""

    def __init__(self, pf: PeersFile) -> None:
        self.pf = pf
        self.runner: NodeRunner | None = None
        self.metrics = NodeMetrics(pf.node.id)
        self.started = time.time()
        self.device = ""

    # ---------------------------------------------------------------- ControlProvider
    def status(self) -> NodeStatus:
        pf = self.pf
        runner = self.runner
        neighbours = []
        stats = runner.transport.stats if runner is not None else {}
        for nb in pf.neighbours:
            s = stats.get(nb.id)
            neighbours.append(NeighbourInfo(
                nb.id, nb.address, s.connected if s else False,
                s.last_round_received if s else -1, s.bytes_received if s else 0,
                s.bytes_sent if s else 0, s.latency_ms if s else math.nan))
        status = NodeStatus(
            node_id=pf.node.id, algorithm=pf.run.algorithm[0],
            round=runner.round if runner else 0, rounds_total=pf.run.rounds,
            phase=runner.phase if runner else "starting", neighbours=neighbours,
            last_accuracy=runner.last_accuracy if runner else math.nan,
            last_loss=runner.last_loss if runner else math.nan,
            consensus_residual=runner.residual() if runner else math.nan,
            device=self.device, uptime_s=time.time() - self.started,
            listen_address=pf.node.listen,
        )
        self.metrics.update(status)
        return status

    def metrics_text(self, fmt: str) -> tuple[str, str]:
        from dacflnode.transport.grpc_control import metrics_json

        status = self.status()
        if fmt == "prometheus":
            return "text/plain; version=0.0.4", self.metrics.prometheus()
        last = self.runner.last if self.runner else None
        extra = {"last_round": None if last is None else {
            "round": last.round, "train_loss": last.train_loss, "samples": last.samples,
            "seconds": last.seconds,
            "exchange_s": last.exchange_s, "train_s": last.train_s,
            "neighbours_used": list(last.used), "neighbours_missing": list(last.missing)}}
        return "application/json", metrics_json(status, extra)

    def stop(self) -> None:
        if self.runner is not None:
            self.runner.request_stop()
        else:
            self._stop_early = True

    _stop_early = False

    # ---------------------------------------------------------------- lifecycle
    async def run(self) -> int:
        from dacflnode.transport import channels
        from dacflnode.transport.grpc_control import add_control_service
        from dacflnode.transport.grpc_transport import GrpcTransport

        pf = self.pf
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)

        control = channels.create_server()
        add_control_service(control, _Provider(self))
        channels.bind(control, pf.node.control)
        await control.start()
        log.info("%s: control service on %s", pf.node.id, pf.node.control)

        built = await asyncio.to_thread(build_node, pf)
        self.device = built.device
        holder: dict[str, NodeRunner] = {}
        inbox = Inbox(senders=pf.neighbour_ids(),
                      current_round=lambda: holder["runner"].round if holder else 0)
        tensors = {name: (built.setup.layout.numel,)
                   for name in built.setup.algorithm.exchanged}
        transport = GrpcTransport(built.identity, pf.node.listen,
                                  {nb.id: nb.address for nb in pf.neighbours}, inbox, tensors)
        runner = NodeRunner(built.setup, transport, built.state, built.used_prev)
        holder["runner"] = runner
        self.runner = runner
        runner.on_round = lambda r: self.metrics.observe_round(
            r.seconds, r.exchange_s, r.train_s, r.train_loss)
        if self._stop_early:
            runner.request_stop()
        await transport.start()
        log.info("%s: serving neighbours on %s (round %d of %d, %s on %s)", pf.node.id,
                 pf.node.listen, runner.round, pf.run.rounds, pf.run.algorithm[0], self.device)
        code = 0
        try:
            await runner.run()
        except Exception as exc:  # a refused handshake, a broken model file, ...
            log.error("%s: %s", pf.node.id, exc, exc_info=not isinstance(exc, RuntimeError))
            runner.phase = "failed"
            code = 1
        finally:
            await transport.stop(grace=2.0)
            await control.stop(grace=1.0)
        return code


class _Provider:
    """Adapts :class:`Daemon` to the Control service's provider protocol."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def status(self) -> NodeStatus:
        return self.daemon.status()

    def metrics(self, fmt: str) -> tuple[str, str]:
        return self.daemon.metrics_text(fmt)

    def stop(self) -> None:
        self.daemon.stop()


def setup_logging(state_dir: Path, level: str = "INFO") -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger("dacflnode")
    root.setLevel(level)
    for handler in (logging.StreamHandler(), logging.FileHandler(state_dir / "daemon.log")):
        handler.setFormatter(fmt)
        root.addHandler(handler)
