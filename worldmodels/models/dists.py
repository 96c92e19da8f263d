"""Latent and action distributions, sampled from pre-drawn noise (the RNG contract).

Every sampler takes its noise as a tensor, so an unroll fed the same noise gives the same
numbers on every backend. Noise layouts:
- Gaussian: standard normal eps, shape of the sample.
- one-hot categorical: standard Gumbel noise, shape [..., groups, classes] (sample = argmax of
  log-probs + noise, straight-through gradients through the probabilities).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F


def gaussian_params(raw: torch.Tensor, min_std: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Split a head's output [..., 2S] into mean [..., S] and std = softplus + min_std."""
    mean, std = raw.chunk(2, -1)
    return mean, F.softplus(std) + min_std


def sample_gaussian(mean: torch.Tensor, std: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    return mean + std * eps


def unimix_logits(logits: torch.Tensor, unimix: float) -> torch.Tensor:
    """Logits of (1 - unimix) * softmax(logits) + unimix / classes (keeps every class reachable)."""
    if unimix <= 0:
        return logits
    probs = torch.softmax(logits, -1)
    probs = (1 - unimix) * probs + unimix / logits.shape[-1]
    return torch.log(probs)


def sample_onehot(logits: torch.Tensor, gumbel: torch.Tensor) -> torch.Tensor:
    """One-hot sample of categoricals [..., G, C] with straight-through gradients."""
    index = (logits + gumbel).argmax(-1)
    onehot = F.one_hot(index, logits.shape[-1]).to(logits.dtype)
    if not (torch.is_grad_enabled() and logits.requires_grad):
        return onehot  # the straight-through term is exactly zero in value
    probs = torch.softmax(logits, -1)
    return onehot + probs - probs.detach()


def gumbel_noise(shape, *, dtype, device, generator=None) -> torch.Tensor:
    u = torch.rand(shape, dtype=dtype, device=device, generator=generator)
    tiny = torch.finfo(dtype).tiny
    return -torch.log(-torch.log(u.clamp(tiny, 1 - 1e-7)))


def kl_categorical(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) of independent categoricals [..., G, C] summed over groups -> [...]."""
    logp, logq = torch.log_softmax(logits_p, -1), torch.log_softmax(logits_q, -1)
    return (logp.exp() * (logp - logq)).sum((-2, -1))


def kl_gaussian(mean_p, std_p, mean_q, std_q) -> torch.Tensor:
    """KL(p || q) of diagonal Gaussians [..., S] summed over S -> [...]."""
    var_ratio = (std_p / std_q).pow(2)
    return 0.5 * (var_ratio + ((mean_p - mean_q) / std_q).pow(2) - 1 - var_ratio.log()).sum(-1)


# Gauss-Hermite rule for E[f(X)], X ~ N(m, s): sum_i w_i f(m + sqrt(2) s z_i), with w_i = h_i / sqrt(pi).
# 32 nodes put TanhNormal.entropy within 1e-4 of the exact value for std <= 1.5, 3e-3 at std 3
# and 1% at std 10 (log(1 - tanh^2) bends like -2|x| on the scale of a wide Gaussian).
@functools.lru_cache(maxsize=None)
def _hermite(device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes sqrt(2) z_i and weights w_i on `device` (cached: no host-to-device copy per call)."""
    nodes, weights = np.polynomial.hermite.hermgauss(32)
    return (torch.tensor(math.sqrt(2.0) * nodes).to(device, dtype),
            torch.tensor(weights / math.sqrt(math.pi)).to(device, dtype))


class TanhNormal(torch.distributions.Distribution):
    """tanh(Normal(mean, std)), independent over the last dim; log_prob of actions in (-1, 1)."""

    arg_constraints: dict = {}

    def __init__(self, mean: torch.Tensor, std: torch.Tensor):
        self.mean_, self.std_ = mean, std
        super().__init__(mean.shape[:-1], mean.shape[-1:], validate_args=False)

    def rsample(self, sample_shape=torch.Size()) -> torch.Tensor:
        eps = torch.randn(torch.Size(sample_shape) + self.mean_.shape, dtype=self.mean_.dtype, device=self.mean_.device)
        return torch.tanh(self.mean_ + self.std_ * eps)

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        action = action.clamp(-1 + 1e-6, 1 - 1e-6)
        pre = torch.atanh(action)
        normal = -0.5 * ((pre - self.mean_) / self.std_).pow(2) - self.std_.log() - 0.5 * math.log(2 * math.pi)
        log_det = 2 * (math.log(2) - pre - F.softplus(-2 * pre))  # log(1 - tanh(x)^2), stable
        return (normal - log_det).sum(-1)

    def entropy(self) -> torch.Tensor:
        """H(tanh X) = H(X) + E[log(1 - tanh(X)^2)], X ~ Normal(mean, std), summed over the last dim.

        The expectation has no closed form; Gauss-Hermite quadrature computes it deterministically
        (no sampling variance in the entropy bonus) and differentiably in mean and std."""
        nodes, weights = _hermite(self.mean_.device, self.mean_.dtype)
        x = self.mean_.unsqueeze(-1) + self.std_.unsqueeze(-1) * nodes  # [..., A, K]
        log_det = 2 * (math.log(2) - x - F.softplus(-2 * x))  # log(1 - tanh(x)^2), stable
        normal = 0.5 + 0.5 * math.log(2 * math.pi) + self.std_.log()
        return (normal + (log_det * weights).sum(-1)).sum(-1)

    @property
    def mode(self) -> torch.Tensor:
        return torch.tanh(self.mean_)
