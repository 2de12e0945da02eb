"""
The engine behind experiments.py: a sweep runs each variant x seed of an experiment (experiments.py's table, passed
in) once, as `python -m lab.train ...` or `python -m lab.evaluate ...` in a child process, and writes its record;
re-run, it skips what is finished. What --help of experiments.py promises, and how:

- A run's identity is a RunKey (model, script and flags, seed, second step). Its script says what the run is,
  "train.py" (a training) or "evaluate.py" (an evaluation), whichever entry point runs it (ENTRY). A finished run of
  another experiment with the same key is copied (same_as), with the per-pair cosines its run keeps made on that
  run's checkpoint (copied_cosines); one that trained the same model takes only its own second step on that run's
  checkpoint (trained_as). What a killed run of it left (its log, its checkpoint) never stays beside such a record.
- A record appears only when the run has finished: the child writes a hidden .result.json, the sweep writes the
  record atomically (outputs.write_json) from it. Only a valid record of this very run counts (report.read_record,
  then its key and the sha256 of its base weights and --data file: other_run); another run's record at its path is
  named, never run over.
- A run in flight holds an flock beside its record (outputs.output_lock), so two sweeps on one --out (two cores,
  two experiments or --variants) run each run once; the kernel drops the flock of a dead sweep, so SIGKILL leaves
  nothing in the way of a resume. A sweep that meets a run another live sweep holds waits on its flock at the end.
- A child runs in a process group of its own: SIGINT, SIGTERM, SIGHUP stop it with its group (stop_on_signals,
  stop_group), and on Linux it dies with the sweep even when the sweep is killed with SIGKILL (die_with_parent).
"""
import contextlib
import fcntl
import functools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from lab import eval_data
from checkpoint import display_name, file_sha256, weights_sha256
from outputs import OutputError, OutputLocked, output_lock, write_json, write_text
from cli import die, model_name
from lab.report import bad_record_line, get, needs, number, read_record, report, setting

ROOT = Path(__file__).resolve().parents[1]  # the repository root: the core and lab/
# a key's script -> the command that runs it: the lab's entry points take the core's methods and flags too
ENTRY = {"train.py": ["-m", "lab.train"], "evaluate.py": ["-m", "lab.evaluate"]}
TRAIN_KEYS = ("best_step", "base_dev", "dev", "test", "steps", "stop", "wall_seconds", "test_seconds", "ms_per_step",
              "fit_seconds")  # what a record keeps of train.py's result
EVAL_FLAGS = {"--device": "--device", "--eval-batch-size": "--batch-size"}  # a sweep's flags that evaluate.py takes
TRANSFER_TEXT = "{transfer_text}"  # a --data value: the file transfer_text() writes into --out


@dataclass(frozen=True)
class RunKey:
    """What makes two runs the same run: the base model (by its own name, as display_name gives it), the script and
    its flags in order (argparse: the last one wins), the seed (None: run once), and the evaluate.py flags of the
    second step on its checkpoint (none: no second step). The outputs (--out, --json), --overwrite and where the
    transfer text lies are not part of it. A record stores str(key), the JSON [model, [script, *flags, "then",
    *then], seed] that every record under results/ holds; RunKey.parse reads it back."""
    model: str
    command: tuple  # (script, *flags)
    seed: int | None
    then: tuple = ()  # evaluate.py's flags

    def __str__(self):
        return json.dumps([self.model, [*self.command, *(["then", *self.then] if self.then else [])], self.seed])

    @classmethod
    def parse(cls, text):
        """The key a record stores, or None when it is not one. The model is named by its own name again, so that
        records written before keys named models that way still match."""
        try:
            model, flags, seed = json.loads(text)
        except (TypeError, ValueError):
            return None
        if not (isinstance(model, str) and isinstance(flags, list) and all(isinstance(f, str) for f in flags)):
            return None
        i = flags.index("then") if "then" in flags else len(flags)
        return cls(display_name(model), tuple(flags[:i]), seed, tuple(flags[i + 1:]))

    def trained(self):
        """The run that trained this one's model: the same key without the second step."""
        return replace(self, then=())


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


