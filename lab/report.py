"""
The reports of experiments.py: which run records count, mean +- std over seeds, and the paper's tables (Table 1 and 5:
the STS tasks; Table 4: transfer; Table 6: efficiency; Figure 4: the drops; the leaderboard), printed and written as
results.md and results.json beside the runs; and the curve: one experiment's rows over several models' results
folders, by tokens seen in pretraining (report_curve). It reads only: sweep.py writes the records.

A record is <out>/<experiment>/<variant>/{seed-<s>,eval,fit}.json. It counts when it is valid JSON of a run's shape
holding every number its experiment's tables need (needs), and a key and sha256s of their shape where it holds them
(damaged_identity); any other is named with what to do, and left out. A row averages the runs of one setting only
(setting: its key but the seed, and the sha256 of its base weights and --data file): the sweep's own, or else the one
most of the row's runs share; a run of another setting is named and left out.
"""
import hashlib
import json
import math
import os
import re
import sys
import zipfile
import zlib
from pathlib import Path

import numpy as np

import data
from checkpoint import LoadError, display_name, file_sha256
from outputs import atomic_write, write_json, write_text
from data import SHORT, TASKS
from lab.files import write_pair

RECORD = re.compile(r"(seed-\d+|eval|fit)\.json")  # never the hidden files of runs in flight (.seed-1.result.json)


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
    why = damaged_identity(rec)
    return (None, why) if why else (rec, None)


SHAS = ("model_sha256", "generator_sha256", "data_sha256", "checkpoint_sha256")  # a run record's inputs and output


def damaged_identity(rec):
    """What is wrong with the parts of a record that say which run it is (its key, its sha256s), or None: a part it
    does not hold is an older record's (taken at its word); a part it holds in another shape is damage, which a row
    would otherwise average with, or set against, its runs (setting, differences)."""
    if "key" in rec:  # str(RunKey): the JSON [model, [script, *flags], seed]
        try:
            key = json.loads(rec["key"]) if isinstance(rec["key"], str) else None
        except ValueError:
            key = None
        if not (isinstance(key, list) and len(key) == 3 and isinstance(key[0], str) and isinstance(key[1], list)):
            return f"'key' is {excerpt(rec['key'])}, not a run's key (the JSON [model, [script, *flags], seed])"
        odd = [f for f in key[1] if not isinstance(f, str)]
        if odd:
            return f"'key' holds {excerpt(odd[0])} among its flags, where each is a string"
    for k in SHAS:
        x = rec.get(k)
        if x is not None and not (isinstance(x, str) and re.fullmatch(r"[0-9a-f]{64}", x)):
            return f"'{k}' is {excerpt(x)}, not a sha256 (64 hex digits)"
    return None


def excerpt(x, width=40):
    """A damaged value as a line shows it: its repr, cut at width."""
    r = repr(x)
    return r if len(r) <= width else r[:width - 3] + "..."


def bad_record_line(path, why):
    return f"warning: {path}: {why}; this run is left out (shown as missing): move the file aside and re-run the sweep"


def load_records(exp, folder, left_out=None, expect=None):
    """{variant: [valid records of one setting]} of an experiment's folder, and [(path, what is wrong)] of the records
    that do not count (corrupt, empty, of the wrong shape, a needed key missing, in left_out {path: why}: a sweep's
    records of other runs than its own, or of another setting than the row's: one_setting, expect[variant])."""
    recs, bad, left_out, expect = {}, [], left_out or {}, expect or {}
    for v in exp.variants:
        paths = [p for p in (folder / v.name).glob("*.json") if RECORD.fullmatch(p.name)]
        good = []
        for path in sorted(paths, key=lambda p: (len(p.name), p.name)):  # seed-2 before seed-10
            rec, why = (None, left_out[path]) if path in left_out else read_record(path, needs(exp, v))
            if rec is None:
                bad.append((path, why))
            else:
                good.append((path, rec))
        kept, other = one_setting(v.name, good, expect.get(v.name))
        bad += other
        if kept:
            recs[v.name] = kept
    return recs, bad


SETTING = ("model", "flags", "second step", "base weights' sha256", "--data file's sha256")


def setting(rec):
    """What a run was made with but its seed, as its record names it: (model, its script and flags without --seed,
    the second step's flags, the sha256 of its base weights and of its --data file); None for a part a record does
    not name (an older record: taken at its word, it matches any)."""
    try:
        model, flags, _ = json.loads(rec["key"])
    except (KeyError, TypeError, ValueError):
        model = flags = None
    if not isinstance(model, str) or not isinstance(flags, list):
        model = flags = None
    i = flags.index("then") if flags and "then" in flags else len(flags or ())
    command = None if flags is None else tuple(
        f for j, f in enumerate(flags[:i]) if f != "--seed" and flags[j - 1:j] != ["--seed"] and
        not f.startswith("--seed="))
    return (model and display_name(model), command, tuple(flags[i + 1:]) if flags and i < len(flags) else None,
            rec.get("model_sha256"), rec.get("data_sha256"))


