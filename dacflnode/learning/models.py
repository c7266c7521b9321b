"""The networks the nodes train.

Built-in models (all plain :class:`torch.nn.Sequential` stacks of ``Conv2d``, ``BatchNorm2d``,
``ReLU``, ``MaxPool2d``, ``Flatten`` and ``Linear``, so that the batched simulation engine,
:mod:`dacflnode.sim.batched`, can train N copies of them as one stacked model):

``fmnist-cnn``
    The paper's CNN for MNIST and Fashion-MNIST: the FedAvg CNN (two 5×5 convolutions with 32 and
    64 channels, each followed by 2×2 max pooling, a 512-unit fully connected layer and the
    output layer) with batch normalisation after each convolution. About 1.66 M parameters for
    28×28 inputs. The softmax is part of the cross-entropy loss.
``cifar-cnn``
    The FedAvg / TensorFlow-tutorial CNN for CIFAR-10: two unpadded 5×5 convolutions (32, 64
    channels) with batch normalisation and 2×2 max pooling, then fully connected layers of 384
    and 192 units and the output layer.
``mlp``
    One hidden layer of 64 units; the default for the synthetic data, whose classes are noisy
    per-pixel prototypes with no spatial structure for a convolution to use.
``tiny-cnn``
    A 4-channel 3×3 convolution with batch normalisation, 2×2 max pooling and a 32-unit hidden
    layer: the smallest model with batch-norm statistics, for tests.

Any other architecture can be named as ``"package.module:ClassName"``; it is instantiated as
``ClassName(input_shape=..., num_classes=...)``, leaving out whichever of the two keywords its
constructor does not take (so ``ClassName()`` when it takes neither).

Parameter initialisation is PyTorch's default and draws from the global RNG, so a caller that
seeds with :func:`torch.manual_seed` right before :func:`build_model` gets the same weights
every time.
"""

from __future__ import annotations

import importlib
import inspect

from torch import nn

from dacflnode.errors import ConfigError

MODELS = ("fmnist-cnn", "cifar-cnn", "mlp", "tiny-cnn")

_DEFAULT_MODEL = {
    "fashion-mnist": "fmnist-cnn",
    "mnist": "fmnist-cnn",
    "cifar10": "cifar-cnn",
    "synthetic": "mlp",
}


def default_model_for(dataset: str) -> str:
    """The built-in model the paper (or, for ``synthetic``, this project) uses for ``dataset``."""
    key = dataset.strip().lower()
    if key not in _DEFAULT_MODEL:
        raise ConfigError(
            "dataset",
            f"no default model for dataset {dataset!r} (known: {', '.join(_DEFAULT_MODEL)})",
        )
    return _DEFAULT_MODEL[key]


