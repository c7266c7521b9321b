"""The command line starts without the numerical stack: torch, grpc and ray load only in the
commands that need them (each check runs in a fresh interpreter, so nothing is loaded before)."""

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "grpc", "ray", "numpy", "matplotlib", "safetensors")


def _loaded_after(code: str) -> dict[str, bool]:
    """Which of HEAVY a fresh interpreter holds after running ``code``."""
    probe = (
        f"import sys\n{code}\n"
        f"print('\\n' + __import__('json').dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    loaded: dict[str, bool] = json.loads(proc.stdout.strip().splitlines()[-1])
    return loaded


def test_importing_the_command_line_loads_no_heavy_module():
    loaded = _loaded_after("import dacflnode.cli.main")
    assert [m for m, yes in loaded.items() if yes] == []


def test_the_top_level_help_loads_no_command_module():
    code = (
        "import contextlib, io\n"
        "from dacflnode.cli.main import main\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['--help'])\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('dacflnode.'))\n"
        "assert loaded == ['dacflnode.cli', 'dacflnode.cli.main'], loaded\n"
    )
    loaded = _loaded_after(code)
    assert [m for m, yes in loaded.items() if yes] == []


def test_the_help_of_every_command_loads_no_heavy_module():
    code = (
        "import contextlib, io\n"
        "from dacflnode.cli.main import cli, main\n"
        "for args in [['--help']] + [[name, '--help'] for name in cli.commands]:\n"
        "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "        main(args)\n"
    )
    loaded = _loaded_after(code)
    assert [m for m, yes in loaded.items() if yes] == []


def test_the_settings_schema_and_its_checks_load_without_torch():
    code = (
        "from dacflnode.config import RunConfig, config_from_mapping\n"
        "config_from_mapping({'dataset': 'synthetic', 'nodes': 4, 'topology': 'ring',"
        " 'compression': 'topk:0.1'})\n"
        "RunConfig().to_json()\n"
    )
    loaded = _loaded_after(code)
    assert not loaded["torch"] and not loaded["grpc"] and not loaded["ray"]


def test_status_without_a_daemon_fails_fast_without_torch():
    code = (
        "import contextlib, io\n"
        "from dacflnode.cli.main import main\n"
        "err = io.StringIO()\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stderr(err):\n"
        "    main(['status', '--target', '127.0.0.1:1'])\n"
        "assert 'no dacflnode daemon answers at 127.0.0.1:1' in err.getvalue(), err.getvalue()\n"
    )
    loaded = _loaded_after(code)
    assert loaded["grpc"]  # the command itself talks gRPC
    assert not loaded["torch"] and not loaded["ray"] and not loaded["numpy"]


@pytest.mark.slow
def test_status_with_a_peers_file_loads_no_torch(tmp_path):
    from dacflnode.cli.main import main

    try:
        main(["topology", "ring", "--nodes", "3", "--dataset", "synthetic", "--out",
              str(tmp_path)])
    except SystemExit as exc:
        assert exc.code in (0, None)
    peers = tmp_path / "node-0.yaml"
    code = (
        "import contextlib, io\n"
        "from dacflnode.cli.main import main\n"
        "err = io.StringIO()\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stderr(err):\n"
        f"    main(['status', '--peers', {str(peers)!r}, '--target', '127.0.0.1:1'])\n"
        "assert 'no dacflnode daemon answers' in err.getvalue(), err.getvalue()\n"
    )
    loaded = _loaded_after(code)
    assert loaded["grpc"]
    assert not loaded["torch"] and not loaded["ray"]