def takes(v, flag):
    """Does variant v's train.py run take the sweep's flag (e.g. '--lr')? methods.py answers for v's method (train.py
    refuses the others). Imported here: list and report need no torch."""
    from lab import methods
    return methods.takes(next((g[1] for g in flag_groups(v.flags) if g[0] == "--loss" and len(g) > 1), "opt"), flag)


def flag_names(flags):
    return [g[0].partition("=")[0] for g in flag_groups(flags) if g[0].startswith("--")]


def untaken(runs, extra):
    """The sweep's flags that no run of it takes (train.py's by its method, evaluate.py's by EVAL_FLAGS)."""
    return [f for f in flag_names(extra) if not any(f in EVAL_FLAGS if r.v.evaluate_only else takes(r.v, f)
                                                    for r in runs)]


def overridden(runs, extra):
    """{flag: [variants]} of the sweep's flags that a train.py run's variant sets itself: its flags come after the
    sweep's (commands), so argparse keeps the variant's and the sweep's would be ignored. (evaluate.py runs and
    second steps take the sweep's flags after the variant's: there the sweep's win, as Table 6 means them to.)"""
    out = {}
    for f in flag_names(extra):
        for v in dict.fromkeys(r.v.name for r in runs if not r.v.evaluate_only and f in flag_names(r.v.flags)):
            out.setdefault(f, []).append(v)
    return out

# -----------------------------------------------------------------------------
# one run: its key and commands, its child processes, its record


@dataclass
class Run:
    """One variant x seed of an experiment, and where its files go."""
    exp: str  # the experiment's name
    v: object  # experiments.Variant
    seed: int  # None: run once (an evaluation, an unseeded fit)
    folder: Path
    then: bool = True  # takes its variant's second step (Experiment.then_seeds)
    cosines: bool = False  # its evaluate.py writes every STS test pair's cosine beside the record (keep_cosines)

    @property
    def stem(self):
        return "eval" if self.v.evaluate_only else "fit" if self.seed is None else f"seed-{self.seed}"

    def path(self, suffix, hidden=""):
        """Its file with this suffix; hidden: a run in flight's file (".result" -> .seed-1.result.json)."""
        return self.folder / f"{'.' if hidden else ''}{self.stem}{hidden}{suffix}"

    def __str__(self):
        return f"{self.exp}/{self.v.name}/{self.stem}"


def plan(name, exp, seeds, out, only=None):
    """The runs of a sweep, seed-major: every variant (those named in `only`, in its order, when given) gets its first
    seed before any gets its second."""
    runs = []
    variants = [next(v for v in exp.variants if v.name == n) for n in dict.fromkeys(only)] if only else exp.variants
    for i, seed in enumerate(seeds):
        for v in variants:
            once = v.evaluate_only or not v.seeded
            if not (once and i > 0):
                then = not exp.then_seeds or i < exp.then_seeds
                cosines = exp.cosines and i == 0  # the first seed's: report.py's paired bootstrap
                runs.append(Run(name, v, None if once else seed, Path(out) / name / v.name, then, cosines))
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
    key = RunKey(display_name(args.model), (script, *map(str, flags)), run.seed, tuple(map(str, second)))
    flags = [str(text) if f == TRANSFER_TEXT else f for f in flags]
    cmd = [*entry(script), "--model", str(args.model), *flags, "--json", str(run.path(".json", ".result"))]
    if not v.evaluate_only:
        cmd += ["--out", str(run.path(".safetensors")), "--overwrite", "--eval-all"]
    then = [*entry("evaluate.py"), "--ckpt", str(run.path(".safetensors")), *second,
            *sweep_flags(extra, rename=EVAL_FLAGS), *data_dir, "--json", str(run.path(".json", ".then"))]
    cosines = ["--cosines-out", str(run.path(".npz", ".cosines"))] if run.cosines else []  # an output: not in the key
    cmd, then = (cmd + cosines, then) if v.evaluate_only else (cmd, then + cosines)  # from evaluate.py's run
    if cosines and not v.evaluate_only and not second:  # a trained run's cosines: its checkpoint scored again
        then = cosines_command(run, args, extra, run.path(".safetensors"), part=".then")
    return key, cmd, then if second or cosines and not v.evaluate_only else None


