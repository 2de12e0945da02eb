"""
BERT encoder in plain PyTorch: config, model, checkpoint loading/saving, tokenizer and sentence encoding.

The whole encoder is in this one file. It follows
1) google-research/bert modeling.py (the original TF1 code) and
2) huggingface/transformers models/bert/modeling_bert.py (BertModel),
and returns every hidden state, because SG-BERT reads views from all layers of the frozen copy.
Attribute names match HF keys, so a BertModel checkpoint loads 1:1.

Shape legend: B = batch size, T = sequence length, H = hidden size, nh = attention heads, hs = H // nh.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

WEIGHTS = Path(os.environ.get("SG_WEIGHTS") or Path(__file__).resolve().parent / "weights")
HF_ENDPOINT = os.environ.get("HF_ENDPOINT", "https://huggingface.co")


class LoadError(Exception):
    """A model, checkpoint or tokenizer that cannot be loaded; the message names the file and what to do."""

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
        names = {f.name for f in fields(cls)}
        for k in (f.name for f in fields(cls) if f.default is MISSING):
            if k not in d:
                raise LoadError(f"{source}: config is missing the required key '{k}'")
        cfg = cls(**{k: v for k, v in d.items() if k in names})  # unknown keys (model_type, ...) are ignored
        if cfg.hidden_size % cfg.num_attention_heads:
            raise LoadError(f"{source}: hidden_size {cfg.hidden_size} is not a multiple of "
                            f"num_attention_heads {cfg.num_attention_heads}")
        if cfg.hidden_act not in GELU_APPROX:
            raise LoadError(f"{source}: hidden_act '{cfg.hidden_act}' is not supported (one of {list(GELU_APPROX)})")
        return cfg

    def to_dict(self):
        return {f.name: getattr(self, f.name) for f in fields(self)}


# Careful: there are two GELUs. HF "gelu" is the exact erf form (what BERT checkpoints on the hub are used with);
# google-bert's TF code and HF "gelu_new" use the tanh approximation. We follow the config.
GELU_APPROX = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}

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

    def forward(self, x, mask):
        B, T, H = x.shape
        sa, ao = self.attention.self, self.attention.output
        q, k, v = (lin(x).view(B, T, self.nh, H // self.nh).transpose(1, 2) for lin in (sa.query, sa.key, sa.value))
        # q, k, v: (B, nh, T, hs); mask: (B, 1, 1, T) bool, True = attend. Padding keys are never attended to,
        # so the outputs at real tokens do not depend on how much padding the batch has.
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.attn_drop if self.training else 0.0)
        y = y.transpose(1, 2).reshape(B, T, H)
        x = ao.LayerNorm(x + self.dropout(ao.dense(y)))
        h = F.gelu(self.intermediate.dense(x), approximate=self.gelu)  # (B, T, I)
        return self.output.LayerNorm(x + self.dropout(self.output.dense(h)))


class Bert(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList([Layer(config) for _ in range(config.num_hidden_layers)])
        self.extra = {}  # checkpoint tensors we carry but do not use (the pooler), so export writes a whole BertModel
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m):
        # BERT's init (truncated normal in TF, plain normal in HF); only matters for random test models
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear):
            nn.init.zeros_(m.bias)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, embedding_fn=None):
        """position_ids (B, T) replace 0..T-1, and embedding_fn maps the embedding output (B, T, H) before layer 1:
        the two hooks ConSERT's augmentations need (views.py)."""
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
        for layer in self.encoder.layer:
            x = layer(x, mask)
            hidden_states.append(x)
        return hidden_states  # list of L+1 (B, T, H); [0] = embedding output, [k] = output of layer k

    @classmethod
    def from_pretrained(cls, name_or_path):
        """A model folder (config.json + model.safetensors), a .safetensors checkpoint written by this project,
        or a name found as weights/<name>/ (downloaded from the Hugging Face hub when missing). Eval mode."""
        src = resolve(name_or_path)
        if src.suffix == ".safetensors":
            meta = read_metadata(src)
            if "config" not in meta:
                raise LoadError(f"{src}: no 'config' in the safetensors metadata; this is not a checkpoint written by "
                                "sgbert. Load the folder that holds it with its config.json instead.")
            config, weights = BertConfig.from_dict(meta["config"], str(src)), src
        else:
            config_file, weights = src / "config.json", src / "model.safetensors"
            for f in (config_file, weights):
                if not f.is_file():
                    hint = " (pytorch_model.bin is not read: save it as model.safetensors)" \
                        if (src / "pytorch_model.bin").exists() else ""
                    raise LoadError(f"{f} not found{hint}; a model folder needs config.json and model.safetensors")
            try:
                config = BertConfig.from_dict(json.loads(config_file.read_text()), str(config_file))
            except (json.JSONDecodeError, TypeError) as e:
                raise LoadError(f"{config_file}: not a valid BERT config.json ({e})") from None
        model = cls(config)
        model.load_safetensors(weights)
        return model.eval()

    def load_safetensors(self, path):
        """Fill every parameter from a safetensors file through the key map below; any mismatch is an error."""
        tensors = read_tensors(path)
        own = self.state_dict()
        loaded, unexpected, bad_shape, self.extra = {}, [], [], {}
        for key, t in tensors.items():
            k = hf_key(key)
            if k.startswith(IGNORED):
                if k.startswith("pooler."):
                    self.extra[k] = t
            elif k not in own:
                unexpected.append(key)
            elif t.shape != own[k].shape:
                bad_shape.append(f"{key} {tuple(t.shape)} (model expects {tuple(own[k].shape)})")
            else:
                loaded[k] = t
        missing = [k for k in own if k not in loaded]
        n_ckpt = len({k.split(".")[2] for k in map(hf_key, tensors) if k.startswith("encoder.layer.")})
        errors = []
        if n_ckpt != self.config.num_hidden_layers:  # CLIP-style cross-check of config vs tensor shapes
            errors.append(f"the config says {self.config.num_hidden_layers} layers but the checkpoint has {n_ckpt}")
        for what, keys in (("missing keys", missing), ("unexpected keys", unexpected), ("wrong shapes", bad_shape)):
            if keys:
                errors.append(f"{what}: {', '.join(keys[:5])}" + (f" and {len(keys) - 5} more" if len(keys) > 5 else ""))
        if errors:
            raise LoadError(f"{path}: does not match a BERT of this config: " + "; ".join(errors))
        self.load_state_dict(loaded, strict=True)


