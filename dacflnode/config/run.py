"""The run settings (:class:`RunConfig`) shared by the simulator and the daemon.

Every setting is declared here once (see :mod:`dacflnode.config.schema`); the reference is
``docs/configuration.md``, generated from these declarations. Every problem is reported as a
:class:`~dacflnode.errors.ConfigError` naming the option, spelled as in YAML (``snake_case``;
``kebab-case`` is accepted too).

The checks that span several settings are :mod:`dacflnode.config.run_checks`; reading the
settings from a YAML file (``--config``) is :mod:`dacflnode.config.run_file`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dacflnode.algorithms.names import (
    ALGORITHMS,
    DAEMON_ALGORITHMS,
    FODAC_VARIANTS,
    GRAPH_KINDS,
    MIXINGS,
    SCHEDULES,
    TOPOLOGIES,
)
from dacflnode.config import schema
from dacflnode.config.dataset_defaults import DEFAULT_LR_TEXT, resolved_model
from dacflnode.config.own_data import (
    BAD_FILES,
    MISSING,
    OWN_DATA,
    SCALINGS,
    is_own,
    parse_categories,
)
from dacflnode.config.run_checks import check_run
from dacflnode.config.run_derived import DerivedValues
from dacflnode.config.schema import Scope, setting
from dacflnode.learning.names import DATASETS, PARTITIONS, PRECISIONS

ENGINES = ("auto", "batched", "sequential")

RUN = Scope.RUN
NODE = Scope.NODE


def _table(run: Any) -> bool:
    return bool(run.dataset == "table")


def _folder(run: Any) -> bool:
    return bool(run.dataset == "folder")


@schema.declared
@dataclass
class RunConfig(DerivedValues):
    """One experiment (simulator) or one run of a cluster (daemon).

    Defaults follow the paper's Table 1 (10 nodes, 100 rounds, batch 20, one local epoch,
    learning-rate decay 0.995, lr 0.001 for (F)MNIST and 0.005 for CIFAR-10). The synthetic
    data set, this project's own, defaults to the ``mlp`` and lr 0.05: its 8x8 images are class
    prototypes under heavy noise, which the tiny CNN at lr 0.001 does not learn in 100 rounds.
    """

    algorithm: tuple[str, ...] = setting(
        ("dacfl",),
        help="Comma list of algorithms to run; a daemon runs exactly one, and only one that"
        " needs no central god node.",
        scope=RUN,
        group="run",
        choices=ALGORITHMS,
        fingerprint=lambda run: ",".join(run.algorithm),
        cluster_choices=DAEMON_ALGORITHMS,
        cluster_help="Comma list of algorithms: launch runs each as a cluster of its own, a"
        " peers file holds one. dpsgd and fedavg need a central god node: simulate only.",
    )
    nodes: int = setting(10, help="Number of nodes.", scope=RUN, group="run", minimum=2)
    rounds: int = setting(
        100,
        help="Communication rounds; under schedule async, each node's training blocks.",
        scope=RUN, group="run", minimum=1)
    schedule: str = setting(
        "sync",
        help="sync: every node mixes its neighbours once per round, in step (the paper's);"
        " async: each node trains at its own pace and mixes with whichever neighbours answer"
        " now, through pairwise exchanges that keep the consensus sum exact (docs/algorithm.md,"
        " Asynchronous DACFL).",
        scope=RUN,
        group="run",
        choices=SCHEDULES,
    )
    staleness: int | None = setting(
        None,
        help="schedule async: never mix a neighbour's snapshot more than N training blocks"
        " behind the node's own.",
        scope=RUN,
        group="run",
        minimum=0,
        metavar="N",
        default_text="no bound",
        relevant=lambda run: run.schedule == "async",
        relevant_text="schedule is async",
    )
    max_duration: float | None = setting(
        None,
        help="schedule async: stop training after this many seconds of the run (each node"
        " from its own start) and end settled, whatever blocks are left.",
        scope=RUN,
        group="run",
        above=0.0,
        metavar="SECONDS",
        default_text="no limit",
        relevant=lambda run: run.schedule == "async",
        relevant_text="schedule is async",
    )
    dataset: str = setting(
        "fashion-mnist",
        help="Data set: a built-in one, or the device's own data: folder (one subfolder of"
        " images per class), table (CSV or Parquet) or python (data_factory).",
        scope=RUN,
        group="data",
        choices=DATASETS + OWN_DATA,
        noun="data set",
    )
    data_root: str | None = setting(
        None,
        help="This device's data: the data set files of a built-in set (IDX files for (F)MNIST,"
        " cifar-10-batches-bin or -py for CIFAR-10); for own data the folder of class"
        " subfolders, or the CSV/Parquet file or folder of them. simulate and launch: DIR with"
        " one DIR/<node-id>/ per node.",
        scope=NODE,
        group="data",
        default_text="/usr/share/datasets/fashion-mnist for fashion-mnist",
    )
    test_root: str | None = setting(
        None,
        help="This device's test data, in the form of data_root (own data only). simulate and"
        " launch: T with one T/<node-id>/ per node, or one test folder of class subfolders"
        " shared by every node.",
        scope=NODE,
        group="data",
        default_text="a held-out fraction (holdout) of the device's data",
    )
    classes: tuple[str, ...] = setting(
        (),
        help="The run's ordered class list (own data): folder names of the class subfolders,"
        " a table's label values as strings, or a Python factory's label i = classes[i]."
        " Labels map by name; a device may lack some classes.",
        scope=RUN,
        group="data",
        relevant=is_own,
        relevant_text="own data",
        metavar="NAME,...",
    )
    label_column: str | None = setting(
        None,
        help="The label column of dataset table; every other column is a feature (numbers, or"
        " text listed in categories).",
        scope=RUN, group="data", relevant=_table, relevant_text="dataset is table",
        metavar="NAME",
    )
    categories: Mapping[str, tuple[str, ...]] | None = setting(
        None,
        help="A table's text columns and their values, {column: [value, ...]}: each column is"
        " one-hot encoded as the features column=value, in this order (a number column listed"
        " here too, by its text). No flag: set it in the run file; dacflnode data check"
        " prints the block.",
        scope=RUN, group="data", relevant=_table, relevant_text="dataset is table", cli=False,
    )
    other_category: bool = setting(
        False,
        help="A table value that categories does not list goes to one more feature,"
        " column=<other>, instead of stopping the load.",
        scope=RUN, group="data", relevant=_table, relevant_text="dataset is table",
    )
    missing: str = setting(
        "fail",
        help="A table's missing cell (empty, NA, N/A, NaN, nan, null, NULL or None): fail (name"
        " the rows), drop (leave those rows out) or mean (a number takes the network's mean, a"
        " text column's one-hot features are all zero).",
        scope=RUN, group="data", choices=MISSING, relevant=_table,
        relevant_text="dataset is table",
    )
    scaling: str = setting(
        "standardize",
        help="How a table's numeric features are put on one scale: standardize (the network's"
        " agreed mean and standard deviation, computed without revealing any device's own),"
        " minmax (the agreed minimum and maximum) or none (as in the files)",
        scope=RUN, group="data", choices=SCALINGS, relevant=_table,
        relevant_text="dataset is table",
    )
    data_factory: str | None = setting(
        None,
        help="package.module:function returning the device's (train, test) datasets, for"
        " dataset python; it is called with the node's data_root and test_root.",
        scope=RUN, group="data", relevant=lambda run: run.dataset == "python",
        relevant_text="dataset is python", metavar="MODULE:FN",
    )
    image_size: int = setting(
        28, help="Side in pixels images of dataset folder are resized to (square).",
        scope=RUN, group="data", minimum=1, relevant=_folder, relevant_text="dataset is folder",
    )
    channels: int = setting(
        1, help="Channels of dataset folder: 1 (grayscale) or 3 (RGB).", scope=RUN,
        group="data", minimum=1, maximum=3, relevant=_folder, relevant_text="dataset is folder",
    )
    resize: bool = setting(
        True,
        help="Resize images of dataset folder to image_size; off, an image of another size is"
        " an error.",
        scope=RUN, group="data", relevant=_folder, relevant_text="dataset is folder",
    )
    holdout: float = setting(
        0.2,
        help="Fraction of a device's own data held out, by seed, to evaluate on when it has"
        " no test_root.",
        scope=RUN,
        group="data",
        above=0.0,
        below=1.0,
        relevant=is_own,
        relevant_text="own data",
    )
    bad_files: str = setting(
        "fail",
        help="An image file of dataset folder that cannot be decoded: fail (list the first"
        " five) or skip it (counted in the log and the status).",
        scope=NODE,
        group="data",
        choices=BAD_FILES,
    )
    download: bool = setting(
        False,
        help="Let torchvision download the data set if it is missing.",
        scope=NODE,
        group="data",
    )
    partition: str = setting(
        "iid",
        help="How the training set of a built-in data set is split over the nodes (shards:"
        " the paper's non-i.i.d.).",
        scope=RUN,
        group="data",
        choices=PARTITIONS,
        relevant=lambda run: not is_own(run),
        relevant_text="a built-in data set",
    )
    dirichlet_alpha: float = setting(
        0.5,
        help="Concentration of --partition dirichlet.",
        scope=RUN,
        group="data",
        above=0.0,
        relevant=lambda run: run.partition == "dirichlet" and not is_own(run),
        relevant_text="partition is dirichlet",
    )
    shards_per_node: int = setting(
        2,
        help="Label shards per node of --partition shards.",
        scope=RUN,
        group="data",
        minimum=1,
        relevant=lambda run: run.partition == "shards" and not is_own(run),
        relevant_text="partition is shards",
    )
    model: str | None = setting(
        None,
        help="fmnist-cnn, cifar-cnn, mlp, tiny-cnn or package.module:Class.",
        scope=RUN,
        group="model",
        default_text="per data set: fmnist-cnn; cifar-cnn for cifar10; mlp for synthetic",
        fingerprint=resolved_model,
    )
    topology: str = setting(
        "dense",
        help="Mixing topology: a matrix kind (simulator only) or a graph kind with"
        " Metropolis-Hastings weights.",
        scope=RUN,
        group="topology",
        choices=TOPOLOGIES,
        cluster_choices=GRAPH_KINDS,
        cluster_help="Graph of the cluster; each node computes its Metropolis-Hastings weights"
        " itself (the matrix kinds dense, sparse, uniform and custom need a global view:"
        " simulate only).",
    )
    degree: int = setting(
        3,
        help="Degree of --topology random-regular.",
        scope=RUN,
        group="topology",
        minimum=1,
        relevant=lambda run: run.topology == "random-regular",
        relevant_text="topology is random-regular",
    )
    edge_prob: float = setting(
        0.3,
        help="Edge probability of --topology erdos-renyi.",
        scope=RUN,
        group="topology",
        relevant=lambda run: run.topology == "erdos-renyi",
        relevant_text="topology is erdos-renyi",
    )
    zero_fraction: float = setting(
        0.5,
        help="Fraction of zero off-diagonal entries of --topology sparse (psi).",
        scope=RUN,
        group="topology",
        relevant=lambda run: run.topology == "sparse",
        relevant_text="topology is sparse",
        simulator_only=True,
    )
    drop_prob: float = setting(
        0.5,
        help="Probability that an edge is inactive in an epoch of a time-varying graph.",
        scope=RUN,
        group="topology",
        relevant=lambda run: run.time_varying > 0,
        relevant_text="time_varying > 0",
    )
    edge_list: str | None = setting(
        None,
        help="File of 'i j' lines for --topology edge-list (a path on this host; a daemon's"
        " graph is fingerprinted through run.edges).",
        scope=NODE,
        group="topology",
    )
    mixing_matrix: str | None = setting(
        None,
        help="File holding a custom mixing matrix (--topology custom; simulator only, a path"
        " on this host).",
        scope=NODE,
        group="topology",
        simulator_only=True,
    )
    time_varying: int = setting(
        0,
        help="Rebuild the topology every K rounds (0 = static).",
        scope=RUN,
        group="topology",
        minimum=0,
        metavar="K",
    )
    lr: float | None = setting(
        None,
        help="SGD learning rate; round t uses lr * lr_decay^t.",
        scope=RUN,
        group="training",
        above=0.0,
        default_text=DEFAULT_LR_TEXT,
        fingerprint=lambda run: run.learning_rate,
    )
    lr_decay: float = setting(
        0.995,
        help="Per-round learning-rate decay.",
        scope=RUN,
        group="training",
        above=0.0,
        maximum=1.0,
    )
    momentum: float = setting(
        0.0, help="SGD momentum.", scope=RUN, group="training", minimum=0.0, below=1.0
    )
    weight_decay: float = setting(
        0.0, help="SGD weight decay.", scope=RUN, group="training", minimum=0.0
    )
    batch_size: int = setting(
        20, help="Mini-batch size of local training.", scope=RUN, group="training", minimum=1
    )
    local_epochs: int = setting(
        1, help="Local epochs per round.", scope=RUN, group="training", minimum=1
    )
    local_steps: int | None = setting(
        None,
        help="Mini-batches per round (overrides local_epochs).",
        scope=RUN,
        group="training",
        minimum=1,
    )
    fodac_variant: str = setting(
        "lagged",
        help="DACFL tracking: the paper's lagged difference or the fresh one.",
        scope=RUN,
        group="training",
        choices=FODAC_VARIANTS,
        noun="variant",
    )
    mixing: str = setting(
        "exact",
        help="How a node mixes its neighbours' states: exact (the paper's weighted average) or"
        " clipped (ClippedGossip: each neighbour's difference clipped to a radius, which"
        " bounds what one neighbour can move a node per round; docs/algorithm.md, Robust"
        " mixing). Not with fedavg.",
        scope=RUN,
        group="topology",
        choices=MIXINGS,
    )
    clip_radius: float | None = setting(
        None,
        help="The clip radius of mixing clipped, in the L2 norm of the whole state vector;"
        " overrides clip_fraction.",
        scope=RUN,
        group="topology",
        above=0.0,
        default_text="clip_fraction of the initial model's norm",
        relevant=lambda run: run.mixing == "clipped",
        relevant_text="mixing is clipped",
    )
    clip_fraction: float = setting(
        0.1,
        help="The clip radius of mixing clipped as a fraction of the L2 norm of the initial"
        " model (which every node derives from the seed, so no peer can move it).",
        scope=RUN,
        group="topology",
        above=0.0,
        relevant=lambda run: run.mixing == "clipped" and run.clip_radius is None,
        relevant_text="mixing is clipped and clip_radius is unset",
    )
    compression: str = setting(
        "none",
        help="What a node sends its neighbours each round: none (the full float32 states),"
        " fp16 or bf16 (a cast), int8 (8 bits per entry and a scale per block, stochastic"
        " rounding), topk:F (the fraction F of largest entries with their indices) or"
        " randk:F (a fraction F of entries chosen by a shared seed). Compressed runs mix"
        " with CHOCO-Gossip, which keeps the consensus sum exact (docs/compression.md).",
        scope=RUN,
        group="topology",
        metavar="none|fp16|bf16|int8|topk:F|randk:F",
    )
    consensus_step: float | None = setting(
        None,
        help="CHOCO-Gossip's consensus step size gamma of a compressed run.",
        scope=RUN,
        group="topology",
        above=0.0,
        maximum=1.0,
        default_text="per compressor (docs/compression.md)",
        relevant=lambda run: run.compression != "none",
        relevant_text="compression is not none",
    )
    seed: int = setting(0, help="Seed of every random choice (same seed, same results).",
                        scope=RUN, group="run")
    eval_every: int = setting(
        1, help="Evaluate every N rounds.", scope=NODE, group="evaluation", minimum=1
    )
    eval_samples: int | None = setting(
        None,
        help="Evaluate on a fixed subset of the test set of this size.",
        scope=NODE,
        group="evaluation",
        minimum=1,
        default_text="the whole test set",
    )
    device: str = setting(
        "auto", help="auto, cpu, cuda, cuda:N or mps.", scope=NODE, group="runtime"
    )
    precision: str = setting(
        "fp32",
        help="Arithmetic of local training: fp32, or bf16 autocast (bfloat16 convolutions and"
        " matrix products; float32 weights, SGD and states). bf16 needs a CPU, a CUDA GPU of"
        " compute capability 8.0+ or MPS on macOS 14+.",
        scope=NODE,
        group="runtime",
        choices=PRECISIONS,
    )
    slowdown: float = setting(
        1.0,
        help="Make this device train this many times slower than it can (an experiment's"
        " slow device: a pause after each round's training of (F-1) times its duration; in"
        " simulate, F times the virtual block time). simulate and launch: --slowdown"
        " NODE=F, repeatable.",
        scope=NODE,
        group="runtime",
        minimum=1.0,
        metavar="F",
        cli=False,
    )
    threads: int | None = setting(
        None,
        help="PyTorch CPU threads per process (bit-identical results need equal counts).",
        scope=NODE,
        group="runtime",
        minimum=1,
        default_text="PyTorch's",
    )
    engine: str = setting(
        "auto",
        help="How the simulator trains its virtual nodes: batched (all of them as one stacked"
        " model: equal to float32 rounding, faster for small models), sequential (one after"
        " another with a daemon's training code: a deployment's results bit for bit) or auto"
        " (batched when the model and the partition allow it). Asynchronous runs and rounds on"
        " the virtual clock are always sequential: each node trains at its own pace.",
        scope=NODE,
        group="runtime",
        choices=ENGINES,
        simulator_only=True,
    )
    block_time: float = setting(
        1.0,
        help="simulate --schedule async: virtual seconds one block of training takes on a"
        " node of slowdown 1 (a node of slowdown F takes F times as long); no real time"
        " passes.",
        scope=NODE,
        group="runtime",
        above=0.0,
        metavar="SECONDS",
        simulator_only=True,
    )
    link_latency: float = setting(
        0.0,
        help="simulate --schedule async: virtual seconds each way of every exchange.",
        scope=NODE,
        group="runtime",
        minimum=0.0,
        metavar="SECONDS",
        simulator_only=True,
    )
    link_mbps: float | None = setting(
        None,
        help="simulate --schedule async: every link's bandwidth in Mbit/s (an exchange's"
        " bytes take their time each way).",
        scope=NODE,
        group="runtime",
        above=0.0,
        metavar="MBPS",
        default_text="unlimited",
        simulator_only=True,
    )
    synthetic_train: int = setting(
        2000, help="Training samples of --dataset synthetic.", scope=RUN, group="data",
        minimum=1, relevant=lambda run: run.dataset == "synthetic",
        relevant_text="dataset is synthetic",
    )
    synthetic_test: int = setting(
        500, help="Test samples of --dataset synthetic.", scope=RUN, group="data", minimum=1,
        relevant=lambda run: run.dataset == "synthetic", relevant_text="dataset is synthetic",
    )

    # ------------------------------------------------------------------ validation
    def validate(self) -> RunConfig:
        """The declared checks (choices, bounds), then the ones that span several settings
        (:func:`~dacflnode.config.run_checks.check_run`); returns this run."""
        check_run(self)
        return self

    def for_node(self, node_id: str) -> RunConfig:
        """This run as node ``node_id`` of ``simulate`` or ``launch`` sees it: with own data,
        ``data_root`` DIR becomes ``DIR/<node-id>`` and ``test_root`` T becomes ``T/<node-id>``
        when that exists, else stays T (one test set shared by every node). Built-in data sets
        are cut by ``partition`` instead: unchanged."""
        if not self.own_data:
            return self
        data_root, test_root = self.data_root, self.test_root
        if data_root is not None:
            data_root = str(Path(data_root) / node_id)
        if test_root is not None and (Path(test_root) / node_id).exists():
            test_root = str(Path(test_root) / node_id)
        return dataclasses.replace(self, data_root=data_root, test_root=test_root)

    @property
    def own_data(self) -> bool:
        """Whether each device brings its own data (``folder``, ``table`` or ``python``)."""
        return is_own(self)

    def apply_threads(self) -> None:
        """Set PyTorch's intra-op threads when ``threads`` is given.

        Results are bit-identical only between runs with the same thread count: a different
        count changes the order of floating-point sums inside convolutions.
        """
        if self.threads is not None:
            import torch

            torch.set_num_threads(self.threads)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["algorithm"] = list(self.algorithm)
        out["lr"] = self.learning_rate
        return out


def config_from_mapping(values: Mapping[str, Any], base: RunConfig | None = None) -> RunConfig:
    """Apply ``values`` (YAML keys or CLI options; ``None`` means "not given") over ``base``;
    ``categories``, a mapping, is read by :func:`~dacflnode.config.own_data.parse_categories`."""
    rest = dict(values)
    keys = [k for k in rest if str(k).replace("-", "_") == "categories"]
    run = schema.from_mapping(RunConfig, {k: v for k, v in rest.items() if k not in keys}, base)
    for key in keys:
        run = dataclasses.replace(run, categories=parse_categories(rest[key]))
    return run
