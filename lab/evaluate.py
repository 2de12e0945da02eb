"""
The lab's evaluations, beyond the core's STS table (evaluate.py): python -m lab.evaluate takes
evaluate.py's flags and these.

    --pooling wk        WK pooling (wk.py) over the hidden states --wk-layer-start..L
    --pooling prompt    PromptBERT's sentence vector: the [MASK] token's hidden state with the
                        sentence inside --template (prompt.py); a PromptBERT checkpoint has its own
    --ckpt C            C with a fitted map of its pooled vectors (posthoc.py: whitening, flow)
    --tasks transfer    SentEval's seven transfer tasks (the paper's Table 4: MR, CR, SUBJ, MPQA,
                        SST2, TREC, MRPC) by SentEval's own protocol and seeds (transfer.py)
    --layerwise         the paper's Figure 1: STS-B test Spearman of every layer 0..L under cls /
                        mean / max pooling (--plot draws it)
    --pairs FILE        your own STS data, scored like a task (--pairs-out: each pair's cosine)
    --cosines-out NPZ   every STS test pair's cosine and gold score (report.py's paired bootstrap)
    --pairs-plot PNG    the paper's Figure 5: STS-B dev pairs in 2-D, a --ckpt beside its base model

--json has evaluate.py's shape, with the lab's keys filled when asked: "transfer": {task: {"acc",
"devacc"[, "f1"]}, "avg"}, "layerwise": {pooling: [layer 0 .. L]}, "pairs": [{"file", "sentence1",
"sentence2", "gold", "cosine"}, ...]. A --pairs file is a task of the "sts" block (with "pearson"
and "n" beside); --pooling wk adds "wk": {"layer_start", "window"}, prompt adds "template".

    python -m lab.evaluate --ckpt sg.safetensors --tasks transfer --transfer-config simcse
    python -m lab.evaluate --model bert-base-uncased --pooling prompt
"""
import math
import time
from functools import partial
from pathlib import Path

import numpy as np

import bert
import checkpoint
import cli
import evaluate
import outputs
from cli import die
from data import TASKS, TRANSFER, DataError, load_stsb, load_task, resolve_data_dir
from lab import cpu, posthoc, prompt, transfer, wk
from lab.eval_data import load_pairs_file

PROG = "python -m lab.evaluate"
LAB_POOLINGS = (*bert.POOLINGS, "wk", "prompt")  # --pooling: bert.py's and the lab's
LAYERWISE_POOLINGS = ("cls", "mean", "max")
EVAL_POOLINGS = (*bert.POOLINGS, "prompt")  # what a checkpoint's metadata 'pooling' may say
PAIR_COLUMNS = ("file", "sentence1", "sentence2", "gold", "cosine")  # --pairs-out, JSON "pairs"

# -----------------------------------------------------------------------------
# sentence vectors and scores


def sentence_vectors(model, tokenizer, pooling="cls", layer=-1, batch_size=64, wk_args=None,
                     transform=None, log=None, template=None, precision="fp32"):
    """evaluate.sentence_vectors with the lab's poolings and maps. pooling: a name of bert.POOLINGS,
    "wk" (wk.py; wk_args = (layer_start, window)) or "prompt" (prompt.py: the [MASK] vector of
    layer `layer` with each sentence inside `template`, default prompt.UNTRAINED_TEMPLATE, as
    PromptBERT evaluates: no denoising); transform: a fitted map of the pooled vectors (posthoc.py:
    whitening, a flow)."""
    if pooling == "wk":
        start, window = wk_args or (wk.default_layer_start(model.config.num_hidden_layers), 2)
        pooling = partial(wk.wk_pool, layer_start=start, window=window)
    if pooling == "prompt":  # the template makes the input, its [MASK] is the pooling
        t = prompt.Template(template or prompt.UNTRAINED_TEMPLATE, tokenizer,
                            model.config.max_position_embeddings, end_period=True)
        tokenizer, pooling = t, partial(t.vector, layer=layer)
    vectors = evaluate.sentence_vectors(model, tokenizer, pooling, layer, batch_size, log,
                                        precision)
    return vectors if transform is None else lambda sentences: transform(vectors(sentences))


