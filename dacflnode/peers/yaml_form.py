"""Writing a peers file: the YAML that :func:`~dacflnode.peers.file.load_peers` reads back.

The ``run:`` section lists every declared setting (:mod:`dacflnode.config.schema`) in
declaration order, so a generated file shows each value a node runs with, defaults included.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dacflnode.config import schema
from dacflnode.config.daemon import DaemonSettings
from dacflnode.config.run import RunConfig
from dacflnode.peers.model import PeersFile


class _Flow(list[Any]):
    """A list written on one line."""


class _FlowMap(dict[str, Any]):
    """A mapping written on one line."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(
    _Flow, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True)
)
_Dumper.add_representer(
    _FlowMap, lambda d, v: d.represent_mapping("tag:yaml.org,2002:map", v, flow_style=True)
)


def _relative(path: Path, base: Path) -> str:
    """``path`` relative to ``base`` when it lies inside it, else absolute."""
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path)


def run_section(run: RunConfig, daemon: DaemonSettings) -> dict[str, Any]:
    """The ``run:`` mapping of a peers file: every setting; the graph only when given."""
    out: dict[str, Any] = {}
    for d in schema.fields_of(RunConfig):
        value = getattr(run, d.name)
        if d.is_list:  # names of a choice (algorithm) as a comma list; free names (classes)
            value = ",".join(value) if d.setting.choices else _Flow(value)  # as a YAML list
        out[d.name] = value
    for d in schema.fields_of(DaemonSettings):
        value = getattr(daemon, d.name)
        if not isinstance(value, tuple):
            out[d.name] = value
        elif value:  # the graph: ids on one line, one line per edge
            out[d.name] = [_Flow(v) for v in value] if isinstance(value[0], tuple) else _Flow(value)
    return out


def node_section(pf: PeersFile) -> dict[str, Any]:
    """The ``node:`` mapping; ``metrics`` and the security keys only when set.

    TLS paths are written absolute, so the file keeps naming the same certificates wherever it is
    copied on this host; the token is written as is (the file is then a secret too).
    """
    node = pf.node
    out: dict[str, Any] = {
        "id": node.id,
        "listen": node.listen,
        "control": node.control,
    }
    if node.metrics is not None:
        out["metrics"] = node.metrics
    if node.health is not None:
        out["health"] = node.health
    out["state_dir"] = _relative(node.state_dir, pf.path.parent)
    out["share"] = node.share
    if node.tls is not None:
        out["tls"] = {
            "ca": str(node.tls.ca.absolute()),
            "cert": str(node.tls.cert.absolute()),
            "key": str(node.tls.key.absolute()),
        }
    if node.insecure:
        out["insecure"] = True
    if node.control_token is not None:
        out["control_token"] = node.control_token
    if node.metrics_token_file is not None:
        out["metrics_token_file"] = str(node.metrics_token_file.absolute())
    elif node.metrics_token is not None:
        out["metrics_token"] = node.metrics_token
    return out


def dump_peers(pf: PeersFile) -> str:
    """YAML text that :func:`load_peers` (at ``pf.path``) reads back to a PeersFile equal to pf."""
    data = {
        "node": node_section(pf),
        "neighbours": [_FlowMap(id=n.id, address=n.address) for n in pf.neighbours],
        "run": run_section(pf.run, pf.daemon),
    }
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
    return f"# dacflnode peers file of {pf.node.id} (see: dacflnode topology --help)\n{body}"
