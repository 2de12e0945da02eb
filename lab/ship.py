"""
The project's own models, shipped in the repository (models/NAME/): put a pretrained folder there with its model card,
and check a shipped model from a fresh clone against the records its README rows rest on.

    python -m lab.ship add raw-bert-mini-4            # weights/raw-bert-mini-4/ -> models/raw-bert-mini-4/ (+ README.md)
    python -m lab.ship check raw-bert-mini-4          # sha256, then [CLS], mean, whitening, SG-OPT seed 1 vs the records
    python -m lab.ship check raw-bert-mini-4 --quick  # sha256, [CLS], mean pooling and SG-OPT seed 1 (no fit)

A shipped folder is what pretrain.py wrote (config.json, model.safetensors, tokenizer.json, vocab.txt, pretrain.json)
plus README.md, its model card, written here from pretrain.json and the records. `--model NAME` finds it before
weights/ and the hub (checkpoint.resolve), and every load checks model.safetensors against the sha256 in pretrain.json
(checkpoint.read_recorded): a damaged copy is one line, not a model that differs from its records.

`check` re-runs the commands of a cheap subset of the model's rows (each exactly as its record ran it, through
python -m lab.evaluate and python -m lab.train) and prints each figure beside its record with the difference. The
records are found by the model's sha256 under results/ (every record names the weights it ran on), so a check never compares one model's
scores with another's. Only the final model of a pretraining is shipped (an intermediate --keep-at folder is refused):
the fp32 bytes its records name, and no optimizer state.
"""
import argparse
import contextlib
import glob
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import checkpoint
import cli
import outputs
from cli import die
from lab import cpu

CODE = Path(__file__).resolve().parents[1]  # the repository root: the core and lab/
ENTRY = {"train.py": "lab.train", "evaluate.py": "lab.evaluate"}  # a key's script -> the lab's entry point (takes all)
SG_LOSSES = ("opt", "sg", "opt1", "opt2")  # what train.py itself trains (train.LOSSES; train imports torch)
ROOT = CODE  # what the records' paths are shown relative to
RESULTS = ROOT / "results"
FILES = ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "pretrain.json")  # what pretrain.py writes
# the rows check re-runs: (label, the record's key (script, flags), the command's extra flags, quick?)
ROWS = (
    ("[CLS]", ("evaluate.py", "--pooling", "cls"), (), True),
    ("mean", ("evaluate.py", "--pooling", "mean"), (), True),
    ("whitening", ("train.py", "--loss", "whitening"), ("--eval-all",), False),
    ("SG-OPT seed 1", ("train.py", "--seed", "1"), ("--eval-all",), True),
)
TOLERANCE = 0.01  # 7-task average, Spearman x100: the evaluation is deterministic, this is print rounding


def get_args(argv=None):
    p = argparse.ArgumentParser(description="Ship a pretrained model in models/NAME/ with its model card, or check a "
                                "shipped one against its records.")
    p.error = die
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("add", help="copy weights/NAME/ (or --src) into models/NAME/ and write its model card")
    a.add_argument("name")
    a.add_argument("--src", help="the model folder (default: weights/NAME/, $SG_WEIGHTS/NAME/)")
    a.add_argument("--overwrite", action="store_true", help="replace an existing models/NAME/")
    c = sub.add_parser("check", help="the shipped model's sha256, then its rows re-run beside their records")
    c.add_argument("name")
    c.add_argument("--quick", action="store_true", help="[CLS], mean pooling and SG-OPT seed 1: the "
                   "README's two commands (no whitening fit; about 10 minutes for a BERT-Mini on 2 cores)")
    c.add_argument("--untrained", action="store_true", help="[CLS] and mean pooling alone (about a minute)")
    c.add_argument("--data-dir", help="data folder (default $SG_DATA, else ./data)")
    c.add_argument("--threads", type=cli.at_least(1), default=2, help="torch threads of each run (default: 2)")
    for s in (a, c):
        s.error = die
    return p.parse_args(argv)

# -----------------------------------------------------------------------------
# the records of a model


