"""
The paper's experiments as data: each is a list of variants (train.py flags, or an untrained model's evaluation)
run over seeds, resumably, and reported as mean +- std over seeds beside the paper's figures. This file is the table
(EXPERIMENTS, the part a researcher edits) and the command line; sweep.py runs the runs, report.py makes the tables
(and `report-curve`'s: the curve experiment's rows over several models' folders, by tokens seen in pretraining).

Each run is `python -m lab.train ...` (or `python -m lab.evaluate ...` for an untrained baseline) in a subprocess
with a process group of its own, writing <out>/<experiment>/<variant>/seed-<s>.{safetensors,json,log} (eval.json
for an evaluation, fit.json for a fit that no seed changes, such as whitening: both run once). The record (.json)
appears, atomically, only when the run has finished, and only such a record counts: re-running the same command skips the finished runs, so a
killed sweep loses at most the run in flight. A record that is not valid JSON of a run's shape, or that a sweep finds to
be another run's (other flags or seed, other base weights, another text in its --data file: the table was edited, the
model replaced, the file rewritten), is named with what to do and left out of the tables, never run over. A run in
flight holds .seed-<s>.json.lock beside its record (outputs.output_lock: an flock, so the lock of a dead owner is
taken over), so sweeps of one experiment on one --out share its runs: each run is run once, and a sweep waits for the
runs that another live sweep holds before it reports (give such sweeps the same --seeds: the leaderboard's transfer step
goes to a sweep's first seed, so `--seeds 2 3` would give it to seed 2). A run whose command equals a finished run of
another experiment (SG-OPT with the defaults is in several) is not run again: its record is copied, naming the source
(except in table6, whose timings come from one sweep); a leaderboard row's copy gets its per-pair cosines from the
source's checkpoint (or says how to get them when it is gone). A run whose training equals such a run's and whose second
step differs (Table 4's SG-OPT: Table 1's, then transfer) takes that run's checkpoint, while it is still beside its
record and the file that run wrote (its sha256), and runs only its own second step. A row of a report averages the runs
of one setting (the flags but the seed, the base weights, the --data file's text): the sweep's own, or in `report` the
one most of the row's runs share; a run of another setting is named and left out. A sweep flag that a row sets itself
(recipe --lr) is refused: the row's own would win.

Exit status: 0 when every run of the sweep is finished; 1 when a run failed, was held by another process
(--no-wait), or has a bad record (or another run's) or lock; 2 for a usage error, ours or a run's (train.py's exit
2, which every run would repeat: the sweep stops at once); 128 + N when stopped by signal N (SIGINT, SIGTERM,
SIGHUP): the run in flight is stopped with its whole process group, the locks are released, and the same command
resumes the sweep.

References: Kim, Yoo, Lee, ACL 2021: Table 1 (main STS table), Table 4 (SentEval transfer), Table 5 (ablation),
Table 6 (efficiency), Figure 4 (domain robustness), appendix Table 9 (the 8 seeds).
"""
import argparse
import difflib
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import data
from lab import eval_data, sweep
from checkpoint import LoadError
from outputs import OutputError, check_output, same_path, temp_path, write_text
from cli import die, seed_value
from lab.report import CURVE_FOLDERS, report, report_curve, say
from lab.sweep import TRANSFER_TEXT

PAPER_SEEDS = [1, 2, 3, 4, 1234, 2345, 3456, 7890]  # appendix Table 9
RECIPE_LRS = ("1e-4", "3e-4", "5e-4")  # the recipe experiment's peak learning rates
CURVE_SEEDS = {"sg-opt": (1, 2), "simcse": (1,)}  # report-curve's seeds of the trained rows: one n at every model
EXAMPLES = """examples:
  python -m lab.experiments list
  python -m lab.experiments table5 --model $M --seeds 1 2 3 --max-steps 300 --out results
  python -m lab.experiments table1 --model $M --seeds 1 2 3 4 1234 2345 3456 7890 --out results
  python -m lab.experiments leaderboard --model $M --variants promptbert sg-opt-mean --out results
  python -m lab.experiments report table5 --out results
  python -m lab.experiments report figure4 --out results --plot figure4.png
  python -m lab.experiments report effect --out results/raw/mini-5 --plot results/raw/mini-5/effect.png
  python -m lab.experiments report-curve results/raw results/raw/mini-2 --plot curve.png --json curve.json

Any other flag goes to every train.py run whose method takes it (methods.py: --whiten-dim to the whitening only,
--proj-size to the rows with the head f; e.g. --max-steps 300, --device cpu); evaluate.py runs get --device and
--eval-batch-size (as its --batch-size). A flag that no run of the sweep takes is refused, and so is any other
flag of list or report (report reads --out and --plot)."""


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
    significance: bool = False  # the report sets every row against its references (report.add_significance)
    references: tuple = ("simcse", "sg-opt")  # those rows (significance)
    cosines: bool = False  # the first seed's runs keep their per-pair cosines (the STS pairs' bootstrap)


