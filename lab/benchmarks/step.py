"""bench.py step, memory and ddp: one SG-OPT training step as train.py runs it vs the same step from
transformers.BertModel with the official formulation of the loss and of the regulariser (a Python loop of
per-parameter norms): time, the step by phase, the achieved GFLOP/s against this machine's GEMM rate; the peak memory
of a few of those steps; train.py itself on 1 process vs torchrun with 2 gloo processes."""
import contextlib
import gc
import io
import itertools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

import bert
import runtime
import data
from lab import reference
import sg_loss
import train
from lab.benchmarks.common import (ROOT, WORDS, cuda_sync, get_device, peak_cuda_mb, peak_rss_mb, skip, step_setting,
                               time_alternating, verdict)


# -----------------------------------------------------------------------------
# step


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
    cfg = train.get_args(flags)  # the core's SG-OPT
    # steps counted from the end of the warm-up, so the lr is near its peak; the reference follows the same schedule
    first = math.ceil(0.1 * cfg.max_steps)
    counter = itertools.count(first)
    if impl == "sgbert":
        with contextlib.redirect_stdout(io.StringIO()):  # build_run's description of the run
            run = train.build_run(cfg, bert.Bert.from_pretrained(path), bert.load_tokenizer(path), ["a", "b"], None, device)

        def run_steps():
            with runtime.bf16_products(cfg.precision, device.type):  # as train.py holds it: bf16 without a bf16 unit
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
    saved = run.bert_F.forward, sg_loss.sg_opt, run.optimizer.step, sg_loss.add_weight_distance_grad_
    run.bert_F.forward = timed("BERT_F fwd", run.bert_F.forward)
    sg_loss.sg_opt = timed("loss", sg_loss.sg_opt)  # train.train_step calls it through the module
    run.optimizer.step = timed("optim", run.optimizer.step)
    sg_loss.add_weight_distance_grad_ = timed("reg", sg_loss.add_weight_distance_grad_)
    try:
        sync(); t0 = time.perf_counter()
        for _ in range(repeats):
            run_steps()
        sync(); total = time.perf_counter() - t0
    finally:
        run.bert_F.forward, sg_loss.sg_opt, run.optimizer.step, sg_loss.add_weight_distance_grad_ = saved
        del run.bert_F.forward  # back to the class's method
    acc["BERT_T fwd+bwd"] = total - sum(acc.values())
    return {k: 1e3 * v / repeats for k, v in acc.items()}


PHASES = ("BERT_F fwd", "BERT_T fwd+bwd", "loss", "reg", "optim")


STEP_IMPLS = ("sgbert", "reference")


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


# -----------------------------------------------------------------------------
# memory


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
# ddp


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
            cmd = [*launcher, str(ROOT / "train.py"), "--model", path, "--data-dir", data_dir,
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
