"""
The lab's methods as one table. A method is code: which encoder makes each side of the contrast, from what input,
pooled how (its `sides`, a function below: two_passes, prompt_pair, repeated_pair, ...), the head both sides go
through, its loss (sg_loss.py's equations), and for a method with state across steps its State (ESimCSE's momentum
encoder and queue). Beside the code: how BERT_T's output becomes the sentence vector at evaluation, and the defaults
of the method's own recipe. The SG family (opt, sg, opt1, opt2) is the core's: train.py's train_step runs it, and its
rows hold its flags only. resolve_config applies a method's recipe to the flags not given and refuses, in one line,
a flag that means nothing for the method; takes(loss, flag) is the one answer to which flags a method takes.

No torch at the top of this file: experiments.py plans its runs from this table before torch loads (seconds). The
functions that run in a step import torch, bert and sg_loss where they use them.

References: SG-OPT, SG, OPT1, OPT2: Kim, Yoo, Lee, ACL 2021 (section 3, Table 5) and galsang/SG-BERT; ConSERT: Yan et
al., ACL 2021 (yym6472/ConSERT, scripts/unsup-consert-base.sh); SimCSE: Gao et al., EMNLP 2021 (princeton-nlp/SimCSE);
PromptBERT: Jiang et al., EMNLP 2022 (kongds/Prompt-BERT, run.sh unsup-bert); whitening: Su et al. 2021; BERT-flow: Li
et al., EMNLP 2020 (bohanli/BERT-flow); ESimCSE: Wu et al., COLING 2022 (caskcsg/sentemb, ESimCSE/run.sh); SSCL: Chen
et al., ACL 2023 (nuochenpku/SSCL, run_unsup_example.sh).
"""
import argparse
from dataclasses import dataclass, field, replace
from typing import Callable

from lab import augment
from lab import prompt
from cli import at_least, die, layers_flag, positive

# -----------------------------------------------------------------------------
# each method's two sides: (run, x1, x2) -> z1, z2 through the head, in fp32 (and, for SSCL, n: more negatives), each
# a tensor of this process's sentences (b, ...), which train_step gathers under torchrun. run: train.py's Run (the
# encoders, the head, the config, run.method: this run's Method, whose state the sides read); x1, x2: (ids, mask) of
# side 1's and side 2's sentences (the same tensors unless --data has pairs, or PromptBERT's second template)


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


def repeated_pair(run, x1, x2):
    """ESimCSE: side 1 is BERT_T's sentence vector of x1, side 2 of x2 with some of its tokens written twice (word
    repetition: repeated(), below), each pass with its own dropout mask -> through the head -> z1, z2 (b, p). The
    draws are the global batch's, the same on every process (run.gen): each process takes its sentences' rows."""
    import torch
    import bert
    b, B, pooling = len(x2[0]), len(x2[0]) * run.world, run.cfg.pooling
    mine = slice(run.rank * b, (run.rank + 1) * b)
    u, keys = torch.rand(B, generator=run.gen)[mine], torch.rand(B, run.cfg.max_len, generator=run.gen)[mine]
    cfg_F = run.bert_F.config
    x2 = repeated(x2, run.cfg.dup_rate, u, keys, cfg_F.pad_token_id, cfg_F.max_position_embeddings)
    with run.autocast():
        c1 = bert.pool(run.bert_T(*x1), x1[1], pooling)  # (b, H)
        c2 = bert.pool(run.bert_T(*x2), x2[1], pooling)  # the repeated sentences, another dropout mask
        return through_head(run.head, c1, c2)


