"""Modules small enough to read in one sitting: no module of the package over 600 lines
(the generated protobuf code aside), and the runner that orders a node's steps under 450."""

from __future__ import annotations

import ast
from pathlib import Path

import dacflnode

PACKAGE = Path(dacflnode.__file__).parent
MAX_MODULE_LINES = 600
MAX_RUNNER_LINES = 450


def test_no_module_of_the_package_is_over_600_lines():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py")
            if "_proto" not in p.parts
            and (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_the_node_runner_class_is_under_450_lines():
    tree = ast.parse((PACKAGE / "protocol" / "runner.py").read_text())
    (runner,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "NodeRunner"]
    assert runner.end_lineno is not None
    assert runner.end_lineno - runner.lineno + 1 <= MAX_RUNNER_LINES