WHITENING = Variant("whitening", ["--loss", "whitening"], seeded=False)
FLOW = Variant("flow", ["--loss", "flow"], {"BERT-base": "68.77 +- 0.07", "SBERT-base": "77.42"})
SG_OPT = Variant("sg-opt", [], {"BERT-base": "74.62 +- 0.25"})
SG_OPT_MEAN = ["--pooling", "mean", "--eval-pooling", "mean"]  # ours: c_i = BERT_T's mean-pooled last layer
TRANSFER_PAPER = ["--tasks", "transfer", "--transfer-config", "paper"]  # evaluate.py: Table 4's protocol
OWN = "BERT-base, its own paper"  # the leaderboard's paper column: each method's own paper
# the methods after 2021 (methods.py), each with its own paper's BERT-base 7-task average (SSCL's README reports
# none; sg-opt-sscl is ours); in the methods experiment (STS only) and the leaderboard (with transfer)
LATER_PAPER = {"esimcse": "78.27", "diffcse": "78.49", "sscl": None, "sg-opt-sscl": None}
LATER = [Variant(n, ["--loss", n], {"BERT-base": p} if p else {}) for n, p in LATER_PAPER.items()]
UNTRAINED = [
    Variant("cls", ["--pooling", "cls"], {"BERT-base": "31.40", "SBERT-base": "71.32"}, evaluate_only=True),
    Variant("mean", ["--pooling", "mean"], {"BERT-base": "52.57", "SBERT-base": "74.85"}, evaluate_only=True),
    Variant("first-last", ["--pooling", "first-last"], evaluate_only=True),
    Variant("wk", ["--pooling", "wk"], {"BERT-base": "25.58", "SBERT-base": "75.59"}, evaluate_only=True),
]
EXPERIMENTS = {
    "table1": Experiment("Table 1: untrained poolings, the post-hoc baselines and SG / SG-OPT", [
        *UNTRAINED,
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
    "dropout": Experiment("SG-OPT with BERT's dropout off in BERT_T and BERT_F (for a model pretrained without it)", [
        SG_OPT,
        Variant("dropout-off", ["--dropout", "off", "--teacher-dropout", "off"]),
    ], "pretrain.py's default pretrains with dropout off (Cramming), and SG-OPT trains BERT_T, and by the official "
       "code's default makes BERT_F's views, with BERT's dropout 0.1 on: such a model meets dropout first in "
       "fine-tuning (probe.py measures how far it moves the vectors). dropout-off takes it away on both sides."),
    "recipe": Experiment("A small-model recipe: peak lr 1e-4 / 3e-4 / 5e-4 over a larger unlabelled set", [
        *[Variant(f"simcse-lr-{lr}", ["--loss", "simcse", "--lr", lr]) for lr in RECIPE_LRS],
        *[Variant(f"sg-opt-lr-{lr}", ["--lr", lr]) for lr in RECIPE_LRS],
    ], "For a 4-layer model: SimCSE and SG-OPT at a small model's learning rates (SCT, TACL 2023, fine-tunes "
       "BERT-Mini at 3e-4 to 5e-4) for one epoch of the set given with --data (e.g. `python -m lab.pretrain --add-text "
       "text/packages.txt --sample 32768 --sample-out text/recipe-32k.txt`: 32,768 sentences of the pretraining text, "
       "none an evaluation sentence: 2,048 steps of 16, 1.9x the paper's one epoch of STS-B), STS-B dev every 50 "
       "steps; each method's other settings are its own recipe's. Pick the row on STS-B dev (the records' dev) only. "
       "SCT's own (batch 128, 10 epochs of ~1M NLI sentences) and even 2 epochs here are beyond a 2-core CPU's "
       "session: add --epochs N to run more."),
    "precision": Experiment("bf16 autocast vs fp32 (the official code's precision)", [
        Variant("fp32", ["--precision", "fp32"]),  # train.py's default, named: the row says it (and its key is kept)
        Variant("bf16", ["--precision", "bf16"]),
    ], "bf16: autocast of BERT_F, BERT_T and the head; the similarity, softmax, loss, regulariser and the evaluation "
       "stay fp32. Read the bf16 row against the fp32 row's seed spread.", drops={"bf16": "fp32"}),
    "methods": Experiment("The trained methods on one harness: same data, seeds and evaluator (STS only)", [
        Variant("sg-opt", [], {"BERT-base": "74.62 +- 0.25"}),
        Variant("consert", ["--loss", "consert"], {"BERT-base": "72.74"}),
        Variant("simcse", ["--loss", "simcse"], {"BERT-base": "76.25"}),
        Variant("promptbert", ["--loss", "promptbert"], {"BERT-base": "78.54 +- 0.15"}),
        Variant("sg-opt-mean", SG_OPT_MEAN),
        *LATER,
    ], "Each method with its own recipe (methods.py: tau, batch, max length, lr, pooling, augmentations), "
       "trained on the STS-B sentences; the paper figures are each method's own paper (ConSERT's trained on STS+SICK "
       "text for 10 epochs; SimCSE's on 10^6 Wikipedia sentences; PromptBERT's, ESimCSE's, SSCL's and DiffCSE's on "
       "SimCSE's). sg-opt-mean and sg-opt-sscl are ours: SG-OPT with BERT_T's mean-pooled last layer as c_i, and "
       "SG-OPT with BERT_T's own two layers below the last as negatives. diffcse needs a masked-LM generator of the "
       "model's vocabulary: the model's own (a pretrain.py model), else --generator MODEL (MiniLM: a raw model's). The "
       "leaderboard's trained rows are these runs (its first seed's checkpoints take its transfer step).",
       significance=True),
    "curve": Experiment("The paper's effect as a function of pretraining: [CLS], mean, whitening, SG-OPT, SimCSE", [
        Variant("cls", ["--pooling", "cls"], {"BERT-base": "31.40"}, evaluate_only=True),
        Variant("mean", ["--pooling", "mean"], {"BERT-base": "52.57"}, evaluate_only=True),
        WHITENING,  # the SG paper has no BERT-base whitening (the whitening paper's 69.21 is wmean: not comparable)
        SG_OPT,
        Variant("simcse", ["--loss", "simcse"], {"BERT-base": "76.25 (SimCSE)"}),
    ], "For each model a pretraining keeps (pretrain.py --keep-at: weights/<name>-step<N>/) and the final ones, "
       "each with its own --out holding the model's pretraining record (weights/<name>/pretrain.json copied to "
       "<out>/pretrain/pretrain.json): `--variants cls mean whitening sg-opt --seeds 1 2`, then `--variants simcse "
       "--seeds 1` (a run of the same command that table1 or methods finished on that --out is copied, not run). "
       "`report-curve OUT [OUT ...]` sets the models side by side by tokens seen, a row's runs from curve/, else "
       "effect/, else table1/, else methods/, SG-OPT at seeds 1 2 and SimCSE at seed 1 at every model unless --seeds: at what "
       "pretraining does SG-OPT lift [CLS] above mean pooling?", drops={"sg-opt": "mean"}),
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
        *[Variant(n, ["--loss", n], {OWN: p} if p else {}, then=TRANSFER_PAPER) for n, p in LATER_PAPER.items()],
    ], "Each method with its own recipe (methods.py) for one epoch of the 17,256 STS-B sentences: the common "
       "budget is the data, not the steps (1,079 steps of 16 for the SG family, 270 of 64 for SimCSE, ESimCSE, SSCL "
       "and DiffCSE, 180 of 96 for ConSERT, 68 of 256 for PromptBERT, 269 of 64 for the flow). diffcse: a model "
       "without a masked-LM head takes --generator MODEL of its vocabulary (MiniLM: a raw model's). Transfer: the 7 SentEval tasks, the paper's "
       "classifier, on the first seed's run of each method. The paper figures are each method's own paper on "
       "BERT-base ('all' protocol unless marked; whitening and flow: their papers' 'target' fits in 'wmean').",
       table="leaderboard", transfer=tuple(data.TRANSFER), then_seeds=1, significance=True, cosines=True),
    "effect": Experiment("The paper's block on a raw BERT: does SG-OPT lift [CLS] above mean pooling?", [
        *UNTRAINED,
        WHITENING,
        FLOW,
        Variant("sg", ["--loss", "sg"], {"BERT-base": "72.17"}),
        SG_OPT,
        Variant("simcse", ["--loss", "simcse"], {"BERT-base": "76.25 (SimCSE)"}),
        Variant("sg-opt-mean", SG_OPT_MEAN),
    ], "Table 1's rows, SimCSE and ours (sg-opt-mean) on one raw model, every row set against the untrained [CLS] "
       "and mean pooling: the paper's claim is that SG-OPT lifts BERT's [CLS] (31.40) far above mean pooling "
       "(52.57). The paper: SG-OPT and SG at 8 seeds (1 2 3 4 1234 2345 3456 7890), the others at 3: `--seeds 1 2 3`, "
       "then `--variants sg sg-opt --seeds 4 1234 2345 3456 7890`. The first seed's runs keep their per-pair "
       "cosines (the STS pairs' bootstrap).",
       significance=True, references=("cls", "mean"), cosines=True),
}


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


