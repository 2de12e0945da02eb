"""
Contrastive training of BERT sentence vectors: SG-OPT (the paper), its ablations, ConSERT, SimCSE and PromptBERT in
one loop.

    python train.py --model bert-base-uncased --loss opt      # -> sg.safetensors, then: python evaluate.py --ckpt sg.safetensors

References: Kim, Yoo, Lee, "Self-Guided Contrastive Learning for BERT Sentence Representations", ACL 2021 (section 3),
and the official code (galsang/SG-BERT), whose defaults we follow where it and the paper disagree; each such
divergence is a flag (see the README's "faithful to the code or to the paper" table). ConSERT: Yan et al., ACL 2021
(yym6472/ConSERT). SimCSE: Gao et al., EMNLP 2021 (princeton-nlp/SimCSE). PromptBERT: Jiang et al., EMNLP 2022
(kongds/Prompt-BERT; the templates and the denoising are in prompt.py).

A method (methods.py) is code: its two sides, which encoder makes each from what input, pooled how, its head and its
loss. SG-OPT (methods.views_of_F, sg_loss.sg_opt): side 1 is c_i, BERT_T's last-layer [CLS]; side 2 the views h_ik of
a frozen BERT_F, pooled from every hidden state k; one projection head f maps both. ConSERT and SimCSE (two_passes):
both sides are BERT_T, twice, with two augmentations or two dropout masks; PromptBERT (prompt_pair): BERT_T's [MASK]
vectors of the sentence inside two different templates. One step is the same few lines for every method (train_step):
batch -> method.sides -> method.loss -> backward -> method.regulariser (SG family: the gradient of
lam * ||BERT_T - BERT_F||^2) -> clip -> AdamW step -> lr from get_lr(step).
The STS-B dev Spearman of BERT_T's sentence vector is measured at step 0, every --eval-every steps and at the last
step; the best weights are what we save.

Several processes (`torchrun --nproc_per_node N train.py ...`, one per GPU, or gloo ranks on a CPU): data parallel,
--batch-size stays the global batch b, each process encodes b / N of its sentences and the contrast runs against
the views of the whole global batch (gather()), so N processes run the same experiment as one. Rank 0 evaluates,
logs and writes the checkpoint.
"""
import argparse
import contextlib
import copy
import itertools
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import cli
from lab import methods  # no torch: the command line is parsed before torch loads
from cli import at_least, die, git_sha, seed_value

# -----------------------------------------------------------------------------
# the command line, parsed before the heavy imports (--help answers without torch)


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1].strip(),
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="example: python train.py --model bert-base-uncased --loss opt --out sg.safetensors")
    p.error = die  # a bad flag is one line too (argparse would print the whole usage first)
    methods.add_method_flags(p.add_argument)
    add_run_flags(p.add_argument)
    args = p.parse_args(argv)
    args.given = given_flags(p, argv)
    return args


def used_flags(cfg):
    """The resolved config less the flags that mean nothing for its method (methods.py: its `ignores`, and another
    method's own settings): what the run's config line shows. The checkpoint's metadata keeps them all."""
    return {k: v for k, v in vars(cfg).items() if methods.takes(cfg.loss, k)}


def header(cfg, device, world=1):
    """The run's first line: the code, the device and the used flags, the model by its own name (cli.model_name)
    beside the path it was given, and the data folder this run reads (data.data_dir_from, absolute), never None."""
    flags = {**used_flags(cfg), "data_dir": data.data_dir_from(cfg.data_dir)[0].resolve()}
    name = cli.model_name(cfg.model)
    flags["model"] = name if name == str(cfg.model) else f"{name} ({cfg.model})"
    return (f"sgbert {git_sha()} | device {device}" + (f" x {world} processes" if world > 1 else "") + " | "
            + " ".join(f"{k}={v}" for k, v in flags.items()))


def given_flags(parser, argv):
    """The flags the user wrote (abbreviations too), whatever their values: the parser again with no defaults."""
    bare = copy.deepcopy(parser)
    for action in bare._actions:
        action.default = argparse.SUPPRESS
    return sorted(vars(bare.parse_args(argv)))


