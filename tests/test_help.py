"""Every script's --help answers before torch loads (torch takes seconds to import; --help should not): each is run as
`python SCRIPT --help` would run it, and sys.modules is read on the way out."""
import ast
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


def test_evaluate_help_names_every_flag_of_the_lab():
    """evaluate.py --help is the core's (no torch: above), its epilog naming each flag that evaluate.py hands over to
    the lab (evaluate.LAB_FLAGS); with one of them, --help is the lab's whole help, every flag with its own text."""
    tree = ast.parse((ROOT / "evaluate.py").read_text())
    lab = next(ast.literal_eval(n.value) for n in tree.body
               if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "LAB_FLAGS")
    core = subprocess.run([sys.executable, "evaluate.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert core.returncode == 0 and all(f in core.stdout for f in lab), core.stdout
    whole = subprocess.run([sys.executable, "evaluate.py", "--layerwise", "--help"], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    assert whole.returncode == 0 and whole.stdout.startswith("usage:"), whole.stderr
    options = [line.split()[0].rstrip(",") for line in whole.stdout.splitlines() if line.startswith("  --")]
    assert set(lab) | {"--model", "--ckpt", "--tasks", "--json", "--batch-size"} <= set(options), options
