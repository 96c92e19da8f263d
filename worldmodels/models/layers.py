"""Building blocks shared by the RSSM, the actor and the heads: norms, activations, MLPs."""

from __future__ import annotations

import torch
from torch import nn

from worldmodels.core import torch_fixes
from worldmodels.ops.activations import ACTIVATIONS

NORMS = ("none", "rms", "layer")
ACTS = tuple(ACTIVATIONS)  # the ops' activation names
ACT_MODULES = {"elu": nn.ELU, "silu": nn.SiLU, "relu": nn.ReLU}
"""The module of each activation name (`activation`; `Actor.op_spec` reads the name back)."""


class RMSNorm(nn.RMSNorm):
    """`torch.nn.RMSNorm` over the last dim with DreamerV3's eps: x / sqrt(mean(x^2) + eps) * weight.

    torch's module (its `rms_norm` op) does all the math. The one addition is the checkpoint
    name of the weight: this class used to hold it as `scale`, so state dicts keep that key
    (saved as `scale`; loaded from `scale`, or from `weight` as torch names it) and every
    checkpoint written before the switch still loads.

    In mixed precision (a bf16 input, the fp32 weight) the norm runs in the input's dtype on a
    cast of the weight, outside autocast: torch would otherwise miss its fused kernel
    (pytorch#167308, `core/torch_fixes.py`). The statistics accumulate in fp32 either way.

    Args:
        size: size of the last dimension, the one normalised.
        eps: added to the mean square before the square root (DreamerV3: 1e-4).
    """

    def __init__(self, size: int, eps: float = 1e-4):
        super().__init__(size, eps=eps)
        self.register_state_dict_post_hook(_save_weight_as_scale)
        self.register_load_state_dict_pre_hook(_load_scale_as_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch_fixes.rms_norm(x, self.weight, self.eps)


def _save_weight_as_scale(module: nn.Module, state_dict: dict, prefix: str, local_metadata) -> None:
    state_dict[prefix + "scale"] = state_dict.pop(prefix + "weight")


def _load_scale_as_weight(module: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    if prefix + "scale" in state_dict:
        state_dict[prefix + "weight"] = state_dict.pop(prefix + "scale")


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
    return ACT_MODULES[check_choice("act", act, ACTS)]()


LINEAR_BIASES = ("auto", "always")
"""`model.linear_bias`: whether a Linear or conv that a norm follows has a bias. "auto": only layers with
no norm after them (a bias before LayerNorm is redundant: it subtracts the mean; the 2023 DreamerV3
reference's layers); "always": every layer (the 2024 reference's `nets.Linear`, bias True, whose RMSNorm
has no offset: without the bias such a layer has no constant term)."""


def has_bias(norm: str, linear_bias: str = "auto") -> bool:
    """Whether a Linear or conv followed by `norm` has a bias (see `LINEAR_BIASES`)."""
    return check_choice("linear_bias", linear_bias, LINEAR_BIASES) == "always" or norm == "none"


def dense(in_size: int, out_size: int, norm: str, act: str, linear_bias: str = "auto") -> nn.Sequential:
    """Linear -> norm -> act; the Linear's bias as `has_bias` says."""
    return nn.Sequential(nn.Linear(in_size, out_size, bias=has_bias(norm, linear_bias)), norm_layer(norm, out_size),
                         activation(act))


def mlp(in_size: int, out_size: int | None, hidden: int, layers: int, norm: str = "none",
        act: str = "elu", linear_bias: str = "auto") -> nn.Sequential:
    """`layers` hidden dense blocks, then a plain Linear to `out_size` (omitted when None)."""
    blocks: list[nn.Module] = []
    for i in range(layers):
        blocks.append(dense(in_size if i == 0 else hidden, hidden, norm, act, linear_bias))
    if out_size is not None:
        blocks.append(nn.Linear(hidden if layers else in_size, out_size))
    return nn.Sequential(*blocks)
