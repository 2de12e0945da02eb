"""
STS evaluation of sentence embeddings: cosine similarity of the two sentence vectors, Spearman x100 against gold.

It follows SentEval's STSEval (facebookresearch/SentEval, senteval/sts.py) as SimCSE runs it (princeton-nlp/SimCSE,
evaluation.py --mode test), which is also the paper's setting. STS12-16 are reported in three protocols, because
papers mix them up and the numbers differ by several points:
    all    one Spearman over the pairs of all subsets concatenated (SimCSE and the paper: the headline number)
    wmean  the subsets' Spearmans averaged, weighted by subset size (SentEval's "wmean")
    mean   the subsets' Spearmans averaged (SentEval's "mean")
STS-B and SICK-R are single test sets, so the three coincide. --layerwise gives the paper's Figure 1: STS-B test
Spearman of every layer 0..L under cls / mean / max pooling.

    python evaluate.py --model bert-base-uncased --pooling cls
    python evaluate.py --ckpt sg.safetensors --json results.json
"""
import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

import bert
from data import TASKS, DataError, load_stsb, load_task, resolve_data_dir

PROTOCOLS = ("all", "wmean", "mean")
SHORT = {"STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R"}  # MTEB's names, for the printed table
LAYERWISE_POOLINGS = ("cls", "mean", "max")


def cosine(a, b):
    """Row-wise cosine similarity of (n, H) and (n, H) -> (n,), in float64."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)


def spearman(x, y):
    """Spearman rank correlation x100 (scipy); NaN when either side is constant (no ranking to compare)."""
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(100 * spearmanr(x, y).statistic)


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


def evaluate_model(model, tokenizer, tasks, data_dir, pooling="cls", layer=-1, batch_size=64):
    """Spearman x100 of every task in every protocol, in the --json format (less "model"). Each task's sentences are
    encoded once, even when they repeat across pairs and subsets, in length-sorted batches (bert.encode)."""
    t0 = time.perf_counter()
    results, n_sent, t_enc = {}, 0, 0.0
    for name in tasks:
        data = load_task(name, data_dir)
        uniq, index = unique_sentences(data.values())
        t = time.perf_counter()
        emb = bert.encode(model, tokenizer, uniq, pooling=pooling, layer=layer, batch_size=batch_size)  # (n, H)
        t_enc += time.perf_counter() - t
        n_sent += len(uniq)
        results[name] = spearman_table({k: (similarities(emb, index, s1, s2), gold)
                                        for k, (s1, s2, gold) in data.items()})
    results["avg"] = {p: float(np.mean([results[name][p] for name in tasks])) for p in PROTOCOLS}
    results.update(pooling=pooling, layer=layer, sentences=n_sent, sentences_per_s=n_sent / max(t_enc, 1e-9),
                   seconds=time.perf_counter() - t0)
    return results


def stsb_spearman(model, tokenizer, data_dir, split="dev", pooling="cls", batch_size=64):
    """STS-B Spearman x100 of one split: train.py's dev score for picking the best checkpoint."""
    s1, s2, gold = load_stsb(split, data_dir)
    uniq, index = unique_sentences([(s1, s2, gold)])
    emb = bert.encode(model, tokenizer, uniq, pooling=pooling, batch_size=batch_size)
    return spearman(similarities(emb, index, s1, s2), gold)


def layerwise(model, tokenizer, data_dir, batch_size=64):
    """The paper's Figure 1: STS-B test Spearman x100 -> {pooling: [layer 0, layer 1, ..., layer L]}."""
    s1, s2, gold = load_stsb("test", data_dir)
    uniq, index = unique_sentences([(s1, s2, gold)])
    L = model.config.num_hidden_layers
    embs = bert.encode_many(model, tokenizer, uniq, [(p, k) for p in LAYERWISE_POOLINGS for k in range(L + 1)],
                            batch_size=batch_size)  # one forward pass per batch for all layers and poolings
    return {p: [spearman(similarities(embs[p, k], index, s1, s2), gold) for k in range(L + 1)]
            for p in LAYERWISE_POOLINGS}

# -----------------------------------------------------------------------------
# printing, plotting, command line


def fmt(x):
    return f"{x:7.2f}" if not math.isnan(x) else "    nan"


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
    fig.savefig(path)


