"""
BERT encoder in plain PyTorch: config, model, the checkpoint key map, tokenizer and sentence encoding.

The whole encoder is in this one file. It follows
1) google-research/bert modeling.py (the original TF1 code) and
2) huggingface/transformers models/bert/modeling_bert.py (BertModel),
and returns every hidden state, because SG-BERT reads views from all layers of the frozen copy.
Attribute names match HF keys, so a BertModel checkpoint loads 1:1.

Shape legend: B = batch size, T = sequence length, H = hidden size, nh = attention heads, hs = H // nh.
"""
import contextlib
import json
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import checkpoint
import cli
from checkpoint import LoadError

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
        """A checked config from a config.json dict; any bad value is a LoadError naming source and the key."""
        if not isinstance(d, dict):
            raise LoadError(f"{source}: the config is a JSON {type(d).__name__}, not an object of config keys")
        for k in (f.name for f in fields(cls) if f.default is MISSING):
            if k not in d:
                raise LoadError(f"{source}: config is missing the required key '{k}'")
        for k, (ok, what) in CONFIG_CHECKS.items():
            if k in d and not ok(d[k]):
                value = json.dumps(d[k], default=repr)[:40]
                raise LoadError(f"{source}: config key '{k}' is {value}; it must be {what}")
        cfg = cls(**{k: d[k] for k in CONFIG_CHECKS if k in d})  # unknown keys (model_type, ...) are ignored
        if cfg.hidden_size % cfg.num_attention_heads:
            raise LoadError(f"{source}: config key 'hidden_size' {cfg.hidden_size} is not a multiple of "
                            f"'num_attention_heads' {cfg.num_attention_heads}")
        if cfg.pad_token_id >= cfg.vocab_size:
            raise LoadError(f"{source}: config key 'pad_token_id' {cfg.pad_token_id} is not below "
                            f"'vocab_size' {cfg.vocab_size}")
        return cfg

    def to_dict(self):
        return {f.name: getattr(self, f.name) for f in fields(self)}


# Careful: there are two GELUs. HF "gelu" is the exact erf form (what BERT checkpoints on the hub are used with);
# google-bert's TF code and HF "gelu_new" use the tanh approximation. We follow the config.
GELU_APPROX = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}

# What each config.json value must be: (test, words for the error). type() rather than isinstance keeps out
# true/false (bool is an int) and, with the comparisons, NaN; HF would build a broken model from any of these.
POSITIVE_INT = (lambda v: type(v) is int and v > 0, "a positive integer")
PROBABILITY = (lambda v: type(v) in (int, float) and 0 <= v < 1, "a number in [0, 1)")
CONFIG_CHECKS = {
    **dict.fromkeys(["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size"], POSITIVE_INT),
    "hidden_act": (lambda v: isinstance(v, str) and v in GELU_APPROX, f"one of {', '.join(GELU_APPROX)}"),
    "hidden_dropout_prob": PROBABILITY, "attention_probs_dropout_prob": PROBABILITY,
    "layer_norm_eps": (lambda v: type(v) in (int, float) and 0 < v < float("inf"), "a positive number"),
    "pad_token_id": (lambda v: type(v) is int and v >= 0, "a non-negative integer"),
}

# -----------------------------------------------------------------------------
# model


class Embeddings(nn.Module):

    def __init__(self, cfg):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=cfg.pad_token_id)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)  # not snake_case: HF key name
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, input_ids, token_type_ids, position_ids=None):
        pos = torch.arange(input_ids.size(1), device=input_ids.device) if position_ids is None else position_ids
        x = self.word_embeddings(input_ids) + self.position_embeddings(pos) + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))  # (B, T, H)


