"""
BERT in plain PyTorch: config, model, the checkpoint key map, tokenizer, sentence vectors.

It follows 1) google-research/bert modeling.py and 2) huggingface/transformers modeling_bert.py
(BertModel). It returns every hidden state: SG-BERT's views come from all layers of BERT_F.
"""
import json
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import checkpoint
import fast
import runtime
import wordpiece
from checkpoint import LoadError
from fast import Linear  # nn.Linear whose frozen weights are cast once (fast.py)

# Shapes: B = batch size, T = sequence length, H = hidden size, N = the batch's real tokens,
# nh = heads, hs = H // nh, I = intermediate size, L = layers.

# -----------------------------------------------------------------------------
# config


@dataclass
class BertConfig:
    # fields are exactly the config.json keys; defaults are HF's for the keys old configs may lack
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0

    @classmethod
    def from_dict(cls, d, source="config"):
        """A checked config from a config.json dict; a bad value is a LoadError naming the key."""
        if not isinstance(d, dict):
            raise LoadError(f"{source}: the config is a JSON {type(d).__name__}, not an object")
        for k in (f.name for f in fields(cls) if f.default is MISSING):
            if k not in d:
                raise LoadError(f"{source}: config is missing the required key '{k}'")
        for k, (ok, what) in CONFIG_CHECKS.items():
            if k in d and not ok(d[k]):
                value = json.dumps(d[k], default=repr)[:40]
                raise LoadError(f"{source}: config key '{k}' is {value}; it must be {what}")
        cfg = cls(**{k: d[k] for k in CONFIG_CHECKS if k in d})  # unknown keys are ignored
        if cfg.hidden_size % cfg.num_attention_heads:
            raise LoadError(f"{source}: config key 'hidden_size' {cfg.hidden_size} is not a "
                            f"multiple of 'num_attention_heads' {cfg.num_attention_heads}")
        if cfg.pad_token_id >= cfg.vocab_size:
            raise LoadError(f"{source}: config key 'pad_token_id' {cfg.pad_token_id} is not below "
                            f"'vocab_size' {cfg.vocab_size}")
        return cfg

    def to_dict(self):
        return {f.name: getattr(self, f.name) for f in fields(self)}


# Careful: there are two GELUs. HF "gelu" is the exact erf form (what hub BERT checkpoints use);
# google-bert's TF code and HF "gelu_new" use the tanh approximation. We follow the config.
GELU_APPROX = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}

# What each config.json value must be: (test, words for the error). type() keeps out true/false
# (bool is an int) and, with the comparisons, NaN; HF would build a broken model from any of these.
SIZE = (lambda v: type(v) is int and v > 0, "a positive integer")
PROBABILITY = (lambda v: type(v) in (int, float) and 0 <= v < 1, "a number in [0, 1)")
EPS = (lambda v: type(v) in (int, float) and 0 < v < float("inf"), "a positive number")
CONFIG_CHECKS = dict(
    vocab_size=SIZE, hidden_size=SIZE, num_hidden_layers=SIZE, num_attention_heads=SIZE,
    intermediate_size=SIZE, max_position_embeddings=SIZE, type_vocab_size=SIZE,
    hidden_act=(lambda v: type(v) is str and v in GELU_APPROX, f"one of {', '.join(GELU_APPROX)}"),
    hidden_dropout_prob=PROBABILITY, attention_probs_dropout_prob=PROBABILITY, layer_norm_eps=EPS,
    pad_token_id=(lambda v: type(v) is int and v >= 0, "a non-negative integer"))

# -----------------------------------------------------------------------------
# model (the speed tricks it calls, fast.Rows, fast.linear and fast.attention, are in fast.py)


class Embeddings(nn.Module):

    def __init__(self, cfg):
        super().__init__()
        H = cfg.hidden_size
        self.word_embeddings = nn.Embedding(cfg.vocab_size, H, padding_idx=cfg.pad_token_id)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, H)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, H)
        self.LayerNorm = nn.LayerNorm(H, eps=cfg.layer_norm_eps)  # HF's key name
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, input_ids, token_type_ids):
        pos = torch.arange(input_ids.size(1), device=input_ids.device)
        x = (self.word_embeddings(input_ids) + self.position_embeddings(pos)
             + self.token_type_embeddings(token_type_ids))
        return self.dropout(self.LayerNorm(x))  # (B, T, H)


