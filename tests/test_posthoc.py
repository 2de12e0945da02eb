"""posthoc.py against its oracles: whitening vs numpy's formula and its defining property; the Glow's inverse, its
log-determinant vs autograd's Jacobian, its fit on Gaussian data of a known covariance."""
import math

import numpy as np
import pytest
import torch

import posthoc


def randomised(flow, seed=0):
    """Every parameter moved off its init (zero-init couplings would make the flow trivially invertible)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return flow.eval()


def test_whitening_equals_the_formula_and_whitens():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 6)) @ rng.normal(size=(6, 6)) + 3.0
    mu, W = posthoc.fit_whitening(x)
    U, S, _ = np.linalg.svd(np.cov(x.T))  # bojone/BERT-whitening compute_kernel_bias
    want_W = U @ np.diag(1 / np.sqrt(S))
    np.testing.assert_allclose(mu.numpy(), x.mean(0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.abs(W.numpy()), np.abs(want_W), rtol=1e-9)  # (an SVD's signs are its own)
    y = posthoc.whiten(x, mu, W).numpy()
    np.testing.assert_allclose(np.cov(y.T), np.eye(6), atol=1e-9)
    np.testing.assert_allclose(y.mean(0), 0, atol=1e-9)
    _, W2 = posthoc.fit_whitening(x, dim=2)
    np.testing.assert_allclose(posthoc.whiten(x, mu, W2).numpy(), y[:, :2], atol=1e-9)  # the top-2 directions


def test_whitening_refuses_bad_input():
    x = np.ones((5, 4)) + np.arange(20).reshape(5, 4) ** 2
    for dim in (0, 5):
        with pytest.raises(ValueError, match="dimension"):
            posthoc.fit_whitening(x, dim)
    with pytest.raises(ValueError, match="at least 2"):
        posthoc.fit_whitening(x[:1])
    with pytest.raises(ValueError, match="NaN"):
        posthoc.fit_whitening(np.full((5, 4), np.nan))


@pytest.mark.parametrize("dim", [8, 13])  # 13: odd halves at every level
def test_flow_round_trip(dim):
    flow = randomised(posthoc.Glow(dim, ddi=False))
    x = torch.randn(16, dim, dtype=torch.float64)
    flow.double()
    z, _ = flow(x)
    assert z.shape == x.shape and not torch.allclose(z, x, atol=1e-2)
    torch.testing.assert_close(flow.inverse(z), x, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(flow(flow.inverse(z))[0], z, rtol=1e-5, atol=1e-5)


def test_flow_logdet_equals_autograd_jacobian():
    flow = randomised(posthoc.Glow(8, ddi=False), seed=1).double()
    for x in torch.randn(3, 8, dtype=torch.float64):
        J = torch.autograd.functional.jacobian(lambda v: flow(v[None])[0][0], x)
        _, logdet = flow(x[None])
        assert abs(torch.linalg.slogdet(J).logabsdet.item() - logdet.item()) < 1e-8


def test_flow_nll_is_bits_per_dim_of_a_gaussian():
    """A fresh flow with identity actnorms is the identity map: its NLL is N(0, I)'s, in bits per dimension."""
    flow = posthoc.Glow(8, ddi=False)
    x = torch.randn(32, 8)
    want = (0.5 * (x ** 2 + math.log(2 * math.pi)).sum(1) / (8 * math.log(2))).mean()
    torch.testing.assert_close(flow.nll_bits(x), want)


def test_fitted_flow_whitens_gaussian_data():
    """Data of a known non-identity covariance: the fitted flow's z is near N(0, I), and the NLL falls."""
    g = torch.Generator().manual_seed(0)
    A = torch.tril(torch.randn(8, 8, generator=g)) + 2 * torch.eye(8)
    x = torch.randn(4096, 8, generator=g) @ A.T + 3 * torch.randn(8, generator=g)
    flow, stats = posthoc.fit_flow(x, epochs=30, batch_size=256, lr=1e-2, seed=0, log_every=100)
    losses = [l for _, l in stats["losses"]]
    assert losses[-1] < losses[0] - 0.2 and stats["steps"] == 30 * 16
    with torch.no_grad():
        z = flow(x)[0]
    cov = torch.cov(z.T)
    assert (torch.cov(x.T) - torch.eye(8)).abs().max() > 1  # far from N(0, I) before
    assert (cov - torch.eye(8)).abs().max() < 0.15, cov
    assert z.mean(0).abs().max() < 0.2


def test_config_and_state_round_trip():
    flow, _ = posthoc.fit_flow(torch.randn(128, 8), batch_size=32, seed=3)
    again = posthoc.Glow.from_config(flow.config())
    again.load_state_dict(flow.state_dict())
    x = torch.randn(5, 8)
    torch.testing.assert_close(again.eval()(x)[0], flow(x)[0], rtol=0, atol=0)
    assert all(t.is_floating_point() for t in flow.state_dict().values())  # checkpoints hold floats