def repeated(x, rate, u, keys, pad_id, max_positions):
    """ESimCSE's word repetition (ESimCSE/train.py prepare_features, --dup_type bpe: on the token ids, after
    truncation): a sentence of n tokens ([CLS] and [SEP] included) gets dup_len = floor(u k) of its tokens written
    twice, k = min(10, int(rate n)) (its code's random.randrange(k): 0 .. k-1; none when k = 0), at positions drawn
    without replacement among 1 .. n-2 (never [CLS] nor the last token): the dup_len smallest of `keys` there.
    x = (ids, mask) (b, T); u (b,) and keys (b, >= T) uniform in [0, 1). -> (ids, mask) (b, T'). dup_len is cut to
    max_positions - n (never at the recipe's 32 tokens)."""
    import torch
    ids, mask = x
    b, T = ids.shape
    n = mask.sum(1)  # (b,)
    k = torch.clamp(torch.floor(n.double().cpu() * rate), max=10)  # float64, as Python's int(rate * n)
    dup = torch.minimum(torch.floor(u.double() * k).long(), max_positions - n.cpu()).to(ids.device)  # (b,)
    j = torch.arange(T, device=ids.device)
    inner = (j >= 1) & (j < (n - 1)[:, None])  # (b, T): positions 1 .. n-2
    key = keys[:, :T].to(ids.device).masked_fill(~inner, 2.0)  # outside: never among the smallest
    rank = key.argsort(1).argsort(1)  # (b, T): each position's place in its row's order of keys
    count = mask + ((rank < dup[:, None]) & inner).long()  # (b, T): 0 padding, 1 a token, 2 a repeated one
    length = count.sum(1)  # (b,) n + dup_len
    tok = ids.flatten().repeat_interleave(count.flatten())  # every row's tokens in order, the repeated twice
    row = torch.arange(b, device=ids.device).repeat_interleave(length)
    col = torch.arange(len(tok), device=ids.device) - (length.cumsum(0) - length).repeat_interleave(length)
    out = ids.new_full((b, int(length.max())), pad_id)
    out[row, col] = tok
    return out, (torch.arange(out.shape[1], device=ids.device) < length[:, None]).to(mask.dtype)


def two_passes_lower(run, x1, x2):
    """SSCL on SimCSE (sscl/models.py cl_forward and construct_negtives): two_passes, and from each pass the vectors
    of the --neg-layers K hidden states below the last (its code's hidden_states[-2-i], i < K), each pooled as the
    sentence vector is (pooled from the model as if it ended there) -> z1, z2 (b, p), and n (b, 2K, p): BERT_T's own
    lower layers of both passes, negatives of every anchor."""
    import torch
    import bert
    m, pooling, K, b = run.method, run.cfg.pooling, run.cfg.neg_layers, len(x1[0])
    with run.autocast():
        hs = [augmented(run.bert_T, x1, m.aug1, m.aug_gen), augmented(run.bert_T, x2, m.aug2, m.aug_gen)]
        c = [bert.pool(h, x[1], pooling) for h, x in zip(hs, (x1, x2))]  # (b, H) each
        lower = [bert.pool(h[:-1 - i], x[1], pooling) for i in range(K) for h, x in zip(hs, (x1, x2))]  # 2K x (b, H)
        z = run.head(torch.cat(c + lower)).float()  # one pass of the head over all
    return z[:b], z[b:2 * b], z[2 * b:].view(2 * K, b, -1).transpose(0, 1)


def views_of_F_lower(run, x1, x2):
    """sg-opt-sscl (ours): SG-OPT's sides (train.train_step's c_i and views h_ik), and BERT_T's vectors of the
    --neg-layers K hidden states below its last (SSCL's hidden_states[-2-i]), pooled as c_i is -> one pass of f over
    all -> z1 (b, p), z2 (b, L, p): BERT_F's views, the positives; n (b, K, p): BERT_T's own lower layers, negatives
    of every anchor."""
    import torch
    import bert
    import train
    m, cfg = run.method, run.cfg
    with torch.no_grad(), run.autocast():  # h_ik: BERT_F's hidden states run.layers, pooled -> (b, L, H)
        hs_F = augmented(run.bert_F, x2, m.aug2, m.aug_gen)
        h = torch.stack([train.view(hs_F[k], x2[1], cfg.view_pooling) for k in run.layers], 1)
    with run.autocast():
        hs = augmented(run.bert_T, x1, m.aug1, m.aug_gen)
        c = bert.pool(hs, x1[1], cfg.pooling)  # c_i: (b, H)
        lower = [bert.pool(hs[:-1 - i], x1[1], cfg.pooling) for i in range(cfg.neg_layers)]
        hn = torch.cat([h, torch.stack(lower, 1)], 1)  # (b, L + K, H)
        b, LK, H = hn.shape
        z = run.head(torch.cat([c, hn.reshape(b * LK, H)]))  # f over c, the views and the negatives at once
    z1, z2 = z[:b].float(), z[b:].float().view(b, LK, -1)
    L = h.shape[1]
    return z1, z2[:, :L], z2[:, L:]


def two_passes_rtd(run, x1, x2):
    """DiffCSE (diffcse/models.py cl_forward): two_passes (SimCSE's) through its head, and each pass's sentences,
    corrupted by the frozen generator G, read by the discriminator D conditioned on that pass's f(c) -> z1, z2 (b, p)
    and rho (b,): each sentence's lam L_RTD term (Discriminated.rtd)."""
    z1, z2 = two_passes(run, x1, x2)
    return z1, z2, run.state.rtd(run, (x1, x2), (z1, z2))


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
    return augment.forward(model, ids, mask, aug.position_ids(mask, gen), aug.embedding_fn(mask, gen))


