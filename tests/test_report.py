"""report.py's significance columns of the leaderboard, each against an oracle: Welch's interval against scipy's,
the paired bootstrap against a plain loop of scipy's Spearman on each resample, the cells on hand-made records; and
the per-pair cosines that python -m lab.evaluate --cosines-out writes for it."""
import json
import sys

import numpy as np
import pytest
from scipy import stats

import data
from lab import evaluate as lab_evaluate
from lab import experiments
from lab import report
from data import TASKS
from test_eval import tiny_data, tiny_model  # noqa: F401  (the tiny data folder and model fixtures)

# -----------------------------------------------------------------------------
# the intervals


@pytest.mark.filterwarnings("ignore:Precision loss occurred")  # scipy's, on the side without spread
def test_welchs_interval_is_scipys():
    for a, b in (([1.0, 2.0, 3.0, 4.5], [0.0, 1.0, 1.5]), ([78.1, 78.6, 77.6], [77.4, 77.3, 77.35]),
                 ([70.0, 70.0, 70.0], [69.0, 69.5, 70.2, 68.8])):  # one side without spread: df from the other
        ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
        assert report.welch_interval(a, b) == pytest.approx([np.mean(a) - np.mean(b), ci.low, ci.high], abs=1e-12)
    assert report.welch_interval([1.0], [1.0, 2.0]) is None and report.welch_interval([1.0, 2.0], [3.0]) is None
    assert report.welch_interval([2.0, 2.0], [1.0, 1.0]) == [1.0, 1.0, 1.0]  # no spread on either side


def small_pairs(rng, sizes=(21, 25, 20, 30, 22, 24, 27)):
    """{task: gold} of a few pairs a task, gold with ties (as STS's), and two rows' cosines {row: {task: (cos,
    gold)}}, one row's cosines with ties too."""
    gold = {t: rng.integers(0, 4, n).astype(float) for t, n in zip(TASKS, sizes)}
    rows = {}
    for row, noise in (("a", 0.5), ("b", 1.5)):
        rows[row] = {t: (np.round(g + noise * rng.standard_normal(len(g)), 1 if row == "b" else 6), g)
                     for t, g in gold.items()}
    return rows


def loop_bootstrap(rows, n, seed):
    """The paired bootstrap written out: the same draws (one rng.integers a resample, task by task), scipy's Spearman
    of each row on each resample, the 7-task average, the differences' 2.5th and 97.5th percentiles."""
    rng = np.random.default_rng(seed)
    draws = {t: [rng.integers(0, len(g), len(g)) for _ in range(n)] for t, (_, g) in rows["a"].items()}
    avg = {r: [np.mean([100 * stats.spearmanr(c[i], g[i]).statistic for t, (c, g) in rows[r].items()
                        for i in [draws[t][b]]]) for b in range(n)] for r in rows}
    whole = {r: np.mean([100 * stats.spearmanr(c, g).statistic for c, g in rows[r].values()]) for r in rows}
    diffs = np.array(avg["a"]) - np.array(avg["b"])
    return [whole["a"] - whole["b"], *np.percentile(diffs, [2.5, 97.5])]


def test_the_paired_bootstrap_is_a_plain_loops():
    rows = small_pairs(np.random.default_rng(0))
    rhos = report.bootstrap_rhos(rows, n=300)
    got = report.paired_difference(rhos["a"][0], rhos["b"][0])
    assert got == pytest.approx(loop_bootstrap(rows, 300, report.BOOTSTRAP_SEED), abs=1e-9)
    assert got[1] < got[0] < got[2]
    other = {"a": rows["a"], "c": {t: (c, g + (t == "STS14")) for t, (c, g) in rows["b"].items()}}
    assert report.bootstrap_rhos(other)["c"] == (None, "other test pairs than the other rows'")


def test_resampled_ranks_are_scipys_on_the_resample_itself():
    rng = np.random.default_rng(1)
    x = np.round(rng.standard_normal(30), 1)  # many ties
    w = np.stack([np.bincount(rng.integers(0, 30, 30), minlength=30) for _ in range(5)])
    r = report.resampled_ranks(x, w)
    for b in range(5):
        idx = np.repeat(np.arange(30), w[b])
        want = stats.rankdata(x[idx])
        assert np.allclose(r[b][idx], want)