def differences(a, b):
    """Where two settings that both name a part differ, as a clause ('' when none does)."""
    def text(x):
        return " ".join(x) or "none" if isinstance(x, tuple) else f"{x[:16]}..." if len(x) == 64 else x
    return "; ".join(f"its {name} {text(x)}, theirs {text(y)}" for name, x, y in zip(SETTING, a, b)
                     if x is not None and y is not None and x != y)


def one_setting(variant, recs, expect=None):
    """recs [(path, record)] of one row -> (the records of one setting, [(path, why)] of the others): the setting
    expect (a sweep's own) when given, else the one most of the runs share (on a tie, the newest run's). A part a
    record does not name matches any; the first record of each part names it for the rest."""
    if len(recs) < 2 and expect is None:
        return [r for _, r in recs], []
    order = sorted(recs, key=lambda pr: (-sum(x is not None for x in setting(pr[1])), -pr[0].stat().st_mtime_ns))
    ref = expect or max((setting(r) for _, r in order),
                        key=lambda s: sum(not differences(s, setting(r)) for _, r in order))
    kept, other = [], []
    for path, rec in order:
        mine = setting(rec)
        if differences(mine, ref):
            other.append((path, mine))
        else:
            kept.append((path, rec))
            ref = tuple(x if x is not None else y for x, y in zip(ref, mine))  # what it names, the next must match
    n = len(kept)
    whose = "this sweep's" if expect else f"the {n} run(s) of {variant} reported"
    why = [(path, f"a run of another setting than {whose} ({differences(mine, ref)}): never averaged with them")
           for path, mine in other]
    kept.sort(key=lambda pr: (len(pr[0].name), pr[0].name))
    return [r for _, r in kept], why


# -----------------------------------------------------------------------------
# summaries and tables


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


def summarize(exp, recs):
    """{variant: row} over the valid records (load_records)."""
    return {v.name: summarize_variant(v, recs[v.name]) for v in exp.variants if v.name in recs}


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
    return lines + significance_table(summary, exp.references)


def significance_table(summary, references=None):
    """The STS table's rows against its references (SimCSE and SG-OPT by default: the leaderboard's significance
    columns, as a table of their own), explained under it; none when no row was set against a reference."""
    refs = [r for r in references or REFERENCES if r in summary]
    rows = [[v, *significance_cells(v, r, refs)] for v, r in summary.items() if "vs" in r]
    if not refs or not rows:
        return []
    once = [LABELS.get(r, r) for r in refs if summary[r]["seeds"] == [None]]
    note = f" {' and '.join(once)} ran once: " + ONCE_NOTE if once else ""
    return ["", *table(["variant", *significance_head(refs)], rows), "", significance_note(refs) + note]


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
    of each method (train time, time per step, STS-B test inference), each method's own paper figure beside; then
    each method's difference from SimCSE and SG-OPT with its intervals (significance), explained under the table."""
    refs = [r for r in exp.references if r in summary]
    head = ["method", "n", *[SHORT.get(t, t) for t in TASKS], "avg", "transfer avg (n)", "train (min)", "ms/step",
            "STS-B test inference (s)", "own paper (BERT-base)", *significance_head(refs)]
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
                     f"{inf[0]:.1f}" if inf else "", next(iter(v.paper.values()), ""),
                     *significance_cells(v.name, r, refs)])
    return [f"Spearman x100, `all` protocol, mean +- std over seeds; transfer: accuracy x100. {exp.note}", "",
            *table(head, rows), *(["", significance_note(refs)] if refs else [])]


def significance_head(refs):
    return [f"vs {LABELS.get(r, r)}: {k}" for r in refs for k in ("seeds", "STS pairs")]


def significance_cells(name, r, refs):
    """Row `name`'s cells against each reference (summary row r): '-' against itself."""
    return [significance_cell(r.get("vs", {}).get(ref, {}), k) if ref != name else "-"
            for ref in refs for k in ("seeds", "pairs")]


def significance_note(refs):
    return SIGNIFICANCE_NOTE.format(refs=" and ".join(LABELS.get(r, r) for r in refs), n=BOOTSTRAP,
                                    seed=BOOTSTRAP_SEED)


def significance_cell(x, kind):
    """'+1.23 [+0.40, +2.06] better': the difference and its 95% interval, marked better / worse only when the
    interval excludes 0; 'n/a (why)' where it cannot be computed."""
    if x.get(kind) is None:
        return f"n/a ({x.get(f'{kind}_why', 'no reference row')})"
    d, lo, hi = x[kind]
    return f"{d:+.2f} [{lo:+.2f}, {hi:+.2f}]" + (" better" if lo > 0 else " worse" if hi < 0 else "")


