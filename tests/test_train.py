"""train.py (and the lab's trainer for the other methods) end to end on a tiny random BERT and a few dozen sentences:
checkpoints, frozen parts, determinism, every flag, crashes, bad input."""
import argparse
import dataclasses
import gzip
import json
import random

import numpy as np
import pytest
import torch

import bert
import checkpoint
import cli
import data
import evaluate
import outputs
from lab import evaluate as lab_evaluate
from lab import methods
import sg_loss
import train
from lab import train as lab_train
from conftest import tiny_model_folder

WORDS = "a man woman dog cat is are playing eating running guitar food in the park on street with".split()


@pytest.fixture
def world(tiny_config, tmp_path):
    """A tiny model folder (config, weights, vocab.txt), a data folder with a small STS-B, and training sentences."""
    rng = random.Random(0)
    model_dir = tiny_model_folder(tmp_path / "tiny", tiny_config, [".", *WORDS])

    def sentence():
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) + " ."

    data_dir = tmp_path / "data"
    sts = data_dir / "senteval/STS/STSBenchmark"
    sts.mkdir(parents=True)
    for split in ("dev", "test"):
        rows = [f"main-captions\tMSRvid\t2012test\t{i:04d}\t{rng.uniform(0, 5):.3f}\t{sentence()}\t{sentence()}"
                for i in range(30)]
        (sts / f"sts-{split}.csv").write_text("\n".join(rows) + "\n")
    with gzip.open(data_dir / "stsbenchmark.tsv.gz", "wt") as f:
        f.write("split\tgenre\tdataset\tyear\tsid\tscore\tsentence1\tsentence2\n")
    sents = tmp_path / "sents.txt"
    sents.write_text("\n".join(sentence() for _ in range(40)) + "\n")
    return dict(model=model_dir, data=data_dir, sents=sents, out=tmp_path / "sg.safetensors", tmp=tmp_path)


def small_head(flags):
    """--proj-size 16 where the method has the projection head f (the others refuse the flag)."""
    loss = flags[flags.index("--loss") + 1] if "--loss" in flags else "opt"
    return [] if "proj_size" in methods.METHODS[loss].ignores or "--no-proj" in flags else ["--proj-size", "16"]


def core_flags():
    """The flags train.py takes: the SG family's and the run's."""
    p = argparse.ArgumentParser()
    train.add_sg_flags(p.add_argument)
    cli.add_run_flags(p.add_argument)
    return {s for a in p._actions for s in a.option_strings}


def trainer(argv):
    """The entry point of a command line: train.py for the SG family and its flags, else the lab's trainer."""
    losses = [argv[i + 1] for i, w in enumerate(argv[:-1]) if w == "--loss"]
    core = (losses or ["opt"])[-1] in train.LOSSES and {w for w in argv if w.startswith("--")} <= core_flags()
    return train.main if core else lab_train.main


def run(world, *flags, main=None):
    argv = ["--model", str(world["model"]), "--data", str(world["sents"]), "--data-dir", str(world["data"]),
            "--out", str(world["out"]), "--batch-size", "4", "--max-steps", "8", "--eval-every", "3",
            "--log-every", "1", *small_head(flags), "--device", "cpu", *flags]
    return (main or trainer(argv))(argv)


def test_full_run_writes_a_loadable_checkpoint(world):
    result = run(world)
    assert result["steps"] == 8 and len(result["losses"]) == 8
    meta = checkpoint.read_metadata(world["out"])
    assert meta["args"]["loss"] == "opt" and meta["base_model"] == world["model"].name  # its own name, not this machine's path
    assert meta["base_sha256"] == checkpoint.file_sha256(world["model"] / "model.safetensors")  # which weights, exactly
    assert meta["best"]["step"] == result["best_step"] and meta["best"]["dev"] == pytest.approx(result["dev"])
    m, tok = bert.Bert.from_pretrained(world["out"]), bert.load_tokenizer(world["out"])
    assert evaluate.stsb_spearman(evaluate.sentence_vectors(m, tok), world["data"], "dev") == pytest.approx(result["dev"])
    assert not list(world["tmp"].glob(".*tmp"))  # no temp files left behind


@pytest.mark.parametrize("loss", list(lab_train.methods.METHODS))
def test_the_config_line_shows_only_the_flags_the_method_uses(loss):
    m = lab_train.methods.METHODS[loss]
    shown = lab_train.used_flags(lab_train.methods.resolve_config(lab_train.get_args(["--loss", loss, "--device", "cpu"])))
    assert not set(shown) & set(m.ignores), (loss, set(shown) & set(m.ignores))
    assert {"loss", "model", "out"} <= set(shown) and ("seed" in shown) == (loss != "whitening")  # nothing drawn
    assert ("lam" in shown) == (m.core or m.regulariser is methods.weight_distance_grad)
    assert ("template" in shown) == (loss == "promptbert")
    assert ("whiten_dim" in shown) == (loss == "whitening")