def entry(script):
    """The command that runs a key's script ("train.py", "evaluate.py"): ENTRY's, with this Python."""
    return [sys.executable, *ENTRY[script]]


def keep_cosines(run):
    """The per-pair cosines file that the run's evaluate.py wrote (run.cosines), moved beside its record before the
    record is written, which names it with its sha256 (a file of another run at that path is never taken for its):
    {"cosines": {"file", "sha256"}}, or {} when there is none."""
    tmp, dest = run.path(".npz", ".cosines"), run.path(".cosines.npz")
    if not run.cosines or not tmp.is_file():
        return {}
    os.replace(tmp, dest)
    return {"cosines": {"file": dest.name, "sha256": file_sha256(dest)}}


def cosines_command(run, args, extra, ckpt=None, part=".result"):
    """evaluate.py writing the run's per-pair cosines alone (--tasks sts: the 7 STS tasks, no transfer) into the hidden
    file keep_cosines moves: of the checkpoint ckpt (a trained run's), or for an evaluation of the base model with
    its variant's flags (--tasks sts last: argparse keeps it)."""
    model = ["--ckpt", str(ckpt)] if ckpt else ["--model", str(args.model), *run.v.flags]
    data_dir = ["--data-dir", args.data_dir] if args.data_dir else []
    return [*entry("evaluate.py"), *model, *sweep_flags(extra, rename=EVAL_FLAGS), *data_dir,
            "--tasks", "sts", "--json", str(run.path(".json", part)), "--cosines-out",
            str(run.path(".npz", ".cosines"))]


def copied_cosines(run, rec, args, extra, tag):
    """A copied record (rec, same_as) of a run that keeps per-pair cosines (run.cosines), and its cosines made now by
    evaluate.py (cosines_command) on the model its scores came from: the checkpoint beside its source record (or
    beside the record of the run that trained it, trained_as) while it is the one that run wrote (kept_checkpoint),
    or for an evaluation the base model. Returns the record, naming them when they were made (keep_cosines), and the
    end of the run's progress line: what was done, or that they are missing and how to get them."""
    out, record = Path(args.out), run.path(".json")
    source = out / rec.get("trained_as", rec["same_as"])
    ckpt = None if run.v.evaluate_only else source.with_suffix(".safetensors")
    if ckpt and not kept_checkpoint(source, rec):
        return rec, (f"; no per-pair cosines: {ckpt.relative_to(out)} is gone (or is another model now), so its "
                     f"bootstrap cells stay n/a; to make them, put that checkpoint back and re-run, or move {record} "
                     f"and {out / rec['same_as']} aside and re-run (the run is then trained again)")
    cmd = cosines_command(run, args, extra, ckpt)
    print(f"{tag} {run}: copied from {rec['same_as']}; its per-pair cosines: {' '.join(shown(cmd))}", flush=True)
    log = run.path(".log")
    log.write_text(" ".join(shown(cmd)) + "\n")
    rc = run_child(cmd, log)
    ok = read_result(run.path(".json", ".result")) is not None and rc == 0
    cosines = keep_cosines(run) if ok else {}
    run.path(".npz", ".cosines").unlink(missing_ok=True)  # a failed step's, never taken for them
    if not cosines:
        return rec, f"; its per-pair cosines failed (exit {rc}): {last_line(log)} | log: {log}"
    made = ckpt.relative_to(out) if ckpt else model_name(args.model)
    return {**rec, **cosines}, f"; its per-pair cosines made from {made}"


def copy_lacking_cosines(run, record):
    """The record at a run's path when it is a copy (same_as) without the per-pair cosines its run keeps
    (run.cosines): one copied before copies had them made. Else None."""
    if not run.cosines:
        return None
    try:
        rec = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and "same_as" in rec and not isinstance(rec.get("cosines"), dict) else None


