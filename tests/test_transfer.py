"""Tests of the SentEval transfer tasks (eval_data.load_transfer, transfer.transfer_task and its batched trainer): the
batched trainer against a plain one-classifier-at-a-time loop (and SentEval's own MLP when its reference copy is
there), the folds against sklearn, every task path on separable and on pure-noise synthetic data, the real files'
counts, and the one-line errors."""
import copy
import json
import threading

import numpy as np
import pytest
import torch

import lab.benchmarks.transfer
from lab import benchmarks
import data
from lab import evaluate as lab_evaluate
from lab import eval_data, transfer
from data import DataError
from conftest import tiny_model_folder

SENTEVAL = benchmarks.transfer.senteval_dir()  # $SENTEVAL_DIR: a checkout of facebookresearch/SentEval


@pytest.fixture(autouse=True)
def one_thread():
    """These problems are a few thousand tiny steps: on a machine shared with other jobs, torch's second OpenMP thread
    turns each step into a wait for a busy core (minutes instead of seconds), and one thread loses nothing here."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

# -----------------------------------------------------------------------------
# the batched trainer


def plain_fit(X, y, train, dev, l2, nhid, C, seed=transfer.SEED):
    """One classifier the plain way, as SentEval's MLP.fit runs it: nn.Sequential, torch.optim.Adam, numpy reseeded
    (5% held out from its first permutation when dev is None), a check every EPOCH_SIZE epochs, the best kept, stop
    at the first failed check after TENACITY failed ones. -> (best dev accuracy, [W1.T, b1, W2.T, b2] in the
    layout of one member of transfer.fit: weights (in, out), biases (1, out))."""
    rng = np.random.RandomState(seed)
    torch.manual_seed(seed)
    d = X.shape[1]
    layers = [torch.nn.Linear(d, nhid), torch.nn.Dropout(0.0), torch.nn.Sigmoid(), torch.nn.Linear(nhid, C)] \
        if nhid else [torch.nn.Linear(d, C)]
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters(), weight_decay=l2)
    if dev is None:
        perm, k = rng.permutation(len(train)), int(0.05 * len(train))
        train, dev = train[perm[k:]], train[perm[:k]]
    best, best_model, failed, epoch = -1.0, None, 0, 0
    while epoch <= transfer.MAX_EPOCH:
        for _ in range(transfer.EPOCH_SIZE):
            perm = rng.permutation(len(train))
            for s in range(0, len(train), transfer.BATCH):
                rows = train[perm[s:s + transfer.BATCH]]
                loss = torch.nn.functional.cross_entropy(model(X[rows]), y[rows])
                opt.zero_grad()
                loss.backward()
                opt.step()
        epoch += transfer.EPOCH_SIZE
        with torch.no_grad():
            acc = (model(X[dev]).argmax(1) == y[dev]).double().mean().item()
        if acc > best:
            best, best_model = acc, copy.deepcopy(model)
        elif failed >= transfer.TENACITY:
            break
        else:
            failed += 1
    return best, [t.detach().T if t.dim() == 2 else t.detach()[None] for t in best_model.parameters()]


def toy_problem(n=260, d=6, C=3, noise=1.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g)
    y = (X @ torch.randn(d, C, generator=g) + noise * torch.randn(n, C, generator=g)).argmax(1)
    return X, y


# groups of different sizes (2 and 3 batches per epoch: one group skips the last step) and both kinds of dev set
TRAIN = [np.arange(0, 120), np.arange(40, 200), np.arange(0, 260, 2), np.arange(60, 260)]
DEV = [np.arange(200, 260), None, np.arange(1, 260, 2), None]
L2 = [[1e-5, 1.0], [1.0, 1e-3], [1e-3, 0.3], [1e-4, 1e-5]]  # strong ones: some members stop before the other


@pytest.mark.parametrize("nhid", [0, 8])
def test_batched_fit_equals_plain_loop(nhid, monkeypatch):
    monkeypatch.setattr(transfer, "MAX_EPOCH", 60)  # the comparison, not the full 200 epochs, is the point here
    X, y = toy_problem()
    shapes, threads, step = set(), set(), transfer.adam_step

    def recording(params, *a):
        shapes.add(params[0].shape[::2])
        threads.add(threading.current_thread().name)
        return step(params, *a)
    monkeypatch.setattr(transfer, "adam_step", recording)
    acc, params = transfer.fit(X, y, TRAIN, DEV, L2, nhid, 3)
    assert min(slots for _, slots in shapes) == 1, shapes  # a member that stopped left its slot; its group trained on
    assert threads == {"MainThread"}
    torch.set_num_threads(2)  # the parts side by side on two threads (one torch thread each)
    acc2, params2 = transfer.fit(X, y, TRAIN, DEV, L2, nhid, 3)
    assert torch.get_num_threads() == 2 and len(threads - {"MainThread"}) == 2, threads
    torch.set_num_threads(1)
    monkeypatch.setattr(transfer, "CACHE_BYTES", 1)  # one group at a time: the chunked path gives the same
    acc1, params1 = transfer.fit(X, y, TRAIN, DEV, L2, nhid, 3)
    for a, ps in [(acc2, params2), (acc1, params1)]:  # other parts: at this toy width (6) bmm's kernel depends on
        np.testing.assert_array_equal(acc, a)  # the batch size (last-bit differences); at 384 and 768 it does not
        for p, q in zip(params, ps):
            torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
    stops = set()
    for g in range(len(TRAIN)):
        for r in range(2):
            want, ps = plain_fit(X, y, TRAIN[g], DEV[g], L2[g][r], nhid, 3)
            assert acc[g, r] == want, (g, r)
            for p, q in zip(params, ps):
                torch.testing.assert_close(p[g, :, r], q, rtol=1e-5, atol=1e-6)
            stops.add(want)
    assert len(stops) > 1  # the members did not all end up alike


def test_threaded_fit_error_stops_every_part(monkeypatch):
    """An error in one part of a fit on two threads is raised, and the other parts stop at their next check instead
    of training on (an interrupted evaluation ends in seconds)."""
    X, y = toy_problem()
    calls, step = [], transfer.adam_step

    def failing(*a):
        calls.append(threading.current_thread().name)
        if len(calls) == 20:
            raise ValueError("a failing step")
        return step(*a)
    monkeypatch.setattr(transfer, "adam_step", failing)
    torch.set_num_threads(2)
    with pytest.raises(ValueError, match="a failing step"):
        transfer.fit(X, y, TRAIN, DEV, L2, 8, 3)
    assert torch.get_num_threads() == 2  # restored
    assert len(calls) <= 20 + transfer.EPOCH_SIZE * 3, len(calls)  # the other thread's round (3 batches an epoch)
    calls.clear()
    monkeypatch.setattr(transfer, "adam_step", lambda *a: calls.append(0) or step(*a))
    transfer.fit(X, y, TRAIN, DEV, L2, 8, 3)
    assert len(calls) > 100  # what the parts would have trained without the stop


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SentEval's own regex strings
def test_fit_equals_senteval_mlp():
    """The same run as SentEval's own classifier (its reference copy), with validation_data and validation_split."""
    pytest.importorskip("sklearn", reason="SentEval's package imports scikit-learn")
    if not (SENTEVAL / "senteval" / "tools" / "classifier.py").is_file():
        pytest.skip(f"no SentEval reference copy at {SENTEVAL} (set SENTEVAL_DIR: README.md#evaluate-and-export)")
    benchmarks.transfer.import_senteval()  # SentEval's code, adapted to a CPU as bench.py runs it
    from senteval.tools.classifier import MLP
    X, y = toy_problem(n=300, d=5, C=2, noise=0.7, seed=1)
    cfg = {"optim": "adam", "batch_size": 64, "tenacity": 5, "epoch_size": 4, "max_epoch": 40}
    for nhid, dev in [(0, None), (8, np.arange(200, 300))]:
        clf = MLP({**cfg, "nhid": nhid}, inputdim=5, nclasses=2, l2reg=1e-3, seed=1111)
        if dev is None:
            want = clf.fit(X.numpy(), y.numpy(), validation_split=0.05)
        else:
            want = clf.fit(X[:200].numpy(), y[:200].numpy(), validation_data=(X[dev].numpy(), y[dev].numpy()))
        old = transfer.MAX_EPOCH
        transfer.MAX_EPOCH = 40
        try:
            acc, params = transfer.fit(X, y, [np.arange(300 if dev is None else 200)], [dev], [[1e-3]], nhid, 2)
        finally:
            transfer.MAX_EPOCH = old
        assert acc[0, 0] == want
        for p, q in zip(params, clf.model.parameters()):
            torch.testing.assert_close(p[0, :, 0], q.detach().T if q.dim() == 2 else q.detach()[None],
                                       rtol=1e-4, atol=2e-5)