@pytest.mark.parametrize("device", ["cpu", "cuda", "auto"])
def test_the_default_precision_is_the_papers_fp32_on_every_device(device, monkeypatch, capsys):
    """The official code ran fp32: so does a GPU run unless --precision bf16 asks for autocast (here on a machine
    that says it has CUDA: nothing runs on it)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert methods.resolve_config(lab_train.get_args(["--device", device])).precision == "fp32"
    assert methods.resolve_config(lab_train.get_args(["--device", device, "--precision", "bf16"])).precision == "bf16"
    with pytest.raises(SystemExit):
        train.get_args(["--help"])
    assert "fp32 (default, on every device: the official code's precision)" in " ".join(capsys.readouterr().out.split())


def test_the_config_line_is_printed_without_ignored_flags(world, capsys):
    run(world, "--loss", "simcse", "--max-steps", "1")
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("sgbert "))
    assert " loss=simcse " in line and " tau=0.05 " in line and "lam=" not in line and "layers=" not in line, line


def test_frozen_parts_stay_frozen(world, monkeypatch):
    seen = {}
    load, save = bert.Bert.from_pretrained, checkpoint.save_checkpoint

    def capture_load(path):
        m = load(path)
        seen.setdefault("F", m)
        return m

    def capture_save(path, tensors, meta):
        seen["T"] = tensors  # the last save: the best step's BERT_T
        return save(path, tensors, meta)

    monkeypatch.setattr(bert.Bert, "from_pretrained", capture_load)
    monkeypatch.setattr(checkpoint, "save_checkpoint", capture_save)
    base = {k: v.clone() for k, v in load(world["model"]).state_dict().items()}
    run(world, "--lr", "1e-3")
    F, T = seen["F"].state_dict(), seen["T"]
    assert all(torch.equal(F[k], base[k]) for k in base), "BERT_F changed"
    emb = [k for k in base if k.startswith("embeddings.")]
    assert emb and all(torch.equal(T[k], base[k]) for k in emb), "BERT_T's embedding block changed"
    rest = [k for k in base if not k.startswith("embeddings.")]
    assert all(not torch.equal(T[k], base[k]) for k in rest), "some BERT_T layer did not train"


def test_one_batch_repeated_drives_the_loss_down(world):
    cfg = json.loads((world["model"] / "config.json").read_text())  # no dropout: a clean optimisation problem
    (world["model"] / "config.json").write_text(json.dumps(dict(cfg, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)))
    losses = [l for _, l in run(world, "--overfit-batch", "--max-steps", "40", "--lr", "3e-3", "--tau", "0.05",
                                "--lam", "0", "--eval-every", "100")["losses"]]
    assert sum(losses[-5:]) / 5 < 0.2 * sum(losses[:5]) / 5, losses


def test_same_seed_same_run(world):
    a, b = run(world)["losses"], run(world, "--overwrite")["losses"]
    c = run(world, "--seed", "7", "--overwrite")["losses"]
    assert a == b and a != c


@pytest.mark.parametrize("flags", [
    ["--loss", "sg"], ["--loss", "opt1"], ["--loss", "opt2"], ["--view-pooling", "max"], ["--teacher-dropout", "off"],
    ["--layers", "1:"], ["--layers", ":1"], ["--no-proj"], ["--weight-decay", "0"], ["--tau", "0.5", "--lam", "0"],
    ["--max-steps", "0", "--epochs", "2", "--patience", "1"], ["--max-len", "5"], ["--eval-only"],
])
def test_every_flag_runs(world, flags):
    result = run(world, *flags)
    assert -100 <= result["dev"] <= 100 and -100 <= result["test"] <= 100
    if "--eval-only" not in flags:
        assert all(torch.isfinite(torch.tensor(l)) for _, l in result["losses"])


def test_epochs_give_the_step_count(world):
    result = run(world, "--max-steps", "0", "--epochs", "2", "--patience", "0", "--log-every", "100")
    assert result["steps"] == 2 * 10  # 40 sentences / batch 4, twice


@pytest.mark.slow
def test_eval_all_gives_the_seven_task_table(world, shared_data):
    result = run(world, "--data-dir", str(shared_data), "--max-steps", "2", "--eval-all", "--eval-batch-size", "256")
    assert set(result["sts"]["avg"]) == {"all", "wmean", "mean"}


def crash_after(monkeypatch, n, exc):
    """Make the n-th loss call (1-based) fail with exc, or return NaN when exc is None."""
    calls, real = [0], sg_loss.sg_opt

    def loss(*a, **kw):
        calls[0] += 1
        if calls[0] == n:
            if exc is None:
                return real(*a, **kw) * float("nan")
            raise exc
        return real(*a, **kw)

    monkeypatch.setattr(sg_loss, "sg_opt", loss)  # train.train_step calls it through the module


def best_state(world):
    return {k: v.clone() for k, v in bert.Bert.from_pretrained(world["out"]).state_dict().items()}


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt(), None])
def test_a_run_stopped_midway_keeps_the_best_checkpoint(world, monkeypatch, capsys, exc):
    saved = []
    save = checkpoint.save_checkpoint
    monkeypatch.setattr(checkpoint, "save_checkpoint", lambda *a: (save(*a), saved.append(best_state(world))))
    crash_after(monkeypatch, 5, exc)  # after the evaluations at steps 0 and 3
    if isinstance(exc, RuntimeError):
        with pytest.raises(RuntimeError, match="boom"):
            run(world, "--lr", "1e-3")
    elif exc is None:
        with pytest.raises(SystemExit) as e:
            run(world, "--lr", "1e-3")
        assert e.value.code == 1
        assert "non-finite loss nan at step 5" in capsys.readouterr().out
    else:
        with pytest.raises(SystemExit) as e:
            run(world, "--lr", "1e-3")
        assert e.value.code == 130
        err = capsys.readouterr().err
        assert "interrupted at step 4; the best checkpoint so far (step 3" in err and len(err.strip().splitlines()) == 1
    assert saved, "no checkpoint was saved before the crash"
    now = best_state(world)  # the file is intact, loads, and holds the last saved best
    assert all(torch.equal(now[k], saved[-1][k]) for k in now)


@pytest.mark.parametrize("flags, message", [
    (["--batch-size", "1"], "--batch-size: 1: must be at least 2"),
    (["--tau", "0"], "--tau: 0: must be a finite number > 0"),
    (["--tau", "nan"], "--tau: nan: must be a finite"),
    (["--lam", "-0.1"], "--lam: -0.1: must be a finite number >= 0"),
    (["--weight-decay", "-1"], "--weight-decay: -1"),
    (["--lr", "inf"], "--lr: inf"),
    (["--eval-every", "-1"], "--eval-every: -1: must be at least 1"),
    (["--log-every", "0"], "--log-every: 0"),
    (["--patience", "-1"], "--patience: -1: must be at least 0"),
    (["--epochs", "0"], "--epochs: 0: must be at least 1"),
    (["--max-steps", "-1"], "--max-steps: -1"),
    (["--proj-size", "0"], "--proj-size: 0"),
    (["--eval-batch-size", "0"], "--eval-batch-size: 0"),
    (["--seed", "-1"], "--seed: -1"),
    (["--seed", str(2 ** 64)], "--seed"),
    (["--batch-size", "x"], "--batch-size: 'x' is not an integer"),
    (["--layers", "5"], "expected a slice"),
    (["--layers", "::0"], "step must not be 0"),
    (["--out", "sg.pt"], "does not end in .safetensors"),
    (["--out", "."], "checkpoint path '.' is a folder"),
    (["--json", "/nonexistent-dir/r.json"], "in a folder that does not exist (/nonexistent-dir)"),
    (["--json", "r.txt"], "ending in .json"),
    (["--model", "./no-such-model"], "no-such-model not found"),
    (["--out", "/nonexistent-dir/sg.safetensors"], "nonexistent-dir"),
    (["--data", "missing.txt"], "missing.txt not found"),
    (["--layers", "20:"], "selects none"),
    (["--layers", "x"], "expected a slice"),
])
def test_bad_input_is_one_line(world, capsys, flags, message):
    with pytest.raises(SystemExit) as e:
        run(world, *flags)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_bad_training_file(world, capsys):
    world["sents"].write_bytes(b"a man .\n\xff\xfe oops\n")
    with pytest.raises(SystemExit):
        run(world)
    assert f"{world['sents']}:2" in capsys.readouterr().err
    world["sents"].write_text("\n\n")
    with pytest.raises(SystemExit):
        run(world)
    assert "no sentences" in capsys.readouterr().err


@pytest.mark.parametrize("total", [10, 17, 1079])
def test_warmup_and_decay_equal_transformers_schedule(total):
    transformers = pytest.importorskip("transformers")
    warmup = -(-total // 10)  # ceil(0.1 * total), as train.get_lr
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=5e-5)
    sched = transformers.get_linear_schedule_with_warmup(opt, warmup, total)
    expected = []
    for _ in range(total + 1):
        expected.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    for step in (0, 1, warmup - 1, warmup, warmup + 1, total - 1, total):
        assert train.get_lr(step, total, 5e-5) == pytest.approx(expected[step], abs=1e-15), step
    assert train.get_lr(0, total, 5e-5) == 0.0


@pytest.mark.parametrize("scores, rule, patience, stops_at", [
    ([10, 9, 11, 10, 12, 11], "code", 3, 5),  # falls at evals 1, 3, 5 (cumulative, never reset)
    ([10, 9, 11, 10, 12, 11], "best", 3, None),  # a new best every other eval
    ([10, 12, 11, 11.5, 11.2, 11.4], "best", 3, 4),  # best at eval 1, then 3 evals without a new best
    ([10, 12, 11, 11.5, 11.2, 11.4], "code", 3, None),  # only two falls (11 < 12, 11.2 < 11.5)
    ([-5, -6, -7], "code", 2, 1),  # the first score is compared with 0, as the official code's last_score
    ([10, 9, 8], "code", 0, None),  # patience 0: never
])
def test_early_stop_rules(scores, rule, patience, stops_at):
    stops = [train.early_stop(scores[:n + 1], rule, patience) for n in range(len(scores))]
    assert stops.index(True) == stops_at if stops_at is not None else not any(stops)


def test_an_existing_out_is_refused_and_kept(world, capsys):
    world["out"].write_bytes(b"an earlier model")
    with pytest.raises(SystemExit) as e:
        run(world)
    assert e.value.code == 2 and "--overwrite" in capsys.readouterr().err
    assert world["out"].read_bytes() == b"an earlier model"


def test_overwrite_keeps_the_old_file_until_the_run_has_a_checkpoint(world, monkeypatch, capsys):
    run(world)
    old = world["out"].read_bytes()
    crash_after(monkeypatch, 2, KeyboardInterrupt())  # stopped after one step, before any evaluation but step 0's
    with pytest.raises(SystemExit) as e:
        run(world, "--overwrite", "--seed", "5")
    assert e.value.code == 130 and "the previous" in capsys.readouterr().err
    assert world["out"].read_bytes() == old
    monkeypatch.undo()
    run(world, "--overwrite", "--seed", "5")  # a finished run replaces it
    assert world["out"].read_bytes() != old


def test_a_nan_dev_score_fails_the_run(world, monkeypatch, capsys):
    monkeypatch.setattr(evaluate, "stsb_spearman", lambda *a, **k: float("nan"))
    with pytest.raises(SystemExit) as e:
        run(world)
    assert e.value.code == 2 and "dev Spearman is nan" in capsys.readouterr().err
    assert not world["out"].exists()


def test_json_is_written_atomically_and_valid(world, monkeypatch):
    crash_after(monkeypatch, 5, None)  # a NaN loss lands in the history
    with pytest.raises(SystemExit):
        run(world, "--json", str(world["tmp"] / "r.json"))
    r = json.loads((world["tmp"] / "r.json").read_text())  # strict JSON: NaN would not parse with allow_nan=False
    assert r["losses"][-1][1] is None and not list(world["tmp"].glob(".*.tmp"))


def test_eval_all_with_an_incomplete_data_folder_fails_before_training(world, capsys, monkeypatch):
    monkeypatch.setattr(train, "train_step", lambda *a: pytest.fail("training started"))
    with pytest.raises(SystemExit) as e:
        run(world, "--eval-all")
    assert e.value.code == 2 and "STS12" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [[], ["--eval-only"], ["--loss", "whitening"]])
def test_a_malformed_stsb_dev_file_fails_before_any_work(world, capsys, monkeypatch, flags):
    """The dev split is read at every evaluation: a bad row must be found before training, not at the first one."""
    dev = world["data"] / "senteval/STS/STSBenchmark/sts-dev.csv"
    lines = dev.read_text().splitlines()
    lines[6] = lines[6].replace("\t", " ", 3)
    dev.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(train, "train_step", lambda *a: pytest.fail("training started"))
    monkeypatch.setattr(bert, "encode", lambda *a, **k: pytest.fail("encoding started"))
    with pytest.raises(SystemExit) as e:
        if "whitening" in flags:  # a fit: run()'s step flags mean nothing to it (and are refused)
            lab_train.main(["--model", str(world["model"]), "--data", str(world["sents"]), "--data-dir",
                            str(world["data"]), "--out", str(world["out"]), "--device", "cpu", *flags])
        else:
            run(world, *flags)
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == f"error: {dev}:7: expected 7 tab-separated columns, found 4"
    assert not world["out"].exists()


def test_a_json_that_cannot_be_written_at_the_end_is_one_line_with_exit_1(world, monkeypatch, capsys):
    monkeypatch.setattr(outputs, "write_json", lambda *a: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(SystemExit) as e:
        run(world, "--json", str(world["tmp"] / "r.json"))
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.count("\n") == 1 and "cannot write --json" in err and "No space left" in err
    assert world["out"].exists()  # the checkpoint itself was written


def scores_in_turn(monkeypatch, devs):
    """The dev scores the run's evaluations read, in turn: step 0's first."""
    it = iter(devs)
    monkeypatch.setattr(evaluate, "stsb_spearman", lambda v, d, split: next(it) if split == "dev" else 1.0)


def test_the_base_model_is_never_kept_by_default_and_the_run_says_so(world, monkeypatch, capsys):
    """Every trained evaluation below step 0's: the default keeps the best trained one (the official codes' rule)
    and says so; the result records step 0 as the base model's score."""
    scores_in_turn(monkeypatch, [50.0, 10.0, 30.0, 20.0, 40.0])  # steps 0, 3, 6, 8, then the final report's dev
    result = run(world, "--patience", "0")
    out = capsys.readouterr().out
    assert result["best_step"] == 6 and result["base_dev"] == 50.0
    assert checkpoint.read_metadata(world["out"])["best"] == {"step": 6, "dev": 30.0}
    assert "base model (step 0, dev 50.00) scored above every trained evaluation; kept the best trained one, " \
           "step 6" in out


