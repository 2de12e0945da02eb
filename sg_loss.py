"""The SG-BERT objectives: the projection head f, the contrastive losses, the weight regulariser.

Follows Kim, Yoo & Lee, "Self-Guided Contrastive Learning for BERT Sentence Representations",
ACL 2021 (arXiv:2106.07345), section 3, and the official code (github.com/galsang/SG-BERT) for the
head layout.
  ProjectionHead      f, applied to c and h before any loss (Linear -> GELU -> Linear -> GELU)
  nt_xent(c, h, tau)  L^base, the SG objective: NT-Xent over the 2b vectors {c_i} U {h_i}
  opt1(c, h, tau)     L^opt1: only c_i is an anchor; the c_j (j != i), all h_j in the denominator
  opt2(c, h, tau)     L^opt2: only c_i is an anchor; the c_j are dropped from the denominator
  sg_opt(c, h, tau)   L^opt3, the SG-OPT objective: c_i against its views h_ik at every layer k
  negatives=n         (opt2, sg_opt) more negatives n_m (n, p) in every anchor's denominator:
                      ESimCSE's queue (Wu et al., COLING 2022, Eq. 2), SSCL's lower layers
                      (Chen et al., ACL 2023, Eq. 5)
  weight_distance     L^reg = ||theta_T - theta_F||^2, BERT_T from BERT_F (train.py adds lam * it)

Legend: b = sentences in the batch, L = l + 1 layer views (embeddings + l layers), p = projection
size. c (b, p): BERT_T last-layer [CLS] after f. h (b, L, p): pooled BERT_F layer views after f
(or (b, p): one sampled layer). phi(u, v) = exp(cos(u, v) / tau). Every loss is a scalar mean,
without the regulariser, computed in log space (logsumexp / cross_entropy): with tau = 0.01 the
logits reach +-100 and exp(100) overflows even fp32. Inputs in bf16/fp16 are cast up, so the
similarity and softmax math is fp32 (fp64 inputs stay fp64, for the tests).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ProjectionHead(nn.Module):
    """f: Linear(hidden, proj) -> GELU -> Linear(proj, proj) -> GELU, weights N(0, 0.02), bias 0."""

    def __init__(self, hidden_size, proj_size=4096):
        super().__init__()
        # exact (erf) GELU, like HF BERT's "gelu"
        self.net = nn.Sequential(nn.Linear(hidden_size, proj_size), nn.GELU(),
                                 nn.Linear(proj_size, proj_size), nn.GELU())
        for m in self.net:
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x):  # (..., hidden) -> (..., proj)
        return self.net(x)


def _up(x):
    """Cast bf16/fp16 up to fp32 (fp32 and fp64 are kept): similarity math runs in >= fp32."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _check_pair(c, h, tau, name):
    assert c.dim() == 2 and c.shape == h.shape, (
        f"{name} wants c and h of the same shape (b, p), got c {tuple(c.shape)} and h "
        f"{tuple(h.shape)}")
    assert tau > 0, f"{name}: the temperature tau must be > 0, got {tau}"


def _anchors(b, rows, device):
    """Global indices of the anchor sentences: all b, or the slice `rows` (a process's share)."""
    return torch.arange(b, device=device)[rows if rows is not None else slice(None)]


def sg_opt(c, h, tau, rows=None, negatives=None):
    """L^opt3: mean over i, k of
    -log( phi(c_i, h_ik) / (phi(c_i, h_ik) + sum_{m != i} sum_n phi(c_i, h_mn)) ).

    c (b, p), h (b, L, p). Not in the denominator: the other c_j and sentence i's other layers.
    One (b, b*L) similarity matrix, no loop over layers and no copies of the negatives. With b = 1
    there are no negatives: loss 0, gradient 0. rows: the anchors i this process owns (a slice of
    the global batch; None: all); every loss here is the mean over its anchors' terms, so equal
    slices averaged over the processes give the mean over all of them. negatives (n, p):
    + sum_m phi(c_i, n_m) in every denominator.
    """
    assert c.dim() == 2 and h.dim() == 3, \
        f"sg_opt wants c (b, p) and h (b, L, p), got c {tuple(c.shape)} and h {tuple(h.shape)}"
    b, L, p = h.shape
    assert c.shape == (b, p), \
        f"sg_opt: c {tuple(c.shape)} does not match h {tuple(h.shape)}, want c ({b}, {p})"
    assert tau > 0, f"sg_opt: the temperature tau must be > 0, got {tau}"
    i = _anchors(b, rows, c.device)  # (r,): the anchors' sentence indices
    c = F.normalize(_up(c[i]), dim=-1)
    h = _up(h).reshape(b * L, p)  # row m*L + n is h_mn
    # cos(c_i, h_mn) = c_i . h_mn / |h_mn|: scaling sim's columns saves a normalised copy of h
    sim = (c @ h.T) / (h.norm(dim=-1).clamp_min(1e-12) * tau)  # sim: (r, b*L)
    sim = sim.view(len(i), b, L)  # sim[a, m, n] = cos(c_i, h_mn) / tau for anchor a = sentence i
    pos = sim[torch.arange(len(i), device=c.device), i]  # (r, L): pos[a, k] = cos(c_i, h_ik) / tau
    # log sum_{m != i} sum_n phi(c_i, h_mn): mask sentence i's whole block, not only the positive.
    # The fill is finite, not -inf, so that b = 1 (an empty sum) gives loss 0 and gradient 0
    own = (i[:, None] == torch.arange(b, device=c.device))[:, :, None]  # (r, b, 1)
    neg = sim.masked_fill(own, torch.finfo(sim.dtype).min).logsumexp(dim=(1, 2))  # (r,)
    if negatives is not None:  # log( that sum + sum_m phi(c_i, n_m) )
        n = _up(negatives)
        neg = torch.logaddexp(
            neg, ((c @ n.T) / (n.norm(dim=-1).clamp_min(1e-12) * tau)).logsumexp(dim=1))
    # -log(phi / (phi + negatives)), mean over r*L
    return (torch.logaddexp(pos, neg[:, None]) - pos).mean()


