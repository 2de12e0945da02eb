"""
STS evaluation of sentence embeddings: cosine similarity of the two sentence vectors, Spearman x100 against gold.

It follows SentEval's STSEval (facebookresearch/SentEval, senteval/sts.py) as SimCSE runs it (princeton-nlp/SimCSE,
evaluation.py --mode test), which is also the paper's setting. STS12-16 are reported in three protocols, because
papers mix them up and the numbers differ by several points:
    all    one Spearman over the pairs of all subsets concatenated (SimCSE and the paper: the headline number)
    wmean  the subsets' Spearmans averaged, weighted by subset size (SentEval's "wmean")
    mean   the subsets' Spearmans averaged (SentEval's "mean")
STS-B and SICK-R are single test sets, so the three coincide. --layerwise gives the paper's Figure 1: STS-B test
Spearman of every layer 0..L under cls / mean / max pooling.

--tasks transfer runs SentEval's seven transfer tasks (the paper's Table 4: MR, CR, SUBJ, MPQA, SST2, TREC, MRPC):
a classifier trained on the frozen vectors, by SentEval's own protocol and seeds, with all the classifiers of a
task's cross-validation (the final refits included) trained as one batched problem. --json holds {"MR": {"acc", "devacc"}, ..., "MRPC": {"acc",
"devacc", "f1"}, "avg"}; with both kinds of task (--tasks all) it is {"sts": {...}, "transfer": {...}}.

    python evaluate.py --model bert-base-uncased --pooling cls
    python evaluate.py --ckpt sg.safetensors --json results.json
    python evaluate.py --ckpt sg.safetensors --tasks transfer --transfer-config simcse
"""
import os
import signal
import sys

if __name__ == "__main__":  # Ctrl-C while torch loads: one line and exit code 130, not a traceback from an import
    signal.signal(signal.SIGINT, lambda *_: (print("evaluate.py: interrupted", file=sys.stderr), os._exit(130)))

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr
from torch.optim.adam import adam  # the functional form of torch.optim.Adam

import bert
from data import TASKS, TRANSFER, TREC_CLASSES, DataError, load_stsb, load_task, load_transfer, resolve_data_dir

PROTOCOLS = ("all", "wmean", "mean")
SHORT = {"STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R"}  # MTEB's names, for the printed table
LAYERWISE_POOLINGS = ("cls", "mean", "max")
TASK_SETS = {"sts": TASKS, "transfer": TRANSFER, "all": TASKS + TRANSFER}  # --tasks shorthands


def cosine(a, b):
    """Row-wise cosine similarity of (n, H) and (n, H) -> (n,), in float64."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)


def spearman(x, y):
    """Spearman rank correlation x100 (scipy); NaN when either side is constant (no ranking to compare)."""
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(100 * spearmanr(x, y).statistic)


def spearman_table(subsets):
    """{subset: (similarities, gold)} -> {"all", "wmean", "mean"} Spearman x100 (see the file docstring)."""
    rhos = [spearman(sims, gold) for sims, gold in subsets.values()]
    sizes = [len(gold) for _, gold in subsets.values()]
    every = [np.concatenate(x) for x in zip(*subsets.values())]  # (sims, gold) of all subsets, concatenated
    return {"all": spearman(*every), "wmean": float(np.average(rhos, weights=sizes)), "mean": float(np.mean(rhos))}


def unique_sentences(pairs):
    """The distinct sentences of [(s1, s2, gold), ...] in first-seen order, and a map sentence -> row."""
    uniq = list(dict.fromkeys(s for s1, s2, _ in pairs for s in (*s1, *s2)))
    return uniq, {s: i for i, s in enumerate(uniq)}


def similarities(emb, index, s1, s2):
    """Cosine of each pair, from the embeddings (n, H) of the distinct sentences."""
    return cosine(emb[[index[s] for s in s1]], emb[[index[s] for s in s2]])


def evaluate_model(model, tokenizer, tasks, data_dir, pooling="cls", layer=-1, batch_size=64):
    """Spearman x100 of every task in every protocol, in the --json format (less "model"). Each task's sentences are
    encoded once, even when they repeat across pairs and subsets, in length-sorted batches (bert.encode)."""
    t0 = time.perf_counter()
    results, n_sent, t_enc = {}, 0, 0.0
    for name in tasks:
        data = load_task(name, data_dir)
        uniq, index = unique_sentences(data.values())
        t = time.perf_counter()
        emb = bert.encode(model, tokenizer, uniq, pooling=pooling, layer=layer, batch_size=batch_size)  # (n, H)
        t_enc += time.perf_counter() - t
        n_sent += len(uniq)
        results[name] = spearman_table({k: (similarities(emb, index, s1, s2), gold)
                                        for k, (s1, s2, gold) in data.items()})
    results["avg"] = {p: float(np.mean([results[name][p] for name in tasks])) for p in PROTOCOLS}
    results.update(pooling=pooling, layer=layer, sentences=n_sent, sentences_per_s=n_sent / max(t_enc, 1e-9),
                   seconds=time.perf_counter() - t0)
    return results


def stsb_spearman(model, tokenizer, data_dir, split="dev", pooling="cls", batch_size=64):
    """STS-B Spearman x100 of one split: train.py's dev score for picking the best checkpoint."""
    s1, s2, gold = load_stsb(split, data_dir)
    uniq, index = unique_sentences([(s1, s2, gold)])
    emb = bert.encode(model, tokenizer, uniq, pooling=pooling, batch_size=batch_size)
    return spearman(similarities(emb, index, s1, s2), gold)


