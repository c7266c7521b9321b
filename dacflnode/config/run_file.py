"""Run settings from a YAML file (``--config FILE``): :func:`load_yaml_config`, and the
document itself (:func:`read_yaml_file`) for commands that read other keys beside them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dacflnode.config.reader import read_yaml
from dacflnode.config.run import RunConfig, config_from_mapping
from dacflnode.errors import ConfigError

__all__ = ["load_yaml_config", "read_yaml_file"]


def read_yaml_file(path: str | Path) -> Any:
    """The YAML document in ``path`` (``{}`` when empty); :class:`ConfigError` (field
    ``config``) naming the file when it cannot be read or parsed."""
    data = read_yaml(path, "config")[1]
    return {} if data is None else data


def load_yaml_config(path: str | Path) -> RunConfig:
    """Read a run configuration; a top-level ``run:`` section is accepted too."""
    data: Any = read_yaml_file(path)
    prefix = ""
    if isinstance(data, dict) and isinstance(data.get("run"), dict) and len(data) == 1:
        data, prefix = data["run"], "run."
    if not isinstance(data, dict):
        raise ConfigError("config", f"{path} must hold a mapping of option: value")
    try:
        return config_from_mapping(data)
    except ConfigError as exc:
        raise ConfigError(f"{prefix}{exc.field}", f"in {path}: {exc.message}") from None
