"""Optimiser steps with adaptive gradient clipping (AGC, as in DreamerV3) or global-norm clipping."""

from __future__ import annotations

import torch
from torch import nn

FUSED_ADAM = True
"""Adam as torch's fused kernels (`fused=True`: a few launches per step for all parameters) rather
than its foreach ones; `benchmarks/update_profile.py` times both (variants fused_adam / base)."""


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
        self.opt = torch.optim.Adam(self.params, lr=lr, eps=eps, fused=FUSED_ADAM)
        self.agc, self.clip = agc, clip
        self.version = 0  # counts load_state_dict calls (`train/graphed_update.py` captures again)

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
        if torch.is_autocast_enabled(self.params[0].device.type):
            # an update run inside one autocast region: forwards after this step must cast the new
            # weights, not reuse the casts autocast cached before it (torch keeps them per region)
            torch.clear_autocast_cache()
        return norm.detach()

    def capturable_(self) -> None:
        """Let `step` be captured in a CUDA graph (torch's `capturable`: the step counts on the device)."""
        for group in self.opt.param_groups:
            group["capturable"] = True
        for p, state in self.opt.state.items():
            if "step" in state and state["step"].device != p.device:
                state["step"] = state["step"].to(p.device, torch.float32)

    def reset_state_(self) -> None:
        """Back to a fresh Adam (zero moments, step 0), in place: the state keeps its storage, so a
        CUDA graph that captured `step` stays valid."""
        for state in self.opt.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    value.zero_()

    def state_dict(self) -> dict:
        return self.opt.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.opt.load_state_dict(state)
        self.version += 1  # new state tensors: a captured step reads the old ones
