"""SG-OPT: self-guided contrastive learning of BERT sentence vectors (Kim, Yoo, Lee, ACL 2021).

BERT_F stays frozen and BERT_T is trained (sec. 3). For sentence i, c_i is BERT_T's [CLS] vector,
h_ik BERT_F's hidden state k averaged over the tokens, k = 0..l. A head f maps both; sg_loss.sg_opt
pulls f(c_i) towards its own views and away from the other sentences'. lam * ||BERT_T - BERT_F||^2
keeps BERT_T near BERT_F. The ablations sg, opt1, opt2 (Table 5) see one view a sentence, its layer
drawn. Where the paper and its code (galsang/SG-BERT) differ, we follow the code, with a flag.
"""
import argparse
import contextlib
import copy
import itertools
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

import bert
import checkpoint
import cli
import data
import evaluate
import outputs
import runtime
import sg_loss
from cli import at_least, die, git_sha, layer_slice, layers_flag, positive
from runtime import gather, raw

LOSSES = ("opt", "sg", "opt1", "opt2")  # SG-OPT and the paper's ablations; the lab has the others

# -----------------------------------------------------------------------------
# the command line


def get_args(argv=None):
    p = cli.parser("train.py", __doc__.split("\n\n")[0].strip(), EPILOG)
    add_sg_flags(p.add_argument)
    cli.add_run_flags(p.add_argument)
    args = cli.parse(p, argv, lab="lab.train")
    if args.loss not in LOSSES:
        cli.to_the_lab(f"--loss {args.loss}: train.py trains {', '.join(LOSSES)}", "lab.train",
                       sys.argv[1:] if argv is None else argv)
    return args


EPILOG = """example: python train.py --model bert-base-uncased --loss opt --out sg.safetensors
the lab's methods and flags: python -m lab.train --help (--loss sg-opt-sscl, consert, simcse,
promptbert, esimcse, sscl, diffcse, whitening, flow; --aug1, --aug2, ...)"""


def add_sg_flags(a):  # the paper's symbols; where code and paper differ, the code's default
    a("--model", default="bert-base-uncased", help="base model: a folder, our .safetensors, or a "
      "name in models/ or weights/ (default: %(default)s)")
    a("--loss", default="opt", help="opt: SG-OPT over all b x (l+1) views (default); sg: NT-Xent; "
      "opt1, opt2: the paper's ablations (sg, opt1, opt2: one view a sentence, its layer drawn)")
    a("--tau", type=positive, default=0.01, help="temperature (default: %(default)s)")
    a("--lam", type=at_least(0.0, float), default=0.1, help="weight of ||BERT_T - BERT_F||^2")
    a("--lr", type=at_least(0.0, float), default=5e-5, help="AdamW's peak lr (default: 5e-5)")
    a("--weight-decay", type=at_least(0.0, float), default=0.01, help="AdamW's, on weight "
      "matrices. code: 0.01 (default), paper: not stated")
    a("--batch-size", type=at_least(2, why="the other sentences of the batch are the negatives"),
      default=16, help="sentences a step, b (default: %(default)s)")
    a("--max-len", type=at_least(3, why="room for [CLS], one token and [SEP]"), default=128,
      help="tokens a training sentence (default: %(default)s); evaluation reads 128")
    a("--dropout", choices=["on", "off"], default="on", help="BERT_T's dropout (default: on)")
    a("--teacher-dropout", default="on", choices=["on", "off"], help="BERT_F's dropout while it "
      "makes the views. code: on (default), paper: not stated")
    a("--view-pooling", default="mean", choices=["mean", "max"], help="how a hidden state of "
      "BERT_F becomes a view h_ik. code: mean (default), paper: max")
    a("--layers", default=":", type=layers_flag, help="the hidden states of BERT_F that give "
      "views, a Python slice A:B over 0..l (default: all)")
    a("--pooling", choices=bert.POOLINGS, default="cls", help="c_i, BERT_T's vector (default: cls)")
    a("--eval-pooling", choices=bert.POOLINGS, default="cls", help="the vector at evaluation, "
      "recorded in the checkpoint (default: cls)")
    a("--no-proj", action="store_true", help="ablation: no head f (the loss sees BERT's vectors)")
    a("--proj-size", type=at_least(1), default=4096, help="width of f (default: %(default)s)")


# -----------------------------------------------------------------------------
# one training step