def add_run_flags(a):
    """Data, schedule, output, device."""
    a("--data", default="stsb", help="'stsb' (all 17,256 STS-B sentences, as the official code; default), a text file "
      "(one sentence per line), or a .tsv of pairs 'sentence<TAB>paraphrase': the paraphrase makes side 2 (BERT_F's "
      "views for the SG family, the second view for ConSERT / SimCSE)")
    a("--data-dir", default=None, help="data folder with senteval/ and stsbenchmark.tsv.gz (default $SG_DATA, else ./data)")
    a("--epochs", type=at_least(1), default=1, help="passes over the training sentences (default: %(default)s)")
    a("--max-steps", type=at_least(0), default=0, help="stop after this many steps (default 0: run the epochs)")
    a("--eval-every", type=at_least(1), default=50, help="STS-B dev evaluation every N steps (and at step 0 and the "
      "last step; default: %(default)s)")
    a("--patience", type=at_least(0), default=10, help="early stop after N counted evaluations (0: never; default: "
      "%(default)s); see --early-stop")
    a("--early-stop", default="code", choices=["code", "best"],
      help="code (default): count evaluations whose dev score fell below the previous evaluation's, over the whole "
           "run (the official code); best: count evaluations since the last new best")
    a("--select", default="trained", choices=["trained", "any"],
      help="trained (default): keep the best of the trained evaluations; step 0 is scored as the base model's bar "
           "and never kept (the official codes); any (ours): keep the base model when nothing beats it")
    a("--out", default="sg.safetensors", help="where the best checkpoint is written (default: %(default)s)")
    a("--overwrite", action="store_true", help="allow an existing --out; it is replaced only once this run has a "
      "checkpoint to put in its place")
    a("--json", default=None, help="write the final results to this JSON file")
    a("--eval-all", action="store_true", help="at the end, evaluate the best checkpoint on all 7 STS tasks")
    a("--eval-only", action="store_true", help="sanity check: evaluate the base model on STS-B dev/test (and all 7 "
      "tasks with --eval-all) and exit, reproducing the paper's untrained [CLS] baseline")
    a("--seed", type=seed_value, default=1, help="seed for the head init, the shuffle, layer sampling and dropout "
      "(default: %(default)s)")
    a("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto (default): cuda when available")
    a("--precision", choices=["fp32", "bf16"], default="fp32", help="fp32 (default, on every device: the official "
      "code's precision), or bf16: an opt-in autocast of the encoders and the head (the similarity, softmax, loss and "
      "regulariser stay fp32); faster only with bf16 matrix instructions (a CPU with AVX512-BF16 or AMX, a GPU); "
      "on a CPU without, the same numbers at about fp32's speed (bf16 products emulated in fp32)")
    a("--log-every", type=at_least(1), default=10, help="one log line every N steps (default: %(default)s)")
    a("--overfit-batch", action="store_true", help="sanity check: train on the first batch over and over (loss must fall)")
    a("--eval-batch-size", type=at_least(1), default=128, help="batch size of the dev-set encoding (default: %(default)s)")



if __name__ == "__main__":
    cli.exit_on_ctrl_c("train.py")  # Ctrl-C while torch loads: one line and exit code 130, not a traceback
    get_args()  # exits here on --help or a bad flag; main() parses again, after the imports below

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
from torch.nn.parallel import DistributedDataParallel as DDP

import bert
import checkpoint
import data
import evaluate
from lab import posthoc

# -----------------------------------------------------------------------------
# one training step


@dataclass
class Run:
    """What a training run holds, built once by build_run(): everything the step and the loop read."""
    cfg: argparse.Namespace  # the resolved config: every flag, the method's recipe applied (saved as 'args')
    method: methods.Method  # this run's: its sides, head, loss and regulariser, and their state (methods.build)
    state: methods.State  # what the method keeps across steps (ESimCSE: its momentum encoder and queue; most: none)
    bert_F: torch.nn.Module  # the frozen copy: the views h_ik, and the base weights of the regulariser
    bert_T: torch.nn.Module  # the copy being trained; a DDP wrapper of it on several processes (raw() unwraps)
    head: torch.nn.Module  # f (DDP-wrapped on several processes when it has weights)
    optimizer: torch.optim.Optimizer
    trainable: list  # the parameters the optimizer updates, clipped together
    layers: list  # the hidden states of BERT_F that give views (0 = embeddings .. l)
    total: int  # training steps
    tokenizer: object  # the training tokenizer: truncates at --max-len
    eval_tokenizer: object  # the dev score's: evaluate.py's truncation, whatever --max-len (evaluate.eval_tokenizer)
    examples: list  # training sentences, or (sentence, paraphrase) pairs
    data_dir: Path
    device: torch.device
    rank: int = 0
    world: int = 1
    gen: torch.Generator = None  # the shuffle and the layer sampling: the same draws on every process
    meta: dict = field(default_factory=dict)  # checkpoint metadata (checkpoint.META)

    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.precision == "bf16")

    def gather(self, x):
        """x (b_local, ...) of every process in rank order -> (b, ...) (gather(), below); x itself on one process."""
        return gather(x) if self.world > 1 else x


def raw(m):
    """The module itself, under its DDP wrapper if it has one (nanoGPT's raw_model)."""
    return m.module if isinstance(m, DDP) else m


