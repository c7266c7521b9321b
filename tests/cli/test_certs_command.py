"""``dacflnode certs``: the files of a CA and its nodes, listed; bad ids are one line, exit 2."""

import json
import stat

from click.testing import CliRunner

from dacflnode.cli.main import cli
from dacflnode.security.certs import check_node_files, tls_files


def run(args):
    return CliRunner().invoke(cli, args)


def test_writes_the_ca_and_every_node_and_lists_the_files(tmp_path):
    out = tmp_path / "certs"
    result = run(["certs", "--out", str(out), "node-0", "node-1", "--json"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)
    names = ["ca.key", "ca.crt", "node-0.key", "node-0.crt", "node-1.key", "node-1.crt"]
    assert listed == [str(out / n) for n in names]
    for node in ("node-0", "node-1"):
        check_node_files(tls_files(out, node), node)
        assert stat.S_IMODE((out / f"{node}.key").stat().st_mode) == 0o600


def test_a_second_run_adds_nodes_with_the_same_ca(tmp_path):
    assert run(["certs", "--out", str(tmp_path), "a"]).exit_code == 0
    ca = (tmp_path / "ca.crt").read_bytes()
    result = run(["certs", "--out", str(tmp_path), "a", "b"])
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == [str(tmp_path / "b.key"), str(tmp_path / "b.crt")]
    assert "kept the existing files of a" in result.stderr
    assert (tmp_path / "ca.crt").read_bytes() == ca
    check_node_files(tls_files(tmp_path, "b"), "b")


def test_a_bad_node_id_is_one_line_and_exit_2(tmp_path):
    result = run(["certs", "--out", str(tmp_path / "c"), "node-0", "bad id"])
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0
    assert result.stderr.startswith("error: node_ids[1]: node ids are 1-128 letters")
    assert not (tmp_path / "c").exists()


def test_a_certs_folder_others_can_write_is_one_line_saying_the_chmod_exit_2(tmp_path):
    out = tmp_path / "certs"
    assert run(["certs", "--out", str(out), "node-0"]).exit_code == 0
    out.chmod(0o777)
    result = run(["certs", "--out", str(out), "node-1"])
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0
    assert result.stderr.startswith(f"error: out: {out} can be written by other users")
    assert f"`chmod 700 {out}`" in result.stderr


def test_node_ids_are_required_and_the_help_shows_an_example():
    assert run(["certs", "--out", "x"]).exit_code == 2
    help_text = run(["certs", "--help"]).stdout
    assert "dacflnode certs --out certs node-0 node-1 node-2" in help_text
    assert "0600" in help_text