@dataclass
class Run:
    """What a training run holds, built once by build_run()."""
    cfg: argparse.Namespace  # the resolved config: every flag (saved as 'args')
    bert_F: torch.nn.Module  # frozen: the views h_ik, and the base weights of the regulariser
    bert_T: torch.nn.Module  # the trained copy; DDP-wrapped on several processes (raw() unwraps)
    head: torch.nn.Module  # f
    optimizer: torch.optim.Optimizer
    trainable: list  # the parameters the optimizer updates, clipped together
    layers: list  # the hidden states of BERT_F that give views (0 = embeddings .. l)
    total: int  # training steps
    tokenizer: object  # the training tokenizer: truncates at --max-len
    eval_tokenizer: object  # the dev score's: evaluate.py's truncation
    examples: list  # training sentences, or (sentence, paraphrase) pairs
    data_dir: Path
    device: torch.device
    rank: int = 0
    world: int = 1
    gen: torch.Generator = None  # the shuffle and the layer draws: the same on every process
    meta: dict = field(default_factory=dict)  # checkpoint metadata (checkpoint.META)

    def autocast(self):
        bf16 = self.cfg.precision == "bf16"
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16)

    def step(self, step, s1, s2):  # s2: the paraphrases, or None (the views read s1 too)
        x1 = batch(self, self.tokenizer, s1)
        return train_step(self, step, x1, x1 if s2 is None else batch(self, self.tokenizer, s2))

    def vectors(self, model):  # sentences -> (n, H), for the dev score and the final report
        return evaluate.sentence_vectors(model, self.eval_tokenizer, self.cfg.eval_pooling,
                                         batch_size=self.cfg.eval_batch_size)

    def record(self):  # what --json says beyond the scores (the lab's: DiffCSE's generator)
        return {}


def train_step(run, step, x1, x2):
    """One step of SG-OPT or an ablation; x1, x2: (ids, mask) of c_i's and the views' sentences."""
    cfg = run.cfg
    # h_ik: BERT_F's hidden states k = run.layers, each pooled over the tokens -> (b, L, H)
    with torch.no_grad(), run.autocast():
        hs = run.bert_F(*x2)
        h = torch.stack([view(hs[k], x2[1], cfg.view_pooling) for k in run.layers], 1)
    with run.autocast():
        c = bert.pool(run.bert_T(*x1), x1[1], cfg.pooling)  # c_i: BERT_T's [CLS] -> (b, H)
        b, L, H = h.shape  # f over c and h in one pass -> f(c) (b, p), f(h) (b, L, p), in fp32
        z = run.head(torch.cat([c, h.reshape(b * L, H)]))
        z_c, z_h = z[:b].float(), z[b:].float().view(b, L, -1)
    if cfg.loss != "opt":  # sg, opt1, opt2: one view a sentence, its layer drawn for the batch
        k = torch.randint(L, (b * run.world,), generator=run.gen)[run.rank * b:(run.rank + 1) * b]
        z_h = z_h[torch.arange(b, device=z_h.device), k.to(z_h.device)]
    rows = None  # one process: every sentence is an anchor
    if run.world > 1:  # this process's anchors against the whole global batch (runtime.py)
        z_c, z_h, rows = gather(z_c), gather(z_h), slice(run.rank * b, (run.rank + 1) * b)
    if cfg.loss == "opt":
        loss = sg_loss.sg_opt(z_c, z_h, cfg.tau, rows=rows)  # L^opt3, the paper's Eq. 4
    else:
        loss = ABLATIONS[cfg.loss](z_c, z_h, cfg.tau, rows=rows)  # Table 5
    run.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    # lam * ||BERT_T - BERT_F||^2, entered as its gradient once the loss's is in (and all-reduced)
    reg = sg_loss.add_weight_distance_grad_(raw(run.bert_T), run.bert_F, cfg.lam)
    lr, norm = update(run, step)
    return loss.detach(), reg, norm, lr


ABLATIONS = {"sg": sg_loss.nt_xent, "opt1": sg_loss.opt1, "opt2": sg_loss.opt2}


def view(hidden, mask, pooling):  # (b, T, H) pooled over the real tokens, [CLS] and [SEP] too
    return bert.masked_mean(hidden, mask) if pooling == "mean" else bert.pool([hidden], mask, "max")


def update(run, step):
    """The optimizer's tail, shared with the lab: lr, clip to norm 1, AdamW -> (lr, norm)."""
    lr = get_lr(step, run.total, run.cfg.lr)
    for g in run.optimizer.param_groups:
        g["lr"] = lr
    norm = torch.nn.utils.clip_grad_norm_(run.trainable, 1.0)
    run.optimizer.step()
    return lr, norm


