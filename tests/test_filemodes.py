"""Files and folders get their modes whatever the umask: made under ``umask 000`` (the issue's
probe), nothing is open to other users, existing files written again get their mode back, and a
rotating ``daemon.log`` starts every new file with its mode."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from dacflnode import logs
from dacflnode.filemodes import (
    DIR_MODE,
    LOG_MODE,
    SECRET_MODE,
    make_dir,
    open_text,
    prepare_file,
    tighten_dir,
    write_bytes,
    write_text,
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_000() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_make_dir_gives_every_folder_it_makes_0700_and_leaves_existing_ones(tmp_path, umask_000):
    existing = tmp_path / "shared"
    existing.mkdir(mode=0o755)
    made = make_dir(existing / "a" / "b" / "c")
    assert made.is_dir()
    for folder in (existing / "a", existing / "a" / "b", made):
        assert mode(folder) == DIR_MODE, folder
    assert mode(existing) == 0o755
    assert make_dir(made) == made  # again: nothing to do


def test_a_file_where_a_folder_should_be_is_an_error(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OSError):
        make_dir(tmp_path / "f" / "sub")


def test_written_files_have_their_mode_from_the_start_and_again_when_rewritten(tmp_path,
                                                                               umask_000):
    secret, log_file, prepared = tmp_path / "k", tmp_path / "log", tmp_path / "tmp"
    write_bytes(secret, b"key", SECRET_MODE)
    write_text(log_file, "line\n", LOG_MODE)
    prepare_file(prepared, SECRET_MODE)
    assert (mode(secret), mode(log_file), mode(prepared)) == (SECRET_MODE, LOG_MODE, SECRET_MODE)
    for path in (secret, log_file):
        path.chmod(0o666)  # left open by an older version
    write_bytes(secret, b"new", SECRET_MODE)
    with open_text(log_file, LOG_MODE, append=True) as out:
        out.write("more\n")
    assert (mode(secret), mode(log_file)) == (SECRET_MODE, LOG_MODE)
    assert secret.read_bytes() == b"new" and log_file.read_text() == "line\nmore\n"


@pytest.mark.parametrize(("before", "after"), [(0o777, 0o750), (0o775, 0o750), (0o755, 0o750),
                                               (0o770, 0o750), (0o701, 0o700)])
def test_tighten_dir_takes_group_write_and_other_access_away(tmp_path, before, after):
    folder = tmp_path / "state"
    folder.mkdir()
    folder.chmod(before)
    assert tighten_dir(folder) is True
    assert mode(folder) == after


@pytest.mark.parametrize("private", [0o700, 0o750])
def test_tighten_dir_leaves_a_folder_only_the_owner_and_a_reading_group_may_enter(tmp_path,
                                                                                  private):
    folder = tmp_path / "state"
    folder.mkdir()
    folder.chmod(private)
    assert tighten_dir(folder) is False
    assert mode(folder) == private


def test_every_file_of_a_rotating_daemon_log_is_0640(tmp_path, umask_000, monkeypatch):
    monkeypatch.setattr(logs.handlers, "LOG_FILE_BYTES", 2000)
    logger = logging.getLogger("dacflnode.test_filemodes")
    logger.propagate = False
    logs.install(logger, tmp_path, console=False)
    try:
        for k in range(200):  # each its own text: the guard's rate limit is per format string
            text = f"line {k} " + "x" * 50
            logger.warning(text)
    finally:
        for handler in logger.handlers[:]:
            handler.close()
            logger.removeHandler(handler)
    files = sorted(tmp_path.glob("daemon.log*"))
    assert len(files) == 1 + logs.LOG_FILE_BACKUPS  # it rotated
    assert {f.name: mode(f) for f in files} == {f.name: LOG_MODE for f in files}