def records_of(sha, root=None):
    """Every run record under root made on the weights of this sha256: {(script, flags...): record}, the first found
    in sorted path order for each key (copies of one run share a key and a result)."""
    out = {}
    if sha is None:
        return out  # a record without model_sha256 is not this model's
    for path in sorted((root or RESULTS).rglob("*.json")):
        if path.name.startswith(".") or not (path.name in ("eval.json", "fit.json") or path.name.startswith("seed-")):
            continue
        try:
            rec = json.loads(path.read_text(encoding="utf-8"))
            if rec.get("model_sha256") != sha:
                continue
            _, (script, *flags), seed = json.loads(rec["key"])
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # not a run record (a results.json, a pretraining record)
        key = (script, *flags) + (("--seed", str(seed)) if seed is not None and "--seed" not in flags else ())
        out.setdefault(key, (path, rec))
    return out


def sts_avg(rec):
    """A record's (or evaluate.py / train.py --json's) 7-task average, `all` protocol."""
    sts = rec.get("sts") or rec.get("final", {}).get("sts") or {}
    avg = sts.get("avg")
    return avg.get("all") if isinstance(avg, dict) else avg


def shipped(name):
    folder = checkpoint.MODELS / name
    if not (folder / "pretrain.json").is_file():
        have = sorted(p.name for p in checkpoint.MODELS.glob("*/pretrain.json"))
        die(f"models/{name}/ is not a shipped model (no pretrain.json); shipped: {', '.join(have) or 'none'}")
    return folder, read_record(folder)


def read_record(folder):
    """A model folder's pretrain.json as a dict, or one line naming it (a file cut short, git's conflict markers)."""
    path = folder / "pretrain.json"
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        die(f"{path} cannot be read ({e}): it is not the record pretrain.py wrote; "
            f"{checkpoint.record_fix(folder)}")
    if not isinstance(rec, dict):
        die(f"{path} is not a pretraining record (a JSON {type(rec).__name__}); {checkpoint.record_fix(folder)}")
    return rec


# -----------------------------------------------------------------------------
# add


