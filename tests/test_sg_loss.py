"""sg_loss.py against oracles written straight from the paper's equations (section 3), in float64 with loops.

phi(u, v) = exp(cos(u, v) / tau) is evaluated directly (no log-space tricks): in float64 exp(1/0.01) = 2.7e43 is
still far from overflow. The oracles loop over the anchors in Python; the sum over the negatives of one anchor is
a torch sum of phi over the rows of a matrix, which keeps the b = 37, L = 25 grid point fast.
"""
import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from sg_loss import ProjectionHead, add_weight_distance_grad_, nt_xent, opt1, opt2, sg_opt, weight_distance

BS, LS, PS, TAUS = [1, 2, 16, 37], [1, 7, 13, 25], [8, 64], [0.01, 0.05, 1.0]


def phi(u, V, tau):
    """phi(u, v) = exp(cos(u, v) / tau) for a vector v, or for every row v of a matrix V."""
    return torch.exp(V @ u / (V.norm(dim=-1) * u.norm()) / tau)


def sg_opt_oracle(c, h, tau):
    b, L, p = h.shape
    total = 0.0
    for i in range(b):
        neg = phi(c[i], torch.cat([h[:i], h[i + 1:]]).reshape(-1, p), tau).sum()  # sum over m != i and all n
        pos = phi(c[i], h[i], tau)  # (L,): phi(c_i, h_ik) for k = 0..L-1
        total = total - torch.log(pos / (pos + neg)).sum()  # the L terms of sentence i
    return total / (b * L)


def nt_xent_oracle(c, h, tau):
    b = c.shape[0]
    X = torch.cat([c, h])  # x_m = c_m for m < b, h_{m-b} after
    total = 0.0
    for m in range(2 * b):
        mu = m + b if m < b else m - b
        den = phi(X[m], torch.cat([X[:m], X[m + 1:]]), tau).sum()  # n != m
        total = total - torch.log(phi(X[m], X[mu], tau) / den)
    return total / (2 * b)


def opt1_oracle(c, h, tau):
    b = c.shape[0]
    total = 0.0
    for i in range(b):
        den = phi(c[i], torch.cat([c[:i], c[i + 1:]]), tau).sum() + phi(c[i], h, tau).sum()
        total = total - torch.log(phi(c[i], h[i], tau) / den)
    return total / b


def opt2_oracle(c, h, tau):
    b = c.shape[0]
    total = 0.0
    for i in range(b):
        total = total - torch.log(phi(c[i], h[i], tau) / phi(c[i], h, tau).sum())
    return total / b


def inputs(b, L, p, seed=0, corr=0.8):
    """c (b, p) and h (b, L, p) in float64, h correlated with c so the positives matter."""
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(b, p, generator=g, dtype=torch.float64)
    h = corr * c[:, None] + torch.randn(b, L, p, generator=g, dtype=torch.float64)
    return c, h


def value_and_grads(fn, c, h, tau):
    c, h = c.clone().requires_grad_(), h.clone().requires_grad_()
    loss = fn(c, h, tau)
    loss.backward()
    return loss.detach(), c.grad, h.grad


def assert_agree(ours, ref):
    for a, r in zip(ours, ref):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, r, rtol=1e-6, atol=1e-6 * r.abs().max().item() + 1e-12)


@pytest.mark.parametrize("tau", TAUS)
@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("L", LS)
@pytest.mark.parametrize("b", BS)
def test_sg_opt_matches_oracle(b, L, p, tau):
    c, h = inputs(b, L, p)
    ours = value_and_grads(sg_opt, c, h, tau)
    assert ours[0].dtype == torch.float64
    assert_agree(ours, value_and_grads(sg_opt_oracle, c, h, tau))


@pytest.mark.parametrize("tau", TAUS)
@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("b", BS)
@pytest.mark.parametrize("fn,oracle", [(nt_xent, nt_xent_oracle), (opt1, opt1_oracle), (opt2, opt2_oracle)],
                         ids=["nt_xent", "opt1", "opt2"])
def test_pair_losses_match_oracle(fn, oracle, b, p, tau):
    c, h = inputs(b, 1, p)
    h = h[:, 0]
    assert_agree(value_and_grads(fn, c, h, tau), value_and_grads(oracle, c, h, tau))


def test_sg_opt_single_sentence_is_zero_with_zero_grad():
    c, h = inputs(1, 13, 64)
    for tau in TAUS:
        loss, gc, gh = value_and_grads(sg_opt, c.float(), h.float(), tau)
        assert loss.item() == 0.0
        assert torch.isfinite(gc).all() and torch.isfinite(gh).all() and gc.abs().max() < 1e-6 and gh.abs().max() < 1e-6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fn", [sg_opt, nt_xent, opt1, opt2], ids=lambda f: f.__name__)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_half_inputs_at_tau_001(fn, dtype, seed):
    # logits up to +-100: finite, and within 1e-2 (relative once the loss is above 1) of the fp32 inputs' loss
    c, h = inputs(16, 13, 64, seed=seed, corr=0.3)
    c, h = c.float(), (h if fn is sg_opt else h[:, 0]).float()
    ref = fn(c, h, 0.01).item()
    loss, gc, gh = value_and_grads(fn, c.to(dtype), h.to(dtype), 0.01)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert gc.dtype == dtype and torch.isfinite(gc).all() and torch.isfinite(gh).all()
    assert abs(loss.item() - ref) <= 1e-2 * max(1.0, abs(ref)), (loss.item(), ref)


