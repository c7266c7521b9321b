"""The run's small CA: node certificates name their node, chain to the CA, keep their keys private,
and a folder is extended, never overwritten."""

from __future__ import annotations

import datetime
import os
import shutil
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509 import verification
from cryptography.x509.oid import ExtendedKeyUsageOID

from dacflnode.errors import ConfigError
from dacflnode.security.certs import (
    CA_CERT,
    CA_KEY,
    check_node_files,
    node_ids_of,
    tls_files,
    write_certs,
)


def cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def verifier(ca_dir: Path) -> verification.PolicyBuilder:
    store = verification.Store([cert(ca_dir / CA_CERT)])
    return verification.PolicyBuilder().store(store).time(datetime.datetime.now(datetime.UTC))


def test_writes_the_ca_and_one_pair_per_node(tmp_path):
    written = write_certs(tmp_path, ["node-0", "node-1"])
    names = ["ca.key", "ca.crt", "node-0.key", "node-0.crt", "node-1.key", "node-1.crt"]
    assert written == [tmp_path / n for n in names]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)
    files = tls_files(tmp_path, "node-1")
    assert (files.ca, files.cert, files.key) == (
        tmp_path / "ca.crt",
        tmp_path / "node-1.crt",
        tmp_path / "node-1.key",
    )


def test_the_ca_is_a_self_signed_ca_that_signs_certificates(tmp_path):
    write_certs(tmp_path, ["a"])
    ca = cert(tmp_path / CA_CERT)
    assert ca.issuer == ca.subject
    ca.verify_directly_issued_by(ca)
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca
    usage = ca.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign and not usage.digital_signature


def test_a_node_certificate_names_the_node_and_serves_as_server_and_client(tmp_path):
    write_certs(tmp_path, ["node-7"])
    leaf = cert(tmp_path / "node-7.crt")
    assert node_ids_of(leaf) == ["node-7"]
    ekus = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(ekus) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    usage = leaf.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical and usage.value.digital_signature
    assert not (usage.value.key_cert_sign or usage.value.crl_sign)
    leaf.verify_directly_issued_by(cert(tmp_path / CA_CERT))


def test_the_chain_verifies_for_the_nodes_own_name_only(tmp_path):
    write_certs(tmp_path, ["node-0", "node-1"])
    builder = verifier(tmp_path)
    leaf = cert(tmp_path / "node-0.crt")
    chain = builder.build_server_verifier(x509.DNSName("node-0")).verify(leaf, [])
    assert chain[-1] == cert(tmp_path / CA_CERT)
    builder.build_client_verifier().verify(leaf, [])
    with pytest.raises(verification.VerificationError):
        builder.build_server_verifier(x509.DNSName("node-1")).verify(leaf, [])


def test_a_certificate_from_another_ca_does_not_verify(tmp_path):
    write_certs(tmp_path / "ours", ["node-0"])
    write_certs(tmp_path / "theirs", ["node-0"])
    stranger = cert(tmp_path / "theirs" / "node-0.crt")
    with pytest.raises(verification.VerificationError):
        verifier(tmp_path / "ours").build_client_verifier().verify(stranger, [])