# -----------------------------------------------------------------------------
# the command line: every flag checked before any work starts


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1].strip(), epilog=EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)  # so that train.py's --seed is not read as --seeds
    p.error = die  # a bad flag is one line (argparse would print the whole usage first)
    p.add_argument("command", help=f"list | report NAME | report-curve OUT [OUT ...] | an experiment: "
                   f"{' | '.join(EXPERIMENTS)}")
    p.add_argument("name", nargs="*", help="with report: the experiment; with report-curve: the results folders to set "
                   "side by side, one a model (its runs' --out, holding its pretrain/pretrain.json)")
    p.add_argument("--model", default="bert-base-uncased", help="base model, as train.py --model (default: "
                   "%(default)s)")
    p.add_argument("--seeds", type=seed_value, nargs="+",
                   help=f"the seeds of each trained variant (default: 1 2 3; the paper's 8: "
                        f"{' '.join(map(str, PAPER_SEEDS))}); with report-curve: the seeds each trained row averages "
                        f"(default: {'; '.join(v + ' ' + ' '.join(map(str, s)) for v, s in CURVE_SEEDS.items())})")
    p.add_argument("--out", default="runs", help="folder of the runs and reports (default: %(default)s)")
    p.add_argument("--data-dir", default=None, help="data folder (default: $SG_DATA, else ./data)")
    p.add_argument("--variants", nargs="+", metavar="NAME", help="run only these variants (rows) of the experiment, "
                   "in this order (e.g. the rows you need first); the report shows every finished run of each row's "
                   "setting (default: all)")
    p.add_argument("--no-wait", action="store_true", help="leave the runs another live sweep holds (exit status 1) "
                   "instead of waiting for them before the report (default: wait)")
    p.add_argument("--plot", help="with report figure4: draw the paper's Figure 4 bars to this .png; with report "
                   "effect: each row's bar beside the papers' BERT-base bar; with "
                   "report-curve: the curve, x = tokens seen (needs matplotlib)")
    p.add_argument("--json", help="with report-curve: write its table to this .json and a .md beside it (default: "
                   "beside --plot, e.g. curve.png -> curve.json, curve.md; without --plot, printed only)")
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