def add(args):
    if not checkpoint.HUB_NAME.fullmatch(args.name) or "/" in args.name or args.name.endswith(".safetensors"):
        die(f"ship add {args.name!r}: not a name --model can read (a folder name of letters, digits, '.', '-', '_', "
            "not ending in .safetensors); choose another name")
    src = Path(args.src) if args.src else checkpoint.WEIGHTS / args.name
    dest = checkpoint.MODELS / args.name
    clean_killed_adds(dest)
    missing = [f for f in FILES if not (src / f).is_file()]
    if missing:
        die(f"{src}: {', '.join(missing)} missing; ship a folder that pretrain.py wrote (config.json, "
            "model.safetensors, tokenizer.json, vocab.txt, pretrain.json)")
    rec = read_record(src)
    if rec.get("intermediate"):
        i = rec["intermediate"]
        die(f"{src} is the step-{i.get('step')} model of {i.get('of')}'s pretraining (--keep-at): ship only a final "
            "model")
    a = rec.get("args")
    lost = next((k for k in ARGS if not isinstance(a, dict) or k not in a), None)
    if lost:
        die(f"{src / 'pretrain.json'} has no args/{lost}: not the record pretrain.py writes; ship a folder that "
            "pretrain.py wrote")
    try:
        sha = checkpoint.recorded_sha256(src)
        if sha is None:
            die(f"{src / 'pretrain.json'} names no sha256 of model.safetensors, so no load could check the shipped "
                "copy and no record under results/ could be matched to it; ship a folder that pretrain.py wrote")
        checkpoint.read_recorded(src, src / "model.safetensors")  # the bytes its record names, or one line
    except checkpoint.LoadError as e:
        die(e)
    if dest.exists() and not args.overwrite:
        die(f"models/{args.name}/ exists: pass --overwrite to replace it")
    tmp = outputs.temp_path(dest)
    try:
        tmp.mkdir(parents=True)
        for f in FILES:
            shutil.copyfile(src / f, tmp / f)
        outputs.write_text(tmp / "README.md", card(args.name, rec, records_of(sha)))
        put_in_place(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    size = sum((dest / f).stat().st_size for f in (*FILES, "README.md"))
    print(f"models/{args.name}/: {size / 1e6:.1f} MB, model.safetensors sha256 {sha}; commit it with "
          f"git add models/{args.name}")


ARGS = ("name", "layers", "hidden", "heads", "steps", "batch_size")  # the record's flags that the card must show


def put_in_place(tmp, dest):
    """The folder tmp renamed to dest; a folder at dest is set aside first (.NAME.PID.old) and removed after.
    SIGINT, SIGTERM and SIGHUP wait until both renames are done, so that dest is the old folder or the new one at
    any moment a signal acts. A kill -9 between the two: the next add puts the old one back (clean_killed_adds)."""
    old = outputs.temp_path(dest, "old")
    try:
        with signals_held():
            if os.path.lexists(dest):
                dest.rename(old)
            try:
                tmp.rename(dest)
            except OSError:
                if os.path.lexists(old):
                    old.rename(dest)
                raise
    finally:
        if os.path.lexists(dest):
            shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def signals_held():
    """SIGINT, SIGTERM and SIGHUP held back inside the block: a handler only notes each that comes (whichever thread
    the system hands it to, torch's included), and as the block ends each is raised again under the handlers there
    were (Ctrl-C: a KeyboardInterrupt there; SIGTERM by default: the process ends). A signal ignored stays ignored.
    Handlers can be set in the main thread only: elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came = []
    kinds = [getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n)]
    old = {s: signal.signal(s, lambda n, frame: came.append(n)) for s in kinds
           if signal.getsignal(s) not in (signal.SIG_IGN, None)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(came):
            signal.raise_signal(s)


def clean_killed_adds(dest):
    """What a killed add left beside dest (models/NAME): .NAME.PID.tmp, the copy it was making, removed;
    .NAME.PID.old, the shipped folder it had set aside, put back when dest is missing, else removed. Only a process
    that is gone: a live add's files are its own. Each said in a line."""
    for p in sorted(dest.parent.glob(f".{glob.escape(dest.name)}.*")):
        pid, _, kind = p.name[len(dest.name) + 2:].partition(".")
        if kind not in ("tmp", "old") or not pid.isdigit() or outputs.pid_alive(int(pid)):
            continue
        if kind == "old" and not os.path.lexists(dest):
            p.rename(dest)
            print(f"note: put models/{dest.name}/ back from {p.name}, where a killed `ship add` (pid {pid}) had set "
                  "it aside", file=sys.stderr)
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        if not os.path.lexists(p):
            print(f"note: removed {p}, what a killed `ship add` (pid {pid}) left", file=sys.stderr)


def recorded(rec):
    sha = rec.get("sha256")
    return sha.get("model.safetensors") if isinstance(sha, dict) else sha


def card(name, rec, rows):
    """The model card: what the model is, how it was made, its text and their licences, its sha256, its rows here."""
    a, held, text = rec["args"], rec.get("held_out") or {}, rec.get("text", {})
    rebuilt = f"{a['name']}-rebuilt" if a["name"] == name or (checkpoint.MODELS / a["name"]).is_dir() else a["name"]
    hours = rec.get("train_seconds", 0) / 3600
    cpu = rec.get("cpu") or {}
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in a.items() if k in (
        "layers", "hidden", "heads", "steps", "batch_size", "lr", "warmup", "dropout", "precision", "threads", "seed"))
    lines = [f"# {name}", "",
             f"A BERT pretrained from scratch by sgbert's pretrain.py, on a CPU, as the offline stand-in for "
             f"bert-base-uncased: {a['layers']} layers, hidden {a['hidden']}, {a['heads']} heads (BERT-Mini's shape), "
             f"masked LM only ({rec.get('no_nsp', 'no next-sentence prediction')}). Its vocabulary is "
             f"bert-base-uncased's uncased WordPiece (taken from {text.get('tokenizer', a.get('tokenizer'))}). It is a raw "
             "model, not a sentence encoder: the repository fine-tunes it with SG-OPT and its rivals.", "",
             "| | |", "|---|---|",
             f"| model.safetensors sha256 | `{recorded(rec)}` |",
             f"| tokens seen | {rec.get('train_tokens_seen', 0):,} ({a['steps']:,} steps of {a['batch_size']} "
             f"{'packed segments' if a.get('pack') else 'sentences'}) |",
             f"| held-out masked LM | {held_out(held)} |",
             f"| made on | {cpu.get('model', rec.get('device'))} ({cpu.get('capability', '')}), torch "
             f"{rec.get('torch')}, {a.get('threads')} threads, {a.get('precision')}: {hours:.2f} h of training in "
             f"{len(rec.get('parts', [])) or 1} part(s), code {rec.get('git')} |", "",
             "## Its command", "", "```bash", *command({**a, "name": rebuilt}, text, flags), "```", "",
             "The same command on the same CPU kind and thread count gives the same bytes (pretrain.py: the batches, "
             "masks and float sums are fixed by the seed and the threads; the name is not among them"
             + (f": pretrain.py refuses {a['name']}, a shipped model's name, which `--model {a['name']}` reads)."
                if rebuilt != a["name"] else ")."), "",
             "## Its text", "",
             f"{text.get('train_sentences', 0):,} training sentences ({text.get('train_tokens', 0):,} tokens) and "
             f"{text.get('held_out_sentences', 0):,} held out. Left out: {text.get('left_out', '?')}: no evaluation "
             "sentence is in it."]
    sources = first_file(text).get("built_by", {}).get("sources", [])
    if sources:  # corpus.py's text: its packages and their licences
        lines += ["", "| source | package (registry, version) | licence | words |", "|---|---|---|---|"]
        lines += [f"| {s['name']} | {s['package']} ({s['registry']}, {s['version']}) | {s['licence']} | "
                  f"{s['words']:,} |" for s in sources]
    elif text.get("files"):  # a --text / --add-text file corpus.py did not write
        lines += ["", f"Its text file: {first_file(text).get('name')} (sha256 `{first_file(text).get('sha256', '?')}`), "
                  "not written by corpus.py: its sources are not recorded."]
    lines += ["", ("And the" if sources else "The") + " data folder's unlabelled sentences (its README and "
              "MANIFEST.tsv name each file's origin and terms), less every evaluation sentence: " + ", ".join(
                  f"{s['name']} {s['kept']:,}" for s in text.get("sources", []) if not s["name"].startswith("--add"))
              + ".", "", "## Its rows here", "",
              "The 7 STS tasks' average (Spearman x100, `all` protocol; mean +- std over seeds) of the runs made on "
              "these exact weights: the records under results/ that name this sha256, each row with its command (S: "
              f"a seed). `python -m lab.ship check {name}` re-runs [CLS], mean, whitening and SG-OPT seed 1 beside them.",
              "", "| row | n | avg | records | command |", "|---|---|---|---|---|"]
    for (script, *flags), runs in grouped(rows).items():
        avgs = [a for _, a in runs]
        spread = f" +- {statistics.stdev(avgs):.2f}" if len(avgs) > 1 else ""
        where = ", ".join(sorted({str(p.parent.relative_to(ROOT)) for p, _ in runs}))
        seeded = " --seed S" if script == "train.py" and "--loss whitening" not in " ".join(flags) else ""
        entry = typed(script, flags)  # the row is named by what a reader runs: train.py, lab.train, ...
        label = entry.removeprefix("python ").removeprefix("-m ")
        row = " ".join([label, *flags]) if flags else f"{label} (SG-OPT: its defaults)"
        lines.append(f"| {row} | {len(avgs)} | {statistics.mean(avgs):.2f}{spread} | {where} | "
                     f"`{' '.join([entry, '--model', name, *flags])}{seeded}` |")
    return "\n".join(lines) + "\n"


