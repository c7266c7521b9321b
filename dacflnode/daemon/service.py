"""The long-running node: ``dacflnode start --peers peers.yaml``.

Lifecycle: build the node from its peers file (:mod:`dacflnode.assembly.build`: data share,
model, trainer — off the event loop), resume from ``STATE_DIR/checkpoint.safetensors`` if it
belongs to this run, serve the Neighbor service on ``node.listen``, the Control service on
``node.control`` and, when ``node.metrics`` is set, the Prometheus exposition at
``http://<node.metrics>/metrics``, handshake with every neighbour, run the rounds, write
``final.safetensors``. SIGUSR1 writes where every task waits to stderr
(:mod:`dacflnode.daemon.task_dump`). SIGINT (and SIGTERM, unless
``run.drain_on_sigterm``) abandons the round being exchanged (or lets the training in flight
finish and complete it), checkpoints, and exits 0: the node can resume later. A drain
(``dacflnode stop --drain``, or SIGTERM with ``run.drain_on_sigterm``) instead has the node leave
the network: it finishes its round, hands its share of the consensus mass to its neighbours,
tells them it left, and exits 0 (docs/faults.md).

Security (docs/security.md): with ``node.tls`` the Neighbor service speaks mutual TLS only and
every call is checked against the id in the caller's certificate; without it the daemon logs one
warning at start and ``status`` shows ``tls: false``. The Control service always requires a
token: ``node.control_token`` when one is set, else a random one drawn at every start and written
to ``STATE_DIR/control.token`` (mode 0600, :mod:`dacflnode.peers.control_token`); it is served over
TLS (the node's certificate, no client certificate) when its address is not loopback.

What the node is, ``status``, ``metrics`` and the Prometheus exposition read from one
:class:`~dacflnode.protocol.snapshot.NodeSnapshot` (the runner's, or the starting one before it
exists); the daemon adds what its servers saw (refused calls, failed TLS handshakes).

Shutdown order: the runner stops or leaves (a signal or the Control service's Stop) → the
transport stops:
it refuses new calls, reports ``NOT_SERVING``, stops its server with a grace period and closes its
channels → the Control server stops → the metrics server stops (see docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
import stat
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from dacflnode.assembly import build
from dacflnode.assembly.build import build_node as build_node  # the daemon's node, re-exported
from dacflnode.daemon.prometheus import MetricsServer, NeighbourInfo, NodeMetrics, NodeStatus
from dacflnode.daemon.round_log import RoundLog
from dacflnode.daemon.task_dump import dump_tasks
from dacflnode.errors import ConfigError
from dacflnode.filemodes import make_dir, tighten_dir
from dacflnode.peers.addresses import format_address, is_loopback, parse_address
from dacflnode.peers.control_token import (
    new_token,
    remove_token_file,
    token_file,
    write_token_file,
)
from dacflnode.peers.file import PeersFile, read_metrics_token
from dacflnode.protocol.phase import Phase
from dacflnode.protocol.runner import NodeRunner
from dacflnode.protocol.setup import RoundReport
from dacflnode.protocol.snapshot import NodeSnapshot, snapshot_of, traffic_totals
from dacflnode.records.checkpoint import CHECKPOINT, CheckpointError
from dacflnode.security.certs import check_node_material
from dacflnode.security.tls import TlsMaterial

if TYPE_CHECKING:
    from dacflnode.assembly.build import BuiltNode
    from dacflnode.protocol.faults import FaultPlan
    from dacflnode.transport.base import Inbox
    from dacflnode.transport.grpc_transport import GrpcTransport
    from dacflnode.transport.receiver import Receiver
    from dacflnode.transport.tls_failures import HandshakeWatch

log = logging.getLogger(__name__)

#: How ``status`` shows an active neighbour whose last call failed (docs/faults.md).
UNREACHABLE = "unreachable"

#: Seconds the Neighbor service gives the calls in flight to finish when the node shuts down.
NEIGHBOUR_STOP_GRACE = 2.0
#: Seconds the Control service gives its calls in flight (a ``stop`` being answered).
CONTROL_STOP_GRACE = 1.0


class Daemon:
    """One node process: servers, runner, signals."""

    def __init__(self, pf: PeersFile, faults: FaultPlan | None = None,
                 handshakes: HandshakeWatch | None = None) -> None:
        self.pf = pf
        self.faults = faults
        #: the failed TLS handshakes counted off gRPC's stderr (see :func:`watch_handshakes`)
        self.handshakes = handshakes
        self.runner: NodeRunner | None = None
        #: the transport's receiver, whose per-neighbour refusal counts the status shows
        self.receiver: Receiver | None = None
        #: whether the transport's channel to a neighbour is connected (once it exists)
        self.channel_ready: Callable[[str], bool | None] | None = None
        self.metrics = NodeMetrics(pf.node.id)
        self.started = time.time()
        self.device = ""
        #: what was refused so far, by reason (filled in by :meth:`run` once the servers exist)
        self.refusal_counts: Callable[[], dict[str, int]] = dict
        #: the ``/metrics`` server, while it runs
        self.metrics_server: MetricsServer | None = None

    # ---------------------------------------------------------------- ControlProvider
    def snapshot(self) -> NodeSnapshot:
        """The node now: its runner's reading, or the starting form before the runner
        exists."""
        if self.runner is None:
            run = self.pf.run
            return NodeSnapshot.starting(self.pf.node.id, run.algorithm[0], run.rounds,
                                         leaving=self._leave_early, stopping=self._stop_early)
        return snapshot_of(self.runner, self.channel_ready)

    def status(self, snap: NodeSnapshot | None = None) -> NodeStatus:
        """What ``dacflnode status`` shows, made from ``snap`` (default: one taken now); the
        Prometheus exposition is refreshed from it."""
        snap = self.snapshot() if snap is None else snap
        pf = self.pf
        late: Mapping[str, int] = self.receiver.late_by if self.receiver is not None else {}
        refused: Mapping[str, int] = (self.receiver.refused_by if self.receiver is not None
                                      else {})
        neighbours = []
        for nb in pf.neighbours:
            p = snap.peer(nb.id)
            neighbours.append(NeighbourInfo(
                nb.id, nb.address, p.connected, p.last_round_received, p.bytes_received,
                p.bytes_sent, p.latency_ms, state=UNREACHABLE if p.unreachable else p.state,
                missed_rounds=p.missed, late_states=late.get(nb.id, 0),
                refused=refused.get(nb.id, 0), corrections=p.corrections,
                refused_states=p.refused_states, messages_received=p.messages_received,
                messages_sent=p.messages_sent, exchanges=p.exchanges))
        status = NodeStatus(
            node_id=snap.node_id, algorithm=snap.algorithm, round=snap.round,
            rounds_total=snap.rounds, phase=snap.phase, neighbours=neighbours,
            last_accuracy=snap.accuracy, last_loss=snap.loss,
            consensus_residual=snap.residual, device=self.device,
            uptime_s=time.time() - self.started, listen_address=pf.node.listen,
            tls=pf.node.tls is not None, refusals=self.refusals(), anchors=list(snap.anchors),
            reanchored=snap.reanchored, leaving=snap.leaving, alone_rounds=snap.alone_rounds,
            tls_handshake_failures=self.handshakes.counts() if self.handshakes else {},
            quarantines=snap.quarantines, refused_states=snap.refused_states,
            data_size=snap.data_size, test_size=snap.test_size,
            class_counts=dict(snap.class_counts), skipped_files=snap.skipped_files,
            schedule=snap.schedule, waited_s=snap.waited_s, ahead_of=list(snap.ahead_of),
            feature_scale=snap.feature_scale,
        )
        self.metrics.update(status)
        return status

    def refusals(self) -> dict[str, int]:
        """What was refused so far, by reason: the servers' counts and the metrics server's
        requests without its token (``metrics-token``)."""
        counts = self.refusal_counts()
        if self.metrics_server is not None and self.metrics_server.refused:
            counts["metrics-token"] = self.metrics_server.refused
        return counts

    def metrics_text(self, fmt: str) -> tuple[str, str]:
        from dacflnode.transport.grpc_control import metrics_json

        snap = self.snapshot()
        status = self.status(snap)
        if fmt == "prometheus":
            return "text/plain; version=0.0.4", self.metrics.prometheus()
        last = snap.last
        extra: dict[str, Any] = {"last_round": None if last is None else {
            "round": last.round, "train_loss": last.train_loss, "samples": last.samples,
            "seconds": last.seconds,
            "exchange_s": last.exchange_s, "train_s": last.train_s,
            "neighbours_used": list(last.used), "neighbours_missing": list(last.missing),
            "alone_rounds": snap.alone_rounds}}
        return "application/json", metrics_json(status, extra)

    def stop(self, drain: bool = False) -> None:
        """Stop the node (it can resume from its checkpoint), or with ``drain`` have it leave
        the network. A request before the runner exists is kept until it does."""
        if self.runner is None:
            if drain:
                self._leave_early = True
            else:
                self._stop_early = True
        elif drain:
            self.runner.request_leave()
        else:
            self.runner.request_stop()

    _stop_early = False
    _leave_early = False

    def on_signal(self, sig: signal.Signals) -> None:
        """SIGTERM drains when ``run.drain_on_sigterm`` says so; anything else stops."""
        drain = sig == signal.SIGTERM and self.pf.daemon.drain_on_sigterm
        log.info("%s received: %s", sig.name,
                 "leaving the network" if drain else "stopping",
                 extra={"event": "signal", "node": self.pf.node.id})
        self.stop(drain=drain)

    async def checkpoint_bytes(self) -> bytes | None:
        """The latest checkpoint file, read off the event loop (``None`` before the first)."""
        path = self.pf.node.state_dir / CHECKPOINT
        try:
            return await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            return None

    def tls_material(self) -> TlsMaterial | None:
        """The node's TLS files, read once at start (``None``, after one warning, without)."""
        files = self.pf.node.tls
        if files is not None:
            try:
                material = files.load()
            except OSError as exc:
                raise ConfigError("node.tls", f"in {self.pf.path}: cannot read {exc.filename}: "
                                  f"{exc.strerror}: fix the path or the file's permissions "
                                  "(the node runs as this user)") from exc
            try:  # before anything binds: a bad file is one line naming it, not a gRPC failure
                check_node_material(files, material, self.pf.node.id)
            except ConfigError as exc:
                raise ConfigError("node.tls", f"in {self.pf.path}: {exc.message}") from None
            return material
        log.warning(
            "neighbours are not authenticated (no node.tls): anyone who reaches %s can push"
            " states in a neighbour's name or pull this node's model; set node.tls (see"
            " `dacflnode certs` and docs/security.md)", self.pf.node.listen,
            extra={"event": "unauthenticated", "node": self.pf.node.id})
        return None

    def control_exposed(self) -> bool:
        """Whether the control address is reachable from other hosts (then it is served over
        TLS; loading the peers file made sure it has TLS and a token)."""
        pf = self.pf
        return not is_loopback(parse_address(pf.node.control, "node.control", pf.path)[0])

    def metrics_ssl(self, host: str) -> ssl.SSLContext | None:
        """HTTPS with the node's certificate for a metrics port other hosts reach, when the node
        has ``node.tls`` (loopback stays plain HTTP for the Prometheus of the same host)."""
        files = self.pf.node.tls
        if files is None or is_loopback(host):
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(files.cert, files.key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError("node.tls", f"in {self.pf.path}: cannot use {files.cert} and "
                              f"{files.key} for the metrics server: {exc}: issue the node's "
                              "files with `dacflnode certs`") from exc
        return context

    async def start_metrics(self) -> MetricsServer | None:
        """Serve ``/metrics`` on ``node.metrics`` from this event loop (``None`` when it is not
        set); a scrape refreshes the status first, as the Control service's ``metrics`` does.
        With ``node.metrics_token`` every request must carry it; beyond loopback with
        ``node.tls`` it is HTTPS. An address that cannot be bound is a :class:`ConfigError`
        naming ``node.metrics``."""
        address = self.pf.node.metrics
        if address is None:
            return None
        host, port = parse_address(address, "node.metrics", self.pf.path)
        node = self.pf.node
        token = (read_metrics_token(node.metrics_token_file, self.pf.path)
                 if node.metrics_token_file is not None else node.metrics_token)
        server = MetricsServer(self.metrics.registry, host, port, self.status, token=token,
                               ssl=self.metrics_ssl(host))
        try:
            bound = await server.start()
        except OSError as exc:
            raise ConfigError("node.metrics", f"in {self.pf.path}: cannot serve metrics on "
                              f"{address}: {exc.strerror or exc}: choose a free port, or drop "
                              "node.metrics") from exc
        self.metrics_server = server
        log.info("Prometheus metrics on %s://%s/metrics (%s)", server.scheme,
                 format_address(host, bound),
                 "bearer token required" if token else "no token",
                 extra={"event": "metrics_serving", "node": self.pf.node.id})
        return server

    # ---------------------------------------------------------------- lifecycle
    async def run(self) -> int:
        """Serve and run the node until its rounds end, it stops or it leaves; the exit code.

        A failure to start (a setting: an address that cannot be bound, unreadable TLS files, a
        checkpoint that cannot be resumed from) is logged as one line, to stderr and
        ``daemon.log``, naming the setting or file and what to do, and gives exit code 2."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.on_signal, sig)
        loop.add_signal_handler(signal.SIGUSR1, dump_tasks, self.pf.node.id)
        try:
            tls = self.tls_material()
            metrics_server = await self.start_metrics()
            try:
                return await self._serve(tls)
            finally:
                if metrics_server is not None:
                    await metrics_server.stop()
        except (ConfigError, CheckpointError) as exc:
            log.error("cannot start: %s", exc,
                      extra={"event": "start_failed", "node": self.pf.node.id})
            if self.runner is not None:
                self.runner.phase = Phase.FAILED
            return 2

    def _publish_token(self, token: str) -> str:
        """Where the node's user finds the Control token (said in the start-up line): the peers
        file's ``node.control_token``, else ``STATE_DIR/control.token``, written now (0600)."""
        node = self.pf.node
        try:
            if node.control_token:
                remove_token_file(node.state_dir)
                return "node.control_token"
            return str(write_token_file(node.state_dir, token))
        except OSError as exc:
            raise ConfigError("node.state_dir", f"in {self.pf.path}: cannot write the control "
                              f"token {token_file(node.state_dir)}: {exc.strerror or exc}: make "
                              "the state folder writable by the user the node runs as") from exc

    def _bind_error(self, exc: OSError, setting: str, address: str) -> ConfigError:
        """An address of the peers file that cannot be bound, as a :class:`ConfigError`."""
        port = address.rpartition(":")[2]
        return ConfigError(setting, f"in {self.pf.path}: {exc}: stop what listens there "
                           f"(`ss -ltnp 'sport = :{port}'` shows it; another dacflnode of this "
                           "node?) or choose a free address")

    async def _serve(self, tls: TlsMaterial | None) -> int:
        """The Control service, the node and its Neighbor service, until the rounds end."""
        from dacflnode.transport import channels
        from dacflnode.transport.grpc_control import add_control_service, control_interceptors

        pf = self.pf
        control_tls = tls if tls is not None and self.control_exposed() else None
        token = pf.node.control_token or new_token()
        interceptors = control_interceptors(token)
        control = channels.create_server(interceptors=interceptors)

        def refusal_counts() -> dict[str, int]:
            """The refusals so far: the neighbours' (once the node is built) and the Control
            calls without their token (from the Control service's start, which comes first)."""
            receiver = self.receiver
            counts = ({} if receiver is None else
                      {reason.value: n for reason, n in receiver.refusals.items()})
            token_refused = sum(i.refused for i in interceptors)
            if token_refused:
                counts["control-token"] = token_refused
            return counts

        self.refusal_counts = refusal_counts
        transport: GrpcTransport | None = None
        try:
            add_control_service(control, _Provider(self))
            try:
                channels.bind(control, pf.node.control, control_tls, require_client_auth=False)
            except channels.BindError as exc:
                raise self._bind_error(exc, "node.control", pf.node.control) from exc
            # only once the port is ours: a second start of a running node must not replace
            # the running one's token
            where = self._publish_token(token)
            await control.start()
            log.info("control service on %s (%s, token required: %s)", pf.node.control,
                     "TLS" if control_tls else "plaintext", where,
                     extra={"event": "control_serving", "node": pf.node.id})

            built = await asyncio.to_thread(build_node, pf, self.faults)
            self.device = built.device
            runner = build.build_runner(built.setup, self._neighbour_service(built, tls),
                                        built.state, resume=built.checkpoint)
            transport = cast("GrpcTransport", runner.transport)
            self.receiver, self.channel_ready = transport.receiver, transport.channel_ready
            self.runner = runner
            if built.checkpoint is not None and await runner.confirm_finished():
                return 0  # started again after its last round: nothing to wait for
            return await self._run(runner, transport)
        finally:
            if transport is not None:
                await transport.stop(grace=NEIGHBOUR_STOP_GRACE)
            await control.stop(grace=CONTROL_STOP_GRACE)

    def _neighbour_service(self, built: BuiltNode, tls: TlsMaterial | None
                           ) -> Callable[[Inbox], GrpcTransport]:
        """The node's Neighbor service, around the inbox its runner builds."""
        from dacflnode.transport.grpc_transport import GrpcTransport

        pf = self.pf
        return partial(
            GrpcTransport, built.identity, pf.node.listen,
            {nb.id: nb.address for nb in pf.neighbours}, tensors=built.parts.tensors,
            compressed=built.parts.compressed, tls=tls,
            idle_timeout=pf.daemon.stream_idle_timeout,
            stream_timeout=pf.daemon.stream_timeout,
            first_message_timeout=pf.daemon.first_message_timeout,
            health_listen=pf.node.health)

    async def _run(self, runner: NodeRunner, transport: GrpcTransport) -> int:
        """Serve the neighbours and run the rounds; the exit code."""
        from dacflnode.transport.channels import BindError

        pf = self.pf
        round_log = RoundLog(pf.node.id, pf.run.rounds, lambda: runner.peers,
                             lambda: traffic_totals(transport.stats.values()))
        chained = runner.on_round

        def on_round(r: RoundReport) -> None:
            if chained is not None:
                chained(r)
            self.metrics.observe_round(r.seconds, r.exchange_s, r.train_s, r.train_loss)
            round_log(r)

        runner.on_round = on_round
        if self._stop_early:
            runner.request_stop()
        elif self._leave_early:
            runner.request_leave()
        try:
            await transport.start()
        except BindError as exc:
            setting, address = (("node.health", pf.node.health)
                                if pf.node.health is not None and exc.address == pf.node.health
                                else ("node.listen", pf.node.listen))
            raise self._bind_error(exc, setting, address) from exc
        log.info("serving neighbours on %s with %s (round %d of %d, %s on %s)", pf.node.listen,
                 "mutual TLS" if transport.tls else "no authentication",
                 runner.round, pf.run.rounds, pf.run.algorithm[0], self.device,
                 extra={"event": "serving", "node": pf.node.id, "round": runner.round})
        if pf.node.health is not None:
            log.info("grpc.health.v1 alone, in plaintext, on %s", pf.node.health,
                     extra={"event": "health_serving", "node": pf.node.id})
        try:
            await runner.run()
            if round_log.done:
                round_log.summary()
            if runner.phase == Phase.LEFT:
                log.info("left the network after round %d", runner.round,
                         extra={"event": "left", "node": pf.node.id, "round": runner.round})
        except Exception as exc:  # a refused handshake, a broken model file, ...
            log.error("%s", exc, exc_info=not isinstance(exc, RuntimeError),
                      extra={"event": "failed", "node": pf.node.id})
            runner.phase = Phase.FAILED
            return 1
        return 0


class _Provider:
    """Adapts :class:`Daemon` to the Control service's provider protocol."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def status(self) -> NodeStatus:
        return self.daemon.status()

    def metrics(self, fmt: str) -> tuple[str, str]:
        return self.daemon.metrics_text(fmt)

    def stop(self, drain: bool = False) -> None:
        self.daemon.stop(drain)

    async def checkpoint_bytes(self) -> bytes | None:
        return await self.daemon.checkpoint_bytes()


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


def guard_state_dir(state_dir: Path, node: str) -> None:
    """Take the group's write access and others' access away from an existing state folder (it
    holds the node's checkpoints, and ``ca.crt`` may lie beside it: another user must not swap
    them), with one warning; one it may not change (another user's) is warned about with the
    fix."""
    mode = stat.S_IMODE(state_dir.stat().st_mode)
    try:
        changed = tighten_dir(state_dir)
    except OSError as exc:
        log.warning("the state folder %s is open to other users (mode %03o) and cannot be "
                    "changed (%s): make it the node user's own with mode 0700 (`chmod 700 %s`)",
                    state_dir, mode, exc.strerror or exc, state_dir,
                    extra={"event": "state_dir_open", "node": node})
        return
    if changed:
        log.warning("the state folder %s was open to other users (mode %03o): set to %03o",
                    state_dir, mode, stat.S_IMODE(state_dir.stat().st_mode),
                    extra={"event": "state_dir_tightened", "node": node})


def watch_handshakes(node: str) -> HandshakeWatch | None:
    """Count and log the node's failed TLS handshakes (which gRPC reports only on stderr) by
    sending its stderr through the relay of :mod:`dacflnode.transport.tls_failures`; call it
    after :func:`setup_logging`. ``None``, after one warning, when they cannot be seen."""
    import os

    from dacflnode.transport.tls_failures import HandshakeWatch, verbosity_hides_failures

    if verbosity_hides_failures():
        log.warning("GRPC_VERBOSITY=%s hides failed TLS handshakes: they are neither "
                    "counted nor logged; unset it to see them", os.environ.get("GRPC_VERBOSITY"),
                    extra={"event": "tls_handshakes_hidden", "node": node})
        return None

    def failed(reason: str, detail: str) -> None:
        log.warning("TLS handshake failed (%s): %s", reason, detail,
                    extra={"node": node, "event": "tls_handshake_failed", "reason": reason})

    watch = HandshakeWatch(failed)
    try:
        watch.start()
    except OSError as exc:
        log.warning("failed TLS handshakes are not counted: cannot start the relay of "
                    "stderr: %s", exc, extra={"event": "tls_handshakes_hidden", "node": node})
        return None
    return watch


def setup_logging(state_dir: Path, level: str = "INFO", log_format: str = "text",
                  node: str | None = None) -> None:
    """The daemon's process setup, before any server exists: logging of the ``dacflnode`` tree to
    stderr and to the rotating ``STATE_DIR/daemon.log``, every value escaped, truncated and
    rate-limited, as text or as one JSON object per line naming ``node`` (see
    :mod:`dacflnode.logs`); then the open-files limit is raised, and logged."""
    from dacflnode import logs

    if log_format not in logs.LOG_FORMATS:
        raise ValueError(f"log format {log_format!r} is not one of {', '.join(logs.LOG_FORMATS)}")
    make_dir(state_dir)
    root = logging.getLogger("dacflnode")
    root.setLevel(level)
    logs.install(root, state_dir, log_format="json" if log_format == "json" else "text",
                 node=node)
    guard_state_dir(state_dir, node or state_dir.name)
    before, after = raise_open_files_limit()
    log.info("open-files limit %d (was %d)", after, before, extra={"event": "open_files_limit"})
