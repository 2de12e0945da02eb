"""bert.py against its oracles: HF transformers.BertModel hidden states, HF tokenizers, hand-made bad checkpoints."""
import contextlib
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import bert
import wordpiece
import runtime
import checkpoint
from bert import Bert, BertConfig, LoadError, batch_tensors, encode, load_tokenizer, pool
from conftest import rounding_atol, save_model

ROOT = Path(bert.__file__).resolve().parent


def tiny_model(cfg, seed=0):
    torch.manual_seed(seed)
    return Bert(BertConfig(**cfg))


def test_tiny_forward_backward(tiny_config):
    m = tiny_model(tiny_config).train()
    ids = torch.randint(1, 120, (3, 10))
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, 6:] = 0
    hs = m(ids, mask)
    assert len(hs) == tiny_config["num_hidden_layers"] + 1
    assert all(h.shape == (3, 10, 32) for h in hs)
    hs[-1][:, 0].sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.encoder.parameters())


def test_padding_does_not_change_real_tokens(tiny_config):
    m = tiny_model(tiny_config).eval()
    ids = torch.randint(1, 120, (1, 7))
    alone = m(ids, torch.ones_like(ids))
    padded_ids = torch.cat([ids, torch.randint(1, 120, (1, 5))], 1)  # junk, not even pad ids, behind a 0 mask
    mask = torch.cat([torch.ones(1, 7), torch.zeros(1, 5)], 1).long()
    padded = m(padded_ids, mask)
    for a, b in zip(alone, padded):  # other shapes, other kernels: equal up to summation order
        torch.testing.assert_close(a, b[:, :7], atol=rounding_atol(a, tiny_config["intermediate_size"]), rtol=0)


def test_config_errors(tiny_config):
    d = dict(tiny_config, model_type="bert", architectures=["BertModel"])  # unknown keys are ignored
    assert BertConfig.from_dict(d).hidden_size == 32
    del d["hidden_size"]
    with pytest.raises(LoadError, match="hidden_size"):
        BertConfig.from_dict(d, "x/config.json")


@pytest.mark.parametrize("key, value, message", [
    ("hidden_size", 0, "a positive integer"), ("hidden_size", 32.0, "a positive integer"),
    ("num_hidden_layers", True, "a positive integer"), ("vocab_size", "120", "a positive integer"),
    ("intermediate_size", -64, "a positive integer"), ("max_position_embeddings", None, "a positive integer"),
    ("type_vocab_size", 0, "a positive integer"),
    ("num_attention_heads", 5, "not a multiple of 'num_attention_heads' 5"),
    ("hidden_dropout_prob", 1.0, r"in \[0, 1\)"), ("attention_probs_dropout_prob", -0.1, r"in \[0, 1\)"),
    ("hidden_dropout_prob", float("nan"), r"is NaN; it must be a number in \[0, 1\)"),
    ("layer_norm_eps", 0, "a positive number"), ("layer_norm_eps", float("inf"), "a positive number"),
    ("pad_token_id", -1, "a non-negative integer"), ("pad_token_id", 120, "120 is not below 'vocab_size' 120"),
    ("hidden_act", "relu", "one of gelu, gelu_new"), ("hidden_act", ["gelu"], "one of gelu"),
])
def test_config_values_are_checked(tiny_config, key, value, message):
    with pytest.raises(LoadError, match=f"^x/config.json: config key '.*{message}") as e:
        BertConfig.from_dict(dict(tiny_config, **{key: value}), "x/config.json")
    assert f"'{key}'" in str(e.value) and "\n" not in str(e.value)


def test_config_checks_cover_every_field():
    assert set(bert.CONFIG_CHECKS) == {f.name for f in bert.fields(BertConfig)}