def test_select_any_keeps_the_base_model_when_nothing_beats_it(world, monkeypatch):
    scores_in_turn(monkeypatch, [50.0, 10.0, 30.0, 20.0, 40.0])
    result = run(world, "--patience", "0", "--select", "any")
    assert result["best_step"] == 0 and result["base_dev"] == 50.0
    meta, base = checkpoint.load(world["out"]), bert.Bert.from_pretrained(world["model"])
    assert meta.meta["best"] == {"step": 0, "dev": 50.0}
    assert all(torch.equal(meta.tensors[k], v) for k, v in base.tensors().items())


def test_ctrl_c_after_the_base_models_evaluation_writes_nothing(world, monkeypatch, capsys):
    crash_after(monkeypatch, 2, KeyboardInterrupt())
    with pytest.raises(SystemExit) as e:
        run(world)
    assert e.value.code == 130 and "no trained checkpoint exists yet; none was written" in capsys.readouterr().err
    assert not world["out"].exists()


def test_a_full_disk_ends_in_one_line_that_says_what_was_kept(world, monkeypatch, capsys):
    save, calls = checkpoint.save_checkpoint, [0]

    def full_after_first(*a):
        calls[0] += 1
        if calls[0] > 1:
            raise OSError(28, "No space left on device")
        return save(*a)

    monkeypatch.setattr(checkpoint, "save_checkpoint", full_after_first)
    with pytest.raises(SystemExit) as e:
        run(world, "--lr", "1e-3", "--eval-every", "1")
    err = capsys.readouterr().err
    assert e.value.code == 2 and "No space left on device" in err and "best checkpoint so far (step 1" in err
    assert checkpoint.read_metadata(world["out"])["best"]["step"] == 1  # step 0 is never written (--select trained)