def train_step(run, step, x1, x2):
    """One optimisation step, the same for every method (methods.py): its two sides through its head, its loss,
    backward, its state's update (a no-op for most), its regulariser, clip, AdamW at the lr of get_lr(step). x1, x2:
    (ids, mask) of side 1's and side 2's sentences. Returns the loss, lam * L^reg, the gradient norm and the lr, as
    tensors (no device synchronisation: the loop reads them at log time)."""
    method = run.method
    z = method.sides(run, x1, x2)  # e.g. SG-OPT: f(c_i) (b, p) and f(h_ik) (b, L, p), fp32; SSCL: z1, z2 and n
    rows = None  # one process: every sentence is an anchor
    if run.world > 1:
        # Anchors are this process's rows, negatives the whole global batch: z1 and z2 (and SSCL's n) of every
        # process, gathered in rank order (sentence rank * b_local + i). Both carry a gradient (z1 = f(c) from BERT_T;
        # z2 = f(h) through the trained head f, or a second pass of BERT_T), so both go through the autograd
        # all_gather, whose backward returns each process the gradient of its rows from every process's loss. The
        # head ran before the gather, on this process's rows only: nothing is computed twice.
        z = [gather(t) for t in z]
        share = len(z[0]) // run.world
        rows = slice(run.rank * share, (run.rank + 1) * share)
    # the sides autocast their encoders and head (--precision bf16) and return fp32; the similarity, softmax and loss
    # run here, outside autocast, in fp32 on a CPU as on CUDA (and so does the regulariser). held: what the method
    # keeps across steps and the loss reads (ESimCSE: its queue, the same on every process; most: nothing)
    loss = method.loss(*z, *run.state.held, run.cfg.tau, rows=rows)  # the mean over this process's anchors
    run.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    # the method's own state, from the weights this step's forward used (ESimCSE: the EMA, then the queue); most: none
    run.state.before_update(run, x1, x2)
    if run.world > 1:
        average_grads(run.state.modules, run.world)  # the method's own modules: averaged, as DDP does BERT_T's
    # SG family: the gradient of lam * ||BERT_T - BERT_F||^2, added once DDP has all-reduced the loss's (else 0)
    reg = method.regulariser(raw(run.bert_T), run.bert_F, run.cfg.lam)
    lr = get_lr(step, run.total, run.cfg.lr)
    for g in run.optimizer.param_groups:
        g["lr"] = lr
    norm = torch.nn.utils.clip_grad_norm_(run.trainable, 1.0)
    run.optimizer.step()
    return loss.detach(), reg, norm, lr


def average_grads(modules, world):
    """The gradients of the method's own trainable modules (not DDP-wrapped), averaged over the processes in one
    all_reduce; the same on every process, as DDP leaves BERT_T's."""
    grads = [p.grad for m in modules for p in m.parameters() if p.grad is not None]
    if grads:
        flat = torch.cat([g.flatten() for g in grads])
        dist.all_reduce(flat)
        for g, f in zip(grads, flat.div_(world).split([g.numel() for g in grads])):
            g.copy_(f.view_as(g))


def get_lr(step, total, peak):
    """Linear warm-up over the first 10% of the steps, then linear decay to 0: transformers'
    get_linear_schedule_with_warmup, which the official code uses, so step 0 runs at lr 0 (tests check it)."""
    warmup = math.ceil(0.1 * total)
    if step < warmup:
        return peak * step / warmup
    return peak * max(0.0, (total - step) / max(1, total - warmup))


def gather(x):
    """x (b_local, ...) of every process, concatenated in rank order -> (b, ...). Autograd-aware when x carries a
    gradient (torch.distributed.nn.functional.all_gather: its backward sums, over every process's loss, the
    gradient of each process's own rows); the plain all_gather otherwise."""
    if x.requires_grad:
        with warnings.catch_warnings():  # torch 2.13 marks it deprecated for a private successor: keep the public one
            warnings.simplefilter("ignore", FutureWarning)
            return torch.cat(dist_nn.all_gather(x))
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)

# -----------------------------------------------------------------------------
# the loop


def batches(run):
    """Endless shuffled epochs of (side-1 sentences, side-2 sentences or None: the same): this process's share of
    each global batch; the step count decides when to stop. Every process draws the same order. A short last batch
    is cut to a multiple of the number of processes, and skipped below 2 sentences (no negatives)."""
    b = run.cfg.batch_size
    while True:
        perm = torch.randperm(len(run.examples), generator=run.gen).tolist()
        for s in range(0, len(perm), b):
            idx = perm[s:s + b]
            idx = idx[:len(idx) - len(idx) % run.world]
            if len(idx) >= max(2, run.world):
                share = len(idx) // run.world
                ex = [run.examples[i] for i in idx[run.rank * share:(run.rank + 1) * share]]
                yield ([e[0] for e in ex], [e[1] for e in ex]) if isinstance(ex[0], tuple) else (ex, None)


def inputs(run, s1, s2):
    """(ids, mask) of side 1's and side 2's sentences, each side read by its own tokenizer (the method's: PromptBERT's
    are its templates). Side 2 reads the paraphrases of --data's pairs, else side 1's sentences again: the same
    tensors when both sides read alike."""
    t1, t2 = run.method.tokenizers
    x1 = tensors(run, t1, s1)
    return x1, (x1 if s2 is None and t2 is t1 else tensors(run, t2, s1 if s2 is None else s2))


def tensors(run, tokenizer, sentences):
    return bert.batch_tensors(tokenizer.encode_batch(sentences), raw(run.bert_T).config.pad_token_id, run.device)


def eta_seconds(step, total, eval_every, seconds_per_step, seconds_per_eval):
    """What is left of the run after `step` steps, at the log line (before that step's evaluation): the steps to
    `total` at seconds_per_step, and the dev evaluations still to come (each step in step..total that is a multiple of
    eval_every, and the last step) at seconds_per_eval each, as long as the ones so far took. An early stop ends
    sooner; the final report on the best checkpoint (STS-B dev and test) comes after."""
    evals = total // eval_every - (step - 1) // eval_every + (total % eval_every != 0)
    return (total - step) * seconds_per_step + evals * seconds_per_eval


