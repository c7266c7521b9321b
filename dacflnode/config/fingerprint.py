"""The handshake's run fingerprint, derived from the settings' declared scopes.

Every run-scoped setting (:class:`~dacflnode.config.schema.Scope`) that is relevant to the run is
hashed, with its effective value (an unset ``lr`` as the data set's default, the model as
resolved); node-local ones never are. Because the set is read from the declarations, a new
setting joins the check by being declared, and cannot be forgotten: an undeclared field fails
when its class is defined.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from dacflnode.config import schema
from dacflnode.config.daemon import DaemonSettings
from dacflnode.config.run import RunConfig


def fingerprint_data(run: RunConfig, daemon: DaemonSettings) -> dict[str, Any]:
    """The run-scoped, relevant settings of ``run`` and ``daemon`` by name."""
    data = dict(schema.run_scoped(run))
    data.update(schema.run_scoped(daemon))
    return data


def run_fingerprint(run: RunConfig, daemon: DaemonSettings) -> str:
    """SHA-256 (hex) of :func:`fingerprint_data` as canonical JSON."""
    text = json.dumps(fingerprint_data(run, daemon), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
