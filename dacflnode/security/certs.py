"""A small certificate authority for a run: one CA, one certificate per node.

Mutual TLS pins identities: a node's certificate carries its node id as a DNS
subject-alternative name, clients connect with the target name overridden to the id they expect,
and a server reads the id of whoever connects from the verified client certificate. So each node
certificate is usable as a TLS server and a TLS client certificate (serverAuth and clientAuth
extended key usages) and is signed by the run's CA, which every node trusts.

Files in the output folder::

    ca.crt  ca.key          the CA (self-signed; CA:true, keyCertSign)
    <id>.crt  <id>.key      one pair per node

Keys are EC P-256, PEM (PKCS#8, unencrypted), created with mode 0600 — their protection is the
file mode — and certificates 0640, in a folder made 0700, whatever the umask
(:mod:`dacflnode.filemodes`). A folder other users can write, a CA key they can read or a CA
certificate they can write is refused: they could have replaced the CA. A folder that already
holds a CA reuses it to add nodes, and a node whose files exist keeps them (they are checked
against the CA, never overwritten). Everything is built with the ``cryptography`` library;
nothing shells out to openssl. A run that already has a PKI needs none of this: see
``docs/security.md`` for what its certificates must contain.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import cryptography.exceptions
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import verification
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dacflnode.errors import ConfigError
from dacflnode.filemodes import make_dir, others_can_write
from dacflnode.security.tls import TlsFiles, TlsMaterial

__all__ = [
    "CA_CERT",
    "CA_DAYS",
    "CA_KEY",
    "NODE_DAYS",
    "NODE_ID_RE",
    "check_node_files",
    "check_node_id",
    "check_node_material",
    "node_ids_of",
    "tls_files",
    "write_certs",
]

#: A node id, as peers files accept it: 1-128 letters, digits, '.', '_' or '-', starting with a
#: letter or digit (also a valid DNS subject-alternative name).
NODE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
#: Validity of a new CA and of a new node certificate, in days.
CA_DAYS = 3650
NODE_DAYS = 825

_KEY_MODE = 0o600
_CERT_MODE = 0o640
# a certificate is valid from a little before it is made, so that a neighbour whose clock runs
# a few minutes behind accepts it
_BACKDATE = datetime.timedelta(hours=1)


def check_node_id(node_id: str, field: str = "node_id") -> str:
    """``node_id`` if it can name a node and its certificate, else a ConfigError for ``field``.

    The rule is the peers file's (:data:`NODE_ID_RE`), and an id may not be an IP address: a
    client that overrides the TLS target name with an IP literal matches IP, not DNS, names.
    """
    if not NODE_ID_RE.fullmatch(node_id):
        raise ConfigError(
            field,
            "node ids are 1-128 letters, digits, '.', '_' or '-' (starting with a letter or"
            f" digit), got {node_id!r}",
        )
    try:
        ipaddress.ip_address(node_id)
    except ValueError:
        return node_id
    raise ConfigError(
        field, f"{node_id!r} is an IP address; a node id for TLS must be a name (e.g. node-0)"
    )


def tls_files(out_dir: Path, node_id: str) -> TlsFiles:
    """The TLS files :func:`write_certs` makes for ``node_id`` in ``out_dir``."""
    return TlsFiles(out_dir / CA_CERT, out_dir / f"{node_id}.crt", out_dir / f"{node_id}.key")


def write_certs(
    out_dir: Path, node_ids: Sequence[str], *, node_days: int = NODE_DAYS
) -> list[Path]:
    """Create what is missing in ``out_dir``: the CA, and a certificate and key per node id.

    Returns the files written, in order (empty when everything existed). An existing CA is
    reused; an existing node pair is kept after checking that the CA signed it for that id.
    Raises ConfigError on a bad node id, on half a pair (a certificate without its key or the
    reverse), on node files the CA did not issue — rather than overwrite anything — and on a
    file it cannot write (field ``out``).
    """
    ids = [check_node_id(n, f"node_ids[{k}]") for k, n in enumerate(node_ids)]
    for k, node_id in enumerate(ids):
        if node_id in ids[:k]:
            raise ConfigError(f"node_ids[{k}]", f"{node_id!r} is given twice")
        if node_id == Path(CA_CERT).stem:
            raise ConfigError(f"node_ids[{k}]", f"{node_id!r} would be the CA's file names")
    if node_days < 1:
        raise ConfigError("days", f"must be >= 1, got {node_days}")
    written: list[Path] = []
    try:
        _fill(Path(out_dir), ids, node_days, written)
    except OSError as exc:  # a folder we may not write, a file planted meanwhile (O_EXCL)
        raise ConfigError(
            "out", f"cannot write {exc.filename or out_dir}: {exc.strerror or exc}"
        ) from None
    return written


def _fill(out_dir: Path, ids: list[str], node_days: int, written: list[Path]) -> None:
    make_dir(out_dir)
    _check_private(out_dir)
    ca = _load_or_create_ca(out_dir, written)
    for node_id in ids:
        files = tls_files(out_dir, node_id)
        have = _existing_pair(files.cert, files.key)
        if have:
            check_node_files(files, node_id)
            continue
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _node_certificate(ca, node_id, key, node_days)
        _write(files.key, _key_pem(key), _KEY_MODE)
        written.append(files.key)
        _write(files.cert, cert.public_bytes(serialization.Encoding.PEM), _CERT_MODE)
        written.append(files.cert)


def check_node_files(files: TlsFiles, node_id: str) -> None:
    """Check that ``files`` make a usable identity for ``node_id``, or raise ConfigError.

    The certificate must chain to the CA in ``files.ca`` for the DNS name ``node_id`` as a
    server and as a client certificate, and the key must be the certificate's key. Every error
    is one line naming the file and what is wrong with it.
    """
    try:
        material = files.load()
    except OSError as exc:
        raise ConfigError("tls", f"cannot read {exc.filename}: {exc.strerror}") from None
    check_node_material(files, material, node_id)


def check_node_material(files: TlsFiles, material: TlsMaterial, node_id: str) -> None:
    """:func:`check_node_files` of PEM bytes already read from ``files`` (the daemon checks what
    it will serve, not the files again)."""
    ca_certs = _certificates(files.ca, material.ca, "the CA certificate(s)")
    chain = _certificates(files.cert, material.cert, "the node's certificate")
    cert = chain[0]
    try:
        key = serialization.load_pem_private_key(material.key, password=None)
    except TypeError:  # "Password was not given but private key is encrypted"
        raise ConfigError(
            "tls.key", f"{files.key} is encrypted: gRPC cannot ask for a passphrase; store it "
            "decrypted (`openssl pkey -in KEY -out PLAIN`) with mode 0600") from None
    except (ValueError, cryptography.exceptions.UnsupportedAlgorithm) as exc:
        raise ConfigError("tls.key", f"{files.key} is not a PEM private key "
                          f"({_first_line(exc)}): point node.tls.key at the node's key "
                          "(`dacflnode certs` makes one)") from None
    if key.public_key() != cert.public_key():
        raise ConfigError("tls.key", f"{files.key} is not the key of {files.cert}: give the "
                          "key that was issued with this certificate")
    if node_id not in node_ids_of(cert):
        raise ConfigError(
            "tls.cert",
            f"{files.cert} names {node_ids_of(cert) or 'no DNS name'}, not {node_id!r}",
        )
    store = verification.Store(ca_certs)
    now = datetime.datetime.now(datetime.UTC)
    builder = verification.PolicyBuilder().store(store).time(now)
    try:
        builder.build_server_verifier(x509.DNSName(node_id)).verify(cert, chain[1:])
        builder.build_client_verifier().verify(cert, chain[1:])
    except verification.VerificationError as exc:
        raise ConfigError(
            "tls.cert",
            f"{files.cert} is not a valid {node_id!r} certificate under {files.ca}: "
            f"{_first_line(exc)}",
        ) from None


def _certificates(path: Path, pem: bytes, what: str) -> list[x509.Certificate]:
    """The PEM certificates in ``pem`` (read from ``path``), or a one-line ConfigError."""
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise ConfigError("tls", f"{path} is not {what} in PEM ({_first_line(exc)}): issue the "
                          "node's files with `dacflnode certs` or point node.tls at them") from None
    return certs


def _first_line(exc: BaseException) -> str:
    """The first line of an error's text, without cryptography's pointer to its FAQ."""
    lines = str(exc).strip().splitlines()
    return lines[0].split(". See https://", 1)[0] if lines else type(exc).__name__


def node_ids_of(cert: x509.Certificate) -> list[str]:
    """The DNS subject-alternative names of ``cert`` — the node ids it proves."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return san.get_values_for_type(x509.DNSName)