def train_loop(run, keeper):
    """Steps, a log line after step 1 and every --log-every steps, a dev evaluation at step 0, every --eval-every
    steps and at the last step, the best checkpoint kept, early stop. Returns (why it stopped early or None, stats)."""
    cfg = run.cfg
    stats = dict(history=[], scores=[], step=0, t_start=time.time(), train_seconds=0.0, eval_seconds=[])
    data_iter = itertools.repeat(next(batches(run))) if cfg.overfit_batch else batches(run)
    stop, step = None, 0
    try:
        t_eval = time.perf_counter()
        evaluation(run, keeper, stats, 0)
        t_mark, mark = time.perf_counter(), 0  # the training time since the last log line or evaluation
        stats["eval_seconds"].append(t_mark - t_eval)
        while step < run.total and not stop:
            loss, reg, norm, lr = train_step(run, step, *inputs(run, *next(data_iter)))
            step = stats["step"] = step + 1
            if step % cfg.log_every == 0 or step in (1, run.total):
                loss_v = global_mean(run, loss).item()  # note: the one CPU-GPU sync point of the step, at log time
                elapsed = time.perf_counter() - t_mark
                dt, t_mark, mark = elapsed / (step - mark), time.perf_counter(), step
                stats["train_seconds"] += elapsed
                stats["history"].append((step, loss_v))
                if not math.isfinite(loss_v):
                    stop = f"non-finite loss {loss_v} at step {step}"
                    break
                eta = eta_seconds(step, run.total, cfg.eval_every, stats["train_seconds"] / step,
                                  sum(stats["eval_seconds"]) / len(stats["eval_seconds"]))
                print(f"step {step}/{run.total} | loss {loss_v:.4f} | reg {reg.item():.2e} | norm {norm.item():.2f} "
                      f"| lr {lr:.2e} | {1000 * dt:.0f} ms/step | {cfg.batch_size / dt:.0f} sent/s | ETA {eta / 60:.1f} min",
                      flush=True)
            if step % cfg.eval_every == 0 or step == run.total:
                sync(run.device)
                t_eval = time.perf_counter()
                stats["train_seconds"] += t_eval - t_mark  # the steps since the last log line
                stop = evaluation(run, keeper, stats, step)
                t_mark, mark = time.perf_counter(), step  # the next log line times training steps, not this evaluation
                stats["eval_seconds"].append(t_mark - t_eval)
    except KeyboardInterrupt:
        if keeper:
            print(f"train.py: interrupted at step {step}; {keeper.kept()}", file=sys.stderr)
        sys.exit(130)
    return stop, stats


def global_mean(run, loss):
    """The global batch's loss: the mean over the processes' anchors."""
    if run.world > 1:
        dist.all_reduce(loss := loss.clone())
        loss /= run.world
    return loss


def agree(run, flag):
    """Rank 0's decision (early stop, a failed evaluation), on every process: they stop together."""
    if run.world == 1:
        return flag
    t = torch.tensor([float(flag)], device=run.device)
    dist.broadcast(t, 0)
    return bool(t.item())


def early_stop(scores, rule, patience):
    """Stop now? `scores`: the dev scores so far, step 0 first. 'code' (the official code): count the evaluations
    whose score fell below the previous evaluation's (the first is compared with 0), over the whole run, never
    reset. 'best': count the evaluations since the last new best. Stop when the count reaches `patience` (0: never)."""
    if not patience:
        return False
    if rule == "code":
        return sum(s < prev for s, prev in zip(scores, [0.0] + scores[:-1])) >= patience
    return len(scores) - 1 - scores.index(max(scores)) >= patience

# -----------------------------------------------------------------------------
# evaluation and the best checkpoint


def evaluation(run, keeper, stats, step):
    """Rank 0: the dev score, the best checkpoint, the early-stop rule. Every process: stop now? (rank 0 decides;
    the others wait for it here)."""
    stop = None
    if run.rank == 0:
        print(f"eval step {step} | encoding STS-B dev ...", end="\r" if sys.stdout.isatty() else "\n", flush=True)
        dev = dev_score(run)
        keeper.offer(step, dev)
        stats["scores"].append(dev)
        best = keeper.best
        print(f"eval step {step} | STS-B dev {dev:.2f}" + (" (the base model)" if not step else
              f" | best {best['dev']:.2f} (step {best['step']})"), flush=True)
        if early_stop(stats["scores"], run.cfg.early_stop, run.cfg.patience):
            stop = f"early stop ({run.cfg.early_stop} rule, patience {run.cfg.patience})"
    return (stop or "early stop (rank 0)") if agree(run, stop is not None) else None


def dev_score(run):
    model = raw(run.bert_T)
    vectors = evaluate.sentence_vectors(model, run.eval_tokenizer, run.cfg.eval_pooling,
                                        batch_size=run.cfg.eval_batch_size,
                                        template=run.cfg.template)  # PromptBERT: the first template, not denoised
    return evaluate.stsb_spearman(vectors, run.data_dir, "dev")


