import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dacflnode.errors import ConfigError
from dacflnode.learning.layout import StateLayout
from dacflnode.learning.models import build_model
from dacflnode.learning.train import (
    LocalTrainer,
    TrainConfig,
    batch_plan,
    evaluate,
    pick_device,
)


def blobs(n: int, seed: int = 0, shape=(1, 8, 8), classes: int = 4):
    """Well separated class prototypes plus a little noise."""
    gen = torch.Generator().manual_seed(seed)
    protos = torch.randn(classes, *shape, generator=torch.Generator().manual_seed(99)) * 2
    y = torch.randint(0, classes, (n,), generator=gen)
    x = protos[y] + 0.5 * torch.randn(n, *shape, generator=gen)
    return x, y


def model_for(name: str = "tiny-cnn", classes: int = 4) -> nn.Module:
    torch.manual_seed(0)
    return build_model(name, (1, 8, 8), classes)


# ------------------------------------------------------------------------------ TrainConfig


def test_lr_decays_geometrically_per_round():
    cfg = TrainConfig(lr=0.1, lr_decay=0.5)
    assert cfg.lr_at(0) == 0.1
    assert cfg.lr_at(3) == pytest.approx(0.0125)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("lr", 0.0),
        ("lr", -1.0),
        ("lr_decay", 0.0),
        ("lr_decay", 1.5),
        ("momentum", 1.0),
        ("momentum", -0.1),
        ("weight_decay", -1e-4),
        ("batch_size", 0),
        ("local_epochs", 0),
        ("local_steps", 0),
    ],
)
def test_bad_train_config_values_are_config_errors(field, value):
    with pytest.raises(ConfigError) as err:
        TrainConfig(**{field: value})
    assert err.value.field == field


# ------------------------------------------------------------------------------ batch_plan


def test_batch_plan_is_deterministic_and_depends_on_seed_node_and_round():
    cfg = TrainConfig(batch_size=7)

    def flat(plan):
        return torch.cat(plan).tolist()

    base = flat(batch_plan(50, cfg, seed=1, node_index=2, round_=3))
    assert base == flat(batch_plan(50, cfg, seed=1, node_index=2, round_=3))
    assert base != flat(batch_plan(50, cfg, seed=2, node_index=2, round_=3))
    assert base != flat(batch_plan(50, cfg, seed=1, node_index=3, round_=3))
    assert base != flat(batch_plan(50, cfg, seed=1, node_index=2, round_=4))


def test_each_epoch_is_a_permutation_cut_into_batches_keeping_the_partial_one():
    cfg = TrainConfig(batch_size=20, local_epochs=2)
    plan = batch_plan(45, cfg, seed=0, node_index=0, round_=0)
    assert [len(b) for b in plan] == [20, 20, 5, 20, 20, 5]
    assert all(b.dtype == torch.long for b in plan)
    first, second = torch.cat(plan[:3]), torch.cat(plan[3:])
    assert sorted(first.tolist()) == list(range(45))
    assert sorted(second.tolist()) == list(range(45))
    assert not torch.equal(first, second)  # a fresh permutation per epoch


def test_local_steps_gives_exactly_that_many_batches_across_epochs():
    plan = batch_plan(45, TrainConfig(batch_size=20, local_steps=5), 0, 0, 0)
    assert [len(b) for b in plan] == [20, 20, 5, 20, 20]
    one_epoch = batch_plan(45, TrainConfig(batch_size=20), 0, 0, 0)
    assert all(torch.equal(a, b) for a, b in zip(plan[:3], one_epoch, strict=True))
    assert len(batch_plan(45, TrainConfig(batch_size=20, local_steps=2), 0, 0, 0)) == 2


def test_empty_partition_gives_an_empty_plan():
    assert batch_plan(0, TrainConfig(), 0, 0, 0) == []
    assert batch_plan(0, TrainConfig(local_steps=3), 0, 0, 0) == []


# ------------------------------------------------------------------------------ LocalTrainer


