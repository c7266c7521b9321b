"""Checkpoints are verified: each carries a checksum of its metadata and tensors, and a damaged,
foreign or non-finite one is refused with one line saying what to do; the previous checkpoint
stays beside the newest, and a node whose newest is damaged resumes from it."""

from __future__ import annotations

import errno
import json
import logging
import math
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dacflnode import logs
from dacflnode.algorithms.rounds import NodeState
from dacflnode.learning import files
from dacflnode.learning.files import CHECKSUM_KEY, CorruptFile, atomic_save, read_verified
from dacflnode.records.checkpoint import (
    CHECKPOINT,
    CHECKPOINT_DAMAGED,
    CHECKPOINT_PREV,
    CheckpointError,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
)

N = 8
RUN = {"run_fingerprint": "run-a", "model_fingerprint": "model-a", "node": "node-1"}


def state(round_: int, x: torch.Tensor | None = None) -> NodeState:
    g = torch.Generator().manual_seed(round_)
    omega = torch.randn(N, generator=g)
    return NodeState(round_, omega + 0.1 if x is None else x, omega, omega - 0.1)


def save(tmp_path: Path, round_: int, run_info: dict[str, str] | None = None,
         x: torch.Tensor | None = None) -> Path:
    return save_checkpoint(tmp_path, state(round_, x), {"steps": torch.tensor([round_])},
                           run_info or RUN, used_log=((round_ - 1, ("node-0",)),),
                           pending={f"pending.{round_ - 1}.node-0": torch.ones(N)},
                           anchors=(round_ + 3,), tracked="omega_prev")


def tensor_offset(path: Path, name: str) -> int:
    """Where tensor ``name``'s bytes start in the safetensors file ``path``."""
    data = path.read_bytes()
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + header_len])
    return 8 + header_len + int(header[name]["data_offsets"][0])


def flip_float(path: Path, name: str = "x", index: int = 3) -> None:
    """Overwrite one float32 of tensor ``name`` with another finite value."""
    data = bytearray(path.read_bytes())
    at = tensor_offset(path, name) + 4 * index
    value = torch.frombuffer(bytearray(data[at : at + 4]), dtype=torch.float32)
    data[at : at + 4] = (value + 1.0).numpy().tobytes()
    path.write_bytes(bytes(data))


def one_line(message: str) -> bool:
    return "\n" not in message and "Traceback" not in message


def test_a_checkpoint_round_trips_with_its_checksum(tmp_path):
    path = save(tmp_path, 5)
    meta, _, verified = read_verified(path)
    assert verified and meta[CHECKSUM_KEY].startswith("xxh3-128:")
    ckpt = load_checkpoint(tmp_path, RUN, N)
    assert ckpt is not None and ckpt.verified
    want = state(5)
    assert ckpt.state.round == 5 and torch.equal(ckpt.state.x, want.x)
    assert torch.equal(ckpt.state.omega_prev, want.omega_prev)
    assert torch.equal(ckpt.local["steps"], torch.tensor([5]))
    assert ckpt.pending_entries.keys() == {(4, "node-0")} and ckpt.anchors == (8,)
    # the bytes the Control service sends verify the same way
    assert read_checkpoint(path.read_bytes()).state.round == 5


def test_one_flipped_float_in_x_is_refused_naming_the_file_and_what_to_do(tmp_path):
    path = save(tmp_path, 5)
    flip_float(path)
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(tmp_path, RUN, N)
    message = str(refused.value)
    assert one_line(message) and str(path) in message and "checksum" in message
    assert "move it away" in message and "afresh" in message


def test_a_changed_metadata_value_is_refused_too(tmp_path):
    path = save(tmp_path, 5)
    data = path.read_bytes()
    assert data.count(b'"round":"5"') == 1
    path.write_bytes(data.replace(b'"round":"5"', b'"round":"7"'))
    with pytest.raises(CheckpointError, match="does not match its checksum"):
        read_checkpoint(path)


