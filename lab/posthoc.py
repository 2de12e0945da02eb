"""
Post-hoc maps of sentence vectors, fitted on unlabelled sentences with BERT left as it is: the baselines SG-BERT
measures itself against (Table 1, Figure 4). python -m lab.train --loss whitening | flow fits them;
python -m lab.evaluate applies them.

Whitening (Su et al. 2021; bojone/BERT-whitening, compute_kernel_bias): mu = the mean, Sigma = the covariance (ddof 1),
U S U^T = SVD(Sigma), W = U diag(1 / sqrt(S)); y = (x - mu) W[:, :K]. In float64.

BERT-flow (Li et al., EMNLP 2020; bohanli/BERT-flow, flow/glow_1x1.py + glow_ops_1x1.py, config l3_d3_w32, the code's
default): a Glow on the H-dim sentence vector (1 x 1 spatial, so every conv is a linear): 3 levels of depth 3; a step
is actnorm -> a fixed channel reversal -> additive coupling (second half += NN(first half); NN = linear, actnorm, ReLU,
linear, actnorm, ReLU, a zero-initialised linear scaled by exp(3 logs)); after each level but the last, the second
half of the channels leaves under a fixed N(0, I) prior (the code's compute_prior returns N(0, 1); nothing learned).
z = [the halves that left, in order, then the top] is the sentence vector. The loss is the negative log-likelihood in
bits per dimension, -(log|det| + log N(z; 0, I)) / (H ln 2), the Gaussian's -1/2 log(2 pi) included, no
dequantisation term (as the code); only actnorm has a log-determinant.
Odd H (the code's tf.split needs even halves): the first floor(C/2) channels condition the coupling and stay at a split.
"""
import math
import time

import numpy as np
import torch
import torch.nn as nn

import checkpoint

# -----------------------------------------------------------------------------
# whitening


def fit_whitening(x, dim=None):
    """x (n, H) sentence vectors (numpy or torch) -> mu (H,), W (H, K) float64 tensors; K = dim or H."""
    x = torch.as_tensor(x).double()
    if x.ndim != 2:
        raise ValueError(f"whitening takes (n, H) sentence vectors, got shape {tuple(x.shape)}")
    n, H = x.shape
    if n < 2:
        raise ValueError(f"whitening needs at least 2 sentence vectors, got {n}")
    if not torch.isfinite(x).all():
        raise ValueError("whitening: the sentence vectors hold NaN or inf")
    K = H if dim is None else dim
    if not 1 <= K <= H:
        raise ValueError(f"whitening dimension {K}: give 1..{H}")
    distinct = len(torch.unique(x, dim=0))
    if distinct <= K:  # (!!) the code has no check: the missing directions get 1 / sqrt(~1e-16) ~ 1e8 and swamp the rest
        raise ValueError(f"whitening to {K} dimensions needs more than {K} distinct sentence vectors (n points span "
                         f"at most n - 1 directions), got {distinct}: give more distinct sentences"
                         + (f", or a dimension below {distinct}" if distinct > 1 else ""))
    mu = x.mean(0)
    # a direction of zero variance that the count above cannot see (LayerNorm's sum-zero outputs in an untrained
    # model) still gets a huge 1/sqrt(S), as in the code; pass dim to drop it
    U, S, _ = torch.linalg.svd(torch.cov(x.T))  # torch.cov: ddof 1, as np.cov; S descending
    W = (U / S.sqrt())[:, :K]  # U diag(1/sqrt(S)): column j of U divided by sqrt(S_j)
    if not (torch.isfinite(mu).all() and torch.isfinite(W).all()):
        raise ValueError("the fitted whitening is not finite (a direction of zero variance): give a smaller dimension")
    return mu, W


def whiten(x, mu, W):
    """(x - mu) W, in float64: (n, H) -> (n, K)."""
    return (torch.as_tensor(x).double() - mu.double()) @ W.double()

# -----------------------------------------------------------------------------
# BERT-flow's Glow

INITS = ("data", "release", "identity")  # how actnorms start; see ActNorm


