"""The timed calls for each mode: forward, forward+backward, no-grad.

fwd+bwd differentiates sum(output * cotangent) over every differentiable output w.r.t. the given
tensors with `torch.autograd.grad` (no `.grad` accumulation between repeats). Cotangents are
standard normal, drawn once per output name from a fixed seed and shared by every row of a group,
so all rows backpropagate the same non-zero signal.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from benchmarks.parity import Outputs, flatten


class Cotangents:
    def __init__(self, seed: int = 1234):
        self.seed = seed
        self.cache: Outputs = {}

    def __call__(self, key: str, like: torch.Tensor) -> torch.Tensor:
        cot = self.cache.get(key)
        if cot is None or cot.shape != like.shape:
            gen = torch.Generator(device="cpu").manual_seed(self.seed + sum(map(ord, key)))
            cot = torch.randn(like.shape, generator=gen, dtype=torch.float32).to(like.device)
            self.cache[key] = cot
        return cot


def forward_only(forward: Callable[[], object]) -> Callable[[], Outputs]:
    return lambda: {k: v.detach() for k, v in flatten(forward()).items()}


def no_grad(forward: Callable[[], object]) -> Callable[[], Outputs]:
    def call() -> Outputs:
        with torch.no_grad():
            return flatten(forward())
    return call


def forward_backward(forward: Callable[[], object], wrt: dict[str, torch.Tensor],
                     cotangents: Cotangents) -> Callable[[], Outputs]:
    """Outputs under "out.<name>", gradients w.r.t. `wrt` under "grad.<name>"."""
    names, tensors = list(wrt), list(wrt.values())

    def call() -> Outputs:
        outputs = flatten(forward())
        loss = sum((v.float() * cotangents(k, v)).sum() for k, v in outputs.items()
                   if v.requires_grad and v.is_floating_point())
        grads = torch.autograd.grad(loss, tensors, allow_unused=True)
        result = {f"out.{k}": v.detach() for k, v in outputs.items()}
        result.update({f"grad.{n}": g for n, g in zip(names, grads) if g is not None})
        return result
    return call