def pearson(x, y):
    """Pearson correlation x100; NaN when either side is constant."""
    if evaluate.constant(x) or evaluate.constant(y):
        return float("nan")
    return float(100 * np.corrcoef(np.asarray(x, np.float64), np.asarray(y, np.float64))[0, 1])


def pairs_names(paths):
    """{path: its name in the tables and the JSON}: the file's name, or as many of its trailing
    folders as make it unique (a/test.tsv and b/test.tsv stay two rows)."""
    parts = {p: Path(p).resolve().parts for p in paths}
    names = {}
    for p in paths:
        for k in range(1, len(parts[p]) + 1):
            name = "/".join(parts[p][-k:])
            if all(q == p or "/".join(parts[q][-k:]) != name for q in paths):
                break
        names[p] = name
    return names


def evaluate_sts(vectors, tasks, data_dir, log=evaluate.progress, pair_rows=None, cosines=None):
    """evaluate.evaluate_sts over tasks of data.TASKS and your own pairs files (--pairs). A file is
    a task named by its shortest unique trailing path (pairs_names), with "pearson" (x100) and "n"
    (its pairs) beside; "avg" is over the pairs files when there are no STS tasks. pair_rows: a list
    that receives (name, sentence1, sentence2, gold, cosine) of every pair of the files; cosines: a
    dict that receives {task: (cosines, gold)} of every STS task (--cosines-out)."""
    names = pairs_names([t for t in tasks if t not in TASKS])
    paths, files, got = {v: k for k, v in names.items()}, {}, {}

    def load(task, data_dir):
        if task in TASKS:
            return load_task(task, data_dir)
        files[task] = load_pairs_file(paths[task])
        return {"pairs": files[task]}
    results = evaluate.evaluate_sts(vectors, [names.get(t, t) for t in tasks], data_dir, log, got,
                                    load)
    for name, (s1, s2, gold) in files.items():  # one subset: the three protocols agree
        cos = got[name][0]
        results[name].update(pearson=pearson(cos, gold), n=len(gold))
        if pair_rows is not None:
            pair_rows.extend(zip([name] * len(gold), s1, s2, gold.tolist(), cos.tolist()))
    if cosines is not None:
        cosines.update((t, c) for t, c in got.items() if t in TASKS)
    return results


def layerwise(model, tokenizer, data_dir, batch_size=64, precision="fp32"):
    """The paper's Figure 1: STS-B test Spearman x100 -> {pooling: [layer 0, 1, ..., L]}."""
    s1, s2, gold = load_stsb("test", data_dir)
    uniq, index = evaluate.unique_sentences([(s1, s2, gold)])
    L = model.config.num_hidden_layers
    specs = [(p, k) for p in LAYERWISE_POOLINGS for k in range(L + 1)]
    embs = bert.encode_many(model, tokenizer, uniq, specs, batch_size=batch_size,
                            precision=precision)  # one pass a batch: all layers and poolings
    return {p: [evaluate.spearman(evaluate.similarities(embs[p, k], index, s1, s2), gold)
                for k in range(L + 1)] for p in LAYERWISE_POOLINGS}

# -----------------------------------------------------------------------------
# the paper's Figure 5