def test_a_second_run_on_the_same_out_refuses(world, capsys):
    with outputs.output_lock(world["out"]):  # as another live run would hold it
        with pytest.raises(SystemExit) as e:
            run(world)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not world["out"].exists()


def test_a_lock_file_that_cannot_be_made_is_one_line(world, capsys):
    lock = world["out"].with_name(f".{world['out'].name}.lock")
    lock.mkdir()  # a folder where the lock file goes: open() fails after the output checks passed
    with pytest.raises(SystemExit) as e:
        run(world)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "cannot create the lock file" in err
    assert not world["out"].exists()


@pytest.mark.parametrize("loss, pooling", [("consert", "last2"), ("simcse", "cls")])
def test_consert_and_simcse_train_and_record_their_pooling(world, loss, pooling, monkeypatch):
    trained, real_finish = {}, train.finish

    def spy(run, *rest):  # BERT_T's weights after the last step (the best checkpoint may be step 0's)
        trained.update(train.raw(run.bert_T).state_dict())
        return real_finish(run, *rest)
    monkeypatch.setattr(train, "finish", spy)
    result = run(world, "--loss", loss, "--lr", "1e-3")
    assert all(torch.isfinite(torch.tensor(l)) for _, l in result["losses"])
    meta = checkpoint.read_metadata(world["out"])
    assert meta["pooling"] == pooling and meta["method"] == loss
    m, tok = bert.Bert.from_pretrained(world["out"]), bert.load_tokenizer(world["out"])
    assert evaluate.stsb_spearman(evaluate.sentence_vectors(m, tok, pooling), world["data"], "dev") == pytest.approx(result["dev"])
    base = bert.Bert.from_pretrained(world["model"]).state_dict()
    assert any(not torch.equal(v, base[k]) for k, v in trained.items()), "nothing trained"


def spy_on_sides(monkeypatch, loss, spy):
    """--loss `loss`'s two sides, seen by spy(sides, run, x1, x2), which calls the real ones."""
    m = methods.METHODS[loss]
    monkeypatch.setitem(methods.METHODS, loss, dataclasses.replace(m, sides=lambda *a: spy(m.sides, *a)))


def test_twin_methods_contrast_two_passes_of_bert_T(world, monkeypatch):
    """SimCSE's two sides are two dropout masks of BERT_T over the same sentences; ConSERT's two augmentations."""
    seen = []

    def spy(sides, run, x1, x2):
        z1, z2 = sides(run, x1, x2)
        seen.append((z1.detach(), z2.detach(), run.bert_F))
        return z1, z2
    spy_on_sides(monkeypatch, "simcse", spy)
    run(world, "--loss", "simcse", "--max-steps", "1")
    z1, z2, _ = seen[-1]
    assert z1.shape == z2.shape and not torch.allclose(z1, z2)  # dropout makes them differ
    seen.clear()
    run(world, "--loss", "simcse", "--max-steps", "1", "--dropout", "off", "--overwrite")
    z1, z2, _ = seen[-1]
    assert torch.allclose(z1, z2)  # no dropout, no augmentation: the two passes agree


@pytest.mark.parametrize("flags, message", [
    (["--aug1", "cutout:0.1"], "--aug1: 'cutout:0.1': unknown augmentation"),
    (["--loss", "consert", "--aug2", "dropout:2"], "--aug2: 'dropout:2': the rate must be in (0, 1)"),
])
def test_bad_augmentations_are_one_line(world, capsys, flags, message):
    with pytest.raises(SystemExit) as e:
        run(world, *flags)
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("loss", ["opt", "opt2", "simcse"])
def test_pairs_send_column_1_to_side_1_and_column_2_to_side_2(world, monkeypatch, loss):
    sents = world["sents"].read_text().split("\n")[:40]
    pairs = world["tmp"] / "pairs.tsv"
    pairs.write_text("".join(f"{s}\ta dog is running .\n" for s in sents if s))  # column 2: one constant sentence
    seen = []

    def spy(sides, run, x1, x2):
        seen.append((x1[0].clone(), x2[0].clone()))
        return sides(run, x1, x2)
    spy_on_sides(monkeypatch, loss, spy)
    run(world, "--data", str(pairs), "--loss", loss, "--max-steps", "3")
    tok = bert.load_tokenizer(world["model"])
    const = tok.encode("a dog is running .").ids
    for ids1, ids2 in seen:
        assert all(row[:len(const)].tolist() == const for row in ids2)  # side 2: the paraphrase column
        firsts = {tuple(r.tolist()) for r in ids1}
        assert len(firsts) > 1 and all(list(r[:len(const)]) != const for r in firsts)  # side 1: the sentences


@pytest.mark.parametrize("text, line", [("a man .\tmen .\nonly one column\n", 2), ("a\tb\tc\n", 1),
                                        ("a man .\t  \n", 1), ("\tthe paraphrase\n", 1)])
def test_malformed_pairs_are_one_line(world, capsys, text, line):
    pairs = world["tmp"] / "pairs.tsv"
    pairs.write_text(text)
    with pytest.raises(SystemExit) as e:
        run(world, "--data", str(pairs))
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"pairs.tsv:{line}: expected 'sentence<TAB>paraphrase'" in err
    assert len(err.strip().splitlines()) == 1


