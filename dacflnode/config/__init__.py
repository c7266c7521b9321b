"""Run settings shared by the simulator and the daemon, declared once.

:mod:`~dacflnode.config.schema` says how a setting is declared, :mod:`~dacflnode.config.run` and
:mod:`~dacflnode.config.daemon` declare them, :mod:`~dacflnode.config.run_checks` checks a run's
settings together (own data's in :mod:`~dacflnode.config.own_data`),
:mod:`~dacflnode.config.run_file` reads them from a YAML file,
:mod:`~dacflnode.config.fingerprint` derives the handshake fingerprint and
:mod:`~dacflnode.config.docs` writes ``docs/configuration.md``.
"""

from dacflnode.config.daemon import DAEMON_DEFAULTS, DaemonSettings, anchor_delay
from dacflnode.config.run import ENGINES, RunConfig, config_from_mapping
from dacflnode.config.run_file import load_yaml_config
from dacflnode.config.schema import Scope

__all__ = [
    "DAEMON_DEFAULTS",
    "ENGINES",
    "DaemonSettings",
    "RunConfig",
    "Scope",
    "anchor_delay",
    "config_from_mapping",
    "load_yaml_config",
]
