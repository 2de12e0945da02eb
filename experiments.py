"""
The paper's experiments as data: each is a list of variants (train.py flags, or an untrained model's evaluation)
run over seeds, resumably, and reported as mean +- std over seeds beside the paper's figures.

Each run is `python train.py ...` (or `python evaluate.py ...` for an untrained baseline) in a subprocess with a
process group of its own, writing <out>/<experiment>/<variant>/seed-<s>.{safetensors,json,log} (eval.json for an
evaluation, fit.json for a fit that no seed changes, such as whitening: both run once). The record (.json) appears,
atomically, only when the run has finished, and only such a record counts: re-running the same command skips the
finished runs, so a killed sweep loses at most the run in flight. A record that is not valid JSON of a run's shape
is named with what to do, and left out of the tables. A run in flight holds .seed-<s>.json.lock beside its record
(checkpoint.output_lock: an flock, so the lock of a dead owner is taken over), so sweeps of one experiment on one
--out share its runs: each run is run once, and a sweep waits for the runs that another live sweep holds before it
reports. A run whose command equals a finished run of another experiment (SG-OPT with the defaults is in several)
is not run again: its record is copied, naming the source (except in table6, whose timings come from one sweep).
A run whose training equals such a run's and whose second step differs (Table 4's SG-OPT: Table 1's, then transfer)
takes that run's checkpoint, while it is still beside its record, and runs only its own second step.

Exit status: 0 when every run of the sweep is finished; 1 when a run failed, was held by another process
(--no-wait), or has a bad record or lock; 2 for a usage error, ours or a run's (train.py's exit 2, which every run
would repeat: the sweep stops at once); 128 + N when stopped by signal N (SIGINT, SIGTERM, SIGHUP): the run in
flight is stopped with its whole process group, the locks are released, and the same command resumes the sweep.

References: Kim, Yoo, Lee, ACL 2021: Table 1 (main STS table), Table 4 (SentEval transfer), Table 5 (ablation),
Table 6 (efficiency), Figure 4 (domain robustness), appendix Table 9 (the 8 seeds).
"""
import argparse
import contextlib
import functools
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import data
from checkpoint import (LoadError, OutputLocked, die, display_name, output_lock, temp_path, weights_sha256,
                        write_json, write_text)

ROOT = Path(__file__).resolve().parent
PAPER_SEEDS = [1, 2, 3, 4, 1234, 2345, 3456, 7890]  # appendix Table 9
TASKS = data.TASKS
SHORT = {"STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R"}
EXAMPLES = """examples:
  python experiments.py list
  python experiments.py table5 --model $M --seeds 1 2 3 --max-steps 300 --out results
  python experiments.py table1 --model $M --seeds 1 2 3 4 1234 2345 3456 7890 --out results
  python experiments.py leaderboard --model $M --variants promptbert sg-opt-mean --out results
  python experiments.py report table5 --out results
  python experiments.py report figure4 --out results --plot figure4.png

Any other flag goes to every train.py run whose method takes it (methods.py: --whiten-dim to the whitening only,
--proj-size to the rows with the head f; e.g. --max-steps 300, --device cpu); evaluate.py runs get --device and
--eval-batch-size (as its --batch-size). A flag that no run of the sweep takes is refused."""


@dataclass
class Variant:
    name: str  # also its folder name
    flags: list = field(default_factory=list)  # train.py flags (or evaluate.py flags when evaluate_only)
    paper: dict = field(default_factory=dict)  # {block: "avg" or "avg +- std"}: the paper's figure(s), as printed
    evaluate_only: bool = False  # evaluate.py on the base model: one run (eval.json), no training, no seeds
    seeded: bool = True  # False: a train.py fit no seed changes (whitening): one run (fit.json), no --seed
    then: list = field(default_factory=list)  # evaluate.py flags of a second step on the run's checkpoint


@dataclass
class Experiment:
    title: str
    variants: list
    note: str = ""
    drops: dict = field(default_factory=dict)  # {variant: its reference}: the report adds variant minus reference
    table: str = "sts"  # the report: sts (7 STS tasks), transfer (Table 4), efficiency (Table 6), drops (Figure 4)
    transfer: tuple = ()  # the transfer tasks whose data it reads (checked before any run)
    fresh: bool = False  # its runs are never copied from another experiment's (timings from one sweep)
    then_seeds: int = 0  # > 0: only the runs of the sweep's first N seeds take their variant's second step