ONCE_NOTE = ("no seed moves such a reference, so against it a seeded row's 'seeds' interval is that row's "
             "one-sample t interval, and a row that also ran once has its difference alone.")
SIGNIFICANCE_NOTE = (
    "vs {refs}: the method's 7-task average (`all`) minus the reference's, with a 95% interval; 'better' or 'worse' "
    "only when the interval excludes 0. seeds: Welch's t interval on the per-seed averages (unequal variances; n/a "
    "where a side has fewer than 2 runs, as an evaluation or a fit, which run once): the noise of training. STS pairs: "
    "a paired bootstrap over the test pairs of one run of each (the sweep's first seed, seed 1; an evaluation's one "
    "run): {n:,} resamples (numpy seed {seed}), each drawing every task's test pairs with replacement, the same draws "
    "for both methods, the 7 tasks' Spearmans recomputed and averaged for both; the interval runs from the 2.5th to "
    "the 97.5th percentile of the differences: the noise of the test sets at one seed. It reads the per-pair cosines "
    "that the run's evaluation wrote beside its record (<run>.cosines.npz, named in the record with its sha256, its "
    "own scores checked against the record's); n/a where a record names none (records made before they were kept). "
    "A gain beyond the noise is one that both intervals put above 0.")


# -----------------------------------------------------------------------------
# significance: each row (leaderboard, methods) against SimCSE and SG-OPT, over the seeds and over the STS test pairs

REFERENCES = ("simcse", "sg-opt")  # the rows every row is set against (the leaderboard, the methods experiment)
BOOTSTRAP, BOOTSTRAP_SEED = 1000, 0  # resamples of the test pairs, and numpy's seed for them
MATCH = 0.05  # how far (Spearman x100) a cosines file's own score of a task may be from its record's


def add_significance(summary, recs, folder, references=REFERENCES):
    """Each row's difference from each reference row (REFERENCES) with its intervals, as summary[v]["vs"][ref] =
    {seeds: [diff, low, high] or None, seeds_why, pairs: [diff, low, high] or None, pairs_why}: Welch over the seeds'
    7-task averages, and the paired bootstrap over the test pairs of one run of each (pair_cosines)."""
    avgs = {v: [r["sts"]["avg"]["all"] for r in rs] for v, rs in recs.items()}
    exact = {v: len(rs) == 1 and rs[0].get("seed") is None for v, rs in recs.items()}  # run once: no seed moves it
    cosines = {v: pair_cosines(folder / v, rs) for v, rs in recs.items()}  # (cosines or None, why not)
    rhos = {**{v: (None, why) for v, (c, why) in cosines.items() if c is None},
            **bootstrap_rhos({v: c for v, (c, _) in cosines.items() if c is not None})}
    for v in summary:
        summary[v]["vs"] = {}
        for ref in (r for r in references if r in summary and r != v):
            # a reference run once (the base model's [CLS], mean pooling) is a constant: no seed moves it
            seeds = welch_interval(avgs[v], avgs[ref], exact[v] and exact[ref], exact[ref])
            why = next((w if u == v else f"{LABELS.get(u, u)}: {w}" for u in (v, ref) if (w := rhos[u][1])), None)
            summary[v]["vs"][ref] = {"seeds": seeds, **({} if seeds else {"seeds_why": "n < 2"}),
                                     "pairs": None if why else paired_difference(rhos[v][0], rhos[ref][0]),
                                     **({"pairs_why": why} if why else {})}


def welch_interval(a, b, exact_a=False, exact_b=False, level=0.95):
    """mean(a) - mean(b) and its Welch t interval (unequal variances, Welch-Satterthwaite degrees of freedom):
    [diff, low, high]; None when a side has fewer than 2 values. Both sides without spread: the difference alone.
    exact_a, exact_b: that side is one run that no seed moves (an evaluation of the base model, a closed-form fit):
    a constant, so the interval is the other side's one-sample t interval."""
    from scipy import stats  # here: the other tables need no scipy
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 2 and not (exact_a and len(a) == 1) or len(b) < 2 and not (exact_b and len(b) == 1):
        return None

    def var(x, exact):  # the variance of the mean: 0 for a constant
        return 0.0 if exact and len(x) == 1 else x.var(ddof=1) / len(x)
    d, va, vb = a.mean() - b.mean(), var(a, exact_a), var(b, exact_b)
    if va + vb == 0:
        return [float(d)] * 3
    df = (va + vb) ** 2 / sum(v ** 2 / (len(x) - 1) for v, x in ((va, a), (vb, b)) if v)
    h = stats.t.ppf(0.5 + level / 2, df) * math.sqrt(va + vb)
    return [float(d), float(d - h), float(d + h)]


