"""``dacflnode certs``: a CA and one TLS certificate per node, for mutual TLS between neighbours."""

from __future__ import annotations

import json
from pathlib import Path

import click

from dacflnode.cli.errors import config_errors
from dacflnode.cli.options import out_dir_option


@click.command("certs")
@click.argument("node_ids", metavar="NODE_ID...", nargs=-1, required=True)
@out_dir_option("Folder of the CA and the certificates (created when missing).")
@click.option(
    "--days",
    type=int,
    default=825,
    show_default=True,
    help="Validity of each new node certificate, in days (never past the CA's).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the files written as a JSON list.")
@config_errors
def certs_cmd(node_ids: tuple[str, ...], out_dir: str, days: int, as_json: bool) -> None:
    """Write DIR/ca.crt, DIR/ca.key and DIR/<id>.crt, DIR/<id>.key for every NODE_ID.

    Each node certificate carries the node id as its DNS name and serves both as the node's TLS
    server and client certificate; point node.tls of its peers file at ca.crt, <id>.crt and
    <id>.key. Keys are written with mode 0600. A CA already in DIR is reused, so nodes can be
    added later; files that exist are checked and kept, never overwritten. ca.key signs every
    identity of the run: keep it off the nodes. See docs/security.md (also for using an
    existing PKI instead).

    \b
    Examples:
      dacflnode certs --out certs node-0 node-1 node-2
      dacflnode certs --out certs node-3 --json     # add a node, same CA
    """
    from dacflnode.security.certs import write_certs

    out = Path(out_dir).expanduser().absolute()
    written = write_certs(out, node_ids, node_days=days)
    if as_json:
        click.echo(json.dumps([str(p) for p in written]))
        return
    for path in written:
        click.echo(str(path))
    new = {p.name for p in written}
    kept = [n for n in dict.fromkeys(node_ids) if f"{n}.key" not in new]
    note = f"; kept the existing files of {', '.join(kept)}" if kept else ""
    click.echo(f"wrote {len(written)} files to {out}{note}", err=True)