class Layer(nn.Module):
    """One post-LN transformer block: x = LN(x + attn(x)); x = LN(x + ffn(x))."""

    def __init__(self, cfg):
        super().__init__()
        H, I, eps = cfg.hidden_size, cfg.intermediate_size, cfg.layer_norm_eps
        self.nh = cfg.num_attention_heads
        self.attn_drop = cfg.attention_probs_dropout_prob
        self.gelu = GELU_APPROX[cfg.hidden_act]
        # names match HF keys so loading is 1:1: encoder.layer.N.attention.self.query.weight, ...
        self.attention = nn.ModuleDict(dict(
            self=nn.ModuleDict(dict(query=nn.Linear(H, H), key=nn.Linear(H, H), value=nn.Linear(H, H))),
            output=nn.ModuleDict(dict(dense=nn.Linear(H, H), LayerNorm=nn.LayerNorm(H, eps=eps)))))
        self.intermediate = nn.ModuleDict(dict(dense=nn.Linear(H, I)))
        self.output = nn.ModuleDict(dict(dense=nn.Linear(I, H), LayerNorm=nn.LayerNorm(H, eps=eps)))
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)
        self.kept = None  # (key, products): a frozen layer's weights as its products take them (products())

    def products(self, device_type):
        """(weight, bias) of the layer's four products as forward takes them: q, k and v as one (3H, H) product, then
        the attention output, the intermediate and the output dense. A frozen layer (no weight requires grad: BERT_F,
        DiffCSE's generator) keeps them, q, k and v concatenated and cast to autocast's dtype when it is on, until
        its weights are replaced or changed in place (their storage and versions are the key): the very tensors
        autocast would make at every use, made once. (!!) Autocast keeps the casts of weights that require grad only,
        so a frozen BERT_F in bf16 was cast again at every step, and q, k and v concatenated again by every forward.
        (!!) Not for weights that learn, even under no_grad: the fused AdamW step changes them in place without
        bumping their versions, so a kept copy would go stale unseen."""
        sa, ao = self.attention.self, self.attention.output
        linears = (ao.dense, self.intermediate.dense, self.output.dense)
        params = (sa.query.weight, sa.key.weight, sa.value.weight, sa.query.bias, sa.key.bias, sa.value.bias,
                  *(t for m in linears for t in (m.weight, m.bias)))
        frozen = not any(t.requires_grad for t in params)
        dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
        key = (dtype, tuple((t._version, t.data_ptr()) for t in params))
        if frozen and self.kept is not None and self.kept[0] == key:
            return self.kept[1]
        out = [(torch.cat(params[:3]), torch.cat(params[3:6])), *((m.weight, m.bias) for m in linears)]
        if frozen:
            out = [(w.to(dtype), b.to(dtype)) for w, b in out] if dtype else out
            self.kept = (key, out)
        return out

    def forward(self, x, mask, B, T, keep=None):
        """x (N, H): the real tokens of a (B, T) batch, packed (keep: their flat indices; None: all B * T rows).
        Everything but attention acts on each token alone, so it runs on the N real rows only; attention unpacks
        q, k, v to (B, nh, T, hs) for its key mask. mask: (B, 1, 1, T) bool, True = attend, or None."""
        H = x.shape[-1]
        # q, k and v from one (N, 3H) product: one larger GEMM is faster than three, and one unpack
        qkv_p, attn_p, inter_p, out_p = self.products(x.device.type)
        qkv = unpack(F.linear(x, *qkv_p), keep, B, T).view(B, T, 3, self.nh, H // self.nh)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, nh, T, hs)
        # padding keys are never attended to, so the outputs at real tokens do not depend on the padding.
        # (!!) On a CPU the attention runs in fp32 under bf16 autocast: torch's CPU flash attention in bf16 ran slower
        # than in fp32 on an AMX Xeon (forward x1.6, backward x5-6: benchmarks/profile.py), and T x T is small work.
        # Autocast would cast fp32 q, k, v back to bf16 (attention is on its CPU list), hence the region without it
        fp32 = q.dtype == torch.bfloat16 and q.device.type == "cpu"
        with torch.autocast("cpu", enabled=False) if fp32 else contextlib.nullcontext():
            q, k, v = (q.float(), k.float(), v.float()) if fp32 else (q, k, v)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                               dropout_p=self.attn_drop if self.training else 0.0)
        y = y.transpose(1, 2).reshape(B * T, H)
        y = y if keep is None else y.index_select(0, keep)  # (N, H)
        x = self.attention.output.LayerNorm(x + self.dropout(F.linear(y, *attn_p)))
        h = F.gelu(F.linear(x, *inter_p), approximate=self.gelu)  # (N, I)
        return self.output.LayerNorm(x + self.dropout(F.linear(h, *out_p)))


def unpack(x, keep, B, T):
    """Packed rows x (N, D) -> (B, T, D) with zeros at the padding (keep: the real rows' flat indices)."""
    if keep is None:
        return x.view(B, T, -1)
    return x.new_zeros(B * T, x.shape[-1]).index_copy(0, keep, x).view(B, T, -1)