def test_bad_config_names_its_file(tiny_config, tiny_folder, tmp_path):
    (tiny_folder / "config.json").write_text(json.dumps(dict(tiny_config, layer_norm_eps=float("nan"))))
    with pytest.raises(LoadError, match=f"^{tiny_folder / 'config.json'}: config key 'layer_norm_eps' is NaN"):
        Bert.from_pretrained(tiny_folder)
    (tiny_folder / "config.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(LoadError, match="config.json: not a valid BERT config.json"):
        Bert.from_pretrained(tiny_folder)
    m = tiny_model(tiny_config)
    m.config.hidden_dropout_prob = 2  # a config no checkpoint should hold, written anyway
    save_model(tmp_path / "sg.safetensors", m, {})
    with pytest.raises(LoadError, match=r"sg.safetensors \(metadata 'config'\): config key 'hidden_dropout_prob' is 2"):
        Bert.from_pretrained(tmp_path / "sg.safetensors")


@pytest.mark.parametrize("meta, message", [
    ({"config": [1, 2]}, "metadata 'config' is a JSON list; it must be an object"),
    ({"args": ["--lr", "1"]}, "metadata 'args' is a JSON list"),
    ({"best": 3}, "metadata 'best' is a JSON int"),
    ({"args": "{not json"}, "metadata 'args' is not valid JSON"),
])
def test_metadata_of_the_wrong_json_type(tiny_config, tmp_path, meta, message):
    save_model(tmp_path / "sg.safetensors", tiny_model(tiny_config), meta)
    with pytest.raises(LoadError, match=message):
        Bert.from_pretrained(tmp_path / "sg.safetensors")


# -----------------------------------------------------------------------------
# the real checkpoint

SENTS = ["A man is playing a guitar.", "hello", "", "Two dogs run through a field of tall grass near the old barn.",
         "Obama signs the bill into law!", "naïve café résumé", "A " * 40]


@pytest.fixture(scope="module")
def minilm(minilm_path):
    return Bert.from_pretrained(minilm_path), load_tokenizer(minilm_path)


@pytest.mark.slow
def test_hidden_states_match_hf(minilm, minilm_path):
    transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle (requirements-dev.txt)")
    model, tok = minilm
    ids, mask = batch_tensors(tok.encode_batch(SENTS))
    assert mask.sum(1).unique().numel() > 3  # a padded batch of different lengths
    K = model.config.intermediate_size  # the longest reduction of a layer
    model64 = copy.deepcopy(model).double()
    for impl in ("eager", "sdpa"):
        hf = transformers.BertModel.from_pretrained(minilm_path, attn_implementation=impl).eval()
        for dtype, ours_model in (("float64", model64), ("float32", model)):  # float64: the exact check; fp32: as run
            hf = hf.to(getattr(torch, dtype))
            with torch.no_grad():
                ours = ours_model(ids, mask)
                ref = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
            assert len(ours) == len(ref) == 7
            for k, (a, b) in enumerate(zip(ours, ref)):
                assert a.dtype == b.dtype == getattr(torch, dtype)
                err = ((a - b).abs() * mask[..., None]).max().item()  # real tokens; padding rows are never read
                tol = rounding_atol(b[mask.bool()], K, dtype)  # summation order alone (threads, kernels): conftest
                assert err <= tol, f"{impl} {dtype} layer {k}: max abs diff {err:.2e} (limit {tol:.2e})"


def pretraining_copy(src, dst):
    """A BertForPreTraining-style file: 'bert.' prefix, gamma/beta, cls.* heads and a position_ids buffer."""
    sd = {}
    for k, v in load_file(str(src / "model.safetensors")).items():
        sd["bert." + k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")] = v
    sd["bert.embeddings.position_ids"] = torch.arange(512)[None]
    sd["cls.predictions.bias"] = torch.zeros(30522)
    sd["cls.predictions.transform.dense.weight"] = torch.zeros(384, 384)
    sd["cls.seq_relationship.weight"] = torch.zeros(2, 384)
    dst.mkdir()
    save_file(sd, str(dst / "model.safetensors"))
    (dst / "config.json").write_text((src / "config.json").read_text())
    return dst


@pytest.mark.slow
def test_pretraining_layout_loads(minilm, minilm_path, tmp_path):
    model, tok = minilm
    other = Bert.from_pretrained(pretraining_copy(minilm_path, tmp_path / "bert-style"))
    for (k, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), k
    ids, mask = batch_tensors(tok.encode_batch(SENTS))
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(model(ids, mask), other(ids, mask)))


@pytest.fixture
def tiny_folder(tiny_config, tmp_path):
    m = tiny_model(tiny_config)
    d = tmp_path / "tiny"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(tiny_config))
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(d / "model.safetensors"))
    return d