def test_control_character_lines_are_not_sentences(world):
    world["sents"].write_text(world["sents"].read_text() + "\x00\x01\n\x07 \n")
    assert len(data.training_sentences(str(world["sents"]))) == 40


def test_data_file_runs_without_the_stsb_archive(world):
    (world["data"] / "stsbenchmark.tsv.gz").unlink()
    assert run(world, "--max-steps", "2")["steps"] == 2


def test_a_symlinked_out_stays_a_symlink(world):
    target = world["tmp"] / "real.safetensors"
    world["out"].symlink_to(target)  # dangling until the run writes its target
    run(world)
    assert world["out"].is_symlink() and target.is_file()
    assert checkpoint.read_metadata(world["out"])["best"]["step"] >= 0


def fit(world, loss, *flags):
    """python -m lab.train --loss whitening | flow on the tiny world (no contrastive flags)."""
    return lab_train.main(["--model", str(world["model"]), "--data", str(world["sents"]), "--data-dir", str(world["data"]),
                       "--out", str(world["out"]), "--device", "cpu", "--loss", loss, *flags])


def test_whitening_checkpoint_holds_the_base_model_and_its_map(world):
    """The checkpoint's vectors are (x - mu) W of the base model's first-last vectors, mu and W fitted in float64 on
    the training sentences; the BERT weights are the base model's."""
    result = fit(world, "whitening", "--whiten-dim", "16", "--json", str(world["tmp"] / "w.json"))
    assert result["steps"] == 0 and json.loads((world["tmp"] / "w.json").read_text())["test"] == result["test"]
    meta = checkpoint.read_metadata(world["out"])
    assert meta["transform"] == {"kind": "whitening", "dim": 16} and meta["pooling"] == "first-last"
    base, tok = bert.Bert.from_pretrained(world["model"]), bert.load_tokenizer(world["model"])
    model, transform = lab_evaluate.load_with_transform(world["out"])
    for k, v in base.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    sents = data.training_sentences(str(world["sents"]))
    x = bert.encode(base, tok, sents, "first-last").astype("float64")
    mu = x.mean(0)
    U, S, _ = torch.linalg.svd(torch.from_numpy(np.cov(x.T)))
    want = (x[:5] - mu) @ (U / S.sqrt()).numpy()[:, :16]
    got = transform(bert.encode(model, tok, sents[:5], "first-last"))
    assert abs(got - want).max() < 1e-4 * max(1, abs(want).max())
    assert result["dev"] == pytest.approx(evaluate.stsb_spearman(
        lab_evaluate.sentence_vectors(model, tok, "first-last", transform=transform), world["data"], "dev"), abs=1e-9)


def test_flow_trains_only_the_flow_and_evaluate_applies_it(world):
    result = fit(world, "flow", "--batch-size", "8", "--max-steps", "3", "--seed", "2")
    assert result["steps"] == 3 and result["losses"][0][0] == 1 and result["ms_per_step"] > 0
    meta = checkpoint.read_metadata(world["out"])
    assert meta["transform"]["kind"] == "flow" and meta["transform"]["config"]["dim"] == 32
    model, transform = lab_evaluate.load_with_transform(world["out"])
    tok = bert.load_tokenizer(world["out"])
    x = bert.encode(model, tok, ["a man is playing ."], "first-last")
    z = transform(x)
    assert z.shape == (1, 32) and abs(z - x).max() > 1e-3  # it maps the vectors
    table = lab_evaluate.main(["--ckpt", str(world["out"]), "--tasks", "STSBenchmark", "--data-dir",
                               str(world["data"]), "--batch-size", "128", "--device", "cpu"])
    assert table["sts"]["STSBenchmark"]["all"] == pytest.approx(result["test"], abs=1e-9)


def test_a_flow_is_a_function_of_its_seed(world):
    """BERT's dropout while it makes the vectors the flow is fitted on draws from --seed, not from the global RNG's
    state (torch's first seed is random per process): the same run twice fits the same flow."""
    runs = [fit(world, "flow", "--batch-size", "8", "--max-steps", "2", "--log-every", "1", "--overwrite")
            for _ in range(2)]
    assert runs[0]["losses"] == runs[1]["losses"] and runs[0]["dev"] == runs[1]["dev"]


@pytest.mark.parametrize("loss,flags,message", [
    ("whitening", ["--lam", "0.1"], "--lam means nothing for --loss whitening"),
    ("whitening", ["--lr", "1e-3"], "--lr means nothing for --loss whitening"),
    ("flow", ["--tau", "0.1"], "--tau means nothing for --loss flow"),
    ("flow", ["--whiten-dim", "4"], "--whiten-dim means nothing for --loss flow"),
    ("opt", ["--whiten-dim", "4"], "--whiten-dim means nothing for --loss opt"),
    ("whitening", ["--whiten-dim", "0"], "--whiten-dim: 0: must be at least 1"),
    ("whitening", ["--whiten-dim", "33"], "--whiten-dim 33: "),
    ("flow", ["--batch-size", "64"], "--batch-size 64: the flow's batches"),
])
def test_post_hoc_flags_that_mean_nothing_are_refused(world, capsys, loss, flags, message):
    with pytest.raises(SystemExit) as e:
        fit(world, loss, *flags)
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("loss, flag", [("whitening", ["--max-steps", "1"]), ("whitening", ["--seed", "3"]),
                                        ("whitening", ["--epochs", "2"]), ("flow", ["--eval-every", "5"]),
                                        ("flow", ["--patience", "0"]), ("flow", ["--early-stop", "best"])])
def test_a_fit_refuses_the_loop_flags_it_would_ignore(world, capsys, monkeypatch, loss, flag):
    """`python -m lab.train --loss whitening --max-steps 1` is one line, before any work: a closed-form fit has no steps
    and no seed, a flow no dev evaluation and no early stop (experiments.py passes neither: methods.takes)."""
    monkeypatch.setattr(bert, "encode", lambda *a, **k: pytest.fail("encoding started"))
    with pytest.raises(SystemExit) as e:
        fit(world, loss, *flag)
    err = capsys.readouterr().err.strip()
    why = methods.METHODS[loss].why
    assert e.value.code == 2 and err == f"error: {flag[0]} means nothing for --loss {loss} ({why}): drop it"
    assert not world["out"].exists()


