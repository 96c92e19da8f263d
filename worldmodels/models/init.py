"""DreamerV3's reference initialisation, applied to an agent's modules in place.

danijar/dreamerv3 at 2411f7d (nets.Initializer, winit "normal", fan "in") draws every weight from a
normal truncated at +-2 standard deviations and rescaled (x 1.1368) to std 1 / sqrt(fan_in), sets
biases to zero and norm scales to one. Two things differ from torch's defaults (uniform weights of std
1 / sqrt(3 fan_in), uniform biases) beyond the distribution:
- fan_in counts a layer's whole input, also for the block GRU's block-diagonal weights (BlockLinear
  with block_fans False): its hidden layer reads [deter block | the three input projections] in every
  block, so fan_in = deter + blocks * 3 * hidden, and its gate layer fan_in = the hidden layer's width;
- the RSSM's posterior layer reads [deter, embed] as one Linear there (split here into `post_deter` and
  `post_embed`, each drawn with the whole input's fan), as does the 2023 cell input [stoch, action]
  (`in_stoch`, `in_action`);
- outputs are scaled by the layer's `outscale`: 0 for the two-hot reward and critic heads, 0.01 for
  the actor's output (both its mean and its std), 1 elsewhere.

`init_like_dreamerv3_(module)` walks every submodule; the caller copies slow (target) networks after.
With `fan="avg"` every std is 1 / sqrt((fan_in + fan_out) / 2) instead, as the 2023 reference
(423291a, nets.Initializer, fan "avg") draws them.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from worldmodels.models.actor import Actor
from worldmodels.models.networks import Head
from worldmodels.models.rssm import RSSM

INITS = ("torch", "dreamerv3")
FANS = ("in", "avg")
_TRUNC_STD = 1.1368  # 1 / the std of a standard normal truncated at +-2: the sample's std is then 1


def trunc_normal_fan_in_(weight: torch.Tensor, fan_in: float) -> None:
    """weight ~ N(0, 1) truncated at +-2 std, times 1.1368 / sqrt(fan_in) (std 1 / sqrt(fan_in))."""
    std = _TRUNC_STD / math.sqrt(fan_in)
    nn.init.trunc_normal_(weight, 0.0, std, -2 * std, 2 * std)


def _zero(tensor: torch.Tensor | None) -> None:
    if tensor is not None:
        nn.init.zeros_(tensor)


def _draw_as_one(draw, *layers: nn.Linear) -> None:
    """Draw Linear `layers` that read parts of one input and add up as the one Linear over the whole
    input they stand for: with that layer's fans (the summed in_features)."""
    fan_in = sum(layer.in_features for layer in layers)
    for layer in layers:
        draw(layer.weight, fan_in, layer.out_features)


@torch.no_grad()
def init_like_dreamerv3_(module: nn.Module, actor_outscale: float = 0.01, fan: str = "in") -> None:
    """Re-initialise `module` and every submodule as the reference does (see the module docstring);
    `actor_outscale`: the actor output's scale (the 2023 reference's: 1.0); `fan`: "in" or "avg"."""
    if fan not in FANS:
        raise ValueError(f"fan={fan!r} is not valid; expected one of {list(FANS)}")

    def draw(weight: torch.Tensor, fan_in: int, fan_out: int) -> None:
        trunc_normal_fan_in_(weight, fan_in if fan == "in" else (fan_in + fan_out) / 2)

    for m in module.modules():
        if isinstance(m, nn.Linear):
            draw(m.weight, m.in_features, m.out_features)
            _zero(m.bias)
        elif isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
            k = m.kernel_size[0] * m.kernel_size[1]
            # the reference's kernel [k, k, in, out]
            draw(m.weight, m.in_channels // m.groups * k, m.out_channels // m.groups * k)
            _zero(m.bias)
        elif isinstance(m, nn.GRUCell):  # the reference's dense GRU: one Linear over [input | deter]
            for weight in (m.weight_ih, m.weight_hh):
                draw(weight, m.input_size + m.hidden_size, 3 * m.hidden_size)
            _zero(m.bias_ih)
            _zero(m.bias_hh)
        elif isinstance(m, (nn.RMSNorm, nn.LayerNorm)):
            if m.weight is not None:
                nn.init.ones_(m.weight)
            _zero(getattr(m, "bias", None))
    for m in module.modules():  # what the generic pass does not know: fans across blocks, outscales
        if isinstance(m, RSSM):  # layers split here over one input that is a single Linear's there
            _draw_as_one(draw, m.post_deter, m.post_embed)  # obs_out / obs0: [deter, embed]
            if m.cell in ("gru", "norm_gru"):
                _draw_as_one(draw, m.in_stoch, m.in_action)  # the 2023 img_in: [stoch, action]
        if isinstance(m, RSSM) and m.cell == "block_gru":
            hidden_in = m.deter_dim + m.blocks * 3 * m.hidden
            draw(m.dyn_x.weight, hidden_in, m.dyn_hidden)
            draw(m.dyn_h, hidden_in, m.dyn_hidden)
            draw(m.gates_w, m.dyn_hidden, 3 * m.deter_dim)
            _zero(m.gates_b)
        elif isinstance(m, Actor):
            m.net[-1].weight.mul_(actor_outscale)
        elif isinstance(m, Head) and m.output == "twohot":
            _zero(m.net[-1].weight)
            _zero(m.net[-1].bias)