def find_finished(out, key, stem, paths, shas=None, checkpoint=False):
    """A finished valid run with this key and inputs (shas: hashes(), the sha256 of its base weights and --data file)
    anywhere under out (another experiment's, not itself a copy): (record path, record), or None. Records that are
    not valid are passed over here (their own experiment's report names them). checkpoint: only a run whose
    checkpoint is still beside its record, the one it wrote (the sha256 its record names, when it names one)."""
    for path in sorted(out.glob(f"*/*/{stem}.json")):
        rec, _ = read_record(path, paths)
        if rec and RunKey.parse(rec.get("key")) == key and "same_as" not in rec and other_run(rec, key, shas) is None \
                and (not checkpoint or kept_checkpoint(path, rec)):
            return path, rec
    return None


def kept_checkpoint(path, rec):
    """The checkpoint beside a record is still there and is the one its run wrote: the sha256 the record names (a
    record written before records named it is taken at its word), not a model trained or copied there since."""
    ckpt = path.with_suffix(".safetensors")
    return ckpt.is_file() and rec.get("checkpoint_sha256") in (None, file_sha256(ckpt))


def other_run(rec, key, shas):
    """What makes a valid record another run's than this one (key; shas: hashes(), the sha256 of its base weights and
    of its --data file), as a line, or None when it is this run's. A record written before records kept keys (or
    hashes) is taken at its word."""
    theirs = RunKey.parse(rec["key"]) if "key" in rec else key
    if theirs is None:
        return f"the record of another run (its key {rec['key']!r} is not a run's key)"

    def text(x):  # a part of a key as the line shows it
        return " ".join(x) if isinstance(x, tuple) and x else "none" if x in (None, ()) else x
    differ = [f"its {f} {text(getattr(theirs, f))}, this run's {text(getattr(key, f))}"
              for f in ("model", "command", "seed", "then") if getattr(theirs, f) != getattr(key, f)]
    if differ:
        return f"the record of another run ({'; '.join(differ)})"
    sha, theirs = (shas or {}).get("model_sha256"), rec.get("model_sha256")
    if sha and theirs not in (None, sha):
        return (f"the record of a run on other weights named {key.model} (sha256 {theirs[:16]}..., this run's "
                f"{sha[:16]}...)")
    sha, theirs = (shas or {}).get("generator_sha256"), rec.get("generator_sha256")
    if sha and theirs not in (None, sha):  # DiffCSE's generator: a model input like the base model
        return (f"the record of a run with another generator named {last_value(key.command, '--generator')} "
                f"(sha256 {str(theirs)[:16]}..., this run's {sha[:16]}...)")
    sha, theirs, data = (shas or {}).get("data_sha256"), rec.get("data_sha256"), data_file(key.command)
    if sha and theirs not in (None, sha):
        return (f"the record of a run on other data: --data {data} had sha256 {str(theirs)[:16]}... then, "
                f"{sha[:16]}... now (the file was rewritten)")
    return None


def data_file(flags):
    """The file a train.py command trains on (its last --data, as argparse keeps), or None (STS-B's sentences)."""
    return last_value(flags, "--data")


def last_value(flags, flag):
    """The value of a flag's last occurrence (argparse keeps the last), or None."""
    values = [g[1] for g in flag_groups(flags) if g[0] == flag and len(g) > 1]
    values += [g[0].partition("=")[2] for g in flag_groups(flags) if g[0].startswith(flag + "=")]
    return values[-1] if values else None


def hashes(cmd):
    """What a run's record names its inputs by, beside its key (which names them by name): the sha256 of the base
    model's weights and, for a run on a --data file, of that file as it is when the run starts."""
    data, generator = data_file(cmd[2:]), last_value(cmd[2:], "--generator")
    out = {"model_sha256": model_sha256(cmd[cmd.index("--model") + 1])}
    if generator:  # DiffCSE's generator, another model input (without the flag: --model itself)
        out["generator_sha256"] = model_sha256(generator)
    return {**out, "data_sha256": file_sha256(data)} if data and os.path.isfile(data) else out