# -----------------------------------------------------------------------------
# folds


@pytest.mark.parametrize("y", [np.r_[np.ones(53), np.zeros(31)].astype(int),
                               np.random.RandomState(0).randint(0, 6, 137)])
def test_stratified_folds(y):
    folds = transfer.stratified_folds(y)
    assert len(folds) == transfer.KFOLD
    tests = np.concatenate([te for _, te in folds])
    assert sorted(tests.tolist()) == list(range(len(y)))  # every example is a test example exactly once
    for tr, te in folds:
        assert sorted(np.r_[tr, te].tolist()) == list(range(len(y)))
        for c in np.unique(y):  # stratified: each fold holds its share of each class, within one example
            assert abs((y[te] == c).sum() - (y == c).sum() / transfer.KFOLD) < 1
    skl = pytest.importorskip("sklearn.model_selection", reason="sklearn is the oracle of SentEval's exact folds")
    want = skl.StratifiedKFold(n_splits=10, shuffle=True, random_state=1111).split(np.zeros(len(y)), y)
    for (tr, te), (wtr, wte) in zip(folds, want):
        np.testing.assert_array_equal(tr, wtr)
        np.testing.assert_array_equal(te, wte)

# -----------------------------------------------------------------------------
# every task path, on synthetic vectors


def synthetic(name, separable, d=64, seed=0):
    """Splits shaped like eval_data.load_transfer's and a vectors() for them. Separable: each class has its own centre,
    a random +-1 pattern over all d dimensions, so that Adam's small steps (lr 1e-3) on every weight at once soon
    outweigh the random start (MRPC: a paraphrase pair is one vector twice, a non-paraphrase two unrelated ones);
    noise: labels drawn apart from the vectors."""
    rng = np.random.RandomState(seed)
    C = 6 if name == "TREC" else 2
    sizes = {"SST2": {"train": 240, "dev": 80, "test": 100}, "TREC": {"train": 240, "test": 120},
             "MRPC": {"train": 240, "test": 100}}.get(name, {"all": 480 if name == "MR" else 240})
    centres = 2 * rng.choice([-1.0, 1.0], (C, d))
    vec, splits = {}, {}
    for split, n in sizes.items():
        y = np.arange(n) % C  # balanced
        rng.shuffle(y)
        x = []
        for i, label in enumerate(y):
            s = f"{split} {i}"
            if name == "MRPC":
                vec[s + " a"] = rng.randn(d)
                vec[s + " b"] = vec[s + " a"] if label and separable else rng.randn(d)
                x.append((s + " a", s + " b"))
            else:
                vec[s] = rng.randn(d) + (centres[label] if separable else 0)
                x.append(s)
        splits[split] = (x, y.astype(np.int64))
    return splits, lambda xs: np.stack([vec[s] for s in xs]).astype(np.float32)


