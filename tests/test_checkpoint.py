"""checkpoint.py: the disk. Same bytes for the same checkpoint, atomic saves, leftovers of dead runs, one writer
per output, the hub layout and offline messages, output path checks."""
import contextlib
import http.server
import json
import os
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import bert
import wordpiece
import checkpoint
import outputs
from lab import files, posthoc
from bert import Bert, BertConfig, LoadError, load_tokenizer
from conftest import save_model, tiny_model_folder

ROOT = Path(bert.__file__).resolve().parent


def tiny_model(cfg, seed=0):
    torch.manual_seed(seed)
    return Bert(BertConfig(**cfg))


@pytest.fixture
def tiny_folder(tiny_config, tmp_path):
    return tiny_model_folder(tmp_path / "tiny", tiny_config)


def write_vocab(path):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "the", "man", "##s", ".", "play", "##ing"]
    path.write_text("\n".join(words) + "\n")
    return path


def test_same_model_and_meta_give_the_same_bytes(tiny_config, tmp_path):
    m = tiny_model(tiny_config)
    m.extra = {"pooler.dense.weight": torch.randn(32, 32, dtype=torch.bfloat16),
               "pooler.dense.bias": torch.randn(32, dtype=torch.float16)}
    tok = wordpiece.from_vocab(write_vocab(tmp_path / "vocab.txt"))
    meta = {"tokenizer": tok.to_str(), "base_model": "tiny", "git": "abc", "args": {"lr": 1e-5, "lam": 0.1, "out": "x"},
            "best": {"step": 3, "dev": 71.5}}
    save_model(tmp_path / "a.safetensors", m, meta)
    shuffled = dict(reversed(meta.items()), args=dict(reversed(meta["args"].items())))
    save_model(tmp_path / "b.safetensors", m, shuffled)
    a, b = (tmp_path / "a.safetensors").read_bytes(), (tmp_path / "b.safetensors").read_bytes()
    assert a == b  # safetensors' own writer gave a different metadata order on every save
    assert int.from_bytes(a[:8], "little") % 8 == 0
    # safetensors' reader is the oracle of the hand-written format: every tensor and dtype, the metadata
    back = load_file(str(tmp_path / "a.safetensors"))
    assert back.keys() == {**m.state_dict(), **m.extra}.keys()
    for k, v in {**m.state_dict(), **m.extra}.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
    got = checkpoint.read_metadata(tmp_path / "a.safetensors")
    assert got["args"] == meta["args"] and got["best"] == meta["best"] and got["tokenizer"] == meta["tokenizer"]
    back = Bert.from_pretrained(tmp_path / "a.safetensors")
    assert all(torch.equal(back.extra[k], v) for k, v in m.extra.items())


