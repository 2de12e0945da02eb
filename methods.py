"""
The methods train.py runs, as one table. A method is code: which encoder makes each side of the contrast, from what
input, pooled how (its `sides`, a function below: views_of_F, one_view_of_F, two_passes, prompt_pair), the head both
sides go through, its loss (sg_loss.py's equations), and, for the SG family, the regulariser's gradient. Beside the
code: how BERT_T's output becomes the sentence vector at evaluation, and the method's own recipe's defaults for the
shared flags. The flags that set a method and its hyperparameters live here too, with resolve_config, which applies a
method's recipe to the flags not given and refuses, in one line, a flag that means nothing for the chosen method, and
takes(loss, flag), the one answer to which flags a method takes.

(!!) No torch at the top of this file: train.py parses its command line, and experiments.py plans its runs, from this
table before torch loads (seconds). The functions that run in a step import torch, bert and sg_loss where they use
them; once a run has started, such an import is a lookup in sys.modules.

References: SG-OPT, SG, OPT1, OPT2: Kim, Yoo, Lee, ACL 2021 (section 3, Table 5) and galsang/SG-BERT; ConSERT: Yan et
al., ACL 2021 (yym6472/ConSERT, scripts/unsup-consert-base.sh); SimCSE: Gao et al., EMNLP 2021 (princeton-nlp/SimCSE);
PromptBERT: Jiang et al., EMNLP 2022 (kongds/Prompt-BERT, run.sh unsup-bert); whitening: Su et al. 2021; BERT-flow: Li
et al., EMNLP 2020 (bohanli/BERT-flow).
"""
import argparse
from dataclasses import dataclass, field, replace
from typing import Callable

import augment
import prompt
from cli import at_least, die, positive

POOLINGS = ("cls", "mean", "max", "first-last", "last2")  # bert.POOLINGS (tests/test_methods.py checks)

# -----------------------------------------------------------------------------
# each method's two sides: (run, x1, x2) -> z1, z2 through the head, in fp32. run: train.py's Run (the encoders, the
# head, the config, run.method: this run's Method, whose state the sides read); x1, x2: (ids, mask) of side 1's and
# side 2's sentences (the same tensors unless --data has pairs, or PromptBERT's second template)


def views_of_F(run, x1, x2):
    """SG-OPT (the paper's section 3): side 1 is c_i, BERT_T's sentence vector of x1 (b, H); side 2 the views h_ik
    of the frozen BERT_F, its hidden states run.layers of x2, each pooled over all real tokens ([CLS]/[SEP]
    included) -> (b, L, H). One pass of the shared head f over both -> z1 (b, p), z2 (b, L, p)."""
    import torch
    import bert
    m, cfg = run.method, run.cfg
    with torch.no_grad(), run.autocast():  # BERT_F: frozen, never in the autograd graph
        hs = augmented(run.bert_F, x2, m.aug2, m.aug_gen)
        pool = bert.masked_mean if cfg.view_pooling == "mean" else lambda x, mask: bert.pool([x], mask, "max")
        h = torch.stack([pool(hs[k], x2[1]) for k in run.layers], 1)  # h_ik: (b, L, H)
    with run.autocast():
        c = bert.pool(augmented(run.bert_T, x1, m.aug1, m.aug_gen), x1[1], cfg.pooling)  # c_i: (b, H)
        return project(run.head, c, h)


def one_view_of_F(run, x1, x2):
    """SG, OPT1, OPT2 (Table 5): views_of_F, then one view per sentence, its layer sampled uniformly -> z1, z2 (b, p).
    The draws are the global batch's, the same on every process (run.gen): each process takes its sentences' rows."""
    import torch
    z1, z2 = views_of_F(run, x1, x2)
    b, L, _ = z2.shape
    k = torch.randint(L, (b * run.world,), generator=run.gen)[run.rank * b:(run.rank + 1) * b].to(z2.device)
    return z1, z2[torch.arange(b, device=z2.device), k]