class ActNorm(nn.Module):
    """y = (x + b) * exp(3 logs) per channel (Glow's actnorm, logscale_factor 3); log|det| = 3 sum(logs). init:
    "data": Glow's data-dependent init: the first batch it sees sets b, logs so that batch leaves with zero mean and
            unit (population) variance per channel (logs = log(1 / (std + 1e-6)) / 3, as the code's init op);
    "release": b, logs ~ U(-a, a), a = sqrt(6 / (1 + C)): TF's default glorot_uniform for a (1, 1, 1, C) variable,
            which is where BERT-flow's release starts (it builds the init op but never runs GlowInitHook);
    "identity": b = logs = 0."""

    def __init__(self, C, init="data"):
        super().__init__()
        self.b, self.logs = nn.Parameter(torch.zeros(C)), nn.Parameter(torch.zeros(C))
        if init == "release":
            a = math.sqrt(6 / (1 + C))
            nn.init.uniform_(self.b, -a, a), nn.init.uniform_(self.logs, -a, a)
        self.register_buffer("initialized", torch.tensor(float(init != "data")))  # a float: checkpoints hold floats

    def forward(self, x):
        if not self.initialized:
            with torch.no_grad():
                self.b.copy_(-x.mean(0))
                self.logs.copy_(torch.log(1 / (x.std(0, unbiased=False) + 1e-6)) / 3)
                self.initialized.fill_(1.0)
        return (x + self.b) * torch.exp(3 * self.logs), 3 * self.logs.sum()

    def inverse(self, y):
        assert self.initialized, "actnorm: no data seen yet (init='data'): run forward on a batch first"
        return y * torch.exp(-3 * self.logs) - self.b


class ShiftNet(nn.Module):
    """The additive coupling's NN (the code's conv_stack on 1 x 1 maps): linear (no bias), actnorm, ReLU, twice, then
    a zero-initialised linear whose output is scaled by exp(3 logs) (Glow's conv2d_zeros): the coupling starts as the
    identity."""

    def __init__(self, c_in, c_out, width, init="data"):
        super().__init__()
        self.l1, self.n1 = nn.Linear(c_in, width, bias=False), ActNorm(width, init)
        self.l2, self.n2 = nn.Linear(width, width, bias=False), ActNorm(width, init)
        for lin in (self.l1, self.l2):
            nn.init.normal_(lin.weight, std=0.05)  # the code's default_initializer
        self.out = nn.Linear(width, c_out)
        nn.init.zeros_(self.out.weight), nn.init.zeros_(self.out.bias)
        self.logs = nn.Parameter(torch.zeros(c_out))

    def forward(self, x):
        h = torch.relu(self.n1(self.l1(x))[0])
        h = torch.relu(self.n2(self.l2(h))[0])
        return self.out(h) * torch.exp(3 * self.logs)


class FlowStep(nn.Module):
    """actnorm -> reverse the channels (the code's permutation=True 1x1 'conv', log|det| 0) -> second half +=
    NN(first half) (log|det| 0)."""

    def __init__(self, C, width, init="data"):
        super().__init__()
        self.norm, self.half = ActNorm(C, init), C // 2
        self.shift = ShiftNet(self.half, C - self.half, width, init)

    def forward(self, x):
        x, logdet = self.norm(x)
        x = x.flip(-1)
        a, b = x[:, :self.half], x[:, self.half:]
        return torch.cat([a, b + self.shift(a)], 1), logdet

    def inverse(self, y):
        a, b = y[:, :self.half], y[:, self.half:]
        return self.norm.inverse(torch.cat([a, b - self.shift(a)], 1).flip(-1))


