"""STS evaluation: the cosine of a pair's sentence vectors, Spearman x100 against the gold scores.

It follows SentEval's STSEval (facebookresearch/SentEval, senteval/sts.py) as SimCSE runs it
(princeton-nlp/SimCSE, evaluation.py --mode test), the paper's setting. STS12-16 have subsets:
    all    one Spearman over the pairs of all subsets concatenated (SimCSE, the paper: the headline)
    wmean  the subsets' Spearmans averaged, weighted by subset size (SentEval's "wmean")
    mean   the subsets' Spearmans averaged (SentEval's "mean")
Papers mix these up, and they differ by points. STS-B and SICK-R are single sets: the three agree.
"""
import contextlib
import difflib
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

import bert
import checkpoint
import cli
import outputs
from cli import die
from data import SHORT, TASKS, TRANSFER, DataError, load_stsb, load_task, resolve_data_dir

PROTOCOLS = ("all", "wmean", "mean")
SUMMARY = ("avg", "sentences", "sentences_per_s", "seconds", "task_seconds")  # not tasks
TASK_SETS = {"sts": TASKS, "transfer": TRANSFER, "all": TASKS + TRANSFER}  # --tasks shorthands
EVAL_MAX_LEN = 128  # tokens a sentence at evaluation, [CLS]/[SEP] included: SentEval's, SimCSE's
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt")  # load reads

EPILOG = """\
example: python evaluate.py --ckpt sg.safetensors --json results.json
the lab's evaluations (python -m lab.evaluate --help): --pooling wk [--wk-layer-start K]
[--wk-window W], --pooling prompt [--template T], --tasks transfer [--transfer-config C],
--layerwise [--plot PNG], --pairs FILE [--pairs-out TSV], --cosines-out NPZ, --pairs-plot PNG,
and a --ckpt with a fitted transform or a template"""

# -----------------------------------------------------------------------------
# the command line


def parser():  # the lab's evaluations (lab/evaluate.py) add their flags to it
    p = cli.parser("evaluate.py", "STS evaluation (Spearman x100) in the all / wmean / mean "
                   "protocols", EPILOG)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="model folder, or a name (models/, weights/, the hub)")
    src.add_argument("--ckpt", help="a .safetensors checkpoint written by train.py")
    a = p.add_argument
    a("--pooling", help=f"sentence vector: {', '.join(bert.POOLINGS)} (default: the pooling a "
      "--ckpt records, else cls); the lab's: wk, prompt")
    a("--layer", type=int, default=None, help="hidden state to pool, 0 = embeddings (default: -1)")
    a("--tasks", nargs="+", default=None, metavar="TASK",
      choices=TASKS + list(SHORT.values()) + TRANSFER + list(TASK_SETS),
      help=f"tasks to run: any of {' '.join(TASKS)}, or sts (the 7 STS tasks, the default); "
      f"the lab's: {' '.join(TRANSFER)}, transfer (those 7), all (both)")
    a("--data-dir", help="data folder (default: $SG_DATA, else ./data; fetched when missing)")
    a("--batch-size", type=int, default=64, help="sentences per forward pass (default: 64)")
    a("--device", default="auto", choices=["auto", "cpu", "cuda"], help="default: cuda if present")
    a("--precision", default="fp32", choices=["fp32", "bf16"], help="fp32 (default: the exact "
      "numbers), or bf16: the encoder's matrix products in bfloat16 (autocast), faster only with "
      "bf16 matrix instructions (AVX512-BF16, AMX) or on a GPU")
    a("--json", help="also write the results to this JSON file")
    return p


def expand(tasks):
    """--tasks as the tasks they name, in order, the sets expanded, each task once."""
    tasks = [{v: k for k, v in SHORT.items()}.get(t, t) for t in tasks]
    return list(dict.fromkeys(x for t in tasks for x in TASK_SETS.get(t, [t])))


def get_args(argv):  # the lab's flags, poolings and tasks: one line with the lab's command
    args = cli.parse(parser(), argv, lab="lab.evaluate")
    if args.pooling is not None and args.pooling not in bert.POOLINGS:
        cli.to_the_lab(f"--pooling {args.pooling}: evaluate.py pools {', '.join(bert.POOLINGS)}",
                       "lab.evaluate", argv)
    transfer = [t for t in args.tasks or [] if set(expand([t])) & set(TRANSFER)]
    if transfer:
        cli.to_the_lab(f"--tasks {transfer[0]}: evaluate.py scores the STS tasks", "lab.evaluate",
                       argv)
    return args


# -----------------------------------------------------------------------------
# sentence vectors and the STS protocols