@pytest.mark.parametrize("loss", ["opt", "simcse", "whitening"])
def test_the_final_report_is_what_evaluate_gives_whatever_max_len(world, loss):
    """A checkpoint's scores are a function of the checkpoint and the evaluation flags only: trained at --max-len 4
    (sentences of up to 12 tokens, so the cut matters), train.py's final report equals evaluate.py --ckpt's."""
    flags = ["--loss", loss, "--max-len", "4", "--json", str(world["tmp"] / "train.json")]
    result = fit(world, loss, *flags[2:]) if loss == "whitening" else run(world, *flags, "--lr", "1e-3")
    reported = json.loads((world["tmp"] / "train.json").read_text())
    assert reported["test"] == result["test"]
    main = lab_evaluate.main if loss == "whitening" else evaluate.main  # a fitted map: the lab's to evaluate
    ev = main(["--ckpt", str(world["out"]), "--data-dir", str(world["data"]), "--tasks", "STSBenchmark",
               "--device", "cpu"])
    assert ev["sts"]["STSBenchmark"]["all"] == reported["test"]  # exactly: the same tokens, the same vectors
    model, transform = lab_evaluate.load_with_transform(world["out"])
    short = bert.load_tokenizer(world["out"], max_len=4)  # the training tokenizer would have given another number
    vectors = lab_evaluate.sentence_vectors(model, short, checkpoint.read_metadata(world["out"])["pooling"],
                                           transform=transform)
    assert evaluate.stsb_spearman(vectors, world["data"], "test") != reported["test"]


@pytest.mark.parametrize("loss,flags,message", [
    ("whitening", [], "needs more than 32 distinct sentence vectors (n points"),  # one sentence repeated
    ("flow", ["--lr", "1e4", "--batch-size", "8"], "the flow diverged"),
])
def test_a_fit_that_fails_exits_non_zero_and_keeps_the_old_file(world, capsys, loss, flags, message):
    good = fit(world, "whitening")
    before = world["out"].read_bytes()
    world["sents"].write_text("a man is playing .\n" * 40 if loss == "whitening" else world["sents"].read_text())
    with pytest.raises(SystemExit) as e:
        fit(world, loss, "--overwrite", *flags)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and f"the previous {world['out']} is kept" in err
    assert len(err.strip().splitlines()) == 1 and world["out"].read_bytes() == before and good["dev"] == good["dev"]


def test_a_nan_dev_score_of_a_fit_keeps_the_old_file(world, capsys, monkeypatch):
    fit(world, "whitening")
    before = world["out"].read_bytes()
    monkeypatch.setattr(evaluate, "stsb_spearman", lambda *a, **k: float("nan"))
    with pytest.raises(SystemExit) as e:
        fit(world, "whitening", "--overwrite")
    assert e.value.code == 2 and "is nan" in capsys.readouterr().err and world["out"].read_bytes() == before


@pytest.mark.parametrize("loss", ["whitening", "flow"])
def test_a_fitted_map_records_the_pooling_it_was_fitted_on(world, loss):
    fit(world, loss, "--pooling", "mean", *(["--batch-size", "8", "--max-steps", "2"] if loss == "flow" else []))
    meta = checkpoint.read_metadata(world["out"])
    assert meta["pooling"] == "mean" == meta["args"]["eval_pooling"]


