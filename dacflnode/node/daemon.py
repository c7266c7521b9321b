"""The long-running node: ``dacflnode start --peers peers.yaml``.

Lifecycle: build the node from its peers file (data share, model, trainer — off the event loop),
resume from ``STATE_DIR/checkpoint.safetensors`` if it belongs to this run, serve the Neighbor
service on ``node.listen`` and the Control service on ``node.control``, handshake with every
neighbour, run the rounds, write ``final.safetensors``. SIGTERM/SIGINT abandon the round being
exchanged (or let the training in flight finish and complete it), checkpoint, and exit 0.

Security (docs/security.md): with ``node.tls`` the Neighbor service speaks mutual TLS only and
every call is checked against the id in the caller's certificate; without it the daemon logs one
warning at start and ``status`` shows ``tls: false``. The Control service requires
``node.control_token`` when one is set, and is served over TLS (the node's certificate, no client
certificate) when its address is not loopback.

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from dacflnode.algorithms.rounds import NodeState, make_algorithm
from dacflnode.errors import ConfigError
from dacflnode.learning.datasets import eval_subset, load_dataset
from dacflnode.learning.layout import StateLayout
from dacflnode.learning.models import build_model, default_model_for
from dacflnode.learning.partition import partition
from dacflnode.learning.train import LocalTrainer, pick_device
from dacflnode.node.addresses import is_loopback, parse_address
from dacflnode.node.checkpoint import load_checkpoint
from dacflnode.node.peers import PeersFile
from dacflnode.node.runner import NodeRunner, NodeSetup
from dacflnode.node.status import NeighbourInfo, NodeMetrics, NodeStatus
from dacflnode.node.training import ThreadedTrainer
from dacflnode.security.tls import TlsMaterial
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
        #: what was refused so far, by reason (filled in by :meth:`run` once the servers exist)
        self.refusal_counts: Callable[[], dict[str, int]] = dict

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
            listen_address=pf.node.listen, tls=pf.node.tls is not None,
            refusals=self.refusal_counts(),
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

    def tls_material(self) -> TlsMaterial | None:
        """The node's TLS files, read once at start (``None``, after one warning, without)."""
        files = self.pf.node.tls
        if files is not None:
            try:
                return files.load()
            except OSError as exc:
                raise ConfigError("node.tls", f"in {self.pf.path}: cannot read {exc.filename}: "
                                  f"{exc.strerror}") from exc
        log.warning(
            "%s: neighbours are not authenticated (no node.tls): anyone who reaches %s can push"
            " states in a neighbour's name or pull this node's model; set node.tls (see"
            " `dacflnode certs` and docs/security.md)", self.pf.node.id, self.pf.node.listen)
        return None

    def control_exposed(self) -> bool:
        """Whether the control address is reachable from other hosts (then it is served over
        TLS; loading the peers file made sure it has TLS and a token)."""
        pf = self.pf
        return not is_loopback(parse_address(pf.node.control, "node.control", pf.path)[0])

    # ---------------------------------------------------------------- lifecycle
    async def run(self) -> int:
        from dacflnode.transport import channels
        from dacflnode.transport.grpc_control import add_control_service, control_interceptors
        from dacflnode.transport.grpc_transport import GrpcTransport

        pf = self.pf
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)

        tls = self.tls_material()
        control_tls = tls if tls is not None and self.control_exposed() else None
        interceptors = control_interceptors(pf.node.control_token)
        control = channels.create_server(interceptors=interceptors)
        add_control_service(control, _Provider(self))
        channels.bind(control, pf.node.control, control_tls, require_client_auth=False)
        await control.start()
        log.info("%s: control service on %s (%s, %s)", pf.node.id, pf.node.control,
                 "TLS" if control_tls else "plaintext",
                 "token required" if pf.node.control_token else "no token")

        built = await asyncio.to_thread(build_node, pf)
        self.device = built.device
        holder: dict[str, NodeRunner] = {}
        inbox = Inbox(senders=pf.neighbour_ids(),
                      current_round=lambda: holder["runner"].round if holder else 0)
        tensors = {name: (built.setup.layout.numel,)
                   for name in built.setup.algorithm.exchanged}
        transport = GrpcTransport(built.identity, pf.node.listen,
                                  {nb.id: nb.address for nb in pf.neighbours}, inbox, tensors,
                                  tls=tls, idle_timeout=pf.daemon.stream_idle_timeout,
                                  stream_timeout=pf.daemon.stream_timeout)
        runner = NodeRunner(built.setup, transport, built.state, built.used_prev)

        def refusal_counts() -> dict[str, int]:
            counts = {reason.value: n for reason, n in transport.receiver.refusals.items()}
            token_refused = sum(i.refused for i in interceptors)
            if token_refused:
                counts["control-token"] = token_refused
            return counts

        self.refusal_counts = refusal_counts
        holder["runner"] = runner
        self.runner = runner
        runner.on_round = lambda r: self.metrics.observe_round(
            r.seconds, r.exchange_s, r.train_s, r.train_loss)
        if self._stop_early:
            runner.request_stop()
        await transport.start()
        log.info("%s: serving neighbours on %s with %s (round %d of %d, %s on %s)", pf.node.id,
                 pf.node.listen, "mutual TLS" if tls else "no authentication", runner.round,
                 pf.run.rounds, pf.run.algorithm[0], self.device)
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


def raise_open_files_limit() -> tuple[int, int]:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit; returns (before, after).

    Every connection a peer opens costs a file descriptor. The servers cap their connections
    (see :mod:`dacflnode.transport.channels`, which sizes the cap from this limit), and that cap,
    not the descriptor limit, must be what a flood of connections runs into: a process out of
    descriptors can no longer open its checkpoint or its log, nor accept its neighbours.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # a hard limit the kernel refuses (RLIM_INFINITY on macOS)
            return soft, soft
    return soft, hard


def setup_logging(state_dir: Path, level: str = "INFO") -> None:
    """The daemon's process setup, before any server exists: logging of the ``dacflnode`` tree to
    stderr and to the rotating ``STATE_DIR/daemon.log``, every value escaped, truncated and
    rate-limited (see :mod:`dacflnode.logs`); then the open-files limit is raised, and logged."""
    from dacflnode import logs

    state_dir.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger("dacflnode")
    root.setLevel(level)
    logs.install(root, state_dir)
    before, after = raise_open_files_limit()
    log.info("open-files limit %d (was %d)", after, before)