# the three protocols (k-fold: MR CR SUBJ MPQA; CV then test: TREC MRPC; dev split: SST2), each classifier on some
@pytest.mark.parametrize("name, nhid", [("MR", 0), ("SUBJ", 50), ("SST2", 0), ("TREC", 50), ("MRPC", 50)])
def test_task_paths_separable_and_noise(name, nhid):
    res = transfer.transfer_task(name, *synthetic(name, separable=True), nhid)
    assert res["acc"] >= 99 and res["devacc"] >= 99, res
    if name == "MRPC":
        assert res["f1"] >= 99
    res = transfer.transfer_task(name, *synthetic(name, separable=False, seed=1), nhid)
    chance = 100 / 6 if name == "TREC" else 50
    assert abs(res["acc"] - chance) < 20, res

# -----------------------------------------------------------------------------
# loaders


def test_real_transfer_counts(shared_data):
    """The counts of the data README, restated here as the oracle."""
    want = {"MR": {"all": {1: 5331, 0: 5331}}, "CR": {"all": {1: 2407, 0: 1368}},
            "SUBJ": {"all": {1: 5000, 0: 5000}}, "MPQA": {"all": {1: 3312, 0: 7294}},
            "SST2": {"train": 67349, "dev": 872, "test": 1821}, "TREC": {"train": 5452, "test": 500},
            "MRPC": {"train": 4076, "test": 1725}}
    for name, counts in want.items():
        splits = eval_data.load_transfer(name, shared_data)
        for split, count in counts.items():
            x, y = splits[split]
            assert len(x) == len(y)
            if isinstance(count, dict):
                assert {c: int((y == c).sum()) for c in count} == count, name
            else:
                assert len(y) == count, (name, split)
    trec = eval_data.load_transfer("TREC", shared_data)
    assert set(trec["train"][1].tolist()) == set(range(6))
    assert trec["test"][0][0] == "How far is it from Denver to Aspen ?"  # "NUM:dist How far ...": labels dropped
    (a, b), label = eval_data.load_transfer("MRPC", shared_data)["train"][0][0], eval_data.load_transfer(
        "MRPC", shared_data)["train"][1][0]
    assert a.startswith("Amrozi accused his brother") and b.startswith("Referring to him") and label == 1


def write(path, text, raw=b""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw + text.encode("latin-1" if "TREC" in str(path) else "utf-8"))