def pca_2d(x):
    """The first two principal components of the rows of x (n, H) -> (n, 2), signs fixed (the
    largest |loading| > 0)."""
    x = x.astype(np.float64) - x.mean(0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    vt = vt[:2] * np.sign(vt[:2][np.arange(2), np.abs(vt[:2]).argmax(1)])[:, None]
    return x @ vt.T


def sts_pairs_2d(vectors, data_dir, n=20):
    """The paper's Figure 5: n positive (gold 5) and n negative (gold 0) STS-B dev pairs, the first
    in file order, projected to 2-D by PCA over their 4n unit-normalised vectors -> (positive
    (n, 2, 2), negative (n, 2, 2))."""
    s1, s2, gold = load_stsb("dev", data_dir)
    pos, neg = [np.flatnonzero(gold == g)[:n] for g in (5.0, 0.0)]
    if len(pos) < n or len(neg) < n:
        raise DataError(f"STS-B dev has {len(pos)} pairs of gold 5 and {len(neg)} of gold 0; the "
                        f"plot needs {n} each")
    idx = np.concatenate([pos, neg])
    v = vectors([s1[i] for i in idx] + [s2[i] for i in idx])
    xy = pca_2d(v / np.linalg.norm(v, axis=1, keepdims=True))
    xy = xy.reshape(2, 2 * n, 2).transpose(1, 0, 2)  # (2n pairs, 2 sentences, 2)
    return xy[:n], xy[n:]


def plot_pairs(panels, path):
    """panels: {title: (positive, negative)} from sts_pairs_2d, side by side; a line joins the two
    sentences of a pair."""
    import matplotlib  # only here and in plot_layerwise
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5), squeeze=False)
    for ax, (title, (pos, neg)) in zip(axes[0], panels.items()):
        for pairs, color, label in ((pos, "tab:blue", "gold 5"), (neg, "tab:red", "gold 0")):
            for k, (a, b) in enumerate(pairs):
                ax.plot([a[0], b[0]], [a[1], b[1]], "-o", color=color, ms=3, lw=0.8,
                        label=label if k == 0 else None)
        ax.set(title=title, xticks=[], yticks=[])
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    outputs.atomic_write(path, lambda f: fig.savefig(f, format="png"))


def pairs_plot(args, model, tokenizer, meta, data_dir):
    """The paper's Figure 5: the checkpoint beside the base model it records, which must be the
    very weights it was trained from (metadata 'base_sha256'; an older checkpoint without it: a
    warning)."""
    base = (meta.get("args") or {}).get("model") or meta.get("base_model")
    name = args.ckpt  # the path as given
    try:
        ck = checkpoint.load(base)
    except checkpoint.LoadError as e:
        die(f"--pairs-plot: the base model {base!r} recorded in {name} cannot be loaded: {e}")
    if "base_sha256" not in meta:
        evaluate.progress(f"warning: {name} records no sha256 of its base model (an older "
                          f"checkpoint): 'before' is {base} as it is on disk now, unchecked")
    elif ck.sha256 != meta["base_sha256"]:
        die(f"--pairs-plot: the base model {base} is not the one {name} was trained from (sha256 "
            f"of its weights {ck.sha256[:12]}..., recorded {meta['base_sha256'][:12]}...); put the "
            "original weights back there")
    before = bert.Bert.from_checkpoint(ck).to(model.embeddings.word_embeddings.weight.device)
    before_tok = evaluate.eval_tokenizer(bert.tokenizer_of(ck), before.config)

    def panel(m, tok):
        return sts_pairs_2d(sentence_vectors(m, tok, args.pooling, template=args.template,
                                             precision=args.precision), data_dir)
    title = meta.get("base_model") or checkpoint.display_name(base)
    panels = {f"before: {title}": panel(before, before_tok),
              f"after: {Path(name).name}": panel(model, tokenizer)}
    evaluate.save(args.pairs_plot, lambda path: plot_pairs(panels, path),
                  "pairs plot (paper Fig. 5)")

# -----------------------------------------------------------------------------
# checkpoints: the metadata the lab reads