def get_lr(step, total, peak):
    """Linear warm-up over 10% of the steps, then linear decay to 0 (the code's schedule)."""
    warmup = math.ceil(0.1 * total)
    if step < warmup:
        return peak * step / warmup
    return peak * max(0.0, (total - step) / max(1, total - warmup))

# -----------------------------------------------------------------------------
# the loop


def batches(run):
    """Endless shuffled epochs of (sentences, paraphrases or None), this process's share."""
    b = run.cfg.batch_size
    while True:
        perm = torch.randperm(len(run.examples), generator=run.gen).tolist()
        for s in range(0, len(perm), b):
            idx = perm[s:s + b]
            idx = idx[:len(idx) - len(idx) % run.world]
            if len(idx) >= max(2, run.world):
                share = len(idx) // run.world
                ex = [run.examples[i] for i in idx[run.rank * share:(run.rank + 1) * share]]
                pairs = isinstance(ex[0], tuple)
                yield ([e[0] for e in ex], [e[1] for e in ex]) if pairs else (ex, None)


def batch(run, tokenizer, sentences):  # -> (ids, mask) on the run's device
    pad = raw(run.bert_T).config.pad_token_id
    return bert.batch_tensors(tokenizer.encode_batch(sentences), pad, run.device)


def train_loop(run, keeper):
    """Steps, log lines, dev evaluations, the best checkpoint -> (why it stopped early, stats)."""
    cfg = run.cfg
    stats = dict(history=[], scores=[], step=0, t_start=time.time(), train_seconds=0.0,
                 eval_seconds=[])
    data_iter = itertools.repeat(next(batches(run))) if cfg.overfit_batch else batches(run)
    stop, step = None, 0
    try:
        t_eval = time.perf_counter()
        evaluation(run, keeper, stats, 0)
        t_mark, mark = time.perf_counter(), 0  # training time since the last log line or evaluation
        stats["eval_seconds"].append(t_mark - t_eval)
        while step < run.total and not stop:
            loss, reg, norm, lr = run.step(step, *next(data_iter))
            step = stats["step"] = step + 1
            if step % cfg.log_every == 0 or step in (1, run.total):
                loss_v = runtime.mean(loss, run.world).item()  # the one CPU-GPU sync, at log time
                elapsed = time.perf_counter() - t_mark
                dt, t_mark, mark = elapsed / (step - mark), time.perf_counter(), step
                stats["train_seconds"] += elapsed
                stats["history"].append((step, loss_v))
                if not math.isfinite(loss_v):
                    stop = f"non-finite loss {loss_v} at step {step}"
                    break
                eta = eta_seconds(step, run.total, cfg.eval_every, stats["train_seconds"] / step,
                                  sum(stats["eval_seconds"]) / len(stats["eval_seconds"]))
                print(f"step {step}/{run.total} | loss {loss_v:.4f} | reg {reg.item():.2e} | norm "
                      f"{norm.item():.2f} | lr {lr:.2e} | {1000 * dt:.0f} ms/step | "
                      f"{cfg.batch_size / dt:.0f} sent/s | ETA {eta / 60:.1f} min", flush=True)
            if step % cfg.eval_every == 0 or step == run.total:
                runtime.sync(run.device)
                t_eval = time.perf_counter()
                stats["train_seconds"] += t_eval - t_mark  # the steps since the last log line
                stop = evaluation(run, keeper, stats, step)
                t_mark, mark = time.perf_counter(), step  # the next log line times steps only
                stats["eval_seconds"].append(t_mark - t_eval)
    except KeyboardInterrupt:
        if keeper:
            print(f"train.py: interrupted at step {step}; {keeper.kept()}", file=sys.stderr)
        sys.exit(130)
    return stop, stats


def eta_seconds(step, total, eval_every, seconds_per_step, seconds_per_eval):
    evals = total // eval_every - (step - 1) // eval_every + (total % eval_every != 0)
    return (total - step) * seconds_per_step + evals * seconds_per_eval


def early_stop(scores, rule, patience):
    """'code' (the official code's): the scores below the one before; 'best': since the best."""
    if not patience:
        return False
    if rule == "code":  # never reset; the first score is compared with 0
        return sum(s < prev for s, prev in zip(scores, [0.0] + scores[:-1])) >= patience
    return len(scores) - 1 - scores.index(max(scores)) >= patience


