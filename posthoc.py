"""
Post-hoc maps of sentence vectors, fitted on unlabelled sentences with BERT left as it is: the baselines SG-BERT
measures itself against (Table 1, Figure 4). train.py --loss whitening | flow fits them; evaluate.py applies them.

Whitening (Su et al. 2021; bojone/BERT-whitening, compute_kernel_bias): mu = the mean, Sigma = the covariance (ddof 1),
U S U^T = SVD(Sigma), W = U diag(1 / sqrt(S)); y = (x - mu) W[:, :K]. In float64.

BERT-flow (Li et al., EMNLP 2020; bohanli/BERT-flow, flow/glow_1x1.py, config l3_d3_w32, the code's default): a Glow
on the H-dim sentence vector (1 x 1 spatial): 3 levels of depth 3; a step is actnorm -> a fixed channel reversal ->
additive coupling (second half += NN(first half); NN = linear, actnorm, ReLU, linear, actnorm, ReLU, a zero-initialised
linear scaled by exp(3 logs)); after each level but the last, the second half of the channels leaves under a fixed
N(0, I) prior. z = [the halves that left, in order, then the top] is the sentence vector. The loss is the negative
log-likelihood in bits per dimension, -(log|det| + log N(z; 0, I)) / (H ln 2); only actnorm has a log-determinant.
"""
import math
import time

import torch
import torch.nn as nn

# -----------------------------------------------------------------------------
# whitening


def fit_whitening(x, dim=None):
    """x (n, H) sentence vectors (numpy or torch) -> mu (H,), W (H, K) float64 tensors; K = dim or H."""
    x = torch.as_tensor(x).double()
    n, H = x.shape
    if n < 2:
        raise ValueError(f"whitening needs at least 2 sentence vectors, got {n}")
    if not torch.isfinite(x).all():
        raise ValueError("whitening: the sentence vectors hold NaN or inf")
    K = H if dim is None else dim
    if not 1 <= K <= H:
        raise ValueError(f"whitening dimension {K}: give 1..{H}")
    mu = x.mean(0)
    U, S, _ = torch.linalg.svd(torch.cov(x.T))  # torch.cov: ddof 1, as np.cov
    return mu, (U / S.sqrt())[:, :K]  # U diag(1/sqrt(S)): column j of U divided by sqrt(S_j)


def whiten(x, mu, W):
    """(x - mu) W, in float64: (n, H) -> (n, K)."""
    return (torch.as_tensor(x).double() - mu.double()) @ W.double()

# -----------------------------------------------------------------------------
# BERT-flow's Glow


class ActNorm(nn.Module):
    """y = (x + b) * exp(3 logs) per channel; log|det| = sum 3 logs. Data-dependent init (Glow's): on the first batch
    it sees, b and logs are set so that batch comes out with zero mean and unit variance per channel."""

    def __init__(self, C, ddi=True):
        super().__init__()
        self.b, self.logs = nn.Parameter(torch.zeros(C)), nn.Parameter(torch.zeros(C))
        self.register_buffer("initialized", torch.tensor(0.0 if ddi else 1.0))  # a float: checkpoints hold floats

    def forward(self, x):
        if not self.initialized:
            with torch.no_grad():
                self.b.copy_(-x.mean(0))
                self.logs.copy_(torch.log(1 / (x.std(0, unbiased=False) + 1e-6)) / 3)
                self.initialized.fill_(1.0)
        return (x + self.b) * torch.exp(3 * self.logs), 3 * self.logs.sum()

    def inverse(self, y):
        return y * torch.exp(-3 * self.logs) - self.b


class ShiftNet(nn.Module):
    """The additive coupling's NN: linear (no bias), actnorm, ReLU, twice, then a zero-initialised linear whose
    output is scaled by exp(3 logs) (Glow's conv2d_zeros): the coupling starts as the identity."""

    def __init__(self, c_in, c_out, width, ddi=True):
        super().__init__()
        self.l1, self.n1 = nn.Linear(c_in, width, bias=False), ActNorm(width, ddi)
        self.l2, self.n2 = nn.Linear(width, width, bias=False), ActNorm(width, ddi)
        for lin in (self.l1, self.l2):
            nn.init.normal_(lin.weight, std=0.05)  # Glow's default_initializer
        self.out = nn.Linear(width, c_out)
        nn.init.zeros_(self.out.weight), nn.init.zeros_(self.out.bias)
        self.logs = nn.Parameter(torch.zeros(c_out))

    def forward(self, x):
        h = torch.relu(self.n1(self.l1(x))[0])
        h = torch.relu(self.n2(self.l2(h))[0])
        return self.out(h) * torch.exp(3 * self.logs)


class FlowStep(nn.Module):
    """actnorm -> reverse the channels -> second half += NN(first half)."""

    def __init__(self, C, width, ddi=True):
        super().__init__()
        self.norm, self.half = ActNorm(C, ddi), C // 2
        self.shift = ShiftNet(self.half, C - self.half, width, ddi)

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
    second half of the channels leaves (scored under N(0, I) by nll_bits)."""

    def __init__(self, dim, levels=3, depth=3, width=32, ddi=True):
        super().__init__()
        self.dim, self.levels, self.depth, self.width = dim, levels, depth, width
        sizes = [dim]
        for _ in range(levels - 1):
            sizes.append(sizes[-1] // 2)  # the first half stays
        if sizes[-1] < 2:
            raise ValueError(f"a Glow of {levels} levels needs at least {2 ** levels} dimensions, not {dim}")
        self.sizes = sizes
        self.steps = nn.ModuleList(nn.ModuleList(FlowStep(C, width, ddi) for _ in range(depth)) for C in sizes)

    def config(self):
        return {"dim": self.dim, "levels": self.levels, "depth": self.depth, "width": self.width}

    @classmethod
    def from_config(cls, config):
        return cls(**config, ddi=False)  # the loaded state sets every actnorm

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
        return torch.cat([*out, x], 1), logdet.expand(x.shape[0])

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


def fit_flow(x, epochs=1, batch_size=64, lr=1e-3, weight_decay=0.01, seed=0, max_steps=0, clip=1.0, log=None,
             log_every=50):
    """Fit a Glow to the vectors x (n, H) by maximum likelihood: AdamW at a constant lr (the code's flow optimiser:
    weight decay 0.01, global-norm clipping 1.0), shuffled full batches (the code drops the remainder). The first
    batch initialises the actnorms. -> (the Glow in eval mode, {"steps", "losses": [[step, nll bits]], "seconds"})."""
    x = torch.as_tensor(x).float()
    n, H = x.shape
    if n < batch_size:
        raise ValueError(f"the flow's batch is {batch_size} vectors but there are only {n}")
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    flow = Glow(H)
    opt = torch.optim.AdamW(flow.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.999), eps=1e-6)
    step, losses, t0 = 0, [], time.perf_counter()
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen)
        for s in range(0, n - batch_size + 1, batch_size):
            loss = flow.nll_bits(x[order[s:s + batch_size]])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(flow.parameters(), clip)
            opt.step()
            step += 1
            if step == 1 or step % log_every == 0:
                losses.append([step, loss.item()])
                log and log(f"flow step {step} | nll {loss.item():.4f} bits/dim")
            if step == max_steps:
                break
        if step == max_steps:
            break
    return flow.eval(), {"steps": step, "losses": losses, "seconds": time.perf_counter() - t0}
