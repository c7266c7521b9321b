import sys
import textwrap

import pytest
import torch
from torch import nn

from dacflnode.errors import ConfigError
from dacflnode.learning.models import MODELS, build_model, default_model_for

SHAPES = {
    "fmnist-cnn": (1, 28, 28),
    "cifar-cnn": (3, 32, 32),
    "mlp": (1, 8, 8),
    "tiny-cnn": (1, 8, 8),
}


def sequential(name: str, shape: tuple[int, int, int], classes: int) -> nn.Sequential:
    """A built-in model, which is an ``nn.Sequential`` (the batched engine relies on it)."""
    model = build_model(name, shape, classes)
    assert isinstance(model, nn.Sequential)
    return model


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", MODELS)
def test_builtin_models_map_a_batch_to_class_scores(name):
    shape = SHAPES[name]
    model = build_model(name, shape, 10)
    assert isinstance(model, nn.Sequential)
    out = model(torch.randn(3, *shape))
    assert out.shape == (3, 10)
    assert build_model(name, shape, 7)(torch.randn(2, *shape)).shape == (2, 7)


@pytest.mark.parametrize("name", MODELS)
def test_builtin_models_use_only_layers_the_batched_engine_converts(name):
    allowed = (nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.MaxPool2d, nn.Flatten, nn.Linear)
    for layer in sequential(name, SHAPES[name], 10):
        assert type(layer) in allowed


def test_fmnist_cnn_is_the_papers_cnn_with_about_1_66_million_parameters():
    model = sequential("fmnist-cnn", (1, 28, 28), 10)
    assert n_params(model) == 1_663_562
    convs = [m for m in model if isinstance(m, nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size) for c in convs] == [
        (1, 32, (5, 5)),
        (32, 64, (5, 5)),
    ]
    linears = [m for m in model if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(64 * 7 * 7, 512), (512, 10)]
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model) == 2


def test_hidden_layer_sizes_follow_the_input_shape():
    cnn = sequential("fmnist-cnn", (3, 32, 32), 10)
    assert cnn(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert next(m for m in cnn if isinstance(m, nn.Linear)).in_features == 64 * 8 * 8
    cifar = sequential("cifar-cnn", (3, 32, 32), 10)
    assert [m.out_features for m in cifar if isinstance(m, nn.Linear)] == [384, 192, 10]
    assert next(m for m in cifar if isinstance(m, nn.Linear)).in_features == 64 * 5 * 5
    hidden = sequential("mlp", (2, 5, 5), 3)[1]
    assert isinstance(hidden, nn.Linear) and hidden.in_features == 50


def test_init_is_deterministic_under_a_seed():
    def weights(seed: int) -> list[torch.Tensor]:
        torch.manual_seed(seed)
        return list(build_model("fmnist-cnn", (1, 28, 28), 10).state_dict().values())

    a, b, c = weights(3), weights(3), weights(4)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))


def test_default_model_per_dataset():
    assert default_model_for("fashion-mnist") == "fmnist-cnn"
    assert default_model_for("mnist") == "fmnist-cnn"
    assert default_model_for("cifar10") == "cifar-cnn"
    assert default_model_for("synthetic") == "mlp"
    with pytest.raises(ConfigError) as err:
        default_model_for("imagenet")
    assert err.value.field == "dataset"


@pytest.fixture
def user_models(tmp_path, monkeypatch):
    (tmp_path / "my_models_for_test.py").write_text(
        textwrap.dedent(
            """
            from torch import nn

            class WithShape(nn.Module):
                def __init__(self, input_shape, num_classes):
                    super().__init__()
                    c, h, w = input_shape
                    self.net = nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, num_classes))

                def forward(self, x):
                    return self.net(x)

            class NoArgs(nn.Sequential):
                def __init__(self):
                    super().__init__(nn.Flatten(), nn.Linear(64, 10))

            class ClassesOnly(nn.Sequential):
                def __init__(self, num_classes=2):
                    super().__init__(nn.Flatten(), nn.Linear(64, num_classes))

            class NotAModule:
                pass

            class Broken(nn.Module):
                def __init__(self):
                    raise RuntimeError("boom")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_models_for_test"
    sys.modules.pop("my_models_for_test", None)


def test_module_class_spec_passes_shape_and_classes(user_models):
    model = build_model(f"{user_models}:WithShape", (1, 8, 8), 5)
    assert model(torch.randn(4, 1, 8, 8)).shape == (4, 5)


def test_module_class_spec_falls_back_to_what_the_constructor_takes(user_models):
    assert build_model(f"{user_models}:NoArgs", (1, 8, 8), 5)(torch.randn(2, 1, 8, 8)).shape == (
        2,
        10,
    )
    only = build_model(f"{user_models}:ClassesOnly", (1, 8, 8), 5)
    assert only(torch.randn(2, 1, 8, 8)).shape == (2, 5)


@pytest.mark.parametrize(
    "name",
    [
        "resnet-9000",
        "no_such_module_xyz:Model",
        "my_models_for_test:Missing",
        "my_models_for_test:NotAModule",
        "my_models_for_test:Broken",
        ":Model",
        "my_models_for_test:",
    ],
)
def test_bad_model_names_are_config_errors(user_models, name):
    with pytest.raises(ConfigError) as err:
        build_model(name, (1, 8, 8), 10)
    assert err.value.field == "model"


def test_inputs_too_small_for_the_architecture_are_config_errors():
    with pytest.raises(ConfigError):
        build_model("cifar-cnn", (3, 8, 8), 10)
    with pytest.raises(ConfigError):
        build_model("fmnist-cnn", (1, 28), 10)
