"""
Export: one folder that is a Hugging Face BertModel checkpoint and a sentence-transformers model at the same time.

    python -m lab.export sg.safetensors OUT_DIR [--force]

Floor 3: every weight, config and tokenizer goes through bert.py, checked on the way in, and every file through
checkpoint.py. The folder is built beside
OUT_DIR under a temporary name, read back, then swapped in, so OUT_DIR is at every instant the old folder or the new
one; one export per OUT_DIR at a time (outputs.output_lock).
"""
import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import cli

if __name__ == "__main__":
    cli.exit_on_ctrl_c("export.py")

import checkpoint  # no torch: --help answers before torch loads
import outputs
from lab import files
from checkpoint import LoadError
from cli import die


def get_args(argv=None):
    p = argparse.ArgumentParser(prog="export.py", description="write an sgbert checkpoint as a Hugging Face BertModel "
                                "+ sentence-transformers folder",
                                epilog="example: python -m lab.export sg.safetensors sg-bert/  (then SentenceTransformer('sg-bert'))")
    p.error = die  # a bad flag is one line
    p.add_argument("src", metavar="CHECKPOINT", help="a .safetensors written by train.py, or a model folder or name")
    p.add_argument("out_dir", metavar="OUT_DIR", help="folder to create; must be absent or empty unless --force")
    p.add_argument("--force", action="store_true", help="replace OUT_DIR even if it is not empty")
    return p.parse_args(argv)


if __name__ == "__main__":
    get_args()  # exits here on --help or a bad flag; main() parses again, after the imports below

import safetensors.torch
import torch

import bert
from bert import Bert