# -----------------------------------------------------------------------------
# the columns, on hand-made leaderboard records


def sts_of(cos, seed_avg=None):
    """An STS block whose tasks' `all` is the cosines' own Spearman (or every task seed_avg), and its average."""
    sts = {t: {"all": float(seed_avg if seed_avg is not None else 100 * stats.spearmanr(*cos[t]).statistic)}
           for t in TASKS}
    sts["avg"] = {"all": float(np.mean([sts[t]["all"] for t in TASKS]))}
    return sts


def write_row(folder, row, cos, avgs, evaluate_only=False):
    """A leaderboard row's records, a run an average of avgs (every task at it), but seed 1 (or eval) when cos is
    given: its scores the cosines' own, the cosines written beside it and named, as the sweep does."""
    folder = folder / row
    folder.mkdir(parents=True)
    train = {"best_step": 1, "wall_seconds": 60.0, "test_seconds": 2.0, "ms_per_step": 10.0}
    for i, avg in enumerate(avgs):
        stem = "eval" if evaluate_only else f"seed-{i + 1}"
        rec = {"seed": None if evaluate_only else i + 1, "sts": sts_of(cos) if i == 0 and cos else sts_of(None, avg),
               "transfer": None, "train": None if evaluate_only else train}
        if i == 0 and cos:
            path = folder / f"{stem}.cosines.npz"
            lab_evaluate.write_cosines(path, cos)
            rec["cosines"] = {"file": path.name, "sha256": report.file_sha256(path)}
        (folder / f"{stem}.json").write_text(json.dumps(rec))


def noisy(gold, rng, noise):
    return {t: (g + noise * rng.standard_normal(len(g)), g) for t, g in gold.items()}


@pytest.fixture
def leaderboard(tmp_path):
    """A leaderboard folder: SimCSE and SG-OPT at 3 seeds with seed 1's cosines, mean (one evaluation) with its
    cosines, ConSERT at 3 seeds without, PromptBERT at 3 seeds well below; returns (out, the rows' cosines)."""
    rng = np.random.default_rng(0)
    gold = {t: rng.integers(0, 6, 300).astype(float) for t in TASKS}
    cos = {"simcse": noisy(gold, rng, 2.0), "sg-opt": noisy(gold, rng, 1.0), "mean": noisy(gold, rng, 2.0)}
    a = {r: sts_of(c)["avg"]["all"] for r, c in cos.items()}  # ~63 for SimCSE, ~85 for SG-OPT
    folder = tmp_path / "leaderboard"
    write_row(folder, "simcse", cos["simcse"], [None, a["simcse"] + 0.2, a["simcse"] - 0.1])
    write_row(folder, "sg-opt", cos["sg-opt"], [None, a["sg-opt"] - 0.2, a["sg-opt"] + 0.3])
    write_row(folder, "mean", cos["mean"], [None], evaluate_only=True)
    write_row(folder, "consert", None, [a["simcse"] + d for d in (0.3, -0.2, 0.1)])
    write_row(folder, "promptbert", None, [a["simcse"] - 10 + d for d in (0.3, -0.2, 0.1)])
    return tmp_path, cos


def avgs_of(out, row):
    return [json.loads(p.read_text())["sts"]["avg"]["all"] for p in sorted((out / "leaderboard" / row).glob("*.json"))]


