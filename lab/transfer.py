"""
SentEval's transfer tasks (the paper's Table 4): a small classifier trained on frozen sentence vectors, by SentEval's
own protocol and seeds.

It follows SentEval's code (facebookresearch/SentEval: senteval/binary.py, mrpc.py, sst.py, trec.py,
tools/validation.py, tools/classifier.py), seeds included: the same vectors give the same folds, the same initial
weights and the same batches, and so the same accuracies (tests/test_transfer.py checks against SentEval itself).
SentEval trains its classifiers one after another (410 per k-fold task); here the classifiers of a task are a few
stacked problems: G groups (one set of rows each, hence the same batches) x R members (the L2 strengths), parameters
(G, ..., R, ...), batches (G, 64, d), one fused Adam step for all, early stopping by masks, a member leaving once it
has stopped; the problems train side by side, one per CPU thread.

The seven tasks are three kinds: k-fold (MR, CR, SUBJ, MPQA: 10-fold CV with an inner CV for the L2 strength),
train/dev/test (SST2: the L2 strength by dev accuracy) and train/test (TREC, MRPC: the L2 strength by 10-fold CV
on train, then a refit). Every function takes vectors(sentences) -> (n, d) float32, whatever made them.
"""
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F
from torch.optim.adam import adam  # the functional form of torch.optim.Adam

from lab.eval_data import TREC_CLASSES, load_transfer

TRANSFER_CONFIGS = {"paper": 50, "simcse": 0}  # nhid: SG-BERT's appendix Table 9 (MLP) / SimCSE's test mode (log. reg.)
L2_GRID = (1e-5, 1e-4, 1e-3, 1e-2)
SEED, KFOLD, BATCH, EPOCH_SIZE, TENACITY, MAX_EPOCH = 1111, 10, 64, 4, 5, 200
LR, B1, B2, EPS = 1e-3, 0.9, 0.999, 1e-8  # torch.optim.Adam's defaults, which SentEval's "adam" uses
CACHE_BYTES = 32 << 20  # fit trains its groups in parts of about this much weight state (the L3 here; 16 MB
# parts on two threads were 4 to 20% slower on CR)


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


def take(X, idx):
    """X's rows idx (any shape) -> (*idx.shape, d): X[idx], by index_select (several times faster than indexing)."""
    return X.index_select(0, idx.reshape(-1)).view(*idx.shape, X.shape[1])


class Affine(torch.autograd.Function):
    """baddbmm(b, x, W) for data x (no gradient), with autograd's gradients of W and b bit for bit: the one bmm and
    the sum they need. On torch 2.13's CPU autograd's own backward of baddbmm costs more (forward + backward of 11
    groups x 4 members, d 384: 5.8 against 4.2 ms on 1 thread, 3.9 against 2.2 ms on 2)."""

    @staticmethod
    def forward(ctx, x, W, b):
        ctx.save_for_backward(x)
        return torch.baddbmm(b, x, W)

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        return None, torch.bmm(x.transpose(1, 2), grad), grad.sum(1, keepdim=True)


def mlp(params, x):
    """x (G, B, d) -> logits (G, B, R, C): per member, Linear -> Sigmoid -> Linear (Dropout(0) is the identity), or
    one Linear. A group's R members see the same batch, so its first layer is one (B, d) @ (d, R * k) matmul."""
    W, b = params[:2]
    G, d, R, k = W.shape
    x = Affine.apply(x, W.view(G, d, R * k), b.view(G, 1, R * k)).view(G, -1, R, k)  # (G, B, R, k)
    if len(params) == 4:
        x = torch.einsum("gbrh,ghrc->gbrc", torch.sigmoid(x), params[2]) + params[3]  # (G, B, R, C)
    return x