# -----------------------------------------------------------------------------
# evaluation and the best checkpoint


def evaluation(run, keeper, stats, step):  # rank 0 scores and keeps; every process: stop now?
    stop = None
    if run.rank == 0:
        print(f"eval step {step} | encoding STS-B dev ...",
              end="\r" if sys.stdout.isatty() else "\n", flush=True)
        dev = evaluate.stsb_spearman(run.vectors(raw(run.bert_T)), run.data_dir, "dev")
        keeper.offer(step, dev)
        stats["scores"].append(dev)
        best = keeper.best
        print(f"eval step {step} | STS-B dev {dev:.2f}" + (" (the base model)" if not step else
              f" | best {best['dev']:.2f} (step {best['step']})"), flush=True)
        if early_stop(stats["scores"], run.cfg.early_stop, run.cfg.patience):
            stop = f"early stop ({run.cfg.early_stop} rule, patience {run.cfg.patience})"
    stop_all = runtime.agree(stop is not None, run.world, run.device)  # all processes stop together
    return (stop or "early stop (rank 0)") if stop_all else None


class BestCheckpoint:
    """The best weights so far, in --out. Step 0, the base model, is the bar unless --select any."""

    def __init__(self, run):
        self.run, self.out = run, run.cfg.out
        self.best = {"step": -1, "dev": -math.inf}  # the best selectable evaluation so far
        self.base = None  # step 0's dev score: the base model's
        self.saved = {}  # the step and dev score of the checkpoint this run wrote to --out
        self.keep_old = Path(self.out).exists()

    def kept(self):  # what --out holds now, for the last line of a run that stops early
        s, out = self.saved, self.out
        if s:
            return f"the best checkpoint so far (step {s['step']}, dev {s['dev']:.2f}) is {out}"
        old = f"the previous {out} is kept" if self.keep_old else "none was written"
        return "no trained checkpoint exists yet; " + old

    def save(self, model, step, dev):
        best = {"step": step, "dev": dev}
        meta = {**self.run.meta, "config": model.config.to_dict(), "best": best}
        weights = model.tensors()
        bad = [k for k, v in weights.items()
               if v.is_floating_point() and not torch.isfinite(v).all()]
        if bad:  # never kept, whatever its score
            die(f"non-finite weights (NaN or inf) in {', '.join(bad[:2])} at step {step}; "
                f"{self.kept()}")
        try:
            checkpoint.save_checkpoint(self.out, weights, meta)
        except OSError as e:  # e.g. a full disk: the file in place is intact (the write is atomic)
            die(f"cannot write {self.out} ({e.strerror or e}); {self.kept()}")
        self.saved = best  # only once the file is in place

    def offer(self, step, dev):
        if not math.isfinite(dev):  # never let a NaN score pick the "best" model
            die(f"STS-B dev Spearman is {dev} at step {step} (constant sentence vectors?); "
                f"{self.kept()}")
        if step == 0:
            self.base = dev
        if (step > 0 or self.run.cfg.select == "any") and dev > self.best["dev"]:
            self.best = {"step": step, "dev": dev}
            if step > 0:  # the base model is written at the end only, if it stays the best
                self.save(raw(self.run.bert_T), step, dev)

    def settle(self):  # at the end: the base model written if it stayed the best (--select any)
        if self.best["step"] == 0:  # --select any, and the base model stayed the best (BERT_F)
            self.save(self.run.bert_F, 0, self.best["dev"])
        elif self.best["step"] > 0 and self.base > self.best["dev"]:  # a trained one was kept
            print(f"note: the base model (step 0, dev {self.base:.2f}) scored above every trained "
                  f"evaluation; kept the best trained one, step {self.best['step']} (--select any "
                  "keeps the base model)")


def finish(run, keeper, stop, stats):  # the final report -> the --json result (None: none written)
    keeper.settle()
    wall, step = time.time() - stats["t_start"], stats["step"]
    if stop:
        print(f"{stop}; {keeper.kept()}")
    if not keeper.saved:  # stopped before any trained evaluation: nothing of this run to report on
        return None
    ms_per_step = 1000 * stats["train_seconds"] / max(step, 1)
    if step:
        print(f"{step} steps in {wall / 60:.1f} min ({ms_per_step:.0f} ms per training step)")
    model = bert.Bert.from_pretrained(run.cfg.out).to(run.device)
    result = final_report(run.cfg, run.vectors(model), run.data_dir, keeper.best, run.device)
    result.update(steps=step, base_dev=keeper.base, losses=stats["history"], wall_seconds=wall,
                  stop=stop, ms_per_step=ms_per_step, **run.record())
    return result