def edit(folder, fn):
    f = folder / "model.safetensors"
    sd = load_file(str(f))
    fn(sd)
    save_file(sd, str(f))
    return folder


@pytest.mark.parametrize("change, message", [
    (lambda sd: sd.pop("encoder.layer.1.output.dense.weight"), "missing keys: encoder.layer.1.output.dense.weight"),
    (lambda sd: sd.update({"encoder.layer.0.attention.self.rotary": torch.zeros(3)}),
     "unexpected keys: encoder.layer.0.attention.self.rotary"),
    (lambda sd: sd.update({"embeddings.word_embeddings.weight": torch.zeros(99, 32)}),
     r"wrong shapes: embeddings.word_embeddings.weight \(99, 32\) \(model expects \(120, 32\)\)"),
    (lambda sd: [sd.pop(k) for k in list(sd) if k.startswith("encoder.layer.1.")], "says 2 layers but the checkpoint has 1"),
    (lambda sd: sd.update({"embeddings.word_embeddings.weight": torch.ones(120, 32, dtype=torch.int64)}),
     r"integer tensors: embeddings.word_embeddings.weight \(int64\)"),
    (lambda sd: sd.update({"pooler.dense.bias": torch.ones(32, dtype=torch.int32)}),
     "integer tensors: pooler.dense.bias"),
    (lambda sd: sd.update({"bert.encoder.layer.0.output.dense.bias": sd["encoder.layer.0.output.dense.bias"] + 1}),
     "two keys for one weight: bert.encoder.layer.0.output.dense.bias and encoder.layer.0.output.dense.bias"),
    (lambda sd: sd.update({"embeddings.LayerNorm.gamma": sd["embeddings.LayerNorm.weight"].clone()}),
     "two keys for one weight: embeddings.LayerNorm.gamma and embeddings.LayerNorm.weight"),
])
def test_bad_checkpoints_name_the_key(tiny_folder, change, message):
    edit(tiny_folder, change)
    with pytest.raises(LoadError, match=message) as e:
        Bert.from_pretrained(tiny_folder)
    assert str(tiny_folder / "model.safetensors") in str(e.value)


def test_not_safetensors_and_missing_files(tiny_folder, tmp_path):
    (tiny_folder / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(LoadError, match="model.safetensors: not a valid safetensors file"):
        Bert.from_pretrained(tiny_folder)
    (tiny_folder / "model.safetensors").unlink()
    with pytest.raises(LoadError, match="model.safetensors not found"):
        Bert.from_pretrained(tiny_folder)
    with pytest.raises(LoadError, match="nope.safetensors not found"):
        Bert.from_pretrained(tmp_path / "nope.safetensors")


def test_checkpoint_roundtrip_is_bit_exact(tiny_config, tiny_folder, tmp_path):
    m = Bert.from_pretrained(tiny_folder)
    tok = wordpiece.from_vocab(write_vocab(tmp_path / "vocab.txt"))
    save_model(tmp_path / "sg.safetensors", m, {"tokenizer": tok.to_str(), "args": {"lam": 0.1}})
    assert not list(tmp_path.glob("*.tmp"))
    back = Bert.from_pretrained(tmp_path / "sg.safetensors")
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), back.state_dict().values()))
    meta = checkpoint.read_metadata(tmp_path / "sg.safetensors")
    assert meta["args"] == {"lam": 0.1} and meta["config"] == tiny_config
    assert load_tokenizer(tmp_path / "sg.safetensors").encode("a b").ids == tok.encode("a b").ids


def write_vocab(path):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "the", "man", "##s", ".", "play", "##ing"]
    path.write_text("\n".join(words) + "\n")
    return path


# -----------------------------------------------------------------------------
# tokenizer and encode


