"""Errors shared across the package."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is invalid.

    ``field`` names the offending option (as the user spells it in YAML or on the command line),
    so that the CLI can print a one-line error that points at what to change.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class MixingMatrixError(ValueError):
    """A mixing matrix is not symmetric, not doubly stochastic, or its graph is disconnected."""
