"""posthoc.py against its oracles: whitening vs numpy's formula and its defining property; the Glow's inverse, its
log-determinant vs autograd's Jacobian, its NLL vs N(0, I)'s, its fit on Gaussian data of a known covariance; the
code's optimiser vs its update written out."""
import math

import numpy as np
import pytest
import torch

from lab import posthoc


def randomised(flow, seed=0, scale=0.1):
    """Every parameter moved off its init (zero-init couplings would make the flow trivially invertible). 0.1: big
    enough to make z far from x, small enough that 9 stacked exp(3 logs) keep float32 well conditioned."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return flow.eval()


def gaussian(n, seed=0, dim=8):
    """n draws of N(m, A A^T), A lower-triangular + 2 I (scales ~1..5, correlations up to ~0.6), and the law."""
    g = torch.Generator().manual_seed(seed)
    A = torch.tril(torch.randn(dim, dim, generator=g)) + 2 * torch.eye(dim)
    m = 3 * torch.randn(dim, generator=g)
    return torch.randn(n, dim, generator=g) @ A.T + m, torch.distributions.MultivariateNormal(m, A @ A.T)


def test_whitening_equals_the_formula_and_whitens():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 6)) @ rng.normal(size=(6, 6)) + 3.0
    mu, W = posthoc.fit_whitening(x)
    assert mu.dtype == W.dtype == torch.float64 and W.shape == (6, 6)
    U, S, _ = np.linalg.svd(np.cov(x.T))  # bojone/BERT-whitening compute_kernel_bias
    want_W = U @ np.diag(1 / np.sqrt(S))
    np.testing.assert_allclose(mu.numpy(), x.mean(0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.abs(W.numpy()), np.abs(want_W), rtol=1e-9)  # (an SVD's signs are its own)
    y = posthoc.whiten(x, mu, W).numpy()
    np.testing.assert_allclose(np.cov(y.T), np.eye(6), atol=1e-9)
    np.testing.assert_allclose(y.mean(0), 0, atol=1e-9)
    _, W2 = posthoc.fit_whitening(torch.from_numpy(x).float(), dim=2)  # torch float32 in, float64 out
    assert W2.dtype == torch.float64 and W2.shape == (6, 2)
    np.testing.assert_allclose(posthoc.whiten(x, mu, W2).numpy(), y[:, :2], atol=1e-5)  # the top-2 directions


def test_whitening_refuses_bad_input():
    x = np.ones((5, 4)) + np.arange(20).reshape(5, 4) ** 2
    for dim in (0, 5):
        with pytest.raises(ValueError, match="dimension"):
            posthoc.fit_whitening(x, dim)
    with pytest.raises(ValueError, match="at least 2"):
        posthoc.fit_whitening(x[:1])
    with pytest.raises(ValueError, match="NaN"):
        posthoc.fit_whitening(np.full((5, 4), np.nan))
    with pytest.raises(ValueError, match="shape"):
        posthoc.fit_whitening(x[0])


def test_whitening_refuses_fewer_distinct_vectors_than_dimensions():
    """One sentence repeated (or n <= K distinct ones) spans too few directions: the code's W would reach ~1e8."""
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="distinct"):
        posthoc.fit_whitening(np.repeat(rng.normal(size=(1, 4)), 50, 0))
    x = np.repeat(rng.normal(size=(3, 4)), 10, 0)  # 3 distinct vectors: 2 directions
    with pytest.raises(ValueError, match="distinct"):
        posthoc.fit_whitening(x)
    mu, W = posthoc.fit_whitening(x, dim=2)
    assert torch.isfinite(W).all() and W.abs().max() < 1e3