def two_passes(run, x1, x2):
    """ConSERT, SimCSE: both sides are BERT_T, twice, each pass with its own dropout mask and its own augmentation
    (ConSERT's; SimCSE's are none) -> z1, z2 (b, p)."""
    import bert
    m, pooling = run.method, run.cfg.pooling
    with run.autocast():
        c1 = bert.pool(augmented(run.bert_T, x1, m.aug1, m.aug_gen), x1[1], pooling)  # (b, H)
        c2 = bert.pool(augmented(run.bert_T, x2, m.aug2, m.aug_gen), x2[1], pooling)  # other augmentation and mask
        return through_head(run.head, c1, c2)


def prompt_pair(run, x1, x2):
    """PromptBERT: side 1 and side 2 are BERT_T's [MASK] vectors of the sentence inside two different templates
    (x1 and x2 are read by them: run.method.tokenizers), each less its template's own at the sentence's length
    (denoising, prompt.py) -> z1, z2 (b, p)."""
    t1, t2 = run.method.tokenizers
    with run.autocast():
        return through_head(run.head, t1.denoised(run.bert_T, *x1), t2.denoised(run.bert_T, *x2))


def sentences(cfg, tokenizer, max_positions):
    """Each side reads its sentences with the run's tokenizer."""
    return tokenizer, tokenizer


def templates(cfg, tokenizer, max_positions):
    """PromptBERT: each side reads its sentences inside its template (--template, --template2)."""
    import checkpoint
    out = []
    for flag, text in (("--template", cfg.template), ("--template2", cfg.template2)):
        try:
            out.append(prompt.Template(text, tokenizer, max_positions))
        except checkpoint.LoadError as e:
            die(f"{flag} {e}")
    return tuple(out)


def augmented(model, x, aug, gen):
    """model's hidden states of x = (ids, mask) with the augmentation aug inside (augment.py; none: as it is)."""
    ids, mask = x
    return model(ids, mask, position_ids=aug.position_ids(mask, gen), embedding_fn=aug.embedding_fn(mask, gen))


def project(head, c, h):
    """One pass of the shared head f over c (b, H) and h (b, L, H) -> f(c) (b, p) and f(h) (b, L, p), in fp32."""
    import torch
    b, L, H = h.shape
    z = head(torch.cat([c, h.reshape(b * L, H)]))
    return z[:b].float(), z[b:].float().view(b, L, -1)


def through_head(head, c1, c2):
    """One pass of the head over both sides' vectors (b, H) -> (b, p) each, in fp32."""
    import torch
    z = head(torch.cat([c1, c2]))
    return z[:len(c1)].float(), z[len(c1):].float()

# -----------------------------------------------------------------------------
# heads, losses and regularisers: head(H, cfg) -> the module f; loss(z1, z2, tau, rows) -> the mean over this
# process's anchors (sg_loss.py, the paper's symbols); regulariser(BERT_T, BERT_F, lam), after backward


def projection_head(H, cfg):
    """The paper's f: Linear H -> p, GELU, Linear p -> p, GELU (p = --proj-size, 4096)."""
    import sg_loss
    return sg_loss.ProjectionHead(H, cfg.proj_size)


def mlp_head(H, cfg=None):
    """SimCSE's MLPLayer (PromptBERT's too): Linear H -> H, then Tanh. Initialised as both codes do it (cl_init calls
    transformers' init_weights: weight N(0, 0.02), BERT's initializer_range; bias 0), not with torch's default."""
    import torch
    linear = torch.nn.Linear(H, H)
    torch.nn.init.normal_(linear.weight, std=0.02)
    torch.nn.init.zeros_(linear.bias)
    return torch.nn.Sequential(linear, torch.nn.Tanh())


def no_head(H, cfg=None):
    """No head: the loss sees BERT's vectors (ConSERT; --no-proj)."""
    import torch
    return torch.nn.Identity()