def die(msg):
    print("error: " + " ".join(str(msg).split()), file=sys.stderr)  # one line, whatever the message holds
    sys.exit(2)


def json_safe(x):
    """NaN (a constant similarity, e.g. [CLS] of the embedding layer) as null, so the file is valid JSON."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [json_safe(v) for v in x]
    return None if isinstance(x, float) and math.isnan(x) else x


def main(argv=None):
    parser = argparse.ArgumentParser(description="STS evaluation (Spearman x100) in the all / wmean / mean protocols")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="model folder, or a name resolved as weights/<name>/ (e.g. bert-base-uncased)")
    src.add_argument("--ckpt", help="a .safetensors checkpoint written by train.py")
    parser.add_argument("--pooling", default="cls", choices=bert.POOLINGS, help="sentence vector (default: cls)")
    parser.add_argument("--layer", type=int, default=-1, help="hidden state to pool, 0 = embeddings (default: -1)")
    parser.add_argument("--tasks", nargs="+", default=TASKS, choices=TASKS + list(SHORT.values()), metavar="TASK",
                        help=f"tasks to run (default: all 7: {' '.join(TASKS)})")
    parser.add_argument("--data-dir", help="data folder (default: $SG_DATA, else ./data; fetched when missing)")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per forward pass (default: 64)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="default: cuda if present")
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--layerwise", action="store_true", help="STS-B test Spearman per layer x cls/mean/max")
    parser.add_argument("--plot", help="with --layerwise: draw it to this .png (needs matplotlib)")
    args = parser.parse_args(argv)
    tasks = [{v: k for k, v in SHORT.items()}.get(t, t) for t in args.tasks]

    # refuse bad input before any work starts, with one line each
    if args.plot and not args.layerwise:
        die("--plot draws the --layerwise table: add --layerwise")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            die("--plot needs matplotlib: pip install matplotlib (or drop --plot; the table has the same numbers)")
    if args.batch_size < 1:
        die(f"--batch-size must be at least 1, not {args.batch_size}")
    if args.device == "cuda" and not torch.cuda.is_available():
        die("--device cuda, but torch sees no CUDA device (use --device cpu)")
    if args.ckpt and not Path(args.ckpt).is_file():
        die(f"--ckpt {args.ckpt}: no such file")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        die(f"--json {args.json}: folder {Path(args.json).resolve().parent} does not exist")
    name = args.ckpt or args.model
    try:
        model = bert.Bert.from_pretrained(name)  # truncate at the model's own limit (128 at most, as SentEval runs)
        tokenizer = bert.load_tokenizer(name, max_len=min(128, model.config.max_position_embeddings))
    except bert.LoadError as e:  # its message names the file and what to do
        die(e)
    except (OSError, ValueError) as e:
        die(f"cannot load {name}: {e}")
    L = model.config.num_hidden_layers
    if not -L - 1 <= args.layer <= L:
        die(f"--layer {args.layer} out of range: {name} has layers 0..{L} (or -1..-{L + 1} from the top)")
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    model.to(device)
    try:
        data_dir = resolve_data_dir(args.data_dir)
        if args.layerwise:
            t0 = time.perf_counter()
            table = layerwise(model, tokenizer, data_dir, args.batch_size)
            results = {"layerwise": table, "seconds": time.perf_counter() - t0}
        else:
            results = evaluate_model(model, tokenizer, tasks, data_dir, args.pooling, args.layer, args.batch_size)
    except DataError as e:
        die(e)
    results["model"] = name
    if args.layerwise:
        title = f"STS-B test Spearman x100 by layer (paper Fig. 1) | {name} | device {device}"
        print_layerwise(results["layerwise"], title)
        print(f"layer-wise evaluation took {results['seconds']:.1f} s")
        if args.plot:
            plot_layerwise(results["layerwise"], args.plot, f"STS-B test, {'/'.join(Path(name).parts[-2:])}")
            print(f"plot written to {args.plot}")
    else:
        print_table(results, tasks, f"STS Spearman x100 | {name} | pooling {args.pooling} | layer {args.layer} | "
                                    f"device {device}")
    if args.json:
        Path(args.json).write_text(json.dumps(json_safe(results), indent=2) + "\n")
        print(f"results written to {args.json}")


if __name__ == "__main__":
    main()