@pytest.mark.parametrize("dim", [8, 13])  # 13: odd halves at every level
def test_flow_round_trip(dim):
    flow = randomised(posthoc.Glow(dim, init="identity"), seed=dim)
    x = torch.randn(16, dim, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        z, _ = flow(x)
        assert z.shape == x.shape and (z - x).abs().max() > 1  # the test can fail
        torch.testing.assert_close(flow.inverse(z), x, rtol=1e-5, atol=1e-5)  # z -> x (x -> z -> x)
        torch.testing.assert_close(flow(flow.inverse(z))[0], z, rtol=1e-5, atol=1e-5)  # x -> z (z -> x -> z)
        flow.double()
        z64 = flow(x.double())[0]
        torch.testing.assert_close(flow.inverse(z64), x.double(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dim", [8, 9])
def test_flow_logdet_equals_autograd_jacobian(dim):
    flow = randomised(posthoc.Glow(dim, init="identity"), seed=1).double()
    for x in torch.randn(3, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(2)):
        J = torch.autograd.functional.jacobian(lambda v: flow(v[None])[0][0], x)  # (dim, dim), one sample
        _, logdet = flow(x[None])
        assert abs(torch.linalg.slogdet(J).logabsdet.item() - logdet.item()) < 1e-8
        assert abs(logdet.item()) > 0.1  # the actnorms' log-scales are not all zero


def test_flow_nll_is_bits_per_dim_of_a_gaussian():
    """A fresh flow with identity actnorms is a fixed permutation of the channels (the reversals, the splits): its NLL
    is N(0, I)'s (with the -1/2 log 2 pi), in bits per dimension."""
    flow = posthoc.Glow(8, init="identity")
    x = torch.randn(32, 8)
    # the code's order: each level's 3 reversals leave it reversed; the second half leaves; z = [eps_0, eps_1, top]
    assert torch.equal(flow(x)[0], x[:, [3, 2, 1, 0, 6, 7, 5, 4]])
    want = (0.5 * (x ** 2 + math.log(2 * math.pi)).sum(1) / (8 * math.log(2))).mean()
    torch.testing.assert_close(flow.nll_bits(x), want)


def test_actnorm_inits():
    """'data': the first batch leaves the first actnorm standardised, and only the first batch sets it; 'release':
    TF's glorot_uniform bound sqrt(6 / (1 + C)); 'identity': zeros. Bad init names and too few dimensions refused."""
    x = torch.randn(64, 16) * torch.arange(1, 17) + 5
    flow = posthoc.Glow(16, init="data")
    assert not any(m.initialized for m in flow.modules() if isinstance(m, posthoc.ActNorm))
    with torch.no_grad():
        flow(x)
        y, _ = flow.steps[0][0].norm(x)
        torch.testing.assert_close(y.mean(0), torch.zeros(16), atol=1e-5, rtol=0)
        torch.testing.assert_close(y.std(0, unbiased=False), torch.ones(16), atol=1e-4, rtol=0)
        before = {k: v.clone() for k, v in flow.state_dict().items()}
        flow(2 * x)
    assert all(torch.equal(before[k], v) for k, v in flow.state_dict().items())
    assert all(m.initialized for m in flow.modules() if isinstance(m, posthoc.ActNorm))
    torch.manual_seed(0)
    norm = posthoc.Glow(16, init="release").steps[0][0].norm
    a = math.sqrt(6 / 17)
    assert norm.initialized and 0.5 * a < norm.logs.abs().max() <= a and 0.5 * a < norm.b.abs().max() <= a
    assert not posthoc.Glow(16, init="identity").steps[1][2].norm.logs.any()
    with pytest.raises(ValueError, match="init"):
        posthoc.Glow(16, init="ddi")
    with pytest.raises(ValueError, match="at least 8"):
        posthoc.Glow(7)


def test_fitted_flow_whitens_gaussian_data():
    """Data of a known non-identity covariance: the fitted flow's z is near N(0, I), its NLL falls to near the true
    law's on held-out draws. Full batches at a low lr: constant-lr Adam on small batches leaves z's covariance ~0.2
    off identity (step noise), which would make a loose test."""
    x, law = gaussian(2048)
    held_out = law.sample((4096,))
    flow, stats = posthoc.fit_flow(x, epochs=150, batch_size=2048, lr=3e-3, seed=0)
    losses = [loss for _, loss in stats["losses"]]
    assert stats["steps"] == 150 and stats["losses"][-1][0] == 150
    true_bits = -law.log_prob(held_out).mean().item() / (8 * math.log(2))
    with torch.no_grad():
        z, held_bits = flow(x)[0], flow.nll_bits(held_out).item()
    assert losses[0] > true_bits + 0.2 and losses[-1] < losses[0] - 0.3  # the NLL falls ...
    assert held_bits < true_bits + 0.1, (held_bits, true_bits)  # ... to near the law's (it cannot go below on average)
    assert (torch.cov(x.T) - torch.eye(8)).abs().max() > 1  # far from N(0, I) before
    assert (torch.corrcoef(x.T) - torch.eye(8)).abs().max() > 0.5  # correlated: per-channel actnorm cannot do it alone
    assert (torch.cov(z.T) - torch.eye(8)).abs().max() < 0.1
    assert z.mean(0).abs().max() < 0.3


def test_fit_flow_release_init_and_code_optimiser_train():
    """The TF release's starting point with the code's optimiser also fits (no NaN, the NLL falls)."""
    x = torch.randn(512, 16)
    flow, stats = posthoc.fit_flow(x, epochs=4, batch_size=64, init="release", optimizer="bert", seed=1, log_every=8)
    losses = [loss for _, loss in stats["losses"]]
    assert stats["steps"] == 32 and all(math.isfinite(v) for v in losses) and losses[-1] < losses[0] - 0.5


def test_bert_adam_is_adam_without_bias_correction():
    """google-research/bert's AdamWeightDecayOptimizer, written out: m, v without bias correction, decay lr*wd*p."""
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
    opt = posthoc.BertAdam([p], lr=0.1, weight_decay=0.01)
    m, v, want = torch.zeros(3), torch.zeros(3), p.detach().clone()
    for g in (torch.tensor([0.5, -1.0, 2.0]), torch.tensor([-0.25, 3.0, 1.0])):
        p.grad = g.clone()
        opt.step()
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        want = want - 0.1 * (m / (v.sqrt() + 1e-6) + 0.01 * want)
        torch.testing.assert_close(p.detach(), want)


def test_fit_flow_refuses_bad_input():
    with pytest.raises(ValueError, match="batch"):
        posthoc.fit_flow(torch.randn(10, 8), batch_size=64)
    with pytest.raises(ValueError, match="NaN"):
        posthoc.fit_flow(torch.full((100, 8), float("nan")), batch_size=10)
    with pytest.raises(ValueError, match="no step"):
        posthoc.fit_flow(torch.randn(100, 8), batch_size=10, epochs=0)
    with pytest.raises(ValueError, match="optimizer"):
        posthoc.fit_flow(torch.randn(100, 8), batch_size=10, optimizer="sgd")
    with pytest.raises(ValueError, match="diverged"):  # a huge lr: NaN weights are never returned
        posthoc.fit_flow(torch.randn(100, 8), batch_size=10, lr=1e4)


def test_config_and_state_round_trip():
    """What a checkpoint keeps (config + state_dict, float tensors only) rebuilds the same map; the fit is a function
    of its seed and leaves the global RNG alone; the log callback sees llm.c-style lines."""
    x = torch.randn(128, 8, generator=torch.Generator().manual_seed(0))
    rng, lines = torch.random.get_rng_state(), []
    flow, stats = posthoc.fit_flow(x, batch_size=32, seed=3, log=lines.append, log_every=2)
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert len(lines) == 3 and lines[-1].startswith("flow step 4/4 | nll ")
    again = posthoc.Glow.from_config(flow.config())
    again.load_state_dict(flow.state_dict())
    assert all(t.is_floating_point() for t in flow.state_dict().values())  # checkpoints hold floats
    assert sum(k.endswith("initialized") for k in flow.state_dict()) == 3 * 3 * 3  # 3 actnorms a step, 9 steps
    twin, _ = posthoc.fit_flow(x, batch_size=32, seed=3)
    other, _ = posthoc.fit_flow(x, batch_size=32, seed=4)
    v = torch.randn(5, 8)
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(v)[0], flow(v)[0], rtol=0, atol=0)
        torch.testing.assert_close(twin(v)[0], flow(v)[0], rtol=0, atol=0)
        assert not torch.allclose(other(v)[0], flow(v)[0])


def test_fit_flow_clips_as_the_code():
    """BERT-flow's loss is the sum of its two sides' means over 32 pairs (2 x our mean over the 64 vectors), clipped at
    global norm 1.0 (optimization_bert_flow.py): fit_flow's default clip is the same clip on our mean, so the clipped
    gradients are the code's over 2, whatever their norm (and Adam's step does not see the factor but through eps)."""
    import inspect
    clip = inspect.signature(posthoc.fit_flow).parameters["clip"].default
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0)) * 3 + 1
    for scale in (1.0, 0.05, 20.0):  # gradient norms below, between and above the two clips
        grads = []
        for loss_of, c in ((lambda f: f.nll_bits(scale * x), clip),
                           (lambda f: f.nll_bits(scale * x[:32]) + f.nll_bits(scale * x[32:]), 1.0)):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                flow = posthoc.Glow(8)
            with torch.no_grad():
                flow(x)  # the actnorms set on the same batch
            loss_of(flow).backward()
            torch.nn.utils.clip_grad_norm_(flow.parameters(), c)
            grads.append(torch.cat([p.grad.flatten() for p in flow.parameters()]))
        torch.testing.assert_close(grads[1], 2 * grads[0], rtol=1e-4, atol=1e-6)