@pytest.mark.slow
def test_tokenizer_matches_hf(minilm_path, shared_data, tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers is the tokenizer oracle")
    lines = (shared_data / "senteval/STS/STS14-en-test/STS.input.deft-forum.txt").read_text(encoding="utf-8").split("\n")
    sents = [s for line in lines[:150] if line for s in line.split("\t")] + SENTS
    ref = transformers.AutoTokenizer.from_pretrained(minilm_path)(sents, truncation=True, max_length=128)["input_ids"]
    assert len(sents) >= 300
    assert [e.ids for e in load_tokenizer(minilm_path).encode_batch(sents)] == ref
    # the vocab.txt-only fallback builds the same uncased WordPiece tokenizer
    only_vocab = tmp_path / "vocab-only"
    only_vocab.mkdir()
    (only_vocab / "vocab.txt").write_text((minilm_path / "vocab.txt").read_text())
    assert [e.ids for e in load_tokenizer(only_vocab).encode_batch(sents)] == ref
    assert len(load_tokenizer(minilm_path, max_len=16).encode("word " * 100).ids) == 16


def tokenizer_folder(tmp_path, tiny_config, **config):
    d = tmp_path / "tok"
    d.mkdir()
    write_vocab(d / "vocab.txt")
    (d / "config.json").write_text(json.dumps(dict(tiny_config, **config)))
    return d


def no_cls_sep(d):
    tok = wordpiece.from_vocab(d / "vocab.txt")
    tok.post_processor = None  # plain WordPiece: no [CLS] in front, no [SEP] behind
    tok.save(str(d / "tokenizer.json"))


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "tokenizer.json").write_text('{"version": "1.0", "model": '),
     "tok/tokenizer.json: not a valid tokenizer"),
    (lambda d: (d / "tokenizer.json").write_text(""), "tok/tokenizer.json: not a valid tokenizer"),
    (lambda d: (d / "vocab.txt").write_bytes("[PAD]\n[UNK]\n[CLS]\n[SEP]\ncaf\xe9\n".encode("latin-1")),
     r"tok/vocab.txt: not UTF-8 text \(invalid continuation byte at byte 27\); save it as UTF-8"),
    (no_cls_sep, r"tok/tokenizer.json: the tokenizer does not add \[CLS\] ... \[SEP\] \(it gives \[5\] for 'a'\)"),
    (lambda d: (d / "config.json").write_text(json.dumps(dict(TINY_VOCAB_10))),
     "tok/vocab.txt: the tokenizer gives ids up to 12 but the model's vocab_size is 10; it belongs to another model"),
])
def test_bad_tokenizers_are_one_line_errors(tiny_config, tmp_path, damage, message):
    d = tokenizer_folder(tmp_path, tiny_config)
    assert load_tokenizer(d).encode("the man").ids == [2, 7, 8, 3]
    damage(d)
    with pytest.raises(LoadError, match=message) as e:  # a real check, not an assert that python -O removes
        load_tokenizer(d)
    assert "\n" not in str(e.value)


TINY_VOCAB_10 = dict(vocab_size=10, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                     max_position_embeddings=64)


def test_tokenizer_in_a_checkpoint(tiny_config, tmp_path):
    m = tiny_model(tiny_config)
    save_model(tmp_path / "garbage.safetensors", m, {"tokenizer": "garbage"})
    with pytest.raises(LoadError, match=r"garbage.safetensors \(metadata 'tokenizer'\): not a valid tokenizer \("):
        load_tokenizer(tmp_path / "garbage.safetensors")
    tok = wordpiece.from_vocab(write_vocab(tmp_path / "vocab.txt"))
    m.config.vocab_size = 12  # one row short of the tokenizer's 13 ids (the model's tensors do not matter here)
    save_model(tmp_path / "short.safetensors", m, {"tokenizer": tok.to_str()})
    with pytest.raises(LoadError, match="gives ids up to 12 but the model's vocab_size is 12"):
        load_tokenizer(tmp_path / "short.safetensors")


def test_tokenizer_truncates_at_the_position_table(tiny_config, tmp_path):
    d = tokenizer_folder(tmp_path, tiny_config, max_position_embeddings=16)
    assert len(load_tokenizer(d, max_len=128).encode("a " * 100).ids) == 16  # no position embedding past 16
    assert len(load_tokenizer(d, max_len=8).encode("a " * 100).ids) == 8
    (d / "config.json").unlink()  # a tokenizer alone: nothing to check it against
    assert len(load_tokenizer(d, max_len=128).encode("a " * 100).ids) == 102


