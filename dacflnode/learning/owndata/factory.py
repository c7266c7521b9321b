"""Python sources: ``package.module:function`` returns the device's train and test data.

The escape hatch, as ``--model package.module:Class`` is for models. The function is called with
whichever of the keywords ``classes`` (the run's class names), ``seed``, ``data_root`` and
``test_root`` (this device's paths, or ``None``) it accepts, and must
return ``(train, test)`` where each is a map-style ``torch.utils.data.Dataset`` of ``(x, label)``
items or an ``(x, y)`` pair of tensors; ``test`` may be ``None`` (the held-out fraction is then
used). ``x`` is float, one sample ``[C, H, W]`` (an image) or ``[F]`` (features), already
normalised as the run wants: the function owns its preprocessing. Labels are integer indices into
the run's ``classes``.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Sequence
from typing import Any

import torch

from dacflnode.errors import ConfigError

FIELD = "data_factory"

MAX_SAMPLE_NUMEL = 1 << 24
"""Largest sample (elements) a factory's data set may hold: refused before stacking."""


def resolve(spec: str) -> Any:
    """The callable ``package.module:function`` names."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(FIELD, f"a python source is package.module:function, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:
        raise ConfigError(FIELD, f"cannot import {module_name!r} for the data factory {spec!r}: "
                                 f"{err}") from err
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ConfigError(FIELD, f"{module_name!r} has no attribute {attr!r} (data factory "
                                     f"{spec!r})")
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(FIELD, f"data factory {spec!r} is not callable")
    return target


def _accepted(fn: Any, offered: dict[str, Any]) -> dict[str, Any]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return dict(offered)
    names = {p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                  inspect.Parameter.KEYWORD_ONLY)}
    return {k: v for k, v in offered.items() if k in names}


def call_factory(
    spec: str, classes: Sequence[str], seed: int, roots: dict[str, str | None] | None = None
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor] | None]:
    """Call the factory and check what it returns: ``((train_x, train_y), (test_x, test_y) or
    None)`` with ``x`` float32 ``[n, *sample]`` and ``y`` int64 ``[n]`` in ``0..len(classes)-1``.
    """
    fn = resolve(spec)
    try:
        offered: dict[str, Any] = {"classes": list(classes), "seed": seed, **(roots or {})}
        result = fn(**_accepted(fn, offered))
    except Exception as err:
        raise ConfigError(FIELD, f"data factory {spec!r} raised {type(err).__name__}: "
                                 f"{str(err)[:200]}") from err
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise ConfigError(FIELD, f"data factory {spec!r} returned {type(result).__name__}; it "
                                 "must return (train, test), each a torch Dataset or an (x, y) "
                                 "pair of tensors (test may be None)")
    train = _as_tensors(spec, "train", result[0], len(classes))
    test = None if result[1] is None else _as_tensors(spec, "test", result[1], len(classes))
    if train is None:
        raise ConfigError(FIELD, f"data factory {spec!r} returned no train data")
    if test is not None and test[0].shape[1:] != train[0].shape[1:]:
        raise ConfigError(FIELD, f"data factory {spec!r}: test samples are "
                                 f"{tuple(test[0].shape[1:])} but train samples "
                                 f"{tuple(train[0].shape[1:])}")
    return train, test


def _as_tensors(spec: str, split: str, data: Any,
                num_classes: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    where = f"data factory {spec!r}, {split}"
    if data is None:
        return None
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(
        isinstance(t, torch.Tensor) for t in data
    ):
        x, y = data
    elif isinstance(data, torch.utils.data.Dataset) and hasattr(data, "__len__"):
        x, y = _stack_dataset(where, data)
    else:
        raise ConfigError(FIELD, f"{where}: got {type(data).__name__}, expected a torch Dataset "
                                 "or an (x, y) pair of tensors")
    if x.ndim not in (2, 4):
        raise ConfigError(FIELD, f"{where}: x has shape {tuple(x.shape)}; expected [n, C, H, W] "
                                 "images or [n, F] features")
    if not (x.is_floating_point() or x.dtype == torch.uint8):
        raise ConfigError(FIELD, f"{where}: x is {x.dtype}; expected floats")
    if y.ndim != 1 or y.shape[0] != x.shape[0]:
        raise ConfigError(FIELD, f"{where}: y has shape {tuple(y.shape)}, expected "
                                 f"[{x.shape[0]}] (one label per sample)")
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise ConfigError(FIELD, f"{where}: labels are {y.dtype}; expected integer class "
                                 "indices")
    if x.shape[0] == 0:
        raise ConfigError(FIELD, f"{where}: empty data set")
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ConfigError(FIELD, f"{where}: labels {int(y.min())}..{int(y.max())} outside "
                                 f"0..{num_classes - 1} (indices into classes)")
    x = x.detach().to(torch.float32).contiguous()
    if not torch.isfinite(x).all():
        raise ConfigError(FIELD, f"{where}: x holds inf or NaN")
    return x, y.detach().to(torch.int64).contiguous()


def _stack_dataset(where: str, data: Any) -> tuple[torch.Tensor, torch.Tensor]:
    n = len(data)
    if n == 0:
        raise ConfigError(FIELD, f"{where}: empty data set")
    xs: list[torch.Tensor] = []
    ys: list[int] = []
    for i in range(n):
        try:
            item = data[i]
        except Exception as err:
            raise ConfigError(FIELD, f"{where}: item {i} raised {type(err).__name__}: "
                                     f"{str(err)[:200]}") from err
        if not isinstance(item, (tuple, list)) or len(item) < 2:
            raise ConfigError(FIELD, f"{where}: item {i} is {type(item).__name__}, expected "
                                     "(x, label)")
        x, label = item[0], item[1]
        if not isinstance(x, torch.Tensor):
            raise ConfigError(FIELD, f"{where}: item {i}'s x is {type(x).__name__}, expected a "
                                     "tensor")
        if xs and x.shape != xs[0].shape:
            raise ConfigError(FIELD, f"{where}: item {i} has shape {tuple(x.shape)}, item 0 "
                                     f"{tuple(xs[0].shape)}; every sample must have one shape")
        if not xs and x.numel() > MAX_SAMPLE_NUMEL:
            raise ConfigError(FIELD, f"{where}: one sample has {x.numel()} values")
        try:
            ys.append(int(label))
        except (TypeError, ValueError, RuntimeError) as err:
            raise ConfigError(FIELD, f"{where}: item {i}'s label {label!r} is not an integer "
                                     "class index") from err
        xs.append(x)
    return torch.stack(xs), torch.tensor(ys, dtype=torch.int64)
