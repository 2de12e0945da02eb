"""probe.py against plain computations: with dropout at 0 the vectors made in train mode are the eval-mode ones (every
cosine 1, the same dev score), the dev score is scipy's Spearman of the cosines, the draws are a function of the seed,
and dropout 0.1 moves the vectors."""
import numpy as np
import pytest
from scipy.stats import spearmanr

import bert
import probe
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
    for pooling in probe.POOLINGS:
        uniq = list(dict.fromkeys(s1 + s2))  # one call on the same sentences: the same batches, the same floats
        x = bert.encode(model, tok, uniq, pooling).astype(np.float64)
        a, b = x[[uniq.index(s) for s in s1]], x[[uniq.index(s) for s in s2]]
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        assert got[pooling]["dev_off"] == pytest.approx(100 * spearmanr(cos, gold).statistic, abs=1e-6)
        assert got[pooling]["on_off"]["mean"] < 0.9999 and got[pooling]["two_draws"]["min"] < 0.9999
    zero = tiny_model_folder(tmp_path / "z", {**tiny_config, "hidden_dropout_prob": 0.0,
                                              "attention_probs_dropout_prob": 0.0}, WORDS)
    still = probe.probe(bert.Bert.from_pretrained(zero), tok, s1, s2, gold, draws=2, seed=1)  # train mode = eval mode
    for pooling in probe.POOLINGS:
        r = still[pooling]
        assert r["on_off"]["min"] == pytest.approx(1, abs=1e-6) and r["two_draws"]["min"] == pytest.approx(1, abs=1e-6)
        assert r["dev_on"] == pytest.approx(r["dev_off"], abs=1e-6) and r["dev_on_std"] == pytest.approx(0, abs=1e-6)
