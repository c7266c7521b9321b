"""A secret per pair of nodes, agreed in the open: X25519 key agreement.

Each node makes a fresh key pair for one agreement and publishes its public key (32 bytes); two
nodes derive the same secret from their own private key and the other's public key, which no
third node can (``cryptography``'s X25519, then HKDF-SHA256 over the run's context so that a
secret serves one purpose of one run). The secret seeds the pair's masks in
:mod:`dacflnode.algorithms.secure_sum`.
"""

from __future__ import annotations

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

#: Bytes of a public key.
PUBLIC_KEY_BYTES = 32


class PairKeys:
    """One node's key pair for one agreement."""

    def __init__(self) -> None:
        self._private = X25519PrivateKey.generate()
        self.public = self._private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    def secret_with(self, public: bytes, context: bytes) -> bytes:
        """The 32-byte secret this node shares with the owner of ``public``; ``ValueError`` for
        a key that is not one."""
        if len(public) != PUBLIC_KEY_BYTES:
            raise ValueError(f"a public key of {len(public)} bytes, expected "
                             f"{PUBLIC_KEY_BYTES}")
        shared = self._private.exchange(X25519PublicKey.from_public_bytes(public))
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                    info=b"dacflnode pair mask " + context).derive(shared)