def shown(cmd):
    """A command as a log and a record show it: "python -m lab.train" (or "python <script's name>"), the model by its
    own name (cli.model_name: the packaged MiniLM's folder `.../model` as all-MiniLM-L6-v2), never this machine's
    paths. Only shown: a run's identity (RunKey) names the model as display_name does."""
    n = 3 if cmd[1] == "-m" else 2
    out = [" ".join(["python", *cmd[1:n - 1], Path(cmd[n - 1]).name]), *cmd[n:]]
    return [model_name(x) if i and out[i - 1] == "--model" else x for i, x in enumerate(out)]


def run_child(cmd, log):
    """Run cmd with its output to the file log, in a process group of its own (Ctrl-C at the terminal reaches only
    us; we pass it on), and return its exit status. Interrupted (a signal, Ctrl-C), it stops the group first. ROOT
    leads its import path: `-m lab.train` finds this repository's lab from any folder."""
    proc = None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with open(log, "a") as f:
        try:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=die_with_parent(), env=env)
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


def execute(run, cmd, then, tag, trained=None):
    """Run the run's command (or, when trained is another experiment's run that trained this very model: (record
    path, record), only the second step, already on that run's checkpoint) and its second step: their results, or
    None when one failed (its line printed). A usage error (exit 2: every run would repeat it) stops the sweep."""
    log = run.path(".log")
    if trained:
        print(f"{tag} {run}: trained as {trained[0]}; on its checkpoint: {' '.join(shown(then))}", flush=True)
    else:
        print(f"{tag} {run}: {' '.join(shown(cmd))}", flush=True)
    steps = ([] if trained else [(cmd, run.path(".json", ".result"))]) + ([(then, run.path(".json", ".then"))]
                                                                         if then else [])
    log.write_text("")
    results = []
    for c, part in steps:
        with open(log, "a") as f:
            f.write(" ".join(shown(c)) + "\n")
        part.unlink(missing_ok=True)  # what a killed sweep's child left never passes for this child's result
        rc = run_child(c, log)
        if rc == 2:
            die(f"{last_line(log).removeprefix('error: ')} ({run}: {shown(c)[0]} refused its input, as every "
                f"run would; the sweep stops. Log: {log})")
        results.append(read_result(part))
        if rc != 0 or results[-1] is None:
            why = f"exit {rc}" if rc else f"no valid result in {part.name}"
            print(f"  {run}: failed ({why}): {last_line(log)} | log: {log}", flush=True)
            return None
    return results


def record_of(run, key, cmd, then, results, seconds, shas, trained=None):
    """The record of a finished run: its identity, its commands as shown, its inputs' sha256 (shas), the sha256 of the
    checkpoint it trained (or evaluated: trained_as), its scores."""
    result = {"sts": trained[1].get("sts"), **(trained[1].get("train") or {})} if trained else results[0]
    second = results[-1] if then else {}
    ckpt = trained[0].with_suffix(".safetensors") if trained else run.path(".safetensors")
    return {
        "experiment": run.exp, "variant": run.v.name, "seed": run.seed, "key": str(key), "command": shown(cmd),
        **shas,  # which weights the model's name meant, which text the --data file held
        **({"checkpoint_sha256": file_sha256(ckpt)} if not run.v.evaluate_only and ckpt.is_file() else {}),
        **({"then": shown(then)} if then else {}), "seconds": seconds, "sts": result.get("sts"),
        **({"trained_as": trained[0].relative_to(run.folder.parents[1]).as_posix()} if trained else {}),  # in out
        "transfer": second.get("transfer") or result.get("transfer"),
        "train": None if run.v.evaluate_only else {k: result[k] for k in TRAIN_KEYS if k in result}}


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
        sents = [s for task in ("MR", "CR", "SUBJ", "MPQA") for s in eval_data.load_transfer(task, data_dir)["all"][0] if s]
        random.Random(seed).shuffle(sents)
        write_text(dest, "\n".join(sents[:n]) + "\n")
    return dest

