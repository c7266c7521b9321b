"""A node's existing state folder that other users may enter is closed at start, with one
warning naming it and its old mode; one the node may not change is warned about with the fix."""

from __future__ import annotations

import logging
import os
import stat
from unittest import mock

from dacflnode.daemon.service import guard_state_dir


def test_a_state_folder_open_to_others_is_closed_to_them_with_one_warning(tmp_path, caplog):
    state = tmp_path / "node-0"
    state.mkdir()
    state.chmod(0o777)
    with caplog.at_level(logging.WARNING, logger="dacflnode.daemon.service"):
        guard_state_dir(state, "node-0")
    assert stat.S_IMODE(state.stat().st_mode) == 0o750
    assert [(getattr(r, "node", None), r.getMessage()) for r in caplog.records] == [
        ("node-0", f"the state folder {state} was open to other users (mode 777): set to 750")]


def test_a_private_state_folder_is_left_alone_silently(tmp_path, caplog):
    state = tmp_path / "node-0"
    state.mkdir(mode=0o700)
    with caplog.at_level(logging.WARNING, logger="dacflnode.daemon.service"):
        guard_state_dir(state, "node-0")
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert caplog.records == []


def test_a_state_folder_the_node_may_not_change_is_warned_about_with_the_chmod(tmp_path,
                                                                             caplog):
    state = tmp_path / "node-0"
    state.mkdir()
    state.chmod(0o775)
    refused = PermissionError(1, os.strerror(1))
    with (mock.patch("dacflnode.filemodes.os.chmod", side_effect=refused),
          caplog.at_level(logging.WARNING, logger="dacflnode.daemon.service")):
        guard_state_dir(state, "node-0")
    (message,) = [r.getMessage() for r in caplog.records]
    assert "is open to other users (mode 775) and cannot be changed" in message
    assert f"`chmod 700 {state}`" in message
