"""probe.py against plain computations: with dropout at 0 the vectors made in train mode are the eval-mode ones (every
cosine 1, the same dev score), the dev score is scipy's Spearman of the cosines, the draws are a function of the seed,
and dropout 0.1 moves the vectors."""
import os

import numpy as np
import pytest
from scipy.stats import spearmanr

import bert
from lab import probe
from conftest import tiny_model_folder

WORDS = "a man woman dog cat plays runs guitar piano park red blue small big".split()


def pairs(n=40, seed=0):
    g = np.random.default_rng(seed)
    s = [" ".join(g.choice(WORDS, g.integers(3, 9))) for _ in range(2 * n)]
    return s[:n], s[n:], g.uniform(0, 5, n)


def test_probe_against_plain_computations(tmp_path, tiny_config):
    folder = tiny_model_folder(tmp_path / "m", {**tiny_config, "hidden_dropout_prob": 0.1,
                                                "attention_probs_dropout_prob": 0.1}, WORDS)
    model, tok = bert.Bert.from_pretrained(folder), bert.load_tokenizer(folder)
    s1, s2, gold = pairs()
    got = probe.probe(model, tok, s1, s2, gold, draws=3, seed=1)
    assert got == probe.probe(model, tok, s1, s2, gold, draws=3, seed=1)  # the draws are the seed's
    for pooling in probe.PROBED_POOLINGS:
        uniq = list(dict.fromkeys(s1 + s2))  # one call on the same sentences: the same batches, the same floats
        x = bert.encode(model, tok, uniq, pooling).astype(np.float64)
        a, b = x[[uniq.index(s) for s in s1]], x[[uniq.index(s) for s in s2]]
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        assert got[pooling]["dev_off"] == pytest.approx(100 * spearmanr(cos, gold).statistic, abs=1e-6)
        assert got[pooling]["on_off"]["mean"] < 0.9999 and got[pooling]["two_draws"]["min"] < 0.9999
    zero = tiny_model_folder(tmp_path / "z", {**tiny_config, "hidden_dropout_prob": 0.0,
                                              "attention_probs_dropout_prob": 0.0}, WORDS)
    still = probe.probe(bert.Bert.from_pretrained(zero), tok, s1, s2, gold, draws=2, seed=1)  # train mode = eval mode
    for pooling in probe.PROBED_POOLINGS:
        r = still[pooling]
        assert r["on_off"]["min"] == pytest.approx(1, abs=1e-6) and r["two_draws"]["min"] == pytest.approx(1, abs=1e-6)
        assert r["dev_on"] == pytest.approx(r["dev_off"], abs=1e-6) and r["dev_on_std"] == pytest.approx(0, abs=1e-6)


def test_json_onto_the_models_own_files_is_refused_before_any_work(tmp_path, tiny_config, capsys):
    """--json one of the model's files, or a new file inside its folder (through '..', a link or a hard link): one
    line, exit 2, nothing of the model replaced (the record over config.json left a model that no longer loads)."""
    folder = tiny_model_folder(tmp_path / "m", tiny_config, WORDS)
    before = {f.name: f.read_bytes() for f in folder.iterdir()}
    (tmp_path / "link").symlink_to(folder)
    os.link(folder / "config.json", tmp_path / "hard.json")
    for out in (folder / "config.json", folder / "sub" / ".." / "probe.json", tmp_path / "link" / "config.json",
                tmp_path / "hard.json"):
        with pytest.raises(SystemExit) as e:
            probe.main(["--model", str(folder), "--json", str(out), "--data-dir", str(tmp_path / "no-data")])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith(f"error: --json {out} ") and len(err.strip().splitlines()) == 1, err
        assert "the model" in err and "give another file" in err
    assert {f.name: f.read_bytes() for f in folder.iterdir()} == before
    probe.check_json(str(tmp_path / "probe.json"), str(folder))  # beside the folder: fine
