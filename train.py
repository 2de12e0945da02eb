"""
SG-BERT training: fine-tune BERT_T so that its [CLS] vector agrees with the layer views of a frozen BERT_F.

    python train.py --model bert-base-uncased --loss opt      # -> sg.safetensors, then: python evaluate.py --ckpt sg.safetensors

References: Kim, Yoo, Lee, "Self-Guided Contrastive Learning for BERT Sentence Representations", ACL 2021 (section 3),
and the official code (galsang/SG-BERT), whose defaults we follow where it and the paper disagree; each such
divergence is a flag (see the README's "faithful to the code or to the paper" table).

One step: get a batch of sentences -> BERT_F (frozen, no graph) gives the views h_ik, pooled from every hidden
state k -> BERT_T gives c_i, its last-layer [CLS] -> both go through one projection head f -> contrastive loss
-> backward -> add the gradient of lam * ||BERT_T - BERT_F||^2 -> clip -> AdamW step -> lr from get_lr(step).
The STS-B dev Spearman of BERT_T's [CLS] is measured at step 0, every --eval-every steps and at the last step;
the best weights are what we save.
"""
import os
import signal
import sys

if __name__ == "__main__":  # Ctrl-C while torch loads: one line and exit code 130, not a traceback from an import
    signal.signal(signal.SIGINT, lambda *_: (print("train.py: interrupted", file=sys.stderr), os._exit(130)))

import argparse
import copy
import itertools
import json
import math
import subprocess
import time
from pathlib import Path

import torch

import bert
import data
import evaluate
import sg_loss


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1].strip(), formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--model", default="bert-base-uncased", help="base model: a folder, our .safetensors, or a name in weights/<name>/")
    a("--loss", default="opt", choices=["opt", "sg", "opt1", "opt2"],
      help="opt: SG-OPT over all b x (l+1) views; sg: NT-Xent; opt1/opt2: the paper's ablations (sg/opt1/opt2 use one "
           "view per sentence, its layer sampled uniformly)")
    a("--tau", type=float, default=0.01, help="temperature of the contrastive loss")
    a("--lam", type=float, default=0.1, help="weight of the regulariser ||BERT_T - BERT_F||^2")
    a("--lr", type=float, default=5e-5, help="peak learning rate of AdamW")
    a("--weight-decay", type=float, default=0.01,
      help="AdamW weight decay on weights (not biases, not LayerNorm). code: 0.01, paper: not stated")
    a("--batch-size", type=int, default=16, help="sentences per step (b); the other b-1 sentences are the negatives")
    a("--epochs", type=int, default=1, help="passes over the training sentences")
    a("--max-steps", type=int, default=0, help="stop after this many steps (0: run the epochs)")
    a("--eval-every", type=int, default=50, help="STS-B dev evaluation every N steps (and at step 0 and the last step)")
    a("--patience", type=int, default=10, help="early stop after N counted evaluations (0: never); see --early-stop")
    a("--early-stop", default="code", choices=["code", "best"],
      help="code: count evaluations whose dev score fell below the previous evaluation's, over the whole run (the "
           "official code); best: count evaluations since the last new best")
    a("--max-len", type=int, default=128, help="tokens per sentence, [CLS]/[SEP] included; longer ones are truncated")
    a("--view-pooling", default="mean", choices=["mean", "max"],
      help="how a layer of BERT_F is pooled into a view h_ik. code: mean, paper: max")
    a("--teacher-dropout", default="on", choices=["on", "off"],
      help="dropout in BERT_F while it makes the views. code: on (it stays in train mode), paper: not stated")
    a("--layers", default=":", help="which BERT_F hidden states give views, as a Python slice A:B over 0..l (default all)")
    a("--no-proj", action="store_true", help="ablation: no projection head f (the loss sees BERT vectors directly)")
    a("--proj-size", type=int, default=4096, help="width of the projection head f")
    a("--data", default="stsb", help="'stsb' (all 17,256 STS-B sentences, as the official code) or a text file, one per line")
    a("--data-dir", default=None, help="data folder with senteval/ and stsbenchmark.tsv.gz (default $SG_DATA, else ./data)")
    a("--out", default="sg.safetensors", help="where the best checkpoint is written")
    a("--overwrite", action="store_true", help="allow an existing --out; it is replaced only once this run has a "
      "checkpoint to put in its place")
    a("--json", default=None, help="write the final results to this JSON file")
    a("--eval-all", action="store_true", help="at the end, evaluate the best checkpoint on all 7 STS tasks")
    a("--eval-only", action="store_true", help="sanity check: evaluate the base model on STS-B dev/test (and all 7 "
      "tasks with --eval-all) and exit, reproducing the paper's untrained [CLS] baseline")
    a("--seed", type=int, default=1, help="seed for the head init, the shuffle, layer sampling and dropout")
    a("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto: cuda when available")
    a("--log-every", type=int, default=10, help="one log line every N steps")
    a("--overfit-batch", action="store_true", help="sanity check: train on the first batch over and over (loss must fall)")
    a("--eval-batch-size", type=int, default=128, help="batch size of the dev-set encoding")
    return p.parse_args(argv)


