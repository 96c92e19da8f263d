"""Building blocks shared by the RSSM, the actor and the heads: norms, activations, MLPs."""

from __future__ import annotations

import torch
from torch import nn

NORMS = ("none", "rms", "layer")
ACTS = ("elu", "silu")


class RMSNorm(nn.Module):
    """x / rms(x) * scale over the last dim (DreamerV3's default normalisation)."""

    def __init__(self, size: int, eps: float = 1e-4):
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.scale


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not valid; expected one of {list(choices)}")
    return value  # type: ignore[return-value]


def norm_layer(norm: str, size: int) -> nn.Module:
    check_choice("norm", norm, NORMS)
    if norm == "rms":
        return RMSNorm(size)
    if norm == "layer":
        return nn.LayerNorm(size, eps=1e-3)
    return nn.Identity()


def activation(act: str) -> nn.Module:
    return {"elu": nn.ELU, "silu": nn.SiLU}[check_choice("act", act, ACTS)]()


def dense(in_size: int, out_size: int, norm: str, act: str) -> nn.Sequential:
    """Linear -> norm -> act; the Linear has no bias when a norm follows it."""
    return nn.Sequential(nn.Linear(in_size, out_size, bias=norm == "none"), norm_layer(norm, out_size), activation(act))


def mlp(in_size: int, out_size: int | None, hidden: int, layers: int, norm: str = "none", act: str = "elu") -> nn.Sequential:
    """`layers` hidden dense blocks, then a plain Linear to `out_size` (omitted when None)."""
    blocks: list[nn.Module] = []
    for i in range(layers):
        blocks.append(dense(in_size if i == 0 else hidden, hidden, norm, act))
    if out_size is not None:
        blocks.append(nn.Linear(hidden if layers else in_size, out_size))
    return nn.Sequential(*blocks)