def export(src, out_dir, force=False):
    """Write a checkpoint (or a model folder / name) to out_dir: config.json + model.safetensors + tokenizer files
    for transformers, modules.json + CLS Pooling for sentence-transformers, and a README.md. An existing non-empty
    out_dir is replaced only with force. Holds outputs.output_lock(out_dir) throughout; returns out_dir as a Path."""
    # no '.' or '..' as a folder name (the temp names are built from it); a symlinked OUT_DIR: its target folder is
    # replaced, the link stays a link (a swap of the link itself would leave the old folder behind under a temp name)
    out = Path(os.path.realpath(out_dir))
    source = checkpoint.local_path(src)  # as checkpoint.resolve finds it
    if any(outputs.same_path(out, p) for p in (source, *Path(os.path.realpath(source)).parents)):
        raise LoadError(f"OUT_DIR {out_dir} is {src} or a folder holding it: replacing it would delete what it "
                        "exports (a model folder's pretrain.json, its MLM head); give another OUT_DIR")
    out.parent.mkdir(parents=True, exist_ok=True)
    with outputs.output_lock(out):
        files.clean_leftovers(out)  # what an export killed mid-way left here (and the old folder, if it was set aside)
        if out.exists() and not out.is_dir():
            raise FileExistsError(f"{out} exists and is not a folder; choose another OUT_DIR")
        if out.is_dir() and any(out.iterdir()) and not force:
            raise FileExistsError(f"{out} is not empty; pass --force to replace it")
        ck = checkpoint.load(src)  # the one read of it
        path, ours = ck.path, ck.path == ck.weights  # ours: a .safetensors checkpoint, not a model folder
        base = base_name(ck.meta) if ours else cli.model_name(src)
        meta = {**(ck.meta if ours else {}), **({"base_model": base} if base else {})}
        if ours:  # its pooling, template and transform as evaluate.py checks them
            from lab.evaluate import check_metadata
            check_metadata(ck)
        model, tok = Bert.from_checkpoint(ck), bert.tokenizer_of(ck)
        contents = folder_files(path, out.name, model, tok, meta, ck.tensors)
        del ck  # its tensors: the model holds its own copy
        tmp = outputs.temp_path(out)
        try:
            tmp.mkdir(mode=0o755)
            for name, content in contents.items():
                (tmp / name).parent.mkdir(exist_ok=True)
                if isinstance(content, bytes):  # a module's weights
                    (tmp / name).write_bytes(content)
                    continue
                text = content if isinstance(content, str) else json.dumps(content, indent=2) + "\n"
                (tmp / name).write_text(text, encoding="utf-8")
            # weights + pooler (model.extra) under HF BertModel names; the metadata keeps it a whole sgbert checkpoint
            meta = {k: v for k, v in meta.items() if k in checkpoint.META and k != "transform"}  # (in 2_Dense)
            checkpoint.save_checkpoint(tmp / "model.safetensors", model.tensors(),
                                       {**meta, "config": model.config.to_dict(), "tokenizer": tok.to_str()})
            back = checkpoint.load(tmp)  # it reads back, before it replaces anything
            Bert.from_checkpoint(back), bert.tokenizer_of(back)
            replace_dir(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def folder_files(path, name, model, tok, meta, tensors):
    """The files of the export folder but model.safetensors: {relative path: text or JSON value}, all checked.
    tensors: the checkpoint's, where a fitted transform's are."""
    cfg, args, best = model.config, meta.get("args") or {}, meta.get("best") or {}
    bad = [k for k, t in {**model.state_dict(), **model.extra}.items() if not torch.isfinite(t).all()]
    if bad:
        raise LoadError(f"{path}: non-finite weights (NaN or inf) in {', '.join(bad[:3])}"
                        + (f" and {len(bad) - 3} more" if len(bad) > 3 else "") + "; refusing to export them")
    # the length transformers and sentence-transformers truncate to: every evaluation's (evaluate.EVAL_MAX_LEN), never
    # training's --max-len (SimCSE's 32 would cut what evaluate.py --ckpt reads), never past the positions
    from evaluate import EVAL_MAX_LEN  # here: export of a plain folder needs none of evaluate's imports otherwise
    max_len = min(EVAL_MAX_LEN, cfg.max_position_embeddings)
    tok.no_truncation()  # transformers and sentence-transformers truncate per call (model_max_length, max_seq_length)
    tj = json.loads(tok.to_str())
    if tj["model"]["type"] != "WordPiece":
        raise LoadError(f"{path}: the tokenizer is {tj['model']['type']}, not WordPiece; only BERT tokenizers export")
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])  # with the added [CLS] ... tokens, ordered by id
    if [i for _, i in vocab] != list(range(len(vocab))):
        raise LoadError(f"{path}: the tokenizer's ids are not 0..{len(vocab) - 1}, so no vocab.txt can hold them")
    norm = tj.get("normalizer") or {}  # BertNormalizer: lowercase, strip_accents, handle_chinese_chars
    pooling = meta.get("pooling") or "cls"  # the method's evaluation pooling, recorded by train.py
    if pooling == "prompt" or meta.get("template"):
        raise LoadError(f"{path}: its sentence vector is PromptBERT's [MASK] vector of the sentence inside the template "
                        f"{meta.get('template')!r}: sentence-transformers cannot express it (its prompts only go "
                        "before the sentence, and no pooling picks the [MASK] token); evaluate it with `python "
                        "evaluate.py --ckpt`")
    st_pooling = ST_POOLING.get(pooling, "mean")  # sentence-transformers has no layer-averaging pooling (!!)
    if st_pooling != pooling:
        print(f"warning: {path} is evaluated with {pooling} pooling, which sentence-transformers cannot express; its "
              f"1_Pooling is the last layer's mean instead (a different vector; the README says so)", file=sys.stderr)
    dense, dense_files = whitening_dense(path, meta, tensors, pooling, st_pooling)
    special = {f"{n}_token": t for n, t in [("unk", "[UNK]"), ("sep", "[SEP]"), ("pad", "[PAD]"), ("cls", "[CLS]"),
                                            ("mask", "[MASK]")] if tok.token_to_id(t) is not None}
    return {
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
                         {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                         *dense],
        "1_Pooling/config.json": {"word_embedding_dimension": cfg.hidden_size,
                                  **{f"pooling_mode_{m}_tokens" if m != "cls" else "pooling_mode_cls_token": m == st_pooling
                                     for m in ("cls", "mean", "max")}, "pooling_mode_mean_sqrt_len_tokens": False},
        "sentence_bert_config.json": {"max_seq_length": max_len, "do_lower_case": False},  # the tokenizer lowercases
        "config_sentence_transformers.json": {"prompts": {}, "default_prompt_name": None,
                                              "similarity_fn_name": "cosine"},
        "README.md": export_readme(name, meta, args, best, cfg, max_len, pooling, st_pooling),
        **dense_files,
    }