def die(msg):
    print(f"train.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


AT_LEAST = {"batch_size": 2, "epochs": 1, "eval_every": 1, "log_every": 1, "proj_size": 1, "eval_batch_size": 1,
            "max_len": 3, "max_steps": 0, "patience": 0}  # integer flags and their smallest sensible value
AT_LEAST_FLOAT = {"lr": 0.0, "lam": 0.0, "weight_decay": 0.0}  # and tau > 0


def check_args(args):
    """Refuse bad input before any work starts, with one line that names the problem."""
    for k, low in AT_LEAST.items():
        if getattr(args, k) < low:
            why = {"batch_size": "the other sentences of the batch are the negatives",
                   "max_len": "room for [CLS], one token and [SEP]"}.get(k, "")
            die(f"--{k.replace('_', '-')} {getattr(args, k)}: must be at least {low}" + (f" ({why})" if why else ""))
    for k, v in [*((k, getattr(args, k)) for k in AT_LEAST_FLOAT), ("tau", args.tau)]:
        if not math.isfinite(v) or v < 0 or (k == "tau" and v == 0):
            die(f"--{k.replace('_', '-')} {v}: must be a finite number " + ("> 0" if k == "tau" else ">= 0"))
    if not 0 <= args.seed < 2 ** 63:
        die(f"--seed {args.seed}: must be in 0 .. 2^63 - 1")
    check_output("--out", args.out, ".safetensors")
    if Path(args.out).exists() and not args.overwrite:
        die(f"--out {args.out} exists: pass --overwrite to replace it (it is kept until this run has a checkpoint of "
            f"its own), or choose another --out")
    if args.json:
        check_output("--json", args.json, ".json")
    if args.device == "cuda" and not torch.cuda.is_available():
        die("--device cuda: no CUDA device is available (use --device cpu)")
    parse_slice(args.layers)


def check_output(flag, path, suffix):
    """An output file path: a file name with the suffix, in an existing writable folder, not a folder itself."""
    p = Path(path)
    if not p.name or p.is_dir() or p.suffix != suffix:
        die(f"{flag} {path}: expected a file name ending in {suffix}")
    if not p.resolve().parent.is_dir():
        die(f"{flag} {path}: the folder {p.resolve().parent} does not exist")
    if not os.access(p.resolve().parent, os.W_OK):
        die(f"{flag} {path}: the folder {p.resolve().parent} is not writable")


def parse_slice(spec):
    """'A:B' or 'A:B:C' -> slice; a bare number is refused (':5' and '5:6' say what they mean)."""
    parts = spec.split(":")
    try:
        if not 2 <= len(parts) <= 3:
            raise ValueError
        s = slice(*[int(x) if x.strip() else None for x in parts])
    except ValueError:
        die(f"--layers {spec}: expected a slice A:B such as 0:7, 1: or : (one layer k: k:k+1)")
    if s.step == 0:
        die(f"--layers {spec}: the slice step must not be 0")
    return s


def view_layers(spec, n_hidden):
    """Indices of the BERT_F hidden states (0 = embeddings .. l = last layer) that give views, from 'A:B'."""
    layers = list(range(n_hidden))[parse_slice(spec)]
    if not layers:
        die(f"--layers {spec}: selects none of the {n_hidden} hidden states 0..{n_hidden - 1}")
    return layers


def get_lr(step, total, peak):
    """Linear warm-up over the first 10% of the steps, then linear decay to 0: transformers'
    get_linear_schedule_with_warmup, which the official code uses, so step 0 runs at lr 0 (tests check it)."""
    warmup = math.ceil(0.1 * total)
    if step < warmup:
        return peak * step / warmup
    return peak * max(0.0, (total - step) / max(1, total - warmup))


def early_stop(scores, rule, patience):
    """Stop now? `scores`: the dev scores so far, step 0 first. 'code' (the official code): count the evaluations
    whose score fell below the previous evaluation's (the first is compared with 0), over the whole run, never
    reset. 'best': count the evaluations since the last new best. Stop when the count reaches `patience` (0: never)."""
    if not patience:
        return False
    if rule == "code":
        return sum(s < prev for s, prev in zip(scores, [0.0] + scores[:-1])) >= patience
    return len(scores) - 1 - scores.index(max(scores)) >= patience


def param_groups(modules, weight_decay):
    """AdamW groups: weight decay on weight matrices, none on biases and LayerNorm (BERT's recipe)."""
    decay, no_decay = [], []
    for m in modules:
        for name, p in m.named_parameters():
            if p.requires_grad:
                (no_decay if name.endswith("bias") or "LayerNorm" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def git_sha():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv=None):
    args = get_args(argv)
    check_args(args)
    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu")
    print(f"sgbert {git_sha()} | device {device} | " + " ".join(f"{k}={v}" for k, v in vars(args).items()))

    # ---- load everything up front, so bad input fails before any work
    try:
        bert_F = bert.Bert.from_pretrained(args.model)
        tokenizer = bert.load_tokenizer(args.model, max_len=min(args.max_len, bert_F.config.max_position_embeddings))
        data_dir = data.resolve_data_dir(args.data_dir)
        sentences = data.training_sentences(args.data, data_dir)
        data.load_stsb("dev", data_dir)
        for task in data.TASKS if args.eval_all else ["STSBenchmark"]:  # fail now, not after training
            data.load_task(task, data_dir)
    except (bert.LoadError, data.DataError) as e:
        die(str(e))
    if len(sentences) < 2:
        die(f"--data {args.data}: {len(sentences)} sentence(s); contrastive training needs at least 2")
    if args.data == "stsb":
        print("note: the STS-B dev and test sentences are part of the unlabelled training data, as in the paper "
              "(no labels are used)")
    cfg = bert_F.config
    layers = view_layers(args.layers, cfg.num_hidden_layers + 1)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)  # shuffle and layer sampling

    if args.eval_only:
        return final_report(args, bert_F.to(device), tokenizer, data_dir, None, device)

    # ---- BERT_F: frozen, never in the autograd graph; BERT_T: a copy whose embedding block is frozen
    bert_F = bert_F.to(device).train(args.teacher_dropout == "on").requires_grad_(False)
    bert_T = copy.deepcopy(bert_F).train().requires_grad_(True)
    bert_T.embeddings.requires_grad_(False)
    head = (sg_loss.ProjectionHead(cfg.hidden_size, args.proj_size) if not args.no_proj else torch.nn.Identity()).to(device)
    # eps: transformers.AdamW's default; fused: one kernel over all parameters (about 5x faster than the loop on CPU)
    optimizer = torch.optim.AdamW(param_groups([bert_T, head], args.weight_decay), lr=args.lr, betas=(0.9, 0.9),
                                  eps=1e-6, fused=True)
    trainable = [p for g in optimizer.param_groups for p in g["params"]]
    n_batches = len(sentences) // args.batch_size + (len(sentences) % args.batch_size >= 2)  # a last batch of 1 has no negatives
    total = args.max_steps or args.epochs * n_batches
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    print(f"{len(sentences)} sentences | {total} steps of {args.batch_size} | views from BERT_F hidden states "
          f"{layers[0]}..{layers[-1]} ({len(layers)}) | loss {args.loss} tau {args.tau} lam {args.lam}")

    def batches():  # endless shuffled epochs; the step count decides when to stop
        while True:
            perm = torch.randperm(len(sentences), generator=gen).tolist()
            for s in range(0, len(perm), args.batch_size):
                if len(idx := perm[s:s + args.batch_size]) >= 2:
                    yield [sentences[i] for i in idx]

    def dev_score():
        return evaluate.stsb_spearman(bert_T, tokenizer, data_dir, "dev", batch_size=args.eval_batch_size)

    meta = {"tokenizer": tokenizer.to_str(), "base_model": str(args.model), "args": vars(args), "git": git_sha()}
    best = {"step": -1, "dev": -math.inf}  # the best evaluation so far
    saved = {}  # the step and dev score of the checkpoint in --out, once this run has written one
    keep_old = Path(args.out).exists()  # --overwrite: the old file stays until this run has a checkpoint to replace it

    def kept():  # what --out holds now, for the last line of a run that stops early
        return (f"the best checkpoint so far (step {saved['step']}, dev {saved['dev']:.2f}) is {args.out}" if saved
                else f"the previous {args.out} is kept" if keep_old else "no checkpoint was written")

    def save(model, step, dev):
        try:
            bert.save_checkpoint(args.out, model, {**meta, "best": {"step": step, "dev": dev}})
        except OSError as e:  # e.g. a full disk: the file in place is intact (the write is atomic)
            die(f"cannot write {args.out} ({e.strerror or e}); {kept()}")
        saved.update(step=step, dev=dev)  # only once the file is in place

    def save_if_best(step, dev):
        if not math.isfinite(dev):  # never let a NaN score pick the "best" model
            die(f"STS-B dev Spearman is {dev} at step {step} (constant sentence vectors?); {kept()}")
        if dev > best["dev"]:
            best.update(step=step, dev=dev)
            if step > 0 or not keep_old:  # step 0 is the base model: not worth replacing an existing file mid-run
                save(bert_T, step, dev)

    # ---- the loop
    phase = dict.fromkeys(["BERT_F fwd", "BERT_T fwd+bwd", "loss", "reg", "optim"], 0.0)
    stop, step, t_start, history, scores = None, 0, time.time(), [], []
    data_iter = batches()
    if args.overfit_batch:
        data_iter = itertools.repeat(next(data_iter))
    try:
        dev = dev_score()
        save_if_best(0, dev)
        scores.append(dev)
        print(f"eval step 0 | STS-B dev {dev:.2f}")
        t_log = time.time()
        while step < total:
            batch = next(data_iter)
            ids, mask = bert.batch_tensors(tokenizer.encode_batch(batch), cfg.pad_token_id, device)
            sync(device); t0 = time.perf_counter()

            # views h_ik: every selected hidden state of BERT_F, pooled over all tokens ([CLS]/[SEP] included)
            with torch.no_grad(), autocast:
                h = layer_views(bert_F, ids, mask, layers, args.view_pooling)  # (b, L, H)
            sync(device); t1 = time.perf_counter()

            # sentence vectors c_i: BERT_T's last-layer [CLS]; one shared head f maps c and h
            with autocast:
                c = bert_T(ids, mask)[-1][:, 0]  # (b, H)
                zc, zh = project(head, c, h)  # (b, p), (b, L, p), fp32: the loss runs in fp32
            t2 = time.perf_counter()
            if args.loss == "opt":
                loss = sg_loss.sg_opt(zc, zh, args.tau)
            else:  # one view per sentence, its layer sampled uniformly
                b, L = h.shape[:2]
                k = torch.randint(L, (b,), generator=gen).to(device)
                loss = LOSSES[args.loss](zc, zh[torch.arange(b, device=device), k], args.tau)
            sync(device); t3 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            sync(device); t4 = time.perf_counter()
            # L^reg = lam * ||BERT_T - BERT_F||^2 enters as its gradient 2 lam (theta_T - theta_F): same update as
            # backpropagating it, without an autograd graph over every weight (tests/test_sg_loss.py proves it)
            reg = sg_loss.add_weight_distance_grad_(bert_T, bert_F, args.lam)
            sync(device); t5 = time.perf_counter()
            lr = get_lr(step, total, args.lr)
            for g in optimizer.param_groups:
                g["lr"] = lr
            norm = torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
            sync(device); t6 = time.perf_counter()
            for key, dt in zip(phase, (t1 - t0, (t2 - t1) + (t4 - t3), t3 - t2, t5 - t4, t6 - t5)):
                phase[key] += dt
            step += 1

            if step % args.log_every == 0 or step == total:
                loss_v = loss.item()  # note: a CPU-GPU sync point, only at log time
                history.append((step, loss_v))
                if not math.isfinite(loss_v):
                    stop = f"non-finite loss {loss_v} at step {step}"
                    break
                dt = (time.time() - t_log) / args.log_every
                t_log = time.time()
                eta = (total - step) * (time.time() - t_start) / step
                print(f"step {step}/{total} | loss {loss_v:.4f} | reg {reg.item():.2e} | norm {norm.item():.2f} "
                      f"| lr {lr:.2e} | {1000 * dt:.0f} ms/step | {args.batch_size / dt:.0f} sent/s | ETA {eta / 60:.1f} min")
            if step % args.eval_every == 0 or step == total:
                dev = dev_score()
                save_if_best(step, dev)
                scores.append(dev)
                print(f"eval step {step} | STS-B dev {dev:.2f} | best {best['dev']:.2f} (step {best['step']})")
                t_log = time.time()  # the next log line times training steps, not this evaluation
                if early_stop(scores, args.early_stop, args.patience):
                    stop = f"early stop ({args.early_stop} rule, patience {args.patience})"
                    break
    except KeyboardInterrupt:
        print(f"train.py: interrupted at step {step}; {kept()}", file=sys.stderr)
        sys.exit(130)
    wall = time.time() - t_start
    if saved.get("step") != best["step"]:  # the run is over and the base model stayed the best: now it replaces
        save(bert_F, 0, best["dev"])         # the old file (BERT_F holds the base weights)
    if stop:
        print(f"{stop}; {kept()}")
    if step:
        print(f"{step} steps in {wall / 60:.1f} min | ms/step: " + " | ".join(f"{k} {1000 * v / step:.1f}" for k, v in phase.items()))
    result = final_report(args, bert.Bert.from_pretrained(args.out).to(device), tokenizer, data_dir, best, device)
    result.update(steps=step, losses=history, wall_seconds=wall, ms_per_step={k: 1000 * v / max(step, 1) for k, v in phase.items()}, stop=stop)
    if args.json:
        write_json(args.json, result)
    if stop and stop.startswith("non-finite"):
        sys.exit(1)
    return result