def nt_xent(c, h, tau, rows=None):
    """L^base: for each of the 2b vectors x_m in {c_i} U {h_i},
    -log( phi(x_m, mu(x_m)) / sum_{n != m} phi(x_m, x_n) ), mean over the 2b terms; mu pairs c_i
    with h_i. c, h (b, p). rows: anchors c_i and h_i for i in rows only."""
    _check_pair(c, h, tau, "nt_xent")
    b = c.shape[0]
    x = F.normalize(_up(torch.cat([c, h])), dim=-1)  # (2b, p): x_m = c_m for m < b, h_{m-b} after
    i = _anchors(b, rows, x.device)
    m = torch.cat([i, i + b])  # the anchors' rows in x
    sim = (x[m] @ x.T / tau)  # (2r, 2b)
    sim = sim.masked_fill(m[:, None] == torch.arange(2 * b, device=x.device),
                          float("-inf"))  # n != m
    # mu(c_i) = h_i is column b + i, mu(h_i) = c_i is column i
    return F.cross_entropy(sim, (m + b) % (2 * b))


def opt1(c, h, tau, rows=None):
    """L^opt1: mean over i of
    -log( phi(c_i, h_i) / (sum_{j != i} phi(c_i, c_j) + sum_j phi(c_i, h_j)) ).
    c, h (b, p). rows: the anchors c_i."""
    _check_pair(c, h, tau, "opt1")
    b = c.shape[0]
    c, h = F.normalize(_up(c), dim=-1), F.normalize(_up(h), dim=-1)
    i = _anchors(b, rows, c.device)
    own = i[:, None] == torch.arange(b, device=c.device)
    # (r, 2b): [h_j | c_j]
    sim = torch.cat([c[i] @ h.T, (c[i] @ c.T).masked_fill(own, float("-inf"))], dim=1) / tau
    return F.cross_entropy(sim, i)


def opt2(c, h, tau, rows=None, negatives=None):
    """L^opt2: mean over i of -log( phi(c_i, h_i) / sum_j phi(c_i, h_j) ). c, h (b, p). rows: the
    anchors c_i. negatives (n, p): + sum_m phi(c_i, n_m) in every denominator (SimCSE's InfoNCE
    with more negatives)."""
    _check_pair(c, h, tau, "opt2")
    c, h = F.normalize(_up(c), dim=-1), F.normalize(_up(h), dim=-1)
    i = _anchors(c.shape[0], rows, c.device)
    sim = c[i] @ h.T / tau  # sim: (r, b), positives at column i
    if negatives is not None:  # sim: (r, b + n)
        sim = torch.cat([sim, c[i] @ F.normalize(_up(negatives), dim=-1).T / tau], dim=1)
    return F.cross_entropy(sim, i)


def _pairs(tuned, fixed):
    """Two lists of parameters (theta_T, theta_F) from two nn.Modules or two tensor iterables."""
    if isinstance(tuned, nn.Module) and isinstance(fixed, nn.Module):
        nt, nf = [n for n, _ in tuned.named_parameters()], [n for n, _ in fixed.named_parameters()]
        assert nt == nf, f"BERT_T and BERT_F parameters differ: {sorted(set(nt) ^ set(nf))[:5]}"
    T = list(tuned.parameters() if isinstance(tuned, nn.Module) else tuned)
    Fx = list(fixed.parameters() if isinstance(fixed, nn.Module) else fixed)
    assert len(T) == len(Fx) > 0, \
        f"need the same non-zero number of parameters, got {len(T)} tuned, {len(Fx)} fixed"
    for i, (t, f) in enumerate(zip(T, Fx)):
        assert t.shape == f.shape, \
            f"parameter {i}: tuned {tuple(t.shape)} vs fixed {tuple(f.shape)}"
    return T, Fx


def _sum_sq(diffs):
    dtype = torch.float64 if any(d.dtype == torch.float64 for d in diffs) else torch.float32
    return torch.stack(torch._foreach_norm(diffs, 2, dtype=dtype)).square().sum()


def weight_distance(tuned, fixed):
    """L^reg = sum over parameter pairs of ||theta_T - theta_F||^2: a scalar, fp32 (fp64 for fp64
    weights), differentiable w.r.t. tuned."""
    T, Fx = _pairs(tuned, fixed)
    return _sum_sq(torch._foreach_sub(T, Fx))


@torch.no_grad()
def add_weight_distance_grad_(tuned, fixed, lam):
    """Add the gradient of lam * L^reg, 2 * lam * (theta_T - theta_F), to each tuned .grad, with no
    autograd graph over all the weights: the update of backward through lam * weight_distance.
    Parameters with requires_grad=False are skipped, in the gradient and in the returned penalty
    lam * L^reg (for logging): their distance is a constant (0 in train.py: BERT_T's frozen
    embeddings are BERT_F's), and skipping it saves a pass over the word embeddings every step."""
    T, Fx = _pairs(tuned, fixed)
    pairs = [(t, f) for t, f in zip(T, Fx) if t.requires_grad]
    if not pairs:
        return torch.zeros(())
    T, Fx = zip(*pairs)
    diffs = torch._foreach_sub(T, Fx)
    for t in T:
        if t.grad is None:
            t.grad = torch.zeros_like(t)
    torch._foreach_add_([t.grad for t in T], diffs, alpha=2 * lam)
    return lam * _sum_sq(diffs)
