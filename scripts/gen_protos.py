#!/usr/bin/env python3
"""Regenerate the committed protobuf/gRPC modules in dacflnode/_proto from protos/.

    python scripts/gen_protos.py            # rewrite dacflnode/_proto
    python scripts/gen_protos.py --check    # exit 1 if the committed files are stale

The generated code is committed (so installing needs no code generation) and the test suite runs
``--check``: a change to a .proto file without regenerating fails CI. The output depends on the
grpcio-tools version, which pyproject.toml pins for that reason.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
TARGET = ROOT / "dacflnode" / "_proto"
PACKAGE = "dacflnode._proto"


def generate(out: Path) -> dict[str, str]:
    files = sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = ["protoc", f"-I{PROTOS}", f"-I{include}", f"--python_out={out}",
            f"--pyi_out={out}", f"--grpc_python_out={out}", *files]
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
    if args.check:
        stale = []
        for name, text in fresh.items():
            path = TARGET / name
            current = path.read_text() if path.exists() else ""
            if current != text:
                stale.append(name)
                sys.stdout.writelines(difflib.unified_diff(
                    current.splitlines(True), text.splitlines(True), f"a/{name}", f"b/{name}"))
        extra = {str(p.relative_to(TARGET)) for p in TARGET.rglob("*.py*")} - set(fresh)
        stale += sorted(extra)
        if stale:
            print(f"stale generated files: {', '.join(stale)}; run scripts/gen_protos.py")
            return 1
        print("generated code is up to date")
        return 0
    for name, text in fresh.items():
        path = TARGET / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(f"wrote {len(fresh)} files to {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