class Bert(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList([Layer(config) for _ in range(config.num_hidden_layers)])
        self.extra = {}  # checkpoint tensors we carry but do not use (the pooler), so export writes a whole BertModel
        self.apply(self._init_weights)

    def tensors(self):
        """What a checkpoint holds: the weights under HF BertModel key names in fp32 on the CPU, and the pooler."""
        return {**{k: v.detach().to("cpu", torch.float32) for k, v in self.state_dict().items()}, **self.extra}

    @staticmethod
    def _init_weights(m):
        # BERT's init (truncated normal in TF, plain normal in HF); only matters for random test models
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear):
            nn.init.zeros_(m.bias)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, embedding_fn=None):
        """position_ids (B, T) replace 0..T-1, and embedding_fn maps the embedding output (B, T, H) before layer 1:
        the two hooks ConSERT's augmentations need (augment.py)."""
        B, T = input_ids.shape
        assert T <= self.config.max_position_embeddings, \
            f"sequence of length {T} is longer than max_position_embeddings {self.config.max_position_embeddings}"
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        if embedding_fn is not None:
            x = embedding_fn(x)
        hidden_states = [x]
        # the layers see only the real tokens, packed: on STS-B-like batches about half of B * T is padding, and
        # the padding rows of a layer's output are 0 (no one reads them: pooling and attention mask them)
        keep = None
        if mask is not None and attention_mask.all():
            mask = None  # no padding: no mask
        elif mask is not None:
            keep = attention_mask.flatten().nonzero().squeeze(1)
        x = x.reshape(B * T, -1) if keep is None else x.reshape(B * T, -1).index_select(0, keep)
        for layer in self.encoder.layer:
            x = layer(x, mask, B, T, keep)
            hidden_states.append(unpack(x, keep, B, T))
        return hidden_states  # list of L+1 (B, T, H); [0] = embedding output, [k] = output of layer k

    @classmethod
    def from_pretrained(cls, name_or_path):
        """A model folder (config.json + model.safetensors), a .safetensors checkpoint written by this project,
        or a name found as weights/<name>/ (downloaded from the Hugging Face hub when missing). Eval mode. What
        cannot be loaded is a LoadError of one line that names the file and what to do (read_checkpoint)."""
        return cls.from_checkpoint(read_checkpoint(name_or_path))

    @classmethod
    def from_checkpoint(cls, ck):
        """The model of what checkpoint.load read: its config, its tensors through the key map below. Eval mode."""
        model = cls(config_of(ck))
        model.load_tensors(ck.tensors, ck.weights)
        model.pooling = ck.meta.get("pooling")  # what encode pools with by default; None for a model folder
        return model.eval()

    def load_tensors(self, tensors, path):
        """Fill every parameter from tensors {checkpoint key: tensor} (read from path) through the key map below;
        any mismatch is an error that names the file and the keys."""
        own = self.state_dict()
        loaded, seen, self.extra = {}, {}, {}
        problems = {k: [] for k in ("missing keys", "unexpected keys", "wrong shapes", "integer tensors",
                                    "two keys for one weight")}
        for key, t in sorted(tensors.items()):
            k = hf_key(key)
            if k in seen:  # bert.X next to X (or gamma next to weight): which one is meant is anyone's guess
                problems["two keys for one weight"].append(f"{seen[k]} and {key}")
            seen[k] = key
            if k.startswith(IGNORED) and not k.startswith("pooler."):
                continue
            if not t.is_floating_point():  # load_state_dict would cast it silently: an id table is no weight
                problems["integer tensors"].append(f"{key} ({str(t.dtype).removeprefix('torch.')})")
            elif k.startswith("pooler."):
                self.extra[k] = t
            elif k not in own:
                problems["unexpected keys"].append(key)
            elif t.shape != own[k].shape:
                problems["wrong shapes"].append(f"{key} {tuple(t.shape)} (model expects {tuple(own[k].shape)})")
            else:
                loaded[k] = t
        problems["missing keys"] = [k for k in own if k not in loaded and k not in seen]
        n_ckpt = len({k.split(".")[2] for k in seen if k.startswith("encoder.layer.")})
        errors = []
        if n_ckpt != self.config.num_hidden_layers:  # CLIP-style cross-check of config vs tensor shapes
            errors.append(f"the config says {self.config.num_hidden_layers} layers but the checkpoint has {n_ckpt}")
        for what, keys in problems.items():
            if keys:
                more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
                errors.append(f"{what}: {', '.join(keys[:5])}{more}")
        if errors:
            raise LoadError(f"{path}: does not match a BERT of this config: " + "; ".join(errors))
        self.load_state_dict(loaded, strict=True)


