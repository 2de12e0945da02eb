"""experiments.py. On the tiny BERT: a sweep runs real runs (python -m lab.train, python -m lab.evaluate), resumes
after a kill without re-running finished runs, shares identical runs across experiments, and its report equals numpy
over the run files.
With fake train.py / evaluate.py scripts (fast): bad records, failing runs, usage errors, signals, locks, two
sweeps at once, bad flags, and the tables of Table 4, Table 6 and Figure 4 from their records."""
import contextlib
import errno
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
import types
from types import SimpleNamespace

import numpy as np
import pytest

import checkpoint
import data
import outputs
from lab import experiments
from lab import report
from lab import sweep
from lab.experiments import Experiment, Variant
from lab.sweep import RunKey
from test_train import world  # noqa: F401  (the tiny model, data and sentences fixture)


@pytest.fixture
def real_sweep(world, shared_data, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.setattr(experiments, "EXPERIMENTS", {
        "tiny": Experiment("two variants", [Variant("base", [], {"BERT-base": "74.62"}),
                                            Variant("sg", ["--loss", "sg"]),
                                            Variant("cls", ["--pooling", "cls"], evaluate_only=True)]),
        "other": Experiment("shares a run with tiny", [Variant("same", [])]),
    })
    calls = []
    real = sweep.run_child

    def counting_run(cmd, log):
        calls.append(cmd)
        return real(cmd, log)

    monkeypatch.setattr(sweep, "run_child", counting_run)
    out = tmp_path / "runs"
    argv = ["--model", str(world["model"]), "--seeds", "1", "2", "--out", str(out), "--data-dir", str(shared_data),
            "--data", str(world["sents"]), "--batch-size", "4", "--max-steps", "3", "--eval-every", "2",
            "--proj-size", "16", "--device", "cpu", "--eval-batch-size", "512"]
    return dict(argv=argv, out=out, calls=calls, real=real)


@pytest.mark.slow  # each run evaluates the 7 real STS tasks (a few seconds with the tiny BERT)
def test_sweep_resumes_after_a_kill_and_reports_numpy_means(real_sweep, monkeypatch):
    n = [0]

    def killed_on_third(cmd, log):  # the 3rd run is killed: the sweep stops there
        n[0] += 1
        if n[0] == 3:
            raise KeyboardInterrupt
        return real_sweep["real"](cmd, log)

    monkeypatch.setattr(sweep, "run_child", killed_on_third)
    with pytest.raises(SystemExit) as e:
        experiments.main(["tiny", *real_sweep["argv"]])
    assert e.value.code == 130
    out = real_sweep["out"] / "tiny"
    assert sorted(p.relative_to(out).as_posix() for p in out.glob("*/*.json")) == ["base/seed-1.json", "sg/seed-1.json"]
    assert not list(out.glob("*/.*.lock")), "the killed run's lock was not released"

    monkeypatch.setattr(sweep, "run_child", lambda c, log: real_sweep["calls"].append(c) or real_sweep["real"](c, log))
    experiments.main(["tiny", *real_sweep["argv"]])
    ran = [(c[2], c[c.index("--seed") + 1] if "--seed" in c else None) for c in real_sweep["calls"]]
    assert ran == [("lab.evaluate", None), ("lab.train", "2"), ("lab.train", "2")]  # only what was missing
    assert real_sweep["calls"][0][1:3] == ["-m", "lab.evaluate"]  # the lab's entry points run every run
    assert real_sweep["calls"][0][7:11] == ["--device", "cpu", "--batch-size", "512"]  # as the sweep's train.py runs

    summary = json.loads((out / "results.json").read_text())["variants"]
    for v in ("base", "sg"):
        recs = [json.loads((out / v / f"seed-{s}.json").read_text()) for s in (1, 2)]
        for task in [*data.TASKS, "avg"]:
            xs = [r["sts"][task]["all"] for r in recs]
            assert summary[v]["sts"][task] == pytest.approx([np.mean(xs), np.std(xs, ddof=1)])
        assert summary[v]["wall_seconds"][0] == pytest.approx(np.mean([r["train"]["wall_seconds"] for r in recs]))
        assert all(r["command"][2] == world_name(real_sweep) for r in recs)  # the model by its own name, not a path
    assert summary["cls"]["seeds"] == [None]
    md = (out / "results.md").read_text()
    assert "| base | 2 |" in md and "74.62" in md and "ms/step" in md

    real_sweep["calls"].clear()  # a third time: nothing to do; the other experiment copies tiny's identical run
    experiments.main(["tiny", *real_sweep["argv"]])
    experiments.main(["other", *real_sweep["argv"]])
    assert real_sweep["calls"] == []
    same = json.loads((real_sweep["out"] / "other/same/seed-1.json").read_text())
    base = json.loads((out / "base/seed-1.json").read_text())
    assert same["same_as"] == "tiny/base/seed-1.json" and same["sts"] == base["sts"]


def world_name(real_sweep):
    return Path(real_sweep["argv"][1]).name


def test_list_prints_every_experiment(capsys):
    experiments.main(["list"])
    out = capsys.readouterr().out
    for name, exp in experiments.EXPERIMENTS.items():
        assert out.count(f"{name}: ") >= 1
        assert all(v.name in out for v in exp.variants)
    assert "74.62" in out and "70.39" in out and "79.41" in out and "train.py, once" in out


def test_a_reader_that_closes_the_pipe_early_gets_no_traceback(tmp_path):
    """`report leaderboard | head`: head closes the pipe; no BrokenPipeError, and report still writes its files."""
    record(tmp_path / "table1/cls/eval.json", **{k: v for k, v in sts_record(70.0).items() if k != "train"})
    for argv in (["list"], ["report", "table1", "--out", str(tmp_path)]):
        p = subprocess.Popen([sys.executable, "-m", "lab.experiments", *argv], cwd=Path(experiments.__file__).parents[1],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        p.stdout.close()  # before the child prints a line: its first write meets a closed pipe
        err = p.stderr.read()
        assert p.wait(timeout=60) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err
    assert "| cls | 1 |" in (tmp_path / "table1/results.md").read_text()


@pytest.mark.parametrize("argv, message", [
    (["nope"], "unknown experiment 'nope'"),
    (["report", "nope"], "report nope"),
    (["table5", "--seed", "3"], "--seed is set per run"),
    (["table5", "--seeds", "-1"], "--seeds: -1 is not in 0 .. 2^32 - 1"),
    (["table5", "--seeds", "4294967296"], "4294967296 is not in 0 .. 2^32 - 1"),
    (["table5", "--seeds", "x"], "'x' is not an integer"),
    (["table5", "--seeds", "1", "2", "1"], "--seeds 1 2 1: a seed is given twice"),
    (["table5", "--plot", "a.png"], "only `report` takes"),
    (["report", "table5", "--variants", "sg"], "--variants chooses the rows a sweep runs"),
    (["table5", "--variants", "sg", "nope"], "--variants nope: table5 has no such variant; choose from sg-opt opt2"),
    (["report", "table5", "--plot", "a.png"], "table5 has none"),
    # words list and report do not take (issue 86): refused, not ignored; a near miss names the close flag
    (["list", "--bogus"], "--bogus: list takes no flags"),
    (["list", "table1"], "table1: list takes no experiment name"),
    (["report", "table5", "--bogus"], "--bogus: report takes no such flag; it takes --out and --plot"),
    (["report", "table5", "--plt", "x.png"], "--plt: report takes no such flag; did you mean --plot?"),
    (["report", "table5", "--plt=x.png"], "--plt: report takes no such flag; did you mean --plot?"),
    (["report", "table5", "--pl", "x.png"], "--pl: report takes no such flag; did you mean --plot?"),  # no abbreviation
    (["report", "table5", "--o", "runs"], "--o: report takes no such flag; did you mean --out?"),
])
def test_bad_commands_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        experiments.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_report_with_a_flag_it_does_not_take_writes_nothing(tmp_path):
    """Issue 86: `report table1 --out DIR --plt x.png` (a typo of --plot) exited 0 with no plot and no word. As the
    command is typed: exit 2, one line naming the flag and the close one, and no report written."""
    record(tmp_path / "table1/cls/eval.json", **{k: v for k, v in sts_record(70.0).items() if k != "train"})
    for flags, message in ((["--plt", "x.png"], "error: --plt: report takes no such flag; did you mean --plot?"),
                           (["--bogus"], "error: --bogus: report takes no such flag; it takes --out and --plot")):
        r = subprocess.run([sys.executable, "-m", "lab.experiments", "report", "table1", "--out", str(tmp_path),
                            *flags], cwd=Path(experiments.__file__).parents[1], capture_output=True, text=True,
                           timeout=60)
        assert (r.returncode, r.stderr.strip(), r.stdout) == (2, message, ""), r
    assert not (tmp_path / "table1/results.md").exists() and not (tmp_path / "x.png").exists()


def test_help_shows_defaults_and_one_example_a_line(capsys):
    with pytest.raises(SystemExit) as e:
        experiments.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "(default: runs)" in out and "(default: 1 2 3;" in out
    examples = out.split("examples:\n")[1].split("\n\n")[0].splitlines()
    assert len(examples) >= 4 and all(x.startswith("  python -m lab.experiments ") for x in examples)


# -----------------------------------------------------------------------------
# fake train.py and evaluate.py: each run takes a few tens of milliseconds

FAKE = r'''
import json, os, signal, subprocess, sys, time
argv, script = sys.argv[1:], os.path.basename(sys.argv[0])
def flag(name, default=None):
    return argv[argv.index(name) + 1] if name in argv else default
if os.environ.get("FAKE_LOG"):
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(json.dumps([script, argv]) + "\n")
if "--usage-error" in argv:
    sys.exit(print("step 1\nerror: --usage-error means nothing here", file=sys.stderr) or 2)
if "--fail" in argv:
    sys.exit(print("Traceback ...\nRuntimeError: boom", file=sys.stderr) or 1)
if os.environ.get("FAKE_SLEEP"):  # hang, with a grandchild that ignores SIGINT: only a group SIGKILL ends it
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, "
                              "signal.SIG_IGN); time.sleep(300)"])
    with open(os.environ["FAKE_PIDS"], "w") as f:
        f.write(f"{os.getpid()} {child.pid}\n")
    time.sleep(300)
time.sleep(float(flag("--sleep", 0)))
score = float(flag("--score", 70)) + 0.1 * int(flag("--seed", 0))
if "transfer-text" in str(flag("--data", "")):
    score -= 12 if flag("--loss") == "flow" else 2
TASKS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness"]
tasks = TASKS if flag("--tasks") in (None, "sts", "all") else [t for t in TASKS if t == flag("--tasks")]
sts = {t: {"all": score + i, "wmean": score, "mean": score} for i, t in enumerate(tasks)}
sts["avg"] = {p: sum(sts[t][p] for t in tasks) / max(len(tasks), 1) for p in ("all", "wmean", "mean")}
sts["seconds"] = {"mean": 4.0, "wk": 8.0}.get(flag("--pooling"), 5.0)
sts["task_seconds"] = {"STSBenchmark": 1.5} if "STSBenchmark" in tasks else {}
TRANSFER = ["MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC"]
transfer = {t: {"acc": 80.0 + i + (1 if "--ckpt" in argv else 0), "devacc": 80.0} for i, t in enumerate(TRANSFER)}
transfer["avg"] = sum(transfer[t]["acc"] for t in TRANSFER) / 7
if script == "evaluate.py":
    result = {"model": "m", "device": "cpu", "pooling": flag("--pooling"), "layer": -1, "layerwise": None,
              "sts": None if flag("--tasks") == "transfer" or "--ckpt" in argv else sts,
              "transfer": transfer if flag("--tasks") in ("transfer", "all") else None}
else:
    result = {"best_step": 2, "dev": score, "test": score, "steps": 3, "stop": None, "sts": sts,
              "wall_seconds": 60.0 + int(flag("--seed", 0)), "test_seconds": 2.0, "ms_per_step": 100.0}
    if flag("--loss") in ("whitening", "flow"):
        result["fit_seconds"] = 10.0
    open(flag("--out"), "w").write("weights")
if flag("--cosines-out"):  # evaluate.py's per-pair cosines: three pairs a task
    import numpy as np
    np.savez_compressed(flag("--cosines-out"), **{f"{t}.{k}": np.arange(3, dtype=np.float32) for t in TASKS
                                                  for k in ("cosine", "gold")})
with open(flag("--json"), "w") as f:
    json.dump(result, f)
'''


@pytest.fixture
def fake(tmp_path, monkeypatch, shared_data):
    """experiments.py driving fake scripts; argv: the sweep's usual flags; calls(): [(script, argv)] so far."""
    root = tmp_path / "root"
    root.mkdir()
    for script in ("train.py", "evaluate.py"):
        (root / script).write_text(FAKE)
    monkeypatch.setattr(sweep, "ROOT", root)
    monkeypatch.setattr(sweep, "ENTRY", {s: [str(root / s)] for s in ("train.py", "evaluate.py")})
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_LOG", str(log))
    out = tmp_path / "runs"

    def calls():
        return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    return SimpleNamespace(root=root, out=out, tmp=tmp_path, calls=calls, data=shared_data,
                           argv=["--model", "m", "--out", str(out), "--data-dir", str(shared_data), "--seeds", "1",
                                 "2"])


def use(monkeypatch, *variants, name="t", **kw):
    """Replace the experiments by one, of these variants."""
    monkeypatch.setattr(experiments, "EXPERIMENTS", {name: Experiment("test", list(variants), **kw)})


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def report_of(name, out):
    return report.report(name, experiments.EXPERIMENTS[name], out)


def record(path, **rec):
    write(path, json.dumps(rec))


def sts_record(score, seed=1):
    sts = {t: {"all": score} for t in [*data.TASKS, "avg"]}
    return dict(seed=seed, sts=sts, train=dict(best_step=1, wall_seconds=6.0, test_seconds=1.0, ms_per_step=9.0))


def test_report_from_run_files(tmp_path, monkeypatch):
    """The report alone, on hand-written run records: means, sample stds, the drop from the baseline, ms/step."""
    use(monkeypatch, Variant("a"), Variant("b"), drops={"b": "a"}, name="d")
    rng = np.random.default_rng(0)
    for v, shift in (("a", 0.0), ("b", -3.0)):
        for seed in (1, 2, 3):
            sts = {t: {"all": float(70 + shift + rng.normal())} for t in data.TASKS}
            sts["avg"] = {"all": float(np.mean([x["all"] for x in sts.values()]))}
            train = dict(best_step=100, dev=80.0, test=75.0, steps=300, stop=None, wall_seconds=60.0 * seed,
                         test_seconds=2.0, ms_per_step={"BERT_F fwd": 100.0, "BERT_T fwd+bwd": 300.0})
            record(tmp_path / "d" / v / f"seed-{seed}.json", seed=seed, sts=sts, train=train)
    s = report_of("d", tmp_path)
    for v in ("a", "b"):
        recs = [json.loads((tmp_path / "d" / v / f"seed-{k}.json").read_text()) for k in (1, 2, 3)]
        xs = [r["sts"]["avg"]["all"] for r in recs]
        assert s[v]["sts"]["avg"] == pytest.approx([np.mean(xs), np.std(xs, ddof=1)])
    md = (tmp_path / "d" / "results.md").read_text()
    assert f"{s['b']['sts']['avg'][0] - s['a']['sts']['avg'][0]:+.2f}" in md and "| 400 |" in md and "| 2.0 |" in md


def test_bad_records_are_named_and_missing_while_the_rest_reports(fake, monkeypatch, capsys):
    use(monkeypatch, *[Variant(v) for v in "abcdef"])
    t = fake.out / "t"
    record(t / "a/seed-1.json", **sts_record(70))
    record(t / "a/.seed-2.result.json", **sts_record(0))  # a run in flight: never read as a record
    record(t / "b/seed-1.json", **sts_record(72))
    write(t / "b/seed-2.json", '{"seed": 2, "sts": {')  # cut off
    write(t / "c/seed-1.json", "")
    write(t / "d/seed-1.json", "[1, 2]")
    bad = sts_record(71)
    del bad["sts"]["STS12"]
    record(t / "e/seed-1.json", **bad)
    (t / "f").mkdir()
    (t / "f/seed-1.json").write_bytes(b'{"seed": "\xff"}')
    s = experiments.main(["report", "t", "--out", str(fake.out)])
    out, err = capsys.readouterr()
    assert list(s) == ["a", "b"] and s["a"]["seeds"] == [1] and s["b"]["sts"]["avg"] == [72.0, 0.0]
    for path, why in (("b/seed-2.json", "not valid JSON"), ("c/seed-1.json", "empty"),
                      ("d/seed-1.json", "a JSON list"), ("e/seed-1.json", "'sts/STS12/all' is missing"),
                      ("f/seed-1.json", "not readable as UTF-8 text")):
        line = next(x for x in err.splitlines() if path in x)
        assert str(t / path) in line and why in line and "move the file aside and re-run" in line
    assert "Missing: b/seed-2.json" in out and "No finished runs yet: c, d, e, f." in out and "| a | 1 |" in out
    # find_finished passes over them too (no crash), and still finds the valid run
    assert sweep.find_finished(fake.out, RunKey("m", ("train.py",), 2), "seed-2", []) is None
    record(t / "a/seed-2.json", **sts_record(71), key=str(RunKey("m", ("train.py",), 2)))
    found = sweep.find_finished(fake.out, RunKey("m", ("train.py",), 2), "seed-2", [])
    assert found[0] == t / "a/seed-2.json"

    # the sweep: the corrupt record's run is not run over it, the others are, exit status 1
    with pytest.raises(SystemExit) as e:
        experiments.main(["t", *fake.argv])
    out, err = capsys.readouterr()
    assert e.value.code == 1 and "not run (a bad record)" in out.splitlines()[-1]
    assert (t / "b/seed-2.json").read_text() == '{"seed": 2, "sts": {'


def test_a_failed_run_gives_exit_1_and_a_summary_line_with_progress(fake, monkeypatch, capsys):
    use(monkeypatch, Variant("ok", ["--score", "75"]), Variant("boom", ["--fail"]), Variant("ev", evaluate_only=True))
    with pytest.raises(SystemExit) as e:
        experiments.main(["t", *fake.argv])
    out = capsys.readouterr().out
    assert e.value.code == 1
    assert "[1/5 | 0.0 min] t/ok/seed-1: python train.py --model m --score 75 --seed 1" in out
    assert "t/ok/seed-1: done in 0.0 min | STS avg 78.10" in out
    assert "t/boom/seed-1: failed (exit 1): RuntimeError: boom | log: " in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("t: 5 runs: 3 run now, 2 failed (") and str(fake.out / "t/boom/seed-1.log") in last
    assert not list(fake.out.rglob(".*.lock")) and not list(fake.out.rglob(".*.result.json"))
    capsys.readouterr()
    with pytest.raises(SystemExit):  # again: the finished runs are not run again, the failed ones are
        experiments.main(["t", *fake.argv])
    assert "t: 5 runs: 3 already finished, 2 failed" in capsys.readouterr().out


def test_a_usage_error_stops_the_sweep_at_once(fake, monkeypatch, capsys):
    use(monkeypatch, Variant("a", ["--usage-error"]), Variant("b"))
    with pytest.raises(SystemExit) as e:
        experiments.main(["t", *fake.argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(fake.calls()) == 1
    assert err[-1].startswith("error: --usage-error means nothing here (t/a/seed-1: python train.py refused its input")
    assert not list(fake.out.rglob(".*.lock"))


def test_report_of_a_folder_without_runs_is_an_error(fake, capsys):
    fake.out.mkdir()
    with pytest.raises(SystemExit) as e:
        experiments.main(["report", "table1", "--out", str(fake.out)])
    assert e.value.code == 1 and "no finished runs of table1 in" in capsys.readouterr().err


def test_report_needs_only_read_access(fake, monkeypatch, capsys):
    use(monkeypatch, Variant("a"))
    record(fake.out / "t/a/seed-1.json", **sts_record(70))
    (fake.out / "t/results.md").mkdir()  # cannot be written, even by root
    s = experiments.main(["report", "t", "--out", str(fake.out)])
    out, err = capsys.readouterr()
    assert s["a"]["sts"]["avg"] == [70.0, 0.0] and "| a | 1 |" in out
    assert "note: the report files in" in err and "were not written" in err


def test_out_that_cannot_be_written_is_one_line(fake, monkeypatch, capsys):
    use(monkeypatch, Variant("a"))
    fake.tmp.joinpath("file").write_text("")
    with pytest.raises(SystemExit) as e:
        experiments.main(["t", *fake.argv, "--out", str(fake.tmp / "file")])
    assert e.value.code == 2 and "is a file, not a folder" in capsys.readouterr().err

    def read_only(path, text):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
    monkeypatch.setattr(experiments, "write_text", read_only)
    with pytest.raises(SystemExit) as e:
        experiments.main(["t", *fake.argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"--out {fake.out}: cannot write there (Read-only file system)" in err
    assert fake.calls() == []


def test_missing_data_is_data_pys_line(fake, monkeypatch, capsys):
    use(monkeypatch, Variant("a"))
    with pytest.raises(SystemExit) as e:
        experiments.main(["t", *fake.argv, "--data-dir", str(fake.tmp / "nowhere")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert fake.calls() == []

# -----------------------------------------------------------------------------
# locks and other sweeps


def test_stale_locks_are_taken_over_and_a_lock_folder_is_named(fake, monkeypatch, capsys):
    use(monkeypatch, Variant("a"))
    folder = fake.out / "t/a"
    folder.mkdir(parents=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (folder / ".seed-1.json.lock").write_text("")  # a crash between creating and writing it
    (folder / ".seed-2.json.lock").write_bytes(b"\xff\xfe not utf-8")
    (folder / ".seed-3.json.lock").write_text(f"{dead.pid}\n")  # a dead owner
    (folder / ".seed-4.json.lock").mkdir()  # not ours to remove
    with pytest.raises(SystemExit) as e:
        experiments.main(["t", *fake.argv, "--seeds", "1", "2", "3", "4"])
    out, err = capsys.readouterr()
    assert e.value.code == 1 and [p.name for p in sorted(folder.glob("seed-*.json"))] == [
        "seed-1.json", "seed-2.json", "seed-3.json"]
    assert sorted(p.name for p in folder.glob(".*.lock")) == [".seed-4.json.lock"]
    line = next(x for x in err.splitlines() if ".seed-4.json.lock" in x)
    assert "remove" in line and "re-run" in line
    assert out.strip().splitlines()[-1] == "t: 4 runs: 3 run now, 1 not run (a bad lock)"


def test_a_run_held_by_a_live_process_is_left_with_no_wait_and_waited_for_without(fake, monkeypatch, capsys):
    use(monkeypatch, Variant("a"))
    record_path = fake.out / "t/a/seed-1.json"
    record_path.parent.mkdir(parents=True)
    with outputs.output_lock(record_path):  # another sweep's run in flight (here: this process)
        with pytest.raises(SystemExit) as e:
            experiments.main(["t", *fake.argv, "--no-wait"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert e.value.code == 1 and not record_path.exists()
    assert last == f"t: 2 runs: 1 run now, 1 held by another process ({record_path.parent}/.seed-1.json.lock " \
                   f"(pid {os.getpid()}))"

    def other_sweep(finish):  # holds the run a moment, then finishes it (or dies without a record)
        with outputs.output_lock(record_path):
            held.set()
            time.sleep(0.3)
            if finish:
                record(record_path, **sts_record(77), key=str(RunKey("m", ("train.py", "--seed", "1", "--data-dir",
                                                                         str(fake.data)), 1)))
    for finish, said in ((True, "1 run by another process"), (False, "1 run now")):
        record_path.unlink(missing_ok=True)
        held = threading.Event()
        th = threading.Thread(target=other_sweep, args=(finish,))
        th.start()
        held.wait()
        experiments.main(["t", *fake.argv])  # exit status 0: it waited
        th.join()
        assert capsys.readouterr().out.strip().splitlines()[-1] == f"t: 2 runs: 1 already finished, {said}"
    assert json.loads(record_path.read_text())["command"][0] == "python train.py"  # the dead owner's run, run here


def test_a_record_of_another_run_at_a_runs_path_is_never_reported_as_its(fake, monkeypatch, capsys):
    """The table edited (other flags), or the model's weights replaced under the same name: the records at the runs'
    paths are not this run's. They are neither counted as finished nor reported, nor copied into another experiment,
    nor run over: each is named in one line with what differs, and the sweep exits 1."""
    model = fake.tmp / "models" / "m"
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"weights 1")
    argv = [*fake.argv, "--model", str(model), "--seeds", "1"]
    use(monkeypatch, Variant("a", ["--score", "75"]))
    experiments.main(["t", *argv])
    record_path = fake.out / "t/a/seed-1.json"
    first = record_path.read_text()
    capsys.readouterr()

    def refused(line_has):
        with pytest.raises(SystemExit) as e:
            experiments.main(["t", *argv])
        out, err = capsys.readouterr()
        line = next(x for x in err.splitlines() if str(record_path) in x)
        assert e.value.code == 1 and all(x in line for x in line_has) and "move the file aside" in line, line
        assert out.strip().splitlines()[-1] == "t: 1 runs: 1 not run (the record of another run)", out
        assert "already finished" not in out and "| a |" not in out and "no finished runs of t to report" in out
        assert record_path.read_text() == first  # never run over
    use(monkeypatch, Variant("a", ["--score", "60"]))  # the table edited
    refused(["--score 75", "--score 60"])
    use(monkeypatch, Variant("a", ["--score", "75"]))
    (model / "model.safetensors").write_bytes(b"weights 2")  # other weights, the same name
    sweep.model_sha256.cache_clear()  # (once per sweep: a new sweep reads the new weights)
    refused(["other weights", hashlib.sha256(b"weights 1").hexdigest()[:16]])
    use(monkeypatch, Variant("a", ["--score", "75"]), name="u")  # nor copied: run anew on the new weights
    n = len(fake.calls())
    experiments.main(["u", *argv])
    copy = json.loads((fake.out / "u/a/seed-1.json").read_text())
    assert len(fake.calls()) == n + 1 and "same_as" not in copy
    assert copy["model_sha256"] == hashlib.sha256(b"weights 2").hexdigest()


def test_a_record_of_a_run_with_another_generator_is_another_runs(fake, monkeypatch, capsys):
    """DiffCSE's records named the generator by its name only, so a run with other generator weights of that name
    was taken for it. A record names its generator's sha256 (hashes): one with another generator's is another run's
    (named, never counted or run over, nor copied); one that names none is taken at its word, as with model_sha256."""
    gen = fake.tmp / "gen"
    gen.mkdir()
    (gen / "model.safetensors").write_bytes(b"generator 1")
    one = hashlib.sha256(b"generator 1").hexdigest()
    use(monkeypatch, Variant("a", ["--loss", "diffcse", "--generator", str(gen)]))
    argv = [*fake.argv, "--seeds", "1"]
    experiments.main(["t", *argv])
    path = fake.out / "t/a/seed-1.json"
    first = json.loads(path.read_text())
    assert first["generator_sha256"] == one
    (gen / "model.safetensors").write_bytes(b"generator 2")  # other weights, the same name
    sweep.model_sha256.cache_clear()  # (once per sweep: a new sweep reads the new weights)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        experiments.main(["t", *argv])
    out, err = capsys.readouterr()
    line = next(x for x in err.splitlines() if str(path) in x)
    assert e.value.code == 1 and f"another generator named {gen} (sha256 {one[:16]}..." in line, line
    assert out.strip().splitlines()[-1] == "t: 1 runs: 1 not run (the record of another run)"
    assert json.loads(path.read_text()) == first  # never run over
    use(monkeypatch, Variant("a", ["--loss", "diffcse", "--generator", str(gen)]), name="u")  # nor copied
    n = len(fake.calls())
    experiments.main(["u", *argv])
    assert len(fake.calls()) == n + 1 and "same_as" not in json.loads((fake.out / "u/a/seed-1.json").read_text())
    path.write_text(json.dumps({k: v for k, v in first.items() if k != "generator_sha256"}))  # an older record
    use(monkeypatch, Variant("a", ["--loss", "diffcse", "--generator", str(gen)]))
    capsys.readouterr()
    experiments.main(["t", *argv])
    assert "t/a/seed-1: finished earlier" in capsys.readouterr().out  # taken at its word
    key, shas = RunKey("m", ("train.py", "--generator", "g"), 1), {"model_sha256": "a" * 64, "generator_sha256": one}
    rec = {"key": str(key), "model_sha256": "a" * 64}
    assert sweep.other_run({**rec, "generator_sha256": one}, key, shas) is None
    assert sweep.other_run(rec, key, shas) is None
    assert "another generator named g (sha256 cccc" in sweep.other_run({**rec, "generator_sha256": "c" * 64}, key, shas)


def driver(fake, exp, *argv):
    """A sweep in a process of its own, on the fake scripts, of the experiment exp (a list of Variant kwargs)."""
    code = ("import json, signal, sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
            "signal.signal(signal.SIGINT, signal.default_int_handler); signal.signal(signal.SIGHUP, signal.SIG_DFL); "
            "from lab import experiments as x, sweep; "
            "sweep.ROOT = Path(sys.argv[2]); "
            "sweep.ENTRY = {s: [str(sweep.ROOT / s)] for s in ('train.py', 'evaluate.py')}; "
            "x.EXPERIMENTS = {'t': x.Experiment('test', [x.Variant(**v) for v in json.loads(sys.argv[3])])}; "
            "x.main(sys.argv[4:])")
    return [sys.executable, "-c", code, str(Path(experiments.__file__).parents[1]), str(fake.root), json.dumps(exp),
            "t", *fake.argv, *argv]


def test_two_sweeps_at_once_share_the_runs_and_report_the_same(fake):
    exp = [dict(name="a", flags=["--sleep", "0.2"]), dict(name="b", flags=["--sleep", "0.2", "--score", "60"])]
    procs = [subprocess.Popen(driver(fake, exp), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    runs = [(Path(c[0]).name, c[1][c[1].index("--seed") + 1], c[1][c[1].index("--json") + 1]) for c in fake.calls()]
    assert len(runs) == 4 and len(set(runs)) == 4  # each run once
    tables = [[x for x in out.splitlines() if x.startswith("|")] for out, _ in outs]
    assert tables[0] == tables[1] and len(tables[0]) == 2 + 2 + 2 + 2  # the STS table and the time table
    ran_here = [re.search(r"(\d+) run now", out.splitlines()[-1]) for out, _ in outs]
    assert sum(int(m[1]) for m in ran_here if m) == 4  # and each summary counts the other's runs as not its own


def alive(pid):
    """The process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except FileNotFoundError:
        return False


def sweep_in_flight(fake):
    """A sweep of one slow run, started in a process of its own: (its Popen, the run's pid, the run's child's pid),
    once the run is going."""
    pids = fake.tmp / "pids"
    env = {**os.environ, "FAKE_SLEEP": "1", "FAKE_PIDS": str(pids)}
    p = subprocess.Popen(driver(fake, [dict(name="a")], "--seeds", "1"), env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    for _ in range(600):
        if pids.exists() and pids.read_text().endswith("\n"):
            break
        time.sleep(0.05)
    return (p, *map(int, pids.read_text().split()))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_stops_the_run_and_its_children_and_the_same_command_resumes(fake, sig):
    p, child, grandchild = sweep_in_flight(fake)
    p.send_signal(sig)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 128 + sig
    assert err.strip().splitlines()[-1].startswith(f"experiments.py: stopped by {signal.Signals(sig).name}; ")
    for _ in range(100):  # the group's SIGKILL is on its way
        if not alive(child) and not alive(grandchild):
            break
        time.sleep(0.05)
    assert not alive(child) and not alive(grandchild), "an orphan outlived the sweep"
    assert not list(fake.out.rglob(".*.lock")) and not (fake.out / "t/a/seed-1.json").exists()
    r = subprocess.run(driver(fake, [dict(name="a")], "--seeds", "1"), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == "t: 1 runs: 1 run now"


def test_a_signal_ignored_at_start_stays_ignored():
    """`nohup python -m lab.experiments ...`: a closed terminal does not stop the sweep."""
    old, term = signal.signal(signal.SIGHUP, signal.SIG_IGN), signal.getsignal(signal.SIGTERM)
    try:
        with sweep.stop_on_signals():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_IGN, signal.SIG_DFL, term)
        assert signal.getsignal(signal.SIGTERM) == term  # restored
    finally:
        signal.signal(signal.SIGHUP, old)

# -----------------------------------------------------------------------------
# the paper's tables


def test_table1_has_the_baselines_and_the_paper_protocol_is_uncapped(fake):
    names = [v.name for v in experiments.EXPERIMENTS["table1"].variants]
    assert names == ["cls", "mean", "first-last", "wk", "whitening", "flow", "sg", "sg-opt"]
    runs = sweep.plan("table1", experiments.EXPERIMENTS["table1"], experiments.PAPER_SEEDS, fake.out)
    assert len(runs) == 4 + 1 + 3 * 8  # the evaluations and the whitening once, the rest at 8 seeds
    args = SimpleNamespace(model="m", data_dir=None, out=fake.out)
    cmds = {str(r): sweep.commands(r, args, ["--lam", "0.2", "--device", "cpu"], None)[1] for r in runs}
    assert not any("--max-steps" in c for c in cmds.values())
    assert cmds["table1/whitening/fit"][4:8] == ["--device", "cpu", "--loss", "whitening"]  # no --lam, no --seed
    assert "--seed" not in cmds["table1/whitening/fit"] and "--lam" not in cmds["table1/flow/seed-7890"]
    assert cmds["table1/wk/eval"][4:10] == ["--pooling", "wk", "--device", "cpu", "--json",
                                           str(fake.out / "table1/wk/.eval.result.json")]
    capped = sweep.commands(runs[5], args, ["--max-steps", "300", "--batch-size", "4"], None)[1]
    assert runs[5].v.name == "flow" and capped[4:8] == ["--max-steps", "300", "--batch-size", "4"]  # flow takes both


def test_table4_records_hold_the_transfer_results(fake, capsys):
    experiments.main(["table4", *fake.argv, "--seeds", "1"])
    t = fake.out / "table4"
    sg = json.loads((t / "sg-opt/seed-1.json").read_text())
    assert sg["then"][:4] == ["python evaluate.py", "--ckpt", str(t / "sg-opt/seed-1.safetensors"), "--tasks"]
    assert sg["transfer"]["MR"]["acc"] == 81.0 and sg["train"]["wall_seconds"] == 61.0
    assert json.loads((t / "wk/eval.json").read_text())["transfer"]["avg"] == 83.0
    out = capsys.readouterr().out
    assert "| sg-opt | 1 | 81.00 | 82.00 | 83.00 | 84.00 | 85.00 | 86.00 | 87.00 | 84.00 | 86.60 |" in out
    assert "| mean | 1 | 80.00 |" in out and "85.85 |" in out


def test_a_model_trained_elsewhere_only_takes_its_own_second_step(fake, capsys):
    experiments.main(["table1", *fake.argv, "--seeds", "1", "2"])
    (fake.out / "table1/sg-opt/seed-2.safetensors").unlink()  # seed 2's checkpoint is gone: trained again
    n = len(fake.calls())
    experiments.main(["table4", *fake.argv, "--seeds", "1", "2"])
    calls = fake.calls()[n:]
    trains = [c[1] for c in calls if c[0] == "train.py"]
    assert len(trains) == 1 and trains[0][trains[0].index("--seed") + 1] == "2"
    ckpts = [c[1][c[1].index("--ckpt") + 1] for c in calls if "--ckpt" in c[1]]
    assert ckpts == [str(fake.out / "table1/sg-opt/seed-1.safetensors"), str(fake.out / "table4/sg-opt/seed-2.safetensors")]
    one, t1 = (json.loads((fake.out / f"{e}/sg-opt/seed-1.json").read_text()) for e in ("table4", "table1"))
    assert one["trained_as"] == "table1/sg-opt/seed-1.json" and one["train"] == t1["train"] and one["sts"] == t1["sts"]
    assert one["transfer"]["MR"]["acc"] == 81.0 and one["key"] != t1["key"] and "then" not in json.loads(t1["key"])[1]
    assert one["then"][:3] == ["python evaluate.py", "--ckpt", ckpts[0]]  # the record names the checkpoint it evaluated
    experiments.main(["leaderboard", *fake.argv, "--seeds", "1"])  # table4's mean and wk are the leaderboard's
    lb = fake.out / "leaderboard"
    assert [json.loads((lb / f"{v}/eval.json").read_text()).get("same_as") for v in ("mean", "wk")] == [
        "table4/mean/eval.json", "table4/wk/eval.json"]
    assert json.loads((lb / "sg-opt/seed-1.json").read_text())["same_as"] == "table4/sg-opt/seed-1.json"


def test_table6_ratios_come_from_the_records_of_one_sweep(fake, capsys):
    record(fake.out / "table1/sg-opt/seed-1.json", **sts_record(1))  # same command elsewhere: not copied here
    experiments.main(["table6", *fake.argv])
    s = json.loads((fake.out / "table6/results.json").read_text())["variants"]
    assert s["mean"]["inference_seconds"] == [4.0, 0.0]
    assert s["sg-opt"]["train_seconds"] == pytest.approx([61.5, np.std([61, 62], ddof=1)])
    out = capsys.readouterr().out
    assert "| mean | 1 |  | 4.00 |  | x1.00 |  | x1.00 | 13.94 |" in out
    assert "| wk | 1 |  | 8.00 |  | x2.00 |  | x14.13 | 197.03 |" in out
    assert "| whitening | 1 | 10.0 | 2.00 | x2.50 | x0.50 |  |  |  |" in out
    assert "| sg-opt | 2 | 61.5 | 2.00 | x15.38 | x0.50 | x32.64 | x0.75 | 455.02 + 10.51 |" in out
    assert "one sweep on an otherwise idle machine" in out
    assert "same_as" not in (fake.out / "table6/sg-opt/seed-1.json").read_text()


def test_figure4_reports_the_drops_and_plot_needs_matplotlib(fake, monkeypatch, capsys):
    text = fake.out / "transfer-text.txt"
    experiments.main(["figure4", *fake.argv, "--variants", "sg-opt", "flow"])  # rows that do not read it
    assert not text.exists()
    experiments.main(["figure4", *fake.argv])
    assert len(text.read_text().splitlines()) == 17256
    calls = [c[1] for c in fake.calls() if "--data" in c[1]]
    assert len(calls) == 4 and all(c[c.index("--data") + 1] == str(text) for c in calls)
    out = capsys.readouterr().out
    assert "| sg-opt-transfer-text | sg-opt | -2.00 | -2.00 | -1.83 | -1.63 |" in out
    assert "| flow-transfer-text | flow | -12.00 | -12.00 | -12.16 | -4.19 |" in out
    d = json.loads((fake.out / "figure4/results.json").read_text())["drops"]
    assert d["flow-transfer-text"] == ["flow", pytest.approx([-12.0, -12.0])]
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    with pytest.raises(SystemExit) as e:
        experiments.main(["report", "figure4", "--out", str(fake.out), "--plot", str(fake.tmp / "f.png")])
    assert e.value.code == 2 and "--plot needs matplotlib: pip install matplotlib" in capsys.readouterr().err


def test_figure4_plot(fake, capsys):
    pytest.importorskip("matplotlib")
    experiments.main(["figure4", *fake.argv, "--seeds", "1"])
    experiments.main(["report", "figure4", "--out", str(fake.out), "--plot", str(fake.tmp / "f.png")])
    assert (fake.tmp / "f.png").stat().st_size > 1000
    assert not [p for p in fake.tmp.iterdir() if p.name.startswith(".f.png")]  # written atomically: no temp left


def test_plot_is_checked_as_an_output_before_the_report(fake, monkeypatch, capsys):
    """--plot was checked for its name alone: a folder named f.png ended the report in a traceback."""
    monkeypatch.setitem(sys.modules, "matplotlib", types.ModuleType("matplotlib"))  # as if installed
    (fake.tmp / "dir.png").mkdir()
    for plot, why in ((fake.tmp / "dir.png", "is a folder"), (fake.tmp / "no" / "f.png", "folder that does not exist")):
        with pytest.raises(SystemExit) as e:
            experiments.main(["report", "figure4", "--out", str(fake.out), "--plot", str(plot)])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith(f"error: --plot {plot} ") and why in err, err
        assert len(err.strip().splitlines()) == 1


def test_leaderboard_transfers_the_first_seed_only_and_reports_every_method(fake, capsys):
    record(fake.out / "methods/simcse/seed-2.json", **sts_record(60, seed=2),
           key=str(RunKey("m", ("train.py", "--loss", "simcse", "--seed", "2", "--data-dir", str(fake.data)),
                          2)))  # a finished run of the same command elsewhere: seed 2 is copied
    experiments.main(["leaderboard", *fake.argv])
    t = fake.out / "leaderboard"
    one, two = (json.loads((t / f"sg-opt/seed-{s}.json").read_text()) for s in (1, 2))
    assert one["then"][3:7] == ["--tasks", "transfer", "--transfer-config", "paper"] and one["transfer"]["MR"]
    assert "then" not in two and two["transfer"] is None and "then" not in json.loads(two["key"])[1]
    assert json.loads((t / "simcse/seed-2.json").read_text())["same_as"] == "methods/simcse/seed-2.json"
    cls = json.loads((t / "cls/eval.json").read_text())
    assert cls["sts"]["avg"]["all"] == 73.0 and cls["transfer"]["avg"] == 83.0  # --tasks all: both in one run
    out = capsys.readouterr().out
    assert "| sg-opt | 2 | 70.15 +- 0.07 |" in out and "| 84.00 (1) | 1.0 | 100 | 2.0 | 74.62 +- 0.25 |" in out
    assert "| cls | 1 | 70.00 | 71.00 | 72.00 | 73.00 | 74.00 | 75.00 | 76.00 | 73.00 | 83.00 (1) |  |  | 1.5 | 31.40" in out
    assert "| promptbert | 2 |" in out and "| sg-opt-mean | 2 |" in out
    assert "one epoch of the 17,256 STS-B sentences" in out


def test_a_copied_record_has_no_killed_runs_log_beside_it(fake, capsys):
    """A sweep killed in a run left its log (and hidden cosines); a later sweep that copies that run's record from
    another experiment wrote the record beside the killed run's log, which then read as the record's own."""
    record(fake.out / "methods/simcse/seed-2.json", **sts_record(60, seed=2),
           key=str(RunKey("m", ("train.py", "--loss", "simcse", "--seed", "2", "--data-dir", str(fake.data)), 2)))
    t = fake.out / "leaderboard/simcse"
    t.mkdir(parents=True)
    (t / "seed-2.log").write_text("evaluate.py --ckpt ... --tasks transfer\nevaluate.py: interrupted\n")
    (t / ".seed-2.cosines.npz").write_bytes(b"partial")
    experiments.main(["leaderboard", *fake.argv, "--variants", "simcse"])
    assert json.loads((t / "seed-2.json").read_text())["same_as"] == "methods/simcse/seed-2.json"
    assert not (t / "seed-2.log").exists() and not (t / ".seed-2.cosines.npz").exists()
    assert (t / "seed-1.log").exists()  # a run's own log stays


def test_a_copied_or_trained_as_record_has_no_killed_runs_checkpoint_beside_it(fake, capsys):
    """A sweep killed after its child wrote the checkpoint, the same run then finished by another experiment, the
    sweep run again: the record was copied, and the killed run's checkpoint (other bytes) stayed beside it; as it did
    beside a record whose second step took another experiment's checkpoint (trained_as)."""
    record(fake.out / "methods/simcse/seed-2.json", **sts_record(60, seed=2),
           key=str(RunKey("m", ("train.py", "--loss", "simcse", "--seed", "2", "--data-dir", str(fake.data)), 2)))
    t = fake.out / "leaderboard/simcse"
    t.mkdir(parents=True)
    (t / "seed-2.safetensors").write_bytes(b"a killed run's model")
    experiments.main(["leaderboard", *fake.argv, "--variants", "simcse"])
    assert json.loads((t / "seed-2.json").read_text())["same_as"] == "methods/simcse/seed-2.json"
    assert not (t / "seed-2.safetensors").exists() and (t / "seed-1.safetensors").read_bytes() == b"weights"
    experiments.main(["table1", *fake.argv, "--seeds", "1", "--variants", "sg-opt"])
    t4 = fake.out / "table4/sg-opt"
    t4.mkdir(parents=True)
    (t4 / "seed-1.safetensors").write_bytes(b"a killed run's model")
    experiments.main(["table4", *fake.argv, "--seeds", "1", "--variants", "sg-opt"])
    assert json.loads((t4 / "seed-1.json").read_text())["trained_as"] == "table1/sg-opt/seed-1.json"
    assert not (t4 / "seed-1.safetensors").exists()


def test_a_copied_leaderboard_row_gets_its_cosines_or_says_how(fake, capsys):
    """A leaderboard row copied from another experiment's record never had its per-pair cosines, and a re-run said
    "finished earlier": its bootstrap cells stayed n/a for good. The copy has evaluate.py make them, on its source's
    checkpoint (an evaluation: on the base model); with that checkpoint gone, its progress line says so and how to get
    them, and a later run, the checkpoint back, makes them."""
    experiments.main(["table4", *fake.argv, "--seeds", "1"])  # mean and wk evaluated, sg-opt trained then transfer
    ckpt, lb = fake.out / "table4/sg-opt/seed-1.safetensors", fake.out / "leaderboard"
    ckpt.rename(ckpt.with_suffix(".away"))
    n = len(fake.calls())
    capsys.readouterr()
    experiments.main(["leaderboard", *fake.argv, "--seeds", "1", "--variants", "mean", "sg-opt"])
    out = capsys.readouterr().out
    mean = json.loads((lb / "mean/eval.json").read_text())
    assert mean["same_as"] == "table4/mean/eval.json"
    assert mean["cosines"] == {"file": "eval.cosines.npz", "sha256": checkpoint.file_sha256(lb / "mean/eval.cosines.npz")}
    assert "mean/eval: copied from" in out and "; its per-pair cosines made from m" in out
    (call,) = fake.calls()[n:]
    assert call[0] == "evaluate.py" and call[1][:3] == ["--model", "m", "--pooling"] and "--cosines-out" in call[1]
    assert call[1][len(call[1]) - 1 - call[1][::-1].index("--tasks") + 1] == "sts"  # its last --tasks: no transfer
    sg = json.loads((lb / "sg-opt/seed-1.json").read_text())
    assert sg["same_as"] == "table4/sg-opt/seed-1.json" and "cosines" not in sg
    line = next(x for x in out.splitlines() if "sg-opt/seed-1: copied from" in x)
    assert "no per-pair cosines: table4/sg-opt/seed-1.safetensors is gone" in line and "re-run" in line, line
    ckpt.with_suffix(".away").rename(ckpt)  # the checkpoint back: the next run makes them
    n = len(fake.calls())
    experiments.main(["leaderboard", *fake.argv, "--seeds", "1", "--variants", "mean", "sg-opt"])
    out = capsys.readouterr().out
    sg = json.loads((lb / "sg-opt/seed-1.json").read_text())
    assert sg["cosines"]["sha256"] == checkpoint.file_sha256(lb / "sg-opt/seed-1.cosines.npz")
    assert "sg-opt/seed-1: finished earlier; its per-pair cosines made from table4/sg-opt/seed-1.safetensors" in out
    (call,) = fake.calls()[n:]
    assert call[1][:2] == ["--ckpt", str(ckpt)]
    n = len(fake.calls())
    experiments.main(["leaderboard", *fake.argv, "--seeds", "1", "--variants", "mean", "sg-opt"])
    assert len(fake.calls()) == n and "sg-opt/seed-1: finished earlier\n" in capsys.readouterr().out
    assert not list(lb.glob("*/.*.npz")) and not list(lb.glob("*/.*.json"))


def test_the_leaderboards_first_seed_keeps_every_sts_pairs_cosine_beside_its_record(fake, capsys):
    """Each row's first run (an evaluation's one, a fit's, seed 1's second step) has evaluate.py write every STS test
    pair's cosine (--cosines-out, an output: not in the key), moved beside the record, which names it and its
    sha256; no other run does, no hidden file stays, and the report names cosines that do not give the scores."""
    experiments.main(["leaderboard", *fake.argv])  # seeds 1 2
    lb, exp = fake.out / "leaderboard", experiments.EXPERIMENTS["leaderboard"]
    for v in exp.variants:
        stem = "eval" if v.evaluate_only else "seed-1" if v.seeded else "fit"
        rec, path = json.loads((lb / v.name / f"{stem}.json").read_text()), lb / v.name / f"{stem}.cosines.npz"
        assert rec["cosines"] == {"file": path.name, "sha256": checkpoint.file_sha256(path)}, v.name
        assert "--cosines-out" not in rec["key"] and "--cosines-out" in rec["then" if v.then else "command"]
    assert "cosines" not in json.loads((lb / "sg-opt/seed-2.json").read_text())
    assert not list(lb.glob("*/seed-2.cosines.npz")) and not list(lb.glob("*/.*.npz"))
    calls = [c for c in fake.calls() if "--cosines-out" in c[1]]
    assert len(calls) == len(exp.variants) and {c[0] for c in calls} == {"evaluate.py"}
    experiments.main(["methods", *fake.argv])
    assert not list((fake.out / "methods").glob("*/*.npz"))  # the leaderboard's only
    assert "| n/a (n < 2) | n/a (eval.cosines.npz gives STS12 " in capsys.readouterr().out  # the fake's: not its scores


def test_the_leaderboard_trains_nothing_the_methods_experiment_trained(fake, capsys):
    experiments.main(["methods", *fake.argv])  # every trained method at seeds 1, 2, STS only
    n = len(fake.calls())
    experiments.main(["leaderboard", *fake.argv])
    calls = fake.calls()[n:]
    lb = fake.out / "leaderboard"
    trained = ["sg-opt", "consert", "simcse", "promptbert", "sg-opt-mean", "esimcse", "diffcse", "sscl", "sg-opt-sscl"]
    assert {v.name for v in experiments.EXPERIMENTS["methods"].variants} == set(trained)
    losses = {c[1][c[1].index("--loss") + 1] if "--loss" in c[1] else "sg-opt" for c in calls if c[0] == "train.py"}
    assert losses == {"whitening", "flow", "sg"}  # the rows that are not methods' (Table 1's, on a real --out)
    for v in trained:  # seed 1: the methods run's checkpoint, then transfer; seed 2: the same run, copied
        one, two = (json.loads((lb / f"{v}/seed-{s}.json").read_text()) for s in (1, 2))
        assert one["trained_as"] == f"methods/{v}/seed-1.json" and one["transfer"]["MR"]["acc"] == 81.0
        assert two["same_as"] == f"methods/{v}/seed-2.json"


def test_variants_runs_only_those_rows_and_the_report_shows_every_finished_run(fake, capsys):
    experiments.main(["methods", *fake.argv, "--variants", "sg-opt-mean", "consert"])
    runs = [(Path(c[1][c[1].index("--out") + 1]).parent.name, c[1][c[1].index("--seed") + 1]) for c in fake.calls()]
    assert runs == [("sg-opt-mean", "1"), ("consert", "1"), ("sg-opt-mean", "2"), ("consert", "2")]  # in that order
    experiments.main(["methods", *fake.argv, "--variants", "simcse"])
    out = capsys.readouterr().out
    assert all(f"| {v} | 2 |" in out for v in ("consert", "simcse", "sg-opt-mean")) and "| promptbert |" not in out


def test_a_record_with_a_damaged_key_or_sha256_is_named_and_left_out(fake, monkeypatch, capsys):
    """Issue 86: a record whose key holds a number among its flags (AttributeError in report.setting), or whose
    model_sha256 is a number (TypeError in report.differences), ended `report` in a traceback. Each such record (a
    key or a sha256 in another shape) is named on stderr with what is wrong and left out; the others report. The
    sweep passes over them too: never a finished run, a copy's source, nor run over."""
    use(monkeypatch, Variant("a"), Variant("b"), name="t")
    t, sha = fake.out / "t", "ab" * 32

    def key(*flags, seed=1):
        return json.dumps(["m", ["train.py", *flags, "--seed", str(seed)], seed])
    for v in "ab":
        record(t / v / "seed-1.json", **sts_record(70.0), key=key(), model_sha256=sha)
    damaged = {  # seed-2 of a and b, a damaged part each time: what the line says
        "a": ({"key": key("--lr", 3, seed=2), "model_sha256": sha}, "'key' holds 3 among its flags, where each is"),
        "b": ({"key": key(seed=2), "model_sha256": 5}, "'model_sha256' is 5, not a sha256 (64 hex digits)")}
    for v, (parts, _) in damaged.items():
        record(t / v / "seed-2.json", **sts_record(80.0, 2), **parts)
    s = experiments.main(["report", "t", "--out", str(fake.out)])
    out, err = capsys.readouterr()
    assert s["a"]["seeds"] == s["b"]["seeds"] == [1] and s["a"]["sts"]["avg"] == [70.0, 0.0]
    for v, (_, why) in damaged.items():
        line = next(x for x in err.splitlines() if str(t / v / "seed-2.json") in x)
        assert line.startswith("warning: ") and why in line and "move the file aside and re-run" in line, line
        assert f"Missing: {v}/seed-2.json ({why}" in out
    assert "Traceback" not in err
    for parts, why in (({"key": 7}, "'key' is 7, not a run's key"), ({"key": "[1, 2"}, "'key' is '[1, 2', not a"),
                       ({"key": json.dumps(["m", "train.py", 1])}, "not a run's key"),
                       ({"data_sha256": ["ab"]}, "'data_sha256' is ['ab'], not a sha256"),
                       ({"generator_sha256": "xyz"}, "'generator_sha256' is 'xyz', not a sha256"),
                       ({"checkpoint_sha256": "ab" * 40}, f"'checkpoint_sha256' is '{'ab' * 18}..., not a")):
        record(t / "a" / "seed-2.json", **sts_record(80.0, 2), **parts)
        rec, got = report.read_record(t / "a" / "seed-2.json", [])
        assert rec is None and why in got, got
    # the sweep: a damaged record is a bad record (exit 1), not run over; nor taken as another experiment's run
    record(t / "a" / "seed-2.json", **sts_record(80.0, 2), **damaged["a"][0])
    assert sweep.find_finished(fake.out, RunKey("m", ("train.py", "--seed", "2"), 2), "seed-2", []) is None
    with pytest.raises(SystemExit) as e:
        experiments.main(["t", *fake.argv])
    out, err = capsys.readouterr()
    assert e.value.code == 1 and "not run (a bad record)" in out.splitlines()[-1] and "Traceback" not in err
    assert json.loads((t / "b" / "seed-2.json").read_text())["model_sha256"] == 5  # never run over


def test_report_names_the_base_weights_and_warns_when_two_differ(tmp_path, monkeypatch, capsys):
    """Records name the sha256 of the base model's weights; a table whose rows come from two weights says so, and a
    row never averages runs on two weights (the odd one is named and left out)."""
    use(monkeypatch, Variant("a"), Variant("b"), name="h")
    for seed, sha in ((1, "ab" * 32), (2, "ab" * 32)):
        record(tmp_path / "h" / "a" / f"seed-{seed}.json", **sts_record(70.0, seed), model_sha256=sha)
    report_of("h", tmp_path)
    md = (tmp_path / "h" / "results.md").read_text()
    assert f"sha256 {'ab' * 8}." in md and "warning" not in md
    record(tmp_path / "h" / "a" / "seed-3.json", **sts_record(80.0, 3), model_sha256="cd" * 32)
    s = report_of("h", tmp_path)
    md, err = (tmp_path / "h" / "results.md").read_text(), capsys.readouterr().err
    assert s["a"]["seeds"] == [1, 2] and s["a"]["sts"]["avg"] == [70.0, 0.0] and "warning" not in md
    assert "Missing: a/seed-3.json (a run of another setting than the 2 run(s) of a reported (its base weights' " \
           f"sha256 {'cd' * 8}..., theirs {'ab' * 8}...)" in md and "h/a/seed-3.json: a run of another setting" in err
    record(tmp_path / "h" / "b" / "seed-1.json", **sts_record(70.0, 1), model_sha256="cd" * 32)
    report_of("h", tmp_path)
    md = (tmp_path / "h" / "results.md").read_text()
    assert "2 different weights" in md and "2 different base weights" in capsys.readouterr().err


def test_a_report_never_averages_runs_of_different_settings(fake, monkeypatch, capsys):
    """Issue 53 item 6: `dropout --seeds 1 --max-steps 2`, then `--variants sg-opt --seeds 2 --max-steps 3`, then
    `report dropout` gave one mean +- std over runs with different flags. A row averages the runs of one setting: the
    sweep's own, or in `report` the one most of its runs share (on a tie, the newest run's); the others are named."""
    use(monkeypatch, Variant("sg-opt"), Variant("off", ["--score", "60"]), name="d")
    one = fake.out / "d/sg-opt/seed-1.json"
    experiments.main(["d", *fake.argv, "--seeds", "1", "--max-steps", "2"])
    os.utime(one, (1, 1))  # made long before the next
    capsys.readouterr()
    experiments.main(["d", *fake.argv, "--variants", "sg-opt", "--seeds", "2", "--max-steps", "3"])
    swept = capsys.readouterr()
    s = experiments.main(["report", "d", "--out", str(fake.out)])
    for out, err in (swept, capsys.readouterr()):  # the sweep's own report, then `report`
        assert "| sg-opt | 1 | 70.20 |" in out and "| off | 1 | 60.10 |" in out, out
        line = next(x for x in err.splitlines() if str(one) in x)
        assert "a run of another setting than" in line and "--max-steps 2" in line and "--max-steps 3" in line
        assert "Missing: sg-opt/seed-1.json (a run of another setting" in out
    assert s["sg-opt"]["seeds"] == [2]
    experiments.main(["d", *fake.argv, "--variants", "sg-opt", "--seeds", "3", "--max-steps", "2"])
    assert "| sg-opt | 2 | 70.20 +- 0.14 |" in capsys.readouterr().out  # the sweep's own: seeds 1 and 3
    s = experiments.main(["report", "d", "--out", str(fake.out)])
    assert s["sg-opt"]["seeds"] == [1, 3] and "Missing: sg-opt/seed-2.json" in capsys.readouterr().out  # most runs'
    records = [json.loads(p.read_text()) for p in sorted(fake.out.glob("d/off/seed-*.json"))]
    assert len(records) == 1 and report.setting(records[0])[1] == ("train.py", "--max-steps", "2", "--score", "60",
                                                                    "--data-dir", str(fake.data))  # not the seed


def test_a_runs_identity_is_its_command_and_a_records_key_reads_back_as_the_same_identity(fake):
    """Equal commands make equal keys (the outputs, the --out folder and a model's folder are not part of it); the
    key a record stores parses back into the same RunKey, as do the keys of every record committed under results/."""
    exp = experiments.EXPERIMENTS["leaderboard"]

    def keys(model, out, extra=()):
        args = SimpleNamespace(model=model, data_dir=None, out=out)
        return [sweep.commands(r, args, list(extra), None)[0] for r in sweep.plan("leaderboard", exp, [1, 2], out)]
    a, b = keys("m", fake.out), keys(str(fake.tmp / "models" / "m"), fake.tmp / "elsewhere")  # a folder named m
    assert a == b and len(set(a)) == len(a) and {hash(k) for k in a} == {hash(k) for k in b}
    assert keys("m", fake.out, ["--lr", "1e-4"]) != a and keys("other", fake.out) != a
    one = {str(k): k for k in a}
    sg1 = next(k for k in a if k.command[:2] == ("train.py", "--seed") and k.seed == 1)
    assert sg1 == RunKey("m", ("train.py", "--seed", "1"), 1, ("--tasks", "transfer", "--transfer-config", "paper"))
    assert str(sg1) == '["m", ["train.py", "--seed", "1", "then", "--tasks", "transfer", "--transfer-config", ' \
                       '"paper"], 1]'  # the format every record holds
    assert sg1.trained() == RunKey("m", ("train.py", "--seed", "1"), 1) and sg1.trained().then == ()
    assert all(RunKey.parse(s) == k for s, k in one.items())
    assert RunKey.parse(json.dumps(["/some/folder/m", ["train.py", "--seed", "1"], 1])) == sg1.trained()
    for junk in (None, "", "x", "[]", '["m", ["train.py"]]', '[1, ["train.py"], 1]', '["m", "train.py", 1]'):
        assert RunKey.parse(junk) is None
    results = Path(experiments.__file__).parents[1] / "results"
    stored = [rec["key"] for p in results.rglob("*.json") for rec in [json.loads(p.read_text())]
              if isinstance(rec, dict) and "key" in rec]
    assert stored and all(str(RunKey.parse(s)) == s for s in stored)
    experiments.main(["leaderboard", *fake.argv, "--seeds", "1", "--variants", "sg-opt"])
    rec = json.loads((fake.out / "leaderboard/sg-opt/seed-1.json").read_text())
    assert RunKey.parse(rec["key"]) == RunKey("m", ("train.py", "--seed", "1", "--data-dir", str(fake.data)), 1,
                                              ("--tasks", "transfer", "--transfer-config", "paper"))


def rebuilt_key(rec):
    """(the key the sweep computes today for a committed record's run, the record's own key), or None when its
    variant is gone or made another command then (the flags of an older definition)."""
    key, exp = RunKey.parse(rec["key"]), experiments.EXPERIMENTS.get(rec.get("experiment"))
    v = next((v for v in exp.variants if v.name == rec.get("variant")), None) if exp else None
    if key is None or v is None:
        return None
    flags, data_dir, own = list(key.command[1:]), None, [str(f) for f in v.flags]
    if len(flags) >= 2 and flags[-2] == "--data-dir":
        flags, data_dir = flags[:-2], flags[-1]
    if v.evaluate_only:  # the variant's flags, then the sweep's (renamed for evaluate.py)
        if flags[:len(own)] != own:
            return None
        extra = sweep.sweep_flags(flags[len(own):], rename={b: a for a, b in sweep.EVAL_FLAGS.items()})
    else:  # the sweep's flags, the variant's, the seed
        seed = [] if key.seed is None else ["--seed", str(key.seed)]
        flags, tail = flags[:len(flags) - len(seed)], flags[len(flags) - len(seed):]
        if tail != seed or own and flags[len(flags) - len(own):] != own:
            return None
        extra = flags[:len(flags) - len(own)]
    run = sweep.Run(rec["experiment"], v, key.seed, Path("out"), then=bool(key.then))
    args = SimpleNamespace(model=key.model, data_dir=data_dir, out="out")
    return sweep.commands(run, args, extra, None)[0], key


def test_committed_records_keep_the_key_the_sweep_computes_for_their_run():
    """Every record under results/ names its run by a RunKey whose script is "train.py" or "evaluate.py" (a training,
    an evaluation), whatever entry point runs it (python -m lab.train, lab.evaluate): the key the sweep computes today
    for the same variant, seed and flags equals the record's, so no finished run is run again because the entry point
    moved. (A record whose variant is gone or made another command then is passed over: at most 5%.)"""
    results = Path(experiments.__file__).parents[1] / "results"
    r = subprocess.run(["git", "-C", str(results.parent), "ls-files", "results"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("not a git checkout: which records are committed is unknown")
    recs = [rec for f in r.stdout.split() if f.endswith(".json")
            for rec in [json.loads((results.parent / f).read_text())] if isinstance(rec, dict) and "experiment" in rec
            and "key" in rec]
    pairs = [p for p in map(rebuilt_key, recs) if p]
    assert len(recs) > 100 and len(pairs) >= 0.95 * len(recs), (len(pairs), len(recs))
    assert [str(theirs) for ours, theirs in pairs if ours != theirs] == []
    assert {k.command[0] for _, k in pairs} == {"train.py", "evaluate.py"}
    run = sweep.Run("table1", experiments.EXPERIMENTS["table1"].variants[0], 1, Path("out"))
    key, cmd, _ = sweep.commands(run, SimpleNamespace(model="m", data_dir=None, out="out"), [], None)
    assert key.command[0] in ("train.py", "evaluate.py") and cmd[1:3] in (["-m", "lab.train"], ["-m", "lab.evaluate"])


def test_committed_records_name_no_folder_of_the_machine_they_ran_on():
    """Records, logs and reports under results/ name a model by its name ($M in the logs, as the README's commands
    do), never by this machine's folders (issue 22: a child's log header holds the --model path as given; the
    logs are edited before they are committed). Only what git tracks is checked: a sweep's runs in progress are not."""
    root = Path(experiments.__file__).parents[1]
    try:
        files = subprocess.run(["git", "ls-files", "results"], cwd=root, capture_output=True, text=True,
                               check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: which files are committed is unknown")
    machine = re.compile(r"(?<![\w$}])/(?:root|home|work|Users|tmp|private|mnt)/")
    texts = [f for f in files if f.endswith((".log", ".json", ".md", ".txt", ".csv"))]
    found = [f"{f}:{n}" for f in texts for n, line in enumerate((root / f).read_text(errors="replace").splitlines(), 1)
             if machine.search(line)]
    assert texts and not found, f"machine paths in committed results (replace them by $M or a relative path): {found[:5]}"


def test_a_record_names_the_sha256_of_the_model_it_ran_on(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    want = hashlib.sha256(b"weights").hexdigest()
    assert sweep.model_sha256(str(folder)) == want
    assert sweep.model_sha256(str(tmp_path / "absent")) is None


def test_every_sweep_flag_goes_to_every_row_that_takes_it(fake):
    """What a row takes is what methods.py says its method takes: --whiten-dim reaches the whitening, --batch-size and
    --lr the flow, neither the other way round, and --proj-size only the rows with the projection head."""
    args = SimpleNamespace(model="m", data_dir=None, out=fake.out)
    extra = ["--whiten-dim", "4", "--batch-size", "8", "--lr", "1e-3", "--proj-size", "16", "--precision", "fp32"]
    cmds = {r.v.name: sweep.commands(r, args, extra, None)[1][4:]
            for r in sweep.plan("leaderboard", experiments.EXPERIMENTS["leaderboard"], [1], fake.out)}

    def given(v):
        return {f for f in cmds[v] if f.startswith("--")} & {"--whiten-dim", "--batch-size", "--lr", "--proj-size",
                                                             "--precision"}
    assert given("whitening") == {"--whiten-dim"}
    assert given("flow") == {"--batch-size", "--lr"}
    assert given("simcse") == given("consert") == given("promptbert") == {"--batch-size", "--lr", "--precision"}
    assert given("sg-opt") == {"--batch-size", "--lr", "--proj-size", "--precision"}
    assert "--batch-size" not in cmds["cls"]  # evaluate.py rows: only --device and --eval-batch-size


def test_a_flag_no_run_of_the_sweep_takes_is_refused_in_one_line(fake, capsys):
    with pytest.raises(SystemExit) as e:
        experiments.main(["table5", *fake.argv, "--whiten-dim", "4"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert err.startswith("error: --whiten-dim means nothing for any run of table5") and fake.calls() == []


def test_a_record_with_a_nan_fit_time_is_named_and_left_out(fake, monkeypatch, capsys):
    use(monkeypatch, Variant("whitening", ["--loss", "whitening"], seeded=False), Variant("a"))
    t = fake.out / "t"
    rec = sts_record(70)
    rec["train"]["fit_seconds"] = float("nan")
    record(t / "whitening/fit.json", **rec)
    record(t / "a/seed-1.json", **sts_record(71))
    s = experiments.main(["report", "t", "--out", str(fake.out)])
    out, err = capsys.readouterr()
    assert list(s) == ["a"] and not [x for x in out.splitlines() if x.startswith("|") and "nan" in x.lower()]
    line = next(x for x in err.splitlines() if "whitening/fit.json" in x)
    assert "'train/fit_seconds' is not a number" in line and "Missing: whitening/fit.json" in out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_sweep_killed_with_sigkill_leaves_no_run_behind_and_resumes(fake):
    p, child, grandchild = sweep_in_flight(fake)
    try:
        p.kill()  # SIGKILL: no handler runs, nothing stops the group
        p.communicate(timeout=30)
        for _ in range(100):
            if not alive(child):
                break
            time.sleep(0.05)
        assert not alive(child), "the run outlived the sweep that was killed"
    finally:
        for pid in (child, grandchild):  # the fake run's own child (it ignores SIGINT) is not the sweep's to end
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    r = subprocess.run(driver(fake, [dict(name="a")], "--seeds", "1"), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == "t: 1 runs: 1 run now", r.stderr
    assert (fake.out / "t/a/seed-1.json").exists()


def test_a_sweep_flag_that_a_row_sets_itself_is_refused_in_one_line(fake, capsys):
    """Issue 53 item 8: `recipe --lr 1e-3` trained at the rows' own 1e-4 / 3e-4 / 5e-4 (a row's flags come after the
    sweep's, and argparse keeps the last). Refused, naming the rows; rows that do not set it still take it."""
    for argv, flag, rows in ((["recipe", "--lr", "1e-3"], "--lr", "simcse-lr-1e-4, simcse-lr-3e-4"),
                             (["recipe", "--variants", "sg-opt-lr-3e-4", "--lr=1e-3"], "--lr", "sg-opt-lr-3e-4 of"),
                             (["table5", "--tau", "0.05"], "--tau", "tau-0.1 of table5"),
                             (["figure4", "--data", str(fake.tmp / "a.txt")], "--data", "sg-opt-transfer-text, "
                                                                                      "flow-transfer-text of")):
        with pytest.raises(SystemExit) as e:
            experiments.main([argv[0], *fake.argv, *argv[1:]])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1, err
        assert err.startswith(f"error: {flag} is set by the row(s) ") and rows in err and "drop" in err, err
    assert fake.calls() == []
    args, extra = experiments.get_args(["table5", "--variants", "sg-opt", "opt2", "--tau", "0.05", *fake.argv])
    experiments.check_sweep(args, extra)  # no row of these sets --tau: no refusal
    args, extra = experiments.get_args(["table6", "--eval-batch-size", "64", *fake.argv])
    experiments.check_sweep(args, extra)  # evaluate.py rows take the sweep's flags after their own: it reaches them


def test_a_finished_run_on_a_rewritten_data_file_is_never_counted(fake, monkeypatch, capsys):
    """Issue 53 item 7: `recipe --data A.txt --seeds 1`, A.txt rewritten, then `--seeds 1 2` said "seed-1: finished
    earlier" and reported a row mixing two texts. A record names its --data file's sha256; a run on the file's
    other text is named and left out (never counted, reported, copied or run over), and the new seed runs."""
    use(monkeypatch, Variant("a"))
    text = fake.tmp / "A.txt"
    text.write_text("the first text\n")
    argv = [*fake.argv, "--data", str(text)]
    experiments.main(["t", *argv, "--seeds", "1"])
    path = fake.out / "t/a/seed-1.json"
    first = path.read_text()
    old = hashlib.sha256(b"the first text\n").hexdigest()
    assert json.loads(first)["data_sha256"] == old
    text.write_text("another text\n")
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        experiments.main(["t", *argv, "--seeds", "1", "2"])
    out, err = capsys.readouterr()
    line = next(x for x in err.splitlines() if str(path) in x)
    assert e.value.code == 1 and "other data" in line and old[:16] in line and "finished earlier" not in out
    assert out.strip().splitlines()[-1] == "t: 2 runs: 1 run now, 1 not run (the record of another run)"
    assert "| a | 1 |" in out and path.read_text() == first  # the report: seed 2 alone; seed 1 never run over
    assert json.loads((fake.out / "t/a/seed-2.json").read_text())["data_sha256"] == \
        hashlib.sha256(b"another text\n").hexdigest()
    use(monkeypatch, Variant("a"), name="u")  # nor copied into another experiment: run anew on the new text
    n = len(fake.calls())
    experiments.main(["u", *argv, "--seeds", "1"])
    assert len(fake.calls()) == n + 1 and "same_as" not in json.loads((fake.out / "u/a/seed-1.json").read_text())


def test_a_checkpoint_replaced_beside_its_record_is_not_taken_for_its_run(fake, capsys):
    """A record names the sha256 of the checkpoint its run wrote: another experiment's second step takes that
    checkpoint only while it is still the same file (not a model trained there by hand since): else it trains anew."""
    experiments.main(["table1", *fake.argv, "--seeds", "1", "--variants", "sg-opt"])
    ckpt = fake.out / "table1/sg-opt/seed-1.safetensors"
    rec = json.loads((fake.out / "table1/sg-opt/seed-1.json").read_text())
    assert rec["checkpoint_sha256"] == hashlib.sha256(ckpt.read_bytes()).hexdigest()
    ckpt.write_bytes(b"another model")
    n = len(fake.calls())
    experiments.main(["table4", *fake.argv, "--seeds", "1", "--variants", "sg-opt"])
    calls = fake.calls()[n:]
    assert [c[0] for c in calls] == ["train.py", "evaluate.py"]
    assert calls[1][1][calls[1][1].index("--ckpt") + 1] == str(fake.out / "table4/sg-opt/seed-1.safetensors")
    assert "trained_as" not in json.loads((fake.out / "table4/sg-opt/seed-1.json").read_text())


# -----------------------------------------------------------------------------
# the curve: report-curve over several models' results folders, by tokens seen


def pretrain_json(out, name, tokens, acc, sha, step=None, **args):
    """A model's pretraining record as pretrain.py writes it (the keys report-curve reads, and a few more); args: more
    of its flags (e.g. lr=1e-3)."""
    rec = dict(args=dict(name=name, layers=4, hidden=256, **args), train_tokens_seen=tokens, train_seconds=60.0,
               held_out=dict(sentences=968, masked_tokens=2066, mlm_loss=5.0, mlm_acc=acc),
               sha256={"model.safetensors": sha, "tokenizer.json": "1c" * 32})
    if step:
        rec["intermediate"] = dict(of=name, step=step, steps=4 * step)
    record(out / "pretrain" / "pretrain.json", **rec)


def curve_run(path, score, sha, seed=None, model="m"):
    """A run record of a curve row in the shape the sweep writes (its key, its model's sha256, the STS scores)."""
    row = path.parent.name
    flags = [f for v in experiments.EXPERIMENTS["curve"].variants if v.name == row for f in v.flags]
    script = "evaluate.py" if row in ("cls", "mean") else "train.py"
    rec = {k: v for k, v in sts_record(score, seed).items() if script == "train.py" or k != "train"}
    rec["sts"]["avg"]["all"] = score  # the 7-task average report-curve reads (every task the same score)
    key = json.dumps([model, [script, *flags, *(["--seed", str(seed)] if seed is not None else [])], seed])
    record(path, **rec, key=key, model_sha256=sha)


def curve_models(tmp_path, rng):
    """Three models' folders, given out of token order: (folders, {folder: sha256}, {(folder, row): [scores]})."""
    outs, shas, scores = [tmp_path / n for n in ("late", "early", "mid")], {}, {}
    for i, (out, tokens) in enumerate(zip(outs, (43_381_194, 7_160_266, 20_000_000))):
        shas[out] = f"{i + 1:x}" * 64
        pretrain_json(out, "raw-bert-mini-3" if out.name == "mid" else out.name, tokens, 0.25 + 0.05 * i,
                      shas[out], step=1000 if out.name == "mid" else None)
        for row, folder, seeds in (("cls", "table1", [None]), ("mean", "table1", [None]),
                                   ("whitening", "table1", [None]), ("sg-opt", "table1", [1, 2, 3]),
                                   ("simcse", "methods", [1, 2])):
            xs = scores[out, row] = [float(30 + 20 * rng.random()) for _ in seeds]
            for seed, x in zip(seeds, xs):
                curve_run(out / folder / row / (f"seed-{seed}.json" if seed else
                                                "fit.json" if row == "whitening" else "eval.json"), x, shas[out], seed)
    return outs, shas, scores


def test_the_curve_is_numpy_over_the_records_by_tokens_seen(tmp_path, capsys):
    """Each cell is numpy's mean and sample std over its runs (SG-OPT seeds 1 2 and SimCSE seed 1 by default, the
    paper's 8 with --seeds), the models sorted by tokens seen, SG-OPT minus mean from the means; written atomically
    as the .json and the .md beside it."""
    outs, shas, scores = curve_models(tmp_path, np.random.default_rng(0))
    js = tmp_path / "curve.json"
    experiments.main(["report-curve", *map(str, outs), "--json", str(js)])
    got = json.loads(js.read_text())
    assert [m["name"] for m in got["models"]] == ["early", "raw-bert-mini-3-step1000", "late"]
    assert [m["train_tokens_seen"] for m in got["models"]] == [7_160_266, 20_000_000, 43_381_194]
    for m in got["models"]:
        out = Path(m["out"])
        assert m["sha256"] == shas[out]
        for row, seeds in (("cls", 1), ("mean", 1), ("whitening", 1), ("sg-opt", 2), ("simcse", 1)):
            xs = scores[out, row][:seeds]
            want = [np.mean(xs), np.std(xs, ddof=1) if seeds > 1 else 0.0]
            assert m["rows"][row]["avg"] == pytest.approx(want) and m["rows"][row]["n"] == seeds
        assert m["sg-opt - mean"] == pytest.approx(np.mean(scores[out, "sg-opt"][:2]) - scores[out, "mean"][0])
    md = js.with_suffix(".md").read_text()
    assert capsys.readouterr().out.startswith(md)  # printed as written
    early = got["models"][0]["rows"]["sg-opt"]["avg"]
    assert "| early | 7.16M | 30.00% | " in md and f"| {early[0]:.2f} +- {early[1]:.2f} (2) |" in md
    assert "| BERT-base (the paper) |  |  | 31.40 | 52.57 |  | 74.62 +- 0.25 | 76.25 (SimCSE) | +22.05 |" in md
    assert md.index("| early |") < md.index("| raw-bert-mini-3-step1000 |") < md.index("| late |")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".curve")]  # no temp file left
    experiments.main(["report-curve", *map(str, outs), "--seeds", *map(str, experiments.PAPER_SEEDS)])
    out = capsys.readouterr().out
    xs = scores[outs[0], "sg-opt"]
    assert f"| {np.mean(xs):.2f} +- {np.std(xs, ddof=1):.2f} (3) |" in out and "table1/sg-opt: 1 2 3 |" in out


def test_a_run_of_another_models_weights_is_named_and_left_out(tmp_path, capsys):
    outs, shas, scores = curve_models(tmp_path, np.random.default_rng(1))
    late = outs[0]
    curve_run(late / "table1/sg-opt/seed-2.json", 99.0, shas[outs[1]], seed=2)  # early's run, in late's folder
    curve_run(late / "table1/mean/eval.json", 99.0, None)  # names no weights: cannot be this model's
    models = experiments.main(["report-curve", *map(str, outs)])
    m = next(m for m in models if m["out"] == str(late))
    assert m["rows"]["sg-opt"]["seeds"] == [1] and m["rows"]["sg-opt"]["avg"] == [scores[late, "sg-opt"][0], 0.0]
    assert "mean" not in m["rows"] and "sg-opt - mean" not in m
    cap = capsys.readouterr()
    for name, theirs in (("sg-opt/seed-2.json", f"{shas[outs[1]][:16]}..."), ("mean/eval.json", "none")):
        why = f"a run on other weights (its model_sha256 {theirs}, this folder's model {shas[late][:16]}... by " \
              "pretrain/pretrain.json): never mixed in"
        path = late / "table1" / name
        assert f"{path}: {why}" in cap.err and f"Left out: {path} ({why})" in cap.out


def test_a_rows_runs_come_from_curve_then_table1_then_methods(tmp_path, capsys):
    """The first folder with runs of the model's weights gives the row (never a mix of two), and the output says
    which."""
    out, sha = tmp_path / "m", "ab" * 32
    pretrain_json(out, "m", 1000, 0.3, sha)
    for folder, score in (("methods", 40.0), ("table1", 50.0), ("curve", 60.0)):
        for seed in (1, 2):
            curve_run(out / folder / "sg-opt" / f"seed-{seed}.json", score + seed, sha, seed)
    curve_run(out / "curve/simcse/seed-1.json", 70.0, "cd" * 32, 1)  # another model's: not curve/'s row
    curve_run(out / "methods/simcse/seed-1.json", 33.0, sha, 1)
    for want, folder in ((61.5, "curve"), (51.5, "table1"), (41.5, "methods")):
        models = experiments.main(["report-curve", str(out)])
        rows = models[0]["rows"]
        assert rows["sg-opt"]["avg"][0] == want and rows["sg-opt"]["runs"] == f"{folder}/sg-opt"
        assert rows["simcse"]["avg"][0] == 33.0 and rows["simcse"]["runs"] == "methods/simcse"
        assert f"| {folder}/sg-opt: 1 2 | methods/simcse: 1 |" in capsys.readouterr().out
        for p in (out / folder / "sg-opt").iterdir():
            p.unlink()


def test_the_curve_sweep_copies_table1s_and_methods_runs_and_reports_them(fake, capsys):
    """The curve's rows are table1's and methods' commands: their finished runs on the same --out are copied, not
    run again; report-curve then reads the curve's own folder, on the weights its pretrain.json names."""
    model = fake.tmp / "raw-bert-mini-3-step1000"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    pretrain_json(fake.out, "raw-bert-mini-3", 5_000_000, 0.3, hashlib.sha256(b"weights").hexdigest(), step=1000)
    argv = [*fake.argv[2:-3], "--model", str(model)]
    experiments.main(["table1", *argv, "--variants", "cls", "mean", "whitening", "sg-opt", "--seeds", "1", "2"])
    experiments.main(["methods", *argv, "--variants", "simcse", "--seeds", "1"])
    n = len(fake.calls())
    experiments.main(["curve", *argv, "--variants", "cls", "mean", "whitening", "sg-opt", "--seeds", "1", "2"])
    experiments.main(["curve", *argv, "--variants", "simcse", "--seeds", "1"])
    assert fake.calls()[n:] == []  # nothing run again
    assert json.loads((fake.out / "curve/simcse/seed-1.json").read_text())["same_as"] == "methods/simcse/seed-1.json"
    capsys.readouterr()
    models = experiments.main(["report-curve", str(fake.out)])
    rows = models[0]["rows"]
    assert {r: c["runs"] for r, c in rows.items()} == {r: f"curve/{r}" for r in ("cls", "mean", "whitening",
                                                                                  "sg-opt", "simcse")}
    assert rows["sg-opt"]["avg"] == pytest.approx([73.15, np.std([73.1, 73.2], ddof=1)])  # the fake's scores
    assert "| raw-bert-mini-3-step1000 | 5.00M | 30.00% |" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["report-curve"], "report-curve needs the results folders"),
    (["report-curve", "{t}/nope"], "/nope is not a folder: give the --out of each model's runs"),
    (["report-curve", "{t}/a", "{t}/a/."], "/a/. is given twice"),
    (["report-curve", "{t}/b"], "/b/pretrain/pretrain.json not found: copy the model's pretraining record there"),
    (["report-curve", "{t}/a", "--json", "{t}/a/pretrain/pretrain.json"], "which report-curve reads"),
    (["report-curve", "{t}/a", "--variants", "cls"], "--variants: report-curve takes its folders (first)"),
    (["report-curve", "{t}/a", "--plot", "{t}/a"], "is a folder; give a file name ending in .png"),
    (["report", "curve", "--plot", "{t}/c.png"], "the curve is drawn over several models: python -m lab.experiments "
                                                 "report-curve"),
    (["report", "table1", "--json", "{t}/c.json"], "--json is report-curve's"),
    (["table1", "--json", "{t}/c.json"], "--json is set per run by experiments.py"),
    (["report", "table1", "table5"], "table5: report takes one experiment name"),
    (["report-curve", "{t}/a", "--plt", "{t}/c.png"], "--plt: report-curve takes its folders (first), --seeds, --plot "
                                                      "and --json only; did you mean --plot?"),
])
def test_bad_curve_commands_are_one_line(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", types.ModuleType("matplotlib"))  # as if installed
    pretrain_json(tmp_path / "a", "a", 1000, 0.3, "ab" * 32)
    (tmp_path / "b").mkdir()
    with pytest.raises(SystemExit) as e:
        experiments.main([a.format(t=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_damaged_pretrain_record_is_one_line_and_no_runs_is_exit_1(tmp_path, capsys):
    write(tmp_path / "a/pretrain/pretrain.json", '{"train_tokens_seen": 1000, "held_out": {"mlm_acc": 0.3}}')
    with pytest.raises(SystemExit) as e:
        experiments.main(["report-curve", str(tmp_path / "a")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.strip() == f"error: {tmp_path}/a/pretrain/pretrain.json: 'sha256/model." \
        "safetensors' is missing or not a sha256; copy the model's own pretrain.json there again"
    pretrain_json(tmp_path / "a", "a", 1000, 0.3, "ab" * 32)
    with pytest.raises(SystemExit) as e:
        experiments.main(["report-curve", str(tmp_path / "a")])
    assert e.value.code == 1 and "no finished runs of the curve's rows" in capsys.readouterr().err


def test_the_figure_joins_one_pretraining_runs_folders_only(tmp_path, capsys):
    """A --keep-at folder of a run and the run's other folders make one line a row, in token order; a model of another
    run (another recipe) is a point of its own, never joined to them."""
    outs, shas, scores = curve_models(tmp_path, np.random.default_rng(3))
    late3 = tmp_path / "late3"  # a second folder of mid's run (raw-bert-mini-3), after 'late' in tokens
    pretrain_json(late3, "raw-bert-mini-3", 50_000_000, 0.4, "f" * 64, step=4000)
    curve_run(late3 / "curve/cls/eval.json", 12.5, "f" * 64)
    models = experiments.main(["report-curve", *map(str, [late3, *outs])])
    assert [m["run"] for m in models] == ["early", "raw-bert-mini-3", "late", "raw-bert-mini-3"]
    series = {(row, run): pts for row, run, pts in report.curve_series(experiments.EXPERIMENTS["curve"], models)}
    assert series["cls", "raw-bert-mini-3"] == [(20_000_000, scores[outs[2], "cls"][0], 0.0), (50_000_000, 12.5, 0.0)]
    assert series["cls", "late"] == [(43_381_194, scores[outs[0], "cls"][0], 0.0)]
    assert ("mean", "raw-bert-mini-3") in series and len(series["mean", "raw-bert-mini-3"]) == 1  # late3 has no mean
    assert sorted(run for row, run in series if row == "sg-opt") == ["early", "late", "raw-bert-mini-3"]


def test_report_curve_plot_needs_matplotlib(tmp_path, monkeypatch, capsys):
    pretrain_json(tmp_path / "a", "a", 1000, 0.3, "ab" * 32)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    with pytest.raises(SystemExit) as e:
        experiments.main(["report-curve", str(tmp_path / "a"), "--plot", str(tmp_path / "c.png")])
    assert e.value.code == 2 and "--plot needs matplotlib: pip install matplotlib" in capsys.readouterr().err


def test_report_curve_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    outs, _, _ = curve_models(tmp_path, np.random.default_rng(2))
    experiments.main(["report-curve", *map(str, outs), "--plot", str(tmp_path / "curve.png")])
    assert (tmp_path / "curve.png").stat().st_size > 1000
    assert json.loads((tmp_path / "curve.json").read_text())["models"][0]["name"] == "early"  # beside the figure
    assert (tmp_path / "curve.md").read_text().startswith("## curve: ")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".curve")]  # written atomically: no temp left


def test_a_model_whose_text_held_no_sentence_out_is_shown_unmeasured(tmp_path, capsys):
    """pretrain.py writes held_out.mlm_acc null when its text held no sentence out (a small text): report-curve shows
    the model, its MLM accuracy as n/a; a value that is neither a number nor null is still refused."""
    out, sha = tmp_path / "small", "ab" * 32
    pretrain_json(out, "small", 2_000_000, None, sha)
    curve_run(out / "curve/cls/eval.json", 40.0, sha)
    js = tmp_path / "c.json"
    models = experiments.main(["report-curve", str(out), "--json", str(js)])
    assert models[0]["mlm_acc"] is None and json.loads(js.read_text())["models"][0]["mlm_acc"] is None
    assert "| small | 2.00M | n/a | 40.00 (1) |" in js.with_suffix(".md").read_text()
    pretrain_json(out, "small", 2_000_000, "0.3", sha)
    with pytest.raises(SystemExit) as e:
        experiments.main(["report-curve", str(out)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "'held_out/mlm_acc' is not a number or null" in err, err


def test_one_model_through_two_folders_is_one_model(tmp_path, capsys):
    """A model is its weights' sha256: two folders of one model (a copy, or its runs spread over two --out) make one
    line, each row from the first folder given that has runs of it; two records of one sha256 that disagree on what
    the model is are refused in one line."""
    sha, a, b = "ab" * 32, tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        pretrain_json(out, "m", 1000, 0.3, sha)
    curve_run(a / "table1/cls/eval.json", 40.0, sha)
    curve_run(b / "table1/cls/eval.json", 99.0, sha)  # a's row: a is given first
    for seed in (1, 2):
        curve_run(b / "curve/sg-opt" / f"seed-{seed}.json", 50.0 + seed, sha, seed)
    models = experiments.main(["report-curve", str(a), str(b)])
    assert len(models) == 1 and models[0]["out"] == str(a) and models[0]["outs"] == [str(a), str(b)]
    rows = models[0]["rows"]
    assert rows["cls"]["avg"] == [40.0, 0.0] and rows["cls"]["runs"] == "table1/cls"
    assert rows["sg-opt"]["avg"][0] == 51.5 and rows["sg-opt"]["runs"] == f"{b}/curve/sg-opt"
    assert capsys.readouterr().out.count("| m | 0.00M | 30.00% |") == 1
    pretrain_json(b, "m", 2000, 0.3, sha)
    with pytest.raises(SystemExit) as e:
        experiments.main(["report-curve", str(a), str(b)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{b}/pretrain/pretrain.json and {a}/pretrain/pretrain.json name the same weights" in err


def test_two_runs_that_share_a_name_are_two_lines(tmp_path, capsys):
    """A pretraining run is its identity (pretrain.py's: its flags and its text's sha256), not its name: the --keep-at
    folders of two runs named r1 at two --lr are two lines of the figure and two labels, each of its own folders."""
    outs = []
    for lr in (1e-3, 5e-4):
        for step in (100, 200):
            out, sha = tmp_path / f"r1-{lr}-{step}", hashlib.sha256(f"{lr} {step}".encode()).hexdigest()
            pretrain_json(out, "r1", 1000 * step, 0.3, sha, step=step, lr=lr, text_sha256="7e" * 32)
            curve_run(out / "curve/cls/eval.json", 30.0 + step / 100 + (10 if lr == 5e-4 else 0), sha)
            outs.append(out)
    models = experiments.main(["report-curve", *map(str, outs)])
    series = [(run, pts) for row, run, pts in report.curve_series(experiments.EXPERIMENTS["curve"], models)
              if row == "cls"]
    assert sorted(series) == [("r1 (lr 0.0005)", [(100_000, 41.0, 0.0), (200_000, 42.0, 0.0)]),
                              ("r1 (lr 0.001)", [(100_000, 31.0, 0.0), (200_000, 32.0, 0.0)])]
    out = capsys.readouterr().out
    assert "| r1-step100 (lr 0.001) |" in out and "| r1-step100 (lr 0.0005) |" in out


def test_report_curve_checks_both_outputs_before_writing_either(tmp_path, monkeypatch, capsys):
    """--json c.json writes c.md beside it: both are checked before any is written (c.md a folder: one line, no
    c.json), and written as a pair; a write that fails (a full disk) is one line, exit 1."""
    sha = "ab" * 32
    pretrain_json(tmp_path / "a", "a", 1000, 0.3, sha)
    curve_run(tmp_path / "a/curve/cls/eval.json", 40.0, sha)
    (tmp_path / "c.md").mkdir()
    for argv in (["--json", str(tmp_path / "c.json")], ["--plot", str(tmp_path / "c.png")]):
        monkeypatch.setitem(sys.modules, "matplotlib", types.ModuleType("matplotlib"))  # as if installed
        with pytest.raises(SystemExit) as e:
            experiments.main(["report-curve", str(tmp_path / "a"), *argv])
        err = capsys.readouterr().err
        assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"{tmp_path}/c.md is a folder" in err and not (tmp_path / "c.json").exists()
    (tmp_path / "c.md").rmdir()

    def full(*a):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(report, "write_pair", full)
    with pytest.raises(SystemExit) as e:
        experiments.main(["report-curve", str(tmp_path / "a"), "--json", str(tmp_path / "c.json")])
    err = capsys.readouterr().err
    assert e.value.code == 1 and "No space left on device" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "c.json").exists() and not (tmp_path / "c.md").exists()


def test_the_effect_experiment_sets_every_row_against_cls_and_mean_with_cosines_of_its_first_seed(fake, capsys):
    """effect: the first seed's trained runs get their per-pair cosines from a second evaluate.py step on their
    checkpoint (not in the key, which has no second step), later seeds none; the report's significance columns are
    against [CLS] and mean pooling, which ran once: a seeded row gets its one-sample interval against them."""
    experiments.main(["effect", *fake.argv, "--variants", "cls", "mean", "sg-opt"])  # seeds 1 2
    out, key = fake.out / "effect", sweep.RunKey.parse
    rec1 = json.loads((out / "sg-opt/seed-1.json").read_text())
    rec2 = json.loads((out / "sg-opt/seed-2.json").read_text())
    assert rec1["cosines"]["file"] == "seed-1.cosines.npz" and "--cosines-out" in rec1["then"]
    assert key(rec1["key"]).then == () and "cosines" not in rec2 and "then" not in rec2
    assert "--cosines-out" in json.loads((out / "cls/eval.json").read_text())["command"]
    text = capsys.readouterr().out
    assert "vs [CLS]: seeds" in text and "vs mean: seeds" in text and "vs SG-OPT" not in text
    assert "[CLS] and mean ran once: no seed moves such a reference" in text
    summary = json.loads((out / "results.json").read_text())["variants"]
    seeds = summary["sg-opt"]["vs"]["mean"]["seeds"]
    avgs = [json.loads((out / f"sg-opt/seed-{s}.json").read_text())["sts"]["avg"]["all"] for s in (1, 2)]
    mean = json.loads((out / "mean/eval.json").read_text())["sts"]["avg"]["all"]
    assert seeds == pytest.approx(report.welch_interval(avgs, [mean], False, True))
    assert summary["cls"]["vs"]["mean"]["seeds"][0] == summary["cls"]["vs"]["mean"]["seeds"][2]  # exact - exact
