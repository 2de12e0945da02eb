"""bench.py loss: sg_opt (one (b, b*L) similarity matrix) vs the official code's formulation of the same L^opt3 (a loop
over layers, per-layer (b, b) similarities, the negatives repeated for every layer): time and extra peak RSS."""
from functools import partial

import torch

from lab import reference
import sg_loss
from lab.benchmarks.common import peak_rss_mb, time_alternating


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
