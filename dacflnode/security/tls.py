"""The TLS files of a node and their contents, independent of how a transport uses them.

A node's identity is a certificate, signed by the run's certificate authority, that carries the
node id as a DNS subject-alternative name. The transport (:mod:`dacflnode.transport.channels`)
turns :class:`TlsMaterial` into gRPC credentials; nothing here imports grpc.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TlsMaterial:
    """PEM bytes: the CA certificate(s) to trust, this node's certificate chain and its key."""

    ca: bytes
    cert: bytes
    key: bytes

    def __repr__(self) -> str:  # never print a private key
        return "TlsMaterial(ca=..., cert=..., key=<hidden>)"


@dataclass(frozen=True)
class TlsFiles:
    """Where a node's TLS material lives (``node.tls`` of a peers file)."""

    ca: Path
    cert: Path
    key: Path

    def load(self) -> TlsMaterial:
        """Read the three PEM files; raises ``OSError`` naming the file that is missing."""
        return TlsMaterial(self.ca.read_bytes(), self.cert.read_bytes(), self.key.read_bytes())