def L_opt3(z1, z2, tau, rows=None):
    """SG-OPT's L^opt3: c_i against its views h_ik at every layer at once (z2: (b, L, p))."""
    import sg_loss
    return sg_loss.sg_opt(z1, z2, tau, rows=rows)


def L_base(z1, z2, tau, rows=None):
    """L^base, NT-Xent over the 2b vectors: SG's loss, and ConSERT's."""
    import sg_loss
    return sg_loss.nt_xent(z1, z2, tau, rows=rows)


def L_opt1(z1, z2, tau, rows=None):
    """L^opt1: only c_i is an anchor; the other c_j and every h_j are its negatives: OPT1's loss."""
    import sg_loss
    return sg_loss.opt1(z1, z2, tau, rows=rows)


def L_opt2(z1, z2, tau, rows=None):
    """L^opt2: only z1_i is an anchor, against every z2_j: OPT2's loss, and SimCSE's and PromptBERT's InfoNCE."""
    import sg_loss
    return sg_loss.opt2(z1, z2, tau, rows=rows)


def weight_distance_grad(bert_T, bert_F, lam):
    """The SG family's L^reg = lam * ||BERT_T - BERT_F||^2, entered as its gradient 2 lam (theta_T - theta_F) once the
    loss's is in (after DDP's all-reduce: added once, on every process); returns lam * L^reg for the log. Same update
    as backpropagating it, without an autograd graph over every weight (tests/test_sg_loss.py proves it). Called
    through the module: bench.py times it by patching sg_loss.add_weight_distance_grad_."""
    import sg_loss
    return sg_loss.add_weight_distance_grad_(bert_T, bert_F, lam)


def no_regulariser(bert_T, bert_F, lam):
    import torch
    return torch.zeros(())

# -----------------------------------------------------------------------------
# the table


@dataclass(frozen=True)
class Method:
    """A method as its code (its two sides, head, loss, regulariser), how BERT_T's output becomes its sentence vector
    in training and at evaluation, and the flag defaults of its own recipe. build() gives a run its copy, with the
    state the sides read (the augmentations and their generator, each side's tokenizer)."""
    sides: Callable = None  # (run, x1, x2) -> z1, z2; None: not a contrast, a post-hoc map fitted on BERT's vectors
    loss: Callable = None  # (z1, z2, tau, rows) -> scalar
    head: Callable = no_head  # (H, cfg) -> f
    regulariser: Callable = no_regulariser  # (BERT_T, BERT_F, lam) -> lam * L^reg, its gradient added
    inputs: Callable = sentences  # (cfg, tokenizer, max_positions) -> side 1's and side 2's tokenizers
    pooling: str = "cls"  # BERT_T's sentence vector during training
    eval_pooling: str = "cls"  # ... at evaluation, recorded in the checkpoint
    recipe: dict = field(default_factory=dict)
    ignores: tuple = ()  # flags that mean nothing for this method: refused when given
    why: str = ""  # ... and why, for the one-line refusal
    # a run's state, set by build()
    tokenizers: tuple = ()  # side 1's and side 2's: the run's tokenizer twice, or PromptBERT's two prompt.Template
    aug1: augment.Augmentation = augment.Augmentation()  # of side 1's input (ConSERT)
    aug2: augment.Augmentation = augment.Augmentation()  # of side 2's input
    aug_gen: object = None  # torch.Generator of this process's augmentations


SG_ONLY = ("lam", "view_pooling", "teacher_dropout", "layers")  # flags that mean something for the SG family only
CONTRASTIVE = (*SG_ONLY, "tau", "aug1", "aug2", "no_proj", "proj_size", "eval_every", "patience", "early_stop",
               "overfit_batch", "eval_pooling")  # ... for any contrastive method
