"""
The methods train.py runs, as one table: a method is which encoder makes side 2 of the contrast (BERT_F's layer views,
or a second pass of BERT_T), how BERT_T's output becomes the sentence vector in training and at evaluation, which head,
which loss, and its own recipe's defaults for the shared flags. The flags that set a method and its hyperparameters
live here beside the table, with resolve_config, which applies a method's recipe to the flags not given and refuses,
in one line, a flag that means nothing for the chosen method.

References: SG-OPT, SG, OPT1, OPT2: Kim, Yoo, Lee, ACL 2021 (section 3, Table 5) and galsang/SG-BERT; ConSERT: Yan et
al., ACL 2021 (yym6472/ConSERT, scripts/unsup-consert-base.sh); SimCSE: Gao et al., EMNLP 2021 (princeton-nlp/SimCSE);
PromptBERT: Jiang et al., EMNLP 2022 (kongds/Prompt-BERT, run.sh unsup-bert); whitening: Su et al. 2021; BERT-flow: Li
et al., EMNLP 2020 (bohanli/BERT-flow).
"""
import argparse
from dataclasses import dataclass, field
from typing import Callable

import torch

import augment
import bert
import prompt
import sg_loss
from cli import at_least, die, positive

@dataclass(frozen=True)
class Method:
    """Which encoder makes side 2 of the contrast, how BERT_T's output becomes its sentence vector in training and
    at evaluation, which head maps both sides, which loss, and the flag defaults of the method's own recipe."""
    side2: str  # "BERT_F": the layer views h_ik of the frozen copy; "BERT_T": a second pass of BERT_T
    loss: Callable  # loss(z1, z2, tau, rows); z2 is (b, L, p) for "opt", else (b, p)
    one_view: bool = False  # SG / OPT1 / OPT2: one view per sentence, its layer sampled uniformly
    head: str = "proj"  # "proj": the paper's f (4096 wide); "mlp": SimCSE's Linear + Tanh; "none"
    pooling: str = "cls"  # BERT_T's sentence vector during training
    eval_pooling: str = "cls"  # ... at evaluation, recorded in the checkpoint
    recipe: dict = field(default_factory=dict)
    ignores: tuple = ()  # flags that mean nothing for this method: refused when given
    why: str = ""  # ... and why, for the one-line refusal


SG_ONLY = ("lam", "view_pooling", "teacher_dropout", "layers")  # flags that mean something for side 2 = BERT_F only
CONTRASTIVE = (*SG_ONLY, "tau", "aug1", "aug2", "no_proj", "proj_size", "eval_every", "patience", "early_stop",
               "overfit_batch", "eval_pooling")  # ... for any contrastive method
GRADIENT = ("lr", "weight_decay", "batch_size", "epochs", "dropout")  # ... for any method with gradient steps
TWO_PASSES = "its side 2 is a second pass of BERT_T, not BERT_F's views"
METHODS = {
    "opt": Method("BERT_F", sg_loss.sg_opt),
    "sg": Method("BERT_F", sg_loss.nt_xent, one_view=True),
    "opt1": Method("BERT_F", sg_loss.opt1, one_view=True),
    "opt2": Method("BERT_F", sg_loss.opt2, one_view=True),
    # ConSERT's unsupervised recipe (scripts/unsup-consert-base.sh): NT-Xent over the 2b views, no head
    "consert": Method("BERT_T", sg_loss.nt_xent, head="none", pooling="mean", eval_pooling="last2", recipe=dict(
        tau=0.1, batch_size=96, max_len=64, lr=5e-7, dropout="off", aug1="feature-cutoff:0.2", aug2="shuffle"),
        ignores=(*SG_ONLY, "proj_size", "no_proj"), why=TWO_PASSES + ", and no head"),
    # SimCSE's unsupervised recipe: InfoNCE of view 1 against view 2 (gradients through both), MLP over [CLS] in
    # training, the raw [CLS] at evaluation
    "simcse": Method("BERT_T", sg_loss.opt2, head="mlp", recipe=dict(tau=0.05, batch_size=64, max_len=32, lr=3e-5),
                     ignores=(*SG_ONLY, "proj_size"), why=TWO_PASSES + "; its head is an H x H MLP"),
    # PromptBERT's unsupervised BERT recipe (run.sh unsup-bert): side 1 and side 2 are BERT_T's [MASK] vectors of the
    # sentence inside two different templates, each less its template's own (denoising, prompt.py); InfoNCE as
    # SimCSE's, MLP in training only. Evaluated with the first template, not denoised. max_len: the sentence's tokens
    "promptbert": Method("BERT_T", sg_loss.opt2, head="mlp", pooling="prompt", eval_pooling="prompt", recipe=dict(
        tau=0.05, batch_size=256, max_len=32, lr=1e-5, template=prompt.TRAIN_TEMPLATES[0],
        template2=prompt.TRAIN_TEMPLATES[1]),
        ignores=(*SG_ONLY, "aug1", "aug2", "pooling", "eval_pooling", "proj_size"),
        why="its two sides are BERT_T's [MASK] vectors in two templates: no BERT_F, no augmentation, no other pooling, "
            "an H x H MLP head"),
    # the paper's post-hoc baselines (posthoc.py; fit_posthoc below): BERT is not trained, a map of its first-last
    # vectors is fitted, in fp32. Flow: bohanli/BERT-flow's defaults (batch 64 sentences, AdamW 1e-3, BERT's dropout
    # on). max_len 64: both codes read 64 tokens when they fit (bojone/BERT-whitening convert_to_vecs' maxlen,
    # BERT-flow's scripts/train_siamese.sh --max_seq_length); the evaluation reads evaluate.py's 128, as every method's
    "whitening": Method("none", None, head="none", pooling="first-last", eval_pooling="first-last",
                        recipe=dict(max_len=64),
                        ignores=(*CONTRASTIVE, *GRADIENT, "precision", "log_every"),
                        why="a closed-form fit in fp32: no contrast, no gradient steps"),
    "flow": Method("none", None, head="none", pooling="first-last", eval_pooling="first-last",
                   recipe=dict(lr=1e-3, batch_size=64, max_len=64), ignores=(*CONTRASTIVE, "precision"),
                   why="a flow fitted by likelihood in fp32: no contrast"),
}
DEFAULTS = dict(tau=0.01, lr=5e-5, batch_size=16, max_len=128, dropout="on", aug1="none", aug2="none")  # SG-OPT's
OWN_FLAGS = {"whiten_dim": "whitening", "template": "promptbert", "template2": "promptbert"}  # one method's settings

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
    a("--pooling", choices=bert.POOLINGS, help="BERT_T's sentence vector in training (method: mean ConSERT, first-last "
      "whitening and flow (their codes' 'last2avg': layers 1 and l), else cls)")
    a("--eval-pooling", choices=bert.POOLINGS, help="the sentence vector at evaluation, recorded in the checkpoint "
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
    """The run's config, resolved once: the method's recipe for every flag not given, the precision for the device."""
    m = METHODS[args.loss]
    cfg = argparse.Namespace(**{k: v for k, v in vars(args).items() if k != "given"})
    for k, v in {**DEFAULTS, "pooling": m.pooling, "eval_pooling": m.eval_pooling, **m.recipe}.items():
        if getattr(cfg, k) is None:  # the method's recipe, unless a flag says otherwise
            setattr(cfg, k, v)
    if m.side2 == "none":  # a fitted map applies to the vectors it was fitted on: evaluated with their pooling
        cfg.eval_pooling = cfg.pooling
    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    cfg.precision = cfg.precision or ("bf16" if cuda else "fp32")
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
