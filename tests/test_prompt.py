"""prompt.py and PromptBERT through train.py, evaluate.py and export.py, each against an oracle written out here: the
template's ids from its pieces tokenized apart, the denoising vector from a per-sentence loop, the loss from the
InfoNCE equation, the [MASK] vector of all-MiniLM-L6-v2 from transformers' BertModel."""
import dataclasses
import math
import random

import pytest
import torch
from scipy.stats import spearmanr

import bert
import checkpoint
import evaluate
from lab import augment
from lab import evaluate as lab_evaluate
from lab import export
from lab import methods
from lab import prompt
from lab import train  # the lab's trainer: every method
from conftest import rounding_atol, save_model, tiny_model_folder

WORDS = 'this sentence of " means : . ? a man dog is playing the guitar in park running'.split()
T1, T2 = prompt.TRAIN_TEMPLATES
SENTS = ["a man is playing the guitar .", "the dog", "", "a dog is running in the park in the park the man is",
         "a man", "the dog is playing ?", "guitar", "a man is running"]


@pytest.fixture
def tiny(tmp_path, tiny_config):
    return tiny_model_folder(tmp_path / "tiny", tiny_config, WORDS)


def plain(tok, text):
    """The test's own tokenization of one piece: no [CLS] / [SEP], no truncation (tok is built with room to spare)."""
    return tok.encode(text, add_special_tokens=False).ids


def special(tok):
    return [tok.token_to_id(t) for t in ("[CLS]", "[SEP]", "[MASK]")]

# -----------------------------------------------------------------------------
# the input: template ids, [MASK] positions, truncation


def test_template_ids_are_the_pieces_joined_and_only_the_sentence_is_cut(tiny):
    tok, wide = bert.load_tokenizer(tiny, max_len=6), bert.load_tokenizer(tiny, max_len=64)
    cls, sep, mask = special(wide)
    t = prompt.Template(T1, tok, max_positions=64)
    rows = [e.ids for e in t.encode_batch(SENTS)]
    for s, row in zip(SENTS, rows):
        sent = plain(wide, s)[:6]  # the sentence cut to the tokenizer's max length, the template whole
        assert row == [cls, *plain(wide, 'This sentence of "'), *sent, *plain(wide, '" means'), mask,
                       *plain(wide, "."), sep]
    ids, att = bert.batch_tensors(t.encode_batch(SENTS))
    pos = t.mask_positions(att)
    for i, s in enumerate(SENTS):
        assert pos[i] == 5 + min(len(plain(wide, s)), 6) + 2 and ids[i, pos[i]] == mask  # [CLS] 4 words, sentence, " means
    assert max(len(plain(wide, s)) for s in SENTS) > 6  # the cut was exercised

    before = prompt.Template("[MASK] : [X] .", tok, max_positions=64)  # [MASK] ahead of the sentence
    ids, att = bert.batch_tensors(before.encode_batch(SENTS))
    assert [e.ids for e in before.encode_batch(SENTS[:1])] == [[cls, mask, *plain(wide, ":"), *plain(wide, SENTS[0])[:6],
                                                               *plain(wide, "."), sep]]
    assert before.mask_positions(att).tolist() == [1] * len(SENTS)

    short = prompt.Template(T1, wide, max_positions=12)  # 10 template tokens: 2 left for the sentence
    assert short.max_len == 2 and all(len(e.ids) <= 12 for e in short.encode_batch(SENTS))
    with pytest.raises(checkpoint.LoadError, match="does not fit the model's 10 positions"):
        prompt.Template(T1, wide, max_positions=10)


def test_evaluation_adds_the_period_the_code_adds():
    assert [prompt.end_with_period(s) for s in ["a man", "a man .", "why?", 'he said "no"', "it's'", "", "x "]] == \
        ["a man.", "a man .", "why?", 'he said "no"', "it's'", "", "x."]

# -----------------------------------------------------------------------------
# template denoising


