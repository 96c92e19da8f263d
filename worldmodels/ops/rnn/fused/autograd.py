"""The fused GRU / LSTM op as `torch.library` custom ops with fake (meta) implementations and
autograd, so `torch.compile(fullgraph=True)` traces through them:

- `worldmodels::triton_rnn_forward` (`forward_op`): the layers' forward launches (`launch.forward`),
  saving the gates for the backward when asked;
- `worldmodels::triton_rnn_backward` (`backward_op`): the backward launches and the weight
  gradients as GEMMs over B*T (`launch.backward`).
"""

from __future__ import annotations

from typing import Optional

import torch

from worldmodels.ops.rnn.fused import launch
from worldmodels.ops.triton_utils import lines, overrides, pinned_launch


@torch.library.custom_op("worldmodels::triton_rnn_forward", mutates_args=())
def forward_op(cell: str, x: torch.Tensor, h0: torch.Tensor, c0: Optional[torch.Tensor], weights: list[torch.Tensor],
               is_init: Optional[torch.Tensor], num_layers: int, bias: bool, precision: str, save: bool,
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> h_n [L, B, H], c_n [L, B, H] (LSTM; else empty), ys [L, B, T+1, HP] (every layer's h
    before the first and after every step, rows padded to HP = H rounded up to 32), saved
    [L, B, T, S*H] (gates for the backward; empty unless save), all in the state dtype."""
    return launch.forward(cell, x, h0, c0, weights, is_init, num_layers, bias, precision, save)


@forward_op.register_fake
def _(cell, x, h0, c0, weights, is_init, num_layers, bias, precision, save):
    batch, steps, _ = x.shape
    hidden = h0.shape[-1]
    sd = launch.state_dtype(x.dtype)
    c_n = x.new_empty(num_layers, batch, hidden, dtype=sd) if cell == "lstm" else x.new_empty(0, dtype=sd)
    saved = x.new_empty((num_layers, batch, steps, launch.SAVED[cell] * hidden) if save else (0,), dtype=sd)
    ys = x.new_empty(num_layers, batch, steps + 1, lines(hidden), dtype=sd)
    return x.new_empty(num_layers, batch, hidden, dtype=sd), c_n, ys, saved


@torch.library.custom_op("worldmodels::triton_rnn_backward", mutates_args=())
def backward_op(cell: str, x: torch.Tensor, h0: torch.Tensor, c0: Optional[torch.Tensor], weights: list[torch.Tensor],
                is_init: Optional[torch.Tensor], ys: torch.Tensor, saved: torch.Tensor, g_ys: torch.Tensor,
                g_hn: torch.Tensor, g_cn: Optional[torch.Tensor], num_layers: int, bias: bool, precision: str,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """-> dx, dh0, dc0 (empty for GRU), one gradient per weight."""
    return launch.backward(cell, x, h0, c0, weights, is_init, ys, saved, g_ys, g_hn, g_cn, num_layers, bias, precision)


@backward_op.register_fake
def _(cell, x, h0, c0, weights, is_init, ys, saved, g_ys, g_hn, g_cn, num_layers, bias, precision):
    return (torch.empty_like(x), torch.empty_like(h0),
            torch.empty_like(h0) if cell == "lstm" else x.new_empty(0), [torch.empty_like(w) for w in weights])


def _setup_context(ctx, inputs, output):
    cell, x, h0, c0, weights, is_init, num_layers, bias, precision, save = inputs
    _, _, ys, saved = output
    ctx.save_for_backward(x, h0, c0, is_init, ys, saved, *weights)
    ctx.meta = (cell, num_layers, bias, precision, save)
    # the launch keys overridden at the forward's call, for the backward: autograd runs a CUDA backward on
    # its device thread, which does not see the caller's `launch_overrides`
    ctx.launch = overrides("rnn")


def _backward(ctx, g_hn, g_cn, g_ys, _g_saved):
    cell, num_layers, bias, precision, save = ctx.meta
    x, h0, c0, is_init, ys, saved, *weights = ctx.saved_tensors
    if not save:
        raise RuntimeError("triton rnn: backward through a forward run without saving gates (no grad was needed then)")
    g_hn = torch.zeros_like(h0) if g_hn is None else g_hn
    g_ys = torch.zeros_like(ys) if g_ys is None else g_ys
    if cell == "lstm":
        g_cn = torch.zeros_like(h0) if g_cn is None else g_cn
    else:
        g_cn = None
    with pinned_launch("rnn", ctx.launch):
        dx, dh0, dc0, dw = backward_op(cell, x, h0, c0, weights, is_init, ys, saved, g_ys, g_hn, g_cn,
                                       num_layers, bias, precision)
    return None, dx, dh0, (dc0 if cell == "lstm" else None), list(dw), None, None, None, None, None


forward_op.register_autograd(_backward, setup_context=_setup_context)