def check_data(exp, args, extra):
    """The data the experiment's runs read, looked at before any run: data.py's own line when something is missing."""
    stsb = "--data" not in [g[0].partition("=")[0] for g in sweep.flag_groups(extra)] and any(
        not v.evaluate_only and "--data" not in v.flags for v in exp.variants)  # trains on STS-B's sentences
    try:
        data_dir = data.resolve_data_dir(args.data_dir, fetch=False, need_stsb=stsb)  # no download behind a sweep
        for task in data.TASKS:
            data.load_task(task, data_dir)
        for task in exp.transfer:
            eval_data.load_transfer(task, data_dir)
    except data.DataError as e:
        die(e)
    return data_dir


def check_sweep(args, extra):
    """A sweep's flags: the experiment and its rows, the seeds, and no flag that no run of it takes."""
    if args.command not in EXPERIMENTS:
        die(f"unknown experiment {args.command!r}: choose list, report, report-curve or one of "
            f"{', '.join(EXPERIMENTS)}")
    if args.name or args.plot:
        die(f"{args.name or '--plot'}: only `report` takes an experiment name or --plot (and `report-curve` folders)")
    bad = ["--json"] * bool(args.json) + [f for f in extra if f.partition("=")[0] in ("--out", "--seed",
                                                                                      "--overwrite")]
    if bad:
        die(f"{bad[0]} is set per run by experiments.py (use --out for the sweep's folder, --seeds for the seeds)")
    names = [v.name for v in EXPERIMENTS[args.command].variants]
    unknown = [n for n in args.variants or [] if n not in names]
    if unknown:
        die(f"--variants {unknown[0]}: {args.command} has no such variant; choose from {' '.join(names)}")
    if len(set(args.seeds)) < len(args.seeds):
        die(f"--seeds {' '.join(map(str, args.seeds))}: a seed is given twice")
    runs = sweep.plan(args.command, EXPERIMENTS[args.command], args.seeds, args.out, args.variants)
    idle = sweep.untaken(runs, extra)
    if idle:
        die(f"{idle[0]} means nothing for any run of {args.command}" + (" --variants ..." if args.variants else "")
            + " (train.py refuses it for their methods, evaluate.py does not take it): drop it")
    for flag, rows in sweep.overridden(runs, extra).items():
        die(f"{flag} is set by the row(s) {', '.join(rows)} of {args.command} themselves (`python -m lab.experiments "
            f"list` shows their flags), and a row's flags win over the sweep's: these runs would ignore it; drop "
            f"{flag}, or choose rows that do not set it with --variants")