def whitening_dense(path, meta, tensors, pooling, st_pooling):
    """A whitening checkpoint's y = (x - mu) W as sentence-transformers' Dense module after the pooling: weight W^T,
    bias -mu W, identity activation -> (its modules.json entry, its files); ([], {}) without a transform. A flow
    cannot be expressed: refused."""
    kind = (meta.get("transform") or {}).get("kind")
    if kind is None:
        return [], {}
    if kind != "whitening":
        raise LoadError(f"{path}: a {kind} checkpoint cannot be exported: sentence-transformers has no module for it "
                        "(evaluate it with `python -m lab.evaluate --ckpt`)")
    if st_pooling != pooling:
        raise LoadError(f"{path}: its whitening was fitted on {pooling} vectors, which sentence-transformers cannot "
                        "pool; for an exportable whitening fit one on --pooling mean (or cls)")
    p = checkpoint.TRANSFORM_PREFIX
    mu, W = tensors[p + "mu"].double(), tensors[p + "W"].double()
    if not (torch.isfinite(mu).all() and torch.isfinite(W).all()):
        raise LoadError(f"{path}: its whitening (transform.mu / transform.W) holds NaN or inf; refusing to export it "
                        "as a Dense layer (fit it again: python -m lab.train --loss whitening)")
    H, K = W.shape
    weights = {"linear.weight": W.T.float().contiguous(), "linear.bias": (-mu @ W).float()}
    return [{"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}], {
        "2_Dense/config.json": {"in_features": H, "out_features": K, "bias": True,
                                "activation_function": "torch.nn.modules.linear.Identity"},
        "2_Dense/model.safetensors": safetensors.torch.save(weights)}


def replace_dir(new, out):
    """Move the folder new to out, replacing out if it exists. Where the system can, the two are swapped in one
    atomic step, so out is at every instant the old folder or the new one; elsewhere out is set aside as .OUT.PID.old
    for the instant between two renames, and an error or Ctrl-C there puts it back (a kill -9 there: the next export
    puts it back, files.clean_leftovers). The old folder is deleted once the new one is in place."""
    if not os.path.lexists(out):
        os.rename(new, out)
    elif exchange(new, out):
        shutil.rmtree(new, ignore_errors=True)  # new now holds the old folder
    else:
        old = outputs.temp_path(out, "old")
        try:
            os.rename(out, old)
            os.rename(new, out)
        except BaseException:
            if os.path.lexists(old) and not os.path.lexists(out):
                try:
                    os.rename(old, out)
                except OSError:
                    raise LoadError(f"replacing {out} failed, and so did putting the previous folder back: it is "
                                    f"at {old}; rename it to {out.name}") from None
            raise
        shutil.rmtree(old, ignore_errors=True)


def exchange(a, b):
    """Swap two paths in one atomic step (Linux renameat2 with RENAME_EXCHANGE); False where the system cannot."""
    import ctypes
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # not Linux, or a C library older than glibc 2.28
        return False
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    return renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0


PATHS = ("model", "data", "data_dir", "out", "json")  # arguments that may hold a path: named by their own name
ST_POOLING = {"cls": "cls", "mean": "mean", "max": "max"}  # sgbert pooling -> sentence-transformers' own


POOLING_WORDS = {"cls": "the last layer's [CLS] token", "mean": "the mean of the last layer over the tokens",
                 "max": "the max of the last layer over the tokens",
                 "last2": "the mean over the tokens of the last two layers, averaged",
                 "first-last": "the mean over the tokens of layer 1 and of the last layer, averaged"}


def base_name(meta):
    """The base model of a checkpoint by its real name: the one its metadata records ('base_model'), unless that is
    a package's data folder ('model': train.py records a folder by its own name), then cli.model_name of the path it
    was trained from (args 'model': the packaged MiniLM's `.../model` is all-MiniLM-L6-v2); None when neither says."""
    base, given = meta.get("base_model"), (meta.get("args") or {}).get("model")
    if given and (not base or base.lower() in cli.GENERIC_FOLDERS):
        return cli.model_name(given)
    return base


def export_readme(name, meta, args, best, cfg, max_len, pooling="cls", st_pooling="cls"):
    trained = f"trained with SG-BERT (self-guided contrastive learning, Kim et al., ACL 2021) from " \
        f"`{meta.get('base_model', 'an unknown base model')}`" if args else \
        f"`{meta.get('base_model', 'a BERT model')}` as it is (no SG-BERT training recorded)"
    lines = [f"# {name}", "", f"A BERT sentence encoder exported by sgbert: {trained}.",
             f"{cfg.num_hidden_layers} layers, hidden size {cfg.hidden_size}, max {max_len} tokens. The sentence "
             f"vector is `{pooling}` pooling ({POOLING_WORDS.get(pooling, pooling)}): no pooler, no normalization; "
             "compare vectors with cosine.", ""]
    if st_pooling != pooling:
        lines += [f"(!!) sentence-transformers has no `{pooling}` pooling: this folder's 1_Pooling takes the mean of the "
                  "last layer instead, which is a different vector from the one this model was selected and evaluated "
                  "with. Use sgbert's `encode` (below) for the evaluated vector.", ""]
    if args:
        base = meta.get("base_model")  # its real name (base_name), not the last folder of the path (.../model)
        shown = {k: base if k == "model" and base else checkpoint.display_name(v) if k in PATHS and v else v
                 for k, v in args.items()}
        lines += ["## Training", "", f"- loss: `{args.get('loss', '?')}`",
                  "- arguments: " + ", ".join(f"`{k}={v}`" for k, v in shown.items())]
        if "dev" in best:
            dev = f"{best['dev']:.2f}" if isinstance(best["dev"], (int, float)) else best["dev"]
            lines += [f"- best STS-B dev Spearman x100: {dev}" + (f" (step {best['step']})" if "step" in best else "")]
        lines += [""]
    lines += ["## Loading", "", f"sgbert (`pooling=\"{pooling}\"` matters: other poolings give other vectors):", "```python",
              "from bert import Bert, load_tokenizer, encode", f"model, tok = Bert.from_pretrained(\"{name}\"), "
              f"load_tokenizer(\"{name}\")", f"vecs = encode(model, tok, sentences, pooling=\"{pooling}\")  # (n, H) float32",
              "```", "", "transformers (" + ("take `last_hidden_state[:, 0]`" if pooling == "cls" else
              f"pool `hidden_states` as `{pooling}` above, with output_hidden_states=True") + ", not `pooler_output`):",
              "```python",
              "from transformers import AutoModel, AutoTokenizer",
              f"tok, model = AutoTokenizer.from_pretrained(\"{name}\"), AutoModel.from_pretrained(\"{name}\")",
              "batch = tok(sentences, padding=True, truncation=True, return_tensors=\"pt\")",
              "vecs = model(**batch).last_hidden_state[:, 0]" if pooling == "cls" else
              "hidden_states = model(**batch, output_hidden_states=True).hidden_states", "```", "",
              f"sentence-transformers ({st_pooling} pooling is set in 1_Pooling/config.json):", "```python",
              "from sentence_transformers import SentenceTransformer",
              f"vecs = SentenceTransformer(\"{name}\").encode(sentences)", "```", ""]
    return "\n".join(lines)


def main(argv=None):
    a = get_args(argv)
    try:
        out = export(a.src, a.out_dir, force=a.force)
    except (LoadError, outputs.OutputError, OSError) as err:  # user-facing: one line, no traceback
        die(err)
    print(f"exported {a.src} to {out}/ (transformers BertModel + sentence-transformers; see its README for the pooling)")


if __name__ == "__main__":  # Ctrl-C: the temp folder is gone; OUT_DIR is the old folder (or, past the swap, the new one)
    cli.run(main, "export.py")