def final_report(cfg, vectors, data_dir, best, device):
    """STS-B dev and test of the best weights (the official code: the last), timed (Table 6)."""
    print("encoding STS-B dev and test ...", flush=True)
    dev = evaluate.stsb_spearman(vectors, data_dir, "dev")
    runtime.sync(device)
    t0 = time.perf_counter()
    test = evaluate.stsb_spearman(vectors, data_dir, "test")
    runtime.sync(device)
    seconds = time.perf_counter() - t0
    what = "base model" if best is None else f"best checkpoint {cfg.out} (step {best['step']})"
    print(f"{what} | STS-B dev {dev:.2f} | STS-B test {test:.2f} ({seconds:.1f} s)")
    result = {"best_step": None if best is None else best["step"], "dev": dev, "test": test,
              "test_seconds": seconds}
    if cfg.eval_all:
        print("the 7 STS tasks ...", flush=True)
        result["sts"] = evaluate.evaluate_sts(vectors, data.TASKS, data_dir)
        evaluate.print_table(result["sts"], data.TASKS, f"{cfg.out}: 7 STS tasks, "
                             f"{cfg.eval_pooling} pooling of the best checkpoint")
    return result


def write_result(path, result):  # --json; None: no checkpoint, no result
    if not path or result is None:
        return
    try:
        outputs.write_json(path, result)
    except OSError as e:
        die(f"cannot write --json {path} ({e.strerror or e}); the checkpoint and the report above "
            "are complete", code=1)

# -----------------------------------------------------------------------------
# setup


def read_setup(cfg):
    try:
        model = bert.Bert.from_pretrained(cfg.model)
        max_len = min(cfg.max_len, model.config.max_position_embeddings)
        tokenizer = bert.load_tokenizer(cfg.model, max_len=max_len)
        data_dir = data.resolve_data_dir(cfg.data_dir, need_stsb=cfg.data == "stsb")
        examples = data.training_sentences(cfg.data, data_dir)  # or (sentence, paraphrase) pairs
        data.load_stsb("dev", data_dir)  # read at every evaluation: fail now, not mid-training
        for task in data.TASKS if cfg.eval_all else ["STSBenchmark"]:
            data.load_task(task, data_dir)
    except checkpoint.LoadError as e:  # a hub name with no network: the error says what works here
        die(f"{e}{checkpoint.models_here(cfg.model)}")
    except data.DataError as e:
        die(e)
    if len(examples) < 2:
        die(f"--data {cfg.data}: {len(examples)} sentence(s); training needs at least 2")
    if cfg.data == "stsb":
        print("note: the STS-B dev and test sentences are part of the unlabelled training data, "
              "as in the paper (no labels are used)")
    return model, tokenizer, examples, data_dir


def build_run(cfg, bert_F, tokenizer, examples, data_dir, device, rank=0, world=1):
    layers = view_layers(cfg.layers, bert_F.config.num_hidden_layers + 1)
    bert_F, bert_T = two_berts(cfg, bert_F, device)
    H = bert_F.config.hidden_size
    head = torch.nn.Identity() if cfg.no_proj else sg_loss.ProjectionHead(H, cfg.proj_size)
    head = head.to(device)
    torch.manual_seed(cfg.seed + rank)  # dropout: each process its own masks
    optimizer = adamw([bert_T, head], cfg)
    bert_T, head = runtime.wrap(bert_T, head, device, world)
    total = steps(cfg, examples, world)
    kind = "pairs" if isinstance(examples[0], tuple) else "sentences"
    print(f"{len(examples)} {kind} | {total} steps of {cfg.batch_size} | {cfg.loss} (tau {cfg.tau})"
          f" | BERT_F's views: hidden states {layers[0]}..{layers[-1]} ({len(layers)})")
    return Run(cfg=cfg, bert_F=bert_F, bert_T=bert_T, head=head, optimizer=optimizer, total=total,
               trainable=[p for g in optimizer.param_groups for p in g["params"]], layers=layers,
               eval_tokenizer=evaluate.eval_tokenizer(tokenizer, bert_F.config), examples=examples,
               tokenizer=tokenizer, data_dir=data_dir, device=device, rank=rank, world=world,
               gen=torch.Generator().manual_seed(cfg.seed), meta=run_meta(cfg, tokenizer))


