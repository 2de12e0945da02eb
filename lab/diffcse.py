"""
DiffCSE's components: SimCSE plus a conditional ELECTRA discriminator over the tokens that a frozen masked-LM
generator replaced. Chuang et al., "DiffCSE: Difference-based Contrastive Learning for Sentence Embeddings", NAACL
2022 (section 3), and the official code github.com/voidism/DiffCSE at f724b2c (2022-05-03), read, not copied.

    load_generator, Generator   G: a frozen masked LM, a BERT and its own MLM head (the cls.predictions.* keys)
    corrupt, replaced_tokens    x -> x'': a share of the real tokens masked, G's argmax at every position, [CLS] kept;
                                y_t = 1 where x''_t != x_t (replaced), else 0 (original)
    Discriminator               D: a trained copy of the model whose [CLS] embedding is the sentence vector, and a
                                2-way per-token head
    electra_loss                L_RTD: the 2-way cross-entropy of y, averaged over every position of the padded batch
    ProjectionMLP               the recipe's head (--batchnorm): Linear, BatchNorm, ReLU, Linear, BatchNorm
    DiffCSE                     the pieces together: extra_loss(z, ids, mask, gen) = lam * L_RTD
    RECIPE, CONFIG              the run script's values for methods.py's shared flags, and DiffCSE's own

The step (methods.py's row; the paper's section 3): L = L_SimCSE(f(c1), f(c2)) + lam * L_RTD, where each copy of the
batch is corrupted on its own and D is conditioned on that copy's f(c), the head's output (--before_mlp off).
Legend: N = sentences given (both copies of the batch), T = tokens, H = hidden size, V = vocabulary.

Taken from the official code (file:line at f724b2c):
- G fills the masked input by argmax at every position, under no_grad (diffcse/models.py:183-184); [CLS] is put
  back (185); y = (G's token != the original) at the real tokens (186); D's input is G's tokens, padding kept (187).
  So a position that was not masked, or [SEP], is "replaced" when G's argmax there is another token, and a masked
  one that G restores is "original".
- The masking: the collator's mask_tokens (train.py:512-545) on both copies of the batch, flattened (train.py:499):
  each token chosen with probability --masking_ratio (handed over in diffcse/trainers.py:482), never one of the
  fast tokenizer's special ids, [PAD] [UNK] [CLS] [SEP] [MASK] (train.py:523-524; transformers-4.2.1's
  tokenization_utils_base.py:3125-3154, all_special_ids); of the chosen 80% [MASK], 10% a random id
  of the whole vocabulary, 10% kept. Here pretrain.mask_tokens, BERT's same rule, fed those five ids.
- D: a second BertModel (models.py:338), initialised from the same pretrained weights as the trained model
  (train.py:376-388), trained; its embedding output at position 0 (after LayerNorm and dropout) replaced by the
  sentence vector (cls_input, models.py:199; modeling_bert.py:960-961); its head nn.Linear(H, 2) made after
  from_pretrained (train.py:387), so torch's default init; logits over the last layer (models.py:264).
- L_RTD: nn.CrossEntropyLoss over the (N * T, 2) logits, labels at every position (models.py:272), padding's 0:
  the mean over all N * T positions of the padded batch, [CLS] and padding counted as "original"; lam * it is added
  to the contrastive loss (273).
- G's dropout: G is a submodule of BertForCL (models.py:122), which the Trainer puts in train mode, so its dropout
  is on while it fills (CONFIG generator_dropout); its weights get no gradient (no_grad), so AdamW leaves them.
- The head: ProjectionMLP (models.py:35-50), chosen by --batchnorm (models.py:119), its Linears N(0, 0.02) by
  cl_init's init_weights (models.py:121), the BatchNorms torch's init.

Departures:
- G is a BERT with its own MLM head from a model folder (pretrain.py's raw models; bert-base-uncased's layout too),
  not distilbert-base-uncased (run_diffcse.sh:9); its vocabulary must be the model's (checked: the official code
  assumes it, pairing uncased BERT with uncased DistilBERT).
- The masks come from a torch.Generator on the CPU (deterministic by seed, the same on any device): the official
  rule in distribution (bernoulli 0.8, then 0.5 of the rest, from the global RNG), not in its draws.
- D's padding rows are 0 (bert.py's layers run on the real tokens only), so D's logits there are its head's bias;
  the official BertModel computes those rows. Both count them as "original" in the mean.
- [CLS] is put back as the input's own first id, not the constant 101 (models.py:141): the same for BERT's uncased
  vocabulary. D's padding ids are the input's (the official multiplies by the mask: id 0, BERT's [PAD]).
- G's decoder runs on the real tokens only (the official's argmax at padding is discarded by the mask).
- The loss in fp32; the official trains with --fp16 (run_diffcse.sh:30). G and D run in the caller's precision.
- G reads the run's sentences whole: a generator whose max_position_embeddings is below the length the run reads
  (--max-len, capped by the model's own) is refused before step 0 (pretrain.py's: 128; the recipe reads 32).

Status: components complete; integration in methods.py
"""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import bert
from lab import augment, pretrain
from checkpoint import LoadError