def through_head(head, c1, c2):
    """One pass of the head over both sides' vectors (b, H) -> (b, p) each, in fp32."""
    import torch
    z = head(torch.cat([c1, c2]))
    return z[:len(c1)].float(), z[len(c1):].float()

# -----------------------------------------------------------------------------
# heads, losses and regularisers: head(H, cfg) -> the module f; loss(*sides, *held, tau, rows) -> the mean over this
# process's anchors (sg_loss.py, the paper's symbols), the sides' tensors then the ones the method's State holds;
# regulariser(BERT_T, BERT_F, lam), after backward


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


def batchnorm_head(H, cfg=None):
    """DiffCSE's head (its recipe's --batchnorm): diffcse.ProjectionMLP, Linear H -> 2H, BatchNorm, ReLU, Linear
    2H -> H, BatchNorm (statistics of the batch in training: under torchrun, each process's own, as in the code)."""
    from lab import diffcse
    return diffcse.ProjectionMLP(H)


def no_head(H, cfg=None):
    """No head: the loss sees BERT's vectors (ConSERT; --no-proj)."""
    import torch
    return torch.nn.Identity()


def L_base(z1, z2, tau, rows=None):
    """L^base, NT-Xent over the 2b vectors: ConSERT's loss (and the core's sg ablation's)."""
    import sg_loss
    return sg_loss.nt_xent(z1, z2, tau, rows=rows)


def L_opt2(z1, z2, tau, rows=None):
    """L^opt2: only z1_i is an anchor, against every z2_j: SimCSE's and PromptBERT's InfoNCE."""
    import sg_loss
    return sg_loss.opt2(z1, z2, tau, rows=rows)


def L_queue(z1, z2, q, tau, rows=None):
    """ESimCSE's loss (esimcse/models.py cl_forward, loss_neg): InfoNCE of z1_i against every z2_j and every vector
    of the queue q (n, p): -log( phi(z1_i, z2_i) / (sum_j phi(z1_i, z2_j) + sum_m phi(z1_i, q_m)) )."""
    import sg_loss
    return sg_loss.opt2(z1, z2, tau, rows=rows, negatives=q)


def L_sscl(z1, z2, n, tau, rows=None):
    """SSCL on SimCSE (sscl/models.py cl_forward: (loss + r_loss) / 2): the mean of SimCSE's InfoNCE and of InfoNCE
    with BERT_T's lower-layer vectors of every sentence, n (b, K, p), as more negatives of every anchor."""
    import sg_loss
    with_n = sg_loss.opt2(z1, z2, tau, rows=rows, negatives=n.flatten(0, 1))  # n_m: every sentence's 2K vectors
    return (sg_loss.opt2(z1, z2, tau, rows=rows) + with_n) / 2


def L_opt3_sscl(z1, z2, n, tau, rows=None):
    """sg-opt-sscl (ours): SSCL's combination on L^opt3: the mean of L^opt3 and of L^opt3 with BERT_T's lower-layer
    vectors of every sentence, n (b, K, p), in every anchor's denominator."""
    import sg_loss
    with_n = sg_loss.sg_opt(z1, z2, tau, rows=rows, negatives=n.flatten(0, 1))  # n_m: every sentence's K vectors
    return (sg_loss.sg_opt(z1, z2, tau, rows=rows) + with_n) / 2


def L_rtd(z1, z2, rho, tau, rows=None):
    """DiffCSE's loss (diffcse/models.py cl_forward): SimCSE's InfoNCE + lam L_RTD, where rho (b,) is each sentence's
    lam L_RTD term, averaged over the anchors as the InfoNCE is (the mean over all: lam L_RTD of the padded batch)."""
    import sg_loss
    return sg_loss.opt2(z1, z2, tau, rows=rows) + rho[slice(None) if rows is None else rows].mean()


def weight_distance_grad(bert_T, bert_F, lam):
    """sg-opt-sscl's L^reg = lam * ||BERT_T - BERT_F||^2: the core's, entered as its gradient."""
    import sg_loss
    return sg_loss.add_weight_distance_grad_(bert_T, bert_F, lam)


def no_regulariser(bert_T, bert_F, lam):
    import torch
    return torch.zeros(())

# -----------------------------------------------------------------------------
# a method's state across steps, on its own object: built once a run by train.build_run, updated by one hook that
# train_step calls for every method