@torch.no_grad()
def predict(params, X, idx):
    """Each member's class for its group's rows idx (G, n) of X (-1 = padding: predicted, then ignored) -> (G, n, R)."""
    return torch.cat([mlp(params, take(X, part.clamp(min=0))).argmax(-1) for part in idx.split(BATCH, dim=1)], 1)


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
    logits = mlp(leaves, take(X, rows))  # (G, B, R, C)
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
    # Groups are independent, so they train in parts: together only those with the same number of batches per epoch
    # (every member then takes each Adam step), a few at a time (so that their weights stay in cache), and the parts
    # side by side, one per torch CPU thread, each on one (their steps are too small to share a GEMM between threads
    # well). A member's math does not depend on its part or thread (to the bit at widths 384 and 768, checked)
    n_batches = [-(-(len(t) - (int(0.05 * len(t)) if v is None else 0)) // BATCH) for t, v in zip(train, dev)]
    chunk = max(1, CACHE_BYTES // (16 * X.shape[1] * R * (nhid or C)))  # groups whose W1, grad and moments fit
    threads, parts = torch.get_num_threads(), []
    for n in dict.fromkeys(n_batches):
        same = [g for g in range(G) if n_batches[g] == n]
        k = -(-len(same) // chunk)
        parts += np.array_split(same, min(len(same), -(-k // threads) * threads))  # k rounded up to whole rounds
    init, stop = init_params(1, 1, X.shape[1], nhid, C, seed), threading.Event()

    def run(part):
        try:
            return fit_part(X, y, [train[g] for g in part], [dev[g] for g in part], [l2[g] for g in part], init, seed,
                            stop)
        except BaseException:
            stop.set()  # the other parts end at their next check
            raise
    if threads == 1 or len(parts) == 1:
        out = [run(part) for part in parts]
    else:
        torch.set_num_threads(1)
        try:
            with ThreadPoolExecutor(threads) as pool:
                futures = [pool.submit(run, part) for part in parts]
                try:
                    out = [f.result() for f in futures]  # a part's error is raised here, once the others have ended
                except BaseException:  # (or an interrupt)
                    stop.set()
                    raise
        finally:
            torch.set_num_threads(threads)
    back = np.argsort(np.concatenate(parts))  # to the callers' order of groups
    return np.concatenate([acc for acc, _ in out])[back], [torch.cat(ps)[back] for ps in zip(*(p for _, p in out))]


def fit_part(X, y, train, dev, l2, init, seed, stop):
    """fit's G x R classifiers as one stacked problem, from the weights init (init_params(1, 1, ...)) -> fit's
    results, or None once the threading.Event stop is set (checked every EPOCH_SIZE epochs)."""
    G, R = np.shape(l2)
    rngs = [np.random.RandomState(seed) for _ in range(G)]  # SentEval reseeds numpy before each classifier
    train, dev = list(train), list(dev)
    for g in range(G):
        if dev[g] is None:  # the stream's first permutation draws the held-out 5%, the later ones each epoch's order
            perm, k = rngs[g].permutation(len(train[g])), int(0.05 * len(train[g]))
            train[g], dev[g] = train[g][perm[k:]], train[g][perm[:k]]
    params = [p.expand(G, -1, R, -1).contiguous() for p in init]
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    steps, wd = [torch.tensor(0.0) for _ in params], torch.tensor(l2, dtype=torch.float32).view(G, 1, R, 1)
    best = [p.clone() for p in params]
    best_acc, failed = torch.full((G, R), -1.0, dtype=torch.float64), torch.zeros(G, R, dtype=torch.int64)
    stopped, dev_rows, epoch = torch.zeros(G, R, dtype=torch.bool), padded(dev), 0
    live, member = torch.arange(G), torch.arange(R).repeat(G, 1)  # slot r of live group g trains member[g, r]
    while len(live) and epoch <= MAX_EPOCH:  # live: the groups with a member still training
        if stop.is_set():
            return None
        for _ in range(EPOCH_SIZE):
            order = padded([train[g][rngs[g].permutation(len(train[g]))] for g in live.tolist()])  # (G_live, n)
            for s in range(0, order.shape[1], BATCH):
                adam_step(params, moments, steps, wd, X, y, order[:, s:s + BATCH])
        epoch += EPOCH_SIZE
        acc = accuracy(params, X, y, dev_rows[live])  # (G_live, slots)
        gm = live[:, None], member  # every slot's (group, member)
        up = (acc > best_acc[gm]) & ~stopped[gm]  # a stopped member still in a slot trains on, ignored
        gi, ri = up.nonzero(as_tuple=True)
        best_acc[live[gi], member[gi, ri]] = acc[gi, ri]
        for b, p in zip(best, params):
            b[live[gi], :, member[gi, ri]] = p[gi, :, ri]
        stopped[gm] |= ~up & (failed[gm] >= TENACITY)
        failed[gm] += ~up
        # Members that have stopped leave the stacked problem: groups with none left go, and the slots shrink to the
        # most members any group still trains, those first (the others' math is unchanged: each member is its own
        # columns of every matmul)
        running = ~stopped[gm]
        keep, width = running.any(1), int(running.sum(1).max())
        if not keep.all() or width < member.shape[1]:
            first = torch.argsort((~running[keep]).byte(), dim=1, stable=True)[:, :width]  # (G_kept, width)
            live, member = live[keep], member[keep].gather(1, first)
            pick = lambda t: t[keep].take_along_dim(first[:, None, :, None], dim=2)  # noqa: E731
            params, moments, wd = [pick(p) for p in params], [(pick(m), pick(v)) for m, v in moments], pick(wd)
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
    splits: eval_data.load_transfer's {split: (x, y)}; vectors(sentences) -> (n, d) float32; nhid: 0 = logistic
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


def evaluate_transfer(vectors, tasks, data_dir, config="paper", log=print):
    """Accuracy x100 of every transfer task: {task: {"acc", "devacc"[, "f1"]}, "avg", "config", "seconds",
    "classifier_seconds"}. Each task's distinct sentences are encoded once by vectors(sentences), then transfer_task
    trains its classifiers on them. log: where the per-task progress lines go."""
    t0 = time.perf_counter()
    results, t_clf = {}, 0.0
    for name in tasks:
        splits = load_transfer(name, data_dir)
        sents = [s for x, _ in splits.values() for e in x for s in (e if name == "MRPC" else (e,))]
        uniq = list(dict.fromkeys(sents))
        index = {s: i for i, s in enumerate(uniq)}
        log(f"{name}: encoding {len(uniq)} sentences ...")
        t = time.perf_counter()
        emb = vectors(uniq)  # (n, H)
        t_enc, t = time.perf_counter() - t, time.perf_counter()
        log(f"{name}: training the classifiers ({'MLP' if TRANSFER_CONFIGS[config] else 'logistic regression'}) ...")
        results[name] = transfer_task(name, splits, lambda xs: emb[[index[s] for s in xs]], TRANSFER_CONFIGS[config])
        t_clf += time.perf_counter() - t
        log(f"{name}: acc {results[name]['acc']:.2f} (encoding {t_enc:.1f} s, classifiers {time.perf_counter() - t:.1f} s)")
    results["avg"] = float(np.mean([results[name]["acc"] for name in tasks]))
    results.update(config=config, classifier_seconds=t_clf, seconds=time.perf_counter() - t0)
    return results


def print_transfer(results, tasks, title):
    print(title)
    print(f"{'task':<8}{'acc':>8}{'devacc':>8}{'f1':>8}")
    for name in tasks:
        r = results[name]
        print(f"{name:<8} {fmt(r['acc'])} {fmt(r['devacc'])}" + (f" {fmt(r['f1'])}" if "f1" in r else ""))
    print(f"{'avg':<8} {fmt(results['avg'])}")
    print(f"evaluation took {results['seconds']:.1f} s ({results['classifier_seconds']:.1f} s training classifiers)")


def fmt(x):
    return f"{x:7.2f}" if not np.isnan(x) else "    nan"