# -----------------------------------------------------------------------------
# a sweep: every run once, shared with other sweeps of the same folder

STATUS = {"done": "already finished", "ran": "run now", "copied": "copied", "others": "run by another process",
          "failed": "failed", "held": "held by another process", "bad": "not run (a bad record)",
          "other": "not run (the record of another run)", "badlock": "not run (a bad lock)"}


def run_one(run, exp, args, extra, text, tag, t_sweep):
    """Run one variant x seed unless it is finished, held or can be copied: (status, detail), status one of STATUS's
    but 'others' (detail: the source, the log, the held lock and its owner, the line naming a bad record or lock, or
    (path, what differs) of another run's record at its path)."""
    record, (key, cmd, then) = run.path(".json"), commands(run, args, extra, text)
    shas = hashes(cmd)
    if record.exists():
        status = finished(run, exp, key, shas)
        if status[0] != "done" or copy_lacking_cosines(run, record) is None:
            return status
    run.folder.mkdir(parents=True, exist_ok=True)
    lock = lock_of(record)
    try:
        with output_lock(record):
            if record.exists():  # finished by another process between our look and our lock
                status = finished(run, exp, key, shas)
                rec = copy_lacking_cosines(run, record) if status[0] == "done" else None
                if rec is None:
                    return status
                rec, said = copied_cosines(run, rec, args, extra, tag)
                if "cosines" in rec:
                    write_json(record, rec)
                return "done", said
            return copy_or_run(run, exp, args, extra, key, shas, cmd, then, tag, t_sweep)
    except OutputLocked:
        return "held", f"{lock} (pid {owner(lock)})"
    except OutputError as e:  # the lock path is a folder, or a file we may not open
        return "badlock", f"warning: {e}; if no sweep is running on {args.out}, remove {lock} and re-run"


def finished(run, exp, key, shas):
    """A run whose record exists: ('done', None) when it is a valid record of this very run; ('bad', its line) when
    it is not valid (the report names it); ('other', (its path, what differs)) when it is another run's (other flags,
    other weights, another text in its --data file): never counted, reported or run over as this run's."""
    record = run.path(".json")
    rec, why = read_record(record, needs(exp, run.v))
    if not rec:
        return "bad", bad_record_line(record, why)
    other = other_run(rec, key, shas)
    return ("other", (record, other)) if other else ("done", None)


def copy_or_run(run, exp, args, extra, key, shas, cmd, then, tag, t_sweep):
    """With the run's lock held: copy the record of a finished run of another experiment with the same key (and
    make its per-pair cosines when the run keeps them), else run it (only its second step when another experiment's
    run trained this very model) and write its record."""
    record, out = run.path(".json"), Path(args.out)
    run.path(".npz", ".cosines").unlink(missing_ok=True)  # what a killed sweep's child left is never this run's
    same = None if exp.fresh else find_finished(out, key, run.stem, needs(exp, run.v), shas)
    if same:
        for f in (run.path(".log"), run.path(".safetensors")):  # a killed run's: a copy's model is its source's
            f.unlink(missing_ok=True)
        rec = {k: v for k, v in same[1].items() if k != "cosines"}  # a file beside the source, not here
        rec, said = {**rec, "same_as": same[0].relative_to(out).as_posix()}, ""
        if run.cosines:
            rec, said = copied_cosines(run, rec, args, extra, tag)
        write_json(record, rec)
        return "copied", f"{same[0]}{said}"
    trained = None if exp.fresh or not then else find_finished(
        out, key.trained(), run.stem, [("train", "wall_seconds")], shas, checkpoint=True)
    if trained:  # the second step reads that run's checkpoint; one a killed run of this one left is not its model
        run.path(".safetensors").unlink(missing_ok=True)
        i = then.index("--ckpt") + 1
        then = [*then[:i], str(trained[0].with_suffix(".safetensors")), *then[i + 1:]]
    t0 = time.time()
    results = execute(run, cmd, then, tag, trained)
    if results is None:
        return "failed", run.path(".log")
    rec = {**record_of(run, key, cmd, then, results, time.time() - t0, shas, trained), **keep_cosines(run)}
    write_json(record, rec)
    print(f"  {run}: done in {(time.time() - t0) / 60:.1f} min | {headline(rec)} | sweep "
          f"{(time.time() - t_sweep) / 60:.1f} min", flush=True)
    return "ran", run.path(".log")