def check_metadata(ck):
    """The evaluation keys of a checkpoint's metadata (checkpoint.load's) against the schema
    (checkpoint.META): 'pooling' one that evaluate.py makes, 'template' a valid template,
    'transform' present exactly when transform.* tensors are, with the pooling it was fitted on.
    A LoadError that names the file and the key: never a checkpoint silently scored another way."""
    path, meta = ck.path, ck.meta
    pooling, info = meta.get("pooling"), meta.get("transform")
    if pooling is not None and pooling not in EVAL_POOLINGS:
        raise checkpoint.LoadError(f"{path}: metadata 'pooling' is {pooling!r}, not one of "
                                   f"{', '.join(EVAL_POOLINGS)}; re-create the checkpoint with "
                                   "this sgbert's python -m lab.train")
    if "template" in meta:
        try:
            prompt.split(meta["template"])
        except ValueError as e:
            raise checkpoint.LoadError(f"{path}: metadata 'template' {e}; re-create the "
                                       "checkpoint") from None
    fitted = [k for k in ck.tensors if k.startswith(checkpoint.TRANSFORM_PREFIX)]
    if fitted and not info:
        raise checkpoint.LoadError(f"{path}: it holds the tensors {', '.join(sorted(fitted))} of a "
                                   "fitted transform but no metadata 'transform' saying what they "
                                   "are; re-create it with python -m lab.train")
    posthoc.check_transform(ck)  # its tensors against the model's width
    if info:
        args_pooling = (meta.get("args") or {}).get("pooling")
        if pooling is None or (meta.get("method") in ("whitening", "flow")
                               and args_pooling not in (None, pooling)):
            raise checkpoint.LoadError(
                f"{path}: metadata 'pooling' is {pooling!r} but its {info.get('kind')} was fitted "
                f"on {args_pooling or 'unrecorded'} vectors (metadata 'args'); fit it again with "
                "this sgbert's python -m lab.train")


def load_with_transform(path, device="cpu"):
    """A checkpoint's model on `device` and its fitted transform (None when it has none), from one
    read of the file, its metadata checked (check_metadata) as evaluate.py --ckpt checks it."""
    ck = checkpoint.load(path)
    model = bert.Bert.from_checkpoint(ck).to(device)
    check_metadata(ck)
    return model, posthoc.transform_of(ck, model.config.hidden_size)


def load(args):
    """The model, its tokenizer, its fitted transform (None without one), its checkpoint metadata
    ({} for a model folder) and the sha256 of its weights, from one read of the file, checked."""
    ck = evaluate.read(args)
    model, tokenizer = evaluate.build(args, ck)
    with evaluate.loading(args):
        args.ckpt and check_metadata(ck)
        transform = posthoc.transform_of(ck, model.config.hidden_size) if args.ckpt else None
    meta, sha, name = (ck.meta if args.ckpt else {}), ck.sha256, args.ckpt or args.model
    ck.tensors.clear()  # the model and the transform hold their own
    L = model.config.num_hidden_layers
    if args.pooling == "wk" and L < 2:
        die(f"--pooling wk: {name} has {L} layer (hidden states 0..{L}); WK needs at least three "
            "hidden states, so a model of 2 layers or more")
    if args.wk_layer_start is not None and not 0 <= args.wk_layer_start <= L - 2:
        die(f"--wk-layer-start {args.wk_layer_start}: {name} has hidden states 0..{L}; WK needs at "
            f"least three of them, so give 0..{L - 2}")
    start = wk.default_layer_start(L) if args.wk_layer_start is None else args.wk_layer_start
    if args.wk_window is not None and args.wk_window > L - start:
        die(f"--wk-window {args.wk_window}: the {L + 1 - start} hidden states {start}..{L} allow a "
            f"window of 1..{L - start}")
    if transform and args.pooling not in (None, meta.get("pooling")):
        die(f"--pooling {args.pooling}: {name} holds a {meta['transform'].get('kind')} fitted on "
            f"{meta.get('pooling')} vectors; drop --pooling")
    return model, tokenizer, transform, meta, sha


def prompt_template(args, meta, model, tokenizer):
    """--pooling prompt: its template (--template, else the one a --ckpt records, else the paper's
    best manual one), checked against the tokenizer and the model's positions; else None."""
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

# -----------------------------------------------------------------------------
# the command line