def test_the_leaderboard_has_each_rows_intervals_against_simcse_and_sg_opt(leaderboard, capsys):
    out, cos = leaderboard
    summary = report.report("leaderboard", experiments.EXPERIMENTS["leaderboard"], out)
    md = (out / "leaderboard/results.md").read_text()
    head = next(line for line in md.splitlines() if line.startswith("| method |"))
    assert head.endswith("| vs SimCSE: seeds | vs SimCSE: STS pairs | vs SG-OPT: seeds | vs SG-OPT: STS pairs |")
    rows = {c[0]: c[-4:] for line in md.splitlines() if line.startswith("| ")
            for c in [[x.strip() for x in line.strip("|").split("|")]]}

    def seeds(a, b):
        return report.welch_interval(avgs_of(out, a), avgs_of(out, b))
    rhos = report.bootstrap_rhos({r: cos[r] for r in ("simcse", "sg-opt", "mean")})

    def pairs(a, b):
        return report.paired_difference(rhos[a][0], rhos[b][0])
    x = seeds("sg-opt", "simcse")
    assert rows["sg-opt"][0] == f"{x[0]:+.2f} [{x[1]:+.2f}, {x[2]:+.2f}] better" and rows["sg-opt"][2:] == ["-", "-"]
    x = pairs("sg-opt", "simcse")
    assert x[1] > 0 and rows["sg-opt"][1] == f"{x[0]:+.2f} [{x[1]:+.2f}, {x[2]:+.2f}] better"
    assert rows["simcse"][:2] == ["-", "-"] and rows["simcse"][3].endswith("] worse")
    x = pairs("mean", "simcse")  # the same noise as SimCSE's: 0 within the interval, no mark
    assert x[1] < 0 < x[2] and rows["mean"] == ["n/a (n < 2)", f"{x[0]:+.2f} [{x[1]:+.2f}, {x[2]:+.2f}]",
                                                "n/a (n < 2)", "{:+.2f} [{:+.2f}, {:+.2f}] worse".format(
                                                    *pairs("mean", "sg-opt"))]
    x = seeds("consert", "simcse")
    assert x[1] < 0 < x[2] and rows["consert"][0] == f"{x[0]:+.2f} [{x[1]:+.2f}, {x[2]:+.2f}]"  # no mark
    assert rows["consert"][1] == "n/a (no per-pair cosines)" and rows["promptbert"][0].endswith("] worse")
    assert summary["sg-opt"]["vs"]["simcse"]["seeds"] == pytest.approx(seeds("sg-opt", "simcse"))
    assert json.loads((out / "leaderboard/results.json").read_text())["variants"]["mean"]["vs"]["simcse"][
        "seeds_why"] == "n < 2"
    assert "Welch's t interval on the per-seed averages" in md and "paired bootstrap over the test pairs" in md


def test_a_cosines_file_that_is_not_its_runs_is_named_not_used(leaderboard, capsys):
    out, cos = leaderboard
    lb, exp = out / "leaderboard", experiments.EXPERIMENTS["leaderboard"]
    (lb / "simcse/seed-1.cosines.npz").unlink()  # SimCSE's is gone: every row's cell against SimCSE says so
    report.report("leaderboard", exp, out)
    s = json.loads((lb / "results.json").read_text())["variants"]
    assert s["sg-opt"]["vs"]["simcse"]["pairs_why"] == "SimCSE: seed-1.cosines.npz, which its record names, is missing"
    assert s["consert"]["vs"]["simcse"]["pairs_why"] == "no per-pair cosines"  # its own reason first
    assert s["mean"]["vs"]["sg-opt"]["pairs"] is not None
    bad = {t: (c[::-1].copy(), g) for t, (c, g) in cos["mean"].items()}
    lab_evaluate.write_cosines(lb / "mean/eval.cosines.npz", bad)  # another run's cosines under mean's name
    rec = json.loads((lb / "sg-opt/seed-1.json").read_text())
    rec["sts"]["STS12"]["all"] += 1.0  # its cosines no longer give its record's score
    (lb / "sg-opt/seed-1.json").write_text(json.dumps(rec))
    report.report("leaderboard", exp, out)
    s = json.loads((lb / "results.json").read_text())["variants"]
    assert s["mean"]["vs"]["sg-opt"]["pairs_why"] == "eval.cosines.npz is not its run's (another sha256)"
    why = s["sg-opt"]["vs"]["simcse"]["pairs_why"]
    assert why.startswith("seed-1.cosines.npz gives STS12 ") and why.endswith(
        ", its record {:.2f}".format(rec["sts"]["STS12"]["all"]))
    assert all(s[v]["vs"][r]["pairs"] is None for v in s for r in s[v]["vs"])