def layerwise(model, tokenizer, data_dir, batch_size=64):
    """The paper's Figure 1: STS-B test Spearman x100 -> {pooling: [layer 0, layer 1, ..., layer L]}."""
    s1, s2, gold = load_stsb("test", data_dir)
    uniq, index = unique_sentences([(s1, s2, gold)])
    L = model.config.num_hidden_layers
    embs = bert.encode_many(model, tokenizer, uniq, [(p, k) for p in LAYERWISE_POOLINGS for k in range(L + 1)],
                            batch_size=batch_size)  # one forward pass per batch for all layers and poolings
    return {p: [spearman(similarities(embs[p, k], index, s1, s2), gold) for k in range(L + 1)]
            for p in LAYERWISE_POOLINGS}

# -----------------------------------------------------------------------------
# SentEval transfer tasks (the paper's Table 4): a small classifier trained on the frozen sentence vectors
#
# SentEval's protocol as its code runs it (facebookresearch/SentEval: senteval/binary.py, mrpc.py, sst.py, trec.py,
# tools/validation.py, tools/classifier.py), seeds included: the same vectors give the same folds, the same initial
# weights and the same batches. SentEval trains its classifiers one after another (410 per k-fold task); here all
# the classifiers of a task are one stacked problem: G groups (one set of rows each, hence the same batches) x R
# members (the L2 strengths), parameters (G, ..., R, ...), batches (G, 64, d), Adam written out per member, early
# stopping by masks, and a group dropped once all its members have stopped.

TRANSFER_CONFIGS = {"paper": 50, "simcse": 0}  # nhid: SG-BERT's appendix Table 9 (MLP) / SimCSE's test mode (log. reg.)
L2_GRID = (1e-5, 1e-4, 1e-3, 1e-2)
SEED, KFOLD, BATCH, EPOCH_SIZE, TENACITY, MAX_EPOCH = 1111, 10, 64, 4, 5, 200
LR, B1, B2, EPS = 1e-3, 0.9, 0.999, 1e-8  # torch.optim.Adam's defaults, which SentEval's "adam" uses
CACHE_BYTES = 16 << 20  # fit trains its groups in chunks of about this much weight state (L3-sized)


def stratified_folds(y, k=KFOLD, seed=SEED):
    """sklearn's StratifiedKFold(k, shuffle=True, random_state=seed).split, as SentEval calls it: [(train, test)]
    index arrays. Each class (numbered by first appearance) is dealt round-robin into k fold sizes, and its fold
    labels are shuffled."""
    _, first, y = np.unique(y, return_index=True, return_inverse=True)
    y = np.argsort(np.argsort(first))[y]  # classes renumbered by first appearance
    per_fold = np.array([np.bincount(np.sort(y)[i::k], minlength=len(first)) for i in range(k)])  # (k, C)
    rng, fold = np.random.RandomState(seed), np.empty(len(y), dtype=np.int64)
    for c in range(len(first)):
        f = np.repeat(np.arange(k), per_fold[:, c])
        rng.shuffle(f)
        fold[y == c] = f
    return [(np.flatnonzero(fold != i), np.flatnonzero(fold == i)) for i in range(k)]


