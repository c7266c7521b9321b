import copy

import pytest
import torch
from torch import nn

from dacflnode.learning.layout import StateLayout
from dacflnode.learning.models import MODELS, build_model
from dacflnode.learning.train import LocalTrainer, TrainConfig, evaluate
from dacflnode.sim.batched.layers import can_batch
from dacflnode.sim.batched.trainer import BatchedTrainer

SHAPE = (1, 8, 8)


def node_data(sizes, seed=0, shape=SHAPE, classes=10):
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(n, *shape, generator=gen), torch.randint(0, classes, (n,), generator=gen))
        for n in sizes
    ]


def starts_for(model: nn.Module, n: int, seed: int = 1) -> torch.Tensor:
    """Different start vectors per node (running variances kept positive)."""
    layout = StateLayout.from_module(model)
    base = layout.flatten_module(model)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        row = base + 0.05 * torch.randn(base.shape, generator=gen)
        views = layout.views(row)
        for spec in layout.shared:
            if spec.name.endswith("running_var"):
                views[spec.name].abs_().add_(0.1)
        rows.append(row)
    return torch.stack(rows)


def run_both(model, data, cfg, starts, rounds=2, seed=7):
    batched = BatchedTrainer(copy.deepcopy(model), data, cfg, seed=seed)
    sequential = [
        LocalTrainer(copy.deepcopy(model), x, y, cfg, seed=seed, node_index=i)
        for i, (x, y) in enumerate(data)
    ]
    for r in range(rounds):
        got = batched.train(starts, r)
        want = [t.train(starts[i], r) for i, t in enumerate(sequential)]
        yield r, batched, sequential, got, want
        starts = torch.stack([w.flat for w in want])


def assert_same(got, want, batched, sequential):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.flat.shape == w.flat.shape and g.flat.dtype == torch.float32
        assert (g.flat - w.flat).abs().max().item() <= 1e-4
        assert g.loss == pytest.approx(w.loss, abs=1e-5)
        assert (g.steps, g.samples) == (w.steps, w.samples)
    for mine, theirs in zip(batched.local, sequential, strict=True):
        assert mine.keys() == theirs.local.keys()
        for key in mine:
            assert torch.equal(mine[key], theirs.local[key])


@pytest.mark.parametrize("name", ["tiny-cnn", "mlp"])
@pytest.mark.parametrize(
    "sgd",
    [
        {},  # plain SGD: the linear layers apply it inside their backward pass
        {"momentum": 0.5, "weight_decay": 1e-3},  # torch.optim.SGD for every parameter
    ],
    ids=["plain", "momentum"],
)
def test_batched_matches_sequential_training(name, sgd):
    torch.manual_seed(0)
    model = build_model(name, SHAPE, 10)
    data = node_data([45, 45, 45])
    cfg = TrainConfig(lr=0.05, lr_decay=0.9, batch_size=10, **sgd)
    starts = starts_for(model, 3)
    for _, batched, sequential, got, want in run_both(model, data, cfg, starts):
        assert_same(got, want, batched, sequential)
        assert not torch.equal(got[0].flat, got[1].flat)


