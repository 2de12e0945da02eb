"""
The paper's experiments as data: each is a list of variants (train.py flags, or an untrained model's evaluation)
run over seeds, resumably, and reported as mean +- std over seeds beside the paper's figures.

    python experiments.py list                                      # every experiment, its variants, the paper's numbers
    python experiments.py table5 --model $M --seeds 1 2 3 [--max-steps 300 ...any train.py flag] [--out runs/]
    python experiments.py report table5 [--out runs/]               # the tables again, from the finished runs

Each run is `python train.py ...` (or `python evaluate.py ...` for an untrained baseline) in a subprocess, writing
<out>/<experiment>/<variant>/seed-<s>.{safetensors,json,log}. The .json appears (atomically) only when the run has
finished, so re-running the same command skips finished runs and a killed sweep loses at most the run in flight. A
run in flight holds seed-<s>.lock, so several processes (or machines sharing the folder) can work through one sweep
without taking the same run. A run whose command equals a finished run of another experiment (SG-OPT with the
defaults is in four of them) is not trained again: its record is copied, naming the source.

References: Kim, Yoo, Lee, ACL 2021: Table 1 (main STS table), Table 5 (ablation), Table 6 (efficiency), Figure 4
(domain robustness), appendix Table 9 (the 8 seeds).
"""
import argparse
import json
import os
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import data
from checkpoint import write_json

ROOT = Path(__file__).resolve().parent
PAPER_SEEDS = [1, 2, 3, 4, 1234, 2345, 3456, 7890]  # appendix Table 9
TASKS = data.TASKS
SHORT = {"STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R"}


@dataclass
class Variant:
    name: str  # also its folder name
    flags: list = field(default_factory=list)  # train.py flags (or evaluate.py flags when evaluate_only)
    paper: dict = field(default_factory=dict)  # {block: "avg" or "avg +- std"}: the paper's figure(s), as printed
    evaluate_only: bool = False  # an untrained baseline: one evaluation, no training, no seeds


@dataclass
class Experiment:
    title: str
    variants: list
    note: str = ""
    baseline: str = ""  # a variant: the report adds each row's avg minus its avg (the paper's Figure 4 drop)


SG_OPT = Variant("sg-opt", [], {"BERT-base": "74.62 +- 0.25"})
EXPERIMENTS = {
    "table1": Experiment("Table 1: untrained poolings, the post-hoc baselines and SG / SG-OPT", [
        Variant("cls", ["--pooling", "cls"], {"BERT-base": "31.40", "SBERT-base": "71.32"}, evaluate_only=True),
        Variant("mean", ["--pooling", "mean"], {"BERT-base": "52.57", "SBERT-base": "74.85"}, evaluate_only=True),
        Variant("first-last", ["--pooling", "first-last"], evaluate_only=True),
        Variant("wk", ["--pooling", "wk"], {"BERT-base": "25.58", "SBERT-base": "75.59"}, evaluate_only=True),
        Variant("whitening", ["--loss", "whitening"]),  # closed form: every seed gives the same numbers
        Variant("flow", ["--loss", "flow"], {"BERT-base": "68.77 +- 0.07", "SBERT-base": "77.42"}),
        Variant("sg", ["--loss", "sg"], {"SBERT-base": "78.41 +- 0.33"}),
        Variant("sg-opt", [], {"BERT-base": "74.62 +- 0.25", "SBERT-base": "79.41 +- 0.17"}),
    ], "SBERT-base is the paper's closest analogue to a model already trained as a sentence encoder (e.g. "
       "all-MiniLM-L6-v2); its Contrastive (BT) row is 72.47. The paper has no whitening row; the whitening paper's "
       "BERT-base (target) figure is 69.21 in the wmean protocol, not comparable with this table's all."),
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
    "views": Experiment("The code-vs-paper switches: how BERT_F's views are made", [
        Variant("sg-opt", []),
        Variant("view-max", ["--view-pooling", "max"]),
        Variant("teacher-dropout-off", ["--teacher-dropout", "off"]),
        Variant("no-layer-0", ["--layers", "1:"]),  # views from layers 1..l only
    ], "sg-opt is the official code's choice: mean-pooled views, BERT_F in train mode (dropout on), all hidden states "
       "0..l. The paper states max pooling."),
    "domain": Experiment("Figure 4: trained on other text than STS-B", [
        Variant("sg-opt", []),
        Variant("transfer-text", ["--data", "{transfer_text}"]),
    ], "transfer-text: as many sentences as STS-B's 17,256, drawn (fixed seed) from the SentEval transfer tasks MR, "
       "CR, SUBJ and MPQA (movie and product reviews, opinion snippets). The paper used NLI, not in our data folder, "
       "and reports the drop from the STS-B-trained run.", baseline="sg-opt"),
    "precision": Experiment("bf16 autocast vs fp32 (the official code's precision)", [
        Variant("fp32", ["--precision", "fp32"]),  # named: train.py's default is bf16 on CUDA
        Variant("bf16", ["--precision", "bf16"]),
    ], "bf16: autocast of BERT_F, BERT_T and the head; the similarity, softmax, loss, regulariser and the evaluation "
       "stay fp32. Read the bf16 row against the fp32 row's seed spread.", baseline="fp32"),
    "methods": Experiment("SG-OPT, ConSERT and SimCSE on one harness: same data, seeds and evaluator", [
        Variant("sg-opt", [], {"BERT-base": "74.62 +- 0.25"}),
        Variant("consert", ["--loss", "consert"], {"BERT-base": "72.74"}),
        Variant("simcse", ["--loss", "simcse"], {"BERT-base": "76.25"}),
    ], "Each method with its own recipe (train.py METHODS: tau, batch, max length, lr, pooling, augmentations), "
       "trained on the STS-B sentences; the paper figures are each method's own paper (ConSERT's trained on STS+SICK "
       "text for 10 epochs; SimCSE's on 10^6 Wikipedia sentences)."),
}