def held_out(held):
    """The held-out masked LM cell: loss and accuracy, or why there are none (pretrain.py records null scores for a
    text that held no sentence out)."""
    loss, acc, n = held.get("mlm_loss"), held.get("mlm_acc"), held.get("sentences") or 0
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (loss, acc)):
        return f"not measured ({n:,} held-out sentences, {held.get('masked_tokens') or 0:,} masked tokens)"
    return f"loss {loss:.4f}, accuracy {100 * acc:.2f}% ({n:,} sentences)"


def command(a, text, flags):
    """How the record's text was made and pretrain.py's command: corpus.py and --add-text when its text came from
    there, a --text or --add-text file by its name, else the data folder's text alone (no text flag)."""
    f = first_file(text)
    if not f:
        return [f"python -m lab.pretrain --name {a['name']} {flags}" + (" --pack" if a.get("pack") else "")]
    made = [f"python -m lab.corpus   # text/{f.get('name')}: sha256 {f.get('sha256', '?')}"] if f.get("built_by") else []
    return made + [f"python -m lab.pretrain --name {a['name']} {f.get('flag', '--add-text')} text/{f.get('name')} {flags}"
                   + (" --pack" if a.get("pack") else "")]


def grouped(rows):
    """The records by row: {(script, flags without --seed): [(path, 7-task avg), ...]}, rows sorted by name."""
    out = {}
    for key, (path, rec) in sorted(rows.items(), key=lambda kv: str(kv[0])):
        flags = list(key[1:])
        if "then" in flags:  # train, then a transfer evaluation: no one command to print for it
            continue
        if "--seed" in flags:
            i = flags.index("--seed")
            del flags[i:i + 2]
        if sts_avg(rec) is not None:
            out.setdefault((key[0], *flags), []).append((path, sts_avg(rec)))
    return out


