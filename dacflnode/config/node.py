"""The keys of a peers file's ``node:`` section (:class:`NodeSettings`): who this node is, where
it listens and how it is protected.

They are declared as every other setting is (:mod:`dacflnode.config.schema`), read with
:func:`~dacflnode.config.schema.from_mapping` (``exact``: a YAML file's own types, no
conversions) and listed in ``docs/configuration.md``. A value here is as the file writes it:
:mod:`dacflnode.peers.file` resolves it (addresses, paths relative to the file, defaults that
depend on other keys) and checks what needs the file and the network (exposure, distinct
ports). Besides these keys, ``node:`` may hold a device's data keys of the run settings
(:data:`NODE_DATA_KEYS`), read exactly as under ``run:``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dacflnode.config import schema
from dacflnode.config.schema import Scope, setting

#: Node-scope run settings about this device's data, which ``node:`` may hold too (each device
#: points at its own files).
NODE_DATA_KEYS = ("data_root", "test_root", "bad_files")


@schema.declared
@dataclass(frozen=True)
class TlsSettings:
    """``node.tls``: the files of mutual TLS with the neighbours (``dacflnode certs``)."""

    ca: str | None = setting(
        None, help="The CA certificate that signed every node's certificate (required).",
        scope=Scope.NODE, cli=False, default_text="required",
    )
    cert: str | None = setting(
        None, help="This node's certificate, issued for its node id (required).",
        scope=Scope.NODE, cli=False, default_text="required",
    )
    key: str | None = setting(
        None, help="This node's private key (required; readable by its user only).",
        scope=Scope.NODE, cli=False, default_text="required",
    )


@schema.declared
@dataclass(frozen=True)
class NodeSettings:
    """Who this node is and where it listens (a peers file's ``node:`` section)."""

    id: str | None = setting(
        None, help="This node's id: 1-128 letters, digits, '.', '_' or '-' (required).",
        scope=Scope.NODE, cli=False, default_text="required",
    )
    listen: str | None = setting(
        None, help="host:port of the Neighbor service, which the neighbours connect to"
        " (required). Beyond loopback it needs tls or insecure: true.",
        scope=Scope.NODE, cli=False, default_text="required",
    )
    control: str | None = setting(
        None, help="host:port of the Control service (status, metrics, stop). Beyond loopback"
        " it needs tls and control_token.",
        scope=Scope.NODE, cli=False, default_text="127.0.0.1:<listen port + 1000>",
    )
    metrics: str | None = setting(
        None, help="host:port of the Prometheus /metrics endpoint over HTTP"
        " (docs/operations.md). Beyond loopback it needs metrics_token or metrics_token_file.",
        scope=Scope.NODE, cli=False, default_text="not served",
    )
    health: str | None = setting(
        None, help="host:port of a plaintext port serving only grpc.health.v1, for probes that"
        " cannot present a client certificate.",
        scope=Scope.NODE, cli=False, default_text="none",
    )
    state_dir: str | None = setting(
        None, help="Folder of the node's checkpoints, metrics and final model (relative to the"
        " peers file).",
        scope=Scope.NODE, cli=False, default_text="<folder of the peers file>/<id>",
    )
    share: int | None = setting(
        None, help="Which data partition this node trains on.",
        scope=Scope.NODE, cli=False, minimum=0,
        default_text="the position of id in run.members (required without run.members)",
    )
    tls: TlsSettings | None = setting(
        None, help="Mutual TLS with the neighbours: {ca, cert, key} (paths relative to the"
        " peers file; see dacflnode certs and docs/security.md).",
        scope=Scope.NODE, cli=False, default_text="plaintext",
    )
    insecure: bool = setting(
        False, help="Allow plaintext on a listen address other hosts can reach.",
        scope=Scope.NODE, cli=False,
    )
    control_token: str | None = setting(
        None, help="The secret a Control client must present (at least 16 printable ASCII"
        " characters); required with a control address beyond loopback.",
        scope=Scope.NODE, cli=False,
        default_text="a new token in STATE_DIR/control.token at every start",
    )
    metrics_token: str | None = setting(
        None, help="The bearer token a scraper of metrics must present (at least 16 printable"
        " ASCII characters).",
        scope=Scope.NODE, cli=False,
    )
    metrics_token_file: str | None = setting(
        None, help="A file holding metrics_token instead (not readable by other users), read"
        " when the daemon starts.",
        scope=Scope.NODE, cli=False,
    )