class BestCheckpoint:
    """The best weights so far, in --out: written on each new best dev score, atomically. Step 0 (the base model)
    is scored as the bar, never selected (the official codes' rule), unless --select any: then the base weights are
    written at the end of a run in which nothing beat them. An existing --out (allowed by --overwrite) is kept until
    this run has a checkpoint of its own."""

    def __init__(self, run):
        self.run, self.out = run, run.cfg.out
        self.any = run.cfg.select == "any"  # may step 0 be the best?
        self.best = {"step": -1, "dev": -math.inf}  # the best selectable evaluation so far
        self.base = None  # step 0's dev score: the base model's
        self.saved = {}  # the step and dev score of the checkpoint in --out, once this run has written one
        self.keep_old = Path(self.out).exists()

    def kept(self):  # what --out holds now, for the last line of a run that stops early
        s, out = self.saved, self.out
        if s:
            return f"the best checkpoint so far (step {s['step']}, dev {s['dev']:.2f}) is {out}"
        none = "no trained checkpoint exists yet; "
        return none + (f"the previous {out} is kept" if self.keep_old else "none was written")

    def save(self, model, step, dev):
        meta = {**self.run.meta, "config": model.config.to_dict(), "best": {"step": step, "dev": dev}}
        tensors = model.tensors()
        bad = [k for k, v in tensors.items() if v.is_floating_point() and not torch.isfinite(v).all()]
        if bad:  # never kept, whatever its score
            die(f"non-finite weights (NaN or inf) in {', '.join(bad[:2])} at step {step}; {self.kept()}")
        try:
            checkpoint.save_checkpoint(self.out, tensors, meta)
        except OSError as e:  # e.g. a full disk: the file in place is intact (the write is atomic)
            die(f"cannot write {self.out} ({e.strerror or e}); {self.kept()}")
        self.saved = {"step": step, "dev": dev}  # only once the file is in place

    def offer(self, step, dev):
        if not math.isfinite(dev):  # never let a NaN score pick the "best" model
            die(f"STS-B dev Spearman is {dev} at step {step} (constant sentence vectors?); {self.kept()}")
        if step == 0:
            self.base = dev
        if (step > 0 or self.any) and dev > self.best["dev"]:
            self.best = {"step": step, "dev": dev}
            if step > 0:  # the base model is written at the end only, if it stays the best
                self.save(raw(self.run.bert_T), step, dev)

    def finish(self):
        if self.best["step"] == 0:  # --select any, and the base model stayed the best (BERT_F holds its weights)
            self.save(self.run.bert_F, 0, self.best["dev"])
        elif self.base is not None and self.base > self.best["dev"]:
            print(f"note: the base model (step 0, dev {self.base:.2f}) scored above every trained evaluation; "
                  f"kept the best trained one, step {self.best['step']} (--select any keeps the base model)")


def finish(run, keeper, stop, stats):
    """The final report on the best checkpoint, the JSON, the exit code."""
    keeper.finish()
    wall, step = time.time() - stats["t_start"], stats["step"]
    if stop:
        print(f"{stop}; {keeper.kept()}")
    if not keeper.saved:  # stopped before any trained evaluation: nothing of this run to report on
        return None
    if step:
        print(f"{step} steps in {wall / 60:.1f} min ({1000 * stats['train_seconds'] / step:.0f} ms per training step)")
    model = bert.Bert.from_pretrained(run.cfg.out).to(run.device)
    result = final_report(run.cfg, model, run.tokenizer, run.data_dir, keeper.best, run.device)
    result.update(steps=step, base_dev=keeper.base, losses=stats["history"], wall_seconds=wall, stop=stop,
                  ms_per_step=1000 * stats["train_seconds"] / max(step, 1), **run.state.meta)  # DiffCSE: its generator
    write_result(run.cfg.json, result)
    return result


def final_report(cfg, model, tokenizer, data_dir, best, device, transform=None):
    """STS-B dev and test Spearman of the best weights (the official code evaluates the last ones by mistake), and
    the STS-B test inference time (the paper's Table 6); with --eval-all the 7-task table. Tokenized as evaluate.py
    does, whatever --max-len: these are the numbers evaluate.py --ckpt gives on the checkpoint."""
    tokenizer = evaluate.eval_tokenizer(tokenizer, model.config)
    vectors = evaluate.sentence_vectors(model, tokenizer, cfg.eval_pooling, batch_size=cfg.eval_batch_size,
                                        transform=transform, template=cfg.template)
    print("encoding STS-B dev and test ...", flush=True)
    dev = evaluate.stsb_spearman(vectors, data_dir, "dev")
    sync(device); t0 = time.perf_counter()
    test = evaluate.stsb_spearman(vectors, data_dir, "test")
    sync(device); test_seconds = time.perf_counter() - t0
    what = "base model" if best is None else f"best checkpoint {cfg.out} (step {best['step']})"
    print(f"{what} | STS-B dev {dev:.2f} | STS-B test {test:.2f} ({test_seconds:.1f} s)")
    result = {"best_step": None if best is None else best["step"], "dev": dev, "test": test,
              "test_seconds": test_seconds}
    if cfg.eval_all:
        print("the 7 STS tasks ...", flush=True)
        table = evaluate.evaluate_sts(vectors, data.TASKS, data_dir)
        evaluate.print_table(table, data.TASKS, f"{cfg.out}: 7 STS tasks, {cfg.eval_pooling} pooling of the best checkpoint")
        result["sts"] = table
    return result


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()