class SelfAttention(nn.Module):

    def __init__(self, cfg):
        super().__init__()
        H = cfg.hidden_size
        self.query, self.key, self.value = Linear(H, H), Linear(H, H), Linear(H, H)
        self.nh, self.dropout_p = cfg.num_attention_heads, cfg.attention_probs_dropout_prob

    def forward(self, x, rows):
        B, T, H = rows.B, rows.T, x.shape[-1]
        # q, k and v from one (N, 3H) product, then as a (B, T) batch for the key mask
        qkv = rows.unpack(fast.linear(x, self.query, self.key, self.value))
        q, k, v = qkv.view(B, T, 3, self.nh, H // self.nh).permute(2, 0, 3, 1, 4)  # (B, nh, T, hs)
        # softmax(q k^T / sqrt(hs)) v; padding keys are masked, so real tokens never see padding
        y = fast.attention(q, k, v, rows.mask, self.dropout_p if self.training else 0.0)
        return rows.pack(y.transpose(1, 2))  # (N, H)


class Layer(nn.Module):
    """One post-LN transformer block: x = LN(x + attn(x)); x = LN(x + ffn(x))."""

    def __init__(self, cfg):
        super().__init__()
        H, I, eps = cfg.hidden_size, cfg.intermediate_size, cfg.layer_norm_eps
        # names match HF keys so loading is 1:1: encoder.layer.N.attention.self.query.weight, ...
        self.attention = nn.ModuleDict(dict(
            self=SelfAttention(cfg),
            output=nn.ModuleDict(dict(dense=Linear(H, H), LayerNorm=nn.LayerNorm(H, eps=eps)))))
        self.intermediate = nn.ModuleDict(dict(dense=Linear(H, I)))
        self.output = nn.ModuleDict(dict(dense=Linear(I, H), LayerNorm=nn.LayerNorm(H, eps=eps)))
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)
        self.gelu = GELU_APPROX[cfg.hidden_act]

    def forward(self, x, rows):
        # x: (N, H), the batch's real tokens (fast.Rows); all but attention act per token
        attn = self.attention
        x = attn.output.LayerNorm(x + self.dropout(attn.output.dense(attn.self(x, rows))))
        h = F.gelu(self.intermediate.dense(x), approximate=self.gelu)  # (N, I)
        return self.output.LayerNorm(x + self.dropout(self.output.dense(h)))