def test_encode_order_poolings_and_edge_cases(tiny_config, tmp_path):
    m = tiny_model(tiny_config)
    tok = wordpiece.from_vocab(write_vocab(tmp_path / "vocab.txt"))
    sents = ["the man", "", "a b a b a b the man playing", "man .", "the the the the", "b"]
    for pooling in bert.POOLINGS:
        for layer in (0, 1, -1):
            got = encode(m, tok, sents, pooling=pooling, layer=layer, batch_size=2)
            assert got.dtype == np.float32 and got.shape == (6, 32)
            for i, s in enumerate(sents):  # one sentence at a time, no padding: the unbatched oracle
                ids, mask = batch_tensors([tok.encode(s)])
                with torch.no_grad():
                    hs = m.eval()(ids)
                ref = {"cls": hs[layer][0, 0], "mean": hs[layer][0].mean(0), "max": hs[layer][0].max(0).values,
                       "first-last": (hs[1][0].mean(0) + hs[-1][0].mean(0)) / 2,
                       "last2": (hs[-2][0].mean(0) + hs[-1][0].mean(0)) / 2}[pooling]
                tol = rounding_atol(torch.cat(hs), tiny_config["intermediate_size"])  # batched: another order
                np.testing.assert_allclose(got[i], ref.numpy(), atol=tol, rtol=0, err_msg=f"{pooling} {layer} {s!r}")
    assert encode(m, tok, []).shape == (0, 32)
    with pytest.raises(ValueError, match="^unknown pooling 'avg': use one of cls, mean, max, first-last, last2$"):
        encode(m, tok, sents, pooling="avg")


def test_pool_masks_padding():
    hs = [torch.tensor([[[1.0, 5.0], [3.0, -1.0], [100.0, 100.0]]])]
    mask = torch.tensor([[1, 1, 0]])
    assert pool(hs, mask, "mean").tolist() == [[2.0, 2.0]]
    assert pool(hs, mask, "max").tolist() == [[3.0, 5.0]]
    assert pool(hs, mask, "cls").tolist() == [[1.0, 5.0]]




def scaled_model(cfg, seed):
    """A random BERT whose layers matter: each weight matrix N(0, 1 / fan_in) (variance-preserving), so every layer
    adds to the residual stream as much as it carries, as in a trained model (BERT's own init, N(0, 0.02), leaves a
    random model's vectors nearly those of its embeddings, and any precision agrees on those)."""
    m = tiny_model(cfg, seed)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.Linear):
                mod.weight.normal_(std=mod.in_features ** -0.5)
                mod.bias.normal_(std=0.1)
            elif isinstance(mod, torch.nn.Embedding):
                mod.weight.normal_()
    return m.eval()


def cosines(x):
    x = x.astype(np.float64) / np.linalg.norm(x, axis=1, keepdims=True)
    return x @ x.T


def test_bf16_encoding_is_fp32_within_bf16_rounding_and_fp32_is_exact(tiny_config, tmp_path):
    """encode(precision="bf16") against fp32 on a random BERT (hidden 64, 2 layers, 24 sentences of 2-16 tokens).
    bf16 keeps 8 significant bits (unit roundoff u = 2^-8); with its products in bf16 a sentence vector moves by a
    few u relative, so the oracle is 4u: every pair's cosine within 4u = 1.6e-2 of fp32's, and each vector's cosine
    with its fp32 self at least 1 - (4u)^2 / 2 = 1 - 1.2e-4. Measured on 4 seeds of a 4-layer version: pairs at most
    1.25u apart (all-MiniLM-L6-v2 on 120 STS-B dev sentences: 0.6u), 1 - cosine at most 4.8e-5 (MiniLM: 2.2e-5).
    The default stays fp32 to the bit: the same numbers as the model's forward under no_grad with no autocast."""
    cfg = dict(tiny_config, hidden_size=64, intermediate_size=256)
    tok = wordpiece.from_vocab(write_vocab(tmp_path / "vocab.txt"))
    rng = np.random.default_rng(0)
    words = ["a", "b", "the", "man", "mans", ".", "play", "playing"]
    sents = [" ".join(rng.choice(words, size=rng.integers(1, 15))) for _ in range(24)]
    u = 2.0 ** -8
    for seed in (0, 1):
        m = scaled_model(cfg, seed)
        for pooling in ("cls", "mean"):
            fp32 = encode(m, tok, sents, pooling, batch_size=8)
            bf16 = encode(m, tok, sents, pooling, batch_size=8, precision="bf16")
            assert bf16.dtype == np.float32 and not np.array_equal(fp32, bf16)  # autocast was on
            assert np.abs(cosines(bf16) - cosines(fp32)).max() <= 4 * u, (seed, pooling)
            own = (bf16 * fp32).sum(1) / np.linalg.norm(bf16, axis=1) / np.linalg.norm(fp32, axis=1)
            assert (1 - own).max() <= (4 * u) ** 2 / 2, (seed, pooling)
    # the default: exactly the fp32 forward of the same batches (encode sorts by length; one batch of all here)
    encodings = tok.encode_batch(sents)
    order = sorted(range(len(sents)), key=lambda i: len(encodings[i].ids))
    ids, mask = batch_tensors([encodings[i] for i in order])
    with torch.no_grad():
        ref = pool(m(ids, mask), mask, "mean").numpy()
    got = encode(m, tok, sents, "mean", batch_size=len(sents))
    np.testing.assert_array_equal(got[order], ref)
    np.testing.assert_array_equal(got, encode(m, tok, sents, "mean", batch_size=len(sents), precision="fp32"))
    with pytest.raises(AssertionError, match="unknown precision"):
        encode(m, tok, sents, precision="fp16")


