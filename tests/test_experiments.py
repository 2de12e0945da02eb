"""experiments.py on the tiny BERT: a 2-variant x 2-seed sweep runs, resumes after a kill without re-running finished
runs, shares identical runs across experiments, respects locks, and its report equals numpy over the run files."""
import json
import os
import subprocess

import numpy as np
import pytest

import experiments
from experiments import Experiment, Variant
from test_train import world  # noqa: F401  (the tiny model, data and sentences fixture)

pytestmark = pytest.mark.slow  # each run evaluates the 7 real STS tasks (a few seconds with the tiny BERT)


@pytest.fixture
def sweep(world, shared_data, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.setattr(experiments, "EXPERIMENTS", {
        "tiny": Experiment("two variants", [Variant("base", [], {"BERT-base": "74.62"}),
                                            Variant("sg", ["--loss", "sg"]),
                                            Variant("cls", ["--pooling", "cls"], evaluate_only=True)]),
        "other": Experiment("shares a run with tiny", [Variant("same", [])]),
    })
    calls = []
    real = subprocess.run

    def counting_run(cmd, **kw):
        calls.append(cmd)
        return real(cmd, **kw)

    monkeypatch.setattr(subprocess, "run", counting_run)
    out = tmp_path / "runs"
    argv = ["--model", str(world["model"]), "--seeds", "1", "2", "--out", str(out), "--data-dir", str(shared_data),
            "--data", str(world["sents"]), "--batch-size", "4", "--max-steps", "3", "--eval-every", "2",
            "--proj-size", "16", "--device", "cpu", "--eval-batch-size", "512"]
    return dict(argv=argv, out=out, calls=calls)


def test_sweep_resumes_after_a_kill_and_reports_numpy_means(sweep, monkeypatch):
    real = subprocess.run
    n = [0]

    def killed_on_third(cmd, **kw):  # the 3rd run is killed: the sweep stops there
        n[0] += 1
        if n[0] == 3:
            raise KeyboardInterrupt
        return real(cmd, **kw)

    monkeypatch.setattr(subprocess, "run", killed_on_third)
    with pytest.raises(SystemExit) as e:
        experiments.main(["tiny", *sweep["argv"]])
    assert e.value.code == 130
    out = sweep["out"] / "tiny"
    assert sorted(p.relative_to(out).as_posix() for p in out.glob("*/*.json")) == ["base/seed-1.json", "sg/seed-1.json"]
    assert not list(out.glob("*/*.lock")), "the killed run's lock was not released"

    monkeypatch.setattr(subprocess, "run", real)  # the fixture's counting run
    sweep["calls"].clear()
    experiments.main(["tiny", *sweep["argv"]])
    ran = [(c[1].rsplit("/", 1)[-1], c[c.index("--seed") + 1] if "--seed" in c else None) for c in sweep["calls"]]
    assert ran == [("evaluate.py", None), ("train.py", "2"), ("train.py", "2")]  # only what was missing

    summary = json.loads((out / "results.json").read_text())["variants"]
    for v in ("base", "sg"):
        recs = [json.loads((out / v / f"seed-{s}.json").read_text()) for s in (1, 2)]
        for task in [*experiments.TASKS, "avg"]:
            xs = [r["sts"][task]["all"] for r in recs]
            assert summary[v]["sts"][task] == pytest.approx([np.mean(xs), np.std(xs, ddof=1)])
        assert summary[v]["wall_seconds"][0] == pytest.approx(np.mean([r["train"]["wall_seconds"] for r in recs]))
    assert summary["cls"]["seeds"] == [None]
    md = (out / "results.md").read_text()
    assert "| base | 2 |" in md and "74.62" in md and "Table 6" in md

    sweep["calls"].clear()  # a third time: nothing to do; the other experiment copies tiny's identical run
    experiments.main(["tiny", *sweep["argv"]])
    experiments.main(["other", *sweep["argv"]])
    assert sweep["calls"] == []
    same = json.loads((sweep["out"] / "other/same/seed-1.json").read_text())
    assert same["same_as"] == "tiny/base/seed-1.json" and same["sts"] == recs_base(out)["sts"]


def recs_base(out):
    return json.loads((out / "base/seed-1.json").read_text())


def test_a_run_locked_by_a_live_process_is_left_alone_and_a_stale_lock_is_taken(sweep, monkeypatch):
    monkeypatch.setattr(experiments, "EXPERIMENTS", {"one": Experiment("", [Variant("a", [])])})
    folder = sweep["out"] / "one/a"
    folder.mkdir(parents=True)
    (folder / "seed-1.lock").write_text(f"{experiments.socket.gethostname()} {os.getpid()}\n")  # alive: us
    dead = subprocess.Popen(["true"])
    dead.wait()
    (folder / "seed-2.lock").write_text(f"{experiments.socket.gethostname()} {dead.pid}\n")
    experiments.main(["one", *sweep["argv"]])
    assert not (folder / "seed-1.json").exists() and (folder / "seed-2.json").exists()
    assert (folder / "seed-1.lock").exists() and not (folder / "seed-2.lock").exists()


def test_list_prints_every_experiment(capsys):
    experiments.main(["list"])
    out = capsys.readouterr().out
    for name, exp in experiments.EXPERIMENTS.items():
        assert out.count(f"{name}: ") >= 1
        assert all(v.name in out for v in exp.variants)
    assert "74.62" in out and "70.39" in out and "79.41" in out


@pytest.mark.parametrize("argv, message", [
    (["nope"], "unknown experiment 'nope'"),
    (["report", "nope"], "report nope"),
    (["table5", "--seed", "3"], "--seed is set per run"),
])
def test_bad_commands_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        experiments.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_report_from_run_files(tmp_path, monkeypatch):
    """The report alone, on hand-written run records: means, sample stds, the drop from the baseline, ms/step."""
    monkeypatch.setattr(experiments, "EXPERIMENTS", {"d": Experiment("", [Variant("a"), Variant("b")], baseline="a")})
    rng = np.random.default_rng(0)
    for v, shift in (("a", 0.0), ("b", -3.0)):
        (tmp_path / "d" / v).mkdir(parents=True)
        for seed in (1, 2, 3):
            sts = {t: {"all": float(70 + shift + rng.normal())} for t in experiments.TASKS}
            sts["avg"] = {"all": float(np.mean([x["all"] for x in sts.values()]))}
            train = dict(best_step=100, dev=80.0, test=75.0, steps=300, stop=None, wall_seconds=60.0 * seed,
                         test_seconds=2.0, ms_per_step={"BERT_F fwd": 100.0, "BERT_T fwd+bwd": 300.0})
            (tmp_path / "d" / v / f"seed-{seed}.json").write_text(json.dumps(dict(seed=seed, sts=sts, train=train)))
    s = experiments.report("d", tmp_path)
    for v in ("a", "b"):
        recs = [json.loads((tmp_path / "d" / v / f"seed-{k}.json").read_text()) for k in (1, 2, 3)]
        xs = [r["sts"]["avg"]["all"] for r in recs]
        assert s[v]["sts"]["avg"] == pytest.approx([np.mean(xs), np.std(xs, ddof=1)])
    md = (tmp_path / "d" / "results.md").read_text()
    assert f"{s['b']['sts']['avg'][0] - s['a']['sts']['avg'][0]:+.2f}" in md and "| 400 |" in md and "| 2.0 |" in md