WHITENING = Variant("whitening", ["--loss", "whitening"], seeded=False)
FLOW = Variant("flow", ["--loss", "flow"], {"BERT-base": "68.77 +- 0.07", "SBERT-base": "77.42"})
SG_OPT = Variant("sg-opt", [], {"BERT-base": "74.62 +- 0.25"})
SG_OPT_MEAN = ["--pooling", "mean", "--eval-pooling", "mean"]  # ours: c_i = BERT_T's mean-pooled last layer
TRANSFER_TEXT = "{transfer_text}"  # a --data value: the file transfer_text() writes
TRANSFER_PAPER = ["--tasks", "transfer", "--transfer-config", "paper"]  # evaluate.py: Table 4's protocol
OWN = "BERT-base, its own paper"  # the leaderboard's paper column: each method's own paper
EXPERIMENTS = {
    "table1": Experiment("Table 1: untrained poolings, the post-hoc baselines and SG / SG-OPT", [
        Variant("cls", ["--pooling", "cls"], {"BERT-base": "31.40", "SBERT-base": "71.32"}, evaluate_only=True),
        Variant("mean", ["--pooling", "mean"], {"BERT-base": "52.57", "SBERT-base": "74.85"}, evaluate_only=True),
        Variant("first-last", ["--pooling", "first-last"], evaluate_only=True),
        Variant("wk", ["--pooling", "wk"], {"BERT-base": "25.58", "SBERT-base": "75.59"}, evaluate_only=True),
        WHITENING,  # closed form: run once
        FLOW,
        Variant("sg", ["--loss", "sg"], {"SBERT-base": "78.41 +- 0.33"}),
        Variant("sg-opt", [], {"BERT-base": "74.62 +- 0.25", "SBERT-base": "79.41 +- 0.17"}),
    ], "SBERT-base is the paper's closest analogue to a model already trained as a sentence encoder (e.g. "
       "all-MiniLM-L6-v2); its Contrastive (BT) row is 72.47. The paper's BERT-base SG figure is Table 5's 72.17. The "
       "paper has no first-last or whitening row: BERT-flow's and the whitening paper's first-last (their "
       "'last2avg') is 63.69 and the whitening paper's BERT-base whitening (target) 69.21, both in the wmean protocol, "
       "not comparable with this table's all."),
    "table4": Experiment("Table 4: SentEval transfer tasks (the paper's classifier config)", [
        # --tasks all: the leaderboard's runs of mean and wk, shared (STS costs a minute beside transfer's 30)
        Variant("mean", ["--pooling", "mean", "--tasks", "all", "--transfer-config", "paper"],
                {"BERT-base": "85.85"}, evaluate_only=True),
        Variant("wk", ["--pooling", "wk", "--tasks", "all", "--transfer-config", "paper"],
                {"BERT-base": "85.83"}, evaluate_only=True),
        Variant("sg-opt", [], {"BERT-base": "86.60"}, then=["--tasks", "transfer", "--transfer-config", "paper"]),
    ], "SentEval's protocol (transfer.py) with the paper's classifier: an MLP of 50 sigmoid units, 10 folds. sg-opt: "
       "the STS-B-trained checkpoint of each seed, evaluated by evaluate.py --ckpt as the second step of its run.",
       table="transfer", transfer=tuple(data.TRANSFER)),
    "table5": Experiment("Table 5: ablation", [
        SG_OPT,
        Variant("opt2", ["--loss", "opt2"], {"BERT-base": "73.14"}),
        Variant("opt1", ["--loss", "opt1"], {"BERT-base": "72.61"}),
        Variant("sg", ["--loss", "sg"], {"BERT-base": "72.17"}),
        Variant("tau-0.1", ["--tau", "0.1"], {"BERT-base": "70.39"}),
        Variant("lam-0", ["--lam", "0"], {"BERT-base": "73.76"}),
        Variant("lam-1", ["--lam", "1"], {"BERT-base": "73.18"}),
        Variant("no-proj", ["--no-proj"], {"BERT-base": "72.78"}),
    ]),
    "table6": Experiment("Table 6: efficiency on STS-B (training and STS-B test inference time)", [
        # evaluate.py at train.py's --eval-batch-size default (a sweep's --eval-batch-size reaches both)
        Variant("mean", ["--pooling", "mean", "--tasks", "STSBenchmark", "--batch-size", "128"],
                {"inference (s)": "13.94"}, evaluate_only=True),
        Variant("wk", ["--pooling", "wk", "--tasks", "STSBenchmark", "--batch-size", "128"],
                {"inference (s)": "197.03"}, evaluate_only=True),
        WHITENING,
        Variant("flow", FLOW.flags, {"train (s)": "155.37", "inference (s)": "28.49"}),
        Variant("sg-opt", [], {"train (s)": "455.02", "inference (s)": "10.51"}),
    ], "Measured in one sweep on an otherwise idle machine (its runs are never copied from other experiments); "
       "compare the ratios, not the seconds. Train: SG-OPT's training loop, or the fit of whitening and flow (their "
       "vectors of the training sentences included). Inference: STS-B test, encoding and scoring (evaluate.py's "
       "STS-B time for mean and WK, train.py's test time for the others). The paper: one Titan Xp, batch 16.",
       table="efficiency", fresh=True),
    "views": Experiment("The code-vs-paper switches: how BERT_F's views are made", [
        Variant("sg-opt", []),
        Variant("view-max", ["--view-pooling", "max"]),
        Variant("teacher-dropout-off", ["--teacher-dropout", "off"]),
        Variant("no-layer-0", ["--layers", "1:"]),  # views from layers 1..l only
    ], "sg-opt is the official code's choice: mean-pooled views, BERT_F in train mode (dropout on), all hidden states "
       "0..l. The paper states max pooling."),
    "domain": Experiment("Figure 4: trained on other text than STS-B (SG-OPT only; figure4 adds Flow)", [
        Variant("sg-opt", []),
        Variant("transfer-text", ["--data", TRANSFER_TEXT]),
    ], "transfer-text: as many sentences as STS-B's 17,256, drawn (fixed seed) from the SentEval transfer tasks MR, "
       "CR, SUBJ and MPQA (movie and product reviews, opinion snippets). The paper used NLI, not in our data folder, "
       "and reports the drop from the STS-B-trained run.", drops={"transfer-text": "sg-opt"},
        transfer=("MR", "CR", "SUBJ", "MPQA")),
    "figure4": Experiment("Figure 4: domain shift, SG-OPT and Flow trained on STS-B's sentences or on other text", [
        Variant("sg-opt", []),
        Variant("sg-opt-transfer-text", ["--data", TRANSFER_TEXT], {"STS-B": "-1.83", "avg": "-1.63"}),
        FLOW,
        Variant("flow-transfer-text", [*FLOW.flags, "--data", TRANSFER_TEXT], {"STS-B": "-12.16", "avg": "-4.19"}),
    ], "transfer-text: 17,256 sentences (as many as STS-B's) drawn with a fixed seed from the SentEval transfer "
       "tasks MR, CR, SUBJ and MPQA. The paper trained on NLI instead of STS-B; its drops are beside ours.",
       drops={"sg-opt-transfer-text": "sg-opt", "flow-transfer-text": "flow"}, table="drops",
       transfer=("MR", "CR", "SUBJ", "MPQA")),
    "lr": Experiment("SG-OPT's peak learning rate (the paper's 5e-5 was chosen for BERT-base)", [
        SG_OPT,
        Variant("lr-1e-4", ["--lr", "1e-4"]),
        Variant("lr-3e-4", ["--lr", "3e-4"]),
    ], "For a model much smaller than BERT-base (raw-bert-mini: 4 layers, hidden 256), on which the SG family at the "
       "paper's 5e-5 leaves the 7-task average where it started: small BERTs are fine-tuned at up to 1e-4 (Turc et al. 2019's grid: 3e-5, 5e-5, 1e-4); "
       "3e-4 probes beyond it. Every other setting is the paper's."),
    "precision": Experiment("bf16 autocast vs fp32 (the official code's precision)", [
        Variant("fp32", ["--precision", "fp32"]),  # named: train.py's default is bf16 on CUDA
        Variant("bf16", ["--precision", "bf16"]),
    ], "bf16: autocast of BERT_F, BERT_T and the head; the similarity, softmax, loss, regulariser and the evaluation "
       "stay fp32. Read the bf16 row against the fp32 row's seed spread.", drops={"bf16": "fp32"}),
    "methods": Experiment("The trained methods on one harness: same data, seeds and evaluator (STS only)", [
        Variant("sg-opt", [], {"BERT-base": "74.62 +- 0.25"}),
        Variant("consert", ["--loss", "consert"], {"BERT-base": "72.74"}),
        Variant("simcse", ["--loss", "simcse"], {"BERT-base": "76.25"}),
        Variant("promptbert", ["--loss", "promptbert"], {"BERT-base": "78.54 +- 0.15"}),
        Variant("sg-opt-mean", SG_OPT_MEAN),
    ], "Each method with its own recipe (methods.py: tau, batch, max length, lr, pooling, augmentations), "
       "trained on the STS-B sentences; the paper figures are each method's own paper (ConSERT's trained on STS+SICK "
       "text for 10 epochs; SimCSE's on 10^6 Wikipedia sentences; PromptBERT's on SimCSE's). sg-opt-mean is ours: "
       "SG-OPT with BERT_T's mean-pooled last layer as c_i. The leaderboard's trained rows are these runs (its "
       "first seed's checkpoints take its transfer step)."),
    "leaderboard": Experiment("Every method and baseline on one harness: STS, transfer and cost", [
        *[Variant(n, ["--pooling", n, "--tasks", "all", "--transfer-config", "paper"], {OWN: p}, evaluate_only=True)
          for n, p in (("cls", "31.40 (SG-BERT)"), ("mean", "52.57 (SG-BERT)"), ("first-last", "56.70 (SimCSE)"),
                       ("wk", "25.58 (SG-BERT)"), ("prompt", "67.85 (PromptBERT)"))],
        Variant("whitening", WHITENING.flags, {OWN: "69.21 (wmean)"}, seeded=False, then=TRANSFER_PAPER),
        Variant("flow", FLOW.flags, {OWN: "69.57 (wmean)"}, then=TRANSFER_PAPER),
        Variant("sg", ["--loss", "sg"], {OWN: "72.17"}, then=TRANSFER_PAPER),
        Variant("sg-opt", [], {OWN: "74.62 +- 0.25"}, then=TRANSFER_PAPER),
        Variant("consert", ["--loss", "consert"], {OWN: "72.74"}, then=TRANSFER_PAPER),
        Variant("simcse", ["--loss", "simcse"], {OWN: "76.25"}, then=TRANSFER_PAPER),
        Variant("promptbert", ["--loss", "promptbert"], {OWN: "78.54 +- 0.15"}, then=TRANSFER_PAPER),
        # ours: self-guidance on the pooling the model was trained with (c_i = BERT_T's mean-pooled last layer)
        Variant("sg-opt-mean", SG_OPT_MEAN, then=TRANSFER_PAPER),
    ], "Each method with its own recipe (methods.py) for one epoch of the 17,256 STS-B sentences: the common "
       "budget is the data, not the steps (1,079 steps of 16 for the SG family, 270 of 64 for SimCSE, 180 of 96 for "
       "ConSERT, 68 of 256 for PromptBERT, 269 of 64 for the flow). Transfer: the 7 SentEval tasks, the paper's "
       "classifier, on the first seed's run of each method. The paper figures are each method's own paper on "
       "BERT-base ('all' protocol unless marked; whitening and flow: their papers' 'target' fits in 'wmean').",
       table="leaderboard", transfer=tuple(data.TRANSFER), then_seeds=1),
}