def eval_tokenizer(tokenizer, config):
    """Every evaluation's tokenizer: truncates at EVAL_MAX_LEN, never at a run's --max-len."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_str(tokenizer.to_str())
    tok.enable_truncation(max_length=min(EVAL_MAX_LEN, config.max_position_embeddings))
    return tok


def sentence_vectors(model, tokenizer, pooling="cls", layer=-1, batch_size=64, log=None,
                     precision="fp32"):
    """vectors(sentences) -> (n, H) float32: what every evaluation takes, so a pooling plugs in."""
    def vectors(sentences):
        count = cli.Counter(log) if log and len(sentences) >= 2000 else None
        return bert.encode(model, tokenizer, sentences, pooling=pooling, layer=layer,
                           batch_size=batch_size, progress=count, precision=precision)
    return vectors


def cosine(a, b):  # row-wise: (n, H) and (n, H) -> (n,), in float64
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)


def constant(x):
    """Every value the same, up to float64 rounding (a cosine of 1 is 1 only to 1e-16)."""
    x = np.asarray(x, np.float64)
    return np.ptp(x) <= 64 * np.finfo(np.float64).eps * np.abs(x).max(initial=0)


def spearman(x, y):  # x100; NaN when either side is constant
    if constant(x) or constant(y):
        return float("nan")
    return float(100 * spearmanr(x, y).statistic)


def spearman_table(subsets):
    """{subset: (similarities, gold)} -> {"all", "wmean", "mean"}: Spearman x100 (see the top)."""
    rhos = [spearman(sims, gold) for sims, gold in subsets.values()]
    sizes = [len(gold) for _, gold in subsets.values()]
    every = [np.concatenate(x) for x in zip(*subsets.values())]  # (sims, gold) of all subsets
    return {"all": spearman(*every), "wmean": float(np.average(rhos, weights=sizes)),
            "mean": float(np.mean(rhos))}


def unique_sentences(pairs):  # [(s1, s2, gold), ...] -> the distinct sentences, sentence -> row
    uniq = list(dict.fromkeys(s for s1, s2, _ in pairs for s in (*s1, *s2)))
    return uniq, {s: i for i, s in enumerate(uniq)}


def similarities(emb, index, s1, s2):  # each pair's cosine, from the distinct sentences' (n, H)
    return cosine(emb[[index[s] for s in s1]], emb[[index[s] for s in s2]])


def progress(msg):
    print(msg, file=sys.stderr, flush=True)  # stderr: the tables on stdout stay clean


def evaluate_sts(vectors, tasks, data_dir, log=progress, cosines=None, load=load_task):
    """{task: {"all", "wmean", "mean"}, *SUMMARY}, each distinct sentence encoded once."""
    t0 = time.perf_counter()
    results, n_sent, t_enc, task_seconds = {}, 0, 0.0, {}
    for task in tasks:
        subsets = load(task, data_dir)
        uniq, index = unique_sentences(subsets.values())
        log(f"{SHORT.get(task, task)}: encoding {len(uniq)} sentences ...")
        t = time.perf_counter()
        emb = vectors(uniq)  # (n, H)
        t_enc += time.perf_counter() - t
        n_sent += len(uniq)
        sims = {k: (similarities(emb, index, s1, s2), gold)
                for k, (s1, s2, gold) in subsets.items()}
        results[task] = spearman_table(sims)
        if cosines is not None:  # the lab's --cosines-out and --pairs
            cosines[task] = [np.concatenate(x) for x in zip(*sims.values())]  # (cosines, gold)
        task_seconds[task] = time.perf_counter() - t  # encoding and scoring: its inference time
        log(f"{SHORT.get(task, task)}: {len(uniq)} sentences, {task_seconds[task]:.1f} s, "
            f"Spearman {results[task]['all']:.2f}")
    names = [k for k in results if k in TASKS] or list(results)
    results["avg"] = {p: float(np.mean([results[k][p] for k in names])) for p in PROTOCOLS}
    results.update(sentences=n_sent, sentences_per_s=n_sent / max(t_enc, 1e-9),
                   seconds=time.perf_counter() - t0, task_seconds=task_seconds)
    return results


def stsb_spearman(vectors, data_dir, split="dev"):  # train.py's dev score, and its final report
    s1, s2, gold = load_stsb(split, data_dir)
    uniq, index = unique_sentences([(s1, s2, gold)])
    return spearman(similarities(vectors(uniq), index, s1, s2), gold)


def print_table(results, tasks, title):
    print(title)
    print(f"{'task':<8}" + "".join(f"{p:>8}" for p in PROTOCOLS))
    for name in [*tasks, "avg"]:
        cells = "".join(f" {results[name][p]:7.2f}" for p in PROTOCOLS)  # NaN: '    nan'
        print(f"{SHORT.get(name, name):<8}{cells}")
    print(f"{results['sentences']} distinct sentences encoded, {results['sentences_per_s']:.0f} "
          f"sentences/s; evaluation took {results['seconds']:.1f} s")


def where(args, device, pooling=None):  # a table's title: the model, pooling, layer, device
    return (f"{cli.model_name(args.ckpt or args.model)} | pooling {pooling or args.pooling} | "
            f"layer {args.layer} | device {device}" + (" bf16" if args.precision == "bf16" else ""))

# -----------------------------------------------------------------------------
# the model, the checks, the outputs


def model_inputs(flag, name):  # (what, path) of the files a model is read from
    p = checkpoint.local_path(name)
    return [(f"{flag} file", p / f) for f in MODEL_FILES] if p.is_dir() else [(flag, p)]


def check_not_read(flag, path, reads):  # an output that is one of the inputs `reads`: refused
    for what, source in reads if path else ():
        if outputs.same_path(path, source):
            die(f"{flag} {path} is the {what} {source}: writing it would replace what it reads; "
                "give another file")


def check_args(args, writes=None, reads=()):
    reads = [*reads, *model_inputs("--ckpt" if args.ckpt else "--model", args.ckpt or args.model)]
    for flag, path, suffix in writes or [("--json", args.json, ".json")]:
        try:
            path and outputs.check_output(path, suffix)
        except outputs.OutputError as e:
            die(f"{flag} {e}")
        check_not_read(flag, path, reads)
    if args.batch_size < 1:
        die(f"--batch-size must be at least 1, not {args.batch_size}")


@contextlib.contextmanager
def loading(args):  # an error while the model is read or built: one line
    try:
        yield
    except checkpoint.LoadError as e:
        die(f"{e}{checkpoint.models_here(args.model) if args.model else ''}")
    except (OSError, ValueError) as e:
        die(f"cannot load {args.ckpt or args.model}: {e}")


def read(args):
    """The --ckpt or --model as checkpoint.load reads it: the one read of its file."""
    ckpt = Path(args.ckpt or "")
    if args.ckpt and ckpt.suffix == ".safetensors" and not ckpt.exists():
        here = [f.name for f in ckpt.parent.glob("*.safetensors") if f.is_file()]
        near = difflib.get_close_matches(ckpt.name, here, n=1)
        where = "" if ckpt.is_absolute() else f" in {Path.cwd()}"
        if near:
            die(f"--ckpt {args.ckpt} not found{where}; did you mean {ckpt.with_name(near[0])}?")
        die(f"--ckpt {args.ckpt} not found{where}; train.py makes one: python train.py --model "
            f"MODEL --out {args.ckpt} (MODEL a local folder, e.g. the packaged all-MiniLM-L6-v2 of "
            "the README's Quick start)")
    with loading(args):
        args.ckpt and checkpoint.check_checkpoint_path(args.ckpt)
        return checkpoint.load(args.ckpt or args.model)


def build(args, ck):
    with loading(args):
        model = bert.Bert.from_checkpoint(ck)
        tokenizer = eval_tokenizer(bert.tokenizer_of(ck), model.config)
    L = model.config.num_hidden_layers
    if not -L - 1 <= args.layer <= L:
        die(f"--layer {args.layer} out of range: {args.ckpt or args.model} has layers 0..{L} "
            f"(or -1..-{L + 1} from the top)")
    return model, tokenizer


def lab_checkpoint(ck):
    """What of a checkpoint only the lab evaluates, in words, or None."""
    if "transform" in ck.meta or any(k.startswith(checkpoint.TRANSFORM_PREFIX) for k in ck.tensors):
        return "holds a fitted transform"
    if "template" in ck.meta:
        return "records a template"
    pooling = ck.meta.get("pooling")
    return None if pooling in (None, *bert.POOLINGS) else f"records pooling {pooling!r}"


def save(path, write, what):  # one output, through write(path) (atomic)
    try:
        write(path)
    except OSError as e:
        die(f"cannot write {path} ({e.strerror or e}); the results above were not saved", code=1)
    print(f"{what} written to {path}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = get_args(argv)
    check_args(args)
    args.layer = -1 if args.layer is None else args.layer
    device = cli.device(args.device)
    ck = read(args)
    lab = args.ckpt and lab_checkpoint(ck)
    if lab:
        cli.to_the_lab(f"--ckpt {args.ckpt} {lab}, which evaluate.py does not make", "lab.evaluate",
                       argv)
    model, tokenizer = build(args, ck)
    meta, sha = ck.meta, ck.sha256
    del ck  # its tensors: the model holds its own copy
    args.pooling = args.pooling or meta.get("pooling") or "cls"  # the method's evaluation pooling
    model.to(device)
    vectors = sentence_vectors(model, tokenizer, args.pooling, args.layer, args.batch_size,
                               log=progress, precision=args.precision)
    try:
        data_dir = resolve_data_dir(args.data_dir, need_stsb=False)
        sts = evaluate_sts(vectors, expand(args.tasks or ["sts"]), data_dir)
    except DataError as e:
        die(e)
    results = {"model": checkpoint.display_name(args.ckpt or args.model), "model_sha256": sha,
               "device": device, "precision": args.precision, "pooling": args.pooling,
               "layer": args.layer, "sts": sts, "transfer": None, "layerwise": None, "pairs": None}
    # "transfer", "layerwise", "pairs": the lab's evaluations fill them (python -m lab.evaluate)
    print_table(sts, [t for t in sts if t in TASKS], f"STS Spearman x100 | {where(args, device)}")
    if args.json:
        save(args.json, lambda path: outputs.write_json(path, results), "results")
    return results


if __name__ == "__main__":
    cli.run(main, "evaluate.py")
