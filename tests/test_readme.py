"""The README's commands, read from README.md and followed in order as a reader on a fresh clone would: no command
writes over what an earlier one wrote unless it says so (train.py --overwrite, export.py --force), so each block runs
as written after the ones above it, and the Quick start can be run again."""
import re
import shlex

from conftest import ROOT

WRITERS = {"train.py": ("--overwrite", "sg.safetensors"), "export.py": ("--force", None)}  # flag, default output


def bash_blocks(text):
    """[(section title, [(line number, command), ...])] of every ```bash block; continuation lines joined."""
    blocks = []
    for m in re.finditer(r"^([ \t]*)```bash\n(.*?)^[ \t]*```", text, re.M | re.S):
        first = text[:m.start(2)].count("\n") + 1
        section = ([""] + re.findall(r"^## (.+)$", text[:m.start()], re.M))[-1]
        lines, cmds, held = m.group(2).split("\n"), [], ""
        for i, line in enumerate(lines):
            held += line.strip()
            if held.endswith("\\"):
                held = held[:-1] + " "
                continue
            if held:
                cmds += [(first + i, part) for part in held.split("&&")]
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
    text = ("## Quick start\n\n```bash\npython train.py --model m --out a.safetensors --overwrite && python evaluate.py "
            "--ckpt a.safetensors\n```\n\n## More\n\n  ```bash\n  python train.py --loss sg \\\n    --seed 2  # b\n"
            "  python export.py a.safetensors st/  # x\n  torchrun train.py ...\n  ```\n")
    blocks = bash_blocks(text)
    assert [s for s, _ in blocks] == ["Quick start", "More"]
    assert [output_of(c) for _, c in blocks[0][1]] == [("train.py", "a.safetensors", True), None]
    assert [output_of(c) for _, c in blocks[1][1]] == [("train.py", "sg.safetensors", False),
                                                      ("export.py", "st", False), None]
    assert blocks[1][1][0][0] == 11  # the line the command starts on