# -----------------------------------------------------------------------------
# run records: only a finished run's valid record counts

RECORD = re.compile(r"(seed-\d+|eval|fit)\.json")  # never the hidden files of runs in flight (.seed-1.result.json)
TRAIN_KEYS = ("best_step", "dev", "test", "steps", "stop", "wall_seconds", "test_seconds", "ms_per_step",
              "fit_seconds")


def number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def get(x, *keys):
    """x[k1][k2]..., or None where a level is missing or not a dict."""
    for k in keys:
        x = x.get(k) if isinstance(x, dict) else None
    return x


def needs(exp, v):
    """The key paths a record of v must hold, each a number, for exp's tables."""
    if exp.table == "leaderboard":  # transfer only on the first seed's runs: not needed
        paths = [("sts", t, "all") for t in [*TASKS, "avg"]]
    elif exp.table == "transfer":
        paths = [("transfer", t, "acc") for t in data.TRANSFER] + [("transfer", "avg")]
    elif exp.table == "efficiency":
        paths = [("sts", "STSBenchmark", "all")] + ([("sts", "seconds")] if v.evaluate_only else [])
    else:
        paths = [("sts", t, "all") for t in [*TASKS, "avg"]]
    return paths + ([] if v.evaluate_only else [("train", k) for k in ("wall_seconds", "test_seconds", "ms_per_step")])