def get_args(argv=None):
    """evaluate.py's parser with the lab's flags and poolings, parsed once."""
    p = evaluate.parser()
    p.prog, p.epilog = PROG, "example: python -m lab.evaluate --ckpt sg.safetensors --tasks transfer"
    p.description = ("STS evaluation (Spearman x100) in the all / wmean / mean protocols, and "
                     "SentEval's transfer tasks (accuracy)")
    a = p.add_argument
    a("--wk-layer-start", type=int, help="wk: the first hidden state used (default: l // 3, e.g. 4 "
      "for a 12-layer BERT, 2 for all-MiniLM-L6-v2; the SBERT-WK code's 4 for BERT-base)")
    a("--wk-window", type=int, help="wk: context window, layers on each side (default: 2, the "
      "SBERT-WK code's)")
    a("--template", help="prompt: the template, one [X] (the sentence) and one [MASK] (whose "
      "vector is the sentence's) (default: the one a --ckpt records, else PromptBERT's best "
      "manual template, prompt.UNTRAINED_TEMPLATE)")
    a("--pairs", nargs="+", metavar="FILE", help="your own STS data: files of 'sentence1<TAB>"
      "sentence2<TAB>score' rows (or a .csv of the same three columns; header optional), scored "
      "like the STS tasks (default tasks: none then): Spearman and Pearson x100 of the cosines "
      "against the scores, and the number of pairs")
    a("--pairs-out", metavar="OUT.tsv", help="with --pairs: write every pair's cosine beside its "
      "score to this .tsv (columns file, sentence1, sentence2, gold, cosine); --json holds them "
      "too")
    a("--cosines-out", metavar="OUT.npz", help="also write every STS test pair's cosine and gold "
      "score to this compressed .npz (per task, its subsets in the 'all' protocol's order: arrays "
      "<task>.cosine and <task>.gold, float32, ~90 KB), the 7 STS tasks scored even when --tasks "
      "leaves them out: what report.py's paired bootstrap over the test pairs reads")
    a("--transfer-config", default="paper", choices=list(transfer.TRANSFER_CONFIGS),
      help="transfer classifier: paper (default) = SG-BERT's Table 9 (MLP, 50 sigmoid units), "
      "simcse = SimCSE's test mode (logistic regression); both Adam, batch 64, tenacity 5, epoch "
      "4, 10 folds")
    a("--layerwise", action="store_true", help="STS-B test Spearman per layer x cls/mean/max")
    a("--plot", help="with --layerwise: draw it to this .png (needs matplotlib)")
    a("--pairs-plot", help="the paper's Figure 5: 20 gold-5 and 20 gold-0 STS-B dev pairs in 2-D "
      "(PCA), a --ckpt beside its base model, to this .png (needs matplotlib)")
    args = cli.parse(p, argv)
    if args.pooling is not None and args.pooling not in LAB_POOLINGS:
        die(f"argument --pooling: invalid choice: {args.pooling!r} (choose from "
            f"{', '.join(LAB_POOLINGS)})")
    return args


def check_args(args):
    """Refuse bad input before any work starts, with one line each."""
    if args.plot and not args.layerwise:
        die("--plot draws the --layerwise table: add --layerwise")
    if args.pairs_out and not args.pairs:
        die("--pairs-out writes the cosines of --pairs files: add --pairs FILE")
    if args.pairs and args.layerwise:
        die("--layerwise scores STS-B test layer by layer, not --pairs files: run them as two "
            "commands")
    if args.cosines_out and (args.layerwise or args.pairs_plot):
        which = "--layerwise" if args.layerwise else "--pairs-plot"
        die(f"--cosines-out writes the STS tasks' cosines, which {which} does not score: run "
            "them as two commands")
    writes = [("--plot", args.plot, ".png"), ("--pairs-plot", args.pairs_plot, ".png"),
              ("--json", args.json, ".json"), ("--pairs-out", args.pairs_out, ".tsv"),
              ("--cosines-out", args.cosines_out, ".npz")]
    reads = [("--pairs file", p) for p in args.pairs or []]  # and the model's files
    evaluate.check_args(args, writes, reads)  # and --batch-size
    if args.pairs_plot and not args.ckpt:
        die("--pairs-plot compares a trained --ckpt with its base model: give --ckpt")
    if args.plot or args.pairs_plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            die("--plot needs matplotlib: pip install matplotlib (or drop --plot; the table has "
                "the same numbers)")
    wk_flags = [f for f, v in (("--wk-layer-start", args.wk_layer_start),
                               ("--wk-window", args.wk_window)) if v is not None]
    if wk_flags and args.pooling != "wk":
        die(f"{wk_flags[0]} is a setting of WK pooling: add --pooling wk, or drop it")
    if args.wk_window is not None and args.wk_window < 1:
        die(f"--wk-window {args.wk_window}: must be at least 1 (layers on each side of the centre "
            "layer)")
    if args.pooling == "wk" and args.layer is not None:
        die("--layer means nothing with --pooling wk (it pools layers --wk-layer-start..l): "
            "drop it")
    try:
        args.template is None or prompt.split(args.template)
    except ValueError as e:
        die(f"--template {e}")
    args.layer = -1 if args.layer is None else args.layer
    args.tasks = args.tasks or ([] if args.pairs else ["sts"])