def test_the_reader_reads_what_safetensors_writes(tmp_path):
    """read_safetensors (one pass: tensors, metadata, sha256) against the safetensors library's own writer, every
    dtype it reads, a scalar and an empty tensor; a cut or holed file is a LoadError, never a wrong tensor."""
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(0)
    tensors = {f"t.{d}": (torch.randn(3, 5, generator=g) * 100).to(getattr(torch, d))
               for d in ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")}
    tensors.update(scalar=torch.tensor(2.5), empty=torch.zeros(0, 4))
    path = tmp_path / "x.safetensors"
    save_file(tensors, str(path), metadata={"git": "abc", "args": '{"lam": 0.1}'})
    got, meta, sha = checkpoint.read_safetensors(path)
    assert got.keys() == tensors.keys() and meta == {"git": "abc", "args": {"lam": 0.1}}
    for k, v in tensors.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape and torch.equal(got[k], v), k
    assert sha == checkpoint.file_sha256(path) and checkpoint.read_safetensors(path, tensors=False) == ({}, meta, None)
    raw = path.read_bytes()
    path.write_bytes(raw[:-3])
    with pytest.raises(LoadError, match="x.safetensors: not a valid safetensors file"):
        checkpoint.read_safetensors(path)
    path.write_bytes(raw + b"\0")  # a byte after the last tensor: the header does not describe this file
    with pytest.raises(LoadError, match="not a valid safetensors file"):
        checkpoint.read_safetensors(path)


def test_interrupted_save_keeps_the_old_checkpoint(tiny_config, tmp_path, monkeypatch):
    path = tmp_path / "sg.safetensors"
    save_model(path, tiny_model(tiny_config), {})
    before = path.read_bytes()

    def half_then_ctrl_c(f, tensors, meta):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt
    monkeypatch.setattr(checkpoint, "write_safetensors", half_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        save_model(path, tiny_model(tiny_config, seed=1), {})
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["sg.safetensors"]


def test_save_removes_only_leftovers_of_dead_runs(tiny_config, tmp_path):
    dead = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(2)]
    for p in dead:
        p.wait()
    d1, d2 = (p.pid for p in dead)  # no process has these pids now: what they left is garbage
    alive = os.getppid()
    keep = [f".sg.safetensors.{alive}.tmp",  # a live writer's
            ".sg.safetensors-k2j4x9.tmp", f".other.safetensors.{d1}.tmp", f"sg.safetensors.{d1}.tmp",  # not ours
            f".sg.safetensors.{d1}.lock"]  # not a temp file: output_lock's, which deals with it itself
    for name in keep + [f".sg.safetensors.{d1}.tmp"]:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / f".sg.safetensors.{d2}.tmp").mkdir()  # a killed export's folder
    (tmp_path / f".sg.safetensors.{d2}.tmp" / "config.json").write_bytes(b"x")
    save_model(tmp_path / "sg.safetensors", tiny_model(tiny_config), {})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep + ["sg.safetensors"])


def test_write_pair_never_leaves_a_record_beside_another_text(tmp_path, monkeypatch):
    """A text and its record (corpus.py's): an error before the renames leaves both as they were, temp files gone; a
    kill at any rename leaves the old pair, or a text with no record, or the new pair: never a mismatched pair."""
    text, rec = tmp_path / "p.txt", tmp_path / "p.txt.json"

    def pair():
        return text.read_text() if text.exists() else None, json.loads(rec.read_text()) if rec.exists() else None
    files.write_pair(text, "old\n", rec, {"text": "old\n"})
    assert pair() == ("old\n", {"text": "old\n"})
    real = os.replace
    for k in range(3):  # killed at the k-th rename (the removal of the old record comes before the first)
        calls = []

        def killed(src, dst):
            calls.append(dst)
            if len(calls) > k:
                raise KeyboardInterrupt
            return real(src, dst)
        monkeypatch.setattr(os, "replace", killed)
        with pytest.raises(KeyboardInterrupt) if k < 2 else contextlib.nullcontext():
            files.write_pair(text, "new\n", rec, {"text": "new\n"})
        monkeypatch.setattr(os, "replace", real)
        t, r = pair()
        assert r is None or r["text"] == t, (k, t, r)
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
        files.write_pair(text, "old\n", rec, {"text": "old\n"})
    rec.unlink()
    rec.mkdir()  # an error before the renames: the text is kept
    with pytest.raises(IsADirectoryError):
        files.write_pair(text, "new\n", rec, {"text": "new\n"})
    assert text.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["p.txt", "p.txt.json"]