def pair_cosines(folder, recs):
    """The per-pair cosines of a row's first run that has them ({task: (cosines, gold)}, float64), from the file its
    record names beside it (sweep.keep_cosines: {file, sha256}), checked: that file, every task, its own Spearman
    the record's; or (None, why not)."""
    rec = next((r for r in recs if isinstance(r.get("cosines"), dict)), None)
    if rec is None:
        return None, "no per-pair cosines"
    info = rec["cosines"]
    path = folder / Path(str(info.get("file"))).name
    try:
        if file_sha256(path) != info.get("sha256"):
            return None, f"{path.name} is not its run's (another sha256)"
        with np.load(path) as z:
            cos = {t: (z[f"{t}.cosine"].astype(np.float64), z[f"{t}.gold"].astype(np.float64)) for t in TASKS}
    except FileNotFoundError:
        return None, f"{path.name}, which its record names, is missing"
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:  # zlib: damaged data
        return None, f"{path.name} unreadable: {e}"
    for t, (c, g) in cos.items():
        if len(c) != len(g) or len(c) < 2:
            return None, f"{path.name}: {t} has {len(c)} cosines and {len(g)} gold scores"
        mine, theirs = resampled_spearmans(g, [c], np.ones((1, len(c)), np.int32))[0, 0], get(rec, "sts", t, "all")
        if not abs(mine - theirs) <= MATCH:
            return None, f"{path.name} gives {SHORT.get(t, t)} {mine:.2f}, its record {theirs:.2f}"
    return cos, None


def bootstrap_counts(sizes, n=BOOTSTRAP, seed=BOOTSTRAP_SEED):
    """{task: (n, size) counts}: resample b of a task draws its size test pairs with replacement (one
    rng.integers(0, size, size) a resample, task by task in order), kept as how often each pair was drawn. The
    same resamples for every row: the bootstrap is paired."""
    rng = np.random.default_rng(seed)
    return {t: np.stack([np.bincount(rng.integers(0, k, k), minlength=k) for _ in range(n)]).astype(np.int32)
            for t, k in sizes.items()}


def bootstrap_rhos(cosines, n=BOOTSTRAP):
    """{variant: ((the 7 tasks' Spearman x100 on the test sets (7,), on each of n resamples (n, 7)), None), or
    (None, why)} for the rows with cosines (pair_cosines), on one set of resamples; a row must hold the test pairs
    (the same gold, in the same order) that most rows hold (on a tie, the first row's): a row of another data folder
    is left out alone."""
    if not cosines:
        return {}
    groups = {}  # {a row: the rows that hold its test pairs}
    for v, cos in cosines.items():
        like = next((u for u in groups if all(np.array_equal(cos[t][1], cosines[u][t][1]) for t in TASKS)), v)
        groups.setdefault(like, []).append(v)
    same = max(groups.values(), key=len)  # max keeps the first of equal lengths
    first = cosines[same[0]]
    counts = bootstrap_counts({t: len(first[t][1]) for t in TASKS}, n)
    whole, resampled = [], []
    for t in TASKS:
        xs, gold = [cosines[v][t][0] for v in same], first[t][1]
        whole.append(resampled_spearmans(gold, xs, np.ones((1, len(gold)), np.int32))[:, 0])  # (rows,)
        resampled.append(resampled_spearmans(gold, xs, counts[t]))  # (rows, B)
    whole, resampled = np.stack(whole, 1), np.stack(resampled, 2)  # (rows, 7), (rows, B, 7)
    out = {v: (None, "other test pairs than the other rows'") for v in cosines if v not in same}
    return {**out, **{v: ((whole[i], resampled[i]), None) for i, v in enumerate(same)}}


def paired_difference(a, b):
    """[diff, low, high]: two rows' difference of 7-task averages on the test sets, and the 2.5th and 97.5th
    percentiles of its values on the resamples (a, b: bootstrap_rhos's (whole, resampled))."""
    diffs = a[1].mean(1) - b[1].mean(1)
    return [float(a[0].mean() - b[0].mean()), *map(float, np.percentile(diffs, [2.5, 97.5]))]


def resampled_ranks(x, w):
    """The average ranks (scipy's rankdata) of x's values within each resample of counts w (B, n), the resample
    being each pair drawn w[b, j] times: a value's rank is the number of draws of smaller values plus (its own draws
    + 1) / 2, equal values sharing one. (B, n); a pair not drawn gets a rank that its weight 0 ignores."""
    _, group = np.unique(x, return_inverse=True)  # equal values: one group; the groups in value order
    order = np.argsort(group, kind="stable")
    starts = np.flatnonzero(np.diff(group[order], prepend=-1))
    drawn = np.add.reduceat(w[:, order], starts, axis=1)  # (B, G): draws of each distinct value
    return (np.cumsum(drawn, axis=1) - (drawn - 1) / 2)[:, group]


