"""``host:port`` addresses of a peers file: parsing, printing, the control-port default, and
whether an address is reachable from other hosts (:func:`is_loopback`).

Errors are :class:`~dacflnode.errors.ConfigError` whose field is the dotted key the address came
from and whose message names the file, like every peers-file error.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

from dacflnode.config.reader import file_error

#: The control port defaults to the listen port plus this, on the loopback interface.
CONTROL_PORT_OFFSET = 1000
CONTROL_HOST = "127.0.0.1"
#: ``dacflnode topology`` puts node.metrics on 127.0.0.1 at the listen port plus this.
METRICS_PORT_OFFSET = 2000

_HOST_RE = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9._-]*[A-Za-z0-9_])?")
_PORT_RE = re.compile(r"[0-9]{1,5}")


def parse_address(value: object, field: str, file: Path) -> tuple[str, int]:
    """``host:port`` or ``[v6-address]:port`` -> ``(host, port)``; the port is 0..65535."""
    if not isinstance(value, str):
        raise file_error(field, file, f"expected host:port, got {value!r}")
    text = value.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] != ":":
            raise file_error(field, file, f"expected [v6-address]:port, got {value!r}")
        host, port_text = text[1:end], text[end + 2 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise file_error(
                field, file, f"{host!r} is not an IPv6 address (in {value!r})"
            ) from None
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            raise file_error(field, file, f"expected host:port, got {value!r}")
        if ":" in host:
            raise file_error(
                field, file, f"put an IPv6 address in brackets, [{host}]:{port_text}: got {value!r}"
            )
        if not _HOST_RE.fullmatch(host):
            raise file_error(field, file, f"{host!r} is not a host name or address (in {value!r})")
    if not _PORT_RE.fullmatch(port_text) or int(port_text) > 65535:
        raise file_error(field, file, f"port must be a number in 0..65535, got {port_text!r}")
    return host, int(port_text)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this host only: 127.0.0.0/8, ``::1`` or ``localhost``.

    Anything else — a name, another address, and the wildcards ``0.0.0.0`` and ``::``, which
    bind every interface — counts as reachable from the network.
    """
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback and not address.is_unspecified


def format_address(host: str, port: int) -> str:
    """The inverse of :func:`parse_address`: brackets around IPv6 addresses."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