def orthogonal_batch(b, L, p, dtype=torch.float64):
    """c_i = h_ik = 2.5 e_i: cos = 1 with every view of the own sentence, 0 with everything of the others."""
    c = 2.5 * torch.eye(b, p, dtype=dtype)
    return c, c[:, None].expand(b, L, p).contiguous()


@pytest.mark.parametrize("tau", TAUS)
@pytest.mark.parametrize("b,L", [(1, 1), (2, 7), (16, 13), (37, 25)])
def test_orthogonal_batch_analytic(b, L, tau):
    # each loss is -1/tau + log(exp(1/tau) + N) = log1p(N exp(-1/tau)), N = number of orthogonal (phi = 1) terms
    want = lambda N: math.log1p(N * math.exp(-1 / tau))
    c, h = orthogonal_batch(b, L, 64)
    kw = dict(rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(sg_opt(c, h, tau).item(), want((b - 1) * L), **kw)
    torch.testing.assert_close(nt_xent(c, h[:, 0], tau).item(), want(2 * (b - 1)), **kw)  # other c_j and h_j
    torch.testing.assert_close(opt1(c, h[:, 0], tau).item(), want(2 * (b - 1)), **kw)
    torch.testing.assert_close(opt2(c, h[:, 0], tau).item(), want(b - 1), **kw)
    torch.testing.assert_close(sg_opt(c.float(), h.float(), tau).item(), want((b - 1) * L), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tau", TAUS)
def test_identical_batch_analytic(tau, dtype):
    # every cos is 1: each term is log(number of terms in the denominator), whatever tau (logits 1/tau = 100 at 0.01)
    b, L, p = 5, 13, 8
    c = torch.ones(b, p, dtype=dtype)
    h = torch.ones(b, L, p, dtype=dtype)
    kw = dict(rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(sg_opt(c, h, tau).item(), math.log(1 + (b - 1) * L), **kw)
    torch.testing.assert_close(nt_xent(c, h[:, 0], tau).item(), math.log(2 * b - 1), **kw)
    torch.testing.assert_close(opt1(c, h[:, 0], tau).item(), math.log(2 * b - 1), **kw)
    torch.testing.assert_close(opt2(c, h[:, 0], tau).item(), math.log(b), **kw)


def test_shape_and_tau_asserts():
    c, h = torch.randn(4, 8), torch.randn(4, 3, 8)
    with pytest.raises(AssertionError, match="does not match h"):
        sg_opt(c[:3], h, 0.05)
    with pytest.raises(AssertionError, match="does not match h"):
        sg_opt(c[:, :4], h, 0.05)
    with pytest.raises(AssertionError, match=r"c \(b, p\) and h \(b, L, p\)"):
        sg_opt(c, h[:, 0], 0.05)
    with pytest.raises(AssertionError, match="tau must be > 0"):
        sg_opt(c, h, 0.0)
    for fn in (nt_xent, opt1, opt2):
        with pytest.raises(AssertionError, match="same shape"):
            fn(c[:3], h[:, 0], 0.05)
        with pytest.raises(AssertionError, match="tau must be > 0"):
            fn(c, h[:, 0], -1.0)


def small_pair(dtype=torch.float64):
    torch.manual_seed(0)
    fixed = nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5), nn.Linear(5, 3)).to(dtype).requires_grad_(False)
    tuned = copy.deepcopy(fixed).requires_grad_(True)
    with torch.no_grad():
        for t in tuned.parameters():
            t.add_(0.1 * torch.randn_like(t))
    return tuned, fixed


def test_weight_distance_matches_loop():
    tuned, fixed = small_pair()
    want = sum(((t - f) ** 2).sum() for t, f in zip(tuned.parameters(), fixed.parameters()))
    got = weight_distance(tuned, fixed)
    torch.testing.assert_close(got, want.detach(), rtol=1e-12, atol=0)
    torch.testing.assert_close(weight_distance(list(tuned.parameters()), fixed.parameters()), got)  # iterables
    t32, f32 = small_pair(torch.float32)
    assert weight_distance(t32, f32).dtype == torch.float32
    got.backward()  # d/d theta_T = 2 (theta_T - theta_F)
    for t, f in zip(tuned.parameters(), fixed.parameters()):
        torch.testing.assert_close(t.grad, 2 * (t - f).detach(), rtol=1e-12, atol=1e-15)
    same = copy.deepcopy(fixed).requires_grad_(True)  # at step 0, theta_T == theta_F: value 0, gradient 0 (not NaN)
    weight_distance(same, fixed).backward()
    assert all(torch.equal(t.grad, torch.zeros_like(t)) for t in same.parameters())


def test_weight_distance_asserts():
    tuned, fixed = small_pair()
    with pytest.raises(AssertionError, match="parameter 0"):
        weight_distance([torch.zeros(2, 3)], [torch.zeros(3, 2)])
    with pytest.raises(AssertionError, match="same non-zero number"):
        weight_distance(list(tuned.parameters())[:-1], fixed.parameters())


def test_grad_form_gives_the_same_adamw_update():
    lam = 0.7
    x, y = torch.randn(16, 6, dtype=torch.float64), torch.randn(16, 3, dtype=torch.float64)
    forward = lambda m: m[2](m[0](x).tanh())  # the LayerNorm m[1] is not used: its bias gets only the penalty
    tuned_a, fixed = small_pair()
    tuned_b = copy.deepcopy(tuned_a)
    tuned_a[1].weight.requires_grad_(False)  # a frozen parameter is skipped by both
    tuned_b[1].weight.requires_grad_(False)
    opt_a = torch.optim.AdamW([t for t in tuned_a.parameters() if t.requires_grad], lr=1e-2, weight_decay=0.01)
    opt_b = torch.optim.AdamW([t for t in tuned_b.parameters() if t.requires_grad], lr=1e-2, weight_decay=0.01)
    for step in range(5):
        opt_a.zero_grad(set_to_none=True)
        opt_b.zero_grad(set_to_none=True)
        # a: backward through lam * weight_distance
        loss_a = F.mse_loss(forward(tuned_a), y) + lam * weight_distance(tuned_a, fixed)
        loss_a.backward()
        # b: backward through the data loss only, then add the penalty's gradient in place
        loss_b = F.mse_loss(forward(tuned_b), y)
        loss_b.backward()
        assert tuned_b[1].bias.grad is None  # unused by the data loss: its .grad gets created
        penalty = add_weight_distance_grad_(tuned_b, fixed, lam)
        frozen = lam * (tuned_b[1].weight - fixed[1].weight).square().sum()  # a constant, left out of penalty
        assert frozen > 0
        torch.testing.assert_close(loss_b + penalty + frozen, loss_a.detach(), rtol=1e-12, atol=0)
        assert tuned_b[1].weight.grad is None
        for a, b in zip(tuned_a.parameters(), tuned_b.parameters()):
            if a.requires_grad:
                torch.testing.assert_close(b.grad, a.grad, rtol=1e-12, atol=1e-15)
        opt_a.step()
        opt_b.step()
        for a, b in zip(tuned_a.parameters(), tuned_b.parameters()):
            torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-15)