# the run script's values for methods.py's shared flags (run_diffcse.sh at f724b2c); also there: bert-base-uncased
# (line 8), wiki1m for 2 epochs (10, 12), --pooler_type cls (20) with --mlp_only_train (21): the head in training,
# the raw [CLS] at evaluation (as SimCSE's row), --eval_steps 125 (19), --fp16 (30). Not in the script, so
# transformers 4.2.1's TrainingArguments defaults: AdamW betas 0.9 / 0.999, eps 1e-8, weight decay 0.0, linear
# decay with no warm-up, clipping at 1.0 (training_args.py:289-304)
RECIPE = dict(
    tau=0.05,  # run_diffcse.sh:25 --temp 0.05
    batch_size=64,  # run_diffcse.sh:13 --per_device_train_batch_size 64
    max_len=32,  # run_diffcse.sh:15 --max_seq_length 32
    lr=7e-6,  # run_diffcse.sh:3 LR=7e-6 (line 14 --learning_rate $LR)
)
# DiffCSE's own settings, DiffCSE(cfg)'s defaults
CONFIG = dict(
    lam=0.005,  # run_diffcse.sh:5 LAMBDA=0.005 (line 29 --lambda_weight; train.py:118-123's default is 0.1)
    mask_rate=0.30,  # run_diffcse.sh:4 MASK=0.30 (line 30 --masking_ratio; train.py:136-139's default is 0.15)
    generator_dropout=True,  # G in train mode, as the official Trainer leaves it (models.py:122)
)
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # never masked: the fast tokenizer's all_special_ids
HEAD_PREFIX = "cls.predictions."  # BERT's MLM head: pretrain.py writes it, BertForPreTraining / BertForMaskedLM have it

# -----------------------------------------------------------------------------
# the generator G: a frozen masked LM


class Generator(nn.Module):
    """G: a BERT and its MLM head (pretrain.make_head: dense + GELU + LayerNorm, then the decoder: the word-embedding
    matrix, tied, or the checkpoint's own), frozen. tokenizer: its own, the model's vocabulary (load_generator)."""

    def __init__(self, model, head, tokenizer, decoder=None, source=""):
        super().__init__()
        self.bert, self.head = model.requires_grad_(False), head.requires_grad_(False)
        self.register_buffer("decoder", decoder)  # (V, H), or None: tied to bert.embeddings.word_embeddings
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        if "[MASK]" not in vocab:
            raise LoadError(f"{source}: its tokenizer has no [MASK] token, which the generator's input needs")
        self.mask_id, self.n_words = vocab["[MASK]"], len(vocab)  # random replacements: any id (official: len(tok))
        self.special = torch.tensor(sorted(vocab[t] for t in SPECIAL_TOKENS if t in vocab))  # CPU, for the masks
        self.source = source  # the folder, for the records

    def logits(self, x):
        """The MLM head over last-layer states x (N, H) -> (N, V) (pretrain.mlm_logits's head)."""
        t = self.head.transform
        x = t.LayerNorm(F.gelu(t.dense(x), approximate=self.bert.encoder.layer[0].gelu))
        w = self.bert.embeddings.word_embeddings.weight if self.decoder is None else self.decoder
        return F.linear(x, w, self.head.bias)

    @torch.no_grad()
    def fill(self, inputs, mask, chunk=4096):
        """G's argmax token at every real position of inputs (B, T), the masked and the others (models.py:184: argmax,
        not a sample); padding keeps its id. The decoder runs on `chunk` rows at a time (N x V logits)."""
        real = mask.bool()
        x = self.bert(inputs, mask)[-1][real]  # (N, H): the real tokens
        top = torch.cat([self.logits(x[i:i + chunk]).argmax(-1) for i in range(0, max(len(x), 1), chunk)])
        out = inputs.clone()
        out[real] = top
        return out


