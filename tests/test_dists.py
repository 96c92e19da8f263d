"""TanhNormal: the quadrature entropy against a fine numerical integral; deterministic; gradcheck.
The KL helpers: equal to torch.distributions.kl_divergence, values and gradients."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributions as D
import torch.nn.functional as F

from worldmodels.models.dists import TanhNormal, kl_categorical, kl_gaussian


def entropy_by_integral(mean: float, std: float, points: int = 400_001) -> float:
    """H(tanh X) = H(X) + E[log(1 - tanh(X)^2)], the expectation by the trapezoid rule over +-12 std."""
    x = torch.linspace(mean - 12 * std, mean + 12 * std, points, dtype=torch.float64)
    density = torch.exp(-0.5 * ((x - mean) / std) ** 2) / (std * math.sqrt(2 * math.pi))
    log_det = 2 * (math.log(2) - x - F.softplus(-2 * x))
    return 0.5 + 0.5 * math.log(2 * math.pi) + math.log(std) + float(torch.trapezoid(density * log_det, x))


@pytest.mark.parametrize("mean,std,tol", [(0.0, 0.1, 1e-6), (0.0, 1.0, 1e-4), (2.0, 0.5, 1e-6),
                                          (-0.7, 1.5, 1e-4), (3.0, 0.05, 1e-6), (-1.0, 3.0, 5e-3)])
def test_entropy_matches_the_integral(mean, std, tol):
    dist = TanhNormal(torch.tensor([[mean, 0.0]], dtype=torch.float64), torch.tensor([[std, 1.0]], dtype=torch.float64))
    want = entropy_by_integral(mean, std) + entropy_by_integral(0.0, 1.0)  # independent dims add
    got = dist.entropy()
    assert got.shape == (1,)
    assert abs(float(got) - want) < tol


def test_entropy_is_deterministic_and_agrees_with_sampled_log_prob():
    torch.manual_seed(0)
    mean, std = torch.randn(64, 3, dtype=torch.float64), torch.rand(64, 3, dtype=torch.float64) + 0.1
    dist = TanhNormal(mean, std)
    assert torch.equal(dist.entropy(), dist.entropy())
    sampled = -dist.log_prob(dist.rsample((20_000,))).mean(0)  # Monte Carlo, [64]
    torch.testing.assert_close(dist.entropy(), sampled, atol=0.05, rtol=0)


def test_entropy_gradcheck_float32_and_float64():
    mean = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    std = (torch.rand(4, 2, dtype=torch.float64) + 0.2).requires_grad_()
    assert torch.autograd.gradcheck(lambda m, s: TanhNormal(m, s).entropy(), (mean, std))
    small = TanhNormal(mean.detach().float(), std.detach().float()).entropy()
    torch.testing.assert_close(small.double(), TanhNormal(mean, std).entropy().detach(), atol=1e-5, rtol=1e-5)


# --- the KL helpers equal torch.distributions.kl_divergence (kept for speed: see dists.py)


def test_kl_categorical_equals_torch_kl_divergence():
    torch.manual_seed(0)
    p = torch.randn(3, 5, 4, 6, dtype=torch.float64, requires_grad=True)  # [B, T, groups, classes]
    q = torch.randn(3, 5, 4, 6, dtype=torch.float64, requires_grad=True)
    ours = kl_categorical(p, q)
    theirs = D.kl_divergence(D.Independent(D.Categorical(logits=p), 1), D.Independent(D.Categorical(logits=q), 1))
    assert ours.shape == (3, 5)
    torch.testing.assert_close(ours, theirs)
    weights = torch.randn(3, 5, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad((ours * weights).sum(), (p, q)),
                               torch.autograd.grad((theirs * weights).sum(), (p, q)))


def test_kl_gaussian_equals_torch_kl_divergence():
    torch.manual_seed(0)
    mp, mq = torch.randn(2, 3, 2, 7, dtype=torch.float64, requires_grad=True)
    sp, sq = (torch.rand(2, 3, 2, 7, dtype=torch.float64) + 0.1).requires_grad_()
    ours = kl_gaussian(mp, sp, mq, sq)
    theirs = D.kl_divergence(D.Independent(D.Normal(mp, sp), 1), D.Independent(D.Normal(mq, sq), 1))
    assert ours.shape == (3, 2)
    torch.testing.assert_close(ours, theirs)
    weights = torch.randn(3, 2, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad((ours * weights).sum(), (mp, sp, mq, sq)),
                               torch.autograd.grad((theirs * weights).sum(), (mp, sp, mq, sq)))
