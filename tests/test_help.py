"""Every script answers --help. The lab's tools and data.py answer before torch loads (torch takes seconds to import);
the core's two scripts and the lab's entry points may import it. Each is run as `python SCRIPT --help` would run it,
and sys.modules is read on the way out."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["lab/experiments.py", "data.py", "lab/pretrain.py", "lab/export.py", "lab/bench.py", "lab/corpus.py",
           "lab/probe.py"]
ENTRIES = [["train.py"], ["evaluate.py"], ["-m", "lab.train"], ["-m", "lab.evaluate"]]  # torch allowed

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


def help_of(entry):
    r = subprocess.run([sys.executable, *entry, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("usage:"), r.stdout + r.stderr
    return r.stdout


def options(text):
    return {line.split()[0].rstrip(",") for line in text.splitlines() if line.startswith("  --")}


@pytest.mark.parametrize("core, lab", [("train.py", "lab.train"), ("evaluate.py", "lab.evaluate")])
def test_the_core_help_names_the_labs_entry_point_and_the_lab_takes_the_cores_flags(core, lab):
    """The lab's entry point takes every flag of the core's script; the core's --help names the lab's command (and
    evaluate.py's, each flag the lab adds)."""
    ours, theirs = help_of([core]), help_of(["-m", lab])
    assert f"python -m {lab} --help" in ours and theirs.startswith(f"usage: python -m {lab}")
    assert options(ours) <= options(theirs)
    if core == "evaluate.py":
        assert all(f in ours for f in options(theirs) - options(ours)), ours
