"""wk.py against its oracle: the SBERT-WK code's algorithm as its per-sentence, per-token, per-layer float64 numpy
loop (utils.py: dissecting -> unify_token -> unify_sentence; reference.wk_reference, shared with bench.py wk),
on the tiny BERT and on real MiniLM sentences."""
import numpy as np
import pytest
import torch

import bert
from lab import wk
from lab.reference import wk_reference as reference_wk
from conftest import TINY, tiny_model_folder

SENTENCES = ["a man is playing a guitar .", "the cat", "a woman and a dog are on the man with the cat in the guitar",
             "is"]


def hidden(model, tok, sentences):
    ids, mask = bert.batch_tensors(tok.encode_batch(sentences), model.config.pad_token_id, "cpu")
    with torch.no_grad():
        return model(ids, mask), mask


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    words = sorted({w for s in SENTENCES for w in s.split()})
    config = dict(TINY, num_hidden_layers=7)  # 8 hidden states: windows that run past both ends
    folder = tiny_model_folder(tmp_path_factory.mktemp("wk") / "tiny", config, words=words, seed=4)
    return bert.Bert.from_pretrained(folder), bert.load_tokenizer(folder)


@pytest.mark.parametrize("layer_start,window", [(0, 2), (1, 1), (0, 3), (2, 4), (5, 2), (5, 1), (0, 7)])
def test_batched_equals_the_code_loop_on_tiny_bert(tiny, layer_start, window):
    """Every window shape: empty left windows at the bottom, truncated right ones at the top, windows past both ends."""
    hs, mask = hidden(*tiny, SENTENCES)
    got = wk.wk_pool(hs, mask, layer_start, window).numpy()
    np.testing.assert_allclose(got, reference_wk(hs, mask, layer_start, window), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scale", [1e-2, 1e-4, 1e-6, 0])
def test_nearly_dependent_layers_equal_the_code_loop(tiny, scale):
    """Hidden state 3 = hidden state 2 plus a small change: windows holding both are ill-conditioned, where a
    Cholesky factor of the Gram matrix could lose what the code's QR keeps; at 0 some windows are singular (Cholesky
    fails, and wk.py factors them by QR)."""
    hs, mask = hidden(*tiny, SENTENCES)
    near = hs[2] + scale * torch.randn(hs[2].shape, generator=torch.Generator().manual_seed(0)) * hs[2].norm(dim=-1, keepdim=True)
    hs = (*hs[:3], near.float(), *hs[4:])
    got = wk.wk_pool(hs, mask, 0, 2).numpy()
    if scale == 0:  # equal hidden states: rank-deficient windows, whose scores are rounding noise in the code too
        assert np.isfinite(got).all()
    else:
        np.testing.assert_allclose(got, reference_wk(hs, mask, 0, 2), rtol=1e-5, atol=1e-5)


def test_context_follows_python_slices():
    assert wk.context(0, 9, 2) == [1, 2, 0] and wk.context(1, 9, 2) == [2, 3, 1]  # left side empty, not truncated
    assert wk.context(2, 9, 2) == [0, 1, 3, 4, 2] and wk.context(8, 9, 2) == [6, 7, 8]
    assert [len(wk.context(k, 9, 2)) for k in range(9)] == [3, 3, 5, 5, 5, 5, 5, 4, 3]  # as the facts file checked


def test_real_minilm_sentences_of_different_lengths(minilm_path):
    path = minilm_path
    model, tok = bert.Bert.from_pretrained(path), bert.load_tokenizer(path)
    sents = ["A man is playing a guitar.", "Stocks fell sharply on Monday after the central bank raised its rates "
             "for the third time this year.", "Hi", "Two dogs run across a snowy field while children watch."]
    hs, mask = hidden(model, tok, sents)
    start = wk.default_layer_start(model.config.num_hidden_layers)
    assert start == 2
    got = wk.wk_pool(hs, mask, start).numpy()
    np.testing.assert_allclose(got, reference_wk(hs, mask, start, 2), rtol=1e-5, atol=1e-5)
    # and through the encoder's batching (sorted by length, a callable pooling): the same vectors, in input order
    enc = bert.encode(model, tok, sents, pooling=lambda h, m: wk.wk_pool(h, m, start), batch_size=2)
    np.testing.assert_allclose(enc, got, rtol=1e-5, atol=1e-5)


def test_defaults_and_bad_arguments(tiny):
    assert wk.default_layer_start(12) == 4 and wk.default_layer_start(6) == 2
    hs, mask = hidden(*tiny, SENTENCES[:2])
    L = len(hs) - 1
    with pytest.raises(ValueError, match="layer_start"):
        wk.wk_pool(hs, mask, L - 1)  # two hidden states: one cosine between layers, no variance to weigh tokens by
    with pytest.raises(ValueError, match="window"):
        wk.wk_pool(hs, mask, 0, 0)
    with pytest.raises(ValueError, match="window"):
        wk.wk_pool(hs, mask, L - 2, 3)  # 3 hidden states: a window of 3 leaves the top one without context