def read_record(path, paths):
    """(record, None) when path is a run record holding every key path, else (None, what is wrong with it)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        return None, f"not readable as UTF-8 text ({e})"
    if not text.strip():
        return None, "empty"
    try:
        rec = json.loads(text)
    except ValueError as e:
        return None, f"not valid JSON ({e})"
    if not isinstance(rec, dict):
        return None, f"a JSON {type(rec).__name__}, not a run record"
    for p in paths:
        x = get(rec, *p)
        phases = p[-1] == "ms_per_step" and isinstance(x, dict) and all(map(number, x.values()))  # older records
        if not (number(x) or phases):
            return None, f"'{'/'.join(p)}' is missing or not a number"
    for k in ("dev", "test", "fit_seconds"):  # not needed by every table, but a number where present (never a NaN row)
        if get(rec, "train", k) is not None and not number(get(rec, "train", k)):
            return None, f"'train/{k}' is not a number ({get(rec, 'train', k)!r})"
    return rec, None


def bad_record_line(path, why):
    return f"warning: {path}: {why}; this run is left out (shown as missing): move the file aside and re-run the sweep"


def load_records(name, out):
    """{variant: [valid records]} of an experiment's folder, and [(path, what is wrong)] of the records that do not
    count (corrupt, empty, of the wrong shape, a needed key missing)."""
    exp, recs, bad = EXPERIMENTS[name], {}, []
    for v in exp.variants:
        paths = [p for p in (out / name / v.name).glob("*.json") if RECORD.fullmatch(p.name)]
        for path in sorted(paths, key=lambda p: (len(p.name), p.name)):  # seed-2 before seed-10
            rec, why = read_record(path, needs(exp, v))
            if rec is None:
                bad.append((path, why))
            else:
                recs.setdefault(v.name, []).append(rec)
    return recs, bad


def same_run(a, b):
    """Two run keys name the same run; a model path is compared by its own name (as records name it), so the
    records written before keys named models that way still match."""
    try:
        a, b = json.loads(a), json.loads(b)
        return [display_name(a[0]), *a[1:]] == [display_name(b[0]), *b[1:]]
    except (TypeError, ValueError, IndexError, KeyError):
        return False


def find_finished(out, key, stem, paths, checkpoint=False):
    """A finished valid run with the same key anywhere under out (another experiment's), or None. Records that are
    not valid are passed over here (their own experiment's report names them). checkpoint: only a run whose
    checkpoint is still beside its record."""
    for path in sorted(out.glob(f"*/*/{stem}.json")):
        rec, _ = read_record(path, paths)
        if rec and same_run(rec.get("key"), key) and "same_as" not in rec and (
                not checkpoint or path.with_suffix(".safetensors").exists()):
            return path, rec
    return None


def find_trained(out, key, stem):
    """A finished run of another experiment that trained what this run trains (this key without its second step),
    its checkpoint still beside its record: (record path, record), or None. Only the second step runs then."""
    model, flags, seed = json.loads(key)
    first = json.dumps([model, flags[:flags.index("then")], seed])
    return find_finished(out, first, stem, [("train", "wall_seconds")], checkpoint=True)

# -----------------------------------------------------------------------------
# one run: its commands, its child processes, its record


def run_key(model, flags, seed):
    """What makes two runs the same run: the model (by its own name), the flags in order (argparse: the last one
    wins), the seed. The outputs (--out, --json), --overwrite and where the transfer text lies are not part of it."""
    return json.dumps([display_name(model), [str(f) for f in flags], seed])


def flag_groups(flags):
    """['--a', '1', '--b', '--c=2'] -> [['--a', '1'], ['--b'], ['--c=2']]: each flag with its values."""
    groups = []
    for f in flags:
        if f.startswith("--") or not groups:
            groups.append([f])
        else:
            groups[-1].append(f)
    return groups


def sweep_flags(extra, accepts=None, rename=None):
    """The sweep's flags (extra) that a run takes: those accepts(flag) says it takes (None: all), renamed by rename
    {ours: theirs} (only those, when rename is given)."""
    out = []
    for g in flag_groups(extra):
        name, eq, value = g[0].partition("=")
        if accepts is not None and not accepts(name) or rename is not None and name not in rename:
            continue
        out += [(rename or {}).get(name, name) + eq + value, *g[1:]]
    return out


EVAL_FLAGS = {"--device": "--device", "--eval-batch-size": "--batch-size"}  # a sweep's flags that evaluate.py takes


def takes(v, flag):
    """Does variant v's train.py run take the sweep's flag (e.g. '--lr')? What methods.py says of v's method: not a
    flag the method ignores, nor another method's own setting (train.py refuses both). Imported here: list and
    report need no torch."""
    import methods
    loss = next((g[1] for g in flag_groups(v.flags) if g[0] == "--loss" and len(g) > 1), "opt")
    name = flag.removeprefix("--").replace("-", "_")
    return name not in methods.METHODS[loss].ignores and methods.OWN_FLAGS.get(name, loss) == loss


def untaken(runs, extra):
    """The sweep's flags that no run of it takes (train.py's by its method, evaluate.py's by EVAL_FLAGS)."""
    names = [g[0].partition("=")[0] for g in flag_groups(extra) if g[0].startswith("--")]
    return [f for f in names if not any(f in EVAL_FLAGS if r.v.evaluate_only else takes(r.v, f) for r in runs)]


@dataclass
class Run:
    """One variant x seed of an experiment, and where its files go."""
    exp: str
    v: Variant
    seed: int  # None: run once (an evaluation, an unseeded fit)
    folder: Path
    then: bool = True  # takes its variant's second step (Experiment.then_seeds)

    @property
    def stem(self):
        return "eval" if self.v.evaluate_only else "fit" if self.seed is None else f"seed-{self.seed}"

    def path(self, suffix, hidden=""):
        """Its file with this suffix; hidden: a run in flight's file (".result" -> .seed-1.result.json)."""
        return self.folder / f"{'.' if hidden else ''}{self.stem}{hidden}{suffix}"

    def __str__(self):
        return f"{self.exp}/{self.v.name}/{self.stem}"


def plan(name, seeds, out, only=None):
    """The runs of a sweep, seed-major: every variant (those named in `only`, in its order, when given) gets its first
    seed before any gets its second."""
    runs, exp = [], EXPERIMENTS[name]
    variants = [next(v for v in exp.variants if v.name == n) for n in dict.fromkeys(only)] if only else exp.variants
    for i, seed in enumerate(seeds):
        for v in variants:
            once = v.evaluate_only or not v.seeded
            if not (once and i > 0):
                then = not exp.then_seeds or i < exp.then_seeds
                runs.append(Run(name, v, None if once else seed, Path(out) / name / v.name, then))
    return runs


def commands(run, args, extra, text):
    """(key, the run's command, the command of its second step or None). text: the transfer-text file."""
    v, data_dir = run.v, (["--data-dir", args.data_dir] if args.data_dir else [])
    second = v.then if run.then else []
    if v.evaluate_only:
        script, flags = "evaluate.py", [*v.flags, *sweep_flags(extra, rename=EVAL_FLAGS), *data_dir]
    else:
        seed = [] if run.seed is None else ["--seed", str(run.seed)]
        script, flags = "train.py", [*sweep_flags(extra, lambda f: takes(v, f)), *v.flags, *seed, *data_dir]
    key = run_key(args.model, [script, *flags, *(["then", *second] if second else [])], run.seed)
    flags = [str(text) if f == TRANSFER_TEXT else f for f in flags]
    cmd = [sys.executable, str(ROOT / script), "--model", str(args.model), *flags, "--json", str(run.path(".json",
                                                                                                       ".result"))]
    if not v.evaluate_only:
        cmd += ["--out", str(run.path(".safetensors")), "--overwrite", "--eval-all"]
    then = [sys.executable, str(ROOT / "evaluate.py"), "--ckpt", str(run.path(".safetensors")), *second,
            *sweep_flags(extra, rename=EVAL_FLAGS), *data_dir, "--json", str(run.path(".json", ".then"))]
    return key, cmd, then if second else None


def shown(cmd):
    """A command as a record shows it: the script's name, the model by its own name, never this machine's paths."""
    out = [Path(cmd[1]).name, *cmd[2:]]
    return [display_name(x) if i and out[i - 1] == "--model" else x for i, x in enumerate(out)]


def run_child(cmd, log):
    """Run cmd with its output to the file log, in a process group of its own (Ctrl-C at the terminal reaches only
    us; we pass it on), and return its exit status. Interrupted (a signal, Ctrl-C), it stops the group first."""
    proc = None
    with open(log, "a") as f:
        try:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=die_with_parent())
            return proc.wait()
        except BaseException:
            if proc:
                stop_group(proc)
            raise


def die_with_parent():
    """A preexec_fn: on Linux the child is sent SIGKILL when this process dies, however it dies (prctl
    PR_SET_PDEATHSIG): a sweep killed with SIGKILL, which no handler sees, leaves no train.py running on; the same
    command resumes it. None elsewhere. (The signal comes when the thread that started the child ends: run_child
    waits in that thread.)"""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    try:
        prctl, parent = ctypes.CDLL(None, use_errno=True).prctl, os.getpid()  # looked up here, before the fork
    except (OSError, AttributeError):
        return None

    def arm():
        PR_SET_PDEATHSIG = 1
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
        if os.getppid() != parent:  # the sweep died before the line above took effect
            os._exit(1)
    return arm


def stop_group(proc, grace=10):
    """Stop a child and all it started: SIGINT to its group (train.py and evaluate.py leave nothing half-written),
    then SIGKILL to what is left after `grace` seconds."""
    try:
        signal_group(proc, signal.SIGINT)
        proc.wait(timeout=grace)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):  # a second signal while we wait: kill now
        pass
    finally:
        signal_group(proc, signal.SIGKILL)  # its own children too, should any outlive it
        proc.wait()


def signal_group(proc, sig):
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone already
        os.killpg(proc.pid, sig)


def last_line(log):
    """The line a failed run's log ends with (its error line, when it has one)."""
    lines = [x.strip() for x in Path(log).read_text(errors="replace").splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith("error: ")]
    return (errors or lines or ["(empty log)"])[-1]


def read_result(path):
    """The JSON a finished child wrote, or None; the file goes either way."""
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        result = None
    path.unlink(missing_ok=True)
    return result if isinstance(result, dict) else None