def test_denoising_is_the_template_alone_at_shifted_positions(tiny):
    tok = bert.load_tokenizer(tiny, max_len=32)
    cls, sep, mask = special(tok)
    torch.manual_seed(0)
    model = bert.Bert.from_pretrained(tiny).double()  # eval mode: no dropout, so the loop sees the same network
    t = prompt.Template(T2, tok, model.config.max_position_embeddings)
    sents = SENTS + SENTS[:3]  # repeated lengths: one bias per distinct length
    ids, att = bert.batch_tensors(t.encode_batch(sents))
    ours = t.denoised(model, ids, att)

    head, tail = [cls, *plain(tok, 'This sentence : "')], [*plain(tok, '" means'), mask, *plain(tok, "."), sep]
    want = []
    for s in sents:  # one sentence at a time: its [MASK] vector, less the template's alone at its length n
        row, n = head + plain(tok, s) + tail, len(plain(tok, s))
        h = model(torch.tensor([row]))[-1][0, row.index(mask)]
        alone, positions = head + tail, list(range(len(head))) + [len(head) + n + j for j in range(len(tail))]
        h0 = augment.forward(model, torch.tensor([alone]), position_ids=torch.tensor([positions]))[-1][0, alone.index(mask)]
        want.append(h - h0)
    want = torch.stack(want)
    torch.testing.assert_close(ours, want, atol=1e-10, rtol=0)
    assert ours[SENTS.index("")].abs().max() < 1e-10  # "": the template less itself

    # with gradient through both forwards, as the code's default: the same weight gradients as the loop's
    w = torch.randn_like(ours)
    grads = [torch.autograd.grad((x * w).sum(), list(model.parameters()), allow_unused=True) for x in (ours, want)]
    for a, b in zip(*grads):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-10, rtol=0)

# -----------------------------------------------------------------------------
# one training step


def test_one_promptbert_step_is_infonce_over_the_two_denoised_templates(tiny, tmp_path, monkeypatch):
    cfg = methods.resolve_config(train.get_args(["--loss", "promptbert", "--model", str(tiny), "--batch-size", "4",
                                               "--dropout", "off", "--lr", "1e-3", "--max-steps", "10", "--device",
                                               "cpu", "--out", str(tmp_path / "p.safetensors")]))
    assert (cfg.tau, cfg.lr, cfg.max_len, cfg.template, cfg.template2, cfg.eval_pooling) == (0.05, 1e-3, 32, T1, T2,
                                                                                              "prompt")
    model, tok = bert.Bert.from_pretrained(tiny), bert.load_tokenizer(tiny, max_len=cfg.max_len)
    run = train.build_run(cfg, model, tok, SENTS, None, torch.device("cpu"))
    # sentences training can see (data.training_sentences skips blank lines): the input of "" is the template alone,
    # its denoised vector 0 up to rounding and so its side (the head's bias is 0), a cosine 0/0 in the equation
    batch = [s for s in SENTS if s][:4]
    x1, x2 = train.inputs(run, batch, None)
    t1, t2 = (prompt.Template(t, tok, 64) for t in (T1, T2))
    assert x1[0].tolist() == bert.batch_tensors(t1.encode_batch(batch))[0].tolist()  # side 1: template 1
    assert x2[0].tolist() == bert.batch_tensors(t2.encode_batch(batch))[0].tolist()  # side 2: template 2
    with torch.no_grad():  # what the sides must be: the MLP head over each template's denoised [MASK] vector
        want1, want2 = (run.head(t.denoised(run.bert_T, *x)) for t, x in ((t1, x1), (t2, x2)))
    before = {k: v.clone() for k, v in run.bert_T.state_dict().items()}

    seen, real = [], run.method.sides
    run.method = dataclasses.replace(run.method, sides=lambda *a: seen.append(real(*a)) or seen[-1])
    loss, _, _, lr = train.train_step(run, 1, x1, x2)
    z1, z2 = (z.detach().double() for z in seen[0])
    K = run.bert_T.config.intermediate_size  # fp32, other batching: equal up to summation order (conftest)
    torch.testing.assert_close(z1, want1.double(), atol=rounding_atol(want1, K), rtol=0)
    torch.testing.assert_close(z2, want2.double(), atol=rounding_atol(want2, K), rtol=0)

    b, terms = len(batch), []
    for i in range(b):  # -log exp(cos(z1_i, z2_i) / tau) / sum_j exp(cos(z1_i, z2_j) / tau)
        logits = [float(z1[i] @ z2[j] / (z1[i].norm() * z2[j].norm())) / cfg.tau for j in range(b)]
        terms.append(-logits[i] + math.log(sum(math.exp(x) for x in logits)))
    assert loss.item() == pytest.approx(sum(terms) / b, abs=1e-5)
    assert lr == cfg.lr
    after = run.bert_T.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("encoder.")), "no weight moved"