def lock_of(record):
    return record.with_name(f".{record.name}.lock")  # outputs.output_lock's name for it


def owner(lock):
    """The pid a lock file names, as far as it can be read."""
    try:
        return lock.read_text(errors="replace").strip() or "?"
    except OSError:
        return "?"


def wait_for(lock):
    """Until the process that holds the flock on lock lets go of it (it finished, or died): a shared flock waits
    for its exclusive one. Nothing to wait for when the file is gone."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)


def sweep(name, exp, args, extra, data_dir):
    """Every run of the experiment once: ours, then (unless --no-wait) those other sweeps held, then the report
    and one summary line. Returns the exit status: 1 when a run failed or could not be run, else 0."""
    t0, runs, out = time.time(), plan(name, exp, args.seeds, args.out, args.variants), Path(args.out)
    uses_text = any(TRANSFER_TEXT in r.v.flags for r in runs)  # the rows this sweep runs (--variants)
    text = transfer_text(data_dir, out / "transfer-text.txt") if uses_text else None
    tally, held = {s: [] for s in STATUS}, []
    for i, run in enumerate(runs, 1):
        tag = f"[{i}/{len(runs)} | {(time.time() - t0) / 60:.1f} min]"
        status, detail = run_one(run, exp, args, extra, text, tag, t0)
        if status == "held" and not args.no_wait:
            held.append((tag, run, detail))
        else:
            tally[status].append(detail)
        said = {"done": f"finished earlier{detail or ''}", "copied": f"copied from {detail}",
                "held": f"held by {detail}"}
        if status in said:
            print(f"{tag} {run}: {said[status]}", flush=True)
        elif status == "badlock":
            print(detail, file=sys.stderr, flush=True)
    for tag, run, detail in held:  # each waited for on its lock; a run whose owner died without a record runs here
        print(f"waiting for {run}, held by {detail}", flush=True)
        status = "held"
        while status == "held":
            wait_for(lock_of(run.path(".json")))
            status, detail = run_one(run, exp, args, extra, text, tag, t0)
        tally["others" if status == "done" else status].append(detail)
        if status == "done":
            print(f"{tag} {run}: finished by another process{detail or ''}", flush=True)
        elif status == "badlock":
            print(detail, file=sys.stderr, flush=True)
    expect = {}  # the setting of each row this sweep ran: the report averages no run of another (one_setting)
    for run in runs:
        key, cmd, _ = commands(run, args, extra, text)
        expect.setdefault(run.v.name, setting({"key": str(key), **hashes(cmd)}))
    if not report(name, exp, out, left_out=dict(tally["other"]), expect=expect):  # named there, as a bad record is
        print(f"no finished runs of {name} to report yet", flush=True)
    counts = [f"{len(d)} {STATUS[s]}" + (f" ({'; '.join(map(str, d))})" if s in ("held", "failed") else "")
              for s, d in tally.items() if d]
    print(f"{name}: {len(runs)} runs: {', '.join(counts)}", flush=True)
    return 1 if any(tally[s] for s in ("failed", "held", "bad", "other", "badlock")) else 0

# -----------------------------------------------------------------------------
# signals: a stopped sweep stops its run in flight and releases its locks


class Stop(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP during a sweep (a KeyboardInterrupt, so that no `except Exception` swallows it)."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def stop_on_signals():
    """While the sweep runs, SIGINT, SIGTERM and SIGHUP raise Stop: the run in flight is stopped with its process
    group (run_child) and the locks are released on the way out. A signal ignored when we started stays ignored
    (`nohup python -m lab.experiments ...` keeps running when its terminal closes)."""
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