# ... for any method with gradient steps (--seed: the init, the order, the dropout masks; a whitening draws nothing)
GRADIENT = ("lr", "weight_decay", "batch_size", "epochs", "max_steps", "log_every", "dropout", "seed")
TWO_PASSES = "its side 2 is a second pass of BERT_T, not BERT_F's views"
SG = dict(head=projection_head, regulariser=weight_distance_grad)  # the paper's head f and L^reg
METHODS = {
    "opt": Method(views_of_F, L_opt3, **SG),
    "sg": Method(one_view_of_F, L_base, **SG),
    "opt1": Method(one_view_of_F, L_opt1, **SG),
    "opt2": Method(one_view_of_F, L_opt2, **SG),
    # ConSERT's unsupervised recipe (scripts/unsup-consert-base.sh): NT-Xent over the 2b views, no head
    "consert": Method(two_passes, L_base, no_head, pooling="mean", eval_pooling="last2", recipe=dict(
        tau=0.1, batch_size=96, max_len=64, lr=5e-7, dropout="off", aug1="feature-cutoff:0.2", aug2="shuffle"),
        ignores=(*SG_ONLY, "proj_size", "no_proj"), why=TWO_PASSES + ", and no head"),
    # SimCSE's unsupervised recipe: InfoNCE of view 1 against view 2 (gradients through both), MLP over [CLS] in
    # training, the raw [CLS] at evaluation
    "simcse": Method(two_passes, L_opt2, mlp_head, recipe=dict(tau=0.05, batch_size=64, max_len=32, lr=3e-5),
                     ignores=(*SG_ONLY, "proj_size"), why=TWO_PASSES + "; its head is an H x H MLP"),
    # PromptBERT's unsupervised BERT recipe (run.sh unsup-bert): InfoNCE as SimCSE's, MLP in training only. Evaluated
    # with the first template, not denoised. max_len: the sentence's tokens
    "promptbert": Method(prompt_pair, L_opt2, mlp_head, pooling="prompt", eval_pooling="prompt", recipe=dict(
        tau=0.05, batch_size=256, max_len=32, lr=1e-5, template=prompt.TRAIN_TEMPLATES[0],
        template2=prompt.TRAIN_TEMPLATES[1]), inputs=templates,
        ignores=(*SG_ONLY, "aug1", "aug2", "pooling", "eval_pooling", "proj_size"),
        why="its two sides are BERT_T's [MASK] vectors in two templates: no BERT_F, no augmentation, no other pooling, "
            "an H x H MLP head"),
    # the paper's post-hoc baselines (posthoc.py; train.fit_posthoc): BERT is not trained, a map of its first-last
    # vectors is fitted, in fp32. Flow: bohanli/BERT-flow's defaults (batch 64 sentences, AdamW 1e-3, BERT's dropout
    # on). max_len 64: both codes read 64 tokens when they fit (bojone/BERT-whitening convert_to_vecs' maxlen,
    # BERT-flow's scripts/train_siamese.sh --max_seq_length); the evaluation reads evaluate.py's 128, as every method's
    "whitening": Method(pooling="first-last", eval_pooling="first-last", recipe=dict(max_len=64),
                        ignores=(*CONTRASTIVE, *GRADIENT, "precision"),
                        why="a closed-form fit in fp32: no contrast, no steps, nothing drawn at random"),
    "flow": Method(pooling="first-last", eval_pooling="first-last", recipe=dict(lr=1e-3, batch_size=64, max_len=64),
                   ignores=(*CONTRASTIVE, "precision"),
                   why="a flow fitted by likelihood in fp32: no contrast, no dev evaluation, no early stop"),
}
DEFAULTS = dict(tau=0.01, lr=5e-5, batch_size=16, max_len=128, dropout="on", aug1="none", aug2="none")  # SG-OPT's
OWN_FLAGS = {"whiten_dim": "whitening", "template": "promptbert", "template2": "promptbert"}  # one method's settings