def resampled_spearmans(gold, xs, w, chunk=100):
    """Spearman x100 of each x of xs against gold on each resample of counts w (B, n): (len(xs), B), each the
    Pearson correlation of the resample's ranks with every pair counted w[b, j] times, which is scipy's spearmanr on
    the resample itself; the gold's ranks computed once a chunk of resamples, for every x."""
    def centered(r):
        return r - (c * r).sum(1, keepdims=True) / c.sum(1, keepdims=True)
    out = []
    for s in range(0, len(w), chunk):
        c = w[s:s + chunk].astype(np.float64)
        ry = centered(resampled_ranks(gold, c))
        cy = c * ry
        rxs = [centered(resampled_ranks(x, c)) for x in xs]
        out.append([100 * (cy * rx).sum(1) / np.sqrt((c * rx * rx).sum(1) * (cy * ry).sum(1)) for rx in rxs])
    return np.concatenate(out, 1)


TABLES = {"sts": sts_table, "transfer": transfer_table, "efficiency": efficiency_table, "drops": drops_table,
          "leaderboard": leaderboard_table}


def report(name, exp, out, plot=None, left_out=None, expect=None):
    """Print the experiment's tables and write results.md and results.json beside its runs (a folder we may not
    write to: the tables are printed all the same). Returns the summary, or None when it has no valid runs.
    left_out: {record path: why} that a sweep found to be other runs' records (named and left out as bad ones);
    expect: {variant: setting} of a sweep's own runs (the setting its rows report; one_setting)."""
    out = Path(out)
    recs, bad = load_records(exp, out / name, left_out, expect)
    summary = summarize(exp, recs)
    for path, why in bad:
        print(bad_record_line(path, why), file=sys.stderr, flush=True)
    if not summary:
        return None
    if exp.significance:
        add_significance(summary, recs, out / name, exp.references)
    lines = [f"## {name}: {exp.title}", "", *models_line(recs, out / name), *TABLES[exp.table](exp, summary)]
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
        (plot_effect if name == "effect" else plot_drops)(exp, summary, plot)
    return summary


def models_line(recs, folder):
    """Which base model weights the records were measured on, by sha256 (a table must not mix two models of one
    name); records written before the hash was kept are counted apart."""
    shas = [r.get("model_sha256") for rs in recs.values() for r in rs]
    known = sorted({s for s in shas if s})
    if not known:
        return []
    line = f"Base model weights: sha256 {', '.join(s[:16] for s in known)}"
    if len(known) > 1:
        line += f" (warning: {len(known)} different weights under one model name: these rows are not comparable)"
        print(f"warning: {folder}: its records were measured on {len(known)} different base weights", file=sys.stderr)
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
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120))  # a kill leaves the old figure or the new
    print(f"figure written to {path}")


EFFECT_ROWS = ("cls", "mean", "whitening", "sg", "sg-opt", "simcse")  # the effect figure's bars, in order


def plot_effect(exp, summary, path):
    """The effect experiment as bars: each row's 7-task average (`all`) on the raw model, its seed spread (std) as
    an error bar and n under it, beside the papers' BERT-base figure of the same row (SG-OPT, SG and the untrained
    rows: the SG-OPT paper's; SimCSE: its own paper's; whitening: none in the 'all' protocol)."""
    import matplotlib
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt
    rows = [v for v in EFFECT_ROWS if "avg" in summary.get(v, {}).get("sts", {})]
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, v in enumerate(rows):
        (m, sd), n = summary[v]["sts"]["avg"], len(summary[v]["seeds"])
        ax.bar(i - 0.2, m, 0.4, yerr=sd if n > 1 else None, capsize=3, color="tab:blue")
        ax.text(i - 0.2, m + (sd if n > 1 else 0) + 0.8, f"{m:.1f}", ha="center", fontsize=8)
        paper = summary[v]["paper"].get("BERT-base")  # the experiment's paper column: "74.62 +- 0.25", "76.25 (SimCSE)"
        if paper:
            p = float(paper.split()[0])
            ax.bar(i + 0.2, p, 0.4, color="lightgray", edgecolor="gray")
            ax.text(i + 0.2, p + 0.8, f"{p:.1f}", ha="center", fontsize=8, color="dimgray")
    ax.set_xticks(range(len(rows)), [f"{LABELS.get(v, v) if v != 'sg' else 'SG'}\nn={len(summary[v]['seeds'])}"
                                     for v in rows])
    ax.set_ylabel("7 STS tasks, Spearman x100 (all)")
    ax.set_ylim(0, 85)
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in ("tab:blue", "lightgray")],
              labels=["ours, on this raw BERT-Mini (mean +- std over seeds)", "the papers, on BERT-base"],
              fontsize=8, loc="upper left")
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120))  # a kill leaves the old figure or the new
    print(f"figure written to {path}")