def check_report(args):
    if args.name not in EXPERIMENTS:
        die(f"report {args.name or '(no name)'}: choose one of {', '.join(EXPERIMENTS)}")
    if args.variants:
        die("--variants chooses the rows a sweep runs; report shows every finished run (drop --variants)")
    if args.json:
        die(f"--json: report {args.name} writes results.json beside its runs (--json is report-curve's)")
    if args.plot and args.name == "curve":
        die("--plot: the curve is drawn over several models: python -m lab.experiments report-curve OUT [OUT ...] --plot "
            "FILE.png")
    if args.plot and not EXPERIMENTS[args.name].drops and args.name != "effect":
        die(f"--plot draws the effect's bars, or the drops of figure4 (or domain, precision); {args.name} has none")
    if args.plot:
        check_plot(args.plot)


def check_plot(plot):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        die("--plot needs matplotlib: pip install matplotlib (or drop --plot; the tables have the same numbers)")
    try:
        check_output(plot, ".png")  # a .png in a folder we can write to, before the report is made
    except OutputError as e:
        die(f"--plot {e}")


def check_curve(args, extra):
    """report-curve's folders, seeds and outputs, before any record is read. Returns the .json to write, or None."""
    if not args.name:
        die("report-curve needs the results folders to set side by side: OUT [OUT ...], each a model's --out with "
            "its pretrain/pretrain.json")
    if extra or args.variants:
        flag = extra[0].partition("=")[0] if extra else "--variants"
        close = near_miss(flag, ("--seeds", "--plot", "--json")) if extra else ""
        die(f"{flag}: report-curve takes its folders (first), --seeds, --plot and --json only{close}")
    for out in args.name:
        if not Path(out).is_dir():
            die(f"{out} is not a folder: give the --out of each model's runs")
    twice = [b for i, b in enumerate(args.name) if any(same_path(a, b) for a in args.name[:i])]
    if twice:
        die(f"{twice[0]} is given twice: give each model's folder once")
    if args.seeds and len(set(args.seeds)) < len(args.seeds):
        die(f"--seeds {' '.join(map(str, args.seeds))}: a seed is given twice")
    if args.plot:
        check_plot(args.plot)
    out = args.json or (Path(args.plot).with_suffix(".json") if args.plot else None)
    if out is None:
        return None
    check_curve_outputs(args, out)
    return out