def run_tasks(args, model, tokenizer, data_dir, transform=None, cosines=None):
    """The results of the asked tasks, in the --json shape (less model and device); cosines:
    evaluate_sts's (with --cosines-out, the 7 STS tasks are scored whatever --tasks)."""
    tasks = evaluate.expand(args.tasks)
    sts, trans = [t for t in tasks if t in TASKS], [t for t in tasks if t in TRANSFER]
    sts += [t for t in TASKS if args.cosines_out and t not in sts]
    pairs = list({Path(p).resolve(): p for p in args.pairs or []}.values())  # a file twice: once
    sts += pairs
    L = model.config.num_hidden_layers
    wk_args = (wk.default_layer_start(L) if args.wk_layer_start is None else args.wk_layer_start,
               args.wk_window or 2)
    vectors = sentence_vectors(model, tokenizer, args.pooling, args.layer, args.batch_size, wk_args,
                               transform, log=evaluate.progress, template=args.template,
                               precision=args.precision)
    results = {"pooling": args.pooling, "layer": args.layer, "sts": None, "transfer": None,
               "layerwise": None, "pairs": None}
    if args.pooling == "wk":
        results["wk"] = {"layer_start": wk_args[0], "window": wk_args[1]}
    if args.pooling == "prompt":
        results["template"] = args.template
    if args.layerwise:
        t0 = time.perf_counter()
        results["layerwise"] = layerwise(model, tokenizer, data_dir, args.batch_size,
                                         args.precision)
        results["seconds"] = time.perf_counter() - t0
        return results
    if sts:
        rows = []
        results["sts"] = evaluate_sts(vectors, sts, data_dir, pair_rows=rows, cosines=cosines)
        if pairs:  # every pair of the --pairs files: its cosine beside its score
            results["pairs"] = [dict(zip(PAIR_COLUMNS, r)) for r in rows]
    if trans:
        results["transfer"] = transfer.evaluate_transfer(
            vectors, trans, data_dir, args.transfer_config, log=evaluate.progress)
    return results

# -----------------------------------------------------------------------------
# printing, plotting, writing


def print_pairs(results, names, title):
    """One line per pairs file: Spearman, Pearson (x100; 'undefined' when every cosine is the same)
    and the number of pairs. (Constant gold scores never get here: load_pairs_file refuses them.)"""
    print(title)
    for name in names:
        r = results[name]
        num = lambda x: "undefined" if math.isnan(x) else f"{x:.2f}"
        print(f"{name}: Spearman {num(r['all'])} | Pearson {num(r['pearson'])} | n {r['n']}")


def print_layerwise(table, title):
    print(title)
    print(f"{'layer':<6}" + "".join(f"{p:>8}" for p in table))
    for k in range(len(next(iter(table.values())))):
        print(f"{k:<6}" + "".join(f" {table[p][k]:7.2f}" for p in table))  # NaN: '    nan'


