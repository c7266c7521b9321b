"""The import contract of the command line ("Commands never import the module that assembles
them", pyproject.toml) names every module of dacflnode/cli, so a command module cannot be left
outside it."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = "Commands never import the module that assembles them"


def contract_modules() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"]
                   if c["name"] == CONTRACT]
    assert contract["containers"] == ["dacflnode.cli"]
    return [name.strip() for layer in contract["layers"] for name in layer.split("|")]


def test_the_cli_contract_names_every_module_of_the_cli_once():
    modules = sorted(p.stem for p in (ROOT / "dacflnode" / "cli").glob("*.py")
                     if p.stem != "__init__")
    named = contract_modules()
    assert sorted(named) == modules