def test_a_cosines_file_damaged_inside_its_compressed_data_is_named_not_a_traceback(leaderboard, capsys):
    """A .npz whose zip structure is whole but whose deflated data is damaged raised zlib.error out of the report: its
    row's bootstrap cells are n/a, naming the file; the other rows keep theirs."""
    import zipfile
    out, _ = leaderboard
    lb = out / "leaderboard"
    path = lb / "simcse/seed-1.cosines.npz"
    data = bytearray(path.read_bytes())
    member = zipfile.ZipFile(path).infolist()[0]
    start = member.header_offset + 30 + len(member.filename) + len(member.extra)  # its compressed bytes
    data[start + 20:start + 60] = bytes(b ^ 0xFF for b in data[start + 20:start + 60])
    path.write_bytes(bytes(data))
    rec = json.loads((lb / "simcse/seed-1.json").read_text())
    rec["cosines"]["sha256"] = report.file_sha256(path)  # damaged before its record was written: the record's own
    (lb / "simcse/seed-1.json").write_text(json.dumps(rec))
    report.report("leaderboard", experiments.EXPERIMENTS["leaderboard"], out)
    s = json.loads((lb / "results.json").read_text())["variants"]
    why = s["sg-opt"]["vs"]["simcse"]["pairs_why"]
    assert why.startswith("SimCSE: seed-1.cosines.npz unreadable: Error -3 while decompressing data"), why
    assert s["simcse"]["vs"]["sg-opt"]["pairs"] is None and s["mean"]["vs"]["sg-opt"]["pairs"] is not None
    assert "| n/a (seed-1.cosines.npz unreadable: Error -3" in (lb / "results.md").read_text()


def test_a_row_of_other_test_pairs_is_left_out_alone(leaderboard, capsys):
    """cls evaluated on another data folder (other gold): it came first in the leaderboard's order, and every row was
    then 'other test pairs' than it. Only its own cells are n/a now; the rows that share the test pairs keep theirs."""
    out, cos = leaderboard
    rng = np.random.default_rng(5)
    other = {t: rng.integers(0, 6, 200).astype(float) for t in TASKS}
    write_row(out / "leaderboard", "cls", noisy(other, rng, 2.0), [None], evaluate_only=True)
    report.report("leaderboard", experiments.EXPERIMENTS["leaderboard"], out)
    s = json.loads((out / "leaderboard/results.json").read_text())["variants"]
    why = "other test pairs than the other rows'"
    assert [s["cls"]["vs"][r]["pairs_why"] for r in ("simcse", "sg-opt")] == [why, why]
    rhos = report.bootstrap_rhos({r: cos[r] for r in ("simcse", "sg-opt", "mean")})
    assert s["sg-opt"]["vs"]["simcse"]["pairs"] == pytest.approx(report.paired_difference(rhos["sg-opt"][0],
                                                                                          rhos["simcse"][0]))
    assert s["mean"]["vs"]["sg-opt"]["pairs"] is not None


def test_a_leaderboard_without_a_reference_row_has_no_columns_of_it(tmp_path, capsys):
    rng = np.random.default_rng(2)
    write_row(tmp_path / "leaderboard", "mean", noisy({t: rng.integers(0, 6, 50).astype(float) for t in TASKS}, rng,
                                                       1.0), [None], evaluate_only=True)
    write_row(tmp_path / "leaderboard", "sg-opt", None, [70.0, 71.0])
    report.report("leaderboard", experiments.EXPERIMENTS["leaderboard"], tmp_path)
    md = (tmp_path / "leaderboard/results.md").read_text()
    assert "vs SimCSE" not in md and "| n/a (n < 2) | n/a (SG-OPT: no per-pair cosines) |" in md


def test_the_methods_experiment_has_its_rows_intervals_as_a_table_of_their_own(tmp_path, capsys):
    """The STS-only methods experiment (no per-pair cosines: its runs have no evaluate.py step) sets every row
    against SimCSE and SG-OPT by Welch over the seeds; a report without them (table1) has no such table."""
    folder = tmp_path / "methods"
    for row, avgs in (("simcse", [77.4, 77.3, 77.35]), ("sg-opt", [78.1, 78.6, 77.6]), ("esimcse", [75.0, 74.8])):
        write_row(folder, row, None, avgs)
    write_row(folder, "sscl", None, [79.0])
    report.report("methods", experiments.EXPERIMENTS["methods"], tmp_path)
    md = (folder / "results.md").read_text()
    assert "| variant | vs SimCSE: seeds | vs SimCSE: STS pairs | vs SG-OPT: seeds | vs SG-OPT: STS pairs |" in md
    rows = {c[0]: c[1:] for line in md.splitlines() if line.startswith("| ") and line.count("|") == 6
            for c in [[x.strip() for x in line.strip("|").split("|")]]}
    x = stats.ttest_ind([75.0, 74.8], [77.4, 77.3, 77.35], equal_var=False).confidence_interval(0.95)
    assert rows["esimcse"][0] == f"{75.0 / 2 + 74.8 / 2 - 77.35:+.2f} [{x.low:+.2f}, {x.high:+.2f}] worse"
    assert rows["esimcse"][1] == "n/a (no per-pair cosines)" and rows["sscl"][0] == "n/a (n < 2)"
    assert rows["simcse"][:2] == ["-", "-"] and rows["sg-opt"][2:] == ["-", "-"]
    assert "Welch's t interval on the per-seed averages" in md
    write_row(tmp_path / "table1", "sg-opt", None, [78.0, 78.5])
    report.report("table1", experiments.EXPERIMENTS["table1"], tmp_path)
    assert "vs SG-OPT" not in (tmp_path / "table1/results.md").read_text()