def execute(run, key, cmd, then, tag, t_sweep, trained=None):
    """Run the run's command (and its second step), write its record; 'ran' or 'failed'. trained: find_trained's
    answer, another experiment's run that trained this very model: only the second step runs, on its checkpoint.
    A usage error (exit 2: every run would repeat it) stops the sweep with its line."""
    log, t0 = run.path(".log"), time.time()
    if trained:
        i = then.index("--ckpt") + 1
        then = [*then[:i], str(trained[0].with_suffix(".safetensors")), *then[i + 1:]]
    steps = [(then, run.path(".json", ".then"))] if then else []
    if trained:
        print(f"{tag} {run}: trained as {trained[0]}; on its checkpoint: {' '.join(shown(then))}", flush=True)
    else:
        steps.insert(0, (cmd, run.path(".json", ".result")))
        print(f"{tag} {run}: {' '.join(shown(cmd))}", flush=True)
    log.write_text("")
    results = []
    for c, part in steps:
        with open(log, "a") as f:
            f.write(" ".join(shown(c)) + "\n")
        rc = run_child(c, log)
        if rc == 2:
            die(f"{last_line(log).removeprefix('error: ')} ({run}: {Path(c[1]).name} refused its input, as every "
                f"run would; the sweep stops. Log: {log})")
        results.append(read_result(part))
        if rc != 0 or results[-1] is None:
            why = f"exit {rc}" if rc else f"no valid result in {part.name}"
            print(f"  {run}: failed ({why}): {last_line(log)} | log: {log}", flush=True)
            return "failed"
    result = {"sts": trained[1].get("sts"), **(trained[1].get("train") or {})} if trained else results[0]
    second = results[-1] if then else {}
    rec = {
        "experiment": run.exp, "variant": run.v.name, "seed": run.seed, "key": key, "command": shown(cmd),
        "model_sha256": model_sha256(cmd[cmd.index("--model") + 1]),  # which weights the model's name meant
        **({"then": shown(then)} if then else {}), "seconds": time.time() - t0, "sts": result.get("sts"),
        **({"trained_as": trained[0].relative_to(run.folder.parents[1]).as_posix()} if trained else {}),  # in out
        "transfer": second.get("transfer") or result.get("transfer"),
        "train": None if run.v.evaluate_only else {k: result[k] for k in TRAIN_KEYS if k in result}}
    write_json(run.path(".json"), rec)
    print(f"  {run}: done in {(time.time() - t0) / 60:.1f} min | {headline(rec)} | sweep "
          f"{(time.time() - t_sweep) / 60:.1f} min", flush=True)
    return "ran"


@functools.cache
def model_sha256(model):
    """The sha256 of the base model's weights, once per sweep (checkpoint.weights_sha256)."""
    return weights_sha256(model)


def headline(rec):
    """A record's main figures, for the progress line."""
    parts = [f"STS avg {x:.2f}" for x in [get(rec, "sts", "avg", "all")] if number(x)]
    parts += [f"STS-B {x:.2f}" for x in [get(rec, "sts", "STSBenchmark", "all")] if number(x) and not parts]
    parts += [f"transfer avg {x:.2f}" for x in [get(rec, "transfer", "avg")] if number(x)]
    return ", ".join(parts) or "no scores"


def transfer_text(data_dir, dest, n=17256, seed=0):
    """A training file of n sentences drawn from MR, CR, SUBJ and MPQA (the SentEval transfer tasks' text)."""
    if not dest.exists():
        sents = [s for task in ("MR", "CR", "SUBJ", "MPQA") for s in data.load_transfer(task, data_dir)["all"][0] if s]
        random.Random(seed).shuffle(sents)
        write_text(dest, "\n".join(sents[:n]) + "\n")
    return dest

# -----------------------------------------------------------------------------
# a sweep: every run once, shared with other sweeps of the same folder

POLL = 5.0  # seconds between looks at the runs another sweep holds


def run_one(run, args, extra, text, tag, t_sweep):
    """Run one variant x seed unless it is finished, held or can be copied: (status, detail), status one of 'done',
    'copied', 'ran', 'failed', 'held' (detail: its lock and owner), 'bad' (detail: the line naming a bad record or
    lock)."""
    exp, record = EXPERIMENTS[run.exp], run.path(".json")
    if record.exists():
        rec, why = read_record(record, needs(exp, run.v))
        return ("done", None) if rec else ("bad", bad_record_line(record, why))  # the report names it
    key, cmd, then = commands(run, args, extra, text)
    run.folder.mkdir(parents=True, exist_ok=True)
    lock = record.with_name(f".{record.name}.lock")  # output_lock's name for it
    try:
        with output_lock(record):
            if record.exists():  # finished by another process between our look and our lock
                return "done", None
            same = None if exp.fresh else find_finished(Path(args.out), key, run.stem, needs(exp, run.v))
            if same:
                write_json(record, {**same[1], "same_as": same[0].relative_to(args.out).as_posix()})
                return "copied", same[0]
            trained = None if exp.fresh or not then else find_trained(Path(args.out), key, run.stem)
            return execute(run, key, cmd, then, tag, t_sweep, trained), run.path(".log")
    except OutputLocked:
        return "held", f"{lock} (pid {owner(lock)})"
    except LoadError as e:  # the lock path is a folder, or a file we may not open
        return "badlock", f"warning: {e}; if no sweep is running on {args.out}, remove {lock} and re-run"


def owner(lock):
    """The pid a lock file names, as far as it can be read."""
    try:
        return lock.read_text(errors="replace").strip() or "?"
    except OSError:
        return "?"


STATUS = {"done": "already finished", "ran": "run now", "copied": "copied", "others": "run by another process",
          "failed": "failed", "held": "held by another process", "bad": "not run (a bad record)",
          "badlock": "not run (a bad lock)"}


def sweep(name, args, extra, data_dir):
    """Every run of the experiment once: ours, then (unless --no-wait) those other sweeps held, then the report
    and one summary line. Returns the exit status: 1 when a run failed or could not be run, else 0."""
    t0, runs, out = time.time(), plan(name, args.seeds, args.out, args.variants), Path(args.out)
    uses_text = any(TRANSFER_TEXT in r.v.flags for r in runs)  # the rows this sweep runs (--variants)
    text = transfer_text(data_dir, out / "transfer-text.txt") if uses_text else None
    tally, held = {s: [] for s in STATUS}, []
    for i, run in enumerate(runs, 1):
        tag = f"[{i}/{len(runs)} | {(time.time() - t0) / 60:.1f} min]"
        status, detail = run_one(run, args, extra, text, tag, t0)
        if status == "held" and not args.no_wait:
            held.append((tag, run, detail))
        else:
            tally[status].append(detail)
        said = {"done": "finished earlier", "copied": f"copied from {detail}", "held": f"held by {detail}"}
        if status in said:
            print(f"{tag} {run}: {said[status]}", flush=True)
        elif status == "badlock":
            print(detail, file=sys.stderr, flush=True)
    wait_for_others(held, args, extra, text, t0, tally)
    if not report(name, out):
        print(f"no finished runs of {name} to report yet", flush=True)
    counts = [f"{len(d)} {STATUS[s]}" + (f" ({'; '.join(map(str, d))})" if s in ("held", "failed") else "")
              for s, d in tally.items() if d]
    print(f"{name}: {len(runs)} runs: {', '.join(counts)}", flush=True)
    return 1 if any(tally[s] for s in ("failed", "held", "bad", "badlock")) else 0