@pytest.mark.parametrize("damage", ["random-bytes", "truncated", "empty", "not-safetensors"])
def test_a_damaged_file_is_refused_in_one_line(tmp_path, damage):
    path = save(tmp_path, 5)
    data = bytearray(path.read_bytes())
    if damage == "random-bytes":
        at = tensor_offset(path, "omega")
        data[at : at + 16] = bytes(range(16))
    elif damage == "truncated":
        data = data[: len(data) - 10]
    elif damage == "empty":
        data = bytearray()
    else:
        data = bytearray(b"not a checkpoint at all, just text\n" * 4)
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(tmp_path, RUN, N)
    assert one_line(str(refused.value)) and str(path) in str(refused.value)


@pytest.mark.parametrize(("key", "said"), [
    ("run_fingerprint", "belongs to another run (run_fingerprint differs)"),
    ("model_fingerprint", "belongs to another run (model_fingerprint differs)"),
    ("node", "belongs to node 'node-2', not 'node-1'"),
])
def test_a_foreign_checkpoint_is_refused_and_not_replaced_by_the_previous(tmp_path, key, said):
    save(tmp_path, 4)  # this node's own, now the previous one
    other = {**RUN, key: "node-2" if key == "node" else "other"}
    path = save(tmp_path, 5, other)
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(tmp_path, RUN, N)
    assert said in str(refused.value) and str(path) in str(refused.value)
    assert one_line(str(refused.value))
    assert path.exists()  # a foreign file is the operator's to move, not the node's


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_values_are_refused_even_with_a_matching_checksum(tmp_path, bad):
    x = state(5).x.clone()
    x[2] = bad
    save(tmp_path, 5, x=x)
    with pytest.raises(CheckpointError, match=r"tensor x holds non-finite values") as refused:
        load_checkpoint(tmp_path, RUN, N)
    assert one_line(str(refused.value))


def test_a_damaged_newest_falls_back_to_the_previous_with_a_warning_naming_both(
        tmp_path, caplog):
    save(tmp_path, 4)
    path = save(tmp_path, 5)
    assert read_checkpoint(tmp_path / CHECKPOINT_PREV).state.round == 4
    flip_float(path)
    with caplog.at_level(logging.WARNING, logger="dacflnode"):
        ckpt = load_checkpoint(tmp_path, RUN, N)
    assert ckpt is not None and ckpt.state.round == 4
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert str(path) in warning and str(tmp_path / CHECKPOINT_PREV) in warning
    assert "round 4" in warning
    # the damaged file is kept aside; the next checkpoint does not push the good one out
    assert (tmp_path / CHECKPOINT_DAMAGED).exists()
    assert read_checkpoint(path).state.round == 4  # the previous one is the newest again
    save(tmp_path, 5)
    assert read_checkpoint(tmp_path / CHECKPOINT_PREV).state.round == 4
    assert read_checkpoint(path).state.round == 5


def test_a_missing_newest_falls_back_to_the_previous(tmp_path):
    """A stop between the two renames of a write leaves only the previous checkpoint."""
    save(tmp_path, 4)
    save(tmp_path, 5)
    (tmp_path / CHECKPOINT).unlink()
    ckpt = load_checkpoint(tmp_path, RUN, N)
    assert ckpt is not None and ckpt.state.round == 4


def test_both_damaged_is_refused_naming_both(tmp_path):
    save(tmp_path, 4)
    path = save(tmp_path, 5)
    flip_float(path)
    flip_float(tmp_path / CHECKPOINT_PREV, "omega")
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(tmp_path, RUN, N)
    message = str(refused.value)
    assert one_line(message) and str(path) in message
    assert CHECKPOINT_PREV in message and "move both" in message
    # the daemon logs it as one argument: short enough for the log guard to keep it whole, in
    # a state folder of a usual length (the test's own is as long as pytest makes it)
    usual = message.replace(str(tmp_path), "/var/lib/dacflnode/node-0")
    assert len(usual) <= logs.MAX_OBJECT_CHARS


