"""Per-round file writes: transient I/O errors are retried with a growing pause, a full disk or
a persistent failure raises PersistError saying what to do; a real full tmpfs and a real
exhaustion of file descriptors are recognised."""

from __future__ import annotations

import errno
import logging
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

from dacflnode.learning.files import atomic_save
from dacflnode.records.persist import Persister, PersistError, os_error

STATE = Path("/var/lib/dacfl/node-0")


class Failing:
    """A writer that fails ``times`` times with ``code``, then succeeds."""

    def __init__(self, times: int, code: int, filename: str | None = "/state/metrics.jsonl"):
        self.times = times
        self.code = code
        self.filename = filename
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        if self.calls <= self.times:
            raise OSError(self.code, os.strerror(self.code), self.filename)


def persister(pauses: list[float], *, tries: int = 3, pause: float = 1.0) -> Persister:
    return Persister("node-0", STATE, tries=tries, pause=pause, sleep=pauses.append)


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.EIO, errno.EAGAIN])
def test_a_transient_error_is_retried_with_a_growing_pause_and_logged(caplog, code):
    pauses: list[float] = []
    writer = Failing(2, code)
    p = persister(pauses, pause=0.5)
    with caplog.at_level(logging.WARNING, logger="dacflnode"):
        p.write("metrics line of round 3", writer)
    assert writer.calls == 3 and pauses == [0.5, 1.0] and p.retried == 2
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert all("metrics line of round 3" in line and "/state/metrics.jsonl" in line
               and os.strerror(code) in line for line in lines), lines


def test_an_error_that_outlasts_the_tries_raises_persist_error_naming_the_file():
    pauses: list[float] = []
    writer = Failing(10, errno.EIO)
    with pytest.raises(PersistError) as caught:
        persister(pauses, tries=3).write("checkpoint of round 9", writer)
    assert writer.calls == 3 and len(pauses) == 2
    err = caught.value
    assert err.errno == errno.EIO and err.path == "/state/metrics.jsonl"
    assert isinstance(err.__cause__, OSError)
    text = str(err)
    assert "checkpoint of round 9" in text and "/state/metrics.jsonl" in text
    assert "tried 3 times" in text and "Input/output error" in text


def test_running_out_of_descriptors_says_to_raise_the_open_files_limit():
    with pytest.raises(PersistError, match="open-files limit") as caught:
        persister([]).write("metrics line of round 1", Failing(10, errno.EMFILE))
    assert caught.value.errno == errno.EMFILE


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_raises_at_once_and_says_to_free_space_in_the_state_dir(code):
    pauses: list[float] = []
    writer = Failing(10, code)
    with pytest.raises(PersistError) as caught:
        persister(pauses).write("checkpoint of round 4", writer)
    assert writer.calls == 1 and pauses == []  # no retry can make room
    text = str(caught.value)
    assert caught.value.errno == code and "free space" in text and str(STATE) in text
    assert "tried" not in text


@pytest.mark.parametrize("code", [errno.EACCES, errno.EROFS])
def test_a_write_that_is_not_allowed_is_not_retried(code):
    writer = Failing(10, code)
    with pytest.raises(PersistError, match="writable"):
        persister([]).write("checkpoint of round 4", writer)
    assert writer.calls == 1


def test_an_error_without_a_file_name_names_the_state_dir():
    with pytest.raises(PersistError) as caught:
        persister([]).write("metrics line of round 2", Failing(1, errno.ENOSPC, filename=None))
    assert caught.value.path == str(STATE)


def test_a_safetensors_io_error_is_read_as_the_os_error_it_quotes():
    def save() -> None:
        raise SafetensorError("Error while serializing: I/O error: No space left on device "
                              "(os error 28)")

    err = os_error(SafetensorError("I/O error: Too many open files (os error 24)"))
    assert err is not None and err.errno == errno.EMFILE
    with pytest.raises(PersistError) as caught:
        persister([]).write("checkpoint of round 5", save)
    assert caught.value.errno == errno.ENOSPC


@pytest.mark.parametrize("exc", [ValueError("bad line"), SafetensorError("header too large")])
def test_an_error_that_is_not_an_io_error_propagates_untouched(exc):
    calls: list[int] = []

    def write() -> None:
        calls.append(1)
        raise exc

    with pytest.raises(type(exc)):
        persister([]).write("metrics line of round 1", write)
    assert calls == [1]


def test_at_least_one_try():
    with pytest.raises(ValueError, match="tries"):
        Persister("node-0", STATE, tries=0)


# ---------------------------------------------------------------- real failures


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs, mounted for this test (needs root and a kernel that lets us mount)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("tmpfs is a Linux file system")
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                          capture_output=True, text=True, timeout=20, check=False)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=20, check=False)


def test_a_checkpoint_on_a_full_tmpfs_raises_persist_error_at_once(tiny_tmpfs: Path):
    pauses: list[float] = []
    p = Persister("node-0", tiny_tmpfs, sleep=pauses.append)
    state = {"x": torch.zeros(100_000)}  # 400 KB into 64 KiB
    with pytest.raises(PersistError) as caught:
        p.write("checkpoint of round 1", lambda: atomic_save(state, tiny_tmpfs / "c", {}))
    assert caught.value.errno == errno.ENOSPC and pauses == []
    assert str(tiny_tmpfs) in str(caught.value)


def test_a_metrics_line_on_a_full_tmpfs_raises_persist_error(tiny_tmpfs: Path):
    path = tiny_tmpfs / "metrics.jsonl"

    def append() -> None:
        with path.open("a") as out:
            out.write("x" * 1000 + "\n")

    p = Persister("node-0", tiny_tmpfs, sleep=lambda _s: None)
    with pytest.raises(PersistError) as caught:
        for _ in range(200):  # 200 KB into 64 KiB
            p.write("metrics line", append)
    assert caught.value.errno == errno.ENOSPC and p.retried == 0


@pytest.fixture
def few_descriptors() -> Iterator[Callable[[], None]]:
    """Uses up this process's file descriptors; yields the function that frees them again."""
    if not hasattr(resource, "RLIMIT_NOFILE"):
        pytest.skip("no RLIMIT_NOFILE here")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []

    def free() -> None:
        while held:
            os.close(held.pop())

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("cannot count this process's descriptors (no /proc/self/fd)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
    try:
        try:
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError as exc:
            assert exc.errno == errno.EMFILE
        yield free
    finally:
        free()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_write_out_of_descriptors_succeeds_once_one_is_freed(
    tmp_path: Path, few_descriptors: Callable[[], None]
):
    path = tmp_path / "metrics.jsonl"
    seen: list[float] = []

    def pause(seconds: float) -> None:  # a connection closes while the node waits
        seen.append(seconds)
        few_descriptors()

    p = Persister("node-0", tmp_path, sleep=pause)
    p.write("metrics line of round 1", lambda: path.write_text("{}\n"))
    assert path.read_text() == "{}\n" and len(seen) == 1 and p.retried == 1