@pytest.mark.parametrize("mu, W, info, key, shape", [
    ((32,), (8, 32), {"kind": "whitening", "dim": 32}, "tensor 'transform.W'", "[8, 32], not [32, 32]"),  # W edited
    ((8,), (8, 32), {"kind": "whitening", "dim": 32}, "tensor 'transform.mu'", "[8], not [32]"),  # mu and W: H = 8
    ((16,), (32, 32), {"kind": "whitening", "dim": 32}, "tensor 'transform.mu'", "[16], not [32]"),
    ((32,), (32, 8), {"kind": "whitening", "dim": 32}, "tensor 'transform.W'", "[32, 8], not [32, 32]"),  # not its dim
    ((32,), (32, 32, 1), {"kind": "whitening"}, "tensor 'transform.W'", "[32, 32, 1], not [32, K]"),
    (None, None, {"kind": "flow", "config": {"dim": 16, "levels": 3, "depth": 3, "width": 32}},
     "metadata 'transform'", "it maps 16 dimensions"),
])
def test_a_fitted_map_of_the_wrong_shape_is_refused_when_read(tiny_config, tmp_path, mu, W, info, key, shape):
    """A fitted transform's tensors are checked against the model's width (lab/posthoc.py), in one line
    naming the file and the key: never a 'mat1 and mat2 shapes cannot be multiplied' at the first encoding."""
    model, path = tiny_model(tiny_config), tmp_path / "w.safetensors"
    fitted = {} if mu is None else {"transform.mu": torch.zeros(mu), "transform.W": torch.ones(W)}
    checkpoint.save_checkpoint(path, {**model.tensors(), **fitted},
                               {"config": model.config.to_dict(), "pooling": "first-last", "transform": info})
    with pytest.raises(LoadError) as e:
        posthoc.check_transform(checkpoint.load(path))
    msg = str(e.value)
    assert msg.startswith(f"{path}: its ") and key in msg and shape in msg and len(msg.splitlines()) == 1, msg
    assert "cannot be rebuilt" in msg and "hidden_size" in msg and "fit it again: python -m lab.train --loss" in msg
    assert checkpoint.load(path, tensors=False).meta["transform"] == info  # the header alone: what a tokenizer needs


def test_check_checkpoint_path(tmp_path):
    (tmp_path / "sg.safetensors").write_bytes(b"x")
    (tmp_path / "d.safetensors").mkdir()
    assert checkpoint.check_checkpoint_path(tmp_path / "sg.safetensors") == tmp_path / "sg.safetensors"
    assert checkpoint.check_checkpoint_path(tmp_path / "new.safetensors", write=True) == tmp_path / "new.safetensors"
    for path, write, problem in [("", False, "is empty"), (" ", True, "is empty"), (tmp_path, True, "is a folder"),
                                 (tmp_path / "d.safetensors", False, "is a folder"),
                                 (tmp_path / "sg.pt", True, "does not end in .safetensors"),
                                 (tmp_path / "new.safetensors", False, "not found"),
                                 (tmp_path / "no/sg.safetensors", True, "is in a folder that does not exist")]:
        with pytest.raises(LoadError, match=f"^checkpoint path '.*' {problem}"):
            checkpoint.check_checkpoint_path(path, write=write)
    with pytest.raises(LoadError, match="d.safetensors' is a folder"):
        Bert.from_pretrained(tmp_path / "d.safetensors")


def test_a_folder_that_refuses_new_files_is_found_before_any_work(tmp_path, monkeypatch):
    """access() says yes to root, and on file systems that refuse new files anyway (/proc, a read-only bind mount
    seen as root): the output checks try to make a file, and leave nothing behind when they can."""
    assert outputs.check_output(tmp_path / "r.json", ".json") == tmp_path / "r.json"
    assert checkpoint.check_checkpoint_path(tmp_path / "sg.safetensors", write=True)
    assert not list(tmp_path.iterdir())

    def refuse(*a, **k):
        raise OSError(30, "Read-only file system")
    monkeypatch.setattr(outputs.tempfile, "mkstemp", refuse)
    with pytest.raises(outputs.OutputError, match=r"r.json is in a folder we cannot write to \(.*: Read-only file system\)$"):
        outputs.check_output(tmp_path / "r.json", ".json")
    with pytest.raises(LoadError, match=r"'.*sg.safetensors' is in a folder we cannot write to \(.*: Read-only file"):
        checkpoint.check_checkpoint_path(tmp_path / "sg.safetensors", write=True)


# -----------------------------------------------------------------------------
# one process per output