# The checkpoint layouts we accept, as one explicit key map applied to every checkpoint key:
#   HF BertModel (sentence-transformers models, our own files): keys as they are
#   HF BertForPreTraining / BertForMaskedLM (bert-base-uncased): "bert." prefix, LayerNorm.gamma / LayerNorm.beta
PREFIX = "bert."
RENAMES = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}
IGNORED = ("cls.", "pooler.", "embeddings.position_ids")  # pretraining heads, the pooler (we use raw [CLS]), a buffer


def hf_key(key):
    key = key.removeprefix(PREFIX)
    for old, new in RENAMES.items():
        key = key.replace(old, new)
    return key

# -----------------------------------------------------------------------------
# files: resolution, download, safetensors checkpoints


def resolve(name_or_path):
    """Path of a model: an existing path as is, else weights/<name>/, downloaded from the hub if missing."""
    p = Path(name_or_path)
    if p.exists():
        return p
    if p.suffix == ".safetensors" or p.is_absolute() or str(name_or_path).startswith("."):
        raise LoadError(f"{p} not found")
    local = WEIGHTS / str(name_or_path)
    if not local.is_dir():
        download(str(name_or_path), local)
    return local


def download(name, dest):
    """Fetch config.json, model.safetensors and tokenizer.json (or vocab.txt) from the hub into dest, atomically."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        for files in (["config.json"], ["model.safetensors"], ["tokenizer.json", "vocab.txt"]):
            for i, f in enumerate(files):
                try:
                    _fetch(f"{HF_ENDPOINT}/{name}/resolve/main/{f}", tmp / f)
                    break
                except urllib.error.HTTPError as e:
                    if e.code != 404 or i == len(files) - 1:
                        raise
        tmp.rename(dest)
    except (OSError, urllib.error.URLError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise LoadError(f"model '{name}' is not a local path and is not in {dest}, and downloading it from "
                        f"{HF_ENDPOINT} failed ({e}). Offline: put config.json, model.safetensors and tokenizer.json "
                        f"(or vocab.txt) of '{name}' in {dest}/") from None


def _fetch(url, path):
    with urllib.request.urlopen(url, timeout=30) as r, open(path, "wb") as f:
        total, done = int(r.headers.get("Content-Length") or 0), 0
        while chunk := r.read(1 << 20):
            f.write(chunk)
            done += len(chunk)
            print(f"\rdownloading {url}: {done / 1e6:.1f}" + (f"/{total / 1e6:.1f}" if total else "") + " MB",
                  end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)


def read_tensors(path):
    from safetensors.torch import load_file
    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises its own SafetensorError, or OSError
        raise LoadError(f"{path}: not a valid safetensors file ({e}); re-download or re-create it") from None


def read_metadata(path):
    """The metadata of a .safetensors file, with the JSON values our checkpoints store decoded."""
    from safetensors import safe_open
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
    except Exception as e:
        raise LoadError(f"{path}: not a valid safetensors file ({e}); re-download or re-create it") from None
    out = {}
    for k, v in meta.items():
        try:
            out[k] = json.loads(v) if k in JSON_META else v
        except json.JSONDecodeError:
            raise LoadError(f"{path}: metadata '{k}' is not valid JSON") from None
    return out


JSON_META = ("config", "args", "best")  # metadata values stored as JSON; "tokenizer" is a tokenizer.json string


def save_checkpoint(path, model, meta):
    """Write the model's weights (HF BertModel key names) and meta to a .safetensors file, atomically:
    a temp file in the same folder, then rename, so a crash never leaves a half-written checkpoint."""
    from safetensors.torch import save_file
    path = Path(path)
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    tensors.update({k: v.contiguous() for k, v in model.extra.items()})
    meta = {"format": "pt", "config": model.config.to_dict(), **meta}
    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=meta)
        os.chmod(tmp, 0o644)  # mkstemp makes the file private; a checkpoint is meant to be shared
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)

# -----------------------------------------------------------------------------
# tokenizer and sentence encoding


def load_tokenizer(name_or_path, max_len=128):
    """A tokenizers.Tokenizer that adds [CLS] ... [SEP] and truncates to max_len tokens (no padding: we pad per batch).
    From tokenizer.json, the tokenizer stored in our checkpoint's metadata, or built from vocab.txt (uncased)."""
    from tokenizers import Tokenizer
    src = resolve(name_or_path)
    if src.suffix == ".safetensors":
        meta = read_metadata(src)
        if "tokenizer" not in meta:
            raise LoadError(f"{src}: no 'tokenizer' in the safetensors metadata; pass the base model's folder instead")
        tok = Tokenizer.from_str(meta["tokenizer"])
    elif (src / "tokenizer.json").is_file():
        tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    elif (src / "vocab.txt").is_file():
        tok = wordpiece_from_vocab(src / "vocab.txt")
    else:
        raise LoadError(f"{src}: no tokenizer.json or vocab.txt; put one of them in the model folder")
    tok.no_padding()
    tok.enable_truncation(max_length=max_len)
    cls_id = tok.token_to_id("[CLS]")
    assert cls_id is not None and tok.encode("a").ids[0] == cls_id, f"{src}: tokenizer does not add [CLS] ... [SEP]"
    return tok


