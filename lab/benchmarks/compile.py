"""bench.py compile: torch.compile of the encoder's layers vs eager on the workloads users wait for: STS-B encoding
(varying shapes), a fixed shape, train.py's SG-OPT step, pretrain.py's step; the compilation time and the calls it
takes to pay back."""
import time
from functools import partial

import numpy as np
import torch

import bert
import data
from lab.benchmarks.common import cuda_sync, get_device, loaded, pretraining_run, skip, step_setting, time_alternating
from lab.benchmarks.encoder import random_batch
from lab.benchmarks.step import make_step_run


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
    from lab import pretrain
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


def bench_compile(results, args):
    """torch.compile (each layer, inductor, dynamic shapes) vs eager, side by side, on: the STS-B test sentences
    encoded as evaluate.py does (length-sorted batches of 64: a new shape almost every batch), one fixed 64 x 32
    batch, train.py's SG-OPT step (BERT_F and BERT_T compiled; checked equal with dropout off, timed with it on, as
    train.py runs) and pretrain.py's masked-LM step. Each: the compilation (its first call minus a steady one), the
    steady ratio, and the number of calls after which the compilation has paid for itself."""
    path, data_dir, why = step_setting(args)
    if data_dir and not why:  # the STS-B test sentences and the pretraining text, before the first compilation
        why = loaded(data.load_task, "STSBenchmark", data_dir)[1] or pretraining_run(args, "--tokenizer", str(path))[2]
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
