import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_committed_generated_code_matches_the_proto_files():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--check"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