# ---------------------------------------------------------------------------------------- CA
@dataclass(frozen=True)
class _Ca:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def _load_or_create_ca(out_dir: Path, written: list[Path]) -> _Ca:
    cert_path, key_path = out_dir / CA_CERT, out_dir / CA_KEY
    if _existing_pair(cert_path, key_path):
        try:
            cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        except (ValueError, TypeError) as exc:
            raise ConfigError("ca", f"cannot reuse the CA in {out_dir}: {exc}") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
            raise ConfigError("ca", f"{key_path} is not an EC key of {cert_path}")
        return _Ca(cert, key)
    strays = sorted(p.name for p in out_dir.glob("*.crt"))
    if strays:
        raise ConfigError(
            "ca",
            f"{out_dir} has no CA but holds certificates ({', '.join(strays)}) a new CA would"
            " not have signed: remove them or use another folder",
        )
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dacflnode CA")])
    now = datetime.datetime.now(datetime.UTC)
    public = key.public_key()
    cert = (
        _builder(name, name, public, now, now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(key_path, _key_pem(key), _KEY_MODE)
    written.append(key_path)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), _CERT_MODE)
    written.append(cert_path)
    return _Ca(cert, key)


def _builder(subject: x509.Name, issuer: x509.Name, public: ec.EllipticCurvePublicKey,
             now: datetime.datetime, not_after: datetime.datetime) -> x509.CertificateBuilder:
    """A certificate of ``subject``'s key ``public``, issued by ``issuer``, valid from a little
    before ``now`` (clock skew) to ``not_after``, with a random serial number."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(not_after)
    )


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """What a certificate's key may do: a CA's signs certificates (and revocation lists), a
    node's signs its TLS handshakes, nothing else."""
    return x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _node_certificate(
    ca: _Ca, node_id: str, key: ec.EllipticCurvePrivateKey, days: int
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    public = key.public_key()
    ca_ski = ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    return (
        _builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)]), ca.cert.subject,
                 public, now,
                 min(now + datetime.timedelta(days=days), ca.cert.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(node_id)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .sign(ca.key, hashes.SHA256())
    )