def build(cfg, tokenizer, max_positions, rank=0):
    """This run's method: its row of the table with its state. The head is none with --no-proj; the augmentations
    draw from a generator of their own, one per process; PromptBERT's sides read the sentences inside its templates."""
    import torch
    m = METHODS[cfg.loss]
    return replace(m, head=no_head if cfg.no_proj else m.head, tokenizers=m.inputs(cfg, tokenizer, max_positions),
                   aug1=augment.parse(cfg.aug1), aug2=augment.parse(cfg.aug2),
                   aug_gen=torch.Generator().manual_seed(cfg.seed + rank))

# -----------------------------------------------------------------------------
# the flags of a method and its recipe


def takes(loss, flag):
    """Does --loss `loss` take `flag` ('--lr', 'lr' or 'whiten-dim')? The one answer, from the table: not a flag
    the method ignores, not another method's own setting. train.py refuses the others; experiments.py asks here."""
    name = flag.removeprefix("--").replace("-", "_")
    return name not in METHODS[loss].ignores and OWN_FLAGS.get(name, loss) == loss


def add_method_flags(a):
    """The method and its hyperparameters; (method) marks a default taken from the method's own recipe."""
    a("--model", default="bert-base-uncased", help="base model: a folder, our .safetensors, or a name in weights/<name>/ "
      "(default: %(default)s)")
    a("--loss", default="opt", choices=list(METHODS),
      help="opt: SG-OPT over all b x (l+1) views (default); sg: NT-Xent; opt1/opt2: the paper's ablations (sg/opt1/opt2 "
           "use one view per sentence, its layer sampled uniformly); consert, simcse, promptbert: the other systems, "
           "each with its own recipe's defaults for the flags marked (method); whitening, flow: the paper's post-hoc "
           "baselines (BERT untouched, a map of its first-last vectors fitted on --data)")
    a("--tau", type=positive, help="temperature of the contrastive loss (method: 0.01 SG, 0.1 ConSERT, 0.05 SimCSE and "
      "PromptBERT)")
    a("--lam", type=at_least(0.0, float), default=0.1, help="weight of the regulariser ||BERT_T - BERT_F||^2 (SG family; "
      "default: %(default)s)")
    a("--lr", type=at_least(0.0, float), help="peak learning rate of AdamW (method: 5e-5 SG, 5e-7 ConSERT, 3e-5 "
      "SimCSE, 1e-5 PromptBERT)")
    a("--weight-decay", type=at_least(0.0, float), default=0.01,
      help="AdamW weight decay on weights (not biases, not LayerNorm). code: 0.01 (default), paper: not stated")
    a("--batch-size", type=at_least(2, why="the other sentences of the batch are the negatives"),
      help="sentences per step (b); the other b-1 sentences are the negatives (method: 16 SG, 96 ConSERT, 64 SimCSE, "
      "256 PromptBERT)")
    a("--max-len", type=at_least(3, why="room for [CLS], one token and [SEP]"), help="tokens per sentence, [CLS]/[SEP] "
      "included; longer ones are truncated in training or fitting, never at evaluation, which reads evaluate.py's 128 "
      "(method: 128 SG, 64 ConSERT, whitening and flow, 32 SimCSE; PromptBERT: 32 tokens of the sentence alone, the "
      "template's come on top)")
    a("--dropout", choices=["on", "off"], help="BERT_T's own dropout in training; flow: BERT's dropout while it makes "
      "the vectors the flow is fitted on, as the BERT-flow code (method: off for ConSERT, else on)")
    a("--aug1", type=augmentation, help="augmentation of side 1's input (augment.py: none, shuffle, token-cutoff:R, "
      "feature-cutoff:R, dropout:R; method: feature-cutoff:0.2 ConSERT, else none)")
    a("--aug2", type=augmentation, help="augmentation of side 2's input (method: shuffle ConSERT, else none)")
    a("--pooling", choices=POOLINGS, help="BERT_T's sentence vector in training (method: mean ConSERT, first-last "
      "whitening and flow (their codes' 'last2avg': layers 1 and l), else cls)")
    a("--eval-pooling", choices=POOLINGS, help="the sentence vector at evaluation, recorded in the checkpoint "
      "(method: last2 ConSERT, else cls)")
    a("--view-pooling", default="mean", choices=["mean", "max"],
      help="how a layer of BERT_F is pooled into a view h_ik. code: mean (default), paper: max")
    a("--teacher-dropout", default="on", choices=["on", "off"],
      help="dropout in BERT_F while it makes the views. code: on (default; it stays in train mode), paper: not stated")
    a("--layers", default=":", type=layers_flag,
      help="which BERT_F hidden states give views, as a Python slice A:B over 0..l (default: all)")
    a("--no-proj", action="store_true", help="ablation: no projection head f (the loss sees BERT vectors directly)")
    a("--proj-size", type=at_least(1), default=4096, help="width of the projection head f (default: %(default)s)")
    a("--whiten-dim", type=at_least(1), help="whitening: keep the first K dimensions (default: all H)")
    a("--template", type=template_flag, help="promptbert: side 1's template, also the one evaluated and recorded in "
      "the checkpoint: one [X] (the sentence) and one [MASK] (whose vector is the sentence's) (method: "
      f"'{prompt.TRAIN_TEMPLATES[0]}')")
    a("--template2", type=template_flag, help=f"promptbert: side 2's template (method: '{prompt.TRAIN_TEMPLATES[1]}')")