def plot_layerwise(table, path, title):
    import matplotlib  # only here and in plot_pairs
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for p, rhos in table.items():
        ax.plot(range(len(rhos)), rhos, marker="o", label=p)
    ax.set(xlabel="layer (0 = embeddings)", ylabel="STS-B test Spearman x100", title=title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    outputs.atomic_write(path, lambda f: fig.savefig(f, format="png"))


def write_pairs(path, rows):
    """--pairs-out: a header row, then one row per pair, tab-separated (csv's quoting for a TAB or
    newline inside a sentence of a .csv), written atomically."""
    import csv
    import io
    buf = io.StringIO()
    w = csv.writer(buf, delimiter="\t", lineterminator="\n")
    w.writerow(PAIR_COLUMNS)
    w.writerows([r[c] for c in PAIR_COLUMNS] for r in rows)
    outputs.write_text(path, buf.getvalue())


def write_cosines(path, cosines):
    """--cosines-out: {task: (cosines, gold)} as a compressed .npz, written atomically. float32:
    float16 would tie the close cosines of an anisotropic model (a raw BERT's [CLS] spans a few
    hundredths) and move its Spearman."""
    arrays = {f"{t}.{k}": np.asarray(x, np.float32) for t, pair in cosines.items()
              for k, x in zip(("cosine", "gold"), pair)}
    outputs.atomic_write(path, lambda f: np.savez_compressed(f, **arrays))


def report(args, results, device):
    """Print the tables (and the plot) of the results."""
    if results["layerwise"]:
        name = cli.model_name(args.ckpt or args.model)
        bf16 = " bf16" if args.precision == "bf16" else ""  # fp32 goes without saying
        print_layerwise(results["layerwise"], "STS-B test Spearman x100 by layer (paper Fig. 1) | "
                        f"{name} | device {device}{bf16}")
        print(f"layer-wise evaluation took {results['seconds']:.1f} s")
        if args.plot:
            title = f"STS-B test, {'/'.join(Path(name).parts[-2:])}"
            evaluate.save(args.plot, lambda path: plot_layerwise(results["layerwise"], path, title),
                          "plot")
        return
    pooling = args.pooling + (f" {args.template!r}" if args.template else "")
    where = evaluate.where(args, device, pooling)
    if results["sts"]:
        sts = results["sts"]
        tasks = [t for t in sts if t in TASKS]
        files = [t for t in sts if t not in TASKS and t not in evaluate.SUMMARY]
        if tasks:
            evaluate.print_table(sts, tasks, f"STS Spearman x100 | {where}")
        if files:
            print_pairs(sts, files, f"your pairs, x100 | {where}")
        if not tasks:
            print(f"{sts['sentences']} distinct sentences encoded; evaluation took "
                  f"{sts['seconds']:.1f} s")
    if results["transfer"]:
        tasks = [t for t in results["transfer"] if t in TRANSFER]
        transfer.print_transfer(results["transfer"], tasks, f"SentEval transfer accuracy x100 | "
                                f"{where} | classifier {args.transfer_config}")


def main(argv=None):
    """evaluate.py's command line, the lab's flags included."""
    args = get_args(argv)
    check_args(args)
    device = cli.device(args.device)
    model, tokenizer, transform, meta, sha = load(args)
    args.pooling = args.pooling or meta.get("pooling") or "cls"  # the method's evaluation pooling
    args.template = prompt_template(args, meta, model, tokenizer)
    model.to(device)
    cpu.warn_slow_bf16(args.precision, device)
    name = checkpoint.display_name(args.ckpt or args.model)  # what the JSON calls it
    try:
        # --pairs alone reads only the user's files; --cosines-out scores the 7 STS tasks whatever
        needs_data = args.tasks or args.layerwise or args.pairs_plot or args.cosines_out
        data_dir = resolve_data_dir(args.data_dir, need_stsb=False) if needs_data else None
        if args.pairs_plot:
            return pairs_plot(args, model, tokenizer, meta, data_dir)
        cosines = {}
        results = {"model": name, "model_sha256": sha, "device": device,
                   "precision": args.precision,
                   **run_tasks(args, model, tokenizer, data_dir, transform, cosines)}
    except DataError as e:
        die(e)
    report(args, results, device)
    if args.pairs_out:
        evaluate.save(args.pairs_out, lambda path: write_pairs(path, results["pairs"]),
                      f"{len(results['pairs'])} pairs with their cosines")
    if args.cosines_out:
        evaluate.save(args.cosines_out, lambda path: write_cosines(path, cosines),
                      f"{sum(len(c) for c, _ in cosines.values())} STS test pairs' cosines")
    if args.json:
        evaluate.save(args.json, lambda path: outputs.write_json(path, results), "results")
    return results


if __name__ == "__main__":
    cli.run(main, "lab.evaluate")