class Glow(nn.Module):
    """x (B, H) -> z (B, H) and log|det dz/dx| (B,). levels x depth FlowSteps; after each level but the last, the
    second half of the channels leaves (scored under N(0, I) by nll_bits). init: how actnorms start (see ActNorm)."""

    def __init__(self, dim, levels=3, depth=3, width=32, init="data"):
        super().__init__()
        if init not in INITS:
            raise ValueError(f"actnorm init {init!r}: give one of {INITS}")
        self.dim, self.levels, self.depth, self.width = dim, levels, depth, width
        sizes = [dim]  # channels entering each level
        for _ in range(levels - 1):
            sizes.append(sizes[-1] // 2)  # the first half stays
        if levels < 1 or depth < 1 or sizes[-1] < 2:
            raise ValueError(f"a Glow of {levels} levels needs at least {2 ** levels} dimensions, not {dim} "
                             f"(and levels, depth >= 1)")
        self.sizes = sizes
        self.steps = nn.ModuleList(nn.ModuleList(FlowStep(C, width, init) for _ in range(depth)) for C in sizes)

    def config(self):
        return {"dim": self.dim, "levels": self.levels, "depth": self.depth, "width": self.width}

    @classmethod
    def from_config(cls, config):
        return cls(**config, init="identity")  # load_state_dict then sets every actnorm (and its 'initialized')

    def forward(self, x):
        logdet, out = x.new_zeros(()), []
        for level, steps in enumerate(self.steps):
            for step in steps:
                x, ld = step(x)
                logdet = logdet + ld
            if level < self.levels - 1:
                keep = self.sizes[level + 1]
                out.append(x[:, keep:])  # leaves under the fixed N(0, I) prior
                x = x[:, :keep]
        return torch.cat([*out, x], 1), logdet.expand(x.shape[0])  # z = [eps_0, eps_1, ..., top]

    def inverse(self, z):
        """z (B, H) -> x (B, H): the steps backwards."""
        sizes_out = [C - self.sizes[i + 1] for i, C in enumerate(self.sizes[:-1])]
        parts = list(torch.split(z, [*sizes_out, self.sizes[-1]], 1))
        x = parts.pop()
        for level in reversed(range(self.levels)):
            if level < self.levels - 1:
                x = torch.cat([x, parts.pop()], 1)
            for step in reversed(self.steps[level]):
                x = step.inverse(x)
        return x

    def nll_bits(self, x):
        """The loss: -(log|det| + log N(z; 0, I)) / (H ln 2) per example, averaged over the batch."""
        z, logdet = self(x)
        logp = -0.5 * (z ** 2 + math.log(2 * math.pi)).sum(1)
        return (-(logp + logdet) / (self.dim * math.log(2))).mean()


class BertAdam(torch.optim.Optimizer):
    """google-research/bert's AdamWeightDecayOptimizer, which BERT-flow's code fits the flow with: Adam with NO bias
    correction (so its steps are larger than AdamW's early on: x3.2 at step 1, x6.5 at 10, x2 at 270) and decoupled
    weight decay on every flow variable (none of their names holds 'bias', the code's exclusion)."""

    def __init__(self, params, lr=1e-3, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-6):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, betas=betas, eps=eps))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["m"], state["v"] = torch.zeros_like(p), torch.zeros_like(p)
                m, v = state["m"], state["v"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                p.sub_(group["lr"] * (m / (v.sqrt() + group["eps"]) + group["weight_decay"] * p))


def fit_flow(x, epochs=1, batch_size=64, lr=1e-3, weight_decay=0.01, clip=0.5, seed=0, log=None, log_every=50,
             max_steps=0, init="data", optimizer="adamw", levels=3, depth=3, width=32):
    """Fit a Glow to the vectors x (n, H) by maximum likelihood: a constant lr, weight decay, global-norm clipping
    (the code's flow optimiser; optimizer "adamw" = torch's AdamW, "bert" = the code's BertAdam), betas 0.9/0.999,
    eps 1e-6, full shuffled batches (the code drops the remainder), `epochs` passes or `max_steps` (0 = no limit),
    whichever ends first. The Glow's init and the order come from `seed`; the global RNG is left as it was.
    The code's loss is mean(side a) + mean(side b) over 32 pairs = 2 x our mean over 64, so its clip 1.0
    (optimization_bert_flow.py, clip_by_global_norm) is our clip 0.5, the default (Adam itself does not see the factor).
    -> (the Glow in eval mode, {"steps", "losses": [[step, nll bits/dim]], "seconds"})."""
    x = torch.as_tensor(x).float()
    if x.ndim != 2 or not torch.isfinite(x).all():
        raise ValueError(f"the flow takes finite (n, H) sentence vectors, got shape {tuple(x.shape)} or NaN/inf")
    n, H = x.shape
    if not 2 <= batch_size <= n:
        raise ValueError(f"the flow's batch is {batch_size} vectors and there are {n}: give 2..{n}")
    if optimizer not in ("adamw", "bert"):
        raise ValueError(f"optimizer {optimizer!r}: give 'adamw' or 'bert'")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        flow = Glow(H, levels, depth, width, init).to(x.device)
    gen = torch.Generator().manual_seed(seed)
    opt = (torch.optim.AdamW if optimizer == "adamw" else BertAdam)(
        flow.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.999), eps=1e-6)
    total = epochs * (n // batch_size) if not max_steps else min(max_steps, epochs * (n // batch_size))
    if total < 1:  # (!!) an unfitted init='data' flow would initialise its actnorms on whatever batch it sees first
        raise ValueError(f"the flow would take no step: epochs {epochs}, max_steps {max_steps}")
    step, losses, t0 = 0, [], time.perf_counter()
    t_log, last = t0, 0
    while step < total:
        order = torch.randperm(n, generator=gen).to(x.device)
        for s in range(0, n - batch_size + 1, batch_size):
            loss = flow.nll_bits(x[order[s:s + batch_size]])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(flow.parameters(), clip)
            opt.step()
            step += 1
            if step == 1 or step % log_every == 0 or step == total:
                losses.append([step, loss.item()])  # .item(): a sync point, at log time only
                now = time.perf_counter()
                ms, t_log, last = 1000 * (now - t_log) / (step - last), now, step
                log and log(f"flow step {step}/{total} | nll {loss.item():.4f} bits/dim | norm {norm.item():.2f} | "
                            f"lr {lr:.1e} | {ms:.1f} ms/step")
            if step == total:
                break
    bad = [k for k, v in flow.state_dict().items() if not torch.isfinite(v).all()]
    if bad or not all(math.isfinite(l) for _, l in losses):
        raise ValueError(f"the flow diverged: non-finite {', '.join(bad[:2]) or 'loss'} after {step} steps at lr "
                         f"{lr:g}; lower the lr")
    return flow.eval(), {"steps": step, "losses": losses, "seconds": time.perf_counter() - t0}

# -----------------------------------------------------------------------------
# a fitted map, back from a checkpoint


def make_transform(info, tensors):
    """The fitted map a checkpoint records (metadata 'transform', its tensors without the prefix) as a function of the
    pooled vectors, numpy (n, H) -> (n, K) float32."""
    if info.get("kind") == "whitening":
        shapes = {k: tuple(v.shape) for k, v in tensors.items()}
        mu, W = tensors.get("mu"), tensors.get("W")
        if set(shapes) != {"mu", "W"} or mu.ndim != 1 or W.ndim != 2 or W.shape[0] != len(mu) \
                or W.shape[1] != info.get("dim", W.shape[1]):
            raise ValueError(f"tensors {shapes}, not mu (H,) and W (H, {info.get('dim', 'K')})")
        return lambda x: whiten(torch.from_numpy(x), mu, W).float().numpy()
    if info.get("kind") == "flow":
        flow = Glow.from_config(info["config"])
        flow.load_state_dict(tensors)
        flow.eval()

        @torch.no_grad()
        def apply(x):
            return flow(torch.from_numpy(x).float())[0].numpy()
        return apply
    raise ValueError(f"unknown transform kind {info.get('kind')!r} (this sgbert knows whitening and flow)")


def check_transform(ck):
    """A fitted transform's tensors (metadata 'transform') of what checkpoint.load read, against the model's width H,
    its hidden_size: a LoadError naming file and key, not a shape error at the first encoding or a wrong-width Dense
    in an export. transform_of names missing ones; a header-only read checks nothing."""
    info, config, p = ck.meta.get("transform"), ck.config, checkpoint.TRANSFORM_PREFIX
    H = config.get("hidden_size") if isinstance(config, dict) else None
    if not ck.tensors or not info or not isinstance(H, int):
        return
    if info.get("kind") == "whitening":
        for k, want in (("mu", [H]), ("W", [H, info.get("dim")])):
            got = list(ck.tensors[p + k].shape) if p + k in ck.tensors else None
            if got is not None and (len(got) != len(want) or any(w not in (None, g) for g, w in zip(got, want))):
                want = ", ".join(str(w or "K") for w in want)
                raise checkpoint.LoadError(
                    f"{ck.path}: its whitening (metadata 'transform') cannot be rebuilt: tensor '{p}{k}' has shape "
                    f"{got}, not [{want}] (H {H}: metadata 'config' hidden_size; K: metadata 'transform' dim); fit "
                    "it again: python -m lab.train --loss whitening")
    flow = info.get("config") if info.get("kind") == "flow" and isinstance(info.get("config"), dict) else {}
    if flow.get("dim", H) != H:
        raise checkpoint.LoadError(
            f"{ck.path}: its flow (metadata 'transform') cannot be rebuilt: it maps {flow['dim']} dimensions, the "
            f"model's vectors have {H} (metadata 'config' hidden_size); fit it again: python -m lab.train --loss flow")


def transform_of(ck, hidden_size):
    """The fitted transform of what checkpoint.load read (None when it records none), rebuilt from its tensors and
    tried on one vector of the model's width: a checkpoint.LoadError that names the file if it cannot be."""
    check_transform(ck)
    info, p = ck.meta.get("transform"), checkpoint.TRANSFORM_PREFIX
    if not info:
        return None
    tensors = {k[len(p):]: v for k, v in ck.tensors.items() if k.startswith(p)}
    try:
        if not all(torch.isfinite(v).all() for v in tensors.values()):
            raise ValueError("its tensors hold NaN or inf")
        transform = make_transform(info, tensors)
        transform(np.zeros((1, hidden_size), np.float32))  # it takes the model's H-dim vectors
        return transform
    except (KeyError, RuntimeError, ValueError, TypeError, AttributeError) as e:
        raise checkpoint.LoadError(f"{ck.path}: its {info.get('kind')} transform (metadata 'transform', tensors {p}*) "
                                   f"cannot be rebuilt ({e}); was it written by this version of train.py?") from None
