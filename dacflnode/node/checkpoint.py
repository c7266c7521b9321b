"""Checkpoints and final models as safetensors files, written atomically.

A checkpoint holds the node's algorithm state (``x``, ``omega``, ``omega_prev``), its local
integer buffers, the round and the fingerprints of the run, and what the node needs to keep the
consensus invariant across a restart (docs/faults.md): its ``used_log``, its pending one-sided
corrections (``pending.<round>.<peer>`` tensors), the anchor rounds it knows, what it knows of
each neighbour (``peers``), and which field ``Σ x`` tracks (``tracked``). The node reads it back
with ``safetensors`` (never pickle) and refuses it when the fingerprints differ;
``dacflnode invariant`` reads any node's, from disk or from the Control service.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from dacflnode.algorithms.rounds import NodeState
from dacflnode.learning.files import atomic_save
from dacflnode.node.membership import PeerTrack
from dacflnode.wire.codec import UsedLog

CHECKPOINT = "checkpoint.safetensors"


def save_checkpoint(
    state_dir: Path,
    state: NodeState,
    local: Mapping[str, torch.Tensor],
    run_info: Mapping[str, str],
    *,
    used_log: UsedLog = (),
    pending: Mapping[str, torch.Tensor] | None = None,
    anchors: Iterable[int] = (),
    peers: Mapping[str, PeerTrack] | None = None,
    tracked: str = "x",
    left: bool = False,
) -> Path:
    """Write ``STATE_DIR/checkpoint.safetensors`` atomically (see the module docstring)."""
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, t in (("x", state.x), ("omega", state.omega), ("omega_prev", state.omega_prev)):
        # CDSGD keeps one vector in all three fields: safetensors stores each tensor once
        tensors[name] = t.clone() if t.data_ptr() in seen else t
        seen.add(t.data_ptr())
    tensors.update({f"local.{k}": v for k, v in local.items()})
    tensors.update(pending or {})
    meta = {
        **{k: str(v) for k, v in run_info.items()},
        "round": str(state.round),
        "used_log": json.dumps([[r, list(p)] for r, p in used_log]),
        "anchors": json.dumps(sorted(anchors)),
        "peers": json.dumps({k: v.to_json() for k, v in sorted((peers or {}).items())}),
        "tracked": tracked,
        "left": "1" if left else "0",
    }
    path = state_dir / CHECKPOINT
    atomic_save(tensors, path, meta)
    return path


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint as read back: the state, the local buffers, and the fault bookkeeping."""

    state: NodeState
    local: dict[str, torch.Tensor]
    meta: dict[str, str]
    used_log: UsedLog = ()
    #: ``pending.<round>.<peer>`` tensors: subtract from ``x`` if ``peer`` did not use this
    #: node's state in ``round`` (docs/faults.md)
    pending: dict[str, torch.Tensor] = field(default_factory=dict)
    anchors: tuple[int, ...] = ()
    peers: dict[str, PeerTrack] = field(default_factory=dict)
    tracked_name: str = "x"
    left: bool = False

    @property
    def node(self) -> str:
        return self.meta.get("node", "")

    @property
    def used(self) -> tuple[str, ...]:
        """The neighbours mixed in the round before :attr:`state`'s."""
        for r, peers in self.used_log:
            if r == self.state.round - 1:
                return peers
        return ()

    @property
    def pending_entries(self) -> dict[tuple[int, str], torch.Tensor]:
        """:attr:`pending` by ``(round, peer)``."""
        out = {}
        for name, tensor in self.pending.items():
            round_text, _, peer = name[len("pending."):].partition(".")
            out[(int(round_text), peer)] = tensor
        return out

    @property
    def tracked(self) -> torch.Tensor:
        return getattr(self.state, self.tracked_name)  # type: ignore[no-any-return]


def read_checkpoint(source: Path | bytes) -> Checkpoint:
    """A checkpoint file (or its bytes, as the Control service sends them), without checking
    which run it belongs to; raises ``ValueError`` when it is not a well-formed checkpoint."""
    try:
        if isinstance(source, bytes):
            meta, tensors = _from_bytes(source)
        else:
            with safe_open(str(source), framework="pt") as f:
                meta = dict(f.metadata() or {})
                tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open API
    except (OSError, SafetensorError) as exc:
        raise ValueError(f"{source if isinstance(source, Path) else 'checkpoint'}: {exc}") from exc
    where = str(source) if isinstance(source, Path) else "checkpoint"
    numel = None
    for name in ("x", "omega", "omega_prev"):
        t = tensors.get(name)
        if t is None or t.dtype != torch.float32 or t.dim() != 1 or (
                numel is not None and t.numel() != numel):
            raise ValueError(f"{where}: tensor {name} is missing or has the wrong shape")
        numel = t.numel()
    try:
        state = NodeState(int(meta["round"]), tensors["x"], tensors["omega"],
                          tensors["omega_prev"])
        used_log = tuple((int(r), tuple(str(x) for x in p))
                         for r, p in json.loads(meta.get("used_log", "[]")))
        if not used_log and "used" in meta:  # written before used_log existed
            used_log = ((state.round - 1, tuple(json.loads(meta["used"]))),)
        anchors = tuple(int(a) for a in json.loads(meta.get("anchors", "[]")))
        peers = {k: PeerTrack.from_json(v) for k, v in json.loads(meta.get("peers", "{}")).items()}
    except (KeyError, ValueError, TypeError) as exc:
        raise ValueError(f"{where}: malformed metadata ({exc})") from exc
    tracked = meta.get("tracked", "x")
    if tracked not in ("x", "omega", "omega_prev"):
        raise ValueError(f"{where}: unknown tracked field {tracked!r}")
    local = {k[len("local."):]: v for k, v in tensors.items() if k.startswith("local.")}
    pending = {k: v for k, v in tensors.items() if k.startswith("pending.")}
    return Checkpoint(state, local, meta, used_log, pending, anchors, peers, tracked,
                      meta.get("left") == "1")


def _from_bytes(data: bytes) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    from safetensors import deserialize

    header_len = int.from_bytes(data[:8], "little") if len(data) >= 8 else 0
    header = json.loads(data[8 : 8 + header_len] or b"{}")
    meta = {str(k): str(v) for k, v in (header.get("__metadata__") or {}).items()}
    tensors: dict[str, torch.Tensor] = {}
    for name, info in deserialize(data):  # type: ignore[no-untyped-call]
        if info["dtype"] != "F32":
            continue  # local integer buffers: not needed to judge the invariant
        tensors[name] = torch.frombuffer(info["data"], dtype=torch.float32).reshape(
            info["shape"])
    return meta, tensors


def load_checkpoint(state_dir: Path, run_info: Mapping[str, str], numel: int) -> Checkpoint | None:
    """The checkpoint in ``state_dir`` if there is one for this run; ``None`` if there is none.

    Raises ``ValueError`` when the file belongs to another run or model (the user must move it
    away: silently starting over would throw away training).
    """
    path = state_dir / CHECKPOINT
    if not path.exists():
        return None
    checkpoint = read_checkpoint(path)
    for key, value in run_info.items():
        if checkpoint.meta.get(key) != str(value):
            raise ValueError(
                f"{path} belongs to another run ({key} differs); move it away to start over"
            )
    if checkpoint.state.x.numel() != numel:
        raise ValueError(f"{path}: tensor x is missing or has the wrong shape")
    return checkpoint
