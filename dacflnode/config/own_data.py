"""A device's own data in the run settings (``dataset: folder | table | python``,
``docs/data.md``): which data sets those are, what a node does with an undecodable image, and
the settings own data needs besides (:func:`check_own_data`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from dacflnode.errors import ConfigError

__all__ = ["BAD_FILES", "OWN_DATA", "OwnDataSettings", "check_own_data", "is_own"]

#: The data sources a device brings itself (``docs/data.md``), beside the built-in data sets.
OWN_DATA = ("folder", "table", "python")

#: What a node does with an image file it cannot decode.
BAD_FILES = ("fail", "skip")


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