# The checkpoint layouts we accept, as one explicit key map applied to every checkpoint key:
#   HF BertModel (sentence-transformers models, our own files): keys as they are
#   HF BertForPreTraining / BertForMaskedLM (bert-base-uncased): "bert." prefix, LayerNorm.gamma / LayerNorm.beta
PREFIX = "bert."
RENAMES = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}
IGNORED = ("cls.", "pooler.", "embeddings.position_ids",  # pretraining heads, the pooler (we use raw [CLS]), a buffer
           checkpoint.TRANSFORM_PREFIX)  # a fitted transform of the sentence vectors (posthoc.py), not BERT's weights


def hf_key(key):
    key = key.removeprefix(PREFIX)
    for old, new in RENAMES.items():
        key = key.replace(old, new)
    return key



def read_checkpoint(name_or_path, tensors=True):
    """checkpoint.load for a library caller (from_pretrained, load_tokenizer): its LoadError raised from here, without
    the loader's frames chained on, so that the error reads as its one line; a relative path that is not there says
    which folder it was looked for in (a script run from another folder than the checkpoint's)."""
    try:
        return checkpoint.load(name_or_path, tensors)
    except LoadError as e:
        p, why = Path(name_or_path), str(e)
        if p.suffix == ".safetensors" and not p.is_absolute() and not p.exists():
            why += (f" in the current folder {Path.cwd()}: a relative path is read from where Python runs; give the "
                    "checkpoint's own path (absolute, or relative to this folder)")
        raise type(e)(why) from None


def config_of(ck):
    """The checked BertConfig of what checkpoint.load read: a model folder's config.json, our checkpoint's metadata."""
    if ck.config is None:
        raise LoadError(f"{ck.path}: no 'config' in the safetensors metadata; this is not a checkpoint written by "
                        "sgbert. Load the folder that holds it with its config.json instead.")
    return BertConfig.from_dict(ck.config, ck.config_source)


# -----------------------------------------------------------------------------
# tokenizer and sentence encoding


def load_tokenizer(name_or_path, max_len=128):
    """A tokenizers.Tokenizer that adds [CLS] ... [SEP] and truncates to max_len tokens (no padding: we pad per batch),
    of a model folder, our checkpoint or a name (checkpoint.load, without its weights): see tokenizer_of."""
    return tokenizer_of(read_checkpoint(name_or_path, tensors=False), max_len)


def tokenizer_of(ck, max_len=128):
    """The tokenizer of what checkpoint.load read: the one stored in our checkpoint's metadata, a folder's
    tokenizer.json, or built from its vocab.txt (uncased). Where the model's config is known, max_len is capped by
    max_position_embeddings and the ids are checked against vocab_size."""
    from tokenizers import Tokenizer
    src = ck.path
    if src == ck.weights:  # our checkpoint
        if ck.tokenizer is None:
            raise LoadError(f"{src}: no 'tokenizer' in the safetensors metadata; pass the base model's folder instead")
        what, make = f"{src} (metadata 'tokenizer')", lambda: Tokenizer.from_str(ck.tokenizer)
    elif ck.tokenizer is None:
        raise LoadError(f"{src}: no tokenizer.json or vocab.txt; put one of them in the model folder")
    elif ck.tokenizer.name == "tokenizer.json":
        what, make = ck.tokenizer, lambda: Tokenizer.from_file(str(ck.tokenizer))
    else:
        what, make = ck.tokenizer, lambda: wordpiece_from_vocab(ck.tokenizer)
    try:
        tok = make()
        tok.no_padding()
        tok.no_truncation()
        ids = tok.encode("a").ids
    except LoadError:
        raise
    except Exception as e:  # the tokenizers library raises plain Exceptions with a parser message
        reason = (str(e).splitlines() or [type(e).__name__])[0]
        raise LoadError(f"{what}: not a valid tokenizer ({reason}); re-create it") from None
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    if cls_id is None or sep_id is None or ids[:1] != [cls_id] or ids[-1:] != [sep_id]:
        raise LoadError(f"{what}: the tokenizer does not add [CLS] ... [SEP] (it gives {ids} for 'a'); "
                        "SG-BERT's sentence vector is the [CLS] token")
    if ck.config is not None:
        config = config_of(ck)
        check_vocab(tok, config, what)
        max_len = min(max_len, config.max_position_embeddings)  # longer inputs have no position embedding
    tok.enable_truncation(max_length=max_len)
    return tok