# -----------------------------------------------------------------------------
# the post-hoc baselines: BERT stays as it is, a map of its sentence vectors is fitted (posthoc.py)


def fit_posthoc(cfg, device):
    """--loss whitening | flow: the training sentences' vectors from the base model, the transform fitted on them,
    saved with the base weights (its tensors under checkpoint.TRANSFORM_PREFIX), then the usual final report."""
    model, tokenizer, examples, data_dir = load_inputs(cfg)
    sentences = [s for e in examples for s in (e if isinstance(e, tuple) else (e,))]  # pairs: both sides
    H = model.config.hidden_size
    if cfg.whiten_dim and cfg.whiten_dim > H:
        die(f"--whiten-dim {cfg.whiten_dim}: {cfg.model} has {H} dimensions; give 1..{H}")
    if cfg.loss == "flow" and cfg.batch_size > len(sentences):
        die(f"--batch-size {cfg.batch_size}: the flow's batches are full ones, and --data has {len(sentences)} "
            "sentences; give a smaller --batch-size")
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(checkpoint.output_lock(cfg.out))  # one run per --out: a second one refuses in one line
        except checkpoint.OutputLocked as e:
            die(e)
        t0 = time.time()
        dropout = cfg.loss == "flow" and cfg.dropout == "on"
        torch.manual_seed(cfg.seed)  # the dropout masks: a function of --seed (torch's own first seed is random)
        print(f"encoding {len(sentences)} training sentences ({cfg.pooling}{', dropout on' if dropout else ''}) ...",
              flush=True)
        x = bert.encode(model.to(device), tokenizer, sentences, cfg.pooling, batch_size=cfg.eval_batch_size,
                        dropout=dropout, progress=evaluate.Counter(print))
        kept = f"the previous {cfg.out} is kept" if Path(cfg.out).exists() else f"{cfg.out} is not written"
        tensors, info, stats = fit_map(cfg, x, kept)
        fit_seconds = time.time() - t0
        transform = posthoc.make_transform(info, tensors)
        vectors = evaluate.sentence_vectors(model, evaluate.eval_tokenizer(tokenizer, model.config), cfg.eval_pooling,
                                            transform=transform, batch_size=cfg.eval_batch_size)
        dev = evaluate.stsb_spearman(vectors, data_dir, "dev")
        if not math.isfinite(dev):  # a NaN score never replaces a good file
            die(f"STS-B dev Spearman of the fitted {cfg.loss} is {dev} (constant sentence vectors?); {kept}")
        meta = {"tokenizer": tokenizer.to_str(), **base_meta(cfg.model), "args": vars(cfg), "git": git_sha(),
                "pooling": cfg.eval_pooling, "method": cfg.loss, "config": model.config.to_dict(), "transform": info,
                "best": {"step": stats["steps"], "dev": dev}}
        try:
            checkpoint.save_checkpoint(cfg.out, {**model.tensors(), **{checkpoint.TRANSFORM_PREFIX + k: v.detach().cpu()
                                                                      for k, v in tensors.items()}}, meta)
        except OSError as e:  # e.g. a full disk: the write is atomic, the file in place is intact
            die(f"cannot write {cfg.out} ({e.strerror or e}); {kept}")
        print(f"{cfg.loss} fitted on {len(sentences)} sentences in {fit_seconds:.1f} s | STS-B dev {dev:.2f} | "
              f"written to {cfg.out}")
    ck = checkpoint.load(cfg.out)  # what evaluate.py --ckpt will see, read back once
    model = bert.Bert.from_checkpoint(ck).to(device)
    transform = posthoc.transform_of(ck, model.config.hidden_size)
    result = final_report(cfg, model, tokenizer, data_dir, meta["best"], device, transform)
    result.update(steps=stats["steps"], losses=stats["losses"], wall_seconds=time.time() - t0, stop=None,
                  fit_seconds=fit_seconds, ms_per_step=1000 * stats.get("seconds", 0.0) / max(stats["steps"], 1))
    write_result(cfg.json, result)
    return result


def write_result(path, result):
    """--json, atomically; a write that fails now (checked writable up front: e.g. a full disk) is one line, exit 1."""
    if not path:
        return
    try:
        checkpoint.write_json(path, result)
    except OSError as e:
        die(f"cannot write --json {path} ({e.strerror or e}); the checkpoint and the report above are complete", code=1)


def fit_map(cfg, x, kept):
    """The fitted map of the vectors x (n, H): (its tensors, its metadata 'transform', {"steps", "losses"}), every
    tensor finite; a fit that cannot be made or diverges is one line (`kept`: what --out holds then)."""
    try:
        if cfg.loss == "whitening":
            mu, W = posthoc.fit_whitening(x, cfg.whiten_dim)
            return {"mu": mu, "W": W}, {"kind": "whitening", "dim": W.shape[1]}, {"steps": 0, "losses": []}
        flow, stats = posthoc.fit_flow(torch.from_numpy(x), epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
                                       weight_decay=cfg.weight_decay, seed=cfg.seed, max_steps=cfg.max_steps, log=print,
                                       log_every=cfg.log_every)
        return flow.state_dict(), {"kind": "flow", "config": flow.config()}, stats
    except ValueError as e:
        die(f"--loss {cfg.loss}: {e}; {kept}")