# -----------------------------------------------------------------------------
# the curve: one experiment's rows over several models (a pretraining's intermediate models), x = tokens seen

CURVE_FOLDERS = ("curve", "effect", "table1", "methods")  # where a model's row is looked for, in this order
LABELS = {"cls": "[CLS]", "mean": "mean", "whitening": "whitening", "sg-opt": "SG-OPT", "simcse": "SimCSE"}


def pretraining(out):
    """The model a results folder holds the runs of, from its pretraining record out/pretrain/pretrain.json:
    {out, name, run, identity, sha256, train_tokens_seen, mlm_acc (held out; None: unmeasured, the text held no
    sentence out)}. LoadError naming the file and what to do when it is missing or lacks one of them."""
    path = Path(out) / "pretrain" / "pretrain.json"
    if not path.is_file():
        raise LoadError(f"{path} not found: copy the model's pretraining record there (pretrain.py writes it as "
                        "weights/<name>/pretrain.json beside its model.safetensors)")
    rec, why = read_record(path, [("train_tokens_seen",)])
    sha, held = get(rec, "sha256", "model.safetensors"), get(rec, "held_out")
    if rec is not None and not (isinstance(held, dict) and "mlm_acc" in held):
        why = "'held_out/mlm_acc' is missing"
    elif rec is not None and not (number(held["mlm_acc"]) or held["mlm_acc"] is None):  # null: pretrain.py's "none"
        why = f"'held_out/mlm_acc' is not a number or null ({held['mlm_acc']!r})"
    elif rec is not None and not (isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha)):
        why = "'sha256/model.safetensors' is missing or not a sha256"
    if why:
        raise LoadError(f"{path}: {why}; copy the model's own pretrain.json there again")
    step = rec.get("intermediate") if isinstance(rec.get("intermediate"), dict) else {}
    name = f"{step.get('of')}-step{step.get('step')}" if step else get(rec, "args", "name") or Path(out).name
    run = step.get("of") if step else name  # the pretraining run it is from: its --keep-at folders are one run's
    return {"out": str(out), "name": name, "run": run, "identity": run_identity(rec, run), "sha256": sha,
            "train_tokens_seen": rec["train_tokens_seen"], "mlm_acc": held["mlm_acc"]}


def run_identity(rec, run):
    """The pretraining run a model is from, as pretrain.py's identity() has it: the flags and the text's sha256 that
    make its result ({key: value}, None for a key an older record lacks), its name the run's. A run's --keep-at
    folders and its final one share it; two runs of one name at two --lr do not. (Imported here: pretrain.py loads
    torch, which the tables need not.)"""
    from lab.pretrain import STATE_KEYS
    args = rec.get("args") if isinstance(rec.get("args"), dict) else {}
    return {**{k: args.get(k) for k in (*STATE_KEYS, "text_sha256")}, "name": run}


def same_model(m, other):
    """Two records of one sha256 (one model through two folders) must agree on what the model is; else LoadError."""
    keys = ("train_tokens_seen", "mlm_acc", "identity")
    if any(m[k] != other[k] for k in keys):
        k = next(k for k in keys if m[k] != other[k])
        a, b = (Path(x["out"]) / "pretrain" / "pretrain.json" for x in (other, m))
        raise LoadError(f"{a} and {b} name the same weights (sha256 {m['sha256'][:16]}...) but differ in {k}: one of "
                        "them is not that model's own record; copy the model's own pretrain.json there again")


def label_runs(models):
    """Each model's run as the figure's legend and the table name it: its name, or where runs of one name differ,
    the name and the flags that tell them apart ("r1 (lr 0.001)"), so that a label is one run (one identity)."""
    ids = {}
    for m in models:
        ids.setdefault(m["run"], {})[json.dumps(m["identity"])] = m["identity"]
    for m in models:
        group = list(ids[m["run"]].values())
        if len(group) > 1:
            keys = [k for k in m["identity"] if len({json.dumps(i[k]) for i in group}) > 1]
            suffix = ", ".join(f"{k} {shown_value(m['identity'][k])}" for k in keys)
            m["run"], m["name"] = f"{m['run']} ({suffix})", f"{m['name']} ({suffix})"


def shown_value(x):
    if isinstance(x, float):
        return f"{x:g}"
    return f"{x[:8]}..." if isinstance(x, str) and len(x) == 64 else str(x)


