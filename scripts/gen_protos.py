#!/usr/bin/env python3
"""Regenerate the committed protobuf/gRPC modules and their type stubs in dacflnode/_proto.

    python scripts/gen_protos.py            # rewrite dacflnode/_proto
    python scripts/gen_protos.py --check    # exit 1 if the committed files are stale
    python scripts/gen_protos.py --check --target DIR   # the same for a copy of the package

The generated code is committed (so installing needs neither grpcio-tools nor a code generation
step) and the test suite runs ``--check``: a change to a .proto file without regenerating fails CI.
Next to each module goes a typed stub written by mypy-protobuf (``*_pb2.pyi`` for the messages,
``*_pb2_grpc.pyi`` for the stubs and servicers), so ``mypy --strict`` checks every use of the
generated classes. The output depends on the grpcio-tools and mypy-protobuf versions, which the
``dev`` extra of pyproject.toml pins for that reason.
"""

from __future__ import annotations

import argparse
import difflib
import re
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
TARGET = ROOT / "dacflnode" / "_proto"
PACKAGE = "dacflnode._proto"


def plugin(name: str) -> str:
    """Path of a protoc plugin installed by mypy-protobuf.

    It is looked up next to the running interpreter first, so ``.venv/bin/python
    scripts/gen_protos.py`` works without the virtual environment on ``PATH``.
    """
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} not found: install the dev extra (pip install -e '.[dev]')")
    return found


def generate(out: Path) -> dict[str, str]:
    """Run protoc with the Python, gRPC and mypy-protobuf generators into ``out``.

    Returns every generated file (path relative to the package -> text), the package's empty
    ``__init__.py`` files included, with the imports between generated modules made absolute.
    """
    files = sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTOS}",
        f"-I{include}",
        f"--plugin=protoc-gen-mypy={plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out=quiet:{out}",
        f"--mypy_grpc_out=quiet:{out}",
        *files,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    result: dict[str, str] = {}
    for path in sorted(out.rglob("*.py*")):
        text = path.read_text()
        # generated modules import each other as top-level "dacfl.v1": make that package-relative
        text = re.sub(r"^from dacfl\.v1 import", f"from {PACKAGE}.dacfl.v1 import", text,
                      flags=re.MULTILINE)
        result[str(path.relative_to(out))] = text
    for pkg in ("", "dacfl", "dacfl/v1"):
        result[f"{pkg}/__init__.py".lstrip("/")] = ""
    return result


def committed(target: Path) -> set[str]:
    """The generated files under ``target`` (modules and stubs; caches and the like are not)."""
    return {str(p.relative_to(target)) for p in target.rglob("*")
            if p.is_file() and p.suffix in {".py", ".pyi"}}


def stale_files(fresh: dict[str, str], target: Path) -> list[str]:
    """Names under ``target`` that differ from ``fresh``, are missing, or are no longer generated.

    Prints a unified diff of each differing file so that a CI log shows what changed.
    """
    stale = []
    for name, text in fresh.items():
        path = target / name
        if not path.is_file():
            stale.append(name)
            continue
        current = path.read_text()
        if current != text:
            stale.append(name)
            sys.stdout.writelines(difflib.unified_diff(
                current.splitlines(True), text.splitlines(True), f"a/{name}", f"b/{name}"))
    return stale + sorted(committed(target) - set(fresh))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    ap.add_argument("--target", type=Path, default=TARGET,
                    help="folder of the generated package (default: %(default)s)")
    args = ap.parse_args()
    target: Path = args.target
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
    if args.check:
        stale = stale_files(fresh, target)
        if stale:
            print(f"stale generated files: {', '.join(stale)}; run scripts/gen_protos.py")
            return 1
        print("generated code is up to date")
        return 0
    for name in committed(target) - set(fresh):
        (target / name).unlink()
    for name, text in fresh.items():
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(f"wrote {len(fresh)} files to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
