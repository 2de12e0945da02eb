"""bf16 without waste (fast.py): a frozen model's products take weights cast (and q, k, v concatenated) once, the very
tensors autocast makes at each use, so a frozen BERT_F, an encoding or a frozen generator give bit for bit the numbers
they gave when every forward cast them anew; and the kept tensors follow the weights when these change."""
import copy

import pytest
import torch

import bert
import fast


@pytest.fixture
def model(tiny_config):
    torch.manual_seed(0)
    return bert.Bert(bert.BertConfig(**tiny_config)).eval()


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 120, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:], mask[2, 3:] = 0, 0
    return ids, mask


def forward(model, frozen, precision):
    """The hidden states of a frozen model (no weight requires grad: it keeps its weights), or of one that learns
    (every product casts its weights anew, as autocast does)."""
    ids, mask = batch()
    model.requires_grad_(not frozen)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        return model(ids, mask)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_frozen_layer_gives_the_numbers_of_a_recast_one(model, precision):
    want = forward(copy.deepcopy(model), False, precision)
    for _ in range(2):  # the first call keeps the weights, the second uses them
        got = forward(model, True, precision)
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    kept = model.encoder.layer[0].attention.self.query.kept  # q, k, v's, kept on the query
    assert kept is not None and kept[1][0].dtype == (torch.bfloat16 if precision == "bf16" else torch.float32)
    assert kept[1][0].shape == (3 * model.config.hidden_size, model.config.hidden_size)  # q, k, v as one
    assert model.encoder.layer[1].output.dense.kept[1][0].dtype == kept[1][0].dtype


def test_kept_weights_follow_the_weights(model):
    forward(model, True, "bf16")
    with torch.no_grad():  # an optimizer step's kind of change: in place
        model.encoder.layer[1].intermediate.dense.weight.mul_(1.5)
        model.encoder.layer[0].attention.self.key.bias.add_(0.1)
    got = forward(model, True, "bf16")
    want = forward(copy.deepcopy(model), False, "bf16")
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    fp32 = forward(model, True, "fp32")  # autocast off: the fp32 weights again, not the bf16 ones kept
    assert all(h.dtype == torch.float32 for h in fp32) and not torch.equal(fp32[-1], got[-1])


def test_a_layer_that_learns_keeps_nothing_even_under_no_grad(model):
    """The fused AdamW step changes weights in place without bumping their versions: a learning layer never keeps
    a copy (the dev evaluation of BERT_T runs under no_grad between steps)."""
    forward(model, False, "bf16")
    assert not kept(model)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    model.train()
    ids, mask = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(ids, mask)[-1].sum().backward()
    assert not kept(model)
    w = model.encoder.layer[0].attention.self.query.weight
    before, version = w.detach().clone(), w._version
    opt.step()
    assert not torch.equal(w, before) and w._version == version  # (!!) changed in place, its version unchanged



def kept(model):
    """The modules of model that keep weights (fast.linear)."""
    return [m for m in model.modules() if m.__dict__.get("kept") is not None]


def test_an_encoding_keeps_the_weights_of_a_model_that_learns_only_while_it_runs(tmp_path, tiny_config, monkeypatch):
    """bert.encode freezes the model for its batches (each layer's weights cast and concatenated once, not once a
    batch), with the numbers of an encoding that casts them at every batch, then gives the model back as it was: its
    weights require grad again and nothing kept outlives the call."""
    import contextlib

    from conftest import tiny_model_folder
    folder = tiny_model_folder(tmp_path / "m", tiny_config, words="a man dog runs".split())
    m, tok = bert.Bert.from_pretrained(folder).requires_grad_(True), bert.load_tokenizer(folder)
    sentences = ["a man runs", "a dog", "a dog runs a man"] * 30
    seen, linear = [], fast.linear

    def spy(x, *linears):
        out = linear(x, *linears)
        seen.append(linears[0].__dict__.get("kept") is not None)
        return out
    monkeypatch.setattr(fast, "linear", spy)
    got = bert.encode(m, tok, sentences, batch_size=8, precision="bf16")
    assert len(seen) > 4 * len(m.encoder.layer) and all(seen)  # kept through every batch
    assert all(p.requires_grad for p in m.parameters()) and not kept(m)
    monkeypatch.setattr(fast, "frozen", lambda model: contextlib.nullcontext())  # as before: cast at every batch
    seen.clear()
    want = bert.encode(m, tok, sentences, batch_size=8, precision="bf16")
    assert not any(seen) and (got == want).all()


def test_under_bf16_autocast_a_cpu_runs_the_attention_in_fp32(model, monkeypatch):
    """Autocast puts scaled_dot_product_attention on its CPU bf16 list: the layer turns it off for the attention,
    whose q, k, v (and output) are fp32 there, in the forward as in the backward."""
    import torch.nn.functional as F
    dtypes, sdpa = [], F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        y = sdpa(q, k, v, **kw)
        dtypes.append((q.dtype, y.dtype))
        return y
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    model.train().requires_grad_(True)
    ids, mask = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hs = model(ids, mask)
    hs[-1].float().sum().backward()
    assert dtypes == [(torch.float32, torch.float32)] * model.config.num_hidden_layers
    assert hs[-1].dtype == torch.float32  # LayerNorm's output, as before
