"""diffcse.py against its oracles: the replaced-token labels against a plain loop, the corruption against pretrain.py's
own masking and MLM head, L_RTD against a float64 loop, the conditional discriminator against transformers'
BertModel with its [CLS] embedding replaced (the official modeling_bert.py's change), the generator loaded from a
pretrain.py folder and from bert-base-uncased's layout equal to the head it was written from, the refusals as one
line, determinism by seed, and where the gradients go."""
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import bert
import wordpiece
from lab import diffcse
from lab import pretrain
from checkpoint import LoadError
from conftest import SPECIAL, TINY, tiny_model_folder
from test_train import world  # noqa: F401 (the tiny model, data folder and sentences)

WORDS = "the a man woman dog cat plays runs on in guitar piano park street red blue small big old new".split()
SENTENCES = ["a man plays the guitar", "the dog runs", "a small red cat plays in the park on the old street",
             "new piano"]


def tokenizer_of(words=WORDS, tmp=None):
    """The uncased WordPiece tokenizer of SPECIAL + words (bert.py's own reader of a vocab.txt)."""
    f = Path(tmp) / "vocab.txt"
    f.write_text("\n".join(dict.fromkeys([*SPECIAL, *words])) + "\n")
    return wordpiece.from_vocab(f)


def mlm_folder(folder, words=WORDS, config=None, seed=0):
    """A tiny random pretrain.py model folder (pretrain.write_folder: bert.* and cls.predictions.* keys, config.json,
    tokenizer.json, vocab.txt, pretrain.json); the head's bias and LayerNorm drawn too, so that no part is trivial.
    Returns (folder, model, head)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = bert.Bert(bert.BertConfig(**(config or TINY)))
    head = pretrain.make_head(model.config)
    with torch.no_grad():
        head.bias.normal_(std=0.02)  # of the scale of the logits: the argmax varies with the input
        head.transform.LayerNorm.weight.uniform_(0.5, 1.5)
        head.transform.LayerNorm.bias.normal_(std=0.1)
    pretrain.write_folder(folder, model, head, tokenizer_of(words, folder.parent), {})
    return folder, model, head


@pytest.fixture
def parts(tmp_path):
    """(G, the trained model, its tokenizer, G's model and head as written): G from a pretrain.py folder, the model a
    tiny BertModel folder of the same vocabulary, as MiniLM takes a raw model's generator."""
    folder, model, head = mlm_folder(tmp_path / "gen" / "raw")
    trained = tiny_model_folder(tmp_path / "model", TINY, WORDS, seed=1)
    tok = bert.load_tokenizer(trained)
    G = diffcse.load_generator(folder, tok, TINY["vocab_size"])
    return G, bert.Bert.from_pretrained(trained), tok, model.eval(), head.eval()


def batch(tok, sentences=SENTENCES):
    return bert.batch_tensors(tok.encode_batch(sentences))  # (N, T) each, padded with 0 = [PAD]

# -----------------------------------------------------------------------------
# the labels and the corruption


def test_replaced_labels_against_a_loop():
    g = torch.Generator().manual_seed(0)
    N, T = 6, 9
    ids = torch.randint(5, 30, (N, T), generator=g)
    ids[:, 0] = 2  # [CLS]
    lengths = [9, 3, 5, 9, 2, 7]
    mask = torch.tensor([[int(t < n) for t in range(T)] for n in lengths])
    ids[~mask.bool()] = 0
    filled = torch.where(torch.rand(N, T, generator=g) < 0.5, torch.randint(0, 30, (N, T), generator=g), ids)
    x2, y = diffcse.replaced_tokens(filled, ids, mask)
    for i in range(N):
        for t in range(T):
            real = mask[i, t] == 1
            want = ids[i, t] if t == 0 or not real else filled[i, t]  # [CLS] put back; padding its own id
            assert x2[i, t] == want
            assert y[i, t] == (1 if real and t > 0 and filled[i, t] != ids[i, t] else 0)
    assert y.sum() > 0 and (y == 0).logical_and(mask.bool()).sum() > 0


def test_corruption_is_the_generators_argmax_over_pretrains_masking(parts):
    G, _, tok, model, head = parts
    ids, mask = batch(tok)
    x2, y = diffcse.corrupt(G, ids, mask, 0.3, torch.Generator().manual_seed(3))
    # the oracle: pretrain.py's masking of the same draws, and its own head's logits on the written weights
    special = torch.tensor(sorted(tok.token_to_id(t) for t in SPECIAL))
    inputs, rows, _ = pretrain.mask_tokens(ids, mask, special, len(tok.get_vocab()), tok.token_to_id("[MASK]"), 0.3,
                                           torch.Generator().manual_seed(3))
    assert len(rows) > 0 and not torch.isin(ids.flatten()[rows], special).any()
    with torch.no_grad():
        top = pretrain.mlm_logits(model, head, inputs, mask).argmax(-1).view(ids.shape)
    for i in range(len(ids)):
        for t in range(ids.shape[1]):
            want = ids[i, t] if t == 0 or not mask[i, t] else top[i, t]
            assert x2[i, t] == want and y[i, t] == int(bool(mask[i, t]) and t > 0 and top[i, t] != ids[i, t])


def test_special_tokens_are_never_masked(parts):
    G = parts[0]
    assert sorted(G.special.tolist()) == [0, 1, 2, 3, 4]  # [PAD] [UNK] [CLS] [SEP] [MASK]: all_special_ids
    ids = torch.randint(0, 25, (200, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    _, rows, _ = pretrain.mask_tokens(ids, mask, G.special, G.n_words, G.mask_id, 0.3,
                                      torch.Generator().manual_seed(1))
    assert abs(len(rows) / (ids >= 5).sum().item() - 0.3) < 0.03
    assert (ids.flatten()[rows] >= 5).all()

# -----------------------------------------------------------------------------
# the discriminator and its loss


def test_electra_loss_against_a_float64_loop():
    g = torch.Generator().manual_seed(0)
    N, T = 5, 7
    logits = torch.randn(N, T, 2, generator=g, dtype=torch.float64) * 3
    y = torch.randint(0, 2, (N, T), generator=g)
    want = 0.0
    for i in range(N):
        for t in range(T):  # every position of the padded batch, each its 2-way -log softmax
            a, b = logits[i, t].tolist()
            want += -((a if y[i, t] == 0 else b) - math.log(math.exp(a) + math.exp(b)))
    want /= N * T
    got = diffcse.electra_loss(logits, y)
    assert got.dtype == torch.float64 and abs(got.item() - want) < 1e-12
    assert diffcse.electra_loss(logits.to(torch.bfloat16), y).dtype == torch.float32  # fp32 math


def test_the_discriminator_is_conditioned_as_the_official_bert(tmp_path):
    """Oracle: transformers' BertModel of the same folder, its embedding output at position 0 replaced by z before
    the encoder (the official modeling_bert.py, lines 960-961), in float64."""
    transformers = pytest.importorskip("transformers")
    folder = tiny_model_folder(tmp_path / "m", TINY, WORDS)
    D = diffcse.Discriminator(bert.Bert.from_pretrained(folder)).double().eval()
    hf = transformers.BertModel.from_pretrained(str(folder), add_pooling_layer=False,
                                                attn_implementation="eager").double().eval()
    ids, mask = batch(bert.load_tokenizer(folder))
    z = torch.randn(len(ids), TINY["hidden_size"], dtype=torch.float64)
    with torch.no_grad():
        x = hf.embeddings(input_ids=ids)
        x = torch.cat([z[:, None], x[:, 1:]], 1)
        additive = (1.0 - mask[:, None, None, :].double()) * torch.finfo(torch.float64).min
        h = hf.encoder(x, attention_mask=additive)
        h = h[0] if isinstance(h, tuple) else h.last_hidden_state
        want = D.electra_head(h)[mask.bool()]
        got = D(z, ids, mask)[mask.bool()]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    other = ids.clone()
    other[:, 0] = 7  # the [CLS] token's id is not seen: its embedding is z
    assert torch.equal(D(z, other, mask), D(z, ids, mask))


def test_the_projection_head_against_a_float64_formula():
    H, N = 6, 10
    f = diffcse.ProjectionMLP(H).double().train()
    c = torch.randn(N, H, dtype=torch.float64)

    def bn(x, w=None, b=None):  # batch statistics, the biased variance, eps 1e-5
        x = (x - x.mean(0)) / torch.sqrt(x.var(0, unbiased=False) + 1e-5)
        return x if w is None else x * w + b
    lin1, bn1, lin2 = f.net[0], f.net[1], f.net[3]
    want = bn(torch.relu(bn(c @ lin1.weight.T, bn1.weight, bn1.bias)) @ lin2.weight.T)
    torch.testing.assert_close(f(c), want, rtol=0, atol=1e-12)
    assert lin1.bias is None and lin2.bias is None and not f.net[4].affine
    assert (lin1.weight.shape, lin2.weight.shape) == ((2 * H, H), (H, 2 * H))

# -----------------------------------------------------------------------------
# the generator's loading and refusals


def test_a_generator_from_a_pretrain_folder_is_its_written_head(parts):
    G, _, tok, model, head = parts
    ids, mask = batch(tok)
    assert not G.training and all(not p.requires_grad for p in G.parameters()) and G.decoder is None
    with torch.no_grad():
        x = G.bert(ids, mask)[-1].flatten(0, 1)
        torch.testing.assert_close(G.logits(x), pretrain.mlm_logits(model, head, ids, mask), rtol=0, atol=0)


def bert_for_pretraining_folder(folder, model, head, decoder=None):
    """bert-base-uncased's layout: bert.* with LayerNorm.gamma / beta, cls.predictions.* with the decoder's weight
    (tied) and bias, cls.seq_relationship.* (NSP), written as safetensors directly."""
    folder.mkdir(parents=True)

    def rename(k):
        return k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
    t = {rename("bert." + k): v for k, v in model.state_dict().items()}
    t.update({rename("cls.predictions." + k): v for k, v in head.state_dict().items()})
    words = model.embeddings.word_embeddings.weight
    t["cls.predictions.decoder.weight"] = (words if decoder is None else decoder).detach().clone()
    t["cls.predictions.decoder.bias"] = head.bias.detach().clone()
    t["cls.seq_relationship.weight"] = torch.zeros(2, model.config.hidden_size)
    t["cls.seq_relationship.bias"] = torch.zeros(2)
    save_file({k: v.contiguous() for k, v in t.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(model.config.to_dict()))
    (folder / "vocab.txt").write_text("\n".join([*SPECIAL, *WORDS]) + "\n")
    return folder


def test_a_generator_of_bert_base_uncased_layout(parts, tmp_path):
    _, _, tok, model, head = parts
    ids, mask = batch(tok)
    G = diffcse.load_generator(bert_for_pretraining_folder(tmp_path / "bfp", model, head), tok, TINY["vocab_size"])
    assert G.decoder is None  # the decoder's weight is the word embeddings: tied
    with torch.no_grad():
        want = pretrain.mlm_logits(model, head, ids, mask)
        torch.testing.assert_close(G.logits(G.bert(ids, mask)[-1].flatten(0, 1)), want, rtol=0, atol=0)
    untied = torch.randn(TINY["vocab_size"], TINY["hidden_size"])
    G = diffcse.load_generator(bert_for_pretraining_folder(tmp_path / "untied", model, head, untied), tok,
                               TINY["vocab_size"])
    x = torch.randn(3, TINY["hidden_size"])
    t = head.transform
    want = torch.nn.functional.linear(t.LayerNorm(torch.nn.functional.gelu(t.dense(x))), untied, head.bias)
    torch.testing.assert_close(G.logits(x), want)


def one_line_refusal(call, *words):
    with pytest.raises(LoadError) as e:
        call()
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    return msg


def test_refusals_are_one_line_naming_the_folder(parts, tmp_path):
    _, _, tok, _, _ = parts
    plain = tiny_model_folder(tmp_path / "plain", TINY, WORDS)  # a BertModel without an MLM head, like MiniLM
    one_line_refusal(lambda: diffcse.load_generator(plain, tok, TINY["vocab_size"]), str(plain), "no masked-LM head",
                     "--generator")
    other, _, _ = mlm_folder(tmp_path / "o" / "other", WORDS[::-1])  # the same words, other ids
    one_line_refusal(lambda: diffcse.load_generator(other, tok, TINY["vocab_size"]), str(other),
                     "vocabulary is not the model's", "--generator with a model of the same vocabulary")
    wide, _, _ = mlm_folder(tmp_path / "w" / "wide", config={**TINY, "vocab_size": 130})
    one_line_refusal(lambda: diffcse.load_generator(wide, tok, TINY["vocab_size"]), str(wide),
                     "vocab_size 130, the model's 120", "--generator")
    # a head that is not whole: a key missing
    folder, model, head = mlm_folder(tmp_path / "h" / "headless")
    t = {"bert." + k: v for k, v in model.state_dict().items()}
    t["cls.predictions.bias"] = head.bias.detach()
    save_file(t, str(folder / "model.safetensors"))
    (folder / "pretrain.json").unlink()  # its record names the old weights' sha256
    one_line_refusal(lambda: diffcse.load_generator(folder, tok, TINY["vocab_size"]), str(folder),
                     "missing cls.predictions.transform.dense.weight")

def test_a_generator_shorter_than_the_runs_sentences_is_refused_before_step_0(world, capsys):  # noqa: F811
    """A generator of 8 positions under --max-len 32 (DiffCSE's recipe) failed with an AssertionError inside
    Generator.fill at step 1: refused in one line naming --generator, its max_position_embeddings and the length the
    run reads; with --max-len 8 it is the run's generator."""
    from test_train import run
    torch.manual_seed(0)
    cfg = bert.BertConfig(**{**bert.Bert.from_pretrained(world["model"]).config.to_dict(),
                             "max_position_embeddings": 8})
    model = bert.Bert(cfg)
    folder = world["tmp"] / "short"
    pretrain.write_folder(folder, model, pretrain.make_head(cfg), bert.load_tokenizer(world["model"]), {})
    with pytest.raises(SystemExit) as e:
        run(world, "--loss", "diffcse", "--generator", str(folder), "--max-steps", "2")
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith(f"error: --generator {folder} "), err
    assert "max_position_embeddings is 8" in err and "up to 32 tokens" in err and "--max-len 8" in err, err
    assert not world["out"].exists()
    result = run(world, "--loss", "diffcse", "--generator", str(folder), "--max-steps", "2", "--max-len", "8")
    assert result["steps"] == 2 and result["generator"] == "short"


# -----------------------------------------------------------------------------
# the method's state: determinism and gradients


def method(parts, **cfg):
    G, trained, _, _, _ = parts
    return diffcse.DiffCSE(G, diffcse.Discriminator(trained), cfg)


def test_deterministic_given_the_seeds(parts):
    ids, mask = batch(parts[2])
    z = torch.randn(len(ids), TINY["hidden_size"], generator=torch.Generator().manual_seed(0))
    runs = []
    for seed in (1, 1, 2):
        torch.manual_seed(0)  # dropout (D's, G's), as train.py seeds it
        m = method(parts)
        assert m.G.training and m.D.training
        loss = m.extra_loss(z, ids, mask, torch.Generator().manual_seed(seed))
        runs.append((loss, diffcse.corrupt(m.G.eval(), ids, mask, 0.3, torch.Generator().manual_seed(seed))))
    assert torch.equal(runs[0][0], runs[1][0]) and all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))
    assert not torch.equal(runs[0][1][0], runs[2][1][0]), "another seed, the same corruption"


def test_the_loss_is_lam_times_l_rtd_of_the_discriminators_logits(parts):
    ids, mask = batch(parts[2])
    z = torch.randn(len(ids), TINY["hidden_size"])
    m = method(parts, generator_dropout=False).train(False)  # no dropout: the pieces can be recomputed
    got = m.extra_loss(z, ids, mask, torch.Generator().manual_seed(5))
    x2, y = diffcse.corrupt(m.G, ids, mask, 0.30, torch.Generator().manual_seed(5))
    want = 0.005 * diffcse.electra_loss(m.D(z, x2, mask), y)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert m.last["replaced"] == y.sum() / mask.sum()


def test_gradients_reach_the_discriminator_and_the_sentence_vector_never_the_generator(parts):
    ids, mask = batch(parts[2])
    z = torch.randn(len(ids), TINY["hidden_size"], requires_grad=True)
    m = method(parts)
    m.extra_loss(z, ids, mask, torch.Generator().manual_seed(0)).backward()
    assert z.grad is not None and z.grad.abs().sum() > 0
    D = m.modules()[0]
    assert D is m.D and D.electra_head.weight.grad.abs().sum() > 0
    assert D.bert.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0
    assert D.bert.embeddings.word_embeddings.weight.grad.abs().sum() > 0  # every weight of D is trained
    assert all(p.grad is None and not p.requires_grad for p in m.G.parameters())


def test_minilm_is_refused_and_takes_a_raw_models_generator(minilm_path, tmp_path):
    """The packaged all-MiniLM-L6-v2 has no MLM head; a raw model made with its tokenizer (pretrain.py's: the same
    30,522 words) is its generator."""
    tok = bert.load_tokenizer(minilm_path)
    V = bert.config_of(bert.read_checkpoint(minilm_path, tensors=False)).vocab_size
    one_line_refusal(lambda: diffcse.load_generator(minilm_path, tok, V), str(minilm_path), "no masked-LM head")
    torch.manual_seed(0)
    model = bert.Bert(bert.BertConfig(**{**TINY, "vocab_size": V}))
    pretrain.write_folder(tmp_path / "raw", model, pretrain.make_head(model.config), tok, {})
    G = diffcse.load_generator(tmp_path / "raw", tok, V)
    assert G.n_words == V and G.mask_id == tok.token_to_id("[MASK]") and len(G.special) == 5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_on_cuda_the_same_corruption_and_loss(parts):
    """Device-agnostic: the masks drawn on the CPU by the same seed, so the corruption is the CPU's and the loss its
    value up to float order."""
    ids, mask = batch(parts[2])
    z = torch.randn(len(ids), TINY["hidden_size"])
    m = method(parts, generator_dropout=False).train(False)
    want = m.extra_loss(z, ids, mask, torch.Generator().manual_seed(4))
    x_cpu = diffcse.corrupt(m.G, ids, mask, 0.3, torch.Generator().manual_seed(4))
    m.to("cuda")
    got = m.extra_loss(z.cuda(), ids.cuda(), mask.cuda(), torch.Generator().manual_seed(4))
    x_gpu = diffcse.corrupt(m.G, ids.cuda(), mask.cuda(), 0.3, torch.Generator().manual_seed(4))
    assert all(torch.equal(a.cpu(), b) for a, b in zip(x_gpu, x_cpu))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-7)