# -----------------------------------------------------------------------------
# running


def run_key(model, flags, seed):
    """What makes two runs the same run: the model, the train.py flags in order (argparse: the last one wins), the
    seed. The outputs (--out, --json) and --overwrite are not part of it."""
    return json.dumps([str(model), [str(f) for f in flags], seed])


def acquire(lock):
    """Take the run: create its lock file exclusively. A lock left by a dead process on this host is taken over."""
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.write(fd, f"{socket.gethostname()} {os.getpid()}\n".encode())
            os.close(fd)
            return True
        except FileExistsError:
            host, _, pid = lock.read_text().partition(" ") if lock.exists() else ("", "", "")
            if host != socket.gethostname() or not pid.strip().isdigit() or alive(int(pid)):
                return False  # another process (or machine) holds it
            lock.unlink(missing_ok=True)  # stale: its process is gone
    return False


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def find_finished(out, key, seed):
    """A finished run with the same key anywhere under out (another experiment's), or None."""
    for path in sorted(out.glob(f"*/*/seed-{seed}.json")):
        rec = json.loads(path.read_text())
        if rec.get("key") == key and "same_as" not in rec:
            return path, rec
    return None


def transfer_text(data_dir, dest, n=17256, seed=0):
    """A training file of n sentences drawn from MR, CR, SUBJ and MPQA (the SentEval transfer tasks' text)."""
    if not dest.exists():
        sents = [s for task in ("MR", "CR", "SUBJ", "MPQA") for s in data.load_transfer(task, data_dir)["all"][0] if s]
        random.Random(seed).shuffle(sents)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
        tmp.write_text("\n".join(sents[:n]) + "\n")
        os.replace(tmp, dest)
    return dest