def test_a_checkpoint_without_a_checksum_is_used_with_a_warning(tmp_path, caplog):
    """Files written before checksums existed: accepted, said so once."""
    s = state(3)
    meta = {**RUN, "round": "3", "tracked": "omega_prev"}
    save_file({"x": s.x, "omega": s.omega, "omega_prev": s.omega_prev},
              str(tmp_path / CHECKPOINT), metadata=meta)
    with caplog.at_level(logging.WARNING, logger="dacflnode"):
        ckpt = load_checkpoint(tmp_path, RUN, N)
    assert ckpt is not None and ckpt.state.round == 3 and not ckpt.verified
    assert any("without a checksum" in r.getMessage() for r in caplog.records)


def test_atomic_save_leaves_no_temporary_file_and_any_dtype_verifies(tmp_path):
    tensors = {"w": torch.randn(3, 2), "b": torch.zeros(2, dtype=torch.bfloat16),
               "n": torch.tensor(7), "mask": torch.tensor([True, False])}
    path = tmp_path / "final.safetensors"
    atomic_save(tensors, path, {"node": "n"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final.safetensors"]
    meta, back, verified = read_verified(path)
    assert verified and meta["node"] == "n"
    assert all(torch.equal(back[k], v) for k, v in tensors.items())
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    with pytest.raises(CorruptFile, match="checksum"):
        read_verified(bytes(data))


def test_a_write_that_does_not_read_back_is_an_io_error_and_keeps_the_old_file(
        tmp_path, monkeypatch):
    """Storage that loses a bit between the write and the read-back: an ``EIO`` the node's
    Persister retries, never a renamed damaged file."""
    path = save(tmp_path, 4)
    from safetensors.torch import save_file as real_save

    def lossy_save(tensors: dict[str, torch.Tensor], filename: str,
                   metadata: dict[str, str]) -> None:
        real_save(tensors, filename, metadata=metadata)
        data = bytearray(Path(filename).read_bytes())
        data[-1] ^= 0x01
        Path(filename).write_bytes(bytes(data))

    monkeypatch.setattr(files, "save_file", lossy_save)
    with pytest.raises(OSError) as failed:
        save(tmp_path, 5)
    assert failed.value.errno == errno.EIO and "did not read back" in str(failed.value)
    assert read_checkpoint(path).state.round == 4  # the newest is still the last good one
    assert not (tmp_path / CHECKPOINT_PREV).exists()


def test_the_newest_checkpoint_exists_at_every_moment_of_a_save(tmp_path, monkeypatch):
    """A node killed anywhere inside a save leaves a checkpoint at ``checkpoint.safetensors``:
    the one it replaces is hard-linked to ``checkpoint.prev.safetensors``, not renamed there."""
    save(tmp_path, 4)
    newest = tmp_path / CHECKPOINT
    seen: list[bool] = []
    real_replace = os.replace

    def watching(src: object, dst: object) -> None:
        seen.append(newest.exists())
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", watching)
    save(tmp_path, 5)
    assert seen and all(seen)
    assert read_checkpoint(newest).state.round == 5
    assert read_checkpoint(tmp_path / CHECKPOINT_PREV).state.round == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_PREV, CHECKPOINT]


def test_without_hard_links_the_replaced_checkpoint_is_renamed_to_the_previous(
        tmp_path, monkeypatch):
    """A file system without hard links (FAT on an SD card): the old newest is renamed to
    ``checkpoint.prev.safetensors`` instead, and both still hold the rounds they should."""
    save(tmp_path, 4)
    save(tmp_path, 5)

    def no_links(src: object, dst: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    save(tmp_path, 6)
    assert read_checkpoint(tmp_path / CHECKPOINT).state.round == 6
    assert read_checkpoint(tmp_path / CHECKPOINT_PREV).state.round == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_PREV, CHECKPOINT]