def wait_for_others(held, args, extra, text, t0, tally):
    """The runs that other live processes held during our pass: look again every POLL seconds until each has its
    record; a run whose owner is gone without one is run here. A line a minute says what we wait for."""
    said = 0.0
    while held:
        if time.time() - said >= 60:
            print(f"waiting for {len(held)} run(s) held by other processes: {'; '.join(d for _, _, d in held)}",
                  flush=True)
            said = time.time()
        time.sleep(POLL)
        for item in list(held):
            tag, run, _ = item
            status, detail = run_one(run, args, extra, text, tag, t0)
            if status == "held":
                continue
            held.remove(item)
            tally["others" if status == "done" else status].append(detail)
            if status == "done":
                print(f"{tag} {run}: finished by another process", flush=True)
            elif status == "badlock":
                print(detail, file=sys.stderr, flush=True)

# -----------------------------------------------------------------------------
# reporting


def ms(xs):
    """[mean, std] over seeds; std: the sample standard deviation (ddof=1), 0 for one run."""
    xs = np.asarray(xs, dtype=float)
    return [float(xs.mean()), float(xs.std(ddof=1)) if len(xs) > 1 else 0.0]


def step_ms(x):
    """A record's time per step: one figure (or, in records written before the step was timed whole, its phases)."""
    return sum(x.values()) if isinstance(x, dict) else float(x)


def summarize_variant(v, recs):
    """{seeds, paper, sts: {task: [mean, std]}, transfer: {task: [mean, std]}, transfer_n, and the times} over v's
    records; an STS task is in only when every record has it, transfer is over the records that have all of it
    (the leaderboard's transfer runs on the first seed only)."""
    row = {"seeds": [r.get("seed") for r in recs], "paper": v.paper}
    with_transfer = [r for r in recs if all(number(get(r, "transfer", t, "acc")) for t in data.TRANSFER)
                     and number(get(r, "transfer", "avg"))]
    for block, tasks, key, rs in (("sts", [*TASKS, "avg"], "all", recs),
                                  ("transfer", [*data.TRANSFER, "avg"], "acc", with_transfer)):
        cols = {t: [get(r, block, t, key) if t != "avg" or block == "sts" else get(r, block, t) for r in rs]
                for t in tasks}
        cols = {t: ms(xs) for t, xs in cols.items() if xs and all(map(number, xs))}
        if cols:
            row[block] = cols
    row["transfer_n"] = len(with_transfer)
    if v.evaluate_only:
        secs = [get(r, "sts", "seconds") for r in recs]
        if all(map(number, secs)):
            row["inference_seconds"] = ms(secs)
        stsb = [get(r, "sts", "task_seconds", "STSBenchmark") for r in recs]  # the STS-B test set alone (leaderboard)
        if all(map(number, stsb)):
            row["stsb_seconds"] = ms(stsb)
        return row
    train = [r["train"] for r in recs]
    row.update({k: ms([t[k] for t in train]) for k in ("wall_seconds", "test_seconds")})
    row["ms_per_step"] = ms([step_ms(t["ms_per_step"]) for t in train])
    row["best_step"] = ms([t["best_step"] for t in train]) if all(number(t.get("best_step")) for t in train) else None
    row["train_seconds"] = ms([t.get("fit_seconds", t["wall_seconds"]) for t in train])  # a fit: the fit alone
    row["inference_seconds"] = row["test_seconds"]
    return row


def summarize(name, out):
    """({variant: row} over the finished valid runs, [(path, what is wrong)] of the records left out)."""
    recs, bad = load_records(name, Path(out))
    return {v.name: summarize_variant(v, recs[v.name]) for v in EXPERIMENTS[name].variants if v.name in recs}, bad


def cell(x, n):
    return "" if x is None else f"{x[0]:.2f} +- {x[1]:.2f}" if n > 1 else f"{x[0]:.2f}"


def table(head, rows):
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *["| " + " | ".join(r) + " |" for r in rows]]


def sts_table(exp, summary, paper=True):
    """The 7 STS tasks and their average, mean +- std over seeds; the drop from a reference; the paper's figures."""
    blocks = sorted({b for v in exp.variants for b in v.paper}) if paper else []
    refs = sorted(set(exp.drops.values()))
    drop = [f"avg - {refs[0]}" if len(refs) == 1 else "avg - reference"] if refs else []
    head = ["variant", "n", *[SHORT.get(t, t) for t in TASKS], "avg", *drop, *[f"paper ({b})" for b in blocks]]
    rows = []
    for v, r in summary.items():
        n, ref = len(r["seeds"]), summary.get(exp.drops.get(v), {}).get("sts", {}).get("avg")
        mine = r.get("sts", {}).get("avg")
        d = [f"{mine[0] - ref[0]:+.2f}" + (f" ({exp.drops[v]})" if len(refs) > 1 else "") if ref and mine else ""
             ] if drop else []
        rows.append([v, str(n), *[cell(r.get("sts", {}).get(t), n) for t in [*TASKS, "avg"]], *d,
                     *[r["paper"].get(b, "") for b in blocks]])
    lines = [f"Spearman x100, `all` protocol, mean +- std over seeds. {exp.note}", "", *table(head, rows)]
    trained = {v: r for v, r in summary.items() if "wall_seconds" in r}
    if trained and exp.table == "sts":
        lines += ["", "Time per run, mean over seeds: train wall time, time per training step, STS-B test inference "
                  "time, best dev step.", ""]
        lines += table(["variant", "train (min)", "ms/step", "STS-B test inference (s)", "best step"], [
            [v, f"{r['wall_seconds'][0] / 60:.1f}", f"{r['ms_per_step'][0]:.0f}", f"{r['test_seconds'][0]:.1f}",
             "" if r["best_step"] is None else f"{r['best_step'][0]:.0f}"] for v, r in trained.items()])
    return lines


def transfer_table(exp, summary):
    """Table 4: accuracy per transfer task and the average, mean +- std over seeds, the paper's average beside."""
    blocks = sorted({b for v in exp.variants for b in v.paper})
    head = ["variant", "n", *data.TRANSFER, "avg", *[f"paper avg ({b})" for b in blocks]]
    rows = [[v, str(len(r["seeds"])), *[cell(r.get("transfer", {}).get(t), len(r["seeds"]))
                                        for t in [*data.TRANSFER, "avg"]], *[r["paper"].get(b, "") for b in blocks]]
            for v, r in summary.items()]
    return [f"SentEval transfer accuracy x100, mean +- std over seeds. {exp.note}", "", *table(head, rows)]


def efficiency_table(exp, summary):
    """Table 6: training and STS-B test inference seconds, and both as multiples of mean pooling's inference time,
    ours beside the paper's."""
    base = summary.get("mean", {}).get("inference_seconds", [None])[0]
    paper_base = float(next(v.paper["inference (s)"] for v in exp.variants if v.name == "mean"))

    def x(s, b):
        return "" if s is None or not b else f"x{s / b:.2f}"
    rows = []
    for v in exp.variants:
        r, p = summary.get(v.name), {k: float(s) for k, s in v.paper.items()}
        if r is None:
            continue
        train, inf = r.get("train_seconds", [None])[0], r.get("inference_seconds", [None])[0]
        rows.append([v.name, str(len(r["seeds"])), "" if train is None else f"{train:.1f}",
                     "" if inf is None else f"{inf:.2f}", x(train, base), x(inf, base),
                     x(p.get("train (s)"), paper_base), x(p.get("inference (s)"), paper_base),
                     " + ".join(f"{p[k]:.2f}" for k in ("train (s)", "inference (s)") if k in p)])
    head = ["variant", "n", "train (s)", "inference (s)", "train / mean inf.", "inference / mean inf.",
            "paper train / mean inf.", "paper inference / mean inf.", "paper seconds (train + inference)"]
    return [f"Seconds, mean over seeds; x: a multiple of mean pooling's STS-B test inference time. {exp.note}", "",
            *table(head, rows)]