def test_a_checkpoint_not_where_python_runs_is_one_line_naming_the_folder(tiny_config, tmp_path, monkeypatch):
    """The README's example run from another folder (issue 53, 13): from_pretrained and load_tokenizer raise a
    LoadError of one line that names the folder a relative path was read from and says to give the checkpoint's own
    path, with the loader's frames not chained on; a script that does not catch it ends in that line."""
    monkeypatch.chdir(tmp_path)
    for load in (Bert.from_pretrained, load_tokenizer):
        with pytest.raises(LoadError) as e:
            load("quickstart.safetensors")
        msg = str(e.value)
        assert msg.startswith(f"quickstart.safetensors not found in the current folder {tmp_path}: ") and "\n" not in msg
        assert "give the checkpoint's own path" in msg and e.value.__suppress_context__
    with pytest.raises(LoadError, match=r"^/nowhere/sg.safetensors not found$"):  # absolute: nothing to add
        Bert.from_pretrained("/nowhere/sg.safetensors")
    r = subprocess.run([sys.executable, "-c", "import bert\nbert.Bert.from_pretrained('quickstart.safetensors')"],
                       cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and last.startswith("checkpoint.LoadError: quickstart.safetensors not found in the current")
    assert "checkpoint.py" not in r.stderr and "During handling" not in r.stderr, r.stderr


class CountingProducts(runtime.Bf16Products):
    """Bf16Products that counts the matrix products it widened (forward and backward)."""
    def __init__(self):
        super().__init__()
        self.caught = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.caught += self.catches(func, args)
        return super().__torch_dispatch__(func, types, args, kwargs)


def forward_backward(m, ids, mask, mode):
    """The mean-pooled last layer under bf16 autocast, and the gradient of its sum of squares (fp32)."""
    m.zero_grad()
    with mode:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = pool(m(ids, mask), mask, "mean")
        out.float().pow(2).sum().backward()
    return out.float().detach(), torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None])


