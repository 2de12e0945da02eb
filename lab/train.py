"""
The lab's trainer: every method of lab/methods.py in the core's loop (train.py). The SG family (--loss opt, sg, opt1,
opt2) is the core's own train_step, here with the lab's --aug1 / --aug2 inside its passes (AugmentedRun).

A method (methods.py) is code: its two sides, which encoder makes each from what input, pooled how, its head and
its loss. ConSERT and SimCSE (two_passes) make both sides with BERT_T, twice; PromptBERT (prompt_pair) reads the
sentence inside two templates. One step is the same few lines for every method (train_step): batch -> method.sides
-> method.loss -> backward -> the method's state -> method.regulariser -> train.update (clip, AdamW: the core's tail).
The loop, the evaluations, the best checkpoint, DDP and the final report are the core's (train.py). Whitening and
the flow are not trained: a map of the base model's vectors is fitted (fit_posthoc, lab/posthoc.py).

    python -m lab.train --model bert-base-uncased --loss simcse --out simcse.safetensors
    torchrun --nproc_per_node 2 -m lab.train --loss simcse ...

References: ConSERT: Yan et al., ACL 2021 (yym6472/ConSERT). SimCSE: Gao et al., EMNLP 2021 (princeton-nlp/SimCSE).
PromptBERT: Jiang et al., EMNLP 2022 (kongds/Prompt-BERT). The others: lab/methods.py.
"""
import argparse
import contextlib
import copy
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

import bert
import checkpoint
import cli
import evaluate
import outputs
import runtime
import train
from cli import die
from lab import augment, cpu, methods, posthoc
from lab import evaluate as lab_evaluate

PROG = "python -m lab.train"


def get_args(argv=None):
    p = cli.parser(PROG, __doc__.split("\n\n")[0].strip(), "example: python -m lab.train --model "
                   "bert-base-uncased --loss simcse --out simcse.safetensors")
    methods.add_method_flags(p.add_argument)
    cli.add_run_flags(p.add_argument)
    args = cli.parse(p, argv)
    args.given = given_flags(p, argv)
    return args


def given_flags(parser, argv):
    """The flags the user wrote, whatever their values: the parser again with no defaults."""
    bare = copy.deepcopy(parser)
    for action in bare._actions:
        action.default = argparse.SUPPRESS
    return sorted(vars(bare.parse_args(argv)))


def used_flags(cfg):
    """The resolved config less the flags that mean nothing for its method (methods.py: its `ignores`, and another
    method's own settings): what the run's config line shows. The checkpoint's metadata keeps them all."""
    return {k: v for k, v in vars(cfg).items() if methods.takes(cfg.loss, k)}


def header(cfg, device, world=1):
    """train.header, with the flags this method takes."""
    return train.header(argparse.Namespace(**used_flags(cfg)), device, world)


# -----------------------------------------------------------------------------
# one step of any method


@dataclass
class AugmentedRun(train.Run):
    """The core's SG family (train.train_step) with ConSERT's augmentations inside its passes: --aug1 in BERT_T's,
    --aug2 in BERT_F's (augment.py), drawn from a generator of their own, one per process."""
    aug1: augment.Augmentation = None
    aug2: augment.Augmentation = None
    aug_gen: torch.Generator = None

    def step(self, step, s1, s2):
        with augmenting(runtime.raw(self.bert_T), self.aug1, self.aug_gen), \
                augmenting(self.bert_F, self.aug2, self.aug_gen):
            return super().step(step, s1, s2)


@contextlib.contextmanager
def augmenting(bert, aug, gen):
    """bert's forward passes with aug inside, as methods.augmented makes them: each pass draws its position ids and
    embedding function (a forward pre-hook) and holds them on the embeddings until it ends (augment.forward)."""
    live = []

    def draw(module, args):
        mask = args[1]
        live.extend(augment.embedding_hooks(bert, aug.position_ids(mask, gen), aug.embedding_fn(mask, gen)))

    def drop(module, args, out):
        while live:
            live.pop().remove()
    handles = [] if aug.kind == "none" else [bert.register_forward_pre_hook(draw), bert.register_forward_hook(drop)]
    try:
        yield
    finally:
        for h in handles + live:
            h.remove()


@dataclass
class MethodRun(train.Run):
    """train.Run with a method of the table: its sides, head, loss and regulariser, and its state across steps."""
    method: methods.Method = None  # this run's (methods.build)
    state: methods.State = None  # ESimCSE: its momentum encoder and queue; most: none

    def gather(self, x):
        """x (b_local, ...) of every process in rank order -> (b, ...); x itself on one process."""
        return runtime.gather(x) if self.world > 1 else x

    def step(self, step, s1, s2):
        return train_step(self, step, *inputs(self, s1, s2))

    def vectors(self, model):  # PromptBERT: its first template, not denoised
        return lab_evaluate.sentence_vectors(model, self.eval_tokenizer, self.cfg.eval_pooling,
                                            batch_size=self.cfg.eval_batch_size, template=self.cfg.template)

    def record(self):
        return dict(self.state.meta)  # DiffCSE: its generator, by name and sha256