def drops(exp, summary):
    """{variant: (reference, [STS-B drop, avg drop])} of the runs trained on other text, from the means."""
    out = {}
    for v, ref in exp.drops.items():
        a, b = summary.get(v, {}).get("sts", {}), summary.get(ref, {}).get("sts", {})
        if all(t in a and t in b for t in ("STSBenchmark", "avg")):
            out[v] = (ref, [a[t][0] - b[t][0] for t in ("STSBenchmark", "avg")])
    return out


def drops_table(exp, summary):
    """Figure 4: the STS table, then each drop (trained on other text minus trained on STS-B) beside the paper's."""
    paper = {v.name: v.paper for v in exp.variants}
    rows = [[v, ref, f"{d[0]:+.2f}", f"{d[1]:+.2f}", paper[v].get("STS-B", ""), paper[v].get("avg", "")]
            for v, (ref, d) in drops(exp, summary).items()]
    return [*sts_table(exp, summary, paper=False), "", "Drop from training on other text (the mean over seeds "
            "minus the reference's mean); the paper trained on NLI instead of STS-B.", "",
            *table(["variant", "minus", "STS-B", "7-task avg", "paper STS-B", "paper avg"], rows)]


def leaderboard_table(exp, summary):
    """Every method on one harness: the STS table, the transfer average (its n: the runs that have it) and the cost
    of each method (train time, time per step, STS-B test inference), each method's own paper figure beside."""
    head = ["method", "n", *[SHORT.get(t, t) for t in TASKS], "avg", "transfer avg (n)", "train (min)", "ms/step",
            "STS-B test inference (s)", "own paper (BERT-base)"]
    rows = []
    for v in exp.variants:
        r = summary.get(v.name)
        if r is None:
            continue
        n, sts, tr = len(r["seeds"]), r.get("sts", {}), r.get("transfer", {}).get("avg")
        train, step = r.get("train_seconds"), r.get("ms_per_step")
        inf = r.get("inference_seconds") if "wall_seconds" in r else r.get("stsb_seconds")
        rows.append([v.name, str(n), *[cell(sts.get(t), n) for t in [*TASKS, "avg"]],
                     f"{cell(tr, r['transfer_n'])} ({r['transfer_n']})" if tr else "",
                     f"{train[0] / 60:.1f}" if train else "", f"{step[0]:.0f}" if step and step[0] else "",
                     f"{inf[0]:.1f}" if inf else "", next(iter(v.paper.values()), "")])
    return [f"Spearman x100, `all` protocol, mean +- std over seeds; transfer: accuracy x100. {exp.note}", "",
            *table(head, rows)]


TABLES = {"sts": sts_table, "transfer": transfer_table, "efficiency": efficiency_table, "drops": drops_table,
          "leaderboard": leaderboard_table}


def report(name, out, plot=None):
    """Print the experiment's tables and write results.md and results.json beside its runs (a folder we may not
    write to: the tables are printed all the same). Returns the summary, or None when it has no valid runs."""
    out, exp = Path(out), EXPERIMENTS[name]
    summary, bad = summarize(name, out)
    for path, why in bad:
        print(bad_record_line(path, why), file=sys.stderr, flush=True)
    if not summary:
        return None
    lines = [f"## {name}: {exp.title}", "", *models_line(name, out), *TABLES[exp.table](exp, summary)]
    lines += [""] + [f"Missing: {p.parent.name}/{p.name} ({why})" for p, why in bad] if bad else []
    none = [v.name for v in exp.variants if v.name not in summary]
    lines += ["", f"No finished runs yet: {', '.join(none)}."] if none else []
    text = "\n".join(lines) + "\n"
    say(text)
    try:
        write_json(out / name / "results.json", {"experiment": name, "title": exp.title, "variants": summary,
                                                 **({"drops": drops(exp, summary)} if exp.drops else {})})
        write_text(out / name / "results.md", text)
    except OSError as e:  # report needs only read access
        print(f"note: the report files in {out / name} were not written ({e.strerror or e}); the tables above are "
              "complete", file=sys.stderr)
    if plot:
        plot_drops(exp, summary, plot)
    return summary


def models_line(name, out):
    """Which base model weights the records were measured on, by sha256 (a table must not mix two models of one
    name); records written before the hash was kept are counted apart."""
    recs, _ = load_records(name, out)
    shas = [r.get("model_sha256") for rs in recs.values() for r in rs]
    known = sorted({s for s in shas if s})
    if not known:
        return []
    line = f"Base model weights: sha256 {', '.join(s[:16] for s in known)}"
    if len(known) > 1:
        line += f" (warning: {len(known)} different weights under one model name: these rows are not comparable)"
        print(f"warning: {out / name}: its records were measured on {len(known)} different base weights", file=sys.stderr)
    old = shas.count(None)
    return [line + (f"; {old} older record(s) name none" if old else "") + ".", ""]


def plot_drops(exp, summary, path):
    """The paper's Figure 4 as bars: STS-B and the 7-task average of each method trained on STS-B's sentences and on
    other text, the drop written over each pair, the paper's drop in the legend."""
    import matplotlib
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt
    pairs, paper = drops(exp, summary), {v.name: v.paper for v in exp.variants}
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, (j, (t, label)) in zip(axes, enumerate((("STSBenchmark", "STS-B"), ("avg", "avg")))):
        heights = []
        for i, (v, (ref, d)) in enumerate(pairs.items()):
            a, b = summary[ref]["sts"][t][0], summary[v]["sts"][t][0]
            ax.bar([3 * i, 3 * i + 1], [a, b], color=["tab:blue", "tab:orange"])
            ax.text(3 * i + 0.5, max(a, b) + 0.3, f"{d[j]:+.2f} (paper {paper[v].get(label, '?')})", ha="center",
                    fontsize=8)
            heights += [a, b]
        ax.set_ylim(min(heights, default=0) - 5, max(heights, default=100) + 2)  # the drops are a few points
        ax.set_xticks([3 * i + 0.5 for i in range(len(pairs))], [ref for ref, _ in pairs.values()])
        ax.set_title(f"{'STS-B' if j == 0 else '7 STS tasks, average'}: Spearman x100")
    fig.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in ("tab:blue", "tab:orange")],
               labels=["trained on STS-B's sentences", "trained on the transfer tasks' text"], loc="lower center",
               ncol=2, fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=120)
    print(f"figure written to {path}")


def list_experiments():
    lines = []
    for name, exp in EXPERIMENTS.items():
        lines.append(f"{name}: {exp.title}")
        for v in exp.variants:
            kind = ("evaluate.py (untrained)" if v.evaluate_only else "train.py" + ("" if v.seeded else ", once")
                    + (f", then evaluate.py {' '.join(v.then)}" if v.then else "")
                    + (f" (the first {exp.then_seeds} seed(s) only)" if v.then and exp.then_seeds else ""))
            paper = "; ".join(f"paper {b}: {x}" for b, x in v.paper.items())
            lines.append(f"  {v.name:<22} {kind} {' '.join(v.flags) or '(defaults)'}" + (f" | {paper}" if paper else ""))
        if exp.note:
            lines.append(f"  note: {exp.note}")
    say("\n".join(lines))