# -----------------------------------------------------------------------------
# python -m lab.evaluate --cosines-out


def test_cosines_out_holds_every_sts_test_pair_as_the_all_protocol_ranks_them(tiny_data, tiny_model,  # noqa: F811
                                                                              tmp_path, capsys):
    """Every STS task (though --tasks asks for one), its subsets concatenated in the 'all' protocol's order: each
    pair's cosine equal to an oracle's that encodes every pair on its own, its gold the data's."""
    import torch

    import bert
    root, out = tiny_data[0], tmp_path / "c.npz"
    lab_evaluate.main(["--model", str(tiny_model), "--data-dir", str(root), "--tasks", "STS13", "--pooling", "mean",
                       "--layer", "1", "--cosines-out", str(out), "--device", "cpu"])
    model, tok = bert.Bert.from_pretrained(tiny_model), bert.load_tokenizer(tiny_model)
    with np.load(out) as z:
        assert sorted(z.files) == sorted(f"{t}.{k}" for t in TASKS for k in ("cosine", "gold"))
        for t in TASKS:
            sims, golds = [], []
            for s1, s2, gold in data.load_task(t, root).values():
                e1, e2 = (torch.from_numpy(bert.encode(model, tok, s, pooling="mean", layer=1, batch_size=1))
                          for s in (s1, s2))
                sims.append(torch.nn.functional.cosine_similarity(e1.double(), e2.double()).numpy())
                golds.append(gold)
            assert z[f"{t}.cosine"].dtype == np.float32
            assert np.allclose(z[f"{t}.cosine"], np.concatenate(sims), atol=1e-6)
            assert np.array_equal(z[f"{t}.gold"], np.concatenate(golds).astype(np.float32))
    assert "STS test pairs' cosines written to" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--cosines-out", "{t}/c.txt"], "--cosines-out {t}/c.txt is not a file name ending in .npz"),
    (["--cosines-out", "{t}/c.npz", "--layerwise"], "--cosines-out writes the STS tasks' cosines, which --layerwise"),
])
def test_bad_cosines_out_is_one_line(argv, message, tiny_model, tmp_path, capsys):  # noqa: F811
    with pytest.raises(SystemExit) as e:
        lab_evaluate.main(["--model", str(tiny_model), *[a.format(t=tmp_path) for a in argv]])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message.format(t=tmp_path) in err and len(err.strip().splitlines()) == 1, err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_welch_against_a_reference_that_ran_once_is_the_one_sample_t_interval():
    """A reference no seed moves (an evaluation of the base model) is a constant: the interval is the seeded side's
    one-sample t interval (scipy's), and two constants differ exactly."""
    from scipy import stats
    a = [48.1, 48.6, 47.9, 48.4]
    ci = stats.ttest_1samp(np.array(a) - 46.0, 0.0).confidence_interval(0.95)
    assert report.welch_interval(a, [46.0], False, True) == pytest.approx([np.mean(a) - 46.0, ci.low, ci.high])
    assert report.welch_interval([46.0], a, True, False)[0] == pytest.approx(46.0 - np.mean(a))
    assert report.welch_interval([41.0], [37.0], True, True) == [4.0, 4.0, 4.0]
    assert report.welch_interval(a, [46.0]) is None  # not known to be a constant: n < 2