def train_step(run, step, x1, x2):
    """One optimisation step, the same for every method (methods.py): its two sides through its head, its loss,
    backward, its state's update (a no-op for most), its regulariser, then the core's clip and AdamW step at the lr
    of get_lr(step). x1, x2: (ids, mask) of side 1's and side 2's sentences. Returns the loss, lam * L^reg, the
    gradient norm and the lr, as tensors (no device synchronisation: the loop reads them at log time)."""
    method = run.method
    z = method.sides(run, x1, x2)  # e.g. SimCSE: z1, z2 (b, p), fp32; SSCL: z1, z2 and n
    rows = None  # one process: every sentence is an anchor
    if run.world > 1:
        # Anchors are this process's rows, negatives the whole global batch: z1 and z2 (and SSCL's n) of every
        # process, gathered in rank order (sentence rank * b_local + i), through the autograd all_gather.
        z = [runtime.gather(t) for t in z]
        share = len(z[0]) // run.world
        rows = slice(run.rank * share, (run.rank + 1) * share)
    # held: what the method keeps across steps and the loss reads (ESimCSE: its queue; most: nothing)
    loss = method.loss(*z, *run.state.held, run.cfg.tau, rows=rows)  # the mean over this process's anchors
    run.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    # the method's own state, from the weights this step's forward used (ESimCSE: the EMA, then the queue)
    run.state.before_update(run, x1, x2)
    if run.world > 1:
        average_grads(run.state.modules, run.world)  # the method's own modules: averaged, as DDP does BERT_T's
    # sg-opt-sscl: the gradient of lam * ||BERT_T - BERT_F||^2, added once DDP has all-reduced the loss's (else 0)
    reg = method.regulariser(runtime.raw(run.bert_T), run.bert_F, run.cfg.lam)
    lr, norm = train.update(run, step)
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


def inputs(run, s1, s2):
    """(ids, mask) of side 1's and side 2's sentences, each side read by its own tokenizer (the method's: PromptBERT's
    are its templates). Side 2 reads the paraphrases of --data's pairs, else side 1's sentences again: the same
    tensors when both sides read alike."""
    t1, t2 = run.method.tokenizers
    x1 = train.batch(run, t1, s1)
    return x1, (x1 if s2 is None and t2 is t1 else train.batch(run, t2, s1 if s2 is None else s2))

# -----------------------------------------------------------------------------
# setup


def build_run(cfg, bert_F, tokenizer, examples, data_dir, device, rank=0, world=1):
    """The SG family: train.build_run (with --aug1 / --aug2: an AugmentedRun). Any other method: its pieces with the
    method's head and state (built after the head, before the optimizer)."""
    if methods.METHODS[cfg.loss].core:
        run = train.build_run(cfg, bert_F, tokenizer, examples, data_dir, device, rank, world)
        aug1, aug2 = augment.parse(cfg.aug1), augment.parse(cfg.aug2)
        if aug1.kind == aug2.kind == "none":
            return run
        return AugmentedRun(**vars(run), aug1=aug1, aug2=aug2,
                            aug_gen=torch.Generator().manual_seed(cfg.seed + rank))
    method, H = methods.build(cfg, tokenizer, bert_F.config.max_position_embeddings, rank), bert_F.config.hidden_size
    layers = train.view_layers(cfg.layers, bert_F.config.num_hidden_layers + 1)
    bert_F, bert_T = train.two_berts(cfg, bert_F, device)
    head = method.head(H, cfg).to(device)
    check_neg_layers(cfg, bert_F.config.num_hidden_layers)
    state = method.state(cfg, bert_T, tokenizer, device)  # the method's own across steps; its draws after the head's
    torch.manual_seed(cfg.seed + rank)  # dropout: each process its own masks (rank 0 = one process's stream)
    optimizer = train.adamw([bert_T, head, *state.modules], cfg)
    bert_T, head = runtime.wrap(bert_T, head, device, world)
    total = train.steps(cfg, examples, world)
    print(f"{len(examples)} {'pairs' if isinstance(examples[0], tuple) else 'sentences'} | {total} steps of "
          f"{cfg.batch_size} | {cfg.loss}: {method.sides.__name__} -> {method.head.__name__} -> {method.loss.__name__}"
          f" (tau {cfg.tau})" + (f" | BERT_F's views: hidden states {layers[0]}..{layers[-1]} ({len(layers)})"
                                 if methods.takes(cfg.loss, "layers") else ""))
    meta = {**train.run_meta(cfg, tokenizer), **({"template": cfg.template} if methods.takes(cfg.loss, "template")
                                                  else {})}
    return MethodRun(cfg=cfg, method=method, state=state, bert_F=bert_F, bert_T=bert_T, head=head,
                     optimizer=optimizer, trainable=[p for g in optimizer.param_groups for p in g["params"]],
                     layers=layers, total=total, tokenizer=tokenizer,
                     eval_tokenizer=evaluate.eval_tokenizer(tokenizer, bert_F.config), examples=examples,
                     data_dir=data_dir, device=device, rank=rank, world=world,
                     gen=torch.Generator().manual_seed(cfg.seed), meta=meta)


