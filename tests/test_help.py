"""Every script's --help answers before torch loads (torch takes seconds to import; --help should not): each is run as
`python SCRIPT --help` would run it, and sys.modules is read on the way out."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["train.py", "evaluate.py", "lab/experiments.py", "data.py", "lab/pretrain.py", "lab/export.py", "lab/bench.py",
           "lab/corpus.py", "lab/probe.py"]

PROBE = """
import runpy, sys
sys.path.insert(0, {root!r})
sys.argv = [{script!r}, "--help"]
try:
    runpy.run_path({script!r}, run_name="__main__")
    code = 0
except SystemExit as e:
    code = e.code
print("exit", code, "torch", "torch" in sys.modules)
"""


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_does_not_import_torch(script):
    r = subprocess.run([sys.executable, "-c", PROBE.format(root=str(ROOT), script=str(ROOT / script))], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "usage:" in r.stdout, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == "exit 0 torch False", r.stdout[-300:]
