"""The ``precision`` setting of local training: fp32 (the default, unchanged) and bf16 autocast."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dacflnode.config import RunConfig
from dacflnode.config.run import config_from_mapping
from dacflnode.errors import ConfigError
from dacflnode.learning.layout import StateLayout
from dacflnode.learning.train import (
    LocalTrainer,
    TrainConfig,
    autocast_dtype,
    batch_plan,
    evaluate,
)
from tests.learning.test_train import blobs, model_for

# ------------------------------------------------------------------------------ the setting


def test_precision_defaults_to_fp32_everywhere():
    assert TrainConfig().precision == "fp32"
    assert RunConfig().precision == "fp32"
    assert RunConfig().train_config().precision == "fp32"


def test_the_run_setting_reaches_the_train_config():
    run = config_from_mapping({"precision": "bf16", "dataset": "synthetic"})
    assert run.precision == "bf16"
    assert run.train_config().precision == "bf16"


@pytest.mark.parametrize("value", ["fp16", "BF16", "float32", ""])
def test_an_unknown_precision_is_refused_naming_the_setting(value):
    with pytest.raises(ConfigError) as err:
        TrainConfig(precision=value)
    assert err.value.field == "precision"
    with pytest.raises(ConfigError) as err:
        config_from_mapping({"precision": value}).validate()
    assert err.value.field == "precision"


def test_fp32_needs_no_autocast_and_bf16_on_the_cpu_autocasts_to_bfloat16():
    assert autocast_dtype("fp32", torch.device("cpu")) is None
    assert autocast_dtype("bf16", torch.device("cpu")) is torch.bfloat16


@pytest.mark.skipif(
    getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available(),
    reason="this machine has MPS",
)
def test_bf16_on_an_mps_device_that_cannot_compute_it_is_refused_with_what_to_do():
    with pytest.raises(ConfigError) as err:
        autocast_dtype("bf16", torch.device("mps"))
    assert err.value.field == "precision"
    assert "--precision fp32" in err.value.message


def test_bf16_on_a_gpu_without_bfloat16_is_refused_with_what_to_do(monkeypatch):
    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda kind: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    with pytest.raises(ConfigError) as err:
        autocast_dtype("bf16", torch.device("cuda"))
    assert err.value.field == "precision"
    assert "Tesla T4" in err.value.message and "--precision fp32" in err.value.message


def test_a_trainer_refuses_bf16_where_the_device_cannot(monkeypatch):
    def refuse(precision, device):
        raise ConfigError("precision", "no bfloat16 here; use --precision fp32")

    monkeypatch.setattr("dacflnode.learning.train.autocast_dtype", refuse)
    x, y = blobs(20)
    with pytest.raises(ConfigError):
        LocalTrainer(model_for(), x, y, TrainConfig(precision="bf16"), seed=0, node_index=0)


# ------------------------------------------------------------------------------ training


def test_fp32_trains_exactly_like_a_plain_float32_sgd_loop():
    x, y = blobs(60)
    cfg = TrainConfig(lr=0.05, batch_size=10)
    model = model_for()
    start = StateLayout.from_module(model).flatten_module(model)
    got = LocalTrainer(copy.deepcopy(model), x, y, cfg, seed=3, node_index=1).train(start, 0)

    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(ref.parameters(), lr=cfg.lr)
    for idx in batch_plan(60, cfg, 3, 1, 0):
        opt.zero_grad()
        F.cross_entropy(ref(x[idx]), y[idx]).backward()
        opt.step()
    assert torch.equal(got.flat, StateLayout.from_module(ref).flatten_module(ref))


@pytest.mark.parametrize("name", ["tiny-cnn", "fmnist-cnn", "mlp"])
def test_bf16_training_lowers_the_loss_and_keeps_float32_states(name):
    x, y = blobs(200)
    model = model_for(name)
    layout = StateLayout.from_module(model)
    trainer = LocalTrainer(
        model, x, y, TrainConfig(lr=0.05, batch_size=20, precision="bf16"), seed=0, node_index=0
    )
    flat = layout.flatten_module(model)
    losses = []
    for r in range(4):
        result = trainer.train(flat, r)
        assert result.flat.dtype == torch.float32 and result.flat.shape == flat.shape
        assert torch.isfinite(result.flat).all()
        losses.append(result.loss)
        flat = result.flat
    assert losses[-1] < 0.5 * losses[0]
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())


def test_bf16_runs_the_layers_in_bfloat16_and_fp32_in_float32():
    x, y = blobs(40)
    seen: dict[str, torch.dtype] = {}
    for precision in ("fp32", "bf16"):
        model = model_for("fmnist-cnn")
        conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
        conv.register_forward_hook(lambda m, i, out, p=precision: seen.__setitem__(p, out.dtype))
        trainer = LocalTrainer(model, x, y, TrainConfig(precision=precision), seed=0, node_index=0)
        trainer.train(StateLayout.from_module(model).flatten_module(model), 0)
    assert seen == {"fp32": torch.float32, "bf16": torch.bfloat16}


def test_bf16_and_fp32_training_end_close_together():
    """bf16 keeps 8 significant bits: the two runs differ by rounding, not by what they learn."""
    x, y = blobs(200)
    model = model_for()
    start = StateLayout.from_module(model).flatten_module(model)
    results = {}
    for precision in ("fp32", "bf16"):
        cfg = TrainConfig(lr=0.05, batch_size=20, precision=precision)
        trainer = LocalTrainer(copy.deepcopy(model), x, y, cfg, seed=0, node_index=0)
        results[precision] = trainer.train(start, 0)
    moved = (results["fp32"].flat - start).norm()
    assert (results["bf16"].flat - results["fp32"].flat).norm() < 0.1 * moved
    assert results["bf16"].loss == pytest.approx(results["fp32"].loss, rel=0.02)


def test_bf16_evaluation_agrees_with_fp32_evaluation():
    x, y = blobs(400)
    model = model_for("fmnist-cnn")
    trainer = LocalTrainer(model, x, y, TrainConfig(lr=0.05), seed=0, node_index=0)
    flat = trainer.train(StateLayout.from_module(model).flatten_module(model), 0).flat
    test_x, test_y = blobs(500, seed=1)
    acc32, loss32 = evaluate(copy.deepcopy(model), flat, test_x, test_y, local=trainer.local)
    acc16, loss16 = evaluate(
        copy.deepcopy(model), flat, test_x, test_y, local=trainer.local, precision="bf16"
    )
    assert acc16 == pytest.approx(acc32, abs=0.01)
    assert loss16 == pytest.approx(loss32, rel=0.05)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_trainer_evaluates_at_its_own_precision_with_its_own_buffers(precision):
    x, y = blobs(200)
    model = model_for()
    cfg = TrainConfig(lr=0.05, batch_size=20, precision=precision)
    trainer = LocalTrainer(copy.deepcopy(model), x, y, cfg, seed=0, node_index=0)
    flat = trainer.train(StateLayout.from_module(model).flatten_module(model), 0).flat
    test_x, test_y = blobs(300, seed=1)
    expected = evaluate(copy.deepcopy(model), flat, test_x, test_y, local=trainer.local,
                        precision=precision)
    other = evaluate(copy.deepcopy(model), flat, test_x, test_y, local=trainer.local,
                     precision="bf16" if precision == "fp32" else "fp32")
    assert expected != other  # the precision shows in the loss's bits
    assert trainer.evaluate(flat, test_x, test_y) == expected