def test_output_lock_one_process_per_output(tmp_path):
    out = tmp_path / "sg.safetensors"
    lock = tmp_path / ".sg.safetensors.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time, outputs\nwith outputs.output_lock(sys.argv[1]):\n"
                               "    print('locked', flush=True)\n    time.sleep(60)", str(out)],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        busy = f"^{out} is being written by another process \\(pid {holder.pid}\\); wait for it"
        with pytest.raises(outputs.OutputLocked, match=busy):
            with outputs.output_lock(out):
                pass
    finally:
        holder.kill()  # kill -9: no clean-up of its own, its lock file stays
        holder.wait()
    assert lock.read_text().strip() == str(holder.pid)
    with outputs.output_lock(out):  # the dead process's lock is taken over
        assert lock.read_text() == f"{os.getpid()}\n"
        with pytest.raises(outputs.OutputLocked, match=f"pid {os.getpid()}"):  # not re-entrant, even in one process
            with outputs.output_lock(out):
                pass
    assert not lock.exists()
    lock.write_text("garbage")  # a lock file nobody holds, whatever it says
    with outputs.output_lock(out):
        pass
    assert not lock.exists()


@pytest.mark.parametrize("module, name", [("fcntl", "flock"), ("os", "ftruncate"), ("os", "write")])
def test_a_ctrl_c_while_the_lock_is_taken_leaves_no_lock_file(tmp_path, monkeypatch, module, name):
    """Ctrl-C landing inside output_lock, after its lock file is made and before the lock is handed out (train.py,
    pretrain.py, export.py and a sweep all take it there): no .NAME.lock file stays, and the output locks again."""
    import fcntl
    out, lock = tmp_path / "sg.safetensors", tmp_path / ".sg.safetensors.lock"
    owner = {"fcntl": fcntl, "os": os}[module]
    real, calls = getattr(owner, name), []

    def interrupted(*a):
        if not calls:  # the first call, as a Ctrl-C there
            calls.append(a)
            raise KeyboardInterrupt
        return real(*a)
    monkeypatch.setattr(owner, name, interrupted)
    with pytest.raises(KeyboardInterrupt):
        with outputs.output_lock(out):
            pytest.fail("the lock was handed out")
    monkeypatch.undo()
    assert calls and not lock.exists(), f"Ctrl-C in {name}: {lock.name} was left behind"
    with outputs.output_lock(out):
        assert lock.read_text() == f"{os.getpid()}\n"
    assert not lock.exists()


# -----------------------------------------------------------------------------
# name resolution and download (against a local HTTP server, never the real hub)


def test_download_from_hub_layout(tiny_folder, tmp_path, monkeypatch):
    hub = tmp_path / "hub" / "org" / "tiny" / "resolve" / "main"
    hub.mkdir(parents=True)
    for f in ("config.json", "model.safetensors"):
        (hub / f).write_bytes((tiny_folder / f).read_bytes())
    write_vocab(hub / "vocab.txt")  # no tokenizer.json on the "hub": the vocab.txt fallback is fetched
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "hub"))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(checkpoint, "HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setattr(checkpoint, "WEIGHTS", tmp_path / "weights")
    try:
        m = Bert.from_pretrained("org/tiny")
        tok = load_tokenizer("org/tiny")
    finally:
        server.shutdown()
    assert sorted(p.name for p in (tmp_path / "weights/org/tiny").iterdir()) == ["config.json", "model.safetensors", "vocab.txt"]
    assert not [p for p in (tmp_path / "weights/org").iterdir() if p.name.startswith(".")]  # no temp folder left
    assert tok.encode("the man").ids == [2, 7, 8, 3]
    assert torch.equal(m.embeddings.word_embeddings.weight, Bert.from_pretrained(tiny_folder).embeddings.word_embeddings.weight)


@pytest.mark.parametrize("name", ["a/../../escaped", "org/../../../tmp/x", "org/..", "a//b", "a/./b", "a\\..\\b",
                                  "~/x", "org/name/", "-rf", "org/.hidden", "$HOME"])
def test_model_names_stay_inside_weights(name, tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "HF_ENDPOINT", "http://127.0.0.1:9")  # nothing may be fetched either
    monkeypatch.setattr(checkpoint, "WEIGHTS", tmp_path / "weights")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LoadError, match=r"not found, and it is not a model name \(org/name: letters, digits"):
        Bert.from_pretrained(name)
    assert list(tmp_path.iterdir()) == []  # no folder made, inside weights/ or out of it


