"""How a command reaches a node's Control service: the address, the token and the CA
(:func:`control_endpoint`), and the one-line failure a command exits with (:func:`fail`).

The Control service always wants a token. It comes from ``--token``, else the environment
variable ``DACFLNODE_CONTROL_TOKEN`` (:data:`TOKEN_ENV`), else ``node.control_token`` of
``--peers``, else the token file the node writes at every start, ``STATE_DIR/control.token`` of
``--peers`` (readable by the node's user only; :mod:`dacflnode.peers.control_token`); a control
address that is not loopback is reached over TLS, verified against the CA of the peers file's
``node.tls`` and the node id (or ``--ca`` and ``--server-name``). ``status``, ``metrics``,
``stop`` (:mod:`dacflnode.cli.daemon_cmds`) and ``invariant --live``
(:mod:`dacflnode.cli.invariant`) use it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

if TYPE_CHECKING:
    from dacflnode.transport.control_types import ControlAuth

__all__ = ["DEFAULT_CONTROL", "TOKEN_ENV", "control_endpoint", "fail", "is_loopback_address",
           "read_file"]

DEFAULT_CONTROL = "127.0.0.1:8000"
#: The environment variable the query commands read the control token from.
TOKEN_ENV = "DACFLNODE_CONTROL_TOKEN"


def is_loopback_address(address: str) -> bool:
    """Whether ``host:port`` ``address`` is on this host only."""
    from dacflnode.peers.addresses import is_loopback

    host = address.rpartition(":")[0].strip("[]")
    return is_loopback(host)


def control_endpoint(target: str | None, peers_file: str | None, token: str | None,
                     ca: str | None, server_name: str | None, as_json: bool = False
                     ) -> tuple[str, ControlAuth]:
    """The control address and how to authenticate to it (see the module docstring); with
    ``as_json``, an unreadable token file is also reported as a JSON object on stdout."""
    from dacflnode.transport.control_types import ControlAuth

    address = target or DEFAULT_CONTROL
    token = token or os.environ.get(TOKEN_ENV) or None
    ca_bytes: bytes | None = None
    if peers_file:
        from dacflnode.peers.control_token import client_token, token_file
        from dacflnode.peers.file import load_peers

        node = load_peers(peers_file).node
        address = target or node.control
        if token is None:
            try:
                token = client_token(node)
            except OSError as exc:
                fail(f"cannot read the control token {token_file(node.state_dir)} of "
                      f"{peers_file}: {exc.strerror or exc}: run as the node's user (the file "
                      "is readable by it only), or pass --token", as_json, target=address)
        if node.tls is not None and not is_loopback_address(address) and ca is None:
            ca_bytes = read_file(node.tls.ca, "node.tls.ca")
            server_name = server_name or node.id
    if ca is not None:
        ca_bytes = read_file(Path(ca), "--ca")
    return address, ControlAuth(token=token, ca=ca_bytes, server_name=server_name)


def read_file(path: Path, what: str) -> bytes:
    """The bytes of ``path``, else a usage error naming ``what`` (the option or setting)."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise click.UsageError(f"{what}: cannot read {path}: {exc.strerror}") from exc


def fail(message: str, as_json: bool, **fields: object) -> NoReturn:
    """Exit 1 after one error line on stderr; with ``as_json``, a JSON object on stdout too
    (``{"error": message, ...fields}``), so that a script reading stdout gets JSON whatever
    happened."""
    click.echo(f"error: {message}", err=True)
    if as_json:
        click.echo(json.dumps({"error": message, **fields}))
    sys.exit(1)