def curve_row(exp, v, out, sha, seeds=None):
    """Row v's runs on the model of sha256 sha: those of the first of out's CURVE_FOLDERS that holds a run that
    counts (a valid record, of that model's weights, of one of the seeds when given, of the setting most share):
    (folder, [records]), or (None, []); and [(path, why)] of the runs left out on the way."""
    bad = []
    for folder in CURVE_FOLDERS:
        paths = sorted((p for p in (Path(out) / folder / v.name).glob("*.json") if RECORD.fullmatch(p.name)),
                       key=lambda p: (len(p.name), p.name))
        good = []
        for path in paths:
            rec, why = read_record(path, needs(exp, v))
            if rec is not None and rec.get("model_sha256") != sha:
                theirs = rec.get("model_sha256")
                theirs = f"{theirs[:16]}..." if isinstance(theirs, str) and theirs else "none"
                rec, why = None, (f"a run on other weights (its model_sha256 {theirs}, this folder's model "
                                  f"{sha[:16]}... by pretrain/pretrain.json): never mixed in")
            if rec is None:
                bad.append((path, why))
            elif seeds is None or rec.get("seed") in seeds:
                good.append((path, rec))
        kept, other = one_setting(v.name, good)
        bad += other
        if kept:
            return folder, kept, bad
    return None, [], bad


def curve_models(outs):
    """The models of the results folders outs, one a sha256 (a model through two folders is one, its folders in
    'outs', the first in 'out'), each run labelled (label_runs)."""
    models = {}
    for out in outs:
        m = pretraining(out)
        if m["sha256"] in models:
            same_model(models[m["sha256"]], m)
            models[m["sha256"]]["outs"].append(m["out"])
        else:
            models[m["sha256"]] = {**m, "outs": [m["out"]], "rows": {}}
    label_runs(list(models.values()))
    return list(models.values())


def curve(exp, outs, seeds):
    """The models of the results folders outs (curve_models), sorted by tokens seen, each with its rows {variant:
    {avg: [mean, std], n, seeds, runs: folder/variant}} (the 7-task average, `all`; a row from the first of the
    model's folders that has runs of it, never a mix of two: runs then names the folder when it is not the first),
    and [(path, why)] of the runs left out. seeds: {variant: the seeds its row averages, or None for all}."""
    models, bad = curve_models(outs), []
    for m in models:
        for v in exp.variants:
            for out in m["outs"]:
                folder, recs, left = curve_row(exp, v, out, m["sha256"], seeds.get(v.name))
                bad += left
                if recs:
                    where = f"{folder}/{v.name}" if out == m["out"] else f"{Path(out) / folder / v.name}"
                    m["rows"][v.name] = {"avg": ms([r["sts"]["avg"]["all"] for r in recs]), "n": len(recs),
                                         "seeds": [r.get("seed") for r in recs], "runs": where}
                    break
        for v, ref in exp.drops.items():
            if v in m["rows"] and ref in m["rows"]:
                m[f"{v} - {ref}"] = m["rows"][v]["avg"][0] - m["rows"][ref]["avg"][0]
    return sorted(models, key=lambda m: m["train_tokens_seen"]), bad


def paper_figure(v):
    """A variant's BERT-base figure as a number ("74.62 +- 0.25" -> 74.62), or None."""
    x = v.paper.get("BERT-base")
    return float(x.split()[0]) if x else None


def curve_table(exp, models, bad):
    """The curve as markdown: a line a model (tokens seen, held-out MLM accuracy, each row's mean +- std (n)), the
    paper's BERT-base line, then where each cell's runs are and the runs left out."""
    rows, drops = [v.name for v in exp.variants], list(exp.drops.items())
    head = ["model", "tokens seen", "MLM acc", *[LABELS.get(r, r) for r in rows],
            *[f"{LABELS.get(v, v)} - {LABELS.get(ref, ref)}" for v, ref in drops]]
    lines = []
    for m in models:
        cells = [f"{cell(c['avg'], c['n'])} ({c['n']})" if (c := m["rows"].get(r)) else "" for r in rows]
        gains = [f"{m[f'{v} - {ref}']:+.2f}" if f"{v} - {ref}" in m else "" for v, ref in drops]
        tokens = f"{m['train_tokens_seen'] / 1e6:,.2f}M"
        acc = "n/a" if m["mlm_acc"] is None else f"{100 * m['mlm_acc']:.2f}%"  # None: no sentence held out
        lines.append([m["name"], tokens, acc, *cells, *gains])
    paper = {v.name: v.paper.get("BERT-base", "") for v in exp.variants}
    ref = {v.name: paper_figure(v) for v in exp.variants}
    lines.append(["BERT-base (the paper)", "", "", *[paper[r] for r in rows], *[
        f"{ref[v] - ref[r]:+.2f}" if ref[v] is not None and ref[r] is not None else "" for v, r in drops]])
    where = [[m["name"], ", ".join(m["outs"]), f"{m['sha256'][:16]}...", *[
        f"{c['runs']}" + (f": {' '.join(map(str, c['seeds']))}" if c["seeds"] != [None] else "")
        if (c := m["rows"].get(r)) else "" for r in rows]] for m in models]
    text = [f"## curve: {exp.title}", "", "The 7 STS tasks' average (Spearman x100, `all` protocol), mean +- std over "
            "seeds (n); a line a model (its weights' sha256), by tokens seen in pretraining; MLM acc: held-out "
            "masked-token accuracy (n/a: its text held no sentence out). " + exp.note, "", *table(head, lines), "",
            "Where each cell's runs are (results folder, then folder/row: "
            f"seeds; the first of {', '.join(f'{f}/' for f in CURVE_FOLDERS)} that has runs of the model's weights):",
            "", *table(["model", "results folder", "sha256", *[LABELS.get(r, r) for r in rows]], where)]
    return text + ([""] + [f"Left out: {p} ({why})" for p, why in bad] if bad else [])