def test_batched_matches_sequential_for_a_more_varied_architecture():
    """Grouped and strided convolutions, average pooling, other activations, no biases, BN
    without affine parameters and with cumulative averaging."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1, bias=False),
        nn.BatchNorm2d(4, affine=False, momentum=None),
        nn.Tanh(),
        nn.Conv2d(4, 6, 3, stride=2, groups=2),
        nn.ReLU(),
        nn.AvgPool2d(2),
        nn.Flatten(),
        nn.Linear(6 * 1 * 1, 5, bias=False),
        nn.LeakyReLU(0.1),
        nn.Linear(5, 3),
    )
    assert can_batch(model)
    data = node_data([30, 30], shape=(2, 8, 8), classes=3)
    cfg = TrainConfig(lr=0.1, momentum=0.9, batch_size=8, local_epochs=2)
    for _, batched, sequential, got, want in run_both(model, data, cfg, starts_for(model, 2)):
        assert_same(got, want, batched, sequential)


def test_local_steps_allow_unequal_partitions_with_equal_batches():
    torch.manual_seed(0)
    model = build_model("tiny-cnn", SHAPE, 10)
    data = node_data([40, 60, 50])
    cfg = TrainConfig(lr=0.05, batch_size=10, local_steps=4)
    for _, batched, sequential, got, want in run_both(model, data, cfg, starts_for(model, 3)):
        assert_same(got, want, batched, sequential)
        assert got[0].steps == 4


def test_batched_evaluate_matches_evaluate():
    torch.manual_seed(0)
    model = build_model("tiny-cnn", SHAPE, 10)
    data = node_data([20, 20, 20])
    trainer = BatchedTrainer(copy.deepcopy(model), data, TrainConfig(), seed=0)
    flats = starts_for(model, 3)
    test_x, test_y = node_data([77], seed=5)[0]
    got = trainer.evaluate(flats, test_x, test_y, batch_size=30)
    for i, (acc, loss) in enumerate(got):
        want_acc, want_loss = evaluate(copy.deepcopy(model), flats[i], test_x, test_y,
                                       local=trainer.local[i])
        assert acc == want_acc
        assert loss == pytest.approx(want_loss, rel=1e-5)
    assert got[0] != got[1]


def test_unequal_step_counts_or_batch_sizes_are_rejected():
    torch.manual_seed(0)
    model = build_model("mlp", SHAPE, 10)
    cfg = TrainConfig(batch_size=20)
    flats = starts_for(model, 2)
    steps = BatchedTrainer(copy.deepcopy(model), node_data([40, 60]), cfg, seed=0)
    with pytest.raises(ValueError, match="sequential"):
        steps.train(flats, 0)
    sizes = BatchedTrainer(copy.deepcopy(model), node_data([45, 50]), cfg, seed=0)
    with pytest.raises(ValueError, match="sequential"):
        sizes.train(flats, 0)


def test_flats_of_the_wrong_shape_are_rejected():
    torch.manual_seed(0)
    model = build_model("mlp", SHAPE, 10)
    trainer = BatchedTrainer(model, node_data([20, 20]), TrainConfig(), seed=0)
    with pytest.raises(ValueError):
        trainer.train(starts_for(model, 3), 0)


@pytest.mark.parametrize("name", MODELS)
def test_builtin_models_can_be_batched(name):
    shape = {"cifar-cnn": (3, 32, 32), "fmnist-cnn": (1, 28, 28)}.get(name, SHAPE)
    assert can_batch(build_model(name, shape, 10))


@pytest.mark.parametrize(
    "model",
    [
        nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(64, 10)),  # random per node
        nn.Sequential(nn.Linear(8, 10), nn.Flatten()),  # Linear on [B, C, H, W]
        nn.Sequential(nn.Conv2d(1, 2, 3)),  # no Flatten
        nn.Sequential(nn.Sequential(nn.Flatten(), nn.Linear(64, 10))),  # nested
        nn.Sequential(nn.Flatten(0), nn.Linear(64, 10)),
        nn.Sequential(nn.MaxPool2d(2, return_indices=True), nn.Flatten(), nn.Linear(16, 10)),
        nn.Linear(64, 10),
    ],
)
def test_unsupported_models_are_not_batched(model):
    assert not can_batch(model)
    with pytest.raises(ValueError, match="sequential"):
        BatchedTrainer(model, node_data([10, 10]), TrainConfig(), seed=0)


@pytest.mark.parametrize("workers", [2, 3])
def test_splitting_the_nodes_over_worker_threads_gives_the_same_results(workers):
    torch.manual_seed(0)
    model = build_model("tiny-cnn", SHAPE, 10)
    data = node_data([30, 30, 30, 30])
    cfg = TrainConfig(lr=0.05, momentum=0.5, batch_size=10)
    starts = starts_for(model, 4)
    threads = torch.get_num_threads()
    split = BatchedTrainer(copy.deepcopy(model), data, cfg, seed=3, workers=workers)
    assert split.workers == workers
    whole = BatchedTrainer(copy.deepcopy(model), data, cfg, seed=3, workers=1)
    for r in range(2):
        got, want = split.train(starts, r), whole.train(starts, r)
        assert torch.get_num_threads() == threads  # restored after the worker threads
        for g, w in zip(got, want, strict=True):
            assert (g.flat - w.flat).abs().max().item() <= 1e-5
            assert g.loss == pytest.approx(w.loss, abs=1e-6)
        starts = torch.stack([w.flat for w in want])
    assert [d["1.num_batches_tracked"] for d in split.local] == [
        d["1.num_batches_tracked"] for d in whole.local
    ]
    test_x, test_y = node_data([50], seed=9)[0]
    for (a1, l1), (a2, l2) in zip(split.evaluate(starts, test_x, test_y),
                                  whole.evaluate(starts, test_x, test_y), strict=True):
        assert a1 == a2 and l1 == pytest.approx(l2, rel=1e-5)


def test_errors_in_worker_threads_reach_the_caller():
    torch.manual_seed(0)
    model = build_model("tiny-cnn", SHAPE, 10)
    trainer = BatchedTrainer(model, node_data([20, 20, 20, 20]), TrainConfig(), seed=0,
                             workers=2)
    threads = torch.get_num_threads()
    wrong_channels = torch.zeros(5, 2, 8, 8)  # the model takes 1 channel
    with pytest.raises(RuntimeError):
        trainer.evaluate(starts_for(model, 4), wrong_channels, torch.zeros(5, dtype=torch.long))
    assert torch.get_num_threads() == threads


def test_cumulative_batch_norm_needs_equal_step_counters():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2, momentum=None), nn.Flatten(),
                          nn.Linear(72, 10))
    trainer = BatchedTrainer(model, node_data([20, 20]), TrainConfig(batch_size=10), seed=0)
    flats = starts_for(model, 2)
    trainer.train(flats, 0)
    assert [int(d["1.num_batches_tracked"]) for d in trainer.local] == [2, 2]
    trainer.local[1]["1.num_batches_tracked"] = torch.tensor(5)
    with pytest.raises(ValueError, match="sequential"):
        trainer.train(flats, 1)


def test_flat_feature_data_works_too():
    """Samples of shape [F] instead of [C, H, W] (an MLP on tabular data)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(24, 6, generator=gen), torch.randint(0, 3, (24,), generator=gen))
            for _ in range(3)]
    cfg = TrainConfig(lr=0.1, batch_size=8)
    for _, batched, sequential, got, want in run_both(model, data, cfg, starts_for(model, 3)):
        assert_same(got, want, batched, sequential)


