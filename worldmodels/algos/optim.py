"""Optimiser steps with adaptive gradient clipping (AGC, as in DreamerV3) or global-norm clipping."""

from __future__ import annotations

import torch
from torch import nn


def adaptive_clip_(params, clip: float, eps: float = 1e-3) -> None:
    """Scale each parameter's gradient so that ||grad|| <= clip * max(||param||, eps)."""
    params = [p for p in params if p.grad is not None]
    grads = [p.grad for p in params]
    limits = torch.stack(torch._foreach_norm([p.detach() for p in params])).clamp(min=eps) * clip
    norms = torch.stack(torch._foreach_norm(grads))
    scales = (limits / norms.clamp(min=1e-12)).clamp(max=1.0)
    torch._foreach_mul_(grads, list(scales.unbind()))


class Optimizer:
    """Adam on one module's parameters; `step(loss)` = zero_grad, backward, clip, step.

    `agc` > 0 clips each parameter adaptively, else `clip` > 0 clips the global norm."""

    def __init__(self, module: nn.Module, *, lr: float, eps: float = 1e-8, agc: float = 0.0, clip: float = 0.0):
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.opt = torch.optim.Adam(self.params, lr=lr, eps=eps)
        self.agc, self.clip = agc, clip

    def step(self, loss: torch.Tensor) -> torch.Tensor:
        """One update; returns the gradient norm before clipping (0-d, on the device: no sync)."""
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None])
        if self.agc > 0:
            adaptive_clip_(self.params, self.agc)
        elif self.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.opt.step()
        return norm.detach()

    def state_dict(self) -> dict:
        return self.opt.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.opt.load_state_dict(state)