def test_emulated_bf16_products_are_torchs_bf16_numbers_and_fp32_is_untouched(tiny_config):
    """Bf16Products (a CPU without a bf16 unit: the products widened to fp32, summed there, rounded to bf16) against
    torch's own bf16 kernels on this CPU, forward and backward of a random BERT (hidden 64, 2 layers) under autocast:
    both sum exact bf16 products in fp32, so they differ only by the order of those sums, then by one rounding to
    bf16 (a unit roundoff u = 2^-8) where that order tips it, and such a flip in layer 1 carries through LayerNorm
    and attention to the output. The oracle: every output within 4u relative of torch's, while bf16 itself is
    hundreds of u from fp32 (checked: the bound tells the two apart), and the gradient at a cosine > 1 - 1e-5 of
    torch's. Measured on 4 seeds: the AVX2 EPYC (torch's bf16 sums in fp32's order there) at most 0.0025u apart,
    95-100% of the outputs equal, 1 - cosine at most 2.5e-7; the Intel Xeon with AVX512-BF16 (oneDNN's blocked
    sums) at most 2.2u, 83-100% equal, 1 - cosine at most 5.4e-7. The mode caught the backward's products (two a
    forward product) as well as the forward's; fp32 under it is torch's to the bit."""
    cfg = dict(tiny_config, hidden_size=64, intermediate_size=256)
    m = scaled_model(cfg, 0).train(False)
    g = torch.Generator().manual_seed(1)
    ids, mask = torch.randint(5, 120, (6, 12), generator=g), torch.ones(6, 12, dtype=torch.long)
    mask[3:, 8:] = 0
    u = 2.0 ** -8
    want, want_grad = forward_backward(m, ids, mask, contextlib.nullcontext())
    mode, forward = CountingProducts(), CountingProducts()
    got, got_grad = forward_backward(m, ids, mask, mode)
    with forward, torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        m(ids, mask)
    assert forward.caught > 0 and mode.caught == 3 * forward.caught, (mode.caught, forward.caught)
    rel = ((got - want).abs() / want.abs().clamp_min(1e-3)).max().item()
    assert rel <= 4 * u, rel
    with torch.no_grad():
        exact = pool(m(ids, mask), mask, "mean")
    assert ((want - exact).abs() / exact.abs().clamp_min(1e-3)).max().item() > 50 * u  # 4u separates bf16 from fp32
    cos = torch.nn.functional.cosine_similarity(got_grad.double(), want_grad.double(), dim=0).item()
    assert cos > 1 - 1e-5, cos
    with torch.no_grad(), runtime.Bf16Products():
        fp32 = pool(m(ids, mask), mask, "mean")
    with torch.no_grad():
        assert torch.equal(fp32, pool(m(ids, mask), mask, "mean"))


def test_bf16_products_are_held_only_for_bf16_on_a_cpu_without_a_bf16_unit(monkeypatch):
    import cli
    monkeypatch.setattr(cli, "bf16_unit", lambda: False)
    assert isinstance(runtime.bf16_products("bf16", "cpu"), runtime.Bf16Products)
    assert not isinstance(runtime.bf16_products("fp32", "cpu"), runtime.Bf16Products)
    assert not isinstance(runtime.bf16_products("bf16", "cuda"), runtime.Bf16Products)
    monkeypatch.setattr(cli, "bf16_unit", lambda: True)
    assert not isinstance(runtime.bf16_products("bf16", "cpu"), runtime.Bf16Products)


def test_encode_pools_as_the_checkpoint_records_by_default(tmp_path):
    """encode without a pooling: the pooling a checkpoint's metadata records (what its method is evaluated with, as
    the README promises), 'cls' for a model folder or a checkpoint that records none; an explicit pooling wins; a
    pooling bert does not know (PromptBERT's, the lab's) is one clear error, never [CLS] vectors in its place."""
    from conftest import tiny_model_folder
    folder = tiny_model_folder(tmp_path / "tiny", words=["a", "man", "plays", "guitar", "."])
    base, tok = Bert.from_pretrained(folder), load_tokenizer(folder)
    sents = ["a man plays guitar .", "a man .", "guitar ."]
    cls_v, mean_v = encode(base, tok, sents, "cls"), encode(base, tok, sents, "mean")
    assert not np.allclose(cls_v, mean_v)
    assert np.array_equal(encode(base, tok, sents), cls_v)  # a folder records no pooling
    for pooling, want in [("mean", mean_v), ("cls", cls_v), (None, cls_v)]:
        path = tmp_path / f"{pooling}.safetensors"
        save_model(path, base, {"tokenizer": tok.to_str(), **({"pooling": pooling} if pooling else {})})
        model = Bert.from_pretrained(path)
        assert np.array_equal(encode(model, load_tokenizer(path), sents), want), pooling
    assert np.array_equal(encode(Bert.from_pretrained(tmp_path / "mean.safetensors"), tok, sents, "cls"), cls_v)
    save_model(tmp_path / "prompt.safetensors", base, {"pooling": "prompt", "template": 'It : "[X]" means [MASK] .'})
    with pytest.raises(ValueError, match="unknown pooling 'prompt'"):
        encode(Bert.from_pretrained(tmp_path / "prompt.safetensors"), tok, sents)