# -----------------------------------------------------------------------------
# setup


def load_inputs(cfg):
    """The base model, its tokenizer, the training examples and the data folder, checked up front: bad input fails
    before any work."""
    try:
        model = bert.Bert.from_pretrained(cfg.model)
        tokenizer = bert.load_tokenizer(cfg.model, max_len=min(cfg.max_len, model.config.max_position_embeddings))
        data_dir = data.resolve_data_dir(cfg.data_dir, need_stsb=cfg.data == "stsb")  # --data FILE: no STS-B file needed
        examples = data.training_sentences(cfg.data, data_dir)  # sentences, or (sentence, paraphrase) pairs
        data.load_stsb("dev", data_dir)  # read at every evaluation: fail now, not mid-training
        for task in data.TASKS if cfg.eval_all else ["STSBenchmark"]:  # fail now, not after training
            data.load_task(task, data_dir)
    except checkpoint.LoadError as e:  # a hub name with no network: the error says what works here
        die(f"{e}{evaluate.models_here(cfg.model)}")
    except data.DataError as e:
        die(e)
    if len(examples) < 2:
        die(f"--data {cfg.data}: {len(examples)} sentence(s); training needs at least 2")
    if cfg.data == "stsb":
        print("note: the STS-B dev and test sentences are part of the unlabelled training data, as in the paper "
              "(no labels are used)")
    return model, tokenizer, examples, data_dir


def setup(cfg, device, rank=0, world=1):
    return build_run(cfg, *load_inputs(cfg), device, rank, world)


def build_run(cfg, bert_F, tokenizer, examples, data_dir, device, rank=0, world=1):
    """BERT_F (frozen), BERT_T (a trained copy), the head f, the optimizer; DDP wrappers on several processes."""
    method, H = methods.build(cfg, tokenizer, bert_F.config.max_position_embeddings, rank), bert_F.config.hidden_size
    layers = view_layers(cfg.layers, bert_F.config.num_hidden_layers + 1)
    torch.manual_seed(cfg.seed)
    # BERT_F: frozen, never in the autograd graph; BERT_T: a copy whose embedding block is frozen
    bert_F = bert_F.to(device).train(cfg.teacher_dropout == "on").requires_grad_(False)
    bert_T = copy.deepcopy(bert_F).train(cfg.dropout == "on").requires_grad_(True)
    bert_T.embeddings.requires_grad_(False)
    head = method.head(H, cfg).to(device)
    check_neg_layers(cfg, bert_F.config.num_hidden_layers)
    state = method.state(cfg, bert_T, tokenizer, device)  # the method's own across steps; its draws after the head's
    torch.manual_seed(cfg.seed + rank)  # dropout: each process its own masks (rank 0 = one process's stream)
    # eps: transformers.AdamW's default; fused: one kernel over all parameters (about 5x faster than the loop on CPU)
    optimizer = torch.optim.AdamW(param_groups([bert_T, head, *state.modules], cfg.weight_decay), lr=cfg.lr,
                                  betas=(0.9, 0.9), eps=1e-6, fused=True)
    if world > 1:  # rank 0's weights are broadcast to every process here; BERT_F is never wrapped
        ids = [device.index] if device.type == "cuda" else None
        bert_T = DDP(bert_T, device_ids=ids)
        head = DDP(head, device_ids=ids) if any(p.requires_grad for p in head.parameters()) else head
    last = len(examples) % cfg.batch_size
    n_batches = len(examples) // cfg.batch_size + (last - last % world >= max(2, world))  # see batches()
    total = cfg.max_steps or cfg.epochs * n_batches
    print(f"{len(examples)} {'pairs' if isinstance(examples[0], tuple) else 'sentences'} | {total} steps of "
          f"{cfg.batch_size} | {cfg.loss}: {method.sides.__name__} -> {method.head.__name__} -> {method.loss.__name__}"
          f" (tau {cfg.tau})" + (f" | BERT_F's views: hidden states {layers[0]}..{layers[-1]} ({len(layers)})"
                                 if methods.takes(cfg.loss, "layers") else ""))
    return Run(cfg=cfg, method=method, state=state, bert_F=bert_F, bert_T=bert_T, head=head, optimizer=optimizer,
               trainable=[p for g in optimizer.param_groups for p in g["params"]], layers=layers, total=total,
               tokenizer=tokenizer, eval_tokenizer=evaluate.eval_tokenizer(tokenizer, bert_F.config),
               examples=examples, data_dir=data_dir, device=device, rank=rank, world=world,
               gen=torch.Generator().manual_seed(cfg.seed),
               meta={"tokenizer": tokenizer.to_str(), **base_meta(cfg.model), "args": vars(cfg),
                     "git": git_sha(), "pooling": cfg.eval_pooling, "method": cfg.loss,
                     **({"template": cfg.template} if methods.takes(cfg.loss, "template") else {})})


