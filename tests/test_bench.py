"""bench.py and benchmarks/: the references compute what they stand for (the step built from transformers with the
official loss and regulariser gives the same losses as train.py's step, on a tiny random BERT); a section on missing
or small data says what is missing in one line, before its work; the header names the machine and warns when it is
busy. No timing here."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import cli
from lab import bench
import lab.benchmarks.common
import lab.benchmarks.compile
import lab.benchmarks.epoch
import lab.benchmarks.gpu
import lab.benchmarks.precision
import lab.benchmarks.pretrain
import lab.benchmarks.step
import lab.benchmarks.transfer
from lab import benchmarks
from conftest import ROOT, tiny_model_folder


@pytest.fixture
def tiny_folder(tiny_config, tmp_path):
    """A tiny model folder: config.json, model.safetensors and a vocab.txt that covers bench's synthetic words."""
    return str(tiny_model_folder(tmp_path, tiny_config, [".", *benchmarks.common.WORDS]))


def test_reference_step_matches_ours(tiny_folder):
    pytest.importorskip("transformers", reason="the reference step is built from transformers.BertModel")
    # a large lam and lr, so that the regulariser's gradient and the AdamW updates move the later losses
    kw = dict(path=tiny_folder, batch_size=4, proj_size=16, dropout=False, lam=1.0, lr=1e-3)
    runs = {impl: benchmarks.step.make_step_run(impl, **kw) for impl in benchmarks.step.STEP_IMPLS}
    got = {impl: [[x.item() for x in run()] for _ in range(4)] for impl, run in runs.items()}
    ours, ref = got["sgbert"], got["reference"]
    assert ours[0][1] == ref[0][1] == 0.0  # BERT_T starts as a copy of BERT_F
    assert all(r > 0 for _, r in ours[1:])  # after that L^reg is not zero, so its gradient takes part
    assert len({round(loss, 3) for loss, _ in ours}) == 4  # the weights move between steps
    for step, (a, b) in enumerate(zip(ours, ref)):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-9), f"step {step}: (loss, lam * L^reg) ours {a} vs reference {b}"


def test_step_flops_and_bf16_step(tiny_folder):
    """The step's counted work is positive and ours skips the padding (no more work than the reference); the bf16
    autocast step (train.py --precision bf16) computes nearly the fp32 numbers."""
    pytest.importorskip("transformers", reason="the reference step is built from transformers.BertModel")
    kw = dict(path=tiny_folder, batch_size=4, proj_size=16, dropout=False)
    ours, ref = (benchmarks.step.step_flops(benchmarks.step.make_step_run(impl, **kw))
                 for impl in benchmarks.step.STEP_IMPLS)
    assert 0 < ours <= ref
    fp32, bf16 = (benchmarks.step.make_step_run("sgbert", precision=p, **kw)()[0].item() for p in ("fp32", "bf16"))
    assert fp32 != bf16 and abs(fp32 - bf16) <= 2e-2 * max(1.0, abs(fp32))
    assert benchmarks.step.gemm_rate(torch.device("cpu"), "fp32", n=64, repeats=1) > 0
    rates = benchmarks.precision.gemm_rates(torch.device("cpu"), repeats=1, shapes=((32, 16, 8),))
    assert list(rates) == [(32, 16, 8)] and list(rates[(32, 16, 8)]) == ["fp32", "bf16", "fp16"]
    assert all(v > 0 for v in rates[(32, 16, 8)].values())