def test_keys_are_mode_0600_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        write_certs(tmp_path / "a" / "certs", ["node-0"])
    finally:
        os.umask(old)
    out = tmp_path / "a" / "certs"
    for name in (CA_KEY, "node-0.key"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name
    assert stat.S_IMODE((out / "node-0.crt").stat().st_mode) == 0o640
    for folder in (out, tmp_path / "a"):  # made here: the owner's only
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_certs_folder_others_can_write_is_refused_with_the_chmod(tmp_path, mode):
    out = tmp_path / "certs"
    write_certs(out, ["node-0"])
    out.chmod(mode)
    with pytest.raises(ConfigError, match=rf"can be written by other users \(mode {mode:03o}\)"
                                          rf".*`chmod 700 {out}`") as caught:
        write_certs(out, ["node-1"])
    assert caught.value.field == "out"
    assert not (out / "node-1.key").exists()


def test_a_shared_sticky_folder_is_refused_with_a_folder_of_its_own_to_use(tmp_path):
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(ConfigError, match=rf"shared with other users \(mode 1777\): give the "
                                          rf"certificates a folder of their own, e.g. "
                                          rf"{shared / 'certs'}"):
        write_certs(shared, ["node-0"])
    write_certs(shared / "certs", ["node-0"])  # the advice works
    assert (shared / "certs" / "node-0.key").exists()


@pytest.mark.parametrize(("name", "mode", "fix"), [
    (CA_KEY, 0o644, "chmod 600"), (CA_KEY, 0o640, "chmod 600"), (CA_KEY, 0o602, "chmod 600"),
    ("ca.crt", 0o666, "chmod 640"), ("ca.crt", 0o620, "chmod 640")])
def test_a_ca_key_others_can_read_or_a_ca_others_can_write_is_refused(tmp_path, name, mode,
                                                                       fix):
    write_certs(tmp_path, ["node-0"])
    (tmp_path / name).chmod(mode)
    with pytest.raises(ConfigError, match=rf"{name} can be .* by other users \(mode "
                                          rf"{mode:03o}\): `{fix} {tmp_path / name}`"):
        write_certs(tmp_path, ["node-1"])
    assert not (tmp_path / "node-1.key").exists()


def test_a_ca_certificate_others_may_only_read_is_reused(tmp_path):
    write_certs(tmp_path, ["node-0"])
    (tmp_path / "ca.crt").chmod(0o644)
    tmp_path.chmod(0o755)
    assert write_certs(tmp_path, ["node-1"]) == [tmp_path / "node-1.key",
                                                 tmp_path / "node-1.crt"]


def test_an_existing_ca_is_reused_and_existing_nodes_are_kept(tmp_path):
    write_certs(tmp_path, ["node-0"])
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    written = write_certs(tmp_path, ["node-0", "node-1"])
    assert written == [tmp_path / "node-1.key", tmp_path / "node-1.crt"]
    assert {n: (tmp_path / n).read_bytes() for n in before} == before
    verifier(tmp_path).build_server_verifier(x509.DNSName("node-1")).verify(
        cert(tmp_path / "node-1.crt"), []
    )
    assert write_certs(tmp_path, ["node-1", "node-0"]) == []


def test_check_node_files_accepts_a_good_identity_and_names_what_is_wrong(tmp_path):
    write_certs(tmp_path, ["node-0", "node-1"])
    check_node_files(tls_files(tmp_path, "node-0"), "node-0")
    with pytest.raises(ConfigError, match=r"names \['node-0'\], not 'node-1'"):
        check_node_files(tls_files(tmp_path, "node-0"), "node-1")
    mixed = tls_files(tmp_path, "node-0")
    with pytest.raises(ConfigError, match="is not the key of"):
        check_node_files(type(mixed)(mixed.ca, mixed.cert, tmp_path / "node-1.key"), "node-0")
    with pytest.raises(ConfigError, match="cannot read"):
        check_node_files(tls_files(tmp_path, "node-9"), "node-9")


def test_node_files_the_ca_did_not_issue_are_refused_not_overwritten(tmp_path):
    write_certs(tmp_path / "ours", ["node-0"])
    write_certs(tmp_path / "theirs", ["node-1"])
    for name in ("node-1.crt", "node-1.key"):
        shutil.copy(tmp_path / "theirs" / name, tmp_path / "ours" / name)
    with pytest.raises(ConfigError, match="is not a valid 'node-1' certificate") as err:
        write_certs(tmp_path / "ours", ["node-1"])
    assert err.value.field == "tls.cert"
    assert (tmp_path / "ours" / "node-1.crt").read_bytes() == (
        tmp_path / "theirs" / "node-1.crt"
    ).read_bytes()


def test_half_a_pair_and_certificates_without_a_ca_are_refused(tmp_path):
    write_certs(tmp_path, ["node-0"])
    (tmp_path / "node-0.key").unlink()
    with pytest.raises(ConfigError, match=r"node-0\.crt exists but .*node-0\.key does not"):
        write_certs(tmp_path, ["node-0"])
    (tmp_path / CA_KEY).unlink()
    with pytest.raises(ConfigError, match=r"ca\.crt exists but .*ca\.key does not"):
        write_certs(tmp_path, ["node-1"])
    (tmp_path / CA_CERT).unlink()
    with pytest.raises(ConfigError, match=r"has no CA but holds certificates \(node-0\.crt\)"):
        write_certs(tmp_path, ["node-1"])
    assert not (tmp_path / CA_CERT).exists()


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (["-node"], "node ids are 1-128 letters"),
        (["node 0"], "node ids are 1-128 letters"),
        (["x" * 129], "node ids are 1-128 letters"),
        (["10.0.0.1"], "is an IP address"),
        (["a", "a"], "is given twice"),
        (["ca"], "CA's file names"),
    ],
)
def test_bad_node_ids_are_refused_before_anything_is_written(tmp_path, ids, message):
    with pytest.raises(ConfigError, match=message) as err:
        write_certs(tmp_path / "out", ids)
    assert err.value.field == f"node_ids[{len(ids) - 1}]"
    assert not (tmp_path / "out").exists()


def test_a_file_planted_where_a_key_goes_is_not_followed(tmp_path):
    write_certs(tmp_path, ["node-0"])
    target = tmp_path / "elsewhere.txt"
    (tmp_path / "node-1.key").symlink_to(target)  # dangling: the pair looks absent
    with pytest.raises(ConfigError, match=r"cannot write .*node-1\.key") as err:
        write_certs(tmp_path, ["node-1"])
    assert err.value.field == "out" and not target.exists()


def test_node_validity_is_the_days_asked_for_and_never_past_the_ca(tmp_path):
    write_certs(tmp_path / "a", ["short"], node_days=30)
    leaf = cert(tmp_path / "a" / "short.crt")
    assert leaf.not_valid_after_utc - leaf.not_valid_before_utc == datetime.timedelta(
        days=30, hours=1
    )
    write_certs(tmp_path / "b", ["long"], node_days=100_000)
    assert cert(tmp_path / "b" / "long.crt").not_valid_after_utc == cert(
        tmp_path / "b" / CA_CERT
    ).not_valid_after_utc
    with pytest.raises(ConfigError) as err:
        write_certs(tmp_path / "c", ["x"], node_days=0)
    assert err.value.field == "days"