def wordpiece_from_vocab(vocab_file):
    """The uncased BERT WordPiece tokenizer (google-bert's BasicTokenizer + WordpieceTokenizer) from vocab.txt."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece
    vocab = {w: i for i, w in enumerate(Path(vocab_file).read_text(encoding="utf-8").split("\n")) if w}
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


def encode(model, tokenizer, sentences, pooling="cls", layer=-1, batch_size=64):
    """Embed sentences: numpy float32 (n, H), in input order. Batches hold sentences of similar length,
    which cuts the padding (and the time) several-fold on real data."""
    return encode_many(model, tokenizer, sentences, [(pooling, layer)], batch_size)[pooling, layer]


@torch.inference_mode()
def encode_many(model, tokenizer, sentences, specs, batch_size=64):
    """encode for several (pooling, layer) pairs from one forward pass per batch: {(pooling, layer): (n, H)}."""
    L = model.config.num_hidden_layers
    for pooling, layer in specs:
        assert pooling in POOLINGS, f"unknown pooling '{pooling}': use one of {POOLINGS}"
        assert -L - 1 <= layer <= L, f"layer {layer} out of range for a model with {L} layers (0..{L})"
    device = next(model.parameters()).device
    out = {spec: np.zeros((len(sentences), model.config.hidden_size), dtype=np.float32) for spec in specs}
    encodings = tokenizer.encode_batch(list(sentences)) if len(sentences) else []
    order = sorted(range(len(sentences)), key=lambda i: len(encodings[i].ids))
    was_training = model.training
    model.eval()
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        ids, mask = batch_tensors([encodings[i] for i in idx], model.config.pad_token_id, device)
        hidden_states = model(ids, mask)
        for (pooling, layer), arr in out.items():
            arr[idx] = pool(hidden_states, mask, pooling, layer).float().cpu().numpy()
    model.train(was_training)
    return out

# -----------------------------------------------------------------------------
# export: one folder that is a Hugging Face BertModel checkpoint and a sentence-transformers model at the same time


def export(src, out_dir, force=False):
    """Write a checkpoint (or a model folder / name) to out_dir: config.json + model.safetensors + tokenizer files
    for transformers, modules.json + CLS Pooling for sentence-transformers, and a README.md. The folder is written
    beside out_dir under a temp name, then renamed in, so a crash never leaves a half-written model."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a folder; choose another OUT_DIR")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise FileExistsError(f"{out} is not empty; pass --force to replace it")
    path = resolve(src)
    meta = read_metadata(path) if path.suffix == ".safetensors" else {"base_model": str(src)}
    model, tok = Bert.from_pretrained(path), load_tokenizer(path)
    cfg, args, best = model.config, meta.get("args") or {}, meta.get("best") or {}
    max_len = int(args.get("max_len") or min(512, cfg.max_position_embeddings))
    tok.no_truncation()  # transformers and sentence-transformers truncate per call (model_max_length, max_seq_length)
    tj = json.loads(tok.to_str())
    if tj["model"]["type"] != "WordPiece":
        raise LoadError(f"{path}: the tokenizer is {tj['model']['type']}, not WordPiece; only BERT tokenizers export")
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])  # with the added [CLS] ... tokens, ordered by id
    assert [i for _, i in vocab] == list(range(len(vocab))), f"{path}: tokenizer ids are not 0..{len(vocab) - 1}"
    norm = tj.get("normalizer") or {}  # BertNormalizer: lowercase, strip_accents, handle_chinese_chars
    special = {f"{n}_token": t for n, t in [("unk", "[UNK]"), ("sep", "[SEP]"), ("pad", "[PAD]"), ("cls", "[CLS]"),
                                            ("mask", "[MASK]")] if tok.token_to_id(t) is not None}
    files = {
        "config.json": {"architectures": ["BertModel"], "model_type": "bert", **cfg.to_dict(),
                        "position_embedding_type": "absolute", "initializer_range": 0.02},
        "tokenizer.json": tok.to_str(pretty=True),
        "tokenizer_config.json": {"tokenizer_class": "BertTokenizer", "do_lower_case": bool(norm.get("lowercase")),
                                  "strip_accents": norm.get("strip_accents"), "do_basic_tokenize": True,
                                  "tokenize_chinese_chars": norm.get("handle_chinese_chars", True),
                                  "model_max_length": max_len, **special},
        "special_tokens_map.json": special,
        "vocab.txt": "".join(w + "\n" for w, _ in vocab),
        # sentence-transformers, in the classic layout every version reads (module paths kept as aliases in v3+).
        # CLS pooling (!!): without 1_Pooling/config.json it silently mean-pools and scores an SG model wrongly.
        "modules.json": [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                         {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}],
        "1_Pooling/config.json": {"word_embedding_dimension": cfg.hidden_size, "pooling_mode_cls_token": True,
                                  "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
                                  "pooling_mode_mean_sqrt_len_tokens": False},
        "sentence_bert_config.json": {"max_seq_length": max_len, "do_lower_case": False},  # the tokenizer lowercases
        "config_sentence_transformers.json": {"prompts": {}, "default_prompt_name": None,
                                              "similarity_fn_name": "cosine"},
        "README.md": export_readme(out.name, meta, args, best, cfg, max_len),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; a model folder is meant to be shared
        for name, content in files.items():
            (tmp / name).parent.mkdir(exist_ok=True)
            text = content if isinstance(content, str) else json.dumps(content, indent=2) + "\n"
            (tmp / name).write_text(text, encoding="utf-8")
        # weights + pooler (model.extra) under HF BertModel names; the metadata keeps it a whole sgbert checkpoint too
        save_checkpoint(tmp / "model.safetensors", model, {**meta, "tokenizer": tok.to_str()})
        old = tmp.with_name(tmp.name + "-old")
        if out.exists():  # --force (or an empty folder): move the old one aside, rename the new in, delete the old
            out.rename(old)
        try:
            tmp.rename(out)
        except OSError:
            if old.exists():
                old.rename(out)  # put the old one back
            raise
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def export_readme(name, meta, args, best, cfg, max_len):
    trained = f"trained with SG-BERT (self-guided contrastive learning, Kim et al., ACL 2021) from " \
        f"`{meta.get('base_model', 'an unknown base model')}`" if args else \
        f"`{meta.get('base_model', 'a BERT model')}` as it is (no SG-BERT training recorded)"
    lines = [f"# {name}", "", f"A BERT sentence encoder exported by sgbert: {trained}.",
             f"{cfg.num_hidden_layers} layers, hidden size {cfg.hidden_size}, max {max_len} tokens. The sentence "
             "vector is the last layer's [CLS] token: no pooler, no normalization; compare vectors with cosine.", ""]
    if args:
        lines += ["## Training", "", f"- loss: `{args.get('loss', '?')}`",
                  "- arguments: " + ", ".join(f"`{k}={v}`" for k, v in args.items())]
        if "dev" in best:
            dev = f"{best['dev']:.2f}" if isinstance(best["dev"], (int, float)) else best["dev"]
            lines += [f"- best STS-B dev Spearman x100: {dev}" + (f" (step {best['step']})" if "step" in best else "")]
        lines += [""]
    lines += ["## Loading", "", "sgbert (`pooling=\"cls\"` matters: other poolings give other vectors):", "```python",
              "from bert import Bert, load_tokenizer, encode", f"model, tok = Bert.from_pretrained(\"{name}\"), "
              f"load_tokenizer(\"{name}\")", "vecs = encode(model, tok, sentences, pooling=\"cls\")  # (n, H) float32",
              "```", "", "transformers (take `last_hidden_state[:, 0]`, not `pooler_output`):", "```python",
              "from transformers import AutoModel, AutoTokenizer",
              f"tok, model = AutoTokenizer.from_pretrained(\"{name}\"), AutoModel.from_pretrained(\"{name}\")",
              "batch = tok(sentences, padding=True, truncation=True, return_tensors=\"pt\")",
              "vecs = model(**batch).last_hidden_state[:, 0]", "```", "",
              "sentence-transformers (CLS pooling is set in 1_Pooling/config.json):", "```python",
              "from sentence_transformers import SentenceTransformer",
              f"vecs = SentenceTransformer(\"{name}\").encode(sentences)", "```", ""]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(prog="bert.py", description="sgbert's BERT encoder: tools for its checkpoints")
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="write a checkpoint as a Hugging Face BertModel + sentence-transformers folder")
    e.add_argument("src", metavar="CHECKPOINT", help="a .safetensors written by train.py, or a model folder or name")
    e.add_argument("out_dir", metavar="OUT_DIR", help="folder to create; must be absent or empty unless --force")
    e.add_argument("--force", action="store_true", help="replace OUT_DIR even if it is not empty")
    a = p.parse_args(argv)
    try:
        out = export(a.src, a.out_dir, force=a.force)
    except (LoadError, OSError) as err:  # user-facing: one line, no traceback
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"exported {a.src} to {out}/ (transformers BertModel + sentence-transformers with CLS pooling)")


if __name__ == "__main__":
    main()