def test_precision_section_names_the_cpu_kind_and_times_both_precisions(tiny_folder, monkeypatch, capsys):
    """bench.py precision (issue 52): the CPU's kind printed and recorded first (here one said to have no bf16 unit:
    its bf16 products emulated in fp32, as train.py and bert.encode run them there), then the step and the encoding
    in fp32 and bf16 side by side, and how far bf16 moved the cosines (bert.encode's own oracle is
    tests/test_bert.py's). No timing is checked."""
    pytest.importorskip("transformers", reason="the reference step is built from transformers.BertModel")
    kind = {"model": "AMD EPYC 7B12", "capability": "AVX2", "bf16_unit": False}
    monkeypatch.setattr(benchmarks.precision.cpu, "cpu_kind", lambda: kind)
    monkeypatch.setattr(cli, "bf16_unit", lambda: False)
    monkeypatch.setattr(benchmarks.common, "minilm_path", lambda: tiny_folder)
    monkeypatch.setattr(benchmarks.common, "missing", lambda *m: None)

    def no_data(*a, **k):
        raise benchmarks.common.data.DataError("no data folder")
    monkeypatch.setattr(benchmarks.common.data, "resolve_data_dir", no_data)
    held, real_products = [], benchmarks.precision.runtime.bf16_products
    monkeypatch.setattr(benchmarks.precision.runtime, "bf16_products", lambda *a: held.append(a) or real_products(*a))
    real_step = benchmarks.precision.make_step_run  # a small head and GEMM probe: seconds
    monkeypatch.setattr(benchmarks.precision, "make_step_run",
                        lambda *a, **kw: real_step(*a, **{**kw, "proj_size": 16}))
    results = {}
    benchmarks.precision.bench_precision(results, bench.argparse.Namespace(data_dir=None, device="cpu", repeats=2))
    row, out = results["precision"], capsys.readouterr().out
    assert out.splitlines()[0] == "  AMD EPYC 7B12 | capability AVX2 | bf16 matrix unit: no (bf16 products " \
                                  "emulated in fp32 here) | " \
                                  f"{torch.get_num_threads()} threads"
    assert row["cpu"] == kind and row["repeats"] == 2 and ("bf16", "cpu") in held and ("fp32", "cpu") in held
    assert set(row["ms"]) == {"fp32", "bf16", "reference fp32"} and all(v > 0 for v in row["ms"].values())
    enc = row["encoding"]
    assert enc["sentences"] == 512 and enc["source"].startswith("synthetic") and set(enc["per_s"]) == {"fp32", "bf16"}
    assert enc["speedup"] == pytest.approx(enc["per_s"]["bf16"] / enc["per_s"]["fp32"])
    assert 0 < enc["max_cos_diff"] < 2 ** -6  # bf16 moved them, by less than 4 bf16 units
    assert "sentences/s" in out and "bf16 speed-up" in out
    assert "torch.matmul" not in out and row["gemm_gflops"] == {}  # no unit: bf16 products would take minutes


def test_epoch_section_runs_train_py_and_extrapolates(tiny_config, tmp_path, shared_data, monkeypatch):
    """bench.py epoch on a tiny shape (the section's bert-base shape swapped out): train.py runs the capped steps with
    its dev evaluations, and the record holds the time per step and the extrapolated epoch."""
    vocab = tmp_path / "vocab"
    vocab.mkdir()
    (vocab / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + list(dict.fromkeys(benchmarks.common.WORDS))) + "\n")
    monkeypatch.setattr(benchmarks.epoch, "minilm_path", lambda: str(vocab))
    monkeypatch.setattr(benchmarks.epoch, "BASE_SHAPE", tiny_config)  # its vocab_size is replaced by the tokenizer's
    args = bench.argparse.Namespace(data_dir=str(shared_data), device="cpu", epoch_steps=2, epoch_precision=None)
    results = {}
    benchmarks.epoch.bench_epoch(results, args)
    row = results["epoch"]
    assert row["steps"] == 2 and row["evaluations"] == 2 and row["precision"] == "fp32"
    assert row["ms_per_step"] > 0  # one figure: the step is timed whole (the phases are the step section's)
    assert row["epoch_seconds_extrapolated"] > row["train_seconds"] > 0