def test_frozen_parameters_stay_frozen():
    torch.manual_seed(0)
    model = build_model("tiny-cnn", SHAPE, 10)
    first = next(iter(model.children()))
    assert isinstance(first, nn.Conv2d)
    first.weight.requires_grad_(False)
    data = node_data([20, 20])
    cfg = TrainConfig(lr=0.1, weight_decay=0.01, batch_size=10)
    starts = starts_for(model, 2)
    layout = StateLayout.from_module(model)
    for _, batched, sequential, got, want in run_both(model, data, cfg, starts, rounds=1):
        assert_same(got, want, batched, sequential)
        for g, start in zip(got, starts, strict=True):
            assert torch.equal(layout.views(g.flat)["0.weight"], layout.views(start)["0.weight"])


def test_a_trainer_of_one_slice_of_the_nodes_trains_them_as_the_whole_runs_trainer_does():
    """``first_node``: a trainer of nodes 2..4 alone (as a Ray worker holds them) gives bit for
    bit what the trainer of all 5 nodes split over 2 worker threads (nodes 0-1, 2-4) gives them.

    The split itself matters at the last bit (a node's place in its stacked group), which is why
    the Ray engine cuts its slices exactly where the local engine cuts its groups."""
    torch.manual_seed(0)
    model = build_model("tiny-cnn", SHAPE, 10)
    data = node_data([30] * 5)
    cfg = TrainConfig(lr=0.05, momentum=0.5, batch_size=10)
    starts = starts_for(model, 5)
    threads = torch.get_num_threads()
    whole = BatchedTrainer(copy.deepcopy(model), data, cfg, seed=3, workers=2)
    torch.set_num_threads(1)  # a Ray worker's (and each of the whole trainer's threads')
    try:
        part = BatchedTrainer(copy.deepcopy(model), data[2:], cfg, seed=3, workers=1,
                              first_node=2)
        unshifted = BatchedTrainer(copy.deepcopy(model), data[2:], cfg, seed=3, workers=1)
        got = part.train(starts[2:], 0)
        other = unshifted.train(starts[2:], 0)
    finally:
        torch.set_num_threads(threads)
    want = whole.train(starts, 0)[2:]
    for g, w, o in zip(got, want, other, strict=True):
        assert torch.equal(g.flat, w.flat) and g.loss == w.loss
        assert not torch.equal(o.flat, w.flat)  # other batches without the offset
    assert part.plans(0)[0][0].tolist() == whole.plans(0)[2][0].tolist()