class Bert(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList([Layer(config) for _ in range(config.num_hidden_layers)])
        self.extra = {}  # checkpoint tensors carried but unused (the pooler): export writes them
        self.apply(self._init_weights)

    def tensors(self):
        """A checkpoint's tensors: the weights (HF BertModel keys, fp32, CPU) and the pooler."""
        return {**{k: v.detach().to("cpu", torch.float32) for k, v in self.state_dict().items()},
                **self.extra}

    @staticmethod
    def _init_weights(m):
        # BERT's init (truncated normal in TF, plain normal in HF); matters for random test models
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear):
            nn.init.zeros_(m.bias)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        B, T = input_ids.shape
        assert T <= self.config.max_position_embeddings, (
            f"sequence of length {T} is longer than max_position_embeddings "
            f"{self.config.max_position_embeddings}")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids)
        hidden_states = [x]
        rows = fast.Rows(attention_mask, B, T)  # the layers see only the real tokens
        x = rows.pack(x)  # (N, H)
        for layer in self.encoder.layer:
            x = layer(x, rows)
            hidden_states.append(rows.unpack(x))  # 0 at the padding, which pooling masks anyway
        return hidden_states  # list of L+1 (B, T, H); [0] = embedding output, [k] = layer k's

    @classmethod
    def from_pretrained(cls, name_or_path):
        """A model folder, our .safetensors checkpoint or a name (weights/<name>/, else the hub),
        in eval mode; else a one-line LoadError."""
        return cls.from_checkpoint(read_checkpoint(name_or_path))

    @classmethod
    def from_checkpoint(cls, ck):
        """The model of what checkpoint.load read, in eval mode."""
        model = cls(config_of(ck))
        model.fill(ck.tensors, ck.weights)
        model.pooling = ck.meta.get("pooling")  # encode's default pooling; None for a model folder
        return model.eval()

    def fill(self, tensors, path):
        """Every weight from a checkpoint's tensors (read from path) through the key map below; a
        mismatch is a LoadError naming the file and the keys."""
        own, loaded, seen, self.extra = self.state_dict(), {}, {}, {}
        problems = {k: [] for k in ("missing keys", "unexpected keys", "wrong shapes",
                                    "integer tensors", "two keys for one weight")}
        for key, t in sorted(tensors.items()):
            k = hf_key(key)
            if k in seen:  # bert.X next to X (or gamma next to weight): which one is meant?
                problems["two keys for one weight"].append(f"{seen[k]} and {key}")
            seen[k] = key
            if k.startswith(IGNORED) and not k.startswith("pooler."):
                continue
            if not t.is_floating_point():  # load_state_dict would cast it silently
                problems["integer tensors"].append(f"{key} ({str(t.dtype).removeprefix('torch.')})")
            elif k.startswith("pooler."):
                self.extra[k] = t
            elif k not in own:
                problems["unexpected keys"].append(key)
            elif t.shape != own[k].shape:
                problems["wrong shapes"].append(f"{key} {tuple(t.shape)} (model expects "
                                                f"{tuple(own[k].shape)})")
            else:
                loaded[k] = t
        problems["missing keys"] = [k for k in own if k not in loaded and k not in seen]
        L = len({k.split(".")[2] for k in seen if k.startswith("encoder.layer.")})
        errors = []
        if L != self.config.num_hidden_layers:  # CLIP-style check of config vs tensor shapes
            errors.append(f"the config says {self.config.num_hidden_layers} layers but the "
                          f"checkpoint has {L}")
        for what, keys in problems.items():
            if keys:
                more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
                errors.append(f"{what}: {', '.join(keys[:5])}{more}")
        if errors:
            raise LoadError(f"{path}: does not match a BERT of this config: " + "; ".join(errors))
        self.load_state_dict(loaded, strict=True)


# The checkpoint layouts we accept, as one explicit key map applied to every checkpoint key:
#   HF BertModel (sentence-transformers models, our own files): keys as they are
#   HF BertForPreTraining, BertForMaskedLM (bert-base-uncased): "bert." prefix, LayerNorm.gamma/beta
PREFIX = "bert."
RENAMES = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}
IGNORED = ("cls.", "pooler.", "embeddings.position_ids",  # pretraining heads, pooler, a buffer
           checkpoint.TRANSFORM_PREFIX)  # a fitted transform of the vectors (posthoc.py)


def hf_key(key):
    key = key.removeprefix(PREFIX)
    for old, new in RENAMES.items():
        key = key.replace(old, new)
    return key


def read_checkpoint(name_or_path, tensors=True):
    """checkpoint.load, its LoadError one line; a relative path not there names the folder."""
    try:
        return checkpoint.load(name_or_path, tensors)
    except LoadError as e:
        p, why = Path(name_or_path), str(e)
        if p.suffix == ".safetensors" and not p.is_absolute() and not p.exists():
            why += (f" in the current folder {Path.cwd()}: a relative path is read from where "
                    "Python runs; give the checkpoint's own path (absolute, or relative to this "
                    "folder)")
        raise type(e)(why) from None


def config_of(ck):
    """The checked BertConfig of what checkpoint.load read (config.json, or our metadata)."""
    if ck.config is None:
        raise LoadError(f"{ck.path}: no 'config' in the safetensors metadata; this is not a "
                        "checkpoint written by sgbert. Load the folder that holds it with its "
                        "config.json instead.")
    return BertConfig.from_dict(ck.config, ck.config_source)

# -----------------------------------------------------------------------------
# tokenizer and sentence vectors


def load_tokenizer(name_or_path, max_len=128):
    """The tokenizer of a model folder, our checkpoint or a name: [CLS] ... [SEP], at most max_len
    tokens, no padding (batch_tensors pads each batch)."""
    return tokenizer_of(read_checkpoint(name_or_path, tensors=False), max_len)


def tokenizer_of(ck, max_len=128):
    """The checked tokenizer of what checkpoint.load read (wordpiece.py), capped by its config."""
    return wordpiece.of(ck, max_len, config=lambda: config_of(ck))