# -----------------------------------------------------------------------------
# the command lines: python -m lab.evaluate --pooling prompt, a PromptBERT checkpoint, refusals


@pytest.fixture
def world(tiny, tmp_path):
    """A data folder with a small STS-B dev / test, a file of training sentences and a pairs file."""
    rng = random.Random(0)

    def sentence():
        return " ".join(rng.choice(WORDS[8:]) for _ in range(rng.randint(1, 7)))

    sts = tmp_path / "data" / "senteval" / "STS" / "STSBenchmark"
    sts.mkdir(parents=True)
    for split in ("dev", "test"):
        (sts / f"sts-{split}.csv").write_text("".join(
            f"main-captions\tMSRvid\t2012test\t{i:04d}\t{rng.uniform(0, 5):.3f}\t{sentence()}\t{sentence()}\n"
            for i in range(20)))
    (tmp_path / "sents.txt").write_text("".join(sentence() + "\n" for _ in range(16)))
    pairs = [(sentence(), sentence(), rng.uniform(0, 5)) for _ in range(12)]
    (tmp_path / "pairs.tsv").write_text("".join(f"{a}\t{b}\t{y}\n" for a, b, y in pairs))
    return dict(model=tiny, data=tmp_path / "data", sents=tmp_path / "sents.txt", pairs=tmp_path / "pairs.tsv",
                rows=pairs, out=tmp_path / "p.safetensors")


def oracle_vectors(model, tok, before, after_mask, sentences):
    """Evaluation's [MASK] vectors, one sentence at a time: [CLS] before sentence(.) " means [MASK] after [SEP]."""
    cls, sep, mask = special(tok)
    out = []
    for s in sentences:
        s = s if s.endswith((".", "?", '"', "'")) else s + "."
        row = [cls, *plain(tok, before), *plain(tok, s), *plain(tok, '" means'), mask, *plain(tok, after_mask), sep]
        out.append(model(torch.tensor([row]))[-1][0, row.index(mask)])
    return torch.stack(out).detach().numpy()


def test_evaluate_pooling_prompt_on_a_base_model(world):
    res = lab_evaluate.main(["--model", str(world["model"]), "--pooling", "prompt", "--pairs", str(world["pairs"]),
                             "--data-dir", str(world["data"]), "--device", "cpu"])
    assert res["template"] == prompt.UNTRAINED_TEMPLATE and res["pooling"] == "prompt"
    model, tok = bert.Bert.from_pretrained(world["model"]), bert.load_tokenizer(world["model"])
    a = oracle_vectors(model, tok, 'This sentence : "', ".", [r[0] for r in world["rows"]])
    b = oracle_vectors(model, tok, 'This sentence : "', ".", [r[1] for r in world["rows"]])
    want = 100 * spearmanr(evaluate.cosine(a, b), [r[2] for r in world["rows"]]).statistic
    assert res["sts"]["pairs.tsv"]["all"] == pytest.approx(want, abs=1e-6)


def test_a_promptbert_checkpoint_records_its_template_and_evaluate_reuses_it(world, monkeypatch, capsys):
    template = 'a sentence of "[X]" means [MASK] ?'
    train.main(["--model", str(world["model"]), "--data", str(world["sents"]), "--data-dir", str(world["data"]),
                "--out", str(world["out"]), "--loss", "promptbert", "--template", template, "--batch-size", "4",
                "--max-steps", "2", "--eval-every", "1", "--lr", "1e-3", "--device", "cpu"])
    meta = checkpoint.read_metadata(world["out"])
    assert (meta["method"], meta["pooling"], meta["template"]) == ("promptbert", "prompt", template)
    model, tok = bert.Bert.from_pretrained(world["out"]), bert.load_tokenizer(world["out"], max_len=32)
    dev = evaluate.stsb_spearman(lab_evaluate.sentence_vectors(model, tok, "prompt", template=template), world["data"])
    assert meta["best"]["dev"] == pytest.approx(dev, abs=1e-9)  # the dev score: the template, no denoising

    seen, real = {}, lab_evaluate.sentence_vectors
    monkeypatch.setattr(lab_evaluate, "sentence_vectors", lambda *a, **k: seen.update(k, v=real(*a, **k)) or seen["v"])
    res = lab_evaluate.main(["--ckpt", str(world["out"]), "--pairs", str(world["pairs"]), "--data-dir", str(world["data"]),
                             "--device", "cpu"])
    assert res["pooling"] == "prompt" and res["template"] == seen["template"] == template
    sents = [r[0] for r in world["rows"]]
    want = torch.from_numpy(oracle_vectors(model, tok, 'a sentence of "', "?", sents))
    torch.testing.assert_close(torch.from_numpy(seen["v"](sents)), want, rtol=0,
                               atol=rounding_atol(want, model.config.intermediate_size))

    capsys.readouterr()
    with pytest.raises(SystemExit) as e:  # export: one line, nothing written
        export.main([str(world["out"]), str(world["out"].parent / "st")])
    err = capsys.readouterr().err.strip().split("\n")
    assert e.value.code == 2 and len(err) == 1 and "sentence-transformers cannot express it" in err[0], err
    assert not (world["out"].parent / "st").exists()


