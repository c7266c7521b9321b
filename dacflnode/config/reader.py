"""Reading the YAML files a user writes: peers files, fault plans and ``--config`` files.

One reader, so that every file says the same when it cannot be read, is not YAML or holds a
value of the wrong shape: a :class:`~dacflnode.errors.ConfigError` whose ``field`` is the dotted
key (``node.listen``, ``faults[2].rounds``) and whose message names the file
(:class:`FileErrors`), and which describes a wrong value without echoing a whole mapping or
list (:func:`describe`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from dacflnode.errors import ConfigError


def read_yaml(path: str | Path, field: str) -> tuple[Path, Any]:
    """The absolute path of the file ``path`` and the YAML document in it (``None`` when it is
    empty); a :class:`ConfigError` for ``field`` naming the file when it cannot be read or is
    not YAML."""
    file = Path(path).expanduser().absolute()
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(field, f"cannot read {file}: {exc.strerror}") from exc
    try:
        return file, yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(field, f"in {file}: not valid YAML: {exc}") from exc


def file_error(field: str, file: Path, message: str) -> ConfigError:
    """A ConfigError for the dotted key ``field`` of the file ``file``."""
    return ConfigError(field, f"in {file}: {message}")


class FileErrors:
    """Makes the errors of one file's values: they name the file when there is one (``None``:
    the values were built in code)."""

    def __init__(self, file: Path | None) -> None:
        self.file = file

    def error(self, field: str, message: str) -> ConfigError:
        if self.file is None:
            return ConfigError(field, message)
        return file_error(field, self.file, message)

    def keys(
        self, value: Mapping[Any, Any], where: str, allowed: Iterable[str], prefix: str = ""
    ) -> dict[str, Any]:
        """The mapping ``value`` (at ``where``) with snake_case keys; an unknown key (with the
        nearest known one) or one given in both spellings is an error named ``prefix + key``."""
        allowed = tuple(allowed)
        out: dict[str, Any] = {}
        for raw_key, item in value.items():
            key = str(raw_key).replace("-", "_")
            field = f"{prefix}{raw_key}"
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                raise self.error(field, f"unknown key (expected one of {', '.join(allowed)}){hint}")
            if key in out:
                raise self.error(field, "given twice (snake_case and kebab-case)")
            out[key] = item
        return out


def describe(value: Any) -> str:
    """``value`` as an error message shows it: ``nothing``, ``a mapping``, ``a list of 2`` or
    its ``repr``."""
    if value is None:
        return "nothing"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return repr(value)


def type_name(value: Any) -> str:
    """The type of ``value``, never the value itself (for secrets)."""
    return "nothing" if value is None else type(value).__name__