def say(text):
    """Print text to stdout. A reader that closed the pipe early (`report leaderboard | head`) has all it wanted:
    the rest of the output goes nowhere, quietly, and the work goes on (report still writes its files)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that the flush at exit cannot fail again

# -----------------------------------------------------------------------------
# the command line: every flag checked before any work starts


class Stop(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP during a sweep (a KeyboardInterrupt, so that no `except Exception` swallows it)."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def stop_on_signals():
    """While the sweep runs, SIGINT, SIGTERM and SIGHUP raise Stop: the run in flight is stopped with its process
    group (run_child) and the locks are released on the way out. A signal ignored when we started stays ignored
    (`nohup python experiments.py ...` keeps running when its terminal closes)."""
    if threading.current_thread() is not threading.main_thread():  # signals reach only the main thread
        yield
        return

    def stop(signum, frame):
        raise Stop(signum)
    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
           if signal.getsignal(s) != signal.SIG_IGN}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def seed_value(s):
    """A --seeds value: what torch.manual_seed and numpy take, a non-negative integer below 2^32."""
    try:
        x = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
    if not 0 <= x < 2 ** 32:
        raise argparse.ArgumentTypeError(f"{s} is not in 0 .. 2^32 - 1")
    return x


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1].strip(), epilog=EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)  # so that train.py's --seed is not read as --seeds
    p.error = die  # a bad flag is one line (argparse would print the whole usage first)
    p.add_argument("command", help=f"list | report NAME | an experiment: {' | '.join(EXPERIMENTS)}")
    p.add_argument("name", nargs="?", help="with report: the experiment")
    p.add_argument("--model", default="bert-base-uncased", help="base model, as train.py --model (default: "
                   "%(default)s)")
    p.add_argument("--seeds", type=seed_value, nargs="+", default=PAPER_SEEDS[:3],
                   help=f"the seeds of each trained variant (default: 1 2 3; the paper's 8: "
                        f"{' '.join(map(str, PAPER_SEEDS))})")
    p.add_argument("--out", default="runs", help="folder of the runs and reports (default: %(default)s)")
    p.add_argument("--data-dir", default=None, help="data folder (default: $SG_DATA, else ./data)")
    p.add_argument("--variants", nargs="+", metavar="NAME", help="run only these variants (rows) of the experiment, "
                   "in this order (e.g. the rows you need first); the report shows every finished run (default: all)")
    p.add_argument("--no-wait", action="store_true", help="leave the runs another live sweep holds (exit status 1) "
                   "instead of waiting for them before the report (default: wait)")
    p.add_argument("--plot", help="with report figure4: draw the paper's Figure 4 bars to this .png (needs matplotlib)")
    return p.parse_known_args(argv)


def check_out(out):
    """A sweep's --out: a folder (made if missing) that we can write to, tried with a small file."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        die(f"--out {out} is a file, not a folder")
    probe = temp_path(out / "probe")
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_text(probe, "sgbert experiments.py: can this folder be written?\n")
        probe.unlink()
    except OSError as e:
        die(f"--out {out}: cannot write there ({e.strerror or e}); choose another folder or free some space")


def check_data(name, args, extra):
    """The data the experiment's runs read, looked at before any run: data.py's own line when something is missing."""
    exp = EXPERIMENTS[name]
    stsb = "--data" not in [g[0].partition("=")[0] for g in flag_groups(extra)] and any(
        not v.evaluate_only and "--data" not in v.flags for v in exp.variants)  # trains on STS-B's sentences
    try:
        data_dir = data.resolve_data_dir(args.data_dir, fetch=False, need_stsb=stsb)  # no download behind a sweep
        for task in TASKS:
            data.load_task(task, data_dir)
        for task in exp.transfer:
            data.load_transfer(task, data_dir)
    except data.DataError as e:
        die(e)
    return data_dir


def check_report(args):
    if args.name not in EXPERIMENTS:
        die(f"report {args.name or '(no name)'}: choose one of {', '.join(EXPERIMENTS)}")
    if args.variants:
        die("--variants chooses the rows a sweep runs; report shows every finished run (drop --variants)")
    if args.plot and not EXPERIMENTS[args.name].drops:
        die(f"--plot draws the drops of figure4 (or domain, precision); {args.name} has none")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            die("--plot needs matplotlib: pip install matplotlib (or drop --plot; the tables have the same numbers)")
        if not Path(args.plot).suffix.lower() == ".png" or not Path(args.plot).resolve().parent.is_dir():
            die(f"--plot {args.plot}: give a .png file name in an existing folder")


def main(argv=None):
    args, extra = get_args(argv)
    if args.command == "list":
        return list_experiments()
    if args.command == "report":
        check_report(args)
        summary = report(args.name, args.out, args.plot)
        if summary is None:
            die(f"no finished runs of {args.name} in {Path(args.out) / args.name}: is --out right?", code=1)
        return summary
    if args.command not in EXPERIMENTS:
        die(f"unknown experiment {args.command!r}: choose list, report or one of {', '.join(EXPERIMENTS)}")
    if args.name or args.plot:
        die(f"{args.name or '--plot'}: only `report` takes an experiment name or --plot")
    bad = [f for f in extra if f.partition("=")[0] in ("--out", "--json", "--seed", "--overwrite")]
    if bad:
        die(f"{bad[0]} is set per run by experiments.py (use --out for the sweep's folder, --seeds for the seeds)")
    names = [v.name for v in EXPERIMENTS[args.command].variants]
    unknown = [n for n in args.variants or [] if n not in names]
    if unknown:
        die(f"--variants {unknown[0]}: {args.command} has no such variant; choose from {' '.join(names)}")
    if len(set(args.seeds)) < len(args.seeds):
        die(f"--seeds {' '.join(map(str, args.seeds))}: a seed is given twice")
    idle = untaken(plan(args.command, args.seeds, args.out, args.variants), extra)
    if idle:
        die(f"{idle[0]} means nothing for any run of {args.command}" + (" --variants ..." if args.variants else "")
            + " (train.py refuses it for their methods, evaluate.py does not take it): drop it")
    check_out(args.out)
    data_dir = check_data(args.command, args, extra)
    try:
        with stop_on_signals():
            code = sweep(args.command, args, extra, data_dir)
    except KeyboardInterrupt as e:  # Stop, or Ctrl-C outside the handler's reach
        sig = getattr(e, "signum", signal.SIGINT)
        print(f"experiments.py: stopped by {signal.Signals(sig).name}; the run in flight was stopped, the finished "
              "runs are kept: re-run the same command to resume", file=sys.stderr)
        sys.exit(128 + sig)
    except OSError as e:  # e.g. the disk filled up during the sweep
        die(f"{e.filename or args.out}: {e.strerror or e}; the finished runs are kept: re-run the same command")
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()