@pytest.mark.parametrize("script, flags, words", [
    ("train", ["--loss", "promptbert", "--template", "this [X] means ."], ["--template", "no [MASK]"]),
    ("train", ["--loss", "promptbert", "--template2", "[MASK] [MASK]"], ["--template2", "no [X] and 2 [MASK]"]),
    ("train", ["--loss", "simcse", "--template", T1], ["--template means nothing for --loss simcse"]),
    ("train", ["--loss", "promptbert", "--aug1", "shuffle"], ["--aug1 means nothing for --loss promptbert"]),
    ("evaluate", ["--pooling", "prompt", "--template", "[X] means"], ["--template", "no [MASK]"]),
    ("evaluate", ["--template", T1], ["--template is the input of --pooling prompt"]),
])
def test_bad_templates_are_one_line(world, capsys, script, flags, words):
    common = {"train": ["--model", str(world["model"]), "--data", str(world["sents"]), "--data-dir",
                        str(world["data"]), "--out", str(world["out"]), "--device", "cpu"],
              "evaluate": ["--model", str(world["model"]), "--pairs", str(world["pairs"]), "--data-dir",
                           str(world["data"]), "--device", "cpu"]}[script]
    with pytest.raises(SystemExit) as e:
        {"train": train.main, "evaluate": lab_evaluate.main}[script]([*common, *flags])
    err = capsys.readouterr().err.strip().split("\n")
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert all(w in err[0] for w in words), err[0]


def test_export_refuses_a_template_checkpoint(tiny, tmp_path):
    model, tok = bert.Bert.from_pretrained(tiny), bert.load_tokenizer(tiny)
    save_model(tmp_path / "p.safetensors", model, {"tokenizer": tok.to_str(), "pooling": "prompt", "template": T1})
    with pytest.raises(checkpoint.LoadError, match="sentence-transformers cannot express it"):
        export.export(tmp_path / "p.safetensors", tmp_path / "st")

# -----------------------------------------------------------------------------
# the real model


@pytest.mark.slow
def test_minilm_mask_vector_equals_transformers(minilm_path):
    transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")
    model, tok = bert.Bert.from_pretrained(minilm_path), bert.load_tokenizer(minilm_path)
    t = prompt.Template(T1, tok, model.config.max_position_embeddings)
    sents = ["A man is playing a guitar.", "Two dogs run", 'He said "no" [MASK] twice, then left the park.']
    hf_tok = transformers.AutoTokenizer.from_pretrained(minilm_path)
    rows = [e.ids for e in t.encode_batch(sents)]
    for s, row in zip(sents[:2], rows):  # the whole filled-in template through HF's tokenizer: the same ids
        assert row == hf_tok(T1.replace("[X]", s))["input_ids"]
    mask_id = hf_tok.mask_token_id
    assert rows[2].count(mask_id) == 2  # the sentence's own "[MASK]" is a mask token too: ours is the template's
    ids, att = bert.batch_tensors(t.encode_batch(sents))
    with torch.no_grad():
        ours = t.vector(model(ids, att), att)
        hf = transformers.BertModel.from_pretrained(minilm_path).eval()
        for i, row in enumerate(rows):
            at = len(row) - 3  # [MASK] . [SEP] end every input of this template
            assert row[at] == mask_id
            ref = hf(input_ids=torch.tensor([row])).last_hidden_state[0, at]
            torch.testing.assert_close(ours[i], ref, atol=rounding_atol(ref, model.config.intermediate_size), rtol=0)