def test_training_lowers_the_loss_and_learns_the_task():
    x, y = blobs(400)
    model = model_for()
    cfg = TrainConfig(lr=0.05, lr_decay=1.0, batch_size=20)
    trainer = LocalTrainer(model, x, y, cfg, seed=0, node_index=0)
    test_x, test_y = blobs(200, seed=1)
    flat = trainer.layout.flatten_module(model)
    acc0, loss0 = evaluate(model, flat, test_x, test_y, local=trainer.local)
    losses = []
    for r in range(4):
        result = trainer.train(flat, r)
        flat = result.flat
        losses.append(result.loss)
    acc, loss = evaluate(model, flat, test_x, test_y, local=trainer.local)
    assert losses[-1] < losses[0]
    assert loss < loss0
    assert acc > 0.9 > acc0


def test_train_follows_the_batch_plan_with_plain_sgd():
    x, y = blobs(45)
    cfg = TrainConfig(lr=0.1, lr_decay=0.9, momentum=0.5, weight_decay=1e-3, batch_size=20)
    model = model_for("mlp")
    layout = StateLayout.from_module(model)
    start = layout.flatten_module(model)
    result = LocalTrainer(copy.deepcopy(model), x, y, cfg, seed=5, node_index=2).train(start, 2)

    reference = copy.deepcopy(model)
    opt = torch.optim.SGD(reference.parameters(), lr=0.1 * 0.9**2, momentum=0.5,
                          weight_decay=1e-3)
    losses = []
    for idx in batch_plan(45, cfg, seed=5, node_index=2, round_=2):
        opt.zero_grad()
        loss = F.cross_entropy(reference(x[idx]), y[idx])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert torch.allclose(result.flat, layout.flatten_module(reference), atol=1e-6)
    assert result.loss == pytest.approx(sum(losses) / len(losses), rel=1e-5)
    assert (result.steps, result.samples) == (3, 45)


def test_optimizer_is_fresh_every_round():
    """With momentum, a carried-over optimizer would make a repeated round differ."""
    x, y = blobs(60)
    cfg = TrainConfig(lr=0.05, momentum=0.9, batch_size=20)
    model = model_for()
    trainer = LocalTrainer(model, x, y, cfg, seed=0, node_index=0)
    start = trainer.layout.flatten_module(model)
    first = trainer.train(start, 0)
    trainer.local = {k: torch.zeros_like(v) for k, v in trainer.local.items()}
    again = trainer.train(start, 0)
    assert torch.equal(first.flat, again.flat)
    assert first.loss == again.loss


def test_train_returns_a_new_cpu_vector_and_leaves_the_start_alone():
    x, y = blobs(40)
    model = model_for()
    trainer = LocalTrainer(model, x, y, TrainConfig(lr=0.1), seed=0, node_index=0)
    start = trainer.layout.flatten_module(model)
    before = start.clone()
    result = trainer.train(start, 0)
    assert torch.equal(start, before)
    assert result.flat.dtype == torch.float32 and result.flat.device.type == "cpu"
    assert result.flat.shape == start.shape
    assert result.flat.data_ptr() != start.data_ptr()
    assert not torch.equal(result.flat, start)


def test_local_integer_buffers_count_this_nodes_steps():
    x, y = blobs(45)
    model = model_for()  # tiny-cnn: one batch norm
    trainer = LocalTrainer(model, x, y, TrainConfig(batch_size=20), seed=0, node_index=0)
    assert trainer.local == {"1.num_batches_tracked": torch.tensor(0)}
    flat = trainer.layout.flatten_module(model)
    for r in range(2):
        result = trainer.train(flat, r)
        assert result.steps == 3
    assert int(trainer.local["1.num_batches_tracked"]) == 6
    # The counters stay out of the flat vector.
    assert result.flat.numel() == trainer.layout.numel