def check_neg_layers(cfg, l):
    """SSCL's --neg-layers K: the hidden states l-1 .. l-K below the last, pooled; K <= l (down to the embedding
    output), K <= l - 1 for a pooling that reads layer 1 as well (first-last, last2)."""
    if methods.takes(cfg.loss, "neg_layers"):
        most = l - (cfg.pooling in ("first-last", "last2"))
        if cfg.neg_layers > most:
            die(f"--neg-layers {cfg.neg_layers}: the model has {l} layers, and --pooling {cfg.pooling} pools at most "
                f"{most} hidden states below the last; give 1..{most}")


def view_layers(spec, n_hidden):
    """Indices of the BERT_F hidden states (0 = embeddings .. l = last layer) that give views, from 'A:B'."""
    layers = list(range(n_hidden))[methods.layer_slice(spec)]
    if not layers:
        die(f"--layers {spec}: selects none of the {n_hidden} hidden states 0..{n_hidden - 1}")
    return layers


def param_groups(modules, weight_decay):
    """AdamW groups: weight decay on weight matrices, none on biases and LayerNorm (BERT's recipe)."""
    decay, no_decay = [], []
    for m in modules:
        for name, p in m.named_parameters():
            if p.requires_grad:
                (no_decay if name.endswith("bias") or "LayerNorm" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def base_meta(model):
    """The base model as a checkpoint's metadata names it: its name, and the sha256 of its weights when on disk."""
    sha = checkpoint.weights_sha256(model)
    return {"base_model": checkpoint.display_name(model), **({"base_sha256": sha} if sha else {})}


def init_distributed(cfg):
    """-> (rank, world size, device). Under torchrun (WORLD_SIZE, RANK and LOCAL_RANK set): one process per device,
    NCCL on CUDA, gloo on CPU; only rank 0 prints. Otherwise one process: (0, 1, the --device)."""
    cuda = cli.device(cfg.device) == "cuda"
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world == 1:
        return 0, 1, torch.device("cuda" if cuda else "cpu")
    if cfg.batch_size % world:
        die(f"--batch-size {cfg.batch_size} does not divide over {world} processes: it is the global batch, "
            f"split evenly (use a multiple of {world})")
    if cfg.eval_only:
        die("--eval-only runs in one process: run it with python, not torchrun")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda and device.index >= torch.cuda.device_count():
        die(f"process {rank} wants GPU {device.index} but {torch.cuda.device_count()} are visible: --nproc_per_node "
            f"at most the number of GPUs (or --device cpu)")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    if rank:
        sys.stdout = open(os.devnull, "w")  # one log: rank 0's (errors still reach stderr from every rank)
    return rank, world, device


def main(argv=None):
    cfg = methods.resolve_config(get_args(argv))
    check_config(cfg)
    rank, world, device = init_distributed(cfg)
    print(header(cfg, device, world))
    if rank == 0 and not cfg.eval_only:
        cli.warn_slow_bf16(cfg.precision, device.type)  # bf16 on a CPU without bf16 matrix instructions: slow
    if methods.METHODS[cfg.loss].sides is None and not cfg.eval_only:  # whitening, flow: no contrast
        if world > 1:
            die(f"--loss {cfg.loss} is fitted in one process: run it with python, not torchrun")
        return fit_posthoc(cfg, device)
    if cfg.eval_only:
        model, tokenizer, _, data_dir = load_inputs(cfg)
        return final_report(cfg, model.to(device), tokenizer, data_dir, None, device)
    run = setup(cfg, device, rank, world)
    with contextlib.ExitStack() as held:
        held.enter_context(bert.bf16_products(cfg.precision, device.type))  # bf16 without a bf16 unit: emulated, fast
        keeper = None
        if rank == 0:  # only rank 0 writes --out
            try:
                held.enter_context(checkpoint.output_lock(cfg.out))  # one run per --out: a second one refuses in one line
            except checkpoint.OutputLocked as e:
                die(e)
            keeper = BestCheckpoint(run)
        stop, stats = train_loop(run, keeper)
        if world > 1:
            dist.barrier()  # every rank is past its last collective before the group is released
            dist.destroy_process_group()
        result = finish(run, keeper, stop, stats) if rank == 0 else None
    code = 1 if stop and stop.startswith("non-finite") else 0
    if world > 1:
        # (!!) The run is complete and written; leave now, while `run` still holds the DDP reducer. Dropping it (on
        # return from here, or in the interpreter's teardown) drops the last reference to the gloo process group,
        # whose destructor joins gloo's worker threads with the GIL held while a worker may need the GIL to free a
        # tensor (py-spy of a hung rank: ~ProcessGroupGloo in thread.join, its worker in ~AsyncBarrierWork waiting
        # for the GIL). Seen in 2 of 3 torchrun tests of one suite run on a loaded CPU, and in 2 of ~35 runs after.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if code:
        sys.exit(code)
    return result

def check_config(cfg):
    """Refuse bad paths and devices before any work starts, with one line that names the problem."""
    try:
        cfg.eval_only or checkpoint.check_checkpoint_path(cfg.out, write=True)
        cfg.json and checkpoint.check_output(cfg.json, ".json")
    except checkpoint.LoadError as e:
        die(e)
    if Path(cfg.out).exists() and not cfg.overwrite and not cfg.eval_only:
        die(f"--out {cfg.out} exists: pass --overwrite to replace it (it is kept until this run has a checkpoint of "
            f"its own), or choose another --out")



if __name__ == "__main__":
    cli.run(main, "train.py")