# ---------------------------------------------------------------------------------------- files
def _existing_pair(cert: Path, key: Path) -> bool:
    """Whether both files exist; ConfigError when only one does (never overwrite half a pair)."""
    if cert.exists() and key.exists():
        return True
    if cert.exists() or key.exists():
        present, missing = (cert, key) if cert.exists() else (key, cert)
        raise ConfigError(
            "tls", f"{present} exists but {missing} does not: restore it or remove {present}"
        )
    return False


def _check_private(out_dir: Path) -> None:
    """Refuse a certs folder, CA key or CA certificate another user could replace (or, for the
    key, read): whatever it signed next would be theirs to forge. The fix is one ``chmod``."""
    if others_can_write(out_dir):
        mode = out_dir.stat().st_mode
        if mode & stat.S_ISVTX:  # /tmp and the like: shared on purpose, not to be chmod'ed
            raise ConfigError(
                "out", f"{out_dir} is shared with other users (mode {stat.S_IMODE(mode):o}): "
                f"give the certificates a folder of their own, e.g. {out_dir / 'certs'}")
        raise ConfigError(
            "out", f"{out_dir} can be written by other users (mode "
            f"{stat.S_IMODE(mode):03o}), who could swap the CA in it: "
            f"`chmod 700 {out_dir}`, check its files, then run again")
    # the key: no access but the owner's; the certificate: others may read it, not write it
    for name, forbidden, mode in ((CA_KEY, 0o077, _KEY_MODE), (CA_CERT, 0o022, _CERT_MODE)):
        path = out_dir / name
        if not path.exists():
            continue
        current = stat.S_IMODE(path.stat().st_mode)
        if current & forbidden:
            raise ConfigError(
                "ca", f"{path} can be {'read or written' if name == CA_KEY else 'written'} by "
                f"other users (mode {current:03o}): `chmod {mode:03o} {path}` (and make a new "
                "CA if anyone else may have used it), then run again")


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    """Create ``path`` with ``mode`` from the start (never a readable moment for a key).

    ``O_EXCL`` refuses an existing file or a planted symlink; the mode is set again because the
    process umask may have narrowed it (it can only narrow it).
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
