"""The activations the ops' pure math names: "elu", "silu" and "relu" (PlaNet's)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = {"elu": F.elu, "silu": F.silu, "relu": F.relu}


def activate(name: str, x: torch.Tensor) -> torch.Tensor:
    """`x` through the activation called `name` (a key of ACTIVATIONS)."""
    return ACTIVATIONS[name](x)