def load_generator(name_or_path, tokenizer, vocab_size, length=None):
    """G from a model folder (or name) that has an MLM head: a pretrain.py folder, bert-base-uncased's layout. Read
    through bert.read_checkpoint; tokenizer, vocab_size: the trained model's, which G's must equal; length: the most
    tokens of a sentence G will fill (the run's). A model without an MLM head, of another vocabulary, or with fewer
    positions than length is a LoadError of one line naming the folder. Eval mode."""
    ck = bert.read_checkpoint(name_or_path)
    tensors = mlm_head_tensors(ck)
    config, own = bert.config_of(ck), bert.tokenizer_of(ck)
    if length is not None and config.max_position_embeddings < length:
        raise LoadError(f"{ck.path}: its max_position_embeddings is {config.max_position_embeddings}, and the run "
                        f"reads sentences of up to {length} tokens (--max-len, capped by the model's own), which G "
                        f"fills whole; give --max-len {config.max_position_embeddings} or less, or a generator of "
                        f"{length} positions or more")
    check_vocabulary(ck.path, config.vocab_size, own.get_vocab(with_added_tokens=True), vocab_size,
                     tokenizer.get_vocab(with_added_tokens=True))
    model = bert.Bert.from_checkpoint(ck)  # the key map skips cls.*
    head = pretrain.make_head(config)
    decoder = tensors.pop("decoder.weight", None)
    words = model.embeddings.word_embeddings.weight  # (V, H)
    want = {**head.state_dict(), **({} if decoder is None else {"decoder.weight": words})}
    bad = [f"missing {HEAD_PREFIX}{k}" for k in want if k not in tensors and k != "decoder.weight"]
    bad += [f"unexpected {HEAD_PREFIX}{k}" for k in tensors if k not in want]
    bad += [f"{HEAD_PREFIX}{k} {tuple(t.shape)} (expected {tuple(want[k].shape)})"
            for k, t in [*tensors.items(), ("decoder.weight", decoder)] if k in want and t.shape != want[k].shape]
    if bad:
        raise LoadError(f"{ck.path}: its MLM head does not match its BERT: {', '.join(bad[:5])}")
    head.load_state_dict(tensors, strict=True)
    if decoder is not None and torch.equal(decoder, words):
        decoder = None  # tied, as BERT's: the word embeddings themselves
    return Generator(model, head.eval(), own, decoder, str(ck.path)).eval()


def mlm_head_tensors(ck):
    """{pretrain.make_head key: tensor} of a checkpoint's cls.predictions.* keys, under bert.py's renames
    (LayerNorm.gamma / beta); decoder.bias, HF's tie of the bias, folded into it. None there: a LoadError."""
    t = {bert.hf_key(k).removeprefix(HEAD_PREFIX): v for k, v in ck.tensors.items() if k.startswith(HEAD_PREFIX)}
    if not t:
        raise LoadError(f"{ck.path}: has no masked-LM head (no {HEAD_PREFIX}* keys), which DiffCSE's generator is; "
                        "pass --generator with a model folder that has one (pretrain.py writes it) and the model's "
                        "vocabulary")
    if "decoder.bias" in t:
        bias = t.pop("decoder.bias")
        t.setdefault("bias", bias)
    return t


def check_vocabulary(path, gen_size, gen_vocab, vocab_size, vocab):
    """G reads and writes the trained model's token ids: the same vocab_size and the same {word: id}."""
    if gen_size != vocab_size:
        why = f"vocab_size {gen_size}, the model's {vocab_size}"
    elif gen_vocab != vocab:
        n = len(set(gen_vocab.items()) ^ set(vocab.items()))
        why = f"its tokenizer's {len(gen_vocab)} words are not the model's {len(vocab)} ({n} word-id pairs differ)"
    else:
        return
    raise LoadError(f"{path}: its vocabulary is not the model's ({why}); the generator must fill in the model's own "
                    "token ids: pass --generator with a model of the same vocabulary")

# -----------------------------------------------------------------------------
# the corruption x -> x'' and its labels y


def corrupt(generator, ids, mask, rate, gen):
    """(x'', y) of a batch ids (N, T), mask (N, T): each real non-special token masked with probability rate (BERT's
    80/10/10, pretrain.mask_tokens; drawn from gen, a CPU torch.Generator), G's argmax filled in, then
    replaced_tokens. Both (N, T) int64 on ids' device."""
    G = generator
    inputs, _, _ = pretrain.mask_tokens(ids.cpu(), mask.cpu(), G.special, G.n_words, G.mask_id, rate, gen)  # (N, T)
    return replaced_tokens(G.fill(inputs.to(ids.device), mask), ids, mask)


