"""Samplers driven by pre-drawn noise (the RNG contract), read inside unrolls and by the actor.

Every sampler takes its noise as a tensor, so an unroll fed the same noise gives the same
numbers on every backend. Noise layouts:
- Gaussian: standard normal eps, shape of the sample.
- one-hot categorical: standard Gumbel noise, shape [..., groups, classes] (sample = argmax of
  log-probs + noise, straight-through gradients through the probabilities).
"""

from __future__ import annotations

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