def setup(cfg, device, rank=0, world=1):
    return build_run(cfg, *train.read_setup(cfg), device, rank, world)


def check_neg_layers(cfg, l):
    """SSCL's --neg-layers K: the hidden states l-1 .. l-K below the last, pooled; K <= l (down to the embedding
    output), K <= l - 1 for a pooling that reads layer 1 as well (first-last, last2)."""
    if methods.takes(cfg.loss, "neg_layers"):
        most = l - (cfg.pooling in ("first-last", "last2"))
        if cfg.neg_layers > most:
            die(f"--neg-layers {cfg.neg_layers}: the model has {l} layers, and --pooling {cfg.pooling} pools at most "
                f"{most} hidden states below the last; give 1..{most}")


def main(argv=None):
    cfg = methods.resolve_config(get_args(argv))
    train.check_config(cfg)
    rank, world, device = runtime.init(cfg)
    print(header(cfg, device, world))
    if rank == 0 and not cfg.eval_only:
        cpu.warn_slow_bf16(cfg.precision, device.type)  # bf16 on a CPU without bf16 matrix instructions: slow
    if methods.METHODS[cfg.loss].fit and not cfg.eval_only:  # whitening, flow: no contrast
        if world > 1:
            die(f"--loss {cfg.loss} is fitted in one process: run it with python, not torchrun")
        return fit_posthoc(cfg, device)
    if cfg.eval_only:
        model, tokenizer, _, data_dir = train.read_setup(cfg)
        model = model.to(device)
        vectors = lab_evaluate.sentence_vectors(model, evaluate.eval_tokenizer(tokenizer, model.config),
                                               cfg.eval_pooling, batch_size=cfg.eval_batch_size,
                                               template=cfg.template)
        return train.final_report(cfg, vectors, data_dir, None, device)
    return train.train(setup(cfg, device, rank, world))

# -----------------------------------------------------------------------------
# the post-hoc baselines: BERT stays as it is, a map of its sentence vectors is fitted (posthoc.py)


def fit_posthoc(cfg, device):
    """--loss whitening | flow: the training sentences' vectors from the base model, the transform fitted on them,
    saved with the base weights (its tensors under checkpoint.TRANSFORM_PREFIX), then the usual final report."""
    model, tokenizer, examples, data_dir = train.read_setup(cfg)
    sentences = [s for e in examples for s in (e if isinstance(e, tuple) else (e,))]  # pairs: both sides
    H = model.config.hidden_size
    if cfg.whiten_dim and cfg.whiten_dim > H:
        die(f"--whiten-dim {cfg.whiten_dim}: {cfg.model} has {H} dimensions; give 1..{H}")
    if cfg.loss == "flow" and cfg.batch_size > len(sentences):
        die(f"--batch-size {cfg.batch_size}: the flow's batches are full ones, and --data has {len(sentences)} "
            "sentences; give a smaller --batch-size")
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(outputs.output_lock(cfg.out))  # one run per --out: a second one refuses in one line
        except outputs.OutputError as e:  # another run holds it, or its lock file cannot be made
            die(e)
        t0 = time.time()
        dropout = cfg.loss == "flow" and cfg.dropout == "on"
        torch.manual_seed(cfg.seed)  # the dropout masks: a function of --seed (torch's own first seed is random)
        print(f"encoding {len(sentences)} training sentences ({cfg.pooling}{', dropout on' if dropout else ''}) ...",
              flush=True)
        x = bert.encode(model.to(device), tokenizer, sentences, cfg.pooling, batch_size=cfg.eval_batch_size,
                        dropout=dropout, progress=cli.Counter(print))
        kept = f"the previous {cfg.out} is kept" if Path(cfg.out).exists() else f"{cfg.out} is not written"
        tensors, info, stats = fit_map(cfg, x, kept)
        fit_seconds = time.time() - t0
        transform = posthoc.make_transform(info, tensors)
        vectors = lab_evaluate.sentence_vectors(model, evaluate.eval_tokenizer(tokenizer, model.config),
                                               cfg.eval_pooling, transform=transform, batch_size=cfg.eval_batch_size)
        dev = evaluate.stsb_spearman(vectors, data_dir, "dev")
        if not math.isfinite(dev):  # a NaN score never replaces a good file
            die(f"STS-B dev Spearman of the fitted {cfg.loss} is {dev} (constant sentence vectors?); {kept}")
        meta = {**train.run_meta(cfg, tokenizer), "config": model.config.to_dict(), "transform": info,
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
    vectors = lab_evaluate.sentence_vectors(model, evaluate.eval_tokenizer(tokenizer, model.config),
                                           cfg.eval_pooling, transform=transform, batch_size=cfg.eval_batch_size)
    result = train.final_report(cfg, vectors, data_dir, meta["best"], device)
    result.update(steps=stats["steps"], losses=stats["losses"], wall_seconds=time.time() - t0, stop=None,
                  fit_seconds=fit_seconds, ms_per_step=1000 * stats.get("seconds", 0.0) / max(stats["steps"], 1))
    train.write_result(cfg.json, result)
    return result


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


if __name__ == "__main__":
    cli.run(main, "lab.train")
