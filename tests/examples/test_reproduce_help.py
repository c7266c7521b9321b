"""examples/reproduce_paper/reproduce.py --help: every option says what it does."""

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "reproduce_paper" / "reproduce.py"


def _parser() -> argparse.ArgumentParser:
    import importlib.util

    spec = importlib.util.spec_from_file_location("reproduce_help", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    parser: argparse.ArgumentParser = module.build_parser()
    return parser


def test_every_option_of_reproduce_has_a_help_text():
    actions = [a for a in _parser()._actions if a.option_strings]
    assert len(actions) > 10
    assert [a.option_strings[0] for a in actions if not (a.help or "").strip()] == []


def test_only_lists_the_settings_the_script_runs():
    only = next(a for a in _parser()._actions if "--only" in a.option_strings)
    assert only.help is not None
    assert "static-dense-iid" in only.help and "varying-sparse-shards" in only.help


@pytest.mark.slow  # a child process
def test_reproduce_help_answers_without_loading_the_simulator():
    probe = (
        "import runpy, sys, contextlib, io\n"
        f"sys.argv = [{str(SCRIPT)!r}, '--help']\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        f"    runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
        "print('torch' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False"