def test_a_full_disk_while_saving_a_fit_is_one_line(world, capsys, monkeypatch):
    def full(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(checkpoint, "save_checkpoint", full)
    with pytest.raises(SystemExit) as e:
        fit(world, "whitening")
    err = capsys.readouterr().err
    assert e.value.code == 2 and "No space left on device" in err and len(err.strip().splitlines()) == 1
    assert not world["out"].exists()


def test_an_out_link_into_a_missing_folder_is_refused_before_training(world, capsys):
    link = world["tmp"] / "link.safetensors"
    link.symlink_to(world["tmp"] / "missing" / "sg.safetensors")
    with pytest.raises(SystemExit) as e:
        run(world, "--out", str(link))
    out, err = capsys.readouterr()
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "step" not in out
    assert f"is a link to {world['tmp'] / 'missing' / 'sg.safetensors'}, which is in a folder that does not exist" in err


def test_the_mlp_head_is_initialised_as_the_simcse_and_promptbert_codes_do(world, monkeypatch):
    """Their cl_init runs transformers' init_weights: Linear weight N(0, initializer_range 0.02), bias 0."""
    torch.manual_seed(0)
    head = methods.mlp_head(768)
    w, b = head[0].weight, head[0].bias
    assert abs(w.std().item() - 0.02) < 5e-4 and abs(w.mean().item()) < 5e-4 and not b.any()
    assert isinstance(head[1], torch.nn.Tanh)
    made, real = [], methods.mlp_head
    monkeypatch.setitem(methods.METHODS, "simcse", dataclasses.replace(
        methods.METHODS["simcse"], head=lambda H, cfg: made.append(H) or real(H, cfg)))
    run(world, "--loss", "simcse", "--max-steps", "1")
    assert made == [32]


def test_non_finite_weights_are_never_kept(world, monkeypatch, capsys):
    """Weights that went NaN while the dev score still reads a number: the run stops in one line, the old --out kept."""
    run(world)
    before = world["out"].read_bytes()
    real = train.BestCheckpoint.offer

    def poisoned(self, step, dev):
        if step:
            with torch.no_grad():
                train.raw(self.run.bert_T).encoder.layer[0].output.dense.bias[0] = float("nan")
        return real(self, step, dev)
    monkeypatch.setattr(train.BestCheckpoint, "offer", poisoned)
    monkeypatch.setattr(train, "early_stop", lambda *a: False)
    scores = iter(range(50, 100))
    monkeypatch.setattr(evaluate, "stsb_spearman", lambda *a, **k: float(next(scores)))  # each one a new best
    with pytest.raises(SystemExit) as e:
        run(world, "--overwrite", "--eval-every", "1")
    err = capsys.readouterr().err
    assert e.value.code == 2 and "non-finite weights" in err and world["out"].read_bytes() == before

# -----------------------------------------------------------------------------
# --precision bf16: the step's numbers against fp32's (an oracle, not a timing), and what stays fp32

BF16_UNITS = 8  # the tolerance of a bf16 step's loss, in bf16's unit roundoff 2^-8 of the fp32 loss (see below)


def step_losses(world, precision, seed, loss="opt", steps=3):
    """The run's own step (opt: train.py's train_step), `steps` times on one fixed batch of 8 sentences, dropout off
    (no draws: the two precisions see the same computation): the losses."""
    sents = world["sents"].read_text().splitlines()[:8]
    argv = ["--model", str(world["model"]), "--loss", loss, "--batch-size", "8", "--max-steps", "10", "--lr", "1e-3",
            "--dropout", "off", "--device", "cpu", "--precision", precision, "--seed", str(seed), *small_head(["--loss", loss])]
    argv += ["--teacher-dropout", "off"] if methods.takes(loss, "teacher_dropout") else []
    cfg = methods.resolve_config(lab_train.get_args(argv))
    r = lab_train.build_run(cfg, bert.Bert.from_pretrained(world["model"]), bert.load_tokenizer(world["model"]), sents,
                         None, torch.device("cpu"))
    return [r.step(5 + k, sents, None)[0].item() for k in range(steps)]  # past the warm-up: the weights move


@pytest.mark.parametrize("loss", ["opt", "simcse"])
def test_a_bf16_step_gives_the_fp32_loss_within_bf16_rounding(world, loss):
    """bf16 keeps 8 significant bits (unit roundoff u = 2^-8 = 3.9e-3). Its products move the sentence vectors'
    cosines by a few u, and SG-OPT's loss, a log-sum-exp of cosine / tau at tau 0.01, amplifies that: measured on
    this tiny BERT over 6 seeds x 3 steps (lr 1e-3, so the updates differ too), |bf16 - fp32| reached 3.8 u of the
    loss (SimCSE: 0.02 u; with dropout off its two passes are the same). The oracle is 8 u, twice the largest seen,
    at each of 3 steps. That the loss itself is fp32 is the next test's: a loss computed in bf16 moved it by at most
    3.9 u here, which no tolerance on the number alone separates."""
    for seed in (0, 1):
        fp32, bf16 = step_losses(world, "fp32", seed, loss), step_losses(world, "bf16", seed, loss)
        assert fp32 != bf16  # autocast was on
        for step, (a, b) in enumerate(zip(fp32, bf16)):
            assert abs(b - a) <= BF16_UNITS * 2 ** -8 * abs(a), f"seed {seed}, step {step}: fp32 {a}, bf16 {b}"


def test_bf16_leaves_the_similarity_loss_and_regulariser_in_fp32(world, monkeypatch):
    """train_step autocasts the encoders and the head; what they hand on is fp32, and the loss and the regulariser run
    outside autocast (on a CPU as on CUDA)."""
    seen = []
    sg_opt, reg_grad = sg_loss.sg_opt, sg_loss.add_weight_distance_grad_

    def loss(z1, z2, *a, **kw):
        seen.append(("loss", z1.dtype, z2.dtype, torch.is_autocast_enabled("cpu")))
        return sg_opt(z1, z2, *a, **kw)

    def regulariser(*a):
        seen.append(("reg", torch.is_autocast_enabled("cpu")))
        return reg_grad(*a)
    monkeypatch.setattr(sg_loss, "sg_opt", loss)
    monkeypatch.setattr(sg_loss, "add_weight_distance_grad_", regulariser)
    step_losses(world, "bf16", 0, steps=1)
    assert seen == [("loss", torch.float32, torch.float32, False), ("reg", False)]


def test_bf16_on_a_cpu_without_a_bf16_unit_says_so_once(world, capsys, monkeypatch):
    """The lab's trainer: one note on stderr (lab/cpu.py), and none for fp32 or on a CPU whose bf16 unit pays; one,
    with the measured ratio, where the unit's bf16 products are slower than fp32's."""
    from lab import cpu
    monkeypatch.setattr(cli, "bf16_unit", lambda: False)
    monkeypatch.setattr(cpu, "cpu_kind", lambda: {"model": "AMD EPYC", "capability": "AVX2", "bf16_unit": False})
    lab = dict(main=lab_train.main)
    run(world, "--precision", "bf16", "--max-steps", "1", "--eval-every", "10", **lab)
    assert capsys.readouterr().err.count("note: --precision bf16 on a CPU without bf16 matrix instructions") == 1
    run(world, "--max-steps", "1", "--eval-every", "10", "--overwrite", **lab)
    assert "note:" not in capsys.readouterr().err
    monkeypatch.setattr(cli, "bf16_unit", lambda: True)
    monkeypatch.setattr(cpu, "cpu_kind", lambda: {"model": "Xeon", "capability": "AVX512", "bf16_unit": True})
    monkeypatch.setattr(cpu, "bf16_matmul_speedup", lambda: 3.0)  # a unit whose bf16 products pay (AMX)
    run(world, "--precision", "bf16", "--max-steps", "1", "--eval-every", "10", "--overwrite", **lab)
    assert "note:" not in capsys.readouterr().err
    monkeypatch.setattr(cpu, "bf16_matmul_speedup", lambda: 0.52)  # AVX512-BF16 without AMX, as measured on a Xeon
    run(world, "--precision", "bf16", "--max-steps", "1", "--eval-every", "10", "--overwrite", **lab)
    err = capsys.readouterr().err
    assert err.count("note: --precision bf16 on this CPU (Xeon, AVX512): its bf16 matrix products run at x0.52 of "
                     "fp32's") == 1 and "slower than fp32 here" in err


def test_an_unreachable_hub_name_says_what_works_here(world, capsys, monkeypatch):
    """--model bert-base-uncased with no network: the loader's line, then the models that need none (issue 53, 12)."""
    def offline(name, dest):
        raise checkpoint.LoadError(f"model '{name}' is not a local path and is not in {dest}, and downloading it "
                                   "failed (no network)")
    monkeypatch.setattr(checkpoint, "download", offline)
    monkeypatch.setattr(checkpoint, "WEIGHTS", world["tmp"] / "weights")
    with pytest.raises(SystemExit) as e:
        run(world, "--model", "bert-base-uncased")
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "downloading it failed" in err
    assert "what works here without a network: --model raw-bert-mini (shipped in models/)" in err
    assert "all-MiniLM-L6-v2" in err
    monkeypatch.setattr(checkpoint, "MODELS", world["tmp"] / "models")  # a clone without models/
    with pytest.raises(SystemExit):
        run(world, "--model", "bert-base-uncased")
    assert capsys.readouterr().err.strip().endswith("or python -m lab.pretrain, then --model raw-bert-mini")
    (world["tmp"] / "weights" / "raw-bert-mini").mkdir(parents=True)  # once pretrain.py has made it
    with pytest.raises(SystemExit):
        run(world, "--model", "bert-base-uncased")
    assert capsys.readouterr().err.strip().endswith("or --model raw-bert-mini (in weights/)")
    with pytest.raises(SystemExit):  # a folder of this disk that is not a model: its own error, no list
        run(world, "--model", str(world["tmp"]))
    assert "what works here" not in capsys.readouterr().err


# -----------------------------------------------------------------------------
# the core's SG-OPT step against the lab's generic step, the code it was written out from


def steps_of(world, module, loss, steps=4):
    """`steps` training steps of `module`'s build_run and Run.step (dropout on, a fresh run): the losses and the
    weights of BERT_T and f after them."""
    sents = world["sents"].read_text().splitlines()
    argv = ["--model", str(world["model"]), "--loss", loss, "--batch-size", "4", "--max-steps", "10", "--lr", "1e-3",
            "--device", "cpu", "--proj-size", "16"]
    cfg = methods.resolve_config(lab_train.get_args(argv))
    r = module.build_run(cfg, bert.Bert.from_pretrained(world["model"]), bert.load_tokenizer(world["model"], 32),
                         sents, None, torch.device("cpu"))
    batches = train.batches(r)
    losses = [r.step(k, *next(batches))[0] for k in range(steps)]
    return losses, {**r.bert_T.state_dict(), **{"f." + k: v for k, v in r.head.state_dict().items()}}


@pytest.mark.parametrize("loss", train.LOSSES)
def test_the_lab_trains_the_sg_family_with_the_cores_step(world, loss):
    """python -m lab.train --loss opt (sg, opt1, opt2) is train.py's run: the core's Run, the same losses and
    weights, bit for bit, dropout and draws included."""
    core, lab = steps_of(world, train, loss), steps_of(world, lab_train, loss)
    assert all(torch.equal(a, b) for a, b in zip(core[0], lab[0]))
    assert core[1].keys() == lab[1].keys() and all(torch.equal(v, lab[1][k]) for k, v in core[1].items())


@pytest.mark.parametrize("aug", ["shuffle", "token-cutoff:0.3"])
def test_the_labs_augmentations_reach_the_cores_passes(world, aug):
    """--aug2 in an SG run (AugmentedRun): BERT_F's pass inside train.train_step is methods.augmented's, the same
    draws from a generator of the same seed."""
    sents = world["sents"].read_text().splitlines()
    argv = ["--model", str(world["model"]), "--aug2", aug, "--device", "cpu", "--proj-size", "16"]
    cfg = methods.resolve_config(lab_train.get_args(argv))
    r = lab_train.build_run(cfg, bert.Bert.from_pretrained(world["model"]), bert.load_tokenizer(world["model"], 32),
                            sents, None, torch.device("cpu"))
    assert isinstance(r, lab_train.AugmentedRun)
    x = train.batch(r, r.tokenizer, sents[:4])
    r.bert_F.eval()
    with lab_train.augmenting(r.bert_F, r.aug2, torch.Generator().manual_seed(5)):
        got = r.bert_F(*x)
    want = methods.augmented(r.bert_F, x, r.aug2, torch.Generator().manual_seed(5))
    plain = r.bert_F(*x)
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and not torch.equal(got[-1], plain[-1])


# -----------------------------------------------------------------------------
# the core and the lab's trainer: what train.py refuses in one line, and the inputs no output may replace


def one_error_line(capsys, main, argv):
    """main(argv) refuses: exit 2 and a single 'error:' line on stderr -> that line."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    return err.strip()


@pytest.mark.parametrize("argv, lab", [
    (["--loss", "simcse", "--out", "x.safetensors"], "python -m lab.train --loss simcse --out x.safetensors"),
    (["--model", "m", "--loss", "whitening"], "python -m lab.train --model m --loss whitening"),
    (["--aug1", "shuffle"], "python -m lab.train --aug1 shuffle"),
    (["--loss", "sscl", "--neg-layers", "1"], "python -m lab.train --loss sscl --neg-layers 1"),
    (["--loss=esimcse", "--dup-rate", "0.2"], "python -m lab.train --loss=esimcse --dup-rate 0.2"),
])
def test_train_py_refuses_the_labs_methods_and_flags_with_the_labs_command(capsys, argv, lab):
    line = one_error_line(capsys, train.main, argv)
    assert line.endswith("; the lab's: " + lab), line
    assert lab_train.get_args(argv).loss == methods.resolve_config(lab_train.get_args(argv)).loss  # the lab takes it


@pytest.mark.parametrize("main", [train.main, lab_train.main], ids=["train.py", "lab.train"])
@pytest.mark.parametrize("argv, flag", [
    (["--model", "M", "--out", "X", "--lo", "opt"], "--lo"),
    (["--loss", "simcse", "--lo", "5"], "--lo"),
    (["--l", "0.1"], "--l"),
    (["--seed=3", "--ov"], "--ov"),
])
def test_an_abbreviated_flag_is_one_line_asking_for_the_whole_flag(capsys, main, argv, flag):
    """Issue 86: argparse read --lo as ambiguous and printed its 16-line usage; a flag is now written whole."""
    line = one_error_line(capsys, main, argv)
    assert line.startswith(f"error: {flag}: write the flag whole") and "usage" not in line, line


def test_an_unknown_flag_of_the_lab_names_the_close_ones(capsys):
    line = one_error_line(capsys, lab_train.main, ["--loss", "simcse", "--tua", "0.1"])
    assert line == "error: unrecognized flag --tua (did you mean --tau?)"


@pytest.mark.parametrize("main", [train.main, lab_train.main], ids=["train.py", "lab.train"])
@pytest.mark.parametrize("which", ["config.json", "data"])
def test_json_naming_an_input_of_the_run_is_refused_before_any_work(world, capsys, monkeypatch, main, which):
    """Issue 86: --json naming the --model folder's config.json (or a --data file named .json) replaced it with the
    record: the model no longer loaded, the training text was gone."""
    data = world["tmp"] / "sentences.json"  # a text file, whatever its name
    data.write_text(world["sents"].read_text())
    target = data if which == "data" else world["model"] / which
    before = target.read_bytes()
    monkeypatch.setattr(bert.Bert, "from_pretrained", lambda *a, **k: pytest.fail("work started"))
    argv = ["--model", str(world["model"]), "--data", str(data), "--data-dir", str(world["data"]), "--out",
            str(world["tmp"] / "new.safetensors"), "--json", str(target), "--device", "cpu"]
    line = one_error_line(capsys, main, argv)
    assert f"--json {target} is the " in line and "writing it would replace what it reads" in line, line
    assert target.read_bytes() == before


def test_a_non_finite_loss_before_any_trained_evaluation_claims_no_kept_checkpoint(world, capsys):
    """Issue 86: --tau 1e-300 over an existing --out (--overwrite): the old file is kept, and no line says that a
    trained checkpoint was kept (there was none: the loss is non-finite at step 1, before the first trained
    evaluation)."""
    world["out"].write_bytes(b"the previous checkpoint")
    with pytest.raises(SystemExit) as e:
        run(world, "--tau", "1e-300", "--overwrite")
    out = capsys.readouterr().out
    assert e.value.code == 1 and world["out"].read_bytes() == b"the previous checkpoint"
    assert "non-finite loss" in out and f"the previous {world['out']} is kept" in out, out
    assert "note: the base model" not in out and "step -1" not in out, out