def test_transfer_section_keeps_finished_tasks(tiny_folder, tmp_path, monkeypatch, capsys):
    """bench.py transfer writes --json after every task: a run stopped in its second task (SentEval takes hours on
    one thread here) keeps the first task's row, its times and accuracies on both sides. SentEval and the classifiers
    are stood in for; the vectors both sides get are one and the same lookup of the encoder's output."""
    (tmp_path / "senteval" / "senteval").mkdir(parents=True)
    (tmp_path / "senteval" / "senteval" / "engine.py").write_text("")
    words = list(dict.fromkeys(benchmarks.common.WORDS))
    sents = [" ".join(words[i:i + 3]) for i in range(8)]
    seen = {}

    def ours(name, splits, vectors, nhid):
        seen.setdefault("ours", []).append(torch.get_num_threads())
        seen["ours vectors"] = vectors(sents)
        return {"acc": 80.0, "devacc": 81.0}

    def senteval(name, data_dir, vectors, nhid):
        if name == "CR":
            raise KeyboardInterrupt  # stopped by hand in the second task
        seen["senteval"], seen["senteval vectors"] = torch.get_num_threads(), vectors(sents)
        return {"acc": 79.5, "devacc": 80.0, "ndev": 8, "ntest": 8}

    monkeypatch.setattr(benchmarks.transfer, "minilm_path", lambda: tiny_folder)
    monkeypatch.setattr(benchmarks.transfer, "missing", lambda *m: None)
    monkeypatch.setattr(benchmarks.transfer, "senteval_dir", lambda: tmp_path / "senteval")
    monkeypatch.setattr(benchmarks.transfer.data, "resolve_data_dir", lambda *a, **k: str(tmp_path))
    monkeypatch.setattr(benchmarks.transfer.eval_data, "load_transfer",
                        lambda name, d: {"all": (sents, np.array([0, 1] * 4))})
    monkeypatch.setattr(benchmarks.transfer.transfer, "transfer_task", ours)
    monkeypatch.setattr(benchmarks.transfer, "run_senteval", senteval)
    out = tmp_path / "bench.json"
    monkeypatch.setattr("sys.argv", ["bench.py", "--only", "transfer", "--transfer-tasks", "MR,CR", "--device", "cpu",
                                     "--json", str(out), "--threads", "2"])
    threads = torch.get_num_threads()
    try:
        with pytest.raises(KeyboardInterrupt):
            bench.main()
    finally:
        torch.set_num_threads(threads)
    row = json.loads(out.read_text())["transfer"]
    # ours on the run's threads and on one, SentEval on its own (--senteval-threads, default 1), each restored after
    assert row["threads"] == {"ours": 2, "senteval": 1, "ours_1thread": 1}
    assert sorted(seen["ours"]) == [1, 2] and seen["senteval"] == 1
    assert list(row["tasks"]) == ["MR"] and row["config"] == "paper" and row["pooling"] == "cls"
    mr = row["tasks"]["MR"]
    assert mr["diff"]["acc"] == pytest.approx(0.5) and mr["senteval"] == {"acc": 79.5, "devacc": 80.0}
    assert mr["ratio"] == pytest.approx(mr["seconds"]["senteval"] / mr["seconds"]["ours"])
    assert mr["ratio_1thread"] == pytest.approx(mr["seconds"]["senteval"] / mr["seconds"]["ours_1thread"])
    assert row["seconds"] == mr["seconds"] and row["avg_acc"] == {"ours": 80.0, "senteval": 79.5}
    assert np.array_equal(seen["ours vectors"], seen["senteval vectors"]) and seen["ours vectors"].shape == (8, 32)
    assert "MR    ours" in capsys.readouterr().out
    seen.clear()  # --transfer-skip-1thread: ours on the run's threads only
    monkeypatch.setattr("sys.argv", ["bench.py", "--only", "transfer", "--transfer-tasks", "MR,CR", "--device", "cpu",
                                     "--json", str(tmp_path / "skip.json"), "--threads", "2",
                                     "--transfer-skip-1thread"])
    try:
        with pytest.raises(KeyboardInterrupt):
            bench.main()
    finally:
        torch.set_num_threads(threads)
    row = json.loads((tmp_path / "skip.json").read_text())["transfer"]
    assert row["threads"] == {"ours": 2, "senteval": 1} and seen["ours"] == [2]
    assert "ratio_1thread" not in row["tasks"]["MR"] and "speedup_1thread" not in row


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answer")
def test_senteval_is_adapted_to_a_cpu_when_imported_and_its_checkout_is_left_alone(tmp_path, monkeypatch):
    """SentEval's code calls .cuda() everywhere and inspect.getargspec (gone in Python 3.11): bench.py imports an
    adapted copy, so that a plain checkout of facebookresearch/SentEval is the reference (the parity test in
    test_transfer.py runs it when SENTEVAL_DIR is set)."""
    pkg = tmp_path / "checkout" / "senteval"
    pkg.mkdir(parents=True)
    code = ("import inspect\nimport torch\nm = torch.nn.Linear(2, 2).cuda()\nx = torch.zeros(3).cuda()\n"
            "d = torch.device('cuda')\nis_float = isinstance(x, torch.cuda.FloatTensor)\n"
            "args = inspect.getargspec(torch.optim.Adam.__init__)[0]\n")
    (pkg / "__init__.py").write_text(code)
    monkeypatch.setattr(benchmarks.transfer, "senteval_dir", lambda: tmp_path / "checkout")
    monkeypatch.setattr(sys, "path", list(sys.path))
    held = sys.modules.pop("senteval", None)
    try:
        se = benchmarks.transfer.import_senteval()
        assert se.m.weight.device.type == se.x.device.type == se.d.type == "cpu" and se.is_float
        assert se.args[:3] == ["self", "params", "lr"] and benchmarks.transfer.import_senteval() is se
        assert (pkg / "__init__.py").read_text() == code and tmp_path / "checkout" not in map(Path, sys.path)
    finally:
        sys.modules.pop("senteval", None)
        if held:
            sys.modules["senteval"] = held