def test_loader_quirks_and_errors(tmp_path):
    root = tmp_path / "senteval"
    write(root / "TREC" / "train_5500.label", "DESC:manner How  did caf\xe9s start ?\nNUM:date When ?\n")
    write(root / "TREC" / "TREC_10.label", "LOC:city Where ?\n")
    (x, y), _ = eval_data.load_transfer("TREC", tmp_path).values()
    assert x == ["How did caf\xe9s start ?", "When ?"] and y.tolist() == [1, 5]  # Latin-1, whitespace collapsed
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    write(root / "MRPC" / "msr_paraphrase_train.txt", header + "1\t1\t2\tA b\tA  c\n0\t5\t6\tf\tg\n", raw=b"\xef\xbb\xbf")
    write(root / "MRPC" / "msr_paraphrase_test.txt", header + "0\t3\t4\td\te\n", raw=b"\xef\xbb\xbf")
    mrpc = eval_data.load_transfer("MRPC", tmp_path)
    assert mrpc["train"][0] == [("A b", "A c"), ("f", "g")] and mrpc["test"][1].tolist() == [0]

    write(root / "TREC" / "TREC_10.label", "LOC:city Where ?\nLOCATION:city Where ?\n")
    with pytest.raises(DataError, match=r"TREC_10.label:2: expected .*ABBR DESC ENTY HUM LOC NUM"):
        eval_data.load_transfer("TREC", tmp_path)
    write(root / "MRPC" / "msr_paraphrase_test.txt", header + "0\t3\t4\td\n")
    with pytest.raises(DataError, match=r"msr_paraphrase_test.txt:2: expected 5 tab-separated columns"):
        eval_data.load_transfer("MRPC", tmp_path)
    write(root / "SST" / "binary" / "sentiment-train", "good\t1\nbad\t2\n")
    with pytest.raises(DataError, match=r"sentiment-train:2: expected 'sentence<TAB>label' with label 0 or 1"):
        eval_data.load_transfer("SST2", tmp_path)
    with pytest.raises(DataError, match=r"custrev.pos not found"):
        eval_data.load_transfer("CR", tmp_path)
    write(root / "CR" / "custrev.pos", "")
    with pytest.raises(DataError, match=r"custrev.pos: 0 examples; the 10-fold protocol needs at least 10"):
        eval_data.load_transfer("CR", tmp_path)
    write(root / "SST" / "binary" / "sentiment-train", "good\t1\nfine\t1\n")  # one class: no 100.00 from it
    with pytest.raises(DataError, match=r"sentiment-train: every example has the label 1"):
        eval_data.load_transfer("SST2", tmp_path)

# -----------------------------------------------------------------------------
# the command line


@pytest.fixture
def tiny_model(tmp_path, tiny_config):
    """A random tiny BERT model folder whose vocabulary covers the synthetic sentences below."""
    words = ["where", "what", "good", "bad", "?"] + [f"w{i}" for i in range(40)]
    return tiny_model_folder(tmp_path / "tiny-bert", tiny_config, words)


def test_cli_json_and_errors(tmp_path, tiny_model, capsys):
    d = tmp_path / "data"
    (d / "senteval").mkdir(parents=True)
    (d / data.STSB_FILE).touch()  # resolve_data_dir looks for it; the transfer tasks do not read it
    rng = np.random.RandomState(0)
    lines = [f"{'good' if i % 2 else 'bad'} w{rng.randint(40)} w{rng.randint(40)}" for i in range(60)]
    write(d / "senteval" / "CR" / "custrev.pos", "\n".join(s for s in lines if s.startswith("good")) + "\n")
    write(d / "senteval" / "CR" / "custrev.neg", "\n".join(s for s in lines if s.startswith("bad")) + "\n")
    out = tmp_path / "r.json"
    lab_evaluate.main(["--model", str(tiny_model), "--data-dir", str(d), "--tasks", "CR", "--transfer-config", "simcse",
                   "--json", str(out)])
    res = json.loads(out.read_text())
    assert res["sts"] is None and res["layerwise"] is None
    res = res["transfer"]
    assert set(res["CR"]) == {"acc", "devacc"} and res["avg"] == res["CR"]["acc"] and res["config"] == "simcse"
    printed = capsys.readouterr().out
    assert "CR" in printed and "avg" in printed

    def one_line_error(*tasks):
        with pytest.raises(SystemExit) as e:
            lab_evaluate.main(["--model", str(tiny_model), "--data-dir", str(d), "--tasks", *tasks])
        err = capsys.readouterr().err.strip().split("\n")
        assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
        return err[0]

    write(d / "senteval" / "TREC" / "train_5500.label", "LOC:city where ?\nwhat ?\n")
    assert "train_5500.label:2: expected 'COARSE:fine question'" in one_line_error("TREC")
    assert "rt-polarity.pos not found" in one_line_error("transfer")  # MR, the first of the seven, is missing