def check_curve_outputs(args, out):
    """report-curve's table files, out (.json) and the .md beside it, both checked before any is written: each a file
    name in a folder we can write to, neither a file it reads nor the --plot."""
    what = f"--json {out}" if args.json else f"--plot {args.plot} (its table goes to {out} and a .md beside it)"
    md = Path(out).with_suffix(".md")
    for path, suffix in ((out, ".json"), (md, ".md")):
        try:
            check_output(path, suffix)
        except OutputError as e:
            die(f"{what}: {e}" if path == out else f"{what}: the .md beside it, {str(e).split(';')[0]}; choose "
                "another name or move it away")
    read = [p for d in args.name for p in (Path(d) / "pretrain" / "pretrain.json",
                                           *[q for f in CURVE_FOLDERS for q in Path(d).glob(f"{f}/*/*.json")])]
    read += [Path(args.plot)] if args.plot else []
    mine = next(((o, p) for o in (out, md) for p in read if same_path(p, o)), None)
    if mine:
        verb = "draws" if args.plot and same_path(mine[1], args.plot) else "reads"
        die(f"{what}: {mine[0]} is {mine[1]}, which report-curve {verb}: choose another file")


def curve(args, extra):
    """report-curve: the curve experiment's rows over the models of several results folders (report.report_curve)."""
    out, exp = check_curve(args, extra), EXPERIMENTS["curve"]
    seeds = {v.name: tuple(args.seeds or CURVE_SEEDS.get(v.name, ())) or None for v in exp.variants
             if not v.evaluate_only and v.seeded}
    try:
        models = report_curve(exp, args.name, seeds, out, args.plot)
    except (LoadError, OutputError) as e:
        die(e)
    except OSError as e:  # e.g. a full disk: the pair is left as it was (lab/files.py write_pair)
        die(f"cannot write {e.filename or out} ({e.strerror or e}); the table above is complete: free some space and "
            "run the same command again", code=1)
    if models is None:
        die(f"no finished runs of the curve's rows in {', '.join(args.name)} ({'/, '.join(CURVE_FOLDERS)}/): "
            "are the folders right?", code=1)
    return models


REPORT_FLAGS = ("--out", "--plot")  # what report reads (it parses and ignores --seeds, as results/raw gives it)


def refuse_extra(extra, command, takes):
    """list's and report's words that get_args left over (a sweep would hand them to its runs): the first, in one
    line, with the close flag of a near miss (--plt, --pl: --plot). A flag no run takes is refused (EXAMPLES)."""
    if not extra:
        return
    word = extra[0]
    if not word.startswith("-"):
        die(f"{word}: {command} takes {'no experiment name' if command == 'list' else 'one experiment name'}")
    flag = word.partition("=")[0]
    if not takes:
        die(f"{flag}: {command} takes no flags")
    die(f"{flag}: {command} takes no such flag" + (near_miss(flag, takes) or f"; it takes {' and '.join(takes)}"))


def near_miss(flag, takes):
    """'; did you mean --plot?' when flag is a typo or a cut-off of one of takes (--plt, --pl), else ''."""
    close = difflib.get_close_matches(flag, takes, n=1, cutoff=0.7)  # 0.7: --bogus is no --out (0.67)
    return f"; did you mean {close[0]}?" if close else ""


def main(argv=None):
    args, extra = get_args(argv)
    if args.command == "list":
        refuse_extra(args.name + extra, "list", ())
        return list_experiments()
    if args.command == "report-curve":
        return curve(args, extra)
    if len(args.name) > 1:
        die(f"{args.name[1]}: {args.command} takes {'one experiment name' if args.command == 'report' else 'none'}")
    args.name, args.seeds = (args.name or [None])[0], args.seeds or PAPER_SEEDS[:3]
    if args.command == "report":
        refuse_extra(extra, "report", REPORT_FLAGS)
        check_report(args)
        summary = report(args.name, EXPERIMENTS[args.name], args.out, args.plot)
        if summary is None:
            die(f"no finished runs of {args.name} in {Path(args.out) / args.name}: is --out right?", code=1)
        return summary
    check_sweep(args, extra)
    exp = EXPERIMENTS[args.command]
    check_out(args.out)
    data_dir = check_data(exp, args, extra)
    try:
        with sweep.stop_on_signals():
            code = sweep.sweep(args.command, exp, args, extra, data_dir)
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