def test_gpu_checks_on_a_machine_without_cuda_say_so_in_one_line_and_exit_0(tmp_path):
    out = subprocess.run([sys.executable, "-m", "lab.bench", "--only", "gpu", "--json", str(tmp_path / "b.json")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "no CUDA device visible to torch" in out.stdout and json.loads((tmp_path / "b.json").read_text())["gpu"] is None


def test_no_module_imports_the_regulariser_by_name():
    """bench.py times the regulariser by patching sg_loss.add_weight_distance_grad_ at run time: a module holding its
    own reference to it (`from sg_loss import add_weight_distance_grad_`) would keep calling the unpatched function and
    the phase timings would silently miss it. Every call goes through the module: sg_loss.add_weight_distance_grad_."""
    import ast
    offenders = []
    for path in sorted([*ROOT.glob("*.py"), *ROOT.glob("benchmarks/*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "sg_loss":
                names = {a.name for a in node.names}
                if names & {"add_weight_distance_grad_", "*"}:
                    offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders, f"import sg_loss and call sg_loss.add_weight_distance_grad_ instead: {offenders}"


@pytest.mark.skipif(not any(__import__("shutil").which(c) for c in ("g++", "c++", "clang++")),
                    reason="torch.compile's CPU code needs a C++ compiler")
def test_compiled_layers_compute_what_eager_does(tiny_folder):
    """bench's compile section: layers compiled in place (dynamic shapes) keep the checkpoint's keys and give the
    eager encoder's hidden states, packed (padding) and unpacked (none), and the same gradients in a training step."""
    import bert
    torch.manual_seed(0)
    eager = bert.Bert.from_pretrained(tiny_folder).train(False)
    comp = benchmarks.compile.compile_layers(bert.Bert.from_pretrained(tiny_folder).train(False))
    assert list(comp.state_dict()) == list(eager.state_dict())
    for T, padded in ((9, True), (13, True), (7, False)):
        ids = torch.randint(5, eager.config.vocab_size, (3, T))
        mask = torch.ones(3, T, dtype=torch.long)
        if padded:
            mask[1, T // 2:] = mask[2, T - 2:] = 0
        ids = ids * mask
        for a, b in zip(eager(ids, mask), comp(ids, mask)):
            torch.testing.assert_close(b * mask[..., None], a * mask[..., None], rtol=1e-5, atol=1e-5)
    grads = []
    for m in (eager, comp):
        sum(h.pow(2).mean() for h in m(ids, mask)).backward()
        grads.append([p.grad for p in m.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_gpu_checks_keep_their_record_after_every_check(tmp_path, monkeypatch):
    """A GPU is lent for minutes: a run stopped at its time limit must leave the checks it finished on disk, and one
    failing check is recorded as its error while the others run. CUDA, the tests and the sections are stand-ins."""
    import types
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU 80GB")
    monkeypatch.setattr(benchmarks.gpu, "GPU_RECORDS", tmp_path)
    monkeypatch.setattr(benchmarks.gpu.subprocess, "run", lambda *a, **k: types.SimpleNamespace(returncode=0,
                                                                                        stdout="3 passed in 1.0s\n"))
    monkeypatch.setattr(benchmarks.gpu, "step_setting", lambda args: (None, None, "no MiniLM here"))

    def fill(name):
        def section(results, args):
            if name == "step":
                raise RuntimeError("CUDA error: out of memory")
            if name == "compile":
                raise KeyboardInterrupt  # the time limit
            results[name] = {"ran": name, "device": args.device}
        return section
    monkeypatch.setattr(benchmarks.gpu, "CHECKS", {n: fill(n) for n in bench.SECTION_NAMES})
    monkeypatch.setattr(benchmarks.gpu, "bench_epoch",
                        lambda results, args: results.update(epoch={"precision": args.epoch_precision}))
    with pytest.raises(KeyboardInterrupt):
        benchmarks.gpu.bench_gpu({}, types.SimpleNamespace(device="auto"))
    [record] = tmp_path.glob("Fake-GPU-80GB-*.json")
    got = json.loads(record.read_text())
    assert got["device"] == "Fake GPU 80GB" and got["test_cuda"] == {"exit": 0, "summary": "3 passed in 1.0s"}
    assert got["encoder"] == {"ran": "encoder", "device": "cuda"} and got["pretrain"]["ran"] == "pretrain"
    assert got["step"] == {"error": "RuntimeError: CUDA error: out of memory"}
    assert got["epoch_fp32"] == {"precision": "fp32"} and got["epoch_bf16"] == {"precision": "bf16"}
    assert "compile" not in got and got["seconds"] >= 0


def test_the_allocator_processes_run_pretrains_own_steps_and_agree(minilm_path, text_file, tmp_path, monkeypatch):
    """bench.py allocator: each fresh process (glibc's malloc, its tunables, jemalloc where installed) runs
    pretrain.py's own steps - their losses agree to the bit, and equal the per-step losses pretrain.py's run logs."""
    import checkpoint
    from lab import pretrain
    argv = ["--text", str(text_file), "--tokenizer", str(minilm_path), "--layers", "2", "--hidden", "32", "--heads", "2",
            "--batch-size", "8", "--dropout", "0.1", "--steps", "4", "--log-every", "1", "--threads", "1"]
    monkeypatch.setattr(checkpoint, "WEIGHTS", tmp_path / "weights")
    threads = torch.get_num_threads()
    try:
        record = pretrain.main(["--name", "tiny", *argv])  # the oracle: pretrain.py's own run, a loss per step
        monkeypatch.setattr(benchmarks.pretrain, "allocator_argv", lambda args: argv)
        results = {}
        benchmarks.pretrain.bench_allocator(results, bench.argparse.Namespace(repeats=1, alloc_steps=2, data_dir=None))
    finally:
        torch.set_num_threads(threads)
    got = results["allocator"]
    assert {"glibc", "glibc, no mmap, no trim"} <= set(got["rows"])
    assert got["loss_sum"] == pytest.approx(sum(loss for _, loss, _ in record["history"]), abs=4 * 1e-5)
    assert all(r["tokens_per_s"] > 0 and r["faults_per_step"] >= 0 for r in got["rows"].values())


# -----------------------------------------------------------------------------
# sections on missing or small data (issue 73, item 10): what is missing, in the one skip line, before any work


def sentences(kind, n):
    """n distinct short sentences, told apart by kind and a number."""
    return [f"the {kind} number {i} sits near a red wall" for i in range(n)]


def write(path, lines, gz=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(line + "\n" for line in lines)
    if gz:
        import gzip
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")


def stsb_folder(root, rows, test=True):
    """A data folder of `rows` STS-B rows in stsbenchmark.tsv.gz (2 sentences each: what the step draws from),
    senteval/ holding STS-B test's csv (test=True: 8 pairs) and nothing else."""
    a, b = sentences("train a", rows), sentences("train b", rows)
    write(root / "stsbenchmark.tsv.gz", ["split\tgenre\tdataset\tyear\tsid\tscore\tsentence1\tsentence2"] +
          [f"train\tmain-captions\tMSRvid\t2012\t{i}\t{i % 5}.0\t{a[i]}\t{b[i]}" for i in range(rows)], gz=True)
    (root / "senteval").mkdir(parents=True, exist_ok=True)
    if test:
        s1, s2 = sentences("test a", 8), sentences("test b", 8)
        write(root / "senteval" / "STS" / "STSBenchmark" / "sts-test.csv",
              [f"main-captions\tMSRvid\t2012test\t{i}\t{i % 5}.0\t{s1[i]}\t{s2[i]}" for i in range(8)])
    return root


def pretraining_folder(root, per_class, rest):
    """A data folder whose pretraining text (pretrain.corpus: STS-B train+dev and the 7 transfer tasks) has
    8 x per_class sentences of MR, CR, SUBJ, MPQA (per_class of each class; SentEval's folds need 10) and `rest`
    lines in each of SST2's, TREC's and MRPC's files and STS-B's rows: 8 per_class + 11 rest sentences, before the
    held-out 1 in 100. STS-B test and SICK-R test (the evaluation sentences, left out of the text) have 4 pairs."""
    stsb_folder(root, rest)
    sick = [f"{i}\t{a}\t{b}\t{1 + i % 4}.0\tNEUTRAL" for i, (a, b) in enumerate(zip(sentences("sick a", 4),
                                                                                   sentences("sick b", 4)))]
    write(root / "senteval" / "SICK" / "SICK_test_annotated.txt", ["pair_ID\tA\tB\tscore\tjudgment", *sick])
    for task, files in {"MR": ("rt-polarity.pos", "rt-polarity.neg"), "CR": ("custrev.pos", "custrev.neg"),
                        "SUBJ": ("subj.objective", "subj.subjective"), "MPQA": ("mpqa.pos", "mpqa.neg")}.items():
        for f in files:
            write(root / "senteval" / task / f, sentences(f, per_class))
    for split in ("train", "dev", "test"):
        write(root / "senteval" / "SST" / "binary" / f"sentiment-{split}",
              [f"{s}\t{i % 2}" for i, s in enumerate(sentences("sst " + split, rest))])
    for f in ("train_5500.label", "TREC_10.label"):
        write(root / "senteval" / "TREC" / f, [f"{('DESC', 'HUM')[i % 2]}:manner how is {s}"
                                               for i, s in enumerate(sentences(f, rest))])
    for split in ("train", "test"):
        a, b = sentences(f"mrpc {split} a", rest), sentences(f"mrpc {split} b", rest)
        write(root / "senteval" / "MRPC" / f"msr_paraphrase_{split}.txt",
              ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"] +
              [f"{i % 2}\t{i}\t{i}\t{a[i]}\t{b[i]}" for i in range(rest)])
    return root


def skipped_line(capsys, argv):
    """bench.py's main on argv, in this process: its one skip line, after checking that nothing reached stderr."""
    bench.main(argv)
    out, err = capsys.readouterr()
    assert err == "", err
    lines = [line for line in out.splitlines() if line.startswith("  skipped: ")]
    assert len(lines) == 1, out
    return lines[0]


@pytest.mark.parametrize("section", ["pretrain", "mlm-precision"])
def test_a_pretraining_section_without_a_data_folder_says_so_with_nothing_on_stderr(section, minilm_path, tmp_path,
                                                                                      capsys):
    pytest.importorskip("transformers", reason="the pretrain section's reference")
    line = skipped_line(capsys, ["--only", section, "--data-dir", str(tmp_path / "none"), "--device", "cpu"])
    assert "no data folder" in line and str(tmp_path / "none") in line  # where it looked


@pytest.mark.parametrize("section", ["pretrain", "mlm-precision"])
def test_a_pretraining_section_on_a_small_text_says_how_small_not_no_data_folder(section, minilm_path, tmp_path,
                                                                                   capsys):
    pytest.importorskip("transformers", reason="the pretrain section's reference")
    folder = pretraining_folder(tmp_path / "data", per_class=10, rest=3)  # 80 + 33 sentences < a batch of 128
    line = skipped_line(capsys, ["--only", section, "--data-dir", str(folder), "--device", "cpu"])
    assert "no data folder" not in line and "training sentences" in line and "128" in line, line


def test_mlm_precision_on_too_few_packed_segments_says_so_before_timing(minilm_path, tmp_path, capsys):
    """A text of enough sentences for a batch of 128 but too few full segments for a packed one: it used to time
    the sentence mode, then stop on a ZeroDivisionError."""
    folder = pretraining_folder(tmp_path / "data", per_class=20, rest=20)  # 380 short sentences, ~20 segments
    line = skipped_line(capsys, ["--only", "mlm-precision", "--data-dir", str(folder), "--device", "cpu",
                                 "--repeats", "1"])
    assert "full segments" in line and "128" in line, line


@pytest.mark.parametrize("section", ["step", "precision"])
def test_a_step_section_on_a_small_stsb_names_the_sentences_it_lacks(section, minilm_path, tmp_path, capsys):
    """80 STS-B sentences, where the step draws 256: a ValueError of random.sample once."""
    pytest.importorskip("transformers", reason="the reference step is built from transformers.BertModel")
    folder = stsb_folder(tmp_path / "data", rows=40)
    line = skipped_line(capsys, ["--only", section, "--data-dir", str(folder), "--device", "cpu", "--repeats", "1"])
    assert "holds 80 sentences" in line and "256" in line, line


@pytest.mark.parametrize("section, lacks", [("precision", "sts-test.csv"), ("wk", "sts-test.csv"),
                                            ("sts", "STS.input")])
def test_an_encoding_section_without_its_test_sentences_names_the_file_before_timing(section, lacks, minilm_path,
                                                                                     tmp_path, capsys):
    """A data folder without STS-B test's csv (or the other STS tasks'): precision timed its steps for a minute,
    then stopped on a DataError traceback; wk and sts loaded the model first."""
    pytest.importorskip("transformers", reason="the reference step is built from transformers.BertModel")
    folder = stsb_folder(tmp_path / "data", rows=200, test=section == "sts")
    line = skipped_line(capsys, ["--only", section, "--data-dir", str(folder), "--device", "cpu", "--repeats", "1"])
    assert lacks in line and "not found" in line, line


# -----------------------------------------------------------------------------
# the header and --help (issue 73, item 15)


def test_help_gives_train_pys_epoch_precision_default():
    """train.py and the README: fp32 on every device; bench.py --help said "bf16 on CUDA"."""
    out = subprocess.run([sys.executable, "-m", "lab.bench", "--help"], capture_output=True, text=True,
                         timeout=60).stdout
    text = " ".join(out.split())
    assert "--epoch-precision" in text and "bf16 on CUDA" not in text
    assert "epoch: train.py --precision (default: train.py's, fp32 on every device)" in text


@pytest.mark.parametrize("load, busy", [(1.5, True), (0.8, False), (None, False)])
def test_header_names_the_cpu_kind_and_warns_on_a_busy_machine(load, busy, tmp_path, monkeypatch, capsys):
    """The header line names the CPU kind (cpu.cpu_kind) and, before any timing, one line warns when the 1-minute
    load average is above half the CPUs (here 2); both are in the record's env."""
    kind = {"model": "AMD EPYC 7B12", "capability": "AVX2", "bf16_unit": False, "amx": False, "family_model": "23/49"}
    monkeypatch.setattr(benchmarks.common.cpu, "cpu_kind", lambda: kind)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)

    def getloadavg():
        if load is None:
            raise OSError("no load average here")
        return load, 0.5, 0.5
    monkeypatch.setattr(os, "getloadavg", getloadavg)
    monkeypatch.setitem(bench.SECTIONS, "loss", lambda results, args: print("  (the section)"))
    bench.main(["--only", "loss", "--json", str(tmp_path / "b.json")])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(" | cpus 2 | torch_threads " + str(torch.get_num_threads()) + " | cuda " +
                             str(torch.cuda.get_device_name() if torch.cuda.is_available() else None) +
                             " | cpu AMD EPYC 7B12 (AVX2, bf16 matrix unit no, AMX no, family/model 23/49)"), lines[0]
    warning = [line for line in lines if line.startswith("warning: ")]
    if busy:
        assert warning == [lines[1]] and "busy (load average 1.50 over the last minute, 2 CPUs)" in lines[1]
        assert lines[2] == "== loss"  # before the section's timings
    else:
        assert not warning and lines[1] == "== loss"
    env = json.loads((tmp_path / "b.json").read_text())["env"]
    assert env["cpu"] == kind and env["load_avg"] == load and env["cpus"] == 2


@pytest.mark.slow
def test_profile_writes_a_table_of_each_workload_and_precision(minilm_path, shared_data, tmp_path, capsys):
    """The profile section's tables: one file per workload and precision, each naming the machine and the unprofiled
    time in its first line, then torch.profiler's operators by self time (the products among them)."""
    out = tmp_path / "prof"
    bench.main(["--only", "profile", "--profile-workloads", "encode-minilm", "--profile-out", str(out), "--threads",
                "1", "--json", str(tmp_path / "b.json")])
    files = sorted(p.name for p in out.iterdir())
    assert files == ["encode-minilm-bf16.txt", "encode-minilm-fp32.txt"]
    for f in files:
        text = (out / f).read_text()
        assert "ms a call" in text.splitlines()[0] and "'amx'" in text.splitlines()[0]
        assert "Self CPU" in text and "aten::addmm" in text
    rec = json.loads((tmp_path / "b.json").read_text())["profile"]
    assert set(rec["ms"]) == {"encode-minilm-fp32", "encode-minilm-bf16"} and rec["threads"] == 1
    assert "bf16 speed-up x" in capsys.readouterr().out