def report_curve(exp, outs, seeds, json_path=None, plot=None):
    """Print the curve's table and write it as json_path and a .md beside (when given: a pair, the .json last, naming
    the .md's sha256; both checked by the caller before), and the figure (plot). Returns the models (curve), or None
    when no model has a finished run of any row."""
    models, bad = curve(exp, outs, seeds)
    for path, why in bad:
        print(bad_record_line(path, why), file=sys.stderr, flush=True)
    if not any(m["rows"] for m in models):
        return None
    text = "\n".join(curve_table(exp, models, bad)) + "\n"
    say(text)
    if json_path:
        md = Path(json_path).with_suffix(".md")
        write_pair(md, text, json_path, {
            "experiment": "curve", "title": exp.title, "seeds": seeds, "models": models,
            "paper": {v.name: paper_figure(v) for v in exp.variants}, "left_out": [[str(p), why] for p, why in bad],
            "md_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()})
        print(f"written to {json_path} and {md}")
    if plot:
        plot_curve(exp, models, plot)
    return models


def curve_series(exp, models):
    """The figure's series: [(variant, run, [(tokens seen, mean, std)])], one per row and pretraining run (its label:
    one a run identity, label_runs), the points by tokens seen. A run's --keep-at folders are one line; models of
    other runs (other recipes, even of the same name) are not joined."""
    runs = list(dict.fromkeys(m["run"] for m in models))
    return [(v.name, run, pts) for v in exp.variants for run in runs
            if (pts := sorted((m["train_tokens_seen"], *m["rows"][v.name]["avg"]) for m in models
                              if m["run"] == run and v.name in m["rows"]))]


def plot_curve(exp, models, path):
    """x: tokens seen (log), y: the 7-task average, a colour a row and a marker a pretraining run (its --keep-at
    folders joined by a line), the seeds' std as error bars; the paper's BERT-base figure of each row as a dashed line
    of its colour."""
    import matplotlib
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.8))
    colors = {v.name: f"C{i}" for i, v in enumerate(exp.variants)}
    series = curve_series(exp, models)
    runs = list(dict.fromkeys(run for _, run, _ in series))
    markers = dict(zip(runs, "osD^vP*Xph"))
    labelled = set()
    for name, run, pts in series:
        x, y, err = zip(*pts)
        label = None if name in labelled else LABELS.get(name, name)
        labelled.add(name)
        ax.errorbar(x, y, yerr=err, color=colors[name], marker=markers.get(run, "o"), capsize=3,
                    linestyle="-" if len(pts) > 1 else "none", label=label)
    for v in exp.variants:
        if (ref := paper_figure(v)) is not None:
            whose = v.paper["BERT-base"].partition("(")[2].rstrip(")") or "SG"  # "76.25 (SimCSE)": SimCSE's paper
            ax.axhline(ref, color=colors[v.name], linestyle="--", linewidth=1, alpha=0.7,
                       label=f"{LABELS.get(v.name, v.name)}, BERT-base ({whose} paper)")
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(plt.NullFormatter())  # the decades only: minor labels overlap on a short range
    ax.set_xlabel("tokens seen in pretraining (log scale)")
    ax.set_ylabel("7 STS tasks, average Spearman x100 (all)")
    ax.set_title("The paper's effect as a function of pretraining", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()  # each row beside its reference, then the runs' markers
    rank = {LABELS.get(v.name, v.name): i for i, v in enumerate(exp.variants)}
    order = sorted(range(len(labels)), key=lambda j: (rank[labels[j].split(",")[0]], "," in labels[j]))
    handles, labels = [handles[j] for j in order], [labels[j] for j in order]
    for run in runs:
        handles.append(plt.Line2D([], [], color="gray", marker=markers.get(run, "o"), linestyle="none"))
        labels.append(run)
    ax.legend(handles, labels, fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120))  # a kill leaves the old figure or the new
    plt.close(fig)
    print(f"figure written to {path}")


def say(text):
    """Print text to stdout. A reader that closed the pipe early (`report leaderboard | head`) has all it wanted:
    the rest of the output goes nowhere, quietly, and the work goes on (report still writes its files)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that the flush at exit cannot fail again
