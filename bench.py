"""Side-by-side benchmarks of sgbert against its references.

    python bench.py [--json FILE] [--only loss,encoder,step,sts] [--repeats 7] [--threads N]

One function per section, bench_<name>(results, args): it prints its lines and fills results[<name>]. Sections
not written yet are None in SECTIONS and are skipped. Shared rules, so that ratios mean something:
- contenders run in one process, alternating run by run (a, b, a, b, ...), and each reports the median; on a
  shared machine a slow spell then hits every contender instead of one;
- peak memory on CPU is measured per contender in a fresh process (peak_rss_mb), on GPU with the CUDA allocator's
  peak (peak_cuda_mb);
- before anything is timed, the contenders are checked to compute the same numbers.

  loss   sg_opt (one (b, b*L) similarity matrix) vs the official code's formulation of the same L^opt3
         (a loop over layers, per-layer (b, b) similarities, the negatives repeated for every layer)
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from functools import partial

import torch
import torch.nn.functional as F

import sg_loss

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


def official_sg_opt(c, h, tau, unbind=False):
    """L^opt3 the way the official code (galsang/SG-BERT) builds it; written from its structure, not copied.

    For each layer k a (b, b) similarity between c and the views h[:, k], positives on the diagonal; for each
    anchor i the similarities to all views of the other sentences at all layers, gathered into a (b, (b-1)*L)
    negatives matrix; then per layer logits = cat([positive, negatives]) / tau, i.e. the negatives are materialised
    again for every layer, cross-entropy with label 0, and the mean over layers. unbind=True takes the layers as
    separate tensors (as when they come from a list of hidden states) instead of indexing h[:, k], whose backward
    writes a zero-filled (b, L, p) gradient per layer.
    """
    b, L, p = h.shape
    c = F.normalize(c, dim=-1)
    views = h.unbind(1) if unbind else [h[:, k] for k in range(L)]
    sims = torch.stack([c @ F.normalize(hk, dim=-1).T for hk in views], dim=1)  # (b, L, b): cos(c_i, h_jk)
    others = ~torch.eye(b, dtype=torch.bool, device=c.device)
    negs = sims.permute(0, 2, 1)[others].reshape(b, (b - 1) * L)  # (b, (b-1)*L): views of sentences j != i
    labels = torch.zeros(b, dtype=torch.long, device=c.device)
    loss = 0.0
    for k in range(L):
        logits = torch.cat([sims[:, k].diagonal()[:, None], negs], dim=1) / tau  # (b, 1 + (b-1)*L), per layer
        loss = loss + F.cross_entropy(logits, labels)
    return loss / L


LOSSES = {"sg_opt": sg_loss.sg_opt, "official": official_sg_opt,
          "official_unbind": partial(official_sg_opt, unbind=True)}


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

CASES = {"loss": make_loss_run}  # name -> factory of a zero-argument run, for peak_rss_mb's fresh process
SECTIONS = {"loss": bench_loss, "encoder": None, "step": None, "sts": None}  # None: not written yet, skipped


def main():
    ap = argparse.ArgumentParser(description="Side-by-side benchmarks of sgbert against its references.")
    ap.add_argument("--json", help="also write the results to this JSON file")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections out of {','.join(SECTIONS)}")
    ap.add_argument("--repeats", type=int, default=7, help="timed runs per contender (medians are reported)")
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice); 1 is steadier on a "
                    "machine shared with other jobs")
    ap.add_argument("--peak-child", help=argparse.SUPPRESS)  # internal: one peak_rss_mb measurement
    args = ap.parse_args()
    if args.peak_child:
        return _peak_child(json.loads(args.peak_child))
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [s for s in args.only.split(",") if s]
    unknown = [s for s in names if s not in SECTIONS]
    if unknown:
        ap.error(f"--only: unknown section(s) {unknown}, choose from {list(SECTIONS)}")
    results = {"env": dict(torch=torch.__version__, python=platform.python_version(), machine=platform.machine(),
                           cpus=os.cpu_count(), torch_threads=torch.get_num_threads(),
                           cuda=torch.cuda.get_device_name() if torch.cuda.is_available() else None)}
    print(" | ".join(f"{k} {v}" for k, v in results["env"].items()))
    for name in names:
        if SECTIONS[name] is None:
            print(f"== {name}: not written yet, skipped")
            continue
        print(f"== {name}")
        SECTIONS[name](results, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