def test_offline_name_says_which_folder_to_fill(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: connection refused at once
    monkeypatch.setattr(checkpoint, "WEIGHTS", tmp_path / "weights")
    with pytest.raises(LoadError) as e:
        Bert.from_pretrained("bert-base-uncased")
    msg = str(e.value)
    assert str(tmp_path / "weights" / "bert-base-uncased") in msg and "model.safetensors" in msg and "config.json" in msg
    assert not (tmp_path / "weights" / "bert-base-uncased").exists()
    assert not list((tmp_path / "weights").iterdir())  # no half-written folder



@pytest.mark.parametrize("text, shipped_only", [
    (None, True),  # no pretrain.json
    ("{}", True),  # a record that names no sha256
    ('{"sha256": 12345}', False),  # a sha256 that is not one
    ('{"sha256": {"model.safetensors": "abc"}}', False),
    ('<<<<<<< HEAD\n{"sha256": "x"}\n=======\n{}\n>>>>>>> theirs\n', False),  # git's conflict markers
    ('{"sha256": {"model.sa', False),  # cut short
])
def test_a_record_that_cannot_check_the_weights_never_lets_them_load_unchecked(tiny_config, tmp_path, monkeypatch,
                                                                               text, shipped_only):
    """The load check of a folder's weights against its pretrain.json was off whenever the record could not be read
    or named no sha256 as a string: a shipped model (models/NAME/) loads only checked, and an unreadable record or a
    sha256 that is not one is refused anywhere; a weights/ folder without a record, or one naming no sha256, loads."""
    monkeypatch.setattr(checkpoint, "MODELS", tmp_path / "models")
    for folder in (tmp_path / "models" / "m", tmp_path / "weights" / "m"):
        tiny_model_folder(folder, tiny_config)
        if text is not None:
            (folder / "pretrain.json").write_text(text)
        shipped = folder.parent.name == "models"
        if shipped or not shipped_only:
            with pytest.raises(LoadError) as e:
                checkpoint.load(folder)
            msg = str(e.value)
            assert str(folder / "pretrain.json") in msg and "\n" not in msg, msg
            assert ("git checkout -- models/m" in msg) == shipped, msg
        else:
            assert checkpoint.load(folder).sha256 == checkpoint.file_sha256(folder / "model.safetensors")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LoadError):  # by its name too: `--model m` finds models/m first
        checkpoint.load("m")


def test_checkpoint_written_before_the_layout_change_still_loads(tmp_path):
    """tests/fixtures/checkpoint-5ad2517.json: the metadata header that train.py wrote at commit 5ad2517 (before
    checkpoint.py existed), written here verbatim around a tiny model's HF-named tensors with safetensors' own writer.
    Today's code reads its metadata, config and tokenizer, and gives, bit for bit, the vectors of the same weights and
    tokenizer put together by hand."""
    import json

    import numpy as np
    from safetensors.torch import save_file
    from tokenizers import Tokenizer
    fixture = json.loads((ROOT / "tests" / "fixtures" / "checkpoint-5ad2517.json").read_text())
    torch.manual_seed(0)
    ref = Bert(bert.BertConfig(**json.loads(fixture["metadata"]["config"]))).eval()
    path = tmp_path / "old.safetensors"
    save_file({k: v.contiguous() for k, v in ref.tensors().items()}, str(path), metadata=fixture["metadata"])
    meta = checkpoint.read_metadata(path)
    assert meta["git"] == "5ad2517" and meta["method"] == "opt" and meta["best"]["step"] == 0
    assert meta["args"]["batch_size"] == 8 and meta["pooling"] == "cls"
    model, tok = Bert.from_pretrained(path), load_tokenizer(path)
    assert model.config.to_dict() == ref.config.to_dict()
    assert all(torch.equal(v, ref.tensors()[k]) for k, v in model.tensors().items())
    by_hand = Tokenizer.from_str(fixture["metadata"]["tokenizer"])
    assert [e.ids for e in tok.encode_batch(fixture["sentences"])] == \
        [e.ids for e in by_hand.encode_batch(fixture["sentences"])]
    for pooling in ("cls", "mean", "first-last"):
        got = bert.encode(model, tok, fixture["sentences"], pooling)
        assert np.array_equal(got, bert.encode(ref, by_hand, fixture["sentences"], pooling)), pooling