def first_file(text):
    return (text.get("files") or [{}])[0]


def shown(command):
    """A record's command without its own output paths (--json, --out): what a reader runs."""
    out, skip = [], False
    for x in command:
        if skip:
            skip = False
        elif x in ("--json", "--out"):
            skip = True
        elif x != "--overwrite":
            out.append(x)
    return out

# -----------------------------------------------------------------------------
# check


def check(args):
    folder, _ = shipped(args.name)
    try:
        want = checkpoint.recorded_sha256(folder)  # a shipped folder's names one, or this is one line
        checkpoint.read_recorded(folder, folder / "model.safetensors")
    except checkpoint.LoadError as e:
        die(e)
    print(f"models/{args.name}/model.safetensors: sha256 {want} (as its pretrain.json records) | {cpu.cpu_kind()}")
    rows, out = records_of(want), []
    todo = [r for r in ROWS if (r[3] or not args.quick) and (r[1][0] == "evaluate.py" or not args.untrained)]
    if not any(r[1] in rows for r in todo):
        die(f"no record under results/ names sha256 {want[:12]}...: nothing to check against")
    with tempfile.TemporaryDirectory() as tmp:
        for label, key, extra, _ in todo:
            if key not in rows:
                print(f"  {label:14s} no record of `{' '.join(key)}` on this model: skipped")
                continue
            path, r = rows[key]
            got = rerun(args, key, extra, Path(tmp) / f"{len(out)}")
            diff = got - sts_avg(r)
            out.append(abs(diff) <= TOLERANCE)
            print(f"  {label:14s} {got:6.2f}   record {sts_avg(r):6.2f} ({path.relative_to(ROOT)})   diff {diff:+.2f}",
                  flush=True)
    bad = out.count(False)
    print(f"{len(out) - bad} of {len(out)} rows within {TOLERANCE} of their records" + (
        "" if not bad else " (another CPU kind or torch can move a trained row; the untrained ones must match)"))
    return 1 if bad else 0


def typed(script, flags):
    """How a reader types a row's run: the core's script for the SG family and STS, else the lab's entry point."""
    import bert
    if script == "evaluate.py":  # the core evaluates bert.py's poolings; WK's and PromptBERT's are the lab's
        pooling = flags[flags.index("--pooling") + 1] if "--pooling" in flags else "cls"
        return f"python {script}" if pooling in bert.POOLINGS else f"python -m {ENTRY[script]}"
    loss = flags[flags.index("--loss") + 1] if "--loss" in flags else "opt"
    return f"python {script}" if loss in SG_LOSSES else f"python -m {ENTRY[script]}"


def rerun(args, key, extra, tmp):
    """The record's command on the shipped model (script, flags), its --json read back: the 7-task average."""
    script, *flags = key
    res = tmp.with_suffix(".json")
    cmd = [sys.executable, "-m", ENTRY[script], "--model", args.name, *flags, *extra, "--json", str(res)]
    if script == "train.py":
        cmd += ["--out", str(tmp.with_suffix(".safetensors"))]
    if args.data_dir:
        cmd += ["--data-dir", args.data_dir]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    p = subprocess.run(cmd, cwd=CODE, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["?"])[-1]
        die(f"`python {' '.join(cmd[1:])}` failed (exit {p.returncode}): {last}")
    return sts_avg(json.loads(res.read_text(encoding="utf-8")))


def main(argv=None):
    args = get_args(argv)
    return add(args) if args.cmd == "add" else check(args)


if __name__ == "__main__":
    sys.exit(cli.run(main, "ship.py"))