def check_vocab(tokenizer, config, source="tokenizer"):
    """Every id the tokenizer can give must be a row of the model's embedding table (config.vocab_size)."""
    top = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)
    if top >= config.vocab_size:
        raise LoadError(f"{source}: the tokenizer gives ids up to {top} but the model's vocab_size is "
                        f"{config.vocab_size}; it belongs to another model")


def wordpiece_from_vocab(vocab_file):
    """The uncased BERT WordPiece tokenizer (google-bert's BasicTokenizer + WordpieceTokenizer) from vocab.txt."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece
    try:
        words = Path(vocab_file).read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError as e:
        raise LoadError(f"{vocab_file}: not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8") from None
    vocab = {w: i for i, w in enumerate(words) if w}
    for t in ("[CLS]", "[SEP]", "[UNK]", "[PAD]"):
        if t not in vocab:
            raise LoadError(f"{vocab_file}: the special token {t} is not in the vocabulary")
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.BertProcessing(("[SEP]", vocab["[SEP]"]), ("[CLS]", vocab["[CLS]"]))
    tok.decoder = decoders.WordPiece()
    return tok


def batch_tensors(encodings, pad_id=0, device="cpu"):
    """Pad a list of tokenizers Encodings to the longest: input_ids and attention_mask, (B, T) int64."""
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


def pool(hidden_states, attention_mask, pooling="cls", layer=-1):
    """One vector per sentence from the hidden states: (B, H)."""
    hs = hidden_states
    if pooling == "cls":
        return hs[layer][:, 0]
    if pooling == "mean":
        return masked_mean(hs[layer], attention_mask)
    if pooling == "max":
        return hs[layer].masked_fill(~attention_mask.bool().unsqueeze(-1), float("-inf")).max(1).values
    if pooling == "first-last":  # layer 1 and the last layer, each mean pooled (not the embeddings, layer 0)
        return (masked_mean(hs[1], attention_mask) + masked_mean(hs[-1], attention_mask)) / 2
    if pooling == "last2":
        return (masked_mean(hs[-2], attention_mask) + masked_mean(hs[-1], attention_mask)) / 2
    raise ValueError(f"unknown pooling '{pooling}': use one of {POOLINGS}")


POOLINGS = ("cls", "mean", "max", "first-last", "last2")


PRECISIONS = ("fp32", "bf16")
MATRIX_PRODUCTS = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.addmm.default,
                   torch.ops.aten.baddbmm.default, torch.ops.aten.addbmm.default}


class Bf16Products(TorchDispatchMode):
    """bf16 matrix products as a bf16 unit computes them, on a CPU that has none: the bf16 operands widened to fp32
    (exactly), one fp32 GEMM (the sums in fp32, as the unit's), the result rounded to bf16. torch's own bf16 GEMM on
    such a CPU gives the same numbers up to the order of the fp32 sums (tests/test_bert.py), 5-50x slower: this keeps
    bf16 runs at about fp32's speed there. Below autograd, so the backward's products are caught too; every other op
    (autocast's casts, bf16 elementwise ops) runs as torch runs it."""

    @staticmethod
    def catches(func, args):
        """Whether this op is a matrix product with a bf16 operand (the ops the mode widens)."""
        return func in MATRIX_PRODUCTS and any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in args)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.catches(func, args):
            wide = [a.float() if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 else a for a in args]
            return func(*wide, **(kwargs or {})).to(torch.bfloat16)
        return func(*args, **(kwargs or {}))


def bf16_products(precision, device_type):
    """The context a --precision run holds around its forward and backward passes: Bf16Products for bf16 on a CPU
    without bf16 matrix instructions (cli.cpu_kind), else nothing (fp32; a bf16 unit or a GPU runs torch's own)."""
    emulate = precision == "bf16" and device_type == "cpu" and not cli.cpu_kind()["bf16_unit"]
    return Bf16Products() if emulate else contextlib.nullcontext()


@contextlib.contextmanager
def frozen(model):
    """A block in which model's weights require no grad, so that its layers keep their products' weights for the
    whole block (Layer.products: q, k, v concatenated and cast once, not once a batch); after it the flags are put
    back and, for a model that learns, what its layers kept is dropped (a kept copy must never outlive a weight
    that can change: Layer.products says why)."""
    flags = [p.requires_grad for p in model.parameters()]
    model.requires_grad_(False)
    try:
        yield model
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
        if any(flags):
            for layer in model.encoder.layer:
                layer.kept = None


def encode(model, tokenizer, sentences, pooling=None, layer=-1, batch_size=64, dropout=False, progress=None,
           precision="fp32"):
    """Embed sentences: numpy float32 (n, H), in input order. Batches hold sentences of similar length,
    which cuts the padding (and the time) several-fold on real data. pooling: a name of POOLINGS, or a function
    (hidden_states, attention_mask) -> (B, H) such as WK pooling (wk.py); None (the default): the pooling the
    checkpoint records (META 'pooling': the one its method is evaluated with, e.g. 'mean' for sg-opt-mean) for a
    model read from a checkpoint written by train.py, else 'cls'. A recorded fitted transform (whitening, flow) is
    not applied here, nor PromptBERT's template: evaluate.sentence_vectors does both. dropout: BERT's dropout stays on
    (BERT-flow's code fits its flow on vectors made so). progress(done, total): called after each batch.
    precision: fp32 (the exact numbers), or bf16: the matrix products in bfloat16 (autocast; the embeddings, the
    residual stream, LayerNorm, the pooling and the vectors stay fp32), faster only on a CPU with bf16 matrix
    instructions (AVX512-BF16, AMX) or a GPU; on a CPU without, its products are emulated at about fp32's speed
    (Bf16Products)."""
    if pooling is None:
        pooling = getattr(model, "pooling", None) or "cls"  # Bert.from_checkpoint: the checkpoint's recorded pooling
    if pooling == "prompt":
        raise ValueError("this checkpoint's sentence vector is PromptBERT's [MASK] vector of a template around the "
                         "sentence, which encode cannot make: use evaluate.sentence_vectors(model, tokenizer, "
                         "'prompt', template=...), or pass another pooling")
    return encode_many(model, tokenizer, sentences, [(pooling, layer)], batch_size, dropout, progress,
                       precision=precision)[pooling, layer]


def encode_many(model, tokenizer, sentences, specs, batch_size=64, dropout=False, progress=None, precision="fp32"):
    """encode for several (pooling, layer) pairs from one forward pass per batch: {(pooling, layer): (n, H)}."""
    L = model.config.num_hidden_layers
    for pooling, layer in specs:
        assert callable(pooling) or pooling in POOLINGS, f"unknown pooling '{pooling}': use one of {POOLINGS}"
        assert -L - 1 <= layer <= L, f"layer {layer} out of range for a model with {L} layers (0..{L})"
    assert precision in PRECISIONS, f"unknown precision '{precision}': use one of {PRECISIONS}"
    device = next(model.parameters()).device
    out = {spec: np.zeros((len(sentences), model.config.hidden_size), dtype=np.float32) for spec in specs}
    encodings = tokenizer.encode_batch(list(sentences)) if len(sentences) else []
    order = sorted(range(len(sentences)), key=lambda i: len(encodings[i].ids))
    was_training = model.training
    model.train(dropout)
    # bf16: one autocast region over all the batches, so that each weight is cast once, not once a batch; (!!)
    # autocast keeps no cast weights under inference_mode, hence no_grad there
    bf16 = precision == "bf16"
    with torch.no_grad() if bf16 else torch.inference_mode(), bf16_products(precision, device.type), \
            torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16), frozen(model):
        for s in range(0, len(order), batch_size):
            idx = order[s:s + batch_size]
            ids, mask = batch_tensors([encodings[i] for i in idx], model.config.pad_token_id, device)
            hidden_states = model(ids, mask)
            for (pooling, layer), arr in out.items():
                v = pooling(hidden_states, mask) if callable(pooling) else pool(hidden_states, mask, pooling, layer)
                arr[idx] = v.float().cpu().numpy()
            if progress:
                progress(s + len(idx), len(order))
    model.train(was_training)
    return out