def two_berts(cfg, bert_F, device):
    torch.manual_seed(cfg.seed)
    bert_F = bert_F.to(device).train(cfg.teacher_dropout == "on").requires_grad_(False)
    bert_T = copy.deepcopy(bert_F).train(cfg.dropout == "on").requires_grad_(True)
    bert_T.embeddings.requires_grad_(False)
    return bert_F, bert_T


def adamw(modules, cfg):  # the code's: betas (0.9, 0.9), eps 1e-6, decay on weight matrices only
    decay, no_decay = [], []
    for m in modules:
        for name, p in m.named_parameters():
            if p.requires_grad:
                (no_decay if name.endswith("bias") or "LayerNorm" in name else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.9), eps=1e-6, fused=True)


def steps(cfg, examples, world):  # --max-steps, else the epochs' batches (see batches())
    last = len(examples) % cfg.batch_size
    n_batches = len(examples) // cfg.batch_size + (last - last % world >= max(2, world))
    return cfg.max_steps or cfg.epochs * n_batches


def view_layers(spec, n_hidden):
    layers = list(range(n_hidden))[layer_slice(spec)]
    if not layers:
        die(f"--layers {spec}: selects none of the {n_hidden} hidden states 0..{n_hidden - 1}")
    return layers


def run_meta(cfg, tokenizer):  # what every checkpoint of the run says of it (checkpoint.META)
    sha = checkpoint.weights_sha256(cfg.model)  # of the base model's weights on disk
    return {"tokenizer": tokenizer.to_str(), "base_model": checkpoint.display_name(cfg.model),
            **({"base_sha256": sha} if sha else {}), "args": vars(cfg), "git": git_sha(),
            "pooling": cfg.eval_pooling, "method": cfg.loss}


def header(cfg, device, world=1):
    flags = {**vars(cfg), "data_dir": data.data_dir_from(cfg.data_dir)[0].resolve()}
    name = cli.model_name(cfg.model)
    flags["model"] = name if name == str(cfg.model) else f"{name} ({cfg.model})"
    return (f"sgbert {git_sha()} | device {device}" + (f" x {world} processes" if world > 1 else "")
            + " | " + " ".join(f"{k}={v}" for k, v in flags.items()))


def check_config(cfg):
    try:
        cfg.eval_only or checkpoint.check_checkpoint_path(cfg.out, write=True)
        cfg.json and outputs.check_output(cfg.json, ".json")
    except (checkpoint.LoadError, outputs.OutputError) as e:
        die(e)
    reads = evaluate.model_inputs("--model", cfg.model)
    reads += [("--data file", cfg.data)] if cfg.data != "stsb" else []
    evaluate.check_not_read("--json", cfg.json, reads)
    if Path(cfg.out).exists() and not cfg.overwrite and not cfg.eval_only:
        die(f"--out {cfg.out} exists: pass --overwrite to replace it (it is kept until this run "
            "has a checkpoint of its own), or choose another --out")


def main(argv=None):
    cfg = get_args(argv)
    check_config(cfg)
    rank, world, device = runtime.init(cfg)
    print(header(cfg, device, world))
    if cfg.eval_only:
        model, tokenizer, _, data_dir = read_setup(cfg)
        model = model.to(device)
        vectors = evaluate.sentence_vectors(model, evaluate.eval_tokenizer(tokenizer, model.config),
                                            cfg.eval_pooling, batch_size=cfg.eval_batch_size)
        return final_report(cfg, vectors, data_dir, None, device)
    return train(build_run(cfg, *read_setup(cfg), device, rank, world))


def train(run):  # the lab's methods' runs too
    with contextlib.ExitStack() as held:
        held.enter_context(runtime.bf16_products(run.cfg.precision, run.device.type))
        keeper = None
        if run.rank == 0:  # only rank 0 writes --out
            try:
                held.enter_context(outputs.output_lock(run.cfg.out))  # one run per --out
            except outputs.OutputError as e:  # another run holds it, or no lock file
                die(e)
            keeper = BestCheckpoint(run)
        stop, stats = train_loop(run, keeper)
        if run.world > 1:
            runtime.close()
        result = finish(run, keeper, stop, stats) if run.rank == 0 else None
        write_result(run.cfg.json, result)
    code = 1 if stop and stop.startswith("non-finite") else 0
    if run.world > 1:
        runtime.leave(code)  # now, while `run` holds the DDP reducer (runtime.leave says why)
    if code:
        sys.exit(code)
    return result


if __name__ == "__main__":
    cli.run(main, "train.py")
