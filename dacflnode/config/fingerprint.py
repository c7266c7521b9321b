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


def fingerprint_data(
    run: RunConfig, daemon: DaemonSettings, contract: str | None = None
) -> dict[str, Any]:
    """The run-scoped, relevant settings of ``run`` and ``daemon`` by name.

    ``contract``: the data contract of own data (canonical JSON, see
    :class:`~dacflnode.learning.owndata.contract.DataContract`), known once the node has read
    its data (a table's feature names come from its files). It replaces the data set's name:
    the contract (classes, input shape, feature names) is what the nodes must agree on."""
    data = dict(schema.run_scoped(run))
    data.update(schema.run_scoped(daemon))
    if contract:
        data["dataset"] = json.loads(contract)
    return data


def run_fingerprint(
    run: RunConfig, daemon: DaemonSettings, contract: str | None = None
) -> str:
    """SHA-256 (hex) of :func:`fingerprint_data` as canonical JSON."""
    text = json.dumps(fingerprint_data(run, daemon, contract), sort_keys=True,
                      separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