def resolve_config(args):
    """The run's config, resolved once: the method's recipe for every flag not given."""
    m = METHODS[args.loss]
    cfg = argparse.Namespace(**{k: v for k, v in vars(args).items() if k != "given"})
    for k, v in {**DEFAULTS, "pooling": m.pooling, "eval_pooling": m.eval_pooling, **m.recipe}.items():
        if getattr(cfg, k) is None:  # the method's recipe, unless a flag says otherwise
            setattr(cfg, k, v)
    if m.sides is None:  # a fitted map applies to the vectors it was fitted on: evaluated with their pooling
        cfg.eval_pooling = cfg.pooling
    given = [k for k in m.ignores if k in args.given]
    given += [k for k, owner in OWN_FLAGS.items() if k in args.given and owner != args.loss]
    if given:
        why = m.why if given[0] in m.ignores else f"it is a setting of --loss {OWN_FLAGS[given[0]]}"
        die(f"--{given[0].replace('_', '-')} means nothing for --loss {args.loss} ({why}): drop it")
    if cfg.no_proj and "proj_size" in args.given:
        die("--proj-size means nothing with --no-proj (there is no head f): drop one of them")
    return cfg


# -----------------------------------------------------------------------------
# argparse types of the method's flags (the numeric ones are cli.py's, shared by every script)


def layer_slice(spec):
    """'A:B' or 'A:B:C' -> slice over the hidden states; a bare number is refused (':5' and '5:6' say what they mean)."""
    parts = spec.split(":")
    try:
        if not 2 <= len(parts) <= 3:
            raise ValueError
        s = slice(*[int(x) if x.strip() else None for x in parts])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{spec}: expected a slice A:B such as 0:7, 1: or : (one layer k: k:k+1)") from None
    if s.step == 0:
        raise argparse.ArgumentTypeError(f"{spec}: the slice step must not be 0")
    return s


def layers_flag(spec):
    layer_slice(spec)
    return spec  # kept as written: it is saved in the checkpoint's config


def checked(validate):
    """An argparse type: the value as written, once validate(value) has raised no ValueError (else its message)."""
    def parse(s):
        try:
            validate(s)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return s
    return parse


template_flag, augmentation = checked(prompt.split), checked(augment.parse)  # --template(2), --aug1 / --aug2