class State:
    """A method's state across steps (DESIGN.md), built by train.build_run once BERT_T and the head exist and before
    the optimizer; this one holds nothing, as most methods' (a run's state lives for the run: train.py has no resume,
    so nothing needs rebuilding). train_step hands the loss `held` after the sides' tensors, and calls before_update
    once every step, after backward and before the optimizer moves the weights; `modules` are trainable modules of
    the method's own, which the optimizer updates with BERT_T and the head."""
    held = ()  # tensors the loss takes after the sides' (ESimCSE: its queue), the same on every process
    modules = ()  # the method's own trainable modules (their gradients averaged over the processes by train_step)
    meta = {}  # what train.py's --json record says of it (DiffCSE: which generator, by name and sha256)

    def __init__(self, cfg, bert_T, tokenizer, device):
        pass

    def before_update(self, run, x1, x2):
        pass


class MomentumQueue(State):
    """ESimCSE's state: a momentum encoder, an EMA copy of BERT_T that no gradient trains (esimcse/models.py
    BertForCL.momentum_model, updated in cl_forward), and the queue of the last --queue-size Q sentence vectors it
    made, without dropout and through the head (trainers.py compute_loss: pre_z1), the negatives the loss adds.
    The queue holds the global batch's vectors (gathered before they are queued), the same on every process."""

    def __init__(self, cfg, bert_T, tokenizer, device):
        import copy
        import torch
        import bert
        if cfg.momentum_init == "random":  # the code's: copied in __init__, before from_pretrained loads BERT
            # BERT's init, drawn after the head's from train.build_run's seed: the same on every process
            self.encoder = bert.Bert(bert_T.config).to(device).eval().requires_grad_(False)
        else:  # BERT_T at step 0: the base weights
            self.encoder = copy.deepcopy(bert_T).eval().requires_grad_(False)
        # the EMA's pairs: every weight from a random start; from the base weights, BERT_T's trained ones only
        # (its frozen embeddings are the encoder's already: the code's EMA of two equal tensors only adds rounding)
        pairs = [(e, t) for e, t in zip(self.encoder.parameters(), bert_T.parameters())
                 if t.requires_grad or cfg.momentum_init == "random"]
        self.ema, self.theta = map(list, zip(*pairs))
        self.m, self.size = cfg.momentum, cfg.queue_size
        self.queue = torch.zeros(0, bert_T.config.hidden_size, device=device)  # (<= Q, H), the oldest first

    @property
    def held(self):
        return (self.queue,)

    def before_update(self, run, x1, x2):
        """The code's order, after this step's loss: the EMA from the weights this step's forward used, then the
        momentum encoder's vectors of side 1's sentences (the originals), queued; the queue of the next step."""
        import torch
        import bert
        with torch.no_grad():
            ema_(self.ema, self.theta, self.m)
            with run.autocast():
                z = run.head(bert.pool(self.encoder(*x1), x1[1], run.cfg.pooling)).float()  # (b, p)
            self.queue = enqueue(self.queue, run.gather(z), self.size)