def batch_tensors(encodings, pad_id=0, device="cpu"):
    """Pad tokenizers Encodings to the longest: input_ids and attention_mask, (B, T) int64."""
    T = max(len(e.ids) for e in encodings)
    ids = np.full((len(encodings), T), pad_id, dtype=np.int64)
    mask = np.zeros((len(encodings), T), dtype=np.int64)
    for i, e in enumerate(encodings):
        ids[i, :len(e.ids)] = e.ids
        mask[i, :len(e.ids)] = 1
    return torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)


def masked_mean(x, mask):
    """Mean over the real tokens: x (B, T, H), mask (B, T) -> (B, H)."""
    m = mask.unsqueeze(-1).to(x.dtype)
    return (x * m).sum(1) / m.sum(1).clamp(min=1)


POOLINGS = ("cls", "mean", "max", "first-last", "last2")
PRECISIONS = ("fp32", "bf16")


def pool(hidden_states, attention_mask, pooling="cls", layer=-1):
    """One vector per sentence from the hidden states: (B, H)."""
    hs = hidden_states
    if pooling == "cls":
        return hs[layer][:, 0]
    if pooling == "mean":
        return masked_mean(hs[layer], attention_mask)
    if pooling == "max":
        return hs[layer].masked_fill(~attention_mask.bool().unsqueeze(-1),
                                     float("-inf")).max(1).values
    if pooling == "first-last":  # layer 1 and the last, each mean pooled (not the embeddings)
        return (masked_mean(hs[1], attention_mask) + masked_mean(hs[-1], attention_mask)) / 2
    if pooling == "last2":
        return (masked_mean(hs[-2], attention_mask) + masked_mean(hs[-1], attention_mask)) / 2
    raise ValueError(f"unknown pooling '{pooling}': use one of {', '.join(POOLINGS)}")


def encode(model, tokenizer, sentences, pooling=None, layer=-1, batch_size=64, dropout=False,
           progress=None, precision="fp32"):
    """Sentence vectors, numpy float32 (n, H) in input order. pooling: a name of POOLINGS, a
    function (hidden_states, attention_mask) -> (B, H), or None: the checkpoint's, else cls."""
    if pooling is None:
        pooling = getattr(model, "pooling", None) or "cls"  # Bert.from_checkpoint's record
    return encode_many(model, tokenizer, sentences, [(pooling, layer)], batch_size, dropout,
                       progress, precision=precision)[pooling, layer]


def encode_many(model, tokenizer, sentences, specs, batch_size=64, dropout=False, progress=None,
                precision="fp32"):
    """encode for several (pooling, layer), one forward per batch: {(pooling, layer): (n, H)}."""
    L = model.config.num_hidden_layers
    for pooling, layer in specs:
        if not callable(pooling) and pooling not in POOLINGS:
            raise ValueError(f"unknown pooling '{pooling}': use one of {', '.join(POOLINGS)}")
        assert -L - 1 <= layer <= L, f"layer {layer} out of range for {L} layers (0..{L})"
    assert precision in PRECISIONS, f"unknown precision '{precision}': use one of {PRECISIONS}"
    device = next(model.parameters()).device
    out = {spec: np.zeros((len(sentences), model.config.hidden_size), dtype=np.float32)
           for spec in specs}
    encodings = tokenizer.encode_batch(list(sentences)) if len(sentences) else []
    order = sorted(range(len(sentences)), key=lambda i: len(encodings[i].ids))
    was_training = model.training
    model.train(dropout)
    # bf16: one autocast region over all the batches, so each weight is cast once; no_grad, not
    # inference_mode, under which autocast keeps no cast weights
    bf16 = precision == "bf16"
    with torch.no_grad() if bf16 else torch.inference_mode(), \
            runtime.bf16_products(precision, device.type), \
            torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16), fast.frozen(model):
        for s in range(0, len(order), batch_size):
            idx = order[s:s + batch_size]
            ids, mask = batch_tensors([encodings[i] for i in idx], model.config.pad_token_id,
                                      device)
            hidden_states = model(ids, mask)
            for (pooling, layer), arr in out.items():
                v = (pooling(hidden_states, mask) if callable(pooling)
                     else pool(hidden_states, mask, pooling, layer))
                arr[idx] = v.float().cpu().numpy()
            if progress:
                progress(s + len(idx), len(order))
    model.train(was_training)
    return out
