"""The README, read from README.md. Its commands followed in order as a reader on a fresh clone would: no command
writes over what an earlier one wrote unless it says so (train.py --overwrite, export.py --force), so each block runs
as written after the ones above it, and the Quick start can be run again. Its "Use it from Python" snippet, run
exactly as written in a folder where quickstart.safetensors is a checkpoint of the tiny random BERT (the vectors are
random: that it runs and prints a 3 x 3 matrix of cosines with 1 on the diagonal is the point), and from a script kept
outside the clone as the README says. What it promises, checked: the answer to "does it reproduce the paper?" near the
top, in results/raw/README.md's numbers and with the loss it claims; whose numbers each table holds; the machine and
load of every time; the results READMEs' figures equal to their records, told by date, never by session or issue."""
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
            "  python -m lab.export a.safetensors st/  # x\n  torchrun train.py ...\n  ```\n")
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


# -----------------------------------------------------------------------------
# what the README promises, checked (issue 73 items 11, 15, 16)

def section(title, doc="README.md"):
    text = (ROOT / doc).read_text()
    assert f"\n## {title}\n" in text, f"{doc}: no section '## {title}'"
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_a_script_outside_the_clone_runs_as_the_readme_says(tmp_path):
    """The example kept in a script outside the clone and run from a folder that holds the checkpoint, as a newcomer
    does: without the clone on its path it fails with ModuleNotFoundError (Python looks in the script's folder, not
    the one it runs in), and runs with the README's PYTHONPATH command and with its sys.path.insert line. The
    checkpoint records mean pooling: the printed cosines are mean-pooled vectors' (encode pools as it records)."""
    import bert
    text = " ".join(section("Use it from Python").split())
    command = re.search(r"`(PYTHONPATH=/path/to/clone python my_script\.py)`", text)
    insert = re.search(r'`(import sys; sys\.path\.insert\(0, "/path/to/clone"\))`', text)
    assert command and insert, "the README names no exact way to put the clone on a script's path"
    assert "ModuleNotFoundError: No module named 'bert'" in text
    code = snippet()
    here, outside = tmp_path / "work", tmp_path / "scripts"
    here.mkdir(), outside.mkdir()
    folder = tiny_model_folder(tmp_path / "tiny", words=["a", "man", "is", "playing", "guitar", "."])
    model, tok = bert.Bert.from_pretrained(folder), bert.load_tokenizer(folder)
    save_model(here / "quickstart.safetensors", model, {"tokenizer": tok.to_str(), "pooling": "mean"})
    sents = re.search(r"sentences = (\[.*?\])\n", code).group(1)
    x = bert.encode(model, tok, eval(sents), "mean")
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    want = np.round(x @ x.T, 3)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    (outside / "my_script.py").write_text(code)
    r = subprocess.run([sys.executable, str(outside / "my_script.py")], cwd=here, capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 1 and "ModuleNotFoundError: No module named 'bert'" in r.stderr, r.stderr
    r = subprocess.run(["bash", "-c", command.group(1).replace("/path/to/clone", shlex.quote(str(ROOT)))
                        .replace("python my_script.py", f"{shlex.quote(sys.executable)} {outside / 'my_script.py'}")],
                       cwd=here, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    got = np.array([[float(v) for v in re.findall(r"-?\d+\.\d*", row)] for row in r.stdout.strip().splitlines()])
    assert np.allclose(got, want, atol=1.5e-3), (got, want)
    (outside / "my_script.py").write_text(insert.group(1).replace("/path/to/clone", str(ROOT)) + "\n" + code)
    r = subprocess.run([sys.executable, str(outside / "my_script.py")], cwd=here, capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0 and r.stdout == subprocess.run(
        ["bash", "-c", f"PYTHONPATH={shlex.quote(str(ROOT))} {shlex.quote(sys.executable)} {outside / 'my_script.py'}"],
        cwd=here, capture_output=True, text=True, env=env, timeout=120).stdout, r.stderr


def test_the_readme_answers_whether_it_reproduces_the_paper():
    """Near the top, before the Quick start: what reproduces, what cannot here, what the raw-BERT stand-in shows, in
    the numbers of results/raw/README.md's answer."""
    text = (ROOT / "README.md").read_text()
    heading = "## Does it reproduce the paper?"
    assert heading in text and text.index(heading) < text.index("## Quick start"), "no such section before the Quick start"
    assert text[:text.index(heading)].count("\n") < 25, "the section should sit near the top"
    body = " ".join(section("Does it reproduce the paper?").split())
    for claim in ("equations", "official code's formulation", "1e-12", "independent",
                  "SentEval's transfer protocol bit for bit", "protocol", "bert-base-uncased", "GPU", "offline", "raw-bert-mini-4", "48.29 +- 0.23",
                  "+2.2 over mean pooling", "+11.1 over [CLS]", "a tenth", "SBERT-base"):
        assert claim in body, claim
    answer = " ".join(section("The answer, first", "results/raw/README.md").split())
    assert "48.29 +- 0.23" in answer and "by 2.2 points" in answer and "(+11.1)" in answer


def test_sg_opt_equals_the_official_codes_formulation_to_1e_12():
    """The README's claim: sg_loss.sg_opt (one fused matrix computation) and reference.official_sg_opt (the official
    code's per-layer structure), in float64, values and gradients, to 1e-12."""
    import torch

    from lab import reference
    import sg_loss
    torch.manual_seed(0)
    for b, L, p in [(2, 1, 8), (16, 13, 64), (37, 25, 16), (7, 5, 300)]:
        for tau in (0.01, 0.05, 1.0):
            c = torch.randn(b, p, dtype=torch.float64, requires_grad=True)
            h = torch.randn(b, L, p, dtype=torch.float64, requires_grad=True)
            ours = sg_loss.sg_opt(c, h, tau)
            g_ours = torch.autograd.grad(ours, (c, h))
            theirs = reference.official_sg_opt(c, h, tau)
            g_theirs = torch.autograd.grad(theirs, (c, h))
            torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=0)
            for a, r in zip(g_ours, g_theirs):
                torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12 * r.abs().max().item())


def test_the_headline_table_labels_whose_numbers_are_whose():
    """MiniLM's numbers are labelled MiniLM's, the paper column BERT-base's; the raw table's paper column too."""
    results = section("Results")
    head = next(line for line in results.splitlines() if line.startswith("| method"))
    cells = [c.strip() for c in head.strip("|").split("|")]
    assert "MiniLM" in cells[0] and "BERT-base" in cells[-1], cells
    assert "Every column is MiniLM's but the last" in " ".join(results.split())
    raw = next(line for line in results.splitlines() if line.startswith("| row |"))
    assert raw.rstrip().endswith("| paper, BERT-base |"), raw


def test_every_speed_and_time_figure_names_its_machine_and_load():
    """The quick start's minutes, the tests' minutes and the speed line say on what machine and whether it was idle."""
    text = " ".join((ROOT / "README.md").read_text().split())
    quick = text[text.index("**~6 min to the STS table**"):][:400]
    assert "idle 2-core AMD EPYC" in quick and "27 min on a loaded 2-core Xeon" in quick, quick
    assert "~4-8 min idle, 10 min loaded" in quick, quick
    speed = text[text.index("**Speed**"):][:300]
    assert "idle 2-core AMD EPYC" in speed and "no bf16 unit" in speed, speed
    assert "a 2-core AVX2 EPYC, fp32)" not in text


REPORTS = {"Table 1 as the paper ran it": "results/full/table1/results.md"}


def table_rows(md, first_header):
    """The rows of the markdown table whose header row starts with `| first_header |`, as lists of cells."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def test_the_results_texts_figures_are_their_records():
    """results/README.md's Table 1 time table is its report's (the whitening row said 1.9 min and 5.7 s, a superseded
    run's, where the record says 3.8 and 10.0), and the leaderboard's prose gives the leaderboard's fit minutes."""
    results = (ROOT / "results/README.md").read_text()
    part = results.split("## Table 1 as the paper ran it", 1)[1].split("\n## ", 1)[0]
    report = (ROOT / REPORTS["Table 1 as the paper ran it"]).read_text()
    assert table_rows(part, "variant | train (min)") == table_rows(report, "variant | train (min)")
    board = {r[0]: r for r in table_rows((ROOT / "results/full/leaderboard/results.md").read_text(), "method")}
    prose = " ".join(results.split("## The leaderboard (full recipe)", 1)[1].split("\n## ", 1)[0].split())
    for method in ("flow", "whitening"):
        assert f"{method} ({board[method][11]} min)" in prose, (method, board[method][11])


HISTORY = re.compile(r"\bissue \d+|\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|"
                     r"twelfth|thirteenth|fourteenth|fifteenth|this|that|the|the same|a later|another|a) session\b|"
                     r"\bcommits? [0-9a-f]{7}\b|\bcode of [0-9a-f]{7}\b|\b[0-9a-f]{7}'s\b", re.I)


def test_the_results_readmes_say_what_happened_and_when_not_which_session_or_issue():
    """A reader has no issue numbers, session counts or commit hashes: dates, times and commands instead."""
    found = [f"{doc}:{n}: {m.group(0)}" for doc in ("results/README.md", "results/raw/README.md")
             for n, line in enumerate((ROOT / doc).read_text().splitlines(), 1) for m in HISTORY.finditer(line)]
    assert not found, "\n".join(found)
    for doc in ("results/README.md", "results/raw/README.md"):  # a short hash beside no sha256 ellipsis
        text = (ROOT / doc).read_text()
        hashes = [h for h in re.findall(r"(?<![`\w])[0-9a-f]{7}(?![\w…])", text) if re.search(r"\d", h) and
                  re.search(r"[a-f]", h)]
        assert not hashes, (doc, hashes)
