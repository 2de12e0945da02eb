"""The README, read from README.md. Its commands followed in order as a reader on a fresh clone would: no command
writes over what an earlier one wrote unless it says so (train.py --overwrite, export.py --force), so each block runs
as written after the ones above it, and the Quick start can be run again. Its "Use it from Python" snippet, run
exactly as written in a folder where quickstart.safetensors is a checkpoint of the tiny random BERT (the vectors are
random: that it runs and prints a 3 x 3 matrix of cosines with 1 on the diagonal is the point)."""
import os
import re
import shlex
import subprocess
import sys

import numpy as np

from conftest import ROOT, save_model, tiny_model_folder

WRITERS = {"train.py": ("--overwrite", "sg.safetensors"), "export.py": ("--force", None)}  # flag, default output


def bash_blocks(text):
    """[(section title, [(line number, command), ...])] of every ```bash block; continuation lines joined, each command
    numbered by the line it starts on."""
    blocks = []
    for m in re.finditer(r"^([ \t]*)```bash\n(.*?)^[ \t]*```", text, re.M | re.S):
        first = text[:m.start(2)].count("\n") + 1
        section = ([""] + re.findall(r"^## (.+)$", text[:m.start()], re.M))[-1]
        lines, cmds, held, start = m.group(2).split("\n"), [], "", 0
        for i, line in enumerate(lines):
            start = start if held else i
            held += line.strip()
            if held.endswith("\\"):
                held = held[:-1] + " "
                continue
            if held:  # a line ending in && chains on to the next (the Quick start): nothing after it on this line
                cmds += [(first + start, part) for part in held.split("&&") if part.strip()]
            held = ""
        blocks.append((section, cmds))
    return blocks


def output_of(command):
    """(script, what it writes, whether it may replace it) of a train.py / export.py command; None for any other, and
    for a pattern ('...' in it) or a run that writes nothing (--eval-only)."""
    words = shlex.split(command, comments=True)
    script = next((w for w in words if w in WRITERS), None)
    if script is None or "..." in words or "--eval-only" in words:
        return None
    flag, default = WRITERS[script]
    args = words[words.index(script) + 1:]
    if script == "train.py":
        out = args[args.index("--out") + 1] if "--out" in args else default
    else:  # export.py CHECKPOINT OUT_DIR
        out = [a for a in args if not a.startswith("-")][1]
    return script, out.rstrip("/"), flag in args


def test_no_command_writes_over_an_earlier_ones_output():
    blocks = bash_blocks((ROOT / "README.md").read_text())
    quick = [cmds for section, cmds in blocks if section == "Quick start"]
    assert quick, "README.md: no ```bash block under ## Quick start"
    writes = [(n, c, o) for _, cmds in blocks + [("Quick start, again", quick[0])] for n, c in cmds
              if (o := output_of(c))]
    assert any(o[0] == "train.py" for _, _, o in writes)
    seen, clashes = {}, []
    for n, command, (script, out, may_replace) in writes:
        if out in seen and not may_replace:
            clashes.append(f"README.md:{n}: `{command.strip()}` writes {out}, as line {seen[out]} did: give it another "
                           f"name, or {WRITERS[script][0]}")
        seen.setdefault(out, n)
    assert not clashes, "\n".join(clashes)


def test_the_reader_is_parsed():
    """The parser of the test above, on a made-up README: continuations, &&, comments, defaults, patterns."""
    text = ("## Quick start\n\n```bash\npython train.py --model m --out a.safetensors --overwrite &&\npython evaluate.py "
            "--ckpt a.safetensors\n```\n\n## More\n\n  ```bash\n  python train.py --loss sg \\\n    --seed 2  # b\n"
            "  python export.py a.safetensors st/  # x\n  torchrun train.py ...\n  ```\n")
    blocks = bash_blocks(text)
    assert [s for s, _ in blocks] == ["Quick start", "More"]
    assert [output_of(c) for _, c in blocks[0][1]] == [("train.py", "a.safetensors", True), None]
    assert [output_of(c) for _, c in blocks[1][1]] == [("train.py", "sg.safetensors", False),
                                                      ("export.py", "st", False), None]
    assert [n for n, _ in blocks[0][1]] == [4, 5] and blocks[1][1][0][0] == 11  # the line each command starts on


def snippet():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Use it from Python", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block, "README.md: the 'Use it from Python' section has no ```python block"
    return block.group(1)


def test_the_python_example_runs_as_written(tmp_path):
    import bert
    code = snippet()
    assert len(code.strip().splitlines()) <= 12, "the example should stay short"
    folder = tiny_model_folder(tmp_path / "tiny", words=["a", "man", "is", "playing", "guitar", "."])
    model, tok = bert.Bert.from_pretrained(folder), bert.load_tokenizer(folder)
    save_model(tmp_path / "quickstart.safetensors", model, {"tokenizer": tok.to_str()})
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    cos = np.array([[float(v) for v in re.findall(r"-?\d+\.\d*", row)] for row in r.stdout.strip().splitlines()])
    assert cos.shape == (3, 3) and np.allclose(np.diag(cos), 1, atol=1e-3) and np.allclose(cos, cos.T), r.stdout


def test_the_python_example_names_the_checkpoints_path_and_fails_in_one_line(tmp_path):
    """Run from a folder without the checkpoint (issue 53, 13), the example says why in one line: the LoadError names
    the folder the relative path was read from and says to give the checkpoint's own path; the example itself says
    its path is the checkpoint's."""
    code = snippet()
    assert "the checkpoint's path" in code
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and last == (f"checkpoint.LoadError: quickstart.safetensors not found in the current folder "
                                          f"{tmp_path}: a relative path is read from where Python runs; give the "
                                          "checkpoint's own path (absolute, or relative to this folder)"), r.stderr
    assert "checkpoint.py" not in r.stderr  # the loader's frames are not chained on


def test_the_readme_stays_a_guide():
    """DESIGN.md: README.md at most 300 lines; results tables live in results/README.md, the code-vs-paper table in
    docs/fidelity.md."""
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= 300, f"README.md has {n} lines: move tables or history to results/README.md or docs/"


DOCS = ["README.md", "docs/fidelity.md", "weights/README.md", "results/README.md", "results/raw/README.md"]


def without_code(md):
    """Markdown less its fenced blocks and code spans (a `# comment` is no heading, `[X](...)` in code no link)."""
    md = re.sub(r"^[ \t]*```.*?^[ \t]*```", "", md, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", md)


def anchors(md):
    """The ids GitHub gives a file's headings: lower case, punctuation dropped, spaces as hyphens."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#{1,6} (.+)$", without_code(md), re.M)}


def test_every_link_resolves():
    """Each relative link (and image) of the README and the docs it links to names a file that exists, and a heading
    that exists when it has a #anchor."""
    broken = []
    for doc in DOCS:
        path = ROOT / doc
        for target in re.findall(r"\]\(([^)\s]+)\)", without_code(path.read_text())):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = path.parent / file if file else path
            if not dest.exists():
                broken.append(f"{doc}: ({target}): no {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
                broken.append(f"{doc}: ({target}): no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def test_anchors_are_githubs():
    assert anchors("## Pretrain a raw BERT\n```bash\n# not a heading\n```\n### SentEval transfer tasks (evaluate.py)\n"
                   "## Table 1, capped at 300 steps\n") == {"pretrain-a-raw-bert", "senteval-transfer-tasks-evaluatepy",
                                                           "table-1-capped-at-300-steps"}