def default_model_for_shape(input_shape: tuple[int, ...]) -> str:
    """The built-in model for a device's own data of ``(C, H, W)`` samples, or a table's
    ``(F,)``: a table's rows (``(F,)`` or ``(1, 1, F)``) train ``mlp``; colour images of 16x16
    or more the ``cifar-cnn``; other images of 4x4 or more the paper's ``fmnist-cnn`` (1x28x28
    folders: the paper's FMNIST model); anything smaller ``mlp``."""
    if len(input_shape) == 1:
        return "mlp"
    c, h, w = (int(s) for s in input_shape)
    if h == 1 or min(h, w) < 4:
        return "mlp"
    if c == 3 and min(h, w) >= 16:
        return "cifar-cnn"
    return "fmnist-cnn"


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Build model ``name`` (one of :data:`MODELS` or ``"package.module:ClassName"``).

    ``input_shape`` is ``(C, H, W)`` of one sample, or a table's ``(F,)``, built as
    ``(1, 1, F)`` (the layout own-data tables are held in). Raises :class:`ConfigError` (field
    ``model``) for an unknown name, a class that cannot be imported or instantiated, or an input
    shape the architecture cannot take.
    """
    if len(input_shape) == 1:
        input_shape = (1, 1, int(input_shape[0]))
    if len(input_shape) != 3 or any(int(s) <= 0 for s in input_shape):
        raise ConfigError(
            "model",
            f"input shape must be (C, H, W) or (F,) > 0, got {input_shape!r}",
        )
    if num_classes < 1:
        raise ConfigError("model", f"num_classes must be at least 1, got {num_classes}")
    c, h, w = (int(s) for s in input_shape)
    key = name.strip()
    if ":" in key:
        return _import_model(key, (c, h, w), num_classes)
    key = key.lower()
    if key == "fmnist-cnn":
        return _fmnist_cnn(c, h, w, num_classes)
    if key == "cifar-cnn":
        return _cifar_cnn(c, h, w, num_classes)
    if key == "mlp":
        return nn.Sequential(
            nn.Flatten(), nn.Linear(c * h * w, 64), nn.ReLU(), nn.Linear(64, num_classes)
        )
    if key == "tiny-cnn":
        return _tiny_cnn(c, h, w, num_classes)
    raise ConfigError(
        "model",
        f"unknown model {name!r} (choose from {', '.join(MODELS)}, "
        "or give a class as package.module:ClassName)",
    )


def _conv_pool(size: int, kernel: int, padding: int, what: str) -> int:
    """Spatial size after a stride-1 convolution and a 2×2 max pooling."""
    out = (size + 2 * padding - kernel + 1) // 2
    if out < 1:
        raise ConfigError("model", f"input too small for {what}")
    return out


def _fmnist_cnn(c: int, h: int, w: int, num_classes: int) -> nn.Sequential:
    what = "fmnist-cnn"
    fh = _conv_pool(_conv_pool(h, 5, 2, what), 5, 2, what)
    fw = _conv_pool(_conv_pool(w, 5, 2, what), 5, 2, what)
    return nn.Sequential(
        nn.Conv2d(c, 32, 5, padding=2),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * fh * fw, 512),
        nn.ReLU(),
        nn.Linear(512, num_classes),
    )


def _cifar_cnn(c: int, h: int, w: int, num_classes: int) -> nn.Sequential:
    what = "cifar-cnn (needs at least 16x16 inputs)"
    fh = _conv_pool(_conv_pool(h, 5, 0, what), 5, 0, what)
    fw = _conv_pool(_conv_pool(w, 5, 0, what), 5, 0, what)
    return nn.Sequential(
        nn.Conv2d(c, 32, 5),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * fh * fw, 384),
        nn.ReLU(),
        nn.Linear(384, 192),
        nn.ReLU(),
        nn.Linear(192, num_classes),
    )


def _tiny_cnn(c: int, h: int, w: int, num_classes: int) -> nn.Sequential:
    what = "tiny-cnn"
    return nn.Sequential(
        nn.Conv2d(c, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(4 * _conv_pool(h, 3, 1, what) * _conv_pool(w, 3, 1, what), 32),
        nn.ReLU(),
        nn.Linear(32, num_classes),
    )


def _import_model(spec: str, input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise ConfigError("model", f"expected package.module:ClassName, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or anything the module raises while importing
        raise ConfigError("model", f"cannot import {module_name!r}: {exc}") from exc
    cls = module
    for part in class_name.split("."):
        if not hasattr(cls, part):
            raise ConfigError("model", f"{module_name!r} has no attribute {class_name!r}")
        cls = getattr(cls, part)
    if not callable(cls):
        raise ConfigError("model", f"{spec!r} is not a class or factory")
    offered = {"input_shape": input_shape, "num_classes": num_classes}
    try:
        model = cls(**{k: v for k, v in offered.items() if k in _keywords(cls, offered)})
    except Exception as exc:
        raise ConfigError("model", f"cannot instantiate {spec!r}: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise ConfigError("model", f"{spec!r} returned {type(model).__name__}, not an nn.Module")
    return model


def _keywords(factory: object, offered: dict[str, object]) -> set[str]:
    """Which of the ``offered`` keyword arguments ``factory`` accepts."""
    try:
        params = list(inspect.signature(factory).parameters.values())  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return set(offered)  # no introspectable signature: offer everything, errors are reported
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return set(offered)
    return {
        p.name
        for p in params
        if p.name in offered
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