def padded(rows):
    """Index arrays of different lengths -> (M, longest) int64 tensor, -1 after each one's end."""
    out = np.full((len(rows), max(map(len, rows))), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return torch.from_numpy(out)


def init_params(G, R, d, nhid, C, seed=SEED):
    """SentEval's initial weights, the same for every member (it reseeds torch before building each classifier):
    [W1 (G, d, R, nhid), b1 (G, 1, R, nhid), W2 (G, nhid, R, C), b2 (G, 1, R, C)], or [W (G, d, R, C), b (G, 1, R, C)]
    when nhid is 0. Member (g, r) is [:, :, r] of group g: every tensor keeps the R axis third."""
    with torch.random.fork_rng(devices=[]):  # the caller's RNG stream stays as it was
        torch.manual_seed(seed)
        layers = [torch.nn.Linear(d, nhid), torch.nn.Linear(nhid, C)] if nhid else [torch.nn.Linear(d, C)]
    return [(t.T if t.dim() == 2 else t[None]).detach()[None, :, None].expand(G, -1, R, -1).contiguous()
            for layer in layers for t in layer.parameters()]


def mlp(params, x):
    """x (G, B, d) -> logits (G, B, R, C): per member, Linear -> Sigmoid -> Linear (Dropout(0) is the identity), or
    one Linear. A group's R members see the same batch, so its first layer is one (B, d) @ (d, R * k) matmul."""
    W, b = params[:2]
    G, d, R, k = W.shape
    x = torch.baddbmm(b.view(G, 1, R * k), x, W.view(G, d, R * k)).view(G, -1, R, k)  # (G, B, R, k)
    if len(params) == 4:
        x = torch.einsum("gbrh,ghrc->gbrc", torch.sigmoid(x), params[2]) + params[3]  # (G, B, R, C)
    return x


@torch.no_grad()
def predict(params, X, idx):
    """Each member's class for its group's rows idx (G, n) of X (-1 = padding: predicted, then ignored) -> (G, n, R)."""
    return torch.cat([mlp(params, X[part.clamp(min=0)]).argmax(-1) for part in idx.split(BATCH, dim=1)], 1)


def accuracy(params, X, y, idx):
    """Fraction of its group's rows idx (G, n) of X that each member classifies right -> float64 (G, R)."""
    valid = idx >= 0
    right = (predict(params, X, idx) == y[idx.clamp(min=0), None]) & valid[..., None]  # (G, n, R)
    return right.sum(1).double() / valid.sum(1, keepdim=True)


def adam_step(params, moments, steps, wd, X, y, idx):
    """One mini-batch for every member: idx (G, B) rows of X, -1 = padding (an epoch's last batch is shorter). Mean
    cross-entropy per member, its weight decay wd (G, 1, R, 1) added to its gradient (what Adam's weight_decay does,
    as SentEval sets it), then torch.optim.Adam's own update (its fused kernel), one step for all members."""
    leaves = [p.detach().requires_grad_() for p in params]  # share storage with params, which Adam updates in place
    valid = idx >= 0  # (G, B)
    rows = idx.clamp(min=0)
    logits = mlp(leaves, X[rows])  # (G, B, R, C)
    ce = F.cross_entropy(logits.permute(0, 3, 1, 2), y[rows, None].expand(-1, -1, logits.shape[2]), reduction="none")
    loss = ((ce * valid[..., None]).sum(1) / valid.sum(1, keepdim=True)).sum()  # summed over members: each gets
    grads = torch.autograd.grad(loss, leaves)  # the gradient of its own mean
    # (!!) the fused kernel reads every tensor in memory order, so the gradients must be laid out like the weights
    grads = [g.contiguous().addcmul_(wd, p) for g, p in zip(grads, params)]
    adam(params, grads, [m for m, _ in moments], [v for _, v in moments], [], steps, fused=True, amsgrad=False,
         beta1=B1, beta2=B2, lr=LR, weight_decay=0.0, eps=EPS, maximize=False)


def fit(X, y, train, dev, l2, nhid, C, seed=SEED):
    """Train G x R classifiers at once, each as SentEval's MLP.fit trains it alone. Group g learns from the rows
    train[g] of X and is checked every EPOCH_SIZE epochs on the rows dev[g] (None: 5% of train[g] held out, SentEval's
    validation_split); its R members differ only in Adam's weight decay l2[g][r], so they share the batches (the
    same seed, the same rows). Each member keeps its best check and stops at the first check that fails to improve
    after TENACITY failed ones (the count is never reset), or past MAX_EPOCH epochs.
    X (n, d) float32, y (n,) int64 -> best dev accuracy (G, R) numpy, best parameters (init_params' layout)."""
    G, R = np.shape(l2)
    # Groups are independent, so they may train in parts: together only those with the same number of batches per
    # epoch (every member then takes each Adam step), and a few at a time (so that their weights stay in cache)
    n_batches = [-(-(len(t) - (int(0.05 * len(t)) if v is None else 0)) // BATCH) for t, v in zip(train, dev)]
    chunk = max(1, CACHE_BYTES // (16 * X.shape[1] * R * (nhid or C)))  # groups whose W1, grad and moments fit
    parts = [[g for g in range(G) if n_batches[g] == n] for n in dict.fromkeys(n_batches)]
    parts = [part[i:i + chunk] for part in parts for i in range(0, len(part), chunk)]
    if len(parts) > 1:
        out = [fit(X, y, [train[g] for g in part], [dev[g] for g in part], [l2[g] for g in part], nhid, C, seed)
               for part in parts]
        back = np.argsort(np.concatenate(parts))  # to the callers' order of groups
        return np.concatenate([acc for acc, _ in out])[back], [torch.cat(ps)[back] for ps in zip(*(p for _, p in out))]
    rngs = [np.random.RandomState(seed) for _ in range(G)]  # SentEval reseeds numpy before each classifier
    train, dev = list(train), list(dev)
    for g in range(G):
        if dev[g] is None:  # the stream's first permutation draws the held-out 5%, the later ones each epoch's order
            perm, k = rngs[g].permutation(len(train[g])), int(0.05 * len(train[g]))
            train[g], dev[g] = train[g][perm[k:]], train[g][perm[:k]]
    params = init_params(G, R, X.shape[1], nhid, C, seed)
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    steps, wd = [torch.tensor(0.0) for _ in params], torch.tensor(l2, dtype=torch.float32).view(G, 1, R, 1)
    best = [p.clone() for p in params]
    best_acc, failed = torch.full((G, R), -1.0, dtype=torch.float64), torch.zeros(G, R, dtype=torch.int64)
    stopped, live, dev_rows, epoch = torch.zeros(G, R, dtype=torch.bool), torch.arange(G), padded(dev), 0
    while len(live) and epoch <= MAX_EPOCH:  # live: the groups with a member still training
        for _ in range(EPOCH_SIZE):
            order = padded([train[g][rngs[g].permutation(len(train[g]))] for g in live.tolist()])  # (G_live, n)
            for s in range(0, order.shape[1], BATCH):
                adam_step(params, moments, steps, wd, X, y, order[:, s:s + BATCH])
        epoch += EPOCH_SIZE
        acc = accuracy(params, X, y, dev_rows[live])  # (G_live, R)
        up = (acc > best_acc[live]) & ~stopped[live]  # a stopped member trains on with its group, ignored
        gi, ri = up.nonzero(as_tuple=True)
        best_acc[live[gi], ri] = acc[gi, ri]
        for b, p in zip(best, params):
            b[live[gi], :, ri] = p[gi, :, ri]
        stopped[live] |= ~up & (failed[live] >= TENACITY)
        failed[live] += ~up
        keep = ~stopped[live].all(1)
        if not keep.all():  # groups whose members have all stopped leave the stacked problem
            params = [p[keep] for p in params]
            moments = [(m[keep], v[keep]) for m, v in moments]
            wd, live = wd[keep], live[keep]
    return best_acc.numpy(), best


def cv_and_refit(X, y, sets, nhid, C):
    """For each row set in `sets`: SentEval's L2 strength by 10-fold stratified CV on it (the mean fold accuracy x100,
    rounded to 2 decimals, the first best), and its final classifier, trained on the whole set with 5% held out and
    that strength -> [(l2, its CV accuracy)], the final classifiers' parameters (one group each). The refits need
    not wait for the choice: each set's refit group trains every strength in the same fit as the CV groups, and the
    chosen member is kept, which is the very run SentEval does afterwards."""
    cv = [(rows[tr], rows[te]) for rows in sets for tr, te in stratified_folds(y[rows].numpy())]
    groups = cv + [(rows, None) for rows in sets]
    acc, params = fit(X, y, *zip(*groups), [L2_GRID] * len(groups), nhid, C)
    scores = np.round(100 * acc[:len(cv)].reshape(len(sets), KFOLD, len(L2_GRID)).mean(1), 2)  # (sets, L2)
    best = scores.argmax(1)
    final = [torch.stack([p[len(cv) + i, :, r] for i, r in enumerate(best)])[:, :, None] for p in params]
    return [(L2_GRID[r], float(s[r])) for s, r in zip(scores, best)], final


def senteval_order(name, x, y):
    """SentEval sorts each split by token count (MRPC: of both sentences), then label, before anything else: the
    folds and batches depend on this order."""
    n = (lambda i: (len(x[i][0].split()), len(x[i][1].split()))) if name == "MRPC" else lambda i: (len(x[i].split()),)
    return sorted(range(len(y)), key=lambda i: (*n(i), y[i]))


def transfer_task(name, splits, vectors, nhid):
    """One transfer task by SentEval's protocol -> {"acc", "devacc"} x100 (MRPC also "f1", of the positive class).
    splits: data.load_transfer's {split: (x, y)}; vectors(sentences) -> (n, d) float32; nhid: 0 = logistic
    regression, else an MLP with nhid sigmoid units."""
    feats, labels, rows = [], [], {}
    for split, (x, y) in splits.items():
        o = senteval_order(name, x, y)
        x, y = [x[i] for i in o], y[o]
        if name == "MRPC":  # the pair feature [|u - v|, u * v]; u and v themselves are not in it
            u, v = vectors([a for a, _ in x]), vectors([b for _, b in x])
            feats.append(np.concatenate([np.abs(u - v), u * v], 1))
        else:
            feats.append(vectors(x))
        start = sum(map(len, labels))
        rows[split] = np.arange(start, start + len(y))
        labels.append(y)
    X, y = torch.from_numpy(np.concatenate(feats)).float(), torch.from_numpy(np.concatenate(labels))
    C = len(TREC_CLASSES) if name == "TREC" else 2
    if name == "SST2":  # the L2 strength by dev accuracy; SentEval's refit with it is the very same run (same seed,
        # data and start), so that member is the final model
        acc, params = fit(X, y, [rows["train"]], [rows["dev"]], [L2_GRID], nhid, C)
        scores = np.round(100 * acc[0], 2)
        r = int(scores.argmax())
        test = accuracy([p[:, :, r:r + 1] for p in params], X, y, padded([rows["test"]]))
        return {"acc": round(100 * test.item(), 2), "devacc": float(scores.max())}
    if name in ("TREC", "MRPC"):  # the L2 strength by 10-fold CV on train, refit on train with 5% held out, test
        [(_, devacc)], params = cv_and_refit(X, y, [rows["train"]], nhid, C)
        pred, gold = predict(params, X, padded([rows["test"]]))[0, :, 0], y[rows["test"]]
        out = {"acc": round(100 * (pred == gold).double().mean().item(), 2), "devacc": devacc}
        if name == "MRPC":
            tp = ((pred == 1) & (gold == 1)).sum().item()
            out["f1"] = round(100 * 2 * tp / max(1, (pred == 1).sum().item() + (gold == 1).sum().item()), 2)
        return out
    # MR, CR, SUBJ, MPQA: 10-fold CV; in each outer fold the L2 strength by an inner 10-fold CV on its train part
    outer = [(rows["all"][tr], rows["all"][te]) for tr, te in stratified_folds(y.numpy())]
    chosen, params = cv_and_refit(X, y, [tr for tr, _ in outer], nhid, C)
    test = accuracy(params, X, y, padded([te for _, te in outer]))
    return {"acc": round(float(np.mean(np.round(100 * test[:, 0].numpy(), 2))), 2),
            "devacc": round(float(np.mean([d for _, d in chosen])), 2)}


def evaluate_transfer(model, tokenizer, tasks, data_dir, config="paper", pooling="cls", layer=-1, batch_size=64):
    """Accuracy x100 of every transfer task, in the --json format (less "model"). Each task's distinct sentences are
    encoded once (bert.encode), then transfer_task trains its classifiers on the vectors."""
    t0 = time.perf_counter()
    results, t_clf = {}, 0.0
    for name in tasks:
        splits = load_transfer(name, data_dir)
        sents = [s for x, _ in splits.values() for e in x for s in (e if name == "MRPC" else (e,))]
        uniq = list(dict.fromkeys(sents))
        index = {s: i for i, s in enumerate(uniq)}
        emb = bert.encode(model, tokenizer, uniq, pooling=pooling, layer=layer, batch_size=batch_size)  # (n, H)
        t = time.perf_counter()
        results[name] = transfer_task(name, splits, lambda xs: emb[[index[s] for s in xs]], TRANSFER_CONFIGS[config])
        t_clf += time.perf_counter() - t
    results["avg"] = float(np.mean([results[name]["acc"] for name in tasks]))
    results.update(config=config, pooling=pooling, layer=layer, classifier_seconds=t_clf,
                   seconds=time.perf_counter() - t0)
    return results

def pca_2d(x):
    """The first two principal components of the rows of x (n, H) -> (n, 2), signs fixed (largest |loading| > 0)."""
    x = x.astype(np.float64) - x.mean(0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    vt = vt[:2] * np.sign(vt[:2][np.arange(2), np.abs(vt[:2]).argmax(1)])[:, None]
    return x @ vt.T


def sts_pairs_2d(model, tokenizer, data_dir, pooling="cls", n=20, batch_size=64):
    """The paper's Figure 5: n positive (gold 5) and n negative (gold 0) STS-B dev pairs, the first in file order,
    projected to 2-D by PCA over their 4n unit-normalised vectors -> (positive (n, 2, 2), negative (n, 2, 2))."""
    s1, s2, gold = load_stsb("dev", data_dir)
    pos, neg = [np.flatnonzero(gold == g)[:n] for g in (5.0, 0.0)]
    if len(pos) < n or len(neg) < n:
        raise DataError(f"STS-B dev has {len(pos)} pairs of gold 5 and {len(neg)} of gold 0; the plot needs {n} each")
    idx = np.concatenate([pos, neg])
    sents = [s1[i] for i in idx] + [s2[i] for i in idx]
    v = bert.encode(model, tokenizer, sents, pooling=pooling, batch_size=batch_size)
    xy = pca_2d(v / np.linalg.norm(v, axis=1, keepdims=True)).reshape(2, 2 * n, 2).transpose(1, 0, 2)  # (2n, 2, 2)
    return xy[:n], xy[n:]


def plot_pairs(panels, path):
    """panels: {title: (positive, negative)} from sts_pairs_2d, side by side; a line joins the two sentences of a pair."""
    import matplotlib  # only here and in plot_layerwise
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5), squeeze=False)
    for ax, (title, (pos, neg)) in zip(axes[0], panels.items()):
        for pairs, color, label in ((pos, "tab:blue", "gold 5"), (neg, "tab:red", "gold 0")):
            for k, (a, b) in enumerate(pairs):
                ax.plot([a[0], b[0]], [a[1], b[1]], "-o", color=color, ms=3, lw=0.8, label=label if k == 0 else None)
        ax.set(title=title, xticks=[], yticks=[])
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)

# -----------------------------------------------------------------------------
# printing, plotting, command line


def fmt(x):
    return f"{x:7.2f}" if not math.isnan(x) else "    nan"


def print_table(results, tasks, title):
    print(title)
    print(f"{'task':<8}" + "".join(f"{p:>8}" for p in PROTOCOLS))
    for name in [*tasks, "avg"]:
        print(f"{SHORT.get(name, name):<8}" + "".join(" " + fmt(results[name][p]) for p in PROTOCOLS))
    print(f"{results['sentences']} distinct sentences encoded, {results['sentences_per_s']:.0f} sentences/s; "
          f"evaluation took {results['seconds']:.1f} s")


def print_layerwise(table, title):
    print(title)
    print(f"{'layer':<6}" + "".join(f"{p:>8}" for p in table))
    for k in range(len(next(iter(table.values())))):
        print(f"{k:<6}" + "".join(" " + fmt(table[p][k]) for p in table))


def print_transfer(results, tasks, title):
    print(title)
    print(f"{'task':<8}{'acc':>8}{'devacc':>8}{'f1':>8}")
    for name in tasks:
        r = results[name]
        print(f"{name:<8} {fmt(r['acc'])} {fmt(r['devacc'])}" + (f" {fmt(r['f1'])}" if "f1" in r else ""))
    print(f"{'avg':<8} {fmt(results['avg'])}")
    print(f"evaluation took {results['seconds']:.1f} s ({results['classifier_seconds']:.1f} s training classifiers)")


def plot_layerwise(table, path, title):
    import matplotlib  # only here: the one place that needs it
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for p, rhos in table.items():
        ax.plot(range(len(rhos)), rhos, marker="o", label=p)
    ax.set(xlabel="layer (0 = embeddings)", ylabel="STS-B test Spearman x100", title=title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


def die(msg):
    print("error: " + " ".join(str(msg).split()), file=sys.stderr)  # one line, whatever the message holds
    sys.exit(2)


def json_safe(x):
    """NaN (a constant similarity, e.g. [CLS] of the embedding layer) as null, so the file is valid JSON."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [json_safe(v) for v in x]
    return None if isinstance(x, float) and math.isnan(x) else x


def get_args(argv=None):
    parser = argparse.ArgumentParser(description="STS evaluation (Spearman x100) in the all / wmean / mean protocols, "
                                     "and SentEval's transfer tasks (accuracy)")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="model folder, or a name resolved as weights/<name>/ (e.g. bert-base-uncased)")
    src.add_argument("--ckpt", help="a .safetensors checkpoint written by train.py")
    parser.add_argument("--pooling", choices=bert.POOLINGS, help="sentence vector (default: the pooling a --ckpt "
                        "records, e.g. last2 for ConSERT; else cls)")
    parser.add_argument("--layer", type=int, default=-1, help="hidden state to pool, 0 = embeddings (default: -1)")
    parser.add_argument("--tasks", nargs="+", default=["sts"], metavar="TASK",
                        choices=TASKS + list(SHORT.values()) + TRANSFER + list(TASK_SETS),
                        help=f"tasks to run: any of {' '.join(TASKS)} {' '.join(TRANSFER)}, or sts (the 7 STS "
                        "tasks, the default), transfer (the 7 transfer tasks), all (both)")
    parser.add_argument("--transfer-config", default="paper", choices=list(TRANSFER_CONFIGS),
                        help="transfer classifier: paper = SG-BERT's Table 9 (MLP, 50 sigmoid units), simcse = "
                        "SimCSE's test mode (logistic regression); both Adam, batch 64, tenacity 5, epoch 4, 10 folds")
    parser.add_argument("--data-dir", help="data folder (default: $SG_DATA, else ./data; fetched when missing)")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per forward pass (default: 64)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="default: cuda if present")
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--layerwise", action="store_true", help="STS-B test Spearman per layer x cls/mean/max")
    parser.add_argument("--plot", help="with --layerwise: draw it to this .png (needs matplotlib)")
    parser.add_argument("--pairs-plot", help="the paper's Figure 5: 20 gold-5 and 20 gold-0 STS-B dev pairs in 2-D (PCA), "
                        "a --ckpt beside its base model, to this .png (needs matplotlib)")
    return parser.parse_args(argv)


def check_args(args):
    """Refuse bad input before any work starts, with one line each."""
    if args.plot and not args.layerwise:
        die("--plot draws the --layerwise table: add --layerwise")
    for flag, path, suffix in (("--plot", args.plot, ".png"), ("--pairs-plot", args.pairs_plot, ".png"),
                               ("--json", args.json, ".json")):
        if path and (Path(path).is_dir() or Path(path).suffix != suffix or not Path(path).resolve().parent.is_dir()):
            die(f"{flag} {path}: expected a file name ending in {suffix} in an existing folder")
    if args.pairs_plot and not args.ckpt:
        die("--pairs-plot compares a trained --ckpt with its base model: give --ckpt")
    if args.plot or args.pairs_plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            die("--plot needs matplotlib: pip install matplotlib (or drop --plot; the table has the same numbers)")
    if args.batch_size < 1:
        die(f"--batch-size must be at least 1, not {args.batch_size}")
    if args.device == "cuda" and not torch.cuda.is_available():
        die("--device cuda, but torch sees no CUDA device (use --device cpu)")


def main(argv=None):
    args = get_args(argv)
    check_args(args)
    tasks = [{v: k for k, v in SHORT.items()}.get(t, t) for t in args.tasks]
    tasks = list(dict.fromkeys(x for t in tasks for x in TASK_SETS.get(t, [t])))  # expand sets, drop repeats
    sts, transfer = [t for t in tasks if t in TASKS], [t for t in tasks if t in TRANSFER]
    name = args.ckpt or args.model
    try:
        if args.ckpt:
            bert.check_checkpoint_path(args.ckpt)
        model = bert.Bert.from_pretrained(name)  # truncate at the model's own limit (128 at most, as SentEval runs)
        tokenizer = bert.load_tokenizer(name, max_len=min(128, model.config.max_position_embeddings))
        meta = bert.read_metadata(name) if args.ckpt else {}
    except bert.LoadError as e:  # its message names the file and what to do
        die(e)
    except (OSError, ValueError) as e:
        die(f"cannot load {name}: {e}")
    args.pooling = args.pooling or meta.get("pooling") or "cls"  # the method's own evaluation pooling
    L = model.config.num_hidden_layers
    if not -L - 1 <= args.layer <= L:
        die(f"--layer {args.layer} out of range: {name} has layers 0..{L} (or -1..-{L + 1} from the top)")
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    model.to(device)
    try:
        data_dir = resolve_data_dir(args.data_dir, need_stsb=False)
        if args.pairs_plot:
            base = meta.get("base_model")
            try:
                before = bert.Bert.from_pretrained(base).to(device), bert.load_tokenizer(base, tokenizer.truncation["max_length"])
            except bert.LoadError as e:
                die(f"--pairs-plot: the base model {base!r} recorded in {name} cannot be loaded: {e}")
            plot_pairs({f"before: {'/'.join(Path(str(base)).parts[-2:])}": sts_pairs_2d(*before, data_dir, args.pooling),
                        f"after: {Path(name).name}": sts_pairs_2d(model, tokenizer, data_dir, args.pooling)},
                       args.pairs_plot)
            print(f"pairs plot (paper Fig. 5) written to {args.pairs_plot}")
            return
        if args.layerwise:
            t0 = time.perf_counter()
            table = layerwise(model, tokenizer, data_dir, args.batch_size)
            results = {"layerwise": table, "seconds": time.perf_counter() - t0}
        else:
            results = {}
            if sts:
                results["sts"] = evaluate_model(model, tokenizer, sts, data_dir, args.pooling, args.layer,
                                                args.batch_size)
            if transfer:
                results["transfer"] = evaluate_transfer(model, tokenizer, transfer, data_dir, args.transfer_config,
                                                        args.pooling, args.layer, args.batch_size)
            if len(results) == 1:  # one kind of task: its results at the top level, as before
                results = next(iter(results.values()))
    except DataError as e:
        die(e)
    results["model"] = name
    if args.layerwise:
        title = f"STS-B test Spearman x100 by layer (paper Fig. 1) | {name} | device {device}"
        print_layerwise(results["layerwise"], title)
        print(f"layer-wise evaluation took {results['seconds']:.1f} s")
        if args.plot:
            plot_layerwise(results["layerwise"], args.plot, f"STS-B test, {'/'.join(Path(name).parts[-2:])}")
            print(f"plot written to {args.plot}")
    else:
        where = f"{name} | pooling {args.pooling} | layer {args.layer} | device {device}"
        if sts:
            print_table(results.get("sts", results), sts, f"STS Spearman x100 | {where}")
        if transfer:
            print_transfer(results.get("transfer", results), transfer,
                           f"SentEval transfer accuracy x100 | {where} | classifier {args.transfer_config}")
    if args.json:
        tmp = bert.temp_path(Path(args.json))
        tmp.write_text(json.dumps(json_safe(results), indent=2) + "\n")
        os.replace(tmp, args.json)  # atomic: the old file or the new one
        print(f"results written to {args.json}")


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        main()
    except KeyboardInterrupt:
        print("evaluate.py: interrupted", file=sys.stderr)
        sys.exit(130)
