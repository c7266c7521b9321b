"""A device's own data in the run settings (``dataset: folder | table | python``,
``docs/data.md``): which data sets those are, what a node does with an undecodable image or a
table's missing cell, how a table's text columns are encoded (:func:`parse_categories`), and
the settings own data needs besides (:func:`check_own_data`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from dacflnode.errors import ConfigError

__all__ = [
    "BAD_FILES",
    "MISSING",
    "OTHER_CATEGORY",
    "OWN_DATA",
    "SCALINGS",
    "OwnDataSettings",
    "check_own_data",
    "is_own",
    "parse_categories",
]

#: The data sources a device brings itself (``docs/data.md``), beside the built-in data sets.
OWN_DATA = ("folder", "table", "python")

#: What a node does with an image file it cannot decode.
BAD_FILES = ("fail", "skip")

#: What a node does with a table's missing cell: refuse the table, leave the row out, or keep
#: the cell as NaN for the network's mean (docs/data.md, Tables).
MISSING = ("fail", "drop", "mean")

#: How a table's numeric features are put on one scale.
SCALINGS = ("standardize", "minmax", "none")

#: The category of ``other_category``: every value of a column its list does not name.
OTHER_CATEGORY = "<other>"


class OwnDataSettings(Protocol):
    """The settings of a :class:`~dacflnode.config.run.RunConfig` that own data reads (a
    protocol, so that this module, which ``run.py`` imports, imports nothing of it)."""

    @property
    def dataset(self) -> str: ...
    @property
    def classes(self) -> tuple[str, ...]: ...
    @property
    def label_column(self) -> str | None: ...
    @property
    def data_factory(self) -> str | None: ...
    @property
    def channels(self) -> int: ...
    @property
    def categories(self) -> Mapping[str, tuple[str, ...]] | None: ...


def is_own(run: OwnDataSettings) -> bool:
    """Whether each device of ``run`` brings its own data."""
    return run.dataset in OWN_DATA


def check_own_data(run: OwnDataSettings) -> None:
    """The settings own data needs: a class list, and what each source reads."""
    if not run.classes:
        raise ConfigError(
            "classes",
            f"dataset {run.dataset} needs the run's class list: classes: [a, b, ...]",
        )
    if len(set(run.classes)) != len(run.classes):
        dup = next(c for c in run.classes if run.classes.count(c) > 1)
        raise ConfigError("classes", f"'{dup}' is listed twice")
    if run.dataset == "table" and not run.label_column:
        raise ConfigError("label_column", "dataset table needs the name of its label column")
    if run.dataset == "table" and run.categories and run.label_column in run.categories:
        raise ConfigError("categories", f"lists the label column {run.label_column!r}, whose "
                          "values are the classes: remove it from categories")
    if run.dataset == "python":
        module, _, func = (run.data_factory or "").partition(":")
        if not module or not func:
            raise ConfigError(
                "data_factory",
                "dataset python needs data_factory: package.module:function, got"
                f" {run.data_factory!r}",
            )
    if run.dataset == "folder" and run.channels not in (1, 3):
        raise ConfigError("channels", f"must be 1 or 3, got {run.channels}")
    for key in ("data_root", "test_root"):
        value = getattr(run, key)
        if value is not None and not Path(value).exists():
            raise ConfigError(key, f"{value} does not exist")


def parse_categories(value: Any) -> dict[str, tuple[str, ...]] | None:
    """The ``categories`` setting from a YAML file or JSON: ``{column: [value, ...]}``, each
    value as text (a YAML ``1`` is the text ``"1"``), in the listed order; ``None`` for none.
    A :class:`ConfigError` on ``categories`` names what is wrong."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigError("categories", "expected a mapping of column: [value, ...], got "
                          f"{type(value).__name__}")
    out: dict[str, tuple[str, ...]] = {}
    for column, values in value.items():
        if not isinstance(column, str | int | float) or not str(column).strip():
            raise ConfigError("categories", f"a column name must be text, got {column!r}")
        name = str(column)
        if not isinstance(values, list | tuple) or not values:
            raise ConfigError("categories", f"{name}: expected a list of its values, e.g. "
                              f"{name}: [a, b, c], got {values!r}")
        items: list[str] = []
        for item in values:
            if isinstance(item, Mapping | list | tuple) or item is None:
                raise ConfigError("categories", f"{name}: a value must be text or a number, "
                                  f"got {item!r}")
            items.append(str(item))
        if len(set(items)) != len(items):
            dup = next(v for v in items if items.count(v) > 1)
            raise ConfigError("categories", f"{name}: value {dup!r} is listed twice")
        if OTHER_CATEGORY in items:
            raise ConfigError("categories", f"{name}: {OTHER_CATEGORY} is the bucket of "
                              "other_category: true, not a value to list")
        out[name] = tuple(items)
    return out or None
