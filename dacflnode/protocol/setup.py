"""What a :class:`~dacflnode.protocol.runner.NodeRunner` is given (:class:`NodeSetup`) and what it
reports after each round (:class:`RoundReport`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dacflnode.algorithms.rounds import Algorithm
from dacflnode.config import DAEMON_DEFAULTS
from dacflnode.config.daemon import MIN_ANCHOR_DELAY
from dacflnode.learning.layout import StateLayout
from dacflnode.protocol.copies import Compression
from dacflnode.protocol.policies import Metropolis, MixingPolicy, ModelView, OwnModel
from dacflnode.protocol.training import NodeTrainer
from dacflnode.wire.state_guard import ABSURD_RATIO

if TYPE_CHECKING:
    from dacflnode.protocol.faults import FaultPlan
    from dacflnode.protocol.scale_agreement import ScaleAgreement
    from dacflnode.records.metrics_log import DataInfo


@dataclass
class NodeSetup:
    """Everything a runner needs, already built (the daemon builds it from peers.yaml, the
    simulator from its run settings).

    ``round_deadline`` may be ``math.inf``: wait for every neighbour, however long (a simulation
    without faults). ``checkpoints`` turns the per-round checkpoint off; ``metrics.jsonl`` and
    ``final.safetensors`` are written whenever ``state_dir`` is set. ``executor`` is where mixing
    and completion run: ``None`` (asyncio's default thread pool) keeps the event loop free to
    serve the neighbours; a process that has nothing else to serve may run them in place.
    """

    node_id: str
    neighbours: Sequence[str]
    algorithm: Algorithm
    trainer: NodeTrainer
    layout: StateLayout
    rounds: int
    eval_every: int = 1
    round_deadline: float = DAEMON_DEFAULTS.round_deadline
    hello_timeout: float = DAEMON_DEFAULTS.hello_timeout
    active_neighbours: Callable[[int], Sequence[str]] | None = None
    mixing: MixingPolicy = field(default_factory=Metropolis)
    view: ModelView = field(default_factory=OwnModel)
    state_dir: Path | None = None
    checkpoints: bool = True
    executor: Executor | None = None
    run_info: dict[str, str] = field(default_factory=dict)
    #: Guard the inbox against absurd and stale states (:mod:`dacflnode.wire.state_guard`;
    #: any number turns the guard on, its tolerances are the module's); ``None`` turns it off.
    absurd_ratio: float | None = ABSURD_RATIO
    #: Consecutive missed rounds after which a neighbour is declared gone (docs/faults.md).
    gone_after: int = DAEMON_DEFAULTS.gone_after
    #: Rounds from proposing a re-anchor to the anchor round (at least the network's diameter).
    anchor_delay: int = MIN_ANCHOR_DELAY
    #: Injected faults: edge-rounds that are neither pushed nor waited for (tests, simulations).
    faults: FaultPlan | None = None
    #: Join a running network even when only one round behind it (start from a neighbour's
    #: model at an agreed round); a node further behind its neighbours always joins.
    join: bool = False
    #: Undo one-sided edge uses (off only to measure what they cost).
    repair: bool = True
    #: The node's data (size, samples per class), for the metrics line and the status.
    data: DataInfo | None = None
    #: A compressed run's compression (CHOCO-Gossip over public copies, docs/compression.md);
    #: the algorithm's mixing is then ``choco`` with the same step. ``None``: full states.
    compression: Compression | None = None
    #: ``sync``: the paper's rounds; ``async``: each node at its own pace, pairwise exchanges
    #: (:mod:`dacflnode.protocol.async_schedule`), mixing no snapshot more than ``staleness``
    #: blocks away from its own (``None``: any), training no longer than ``max_duration``
    #: seconds (``None``: every block).
    schedule: str = "sync"
    staleness: int | None = None
    max_duration: float | None = None
    #: A table run's feature agreement (:mod:`dacflnode.protocol.scale_agreement`), settled
    #: after the handshake and before the first round; ``None``: nothing to agree on.
    scale: ScaleAgreement | None = None
    #: The time of the metrics lines (unix seconds); the simulator's runs on its own clock.
    clock: Callable[[], float] = time.time


@dataclass
class RoundReport:
    round: int
    used: tuple[str, ...]
    missing: tuple[str, ...]
    train_loss: float
    samples: int
    accuracy: float | None
    test_loss: float | None
    residual: float
    exchange_s: float
    train_s: float
    seconds: float
    #: payload bytes of the states this node sent to / received from its neighbours in the
    #: round (pushes and pulls, both ways)
    bytes_sent: int = 0
    bytes_received: int = 0
    #: an asynchronous run's exchanges applied in the block and its staleness (metrics line)
    exchanges: int | None = None
    staleness: int | None = None