def write_json(path, obj):
    """Write obj as JSON atomically (a temp file renamed over path): a reader sees the old file or the new one.
    NaN / inf become null, so the file is valid JSON."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    def finite(x):  # NaN / inf -> null: strict JSON
        if isinstance(x, dict):
            return {k: finite(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [finite(v) for v in x]
        return None if isinstance(x, float) and not math.isfinite(x) else x
    tmp.write_text(json.dumps(finite(obj), indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)


LOSSES = {"sg": sg_loss.nt_xent, "opt1": sg_loss.opt1, "opt2": sg_loss.opt2}  # the one-view-per-sentence losses


def layer_views(bert_F, ids, mask, layers, pooling="mean"):
    """The views h_ik: BERT_F's hidden states `layers`, each pooled over all real tokens ([CLS]/[SEP] included)
    -> (b, L, H)."""
    hs = bert_F(ids, mask)
    pool = bert.masked_mean if pooling == "mean" else lambda x, m: bert.pool([x], m, "max")
    return torch.stack([pool(hs[k], mask) for k in layers], 1)


def project(head, c, h):
    """One pass of the shared head f over c (b, H) and h (b, L, H) -> f(c) (b, p) and f(h) (b, L, p), in fp32."""
    b, L, H = h.shape
    z = head(torch.cat([c, h.reshape(b * L, H)]))
    return z[:b].float(), z[b:].float().view(b, L, -1)


def final_report(args, model, tokenizer, data_dir, best, device):
    """STS-B dev and test Spearman of the best weights (the official code evaluates the last ones by mistake), and
    the STS-B test inference time (the paper's Table 6)."""
    dev = evaluate.stsb_spearman(model, tokenizer, data_dir, "dev", batch_size=args.eval_batch_size)
    sync(device); t0 = time.perf_counter()
    test = evaluate.stsb_spearman(model, tokenizer, data_dir, "test", batch_size=args.eval_batch_size)
    sync(device); test_seconds = time.perf_counter() - t0
    what = "base model" if best is None else f"best checkpoint {args.out} (step {best['step']})"
    print(f"{what} | STS-B dev {dev:.2f} | STS-B test {test:.2f} ({test_seconds:.1f} s)")
    result = {"best_step": None if best is None else best["step"], "dev": dev, "test": test,
              "test_seconds": test_seconds}
    if args.eval_all:
        table = evaluate.evaluate_model(model, tokenizer, data.TASKS, data_dir, batch_size=args.eval_batch_size)
        evaluate.print_table(table, data.TASKS, f"{args.out}: 7 STS tasks, [CLS] of the best checkpoint")
        result["sts"] = table
    return result


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # from here on, Ctrl-C is a KeyboardInterrupt
    try:
        main()
    except KeyboardInterrupt:  # outside the loop (loading, the final evaluation): no traceback, nothing half-written
        print("train.py: interrupted", file=sys.stderr)
        sys.exit(130)