def replaced_tokens(filled, ids, mask):
    """(x'', y) from G's tokens filled (N, T): x'' = filled at the real tokens with [CLS] put back (position 0 keeps
    ids'), padding ids' own; y = 1 at a real token where x'' != ids (replaced), else 0 (models.py:185-187)."""
    real = mask.bool()
    x2 = torch.where(real, filled, ids)
    x2[:, 0] = ids[:, 0]
    return x2, ((x2 != ids) & real).long()

# -----------------------------------------------------------------------------
# the conditional discriminator D and its loss


class Discriminator(nn.Module):
    """D: a trained copy of model (the official initialises it from the same pretrained weights as the trained model,
    train.py:388), conditioned on a sentence vector that replaces its [CLS] embedding, and its per-token head."""

    def __init__(self, model):
        super().__init__()
        self.bert = copy.deepcopy(model).requires_grad_(True)  # every weight trained, the embeddings too
        self.electra_head = nn.Linear(model.config.hidden_size, 2)  # torch's init (train.py:387)

    def forward(self, z, inputs, mask):
        """Logits (N, T, 2) (original, replaced) of x'' = inputs (N, T), conditioned on z (N, H): the embedding
        output at position 0 replaced by z (modeling_bert.py:960-961)."""
        H = self.bert.config.hidden_size
        assert z.shape == (len(inputs), H), f"sentence vectors {tuple(z.shape)} for {len(inputs)} sentences, D's H {H}"

        def condition(x):  # (N, T, H) -> (N, T, H)
            return torch.cat([z[:, None].to(x.dtype), x[:, 1:]], 1)
        return self.electra_head(augment.forward(self.bert, inputs, mask, embedding_fn=condition)[-1])


def electra_loss(logits, y):
    """L_RTD: the cross-entropy of y (N, T) under the 2-way logits (N, T, 2), the mean over all N * T positions (padding
    and [CLS] included, their y 0: models.py:272), in fp32 (fp64 stays fp64, for the tests)."""
    logits = logits.float() if logits.dtype != torch.float64 else logits
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


class ProjectionMLP(nn.Module):
    """The recipe's head f (--batchnorm, models.py:35-50): Linear(H, 2H, no bias), BatchNorm, ReLU, Linear(2H, H, no
    bias), BatchNorm without affine. Linears N(0, 0.02) (cl_init's init_weights), BatchNorms torch's init."""

    def __init__(self, H):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(H, 2 * H, bias=False), nn.BatchNorm1d(2 * H), nn.ReLU(),
                                 nn.Linear(2 * H, H, bias=False), nn.BatchNorm1d(H, affine=False))
        for m in self.net:
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, c):  # (N, H) -> (N, H); batch statistics in train mode
        return self.net(c)


def batchnorm_head(H, cfg=None):
    """methods.py's head(H, cfg): ProjectionMLP."""
    return ProjectionMLP(H)

# -----------------------------------------------------------------------------
# the method's state: G, D and the extra loss


class DiffCSE:
    """G (frozen) and D (trained), and lam * L_RTD for the step. cfg: CONFIG's keys (lam, mask_rate,
    generator_dropout), missing ones CONFIG's. Starts in train mode: D's dropout on, G's as generator_dropout."""

    def __init__(self, generator, discriminator, cfg=None):
        unknown = set(cfg or {}) - set(CONFIG)
        assert not unknown, f"unknown DiffCSE settings {sorted(unknown)}: use {sorted(CONFIG)}"
        self.G, self.D, self.cfg = generator.requires_grad_(False), discriminator, {**CONFIG, **(cfg or {})}
        self.last = {}  # the last step's L_RTD and share of replaced tokens, detached tensors (for the log)
        self.train()

    def modules(self):
        """The trained modules, for the optimizer (and DDP): D, its BERT and head."""
        return [self.D]

    def train(self, mode=True):
        self.D.train(mode)
        self.G.train(mode and self.cfg["generator_dropout"])
        return self

    def to(self, device):
        self.G.to(device)
        self.D.to(device)
        return self

    def extra_loss(self, z, ids, mask, gen):
        """lam * L_RTD, a scalar fp32 tensor, for N sentences ids (N, T), mask (N, T) and z (N, H), the vectors D is
        conditioned on: f(c), the head's output of each row (models.py:175-179). Gradients reach D and z, never G.
        The masks come from gen (a CPU torch.Generator), dropout from torch's RNG. Both copies of a batch: once on
        their concatenation, or once each and averaged (the same number for two (b, T) batches)."""
        x2, y = corrupt(self.G, ids, mask, self.cfg["mask_rate"], gen)  # (N, T) each
        L = electra_loss(self.D(z, x2, mask), y)
        self.last = {"rtd": L.detach(), "replaced": y.sum() / mask.sum()}
        return self.cfg["lam"] * L
