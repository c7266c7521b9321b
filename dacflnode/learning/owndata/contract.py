"""The run's data contract: what every node's data must agree on, whatever files it comes from.

A contract is the form of the data (``folder``, ``table`` or ``python``), the ordered class list
(labels map to their index in it by *name*), the shape of one sample and, for tables, the feature
names in column order. Two nodes train one model only when their contracts are equal; when they
are not, :meth:`DataContract.difference` says what differs in one line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from dacflnode.errors import ConfigError

FORMS = ("folder", "table", "python")
"""The forms of a device's own data."""


@dataclass(frozen=True)
class DataContract:
    """What every node's data agrees on.

    ``form``
        ``"folder"`` (class subfolders of images), ``"table"`` (CSV/Parquet) or ``"python"``
        (a ``package.module:function`` factory).
    ``classes``
        The run's class names, in the run's order: label ``i`` is ``classes[i]``.
    ``input_shape``
        One sample: ``(C, H, W)`` for images, ``(F,)`` for a table of ``F`` features (the
        tensors hold a table row as ``[1, 1, F]``, see :func:`model_input_shape`).
    ``feature_names``
        A table's feature columns, in file order; ``()`` otherwise.
    """

    form: str
    classes: tuple[str, ...]
    input_shape: tuple[int, ...]
    feature_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise ValueError(f"unknown data kind {self.form!r} (choose from {', '.join(FORMS)})")
        object.__setattr__(self, "classes", tuple(str(c) for c in self.classes))
        object.__setattr__(self, "input_shape", tuple(int(s) for s in self.input_shape))
        object.__setattr__(self, "feature_names", tuple(str(f) for f in self.feature_names))
        if not self.classes:
            raise ValueError("a data contract needs at least one class")
        if len(set(self.classes)) != len(self.classes):
            raise ValueError(f"class names repeat: {list(self.classes)}")
        if not self.input_shape or any(s < 1 for s in self.input_shape):
            raise ValueError(f"input shape must be positive, got {self.input_shape}")

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able fields (lists for tuples)."""
        return {
            "kind": self.form,
            "classes": list(self.classes),
            "input_shape": list(self.input_shape),
            "feature_names": list(self.feature_names),
        }

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no spaces. Equal contracts give equal strings, so it can
        go into a handshake or a fingerprint as is."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> DataContract:
        """Parse :meth:`to_json`'s output; raises :class:`ValueError` on anything else."""
        try:
            raw = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"data contract is not JSON: {err}") from err
        if not isinstance(raw, dict):
            raise ValueError("data contract must be a JSON object")
        expected = {"kind", "classes", "input_shape", "feature_names"}
        if set(raw) != expected:
            raise ValueError(
                f"data contract has keys {sorted(raw)}, expected {sorted(expected)}"
            )
        form, classes, shape, features = (
            raw["kind"], raw["classes"], raw["input_shape"], raw["feature_names"]
        )
        if not isinstance(form, str):
            raise ValueError("data contract: kind must be a string")
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise ValueError("data contract: classes must be a list of strings")
        if not isinstance(shape, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in shape
        ):
            raise ValueError("data contract: input_shape must be a list of integers")
        if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
            raise ValueError("data contract: feature_names must be a list of strings")
        return cls(form, tuple(classes), tuple(shape), tuple(features))

    def difference(self, other: DataContract, other_name: str = "the peer") -> str | None:
        """``None`` when equal, else one line naming the first thing that differs, e.g.
        ``node-3 has classes ['a', 'b'], this run ['a', 'b', 'c']``."""
        for what, mine, theirs in (
            ("data kind", self.form, other.form),
            ("classes", list(self.classes), list(other.classes)),
            ("input shape", _shape(self.input_shape), _shape(other.input_shape)),
            ("feature names", list(self.feature_names), list(other.feature_names)),
        ):
            if mine != theirs:
                return f"{other_name} has {what} {theirs}, this run {mine}"
        return None


def class_labels(classes: Sequence[str], found: Iterable[str],
                 refusal: Callable[[str], str]) -> dict[str, int]:
    """The label of each class name: its index in the run's ``classes``. A name in ``found``
    (the class names the files hold) that is not one of them is refused with a
    :class:`ConfigError` on ``classes``, whose text ``refusal(name)`` writes."""
    labels = {name: i for i, name in enumerate(classes)}
    for name in found:
        if name not in labels:
            raise ConfigError("classes", refusal(name))
    return labels


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(str(s) for s in shape)


def model_input_shape(input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """The ``(C, H, W)`` the model layer builds for: images as they are, a table's ``(F,)`` as
    ``(1, 1, F)`` (the layout :class:`~dacflnode.learning.owndata.LocalData` holds rows in)."""
    if len(input_shape) == 3:
        c, h, w = input_shape
        return (int(c), int(h), int(w))
    if len(input_shape) == 1:
        return (1, 1, int(input_shape[0]))
    raise ValueError(f"input shape must be (C, H, W) or (F,), got {input_shape}")
