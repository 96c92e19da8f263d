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


def test_log_prob_is_torchs_transformed_normal():
    """log_prob equals torch's TransformedDistribution(Normal, TanhTransform) summed over the action
    dim (its Jacobian term written by torch), at actions across (-1, 1) and close to its ends."""
    torch.manual_seed(0)
    mean, std = 2 * torch.randn(32, 3, dtype=torch.float64), torch.rand(32, 3, dtype=torch.float64) + 0.1
    action = torch.tanh(mean + 1.5 * std * torch.randn(4, 32, 3, dtype=torch.float64)).clamp(-0.9999, 0.9999)
    torchs = D.Independent(D.TransformedDistribution(D.Normal(mean, std), [D.TanhTransform()]), 1)
    torch.testing.assert_close(TanhNormal(mean, std).log_prob(action), torchs.log_prob(action), rtol=1e-9, atol=1e-9)


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


def test_bounded_normal_actor_is_the_references_normal():
    """dist="bounded_normal" is danijar/dreamerv3's (2411f7d, nets.Dist "normal"): N(tanh(m), (max - min)
    sigmoid(s + 2) + min), output layer weights x 0.01 and bias 0; samples are not squashed, the mode is
    tanh(m); forward's sample is mean + std * noise with the noise given."""
    from worldmodels.models import Actor

    torch.manual_seed(0)
    plain = Actor(6, 3, hidden=8, layers=2, dist="normal")
    torch.manual_seed(0)
    actor = Actor(6, 3, hidden=8, layers=2, dist="bounded_normal", min_std=0.1, max_std=1.0)
    assert torch.allclose(actor.net[-1].weight, 0.01 * plain.net[-1].weight) and not actor.net[-1].bias.any()
    with torch.no_grad():
        actor.net[-1].weight.normal_(0, 3.0)  # push the means and stds into their bounds
    feat = torch.randn(50, 6)
    raw_mean, raw_std = actor.net(feat).chunk(2, -1)
    mean, std = torch.tanh(raw_mean), 0.9 * torch.sigmoid(raw_std + 2.0) + 0.1
    dist = actor.dist(feat)
    assert torch.allclose(dist.mean, mean) and torch.allclose(dist.stddev, std) and torch.allclose(dist.mode, mean)
    noise = actor.noise((50,))
    sample = actor(feat, noise)
    assert torch.allclose(sample, mean + std * noise) and sample.abs().max() > 1  # unsquashed
    want = D.Independent(D.Normal(mean, std), 1)
    assert torch.allclose(dist.log_prob(sample), want.log_prob(sample))
    assert torch.allclose(dist.entropy(), want.entropy())
    with pytest.raises(ValueError, match="min_std < max_std"):
        Actor(6, 3, hidden=8, layers=2, dist="bounded_normal", min_std=1.0, max_std=0.5)
    # raw outputs set by hand (zero weights, these biases): the std at its bounds and between them
    with torch.no_grad():
        actor.net[-1].weight.zero_()
        actor.net[-1].bias.copy_(torch.tensor([0.0, math.atanh(0.5), -40.0, -2.0, 40.0, -40.0]))
    dist = actor.dist(torch.randn(2, 6))
    assert torch.allclose(dist.mean, torch.tensor([[0.0, 0.5, -1.0]] * 2))
    # 0.9 sigmoid(s + 2) + 0.1: s = -2 gives 0.55; s = +-40 the bounds 1 and 0.1
    assert torch.allclose(dist.stddev, torch.tensor([[0.55, 1.0, 0.1]] * 2))


def test_init_std_sets_the_initial_std_as_dreamer_v1s_shift_does():
    """init_std=5 (Dreamer V1's action_init_std): std = softplus(raw + softplus^-1(5)) + min_std with the
    reference's zero bias, i.e. the std outputs' bias set to softplus^-1(5): 5 + min_std at zero input."""
    from worldmodels.models import Actor

    actor = Actor(6, 3, hidden=8, layers=2, dist="tanh_normal", min_std=1e-4, init_std=5.0)
    assert torch.allclose(actor.net[-1].bias[3:], torch.full((3,), math.log(math.expm1(5.0))))
    with torch.no_grad():
        actor.net[-1].weight.zero_()
    _, std = actor._params(torch.randn(4, 6))
    assert torch.allclose(std, torch.full_like(std, 5.0 + 1e-4))
    with pytest.raises(ValueError, match="init_std"):
        Actor(6, 3, hidden=8, layers=2, dist="bounded_normal", init_std=5.0)