def test_local_steps_and_epochs_set_the_number_of_steps():
    x, y = blobs(45)
    model = model_for("mlp")
    flat = StateLayout.from_module(model).flatten_module(model)
    steps = LocalTrainer(model, x, y, TrainConfig(local_steps=7), seed=0, node_index=0)
    assert steps.train(flat, 0).steps == 7
    epochs = LocalTrainer(model, x, y, TrainConfig(local_epochs=2), seed=0, node_index=0)
    result = epochs.train(flat, 0)
    assert (result.steps, result.samples) == (6, 90)


def test_node_without_data_returns_its_start_and_nan_loss():
    model = model_for("mlp")
    flat = StateLayout.from_module(model).flatten_module(model)
    trainer = LocalTrainer(
        model, torch.empty(0, 1, 8, 8), torch.empty(0, dtype=torch.long), TrainConfig(),
        seed=0, node_index=0,
    )
    result = trainer.train(flat, 0)
    assert torch.equal(result.flat, flat)
    assert math.isnan(result.loss) and result.steps == 0 and result.samples == 0


def test_mismatched_data_and_labels_are_rejected():
    with pytest.raises(ValueError):
        LocalTrainer(model_for(), torch.zeros(5, 1, 8, 8), torch.zeros(4, dtype=torch.long),
                     TrainConfig(), seed=0, node_index=0)


# ------------------------------------------------------------------------------ evaluate


def identity_classifier() -> tuple[nn.Module, torch.Tensor]:
    """A 2-class model whose logits are the two input values."""
    linear = nn.Linear(2, 2)
    model = nn.Sequential(nn.Flatten(), linear)
    with torch.no_grad():
        linear.weight.copy_(torch.eye(2))
        linear.bias.zero_()
    return model, StateLayout.from_module(model).flatten_module(model)


def test_evaluate_reports_accuracy_and_mean_cross_entropy():
    model, flat = identity_classifier()
    x = torch.tensor([[3.0, 0.0], [0.0, 2.0], [1.0, 0.0], [0.0, 5.0]]).view(4, 1, 1, 2)
    y = torch.tensor([0, 1, 1, 0])  # the last two are wrong
    acc, loss = evaluate(model, flat, x, y)
    assert acc == 0.5
    expected = F.cross_entropy(x.view(4, 2), y).item()
    assert loss == pytest.approx(expected, rel=1e-6)
    # Batching does not change the result.
    acc3, loss3 = evaluate(model, flat, x, y, batch_size=3)
    assert acc3 == acc and loss3 == pytest.approx(loss, rel=1e-6)
    assert evaluate(model, flat, x[:2], y[:2])[0] == 1.0


def test_evaluate_loads_the_given_vector_and_uses_eval_mode():
    x, y = blobs(40)
    model = model_for()
    layout = StateLayout.from_module(model)
    flat = layout.flatten_module(model)
    model.train()
    before = evaluate(model, flat, x, y)
    assert model.training  # the mode is restored
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    assert evaluate(model, flat, x, y) == before  # the vector, not the module's weights
    # Eval mode: running statistics, so the result does not depend on the batch split.
    acc, loss = evaluate(model, flat, x, y, batch_size=7)
    assert acc == before[0] and loss == pytest.approx(before[1], rel=1e-5)


def test_evaluate_rejects_an_empty_test_set():
    model, flat = identity_classifier()
    with pytest.raises(ValueError):
        evaluate(model, flat, torch.empty(0, 1, 1, 2), torch.empty(0, dtype=torch.long))


# ------------------------------------------------------------------------------ pick_device


def test_pick_device():
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device(" CPU ") == torch.device("cpu")
    assert pick_device("auto").type in ("cpu", "cuda", "mps")
    for bad in ("gpu", "tpu:0", ""):
        with pytest.raises(ConfigError) as err:
            pick_device(bad)
        assert err.value.field == "device"


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_pick_device_rejects_unavailable_cuda():
    for pref in ("cuda", "cuda:1"):
        with pytest.raises(ConfigError) as err:
            pick_device(pref)
        assert err.value.field == "device"