def test_projection_head_layout_and_init():
    torch.manual_seed(0)
    f = ProjectionHead(384, 4096)
    kinds = [type(m) for m in f.net]
    assert kinds == [nn.Linear, nn.GELU, nn.Linear, nn.GELU]
    assert f.net[1].approximate == "none" and f.net[3].approximate == "none"
    assert f.net[0].weight.shape == (4096, 384) and f.net[2].weight.shape == (4096, 4096)
    for lin in (f.net[0], f.net[2]):
        w = lin.weight.detach()
        assert abs(w.mean().item()) < 1e-3 and abs(w.std().item() - 0.02) < 0.02 * 0.01
        assert torch.equal(lin.bias, torch.zeros_like(lin.bias))
    assert ProjectionHead(32).net[2].weight.shape == (4096, 4096)  # proj_size defaults to 4096
    x = torch.randn(3, 5, 384)
    want = F.gelu(F.gelu(x @ f.net[0].weight.T + f.net[0].bias) @ f.net[2].weight.T + f.net[2].bias)
    torch.testing.assert_close(f(x), want)


@pytest.mark.parametrize("loss", [sg_opt, nt_xent, opt1, opt2])
@pytest.mark.parametrize("parts", [2, 4])
def test_rows_split_the_batch_exactly(loss, parts):
    """A process's share (rows) of a global batch: the mean over equal shares is the loss, and so is its gradient
    (what data-parallel training with gathered negatives relies on)."""
    torch.manual_seed(0)
    b, L, p = 8, 3, 5
    c = torch.randn(b, p, dtype=torch.float64, requires_grad=True)
    h = torch.randn(*((b, L, p) if loss is sg_opt else (b, p)), dtype=torch.float64, requires_grad=True)
    full = loss(c, h, 0.1)
    gc, gh = torch.autograd.grad(full, (c, h))
    share = b // parts
    split = sum(loss(c, h, 0.1, rows=slice(r * share, (r + 1) * share)) for r in range(parts)) / parts
    sc, sh = torch.autograd.grad(split, (c, h))
    torch.testing.assert_close(split, full, rtol=1e-12, atol=0)
    torch.testing.assert_close(sc, gc, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(sh, gh, rtol=1e-10, atol=1e-14)