class FakeHub(http.server.BaseHTTPRequestHandler):
    """The hub's layout, /org/tiny/resolve/main/FILE, from `files` {name: bytes}, each served as `how`[name] says:
    'ok', 'short' (a Content-Length 100 bytes past the body), 'html' (a 200 page of HTML), or a list of those, one
    per request."""
    files, how, requests = {}, {}, []

    def do_GET(self):
        name = self.path.rsplit("/", 1)[-1]
        FakeHub.requests.append(name)
        if name not in self.files:
            self.send_error(404)
            return
        way = self.how.get(name, "ok")
        way = way.pop(0) if isinstance(way, list) else way
        body = b"<!DOCTYPE html><html><body>Sign in</body></html>" if way == "html" else self.files[name]
        self.send_response(200)
        self.send_header("Content-Type", "text/html" if way == "html" else "application/octet-stream")
        self.send_header("Content-Length", str(len(body) + (100 if way == "short" else 0)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture
def hub(tiny_folder, tmp_path, monkeypatch):
    """A fake hub on 127.0.0.1 serving the tiny model as org/tiny; weights/ in tmp_path."""
    for k in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(k, raising=False)
    FakeHub.files = {f: (tiny_folder / f).read_bytes() for f in ("config.json", "model.safetensors")}
    FakeHub.files["vocab.txt"] = write_vocab(tmp_path / "vocab.txt").read_bytes()
    FakeHub.how, FakeHub.requests = {}, []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    server.timeout = 5
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(checkpoint, "HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setattr(checkpoint, "WEIGHTS", tmp_path / "weights")
    yield FakeHub
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("file, how, message", [
    ("model.safetensors", "short", "of the"),  # cut short: fewer bytes than its Content-Length
    ("model.safetensors", "html", "HTML page"),  # a login page served with 200
    ("config.json", "html", "HTML page"),
    ("model.safetensors", "garbage", "not a valid safetensors file"),  # a header that does not parse
    ("model.safetensors", "cut", "not a valid safetensors file"),  # a well-formed header, the data cut short
    ("config.json", "garbage", "not a valid json file"),
])
def test_a_bad_download_never_reaches_weights(hub, tmp_path, file, how, message):
    if how == "garbage":
        hub.files[file] = b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all"
    elif how == "cut":
        hub.files[file] = hub.files[file][:-64]  # announced in full (Content-Length matches), the tensors are not
    else:
        hub.how[file] = how
    with pytest.raises(LoadError, match=message) as e:
        Bert.from_pretrained("org/tiny")
    assert "org/tiny" in str(e.value) and "\n" not in str(e.value)
    assert hub.requests.count(file) == 2  # retried once
    assert not (tmp_path / "weights" / "org" / "tiny").exists() and not list((tmp_path / "weights" / "org").iterdir())


def test_a_download_that_fails_once_is_retried(hub, tmp_path, tiny_folder):
    hub.how["model.safetensors"] = ["short", "ok"]
    m = Bert.from_pretrained("org/tiny")
    assert hub.requests.count("model.safetensors") == 2
    assert (tmp_path / "weights/org/tiny/model.safetensors").read_bytes() == (tiny_folder / "model.safetensors").read_bytes()
    assert torch.equal(m.embeddings.word_embeddings.weight, Bert.from_pretrained(tiny_folder).embeddings.word_embeddings.weight)


def test_a_weights_folder_that_cannot_be_made_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setattr(checkpoint, "WEIGHTS", tmp_path / "file" / "weights")
    monkeypatch.setattr(checkpoint, "HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(LoadError, match="cannot be created to download it into .*set SG_WEIGHTS"):
        Bert.from_pretrained("org/tiny")
    r = subprocess.run([sys.executable, "evaluate.py", "--model", "org/tiny", "--tasks", "STS12"], cwd=ROOT, timeout=120,
                       capture_output=True, text=True, env={**os.environ, "SG_WEIGHTS": str(tmp_path / "file" / "w"),
                                                             "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert r.returncode == 2 and "Traceback" not in r.stderr and "set SG_WEIGHTS" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