class Discriminated(State):
    """DiffCSE's state (diffcse.py): the frozen masked-LM generator G, --generator (default: --model, when it has an
    MLM head), and the trained conditional discriminator D, a copy of the base model with a 2-way token head, which
    the optimizer updates with BERT_T and the head. --dropout sets D's and G's dropout too (on: the code's, whose
    Trainer keeps both in train mode)."""

    def __init__(self, cfg, bert_T, tokenizer, device):
        import checkpoint
        from lab import diffcse
        name = cfg.generator  # resolve_config: --model unless given
        length = min(cfg.max_len, bert_T.config.max_position_embeddings)  # the longest sentence G fills
        try:
            G = diffcse.load_generator(name, tokenizer, bert_T.config.vocab_size, length)
        except checkpoint.LoadError as e:
            die(f"--generator {name} (default: --model): {e}")
        on = cfg.dropout == "on"
        parts = diffcse.DiffCSE(G, diffcse.Discriminator(bert_T), dict(mask_rate=cfg.mask_rate, generator_dropout=on))
        self.G, self.D = parts.to(device).G, parts.D.train(on)
        self.modules, self.lam, self.rate = tuple(parts.modules()), cfg.rtd_weight, cfg.mask_rate
        sha = checkpoint.weights_sha256(name)
        self.meta = {"generator": checkpoint.display_name(name), **({"generator_sha256": sha} if sha else {})}

    def rtd(self, run, xs, zs):
        """rho (b,): lam times the mean of D's cross-entropy over each sentence's positions in both copies, every
        copy padded to the longest of the global batch (T), so that the mean of rho over the global batch is lam
        L_RTD of the padded batch (the code's mean over all its positions, padding and [CLS] as "original") on any
        number of processes. xs: both copies (ids, mask) (b, T_c); zs: the vectors D is conditioned on, f(c) (b, p)."""
        import torch
        import torch.nn.functional as F
        from lab import diffcse
        T = int(run.gather(torch.tensor([max(x[0].shape[1] for x in xs)], device=run.device)).max())
        ce = []
        for (ids, mask), z in zip(xs, zs):
            ids, mask = (F.pad(t, (0, T - t.shape[1]), value=v) for t, v in ((ids, run.bert_F.config.pad_token_id),
                                                                             (mask, 0)))
            with run.autocast():
                x2, y = diffcse.replaced_tokens(self.G.fill(self.masked(run, ids, mask), mask), ids, mask)
                logits = self.D(z, x2, mask)  # (b, T, 2)
            ce.append(F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none").view(-1, T).mean(1))
        return self.lam * (ce[0] + ce[1]) / 2

    def masked(self, run, ids, mask):
        """BERT's masking (pretrain.mask_tokens, as diffcse.corrupt) of this process's rows, drawn for a canvas of the
        global batch, (b * processes, --max-len), from run.gen: mask_tokens draws at every position of the shape it
        is given, so a sentence gets the same draws on any number of processes."""
        import torch
        from lab import pretrain
        b, T, G = len(ids), ids.shape[1], self.G
        mine = slice(run.rank * b, (run.rank + 1) * b)
        canvas = torch.zeros(2, b * run.world, run.cfg.max_len, dtype=ids.dtype)  # ids, mask
        canvas[0, mine, :T], canvas[1, mine, :T] = ids.cpu(), mask.cpu()
        inputs, _, _ = pretrain.mask_tokens(*canvas, G.special, G.n_words, G.mask_id, self.rate, run.gen)
        return inputs[mine, :T].to(ids.device)


def ema_(ema, theta, m):
    """ema <- m ema + (1 - m) theta, in place over two lists of tensors: the code's arithmetic (both products
    rounded, then added), over all the tensors at once."""
    import torch
    torch._foreach_mul_(ema, m)
    torch._foreach_add_(ema, torch._foreach_mul(theta, 1 - m))


def enqueue(queue, z, size):
    """The queue (n, p) with the vectors z (b, p) after it, less its oldest beyond `size`: the code's
    torch.cat((pre_z1, z))[-neg_size:] (a size of 0 keeps none)."""
    import torch
    q = torch.cat([queue, z])
    return q[max(0, len(q) - size):]

# -----------------------------------------------------------------------------
# the table


@dataclass(frozen=True)
class Method:
    """A method as its code (its two sides, head, loss, regulariser), how BERT_T's output becomes its sentence vector
    in training and at evaluation, and the flag defaults of its own recipe. build() gives a run its copy, with the
    state the sides read (the augmentations and their generator, each side's tokenizer)."""
    sides: Callable = None  # (run, x1, x2) -> z1, z2; None: the core's SG family, or a post-hoc map (fit)
    loss: Callable = None  # (z1, z2, tau, rows) -> scalar
    head: Callable = no_head  # (H, cfg) -> f
    regulariser: Callable = no_regulariser  # (BERT_T, BERT_F, lam) -> lam * L^reg, its gradient added
    inputs: Callable = sentences  # (cfg, tokenizer, max_positions) -> side 1's and side 2's tokenizers
    pooling: str = "cls"  # BERT_T's sentence vector during training
    eval_pooling: str = "cls"  # ... at evaluation, recorded in the checkpoint
    recipe: dict = field(default_factory=dict)
    state: type = State  # (cfg, BERT_T, tokenizer, device) -> its State: what it keeps across steps (most: nothing)
    ignores: tuple = ()  # flags that mean nothing for this method: refused when given
    why: str = ""  # ... and why, for the one-line refusal
    core: bool = False  # the SG family: train.py's train_step runs it; the row holds its flags
    fit: bool = False  # a post-hoc map fitted on BERT's vectors (posthoc.py), not a contrast
    # a run's state, set by build()
    tokenizers: tuple = ()  # side 1's and side 2's: the run's tokenizer twice, or PromptBERT's two prompt.Template
    aug1: augment.Augmentation = augment.Augmentation()  # of side 1's input (ConSERT)
    aug2: augment.Augmentation = augment.Augmentation()  # of side 2's input
    aug_gen: object = None  # torch.Generator of this process's augmentations


SG_ONLY = ("lam", "view_pooling", "teacher_dropout", "layers")  # flags that mean something for the SG family only
CONTRASTIVE = (*SG_ONLY, "tau", "aug1", "aug2", "no_proj", "proj_size", "eval_every", "patience", "early_stop",
               "select", "overfit_batch", "eval_pooling")  # ... for any contrastive method
# ... for any method with gradient steps (--seed: the init, the order, the dropout masks; a whitening draws nothing)
GRADIENT = ("lr", "weight_decay", "batch_size", "epochs", "max_steps", "log_every", "dropout", "seed")
TWO_PASSES = "its side 2 is a second pass of BERT_T, not BERT_F's views"
SG = Method(core=True)  # SG-OPT and its ablations: train.train_step (the core's), with the lab's --aug1, --aug2
METHODS = {
    "opt": SG, "sg": SG, "opt1": SG, "opt2": SG,
    # ours: SG-OPT whose anchors c_i also push away BERT_T's own lower layers (SSCL's negatives; docs/fidelity.md)
    "sg-opt-sscl": Method(views_of_F_lower, L_opt3_sscl, projection_head, weight_distance_grad),
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
    # ESimCSE's unsupervised BERT-base recipe (ESimCSE/run.sh): SimCSE's, its positive the sentence with some tokens
    # repeated (--dup-rate 0.32, dup_type bpe), the queue of a momentum encoder's vectors (--momentum 0.995,
    # --queue-size 160: neg_size) as more negatives; the MLP in training only, the raw [CLS] at evaluation
    "esimcse": Method(repeated_pair, L_queue, mlp_head, state=MomentumQueue, recipe=dict(
        tau=0.05, batch_size=64, max_len=32, lr=3e-5), ignores=(*SG_ONLY, "proj_size", "aug1", "aug2"),
        why="its side 2 is BERT_T over the sentence with tokens repeated: no BERT_F, no other augmentation; its "
            "head is an H x H MLP"),
    # SSCL's unsupervised recipe (run_unsup_example.sh, on SimCSE): --pooler_type avg (mean pooling, no MLP), the
    # --hard_negative_layers 2 hidden states below the last as more negatives, evaluated with avg too
    "sscl": Method(two_passes_lower, L_sscl, no_head, pooling="mean", eval_pooling="mean", recipe=dict(
        tau=0.05, batch_size=64, max_len=32, lr=3e-5), ignores=(*SG_ONLY, "proj_size", "no_proj"),
        why=TWO_PASSES + ", and no head (its recipe's avg pooling has none)"),
    # DiffCSE's recipe (run_diffcse.sh; diffcse.RECIPE, diffcse.CONFIG): SimCSE's, + lam L_RTD of a conditional
    # discriminator over the tokens a frozen generator replaced (--rtd-weight 0.005, --mask-rate 0.30), its head
    # --batchnorm's MLP in training only, the raw [CLS] at evaluation
    "diffcse": Method(two_passes_rtd, L_rtd, batchnorm_head, state=Discriminated, recipe=dict(
        tau=0.05, batch_size=64, max_len=32, lr=7e-6), ignores=(*SG_ONLY, "proj_size"),
        why=TWO_PASSES + "; its head is DiffCSE's BatchNorm MLP"),
    # the paper's post-hoc baselines (posthoc.py; train.fit_posthoc): BERT is not trained, a map of its first-last
    # vectors is fitted, in fp32. Flow: bohanli/BERT-flow's defaults (batch 64 sentences, AdamW 1e-3, BERT's dropout
    # on). max_len 64: both codes read 64 tokens when they fit (bojone/BERT-whitening convert_to_vecs' maxlen,
    # BERT-flow's scripts/train_siamese.sh --max_seq_length); the evaluation reads evaluate.py's 128, as every method's
    "whitening": Method(fit=True, pooling="first-last", eval_pooling="first-last", recipe=dict(max_len=64),
                        ignores=(*CONTRASTIVE, *GRADIENT, "precision"),
                        why="a closed-form fit in fp32: no contrast, no steps, nothing drawn at random"),
    "flow": Method(fit=True, pooling="first-last", eval_pooling="first-last",
                   recipe=dict(lr=1e-3, batch_size=64, max_len=64), ignores=(*CONTRASTIVE, "precision"),
                   why="a flow fitted by likelihood in fp32: no contrast, no dev evaluation, no early stop"),
}
DEFAULTS = dict(tau=0.01, lr=5e-5, batch_size=16, max_len=128, dropout="on", aug1="none", aug2="none")  # SG-OPT's
OWN_FLAGS = {"whiten_dim": ("whitening",), "template": ("promptbert",), "template2": ("promptbert",),  # a method's
             "dup_rate": ("esimcse",), "queue_size": ("esimcse",), "momentum": ("esimcse",),  # own settings
             "momentum_init": ("esimcse",),
             "neg_layers": ("sscl", "sg-opt-sscl"), "generator": ("diffcse",), "rtd_weight": ("diffcse",),
             "mask_rate": ("diffcse",)}


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
    return name not in METHODS[loss].ignores and loss in OWN_FLAGS.get(name, (loss,))


def add_method_flags(a):
    """The method and its hyperparameters; (method) marks a default taken from the method's own recipe."""
    from bert import POOLINGS  # torch loads here: a lab.train command line is read, not a plan (experiments.py)
    a("--model", default="bert-base-uncased", help="base model: a folder, our .safetensors, or a name in weights/<name>/ "
      "(default: %(default)s)")
    a("--loss", default="opt", choices=list(METHODS),
      help="opt: SG-OPT over all b x (l+1) views (default); sg: NT-Xent; opt1/opt2: the paper's ablations (sg/opt1/opt2 "
           "use one view per sentence, its layer sampled uniformly); sg-opt-sscl (ours): SG-OPT with BERT_T's own "
           "lower layers as negatives; consert, simcse, promptbert, esimcse, sscl, diffcse: the other systems, each "
           "with its own recipe's defaults for the flags marked (method); whitening, flow: the paper's post-hoc "
           "baselines (BERT untouched, a map of its first-last vectors fitted on --data)")
    a("--tau", type=positive, help="temperature of the contrastive loss (method: 0.01 SG, 0.1 ConSERT, 0.05 SimCSE, "
      "PromptBERT, ESimCSE, SSCL and DiffCSE)")
    a("--lam", type=at_least(0.0, float), default=0.1, help="weight of the regulariser ||BERT_T - BERT_F||^2 (SG family; "
      "default: %(default)s)")
    a("--lr", type=at_least(0.0, float), help="peak learning rate of AdamW (method: 5e-5 SG, 5e-7 ConSERT, 3e-5 "
      "SimCSE, ESimCSE and SSCL, 1e-5 PromptBERT, 7e-6 DiffCSE)")
    a("--weight-decay", type=at_least(0.0, float), default=0.01,
      help="AdamW weight decay on weights (not biases, not LayerNorm). code: 0.01 (default), paper: not stated")
    a("--batch-size", type=at_least(2, why="the other sentences of the batch are the negatives"),
      help="sentences per step (b); the other b-1 sentences are the negatives (method: 16 SG, 96 ConSERT, 64 SimCSE, "
      "ESimCSE, SSCL and DiffCSE, 256 PromptBERT)")
    a("--max-len", type=at_least(3, why="room for [CLS], one token and [SEP]"), help="tokens per sentence, [CLS]/[SEP] "
      "included; longer ones are truncated in training or fitting, never at evaluation, which reads evaluate.py's 128 "
      "(method: 128 SG, 64 ConSERT, whitening and flow, 32 SimCSE, ESimCSE, SSCL and DiffCSE; PromptBERT: 32 tokens "
      "of the sentence alone, the template's come on top)")
    a("--dropout", choices=["on", "off"], help="BERT_T's own dropout in training; flow: BERT's dropout while it makes "
      "the vectors the flow is fitted on, as the BERT-flow code (method: off for ConSERT, else on)")
    a("--aug1", type=augmentation, help="augmentation of side 1's input (augment.py: none, shuffle, token-cutoff:R, "
      "feature-cutoff:R, dropout:R; method: feature-cutoff:0.2 ConSERT, else none)")
    a("--aug2", type=augmentation, help="augmentation of side 2's input (method: shuffle ConSERT, else none)")
    a("--pooling", choices=POOLINGS, help="BERT_T's sentence vector in training (method: mean ConSERT and SSCL, "
      "first-last whitening and flow (their codes' 'last2avg': layers 1 and l), else cls)")
    a("--eval-pooling", choices=POOLINGS, help="the sentence vector at evaluation, recorded in the checkpoint "
      "(method: last2 ConSERT, mean SSCL, else cls)")
    a("--view-pooling", default="mean", choices=["mean", "max"],
      help="how a layer of BERT_F is pooled into a view h_ik. code: mean (default), paper: max")
    a("--teacher-dropout", default="on", choices=["on", "off"],
      help="dropout in BERT_F while it makes the views. code: on (default; it stays in train mode), paper: not stated")
    a("--layers", default=":", type=layers_flag,
      help="which BERT_F hidden states give views, as a Python slice A:B over 0..l (default: all)")
    a("--no-proj", action="store_true", help="ablation: no projection head f (the loss sees BERT vectors directly)")
    a("--proj-size", type=at_least(1), default=4096, help="width of the projection head f (default: %(default)s)")
    add_own_flags(a)


def add_own_flags(a):
    """The settings only one method (or one family) has: whitening's, PromptBERT's, ESimCSE's, SSCL's, DiffCSE's."""
    a("--whiten-dim", type=at_least(1), help="whitening: keep the first K dimensions (default: all H)")
    a("--template", type=template_flag, help="promptbert: side 1's template, also the one evaluated and recorded in "
      "the checkpoint: one [X] (the sentence) and one [MASK] (whose vector is the sentence's) (method: "
      f"'{prompt.TRAIN_TEMPLATES[0]}')")
    a("--template2", type=template_flag, help=f"promptbert: side 2's template (method: '{prompt.TRAIN_TEMPLATES[1]}')")
    a("--dup-rate", type=unit_interval, default=0.32, help="esimcse: word repetition: a sentence of n tokens gets "
      "0 .. min(10, int(rate n)) - 1 of them written twice (run.sh for bert-base; default: %(default)s)")
    a("--queue-size", type=at_least(0), default=160, help="esimcse: the momentum encoder's last N sentence vectors, "
      "negatives of every anchor (run.sh: neg_size; default: %(default)s)")
    a("--momentum", type=unit_interval, default=0.995, help="esimcse: the momentum encoder's EMA, m theta_m + (1 - m) "
      "theta_T once a step (run.sh; default: %(default)s)")
    a("--momentum-init", choices=["random", "pretrained"], default="random", help="esimcse: the momentum "
      "encoder's start: random (default: its code, which copies BERT before from_pretrained loads the weights, so "
      "its log lists every momentum_model.* weight as newly initialised) or pretrained (a copy of --model)")
    a("--neg-layers", type=at_least(1), default=2, help="sscl, sg-opt-sscl: BERT_T's K hidden states below its last, "
      "pooled as the sentence vector, are negatives of every anchor (SSCL's --hard_negative_layers; default: "
      "%(default)s)")
    a("--generator", help="diffcse: the frozen masked-LM generator, a model folder with an MLM head "
      "(cls.predictions.*, as pretrain.py writes) and --model's vocabulary (default: --model itself)")
    a("--rtd-weight", type=at_least(0.0, float), default=0.005, help="diffcse: lam, the weight of the discriminator's "
      "replaced-token loss (run_diffcse.sh LAMBDA; default: %(default)s)")
    a("--mask-rate", type=unit_interval, default=0.30, help="diffcse: the share of tokens masked before the generator "
      "fills them (run_diffcse.sh MASK; default: %(default)s)")


def resolve_config(args):
    """The run's config, resolved once: the method's recipe for every flag not given."""
    m = METHODS[args.loss]
    cfg = argparse.Namespace(**{k: v for k, v in vars(args).items() if k != "given"})
    for k, v in {**DEFAULTS, "pooling": m.pooling, "eval_pooling": m.eval_pooling, **m.recipe}.items():
        if getattr(cfg, k) is None:  # the method's recipe, unless a flag says otherwise
            setattr(cfg, k, v)
    if m.fit:  # a fitted map applies to the vectors it was fitted on: evaluated with their pooling
        cfg.eval_pooling = cfg.pooling
    if takes(args.loss, "generator") and cfg.generator is None:  # DiffCSE: --model's own MLM head
        cfg.generator = cfg.model
    given = [k for k in m.ignores if k in args.given]
    given += [k for k, owners in OWN_FLAGS.items() if k in args.given and args.loss not in owners]
    if given:
        owners = " and --loss ".join(OWN_FLAGS.get(given[0], ()))
        why = m.why if given[0] in m.ignores else f"it is a setting of --loss {owners}"
        die(f"--{given[0].replace('_', '-')} means nothing for --loss {args.loss} ({why}): drop it")
    if cfg.no_proj and "proj_size" in args.given:
        die("--proj-size means nothing with --no-proj (there is no head f): drop one of them")
    return cfg


# -----------------------------------------------------------------------------
# argparse types of the method's flags (the numeric ones are cli.py's, shared by every script)


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


def unit_interval(s):
    """An argparse type: a number in [0, 1] (--dup-rate, --momentum)."""
    v = at_least(0.0, float)(s)
    if v > 1:
        raise argparse.ArgumentTypeError(f"{s}: must be a number in [0, 1]")
    return v