def run_one(exp_name, v, seed, args, extra, out):
    """Run one variant x seed unless it is finished or taken; returns 'done', 'copied', 'ran', 'taken' or 'failed'."""
    folder = out / exp_name / v.name
    folder.mkdir(parents=True, exist_ok=True)
    stem = "eval" if v.evaluate_only else f"seed-{seed}"
    record_path = folder / f"{stem}.json"
    if record_path.exists():
        return "done"
    flags = [f.format(transfer_text=transfer_text(data.resolve_data_dir(args.data_dir), out / exp_name / "transfer-text.txt"))
             if "{" in f else f for f in v.flags]
    script = "evaluate.py" if v.evaluate_only else "train.py"
    run_flags = ([*flags] if v.evaluate_only else [*extra, *flags, "--seed", str(seed)])
    if args.data_dir:
        run_flags += ["--data-dir", args.data_dir]
    key = run_key(args.model, [script, *run_flags], None if v.evaluate_only else seed)
    lock = folder / f"{stem}.lock"
    if not acquire(lock):
        return "taken"
    try:
        if record_path.exists():  # finished by another process between our check and our lock
            return "done"
        if not v.evaluate_only and (same := find_finished(out, key, seed)):
            write_json(record_path, {**same[1], "same_as": str(same[0].relative_to(out))})
            return "copied"
        part = folder / f".{stem}.result.json"
        cmd = [sys.executable, str(ROOT / script), "--model", str(args.model), *run_flags, "--json", str(part)]
        if not v.evaluate_only:
            cmd += ["--out", str(folder / f"{stem}.safetensors"), "--overwrite", "--eval-all"]
        print(f"[{time.strftime('%H:%M:%S')}] {exp_name}/{v.name}/{stem}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.time()
        with open(folder / f"{stem}.log", "w") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            print(f"  failed (exit {rc}): see {folder / f'{stem}.log'}", flush=True)
            return "failed"
        result = json.loads(part.read_text())
        part.unlink()
        sts = result["sts"]
        write_json(record_path, {"experiment": exp_name, "variant": v.name, "seed": None if v.evaluate_only else seed,
                                 "key": key, "command": [script, *cmd[2:]], "seconds": time.time() - t0,
                                 "sts": {t: sts[t] for t in [*TASKS, "avg"]},
                                 "train": None if v.evaluate_only else {k: result[k] for k in (
                                     "best_step", "dev", "test", "steps", "stop", "wall_seconds", "test_seconds",
                                     "ms_per_step")}})
        print(f"  done in {(time.time() - t0) / 60:.1f} min | avg {sts['avg']['all']:.2f}", flush=True)
        return "ran"
    finally:
        lock.unlink(missing_ok=True)


def run_experiment(name, args, extra):
    out = Path(args.out)
    exp = EXPERIMENTS[name]
    counts = {}
    for seed in args.seeds:  # seed-major: every variant gets its first seed before any gets its second
        for v in exp.variants:
            if v.evaluate_only and seed != args.seeds[0]:
                continue
            status = run_one(name, v, seed, args, extra, out)
            counts[status] = counts.get(status, 0) + 1
    print(f"{name}: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    report(name, out)

# -----------------------------------------------------------------------------
# reporting


def summarize(name, out):
    """{variant: {seeds, tasks: {task: (mean, std)}, avg, train_seconds, test_seconds, paper}} over finished runs.
    std: the sample standard deviation over seeds (ddof=1), 0 for one run."""
    summary = {}
    for v in EXPERIMENTS[name].variants:
        recs = [json.loads(p.read_text()) for p in sorted((out / name / v.name).glob("*.json"))]
        if not recs:
            continue

        def ms(xs):
            xs = np.asarray(xs, dtype=float)
            return [float(xs.mean()), float(xs.std(ddof=1)) if len(xs) > 1 else 0.0]
        row = {"seeds": [r["seed"] for r in recs], "paper": v.paper,
               "sts": {t: ms([r["sts"][t]["all"] for r in recs]) for t in [*TASKS, "avg"]}}
        if not v.evaluate_only:
            row.update({k: ms([r["train"][k] for r in recs]) for k in ("wall_seconds", "test_seconds", "best_step")})
            row["ms_per_step"] = ms([step_ms(r["train"]["ms_per_step"]) for r in recs])
        summary[v.name] = row
    return summary


def step_ms(x):
    """A record's time per step: one figure (or, in records written before the step was timed whole, its phases)."""
    return sum(x.values()) if isinstance(x, dict) else float(x)


def report(name, out):
    """Print the experiment's tables and write results.md and results.json beside its runs."""
    out = Path(out)
    exp, summary = EXPERIMENTS[name], summarize(name, out)
    blocks = sorted({b for v in exp.variants for b in v.paper})
    base = summary.get(exp.baseline, {}).get("sts", {}).get("avg", [None])[0]
    head = ["variant", "n", *[SHORT.get(t, t) for t in TASKS], "avg", *([f"avg - {exp.baseline}"] if base else []),
            *[f"paper ({b})" for b in blocks]]
    lines = [f"## {name}: {exp.title}", "", f"Spearman x100, `all` protocol, mean +- std over seeds. {exp.note}", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v, row in summary.items():
        cells = [f"{m:.2f} +- {s:.2f}" if len(row["seeds"]) > 1 else f"{m:.2f}" for m, s in row["sts"].values()]
        delta = [f"{row['sts']['avg'][0] - base:+.2f}"] if base else []
        paper = [row["paper"].get(b, "") for b in blocks]
        lines.append(f"| {v} | {len(row['seeds'])} | " + " | ".join(cells + delta + paper) + " |")
    trained = {v: r for v, r in summary.items() if "wall_seconds" in r}
    if trained:
        lines += ["", "Efficiency (the paper's Table 6): train wall time and STS-B test inference time per run, mean "
                  "over seeds; time per training step (all phases); best dev step.", "",
                  "| variant | train (min) | ms/step | STS-B test inference (s) | best step |", "|---|---|---|---|---|"]
        lines += [f"| {v} | {r['wall_seconds'][0] / 60:.1f} | {r['ms_per_step'][0]:.0f} | {r['test_seconds'][0]:.1f} | "
                  f"{r['best_step'][0]:.0f} |" for v, r in trained.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    if summary:
        (out / name).mkdir(parents=True, exist_ok=True)
        write_json(out / name / "results.json", {"experiment": name, "title": exp.title, "variants": summary})
        tmp = out / name / f".results.md.{os.getpid()}.tmp"
        tmp.write_text(text)
        os.replace(tmp, out / name / "results.md")
    return summary


def list_experiments():
    for name, exp in EXPERIMENTS.items():
        print(f"{name}: {exp.title}")
        for v in exp.variants:
            kind = "evaluate.py (untrained)" if v.evaluate_only else "train.py"
            paper = "; ".join(f"paper {b}: {x}" for b, x in v.paper.items())
            print(f"  {v.name:<22} {kind} {' '.join(v.flags) or '(defaults)'}" + (f" | {paper}" if paper else ""))
        if exp.note:
            print(f"  note: {exp.note}")


def die(msg):
    print(f"experiments.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1].strip(), epilog="Any other flag goes to train.py.",
                                allow_abbrev=False)  # so that --seed is not read as --seeds
    p.add_argument("command", help=f"list | report NAME | an experiment: {' | '.join(EXPERIMENTS)}")
    p.add_argument("name", nargs="?", help="with report: the experiment")
    p.add_argument("--model", default="bert-base-uncased", help="base model (as train.py --model)")
    p.add_argument("--seeds", type=int, nargs="+", default=PAPER_SEEDS[:3], help="default: 1 2 3 (the paper: 8)")
    p.add_argument("--out", default="runs", help="folder of the runs and reports (default: runs/)")
    p.add_argument("--data-dir", default=None, help="data folder (default $SG_DATA, else ./data)")
    args, extra = p.parse_known_args(argv)
    if args.command == "list":
        return list_experiments()
    if args.command == "report":
        if args.name not in EXPERIMENTS:
            die(f"report {args.name}: choose one of {', '.join(EXPERIMENTS)}")
        return report(args.name, args.out)
    if args.command not in EXPERIMENTS:
        die(f"unknown experiment {args.command!r}: choose list, report or one of {', '.join(EXPERIMENTS)}")
    bad = [f for f in extra if f in ("--out", "--json", "--seed", "--overwrite")]
    if bad:
        die(f"{bad[0]} is set per run by experiments.py (use --out for the sweep's folder, --seeds for the seeds)")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        die(f"--out {args.out} is a file, not a folder")
    try:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        die(f"--out {args.out}: cannot create the folder ({e.strerror})")
    try:
        run_experiment(args.command, args, extra)
    except KeyboardInterrupt:
        print("experiments.py: interrupted; finished runs are kept, re-run the same command to resume", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
