"""GRU / LSTM sequences, the reference: the cell in a Python loop, layer after layer.

    rnn(cell, x, states, weights, is_init, *, num_layers, bias, precision) -> (y, states)

- cell: "gru" or "lstm" (torch's gate orders: GRU r, z, n; LSTM i, f, g, o).
- x [B, T, F]; states: (h,) for GRU, (h, c) for LSTM, each [L, B, H]; is_init [B, T] bool or
  None: the hidden (and cell) state is zeroed before step t where set.
- weights: per layer w_ih [G*H, F_l], w_hh [G*H, H], then b_ih, b_hh [G*H] when `bias`
  (the order of `torch._VF.gru`), G = 3 (GRU) or 4 (LSTM).
- precision: a concrete mode of `core/precision.py` ("ieee", "tf32", "tf32x3", "bf16").
- Returns y [B, T, H] (the last layer's h after every step) and the final states, each [L, B, H].

Each layer's input projection is one matmul over the whole sequence (off the recurrent chain);
the recurrence runs on an unroll driver (`core/unroll.py`): `loop` here, `scan` in scan.py.
"""

from __future__ import annotations

import functools

import torch

from worldmodels.core.precision import linear
from worldmodels.core.unroll import Driver, loop_unroll

GATES = {"gru": 3, "lstm": 4}
STATES = {"gru": 1, "lstm": 2}


def gru_cell(h: torch.Tensor, gates_x: torch.Tensor, w_hh, b_hh, precision: str) -> torch.Tensor:
    """One GRU step from the precomputed input gates `gates_x` = x W_ih^T + b_ih, [B, 3H]."""
    r_x, z_x, n_x = gates_x.chunk(3, -1)
    r_h, z_h, n_h = linear(h, w_hh, b_hh, precision).chunk(3, -1)
    r = torch.sigmoid(r_x + r_h)
    z = torch.sigmoid(z_x + z_h)
    n = torch.tanh(n_x + r * n_h)
    return n + z * (h - n)


def lstm_cell(hc: tuple[torch.Tensor, torch.Tensor], gates_x: torch.Tensor, w_hh, b_hh, precision: str):
    """One LSTM step from the precomputed input gates, [B, 4H] in torch's order (i, f, g, o)."""
    h, c = hc
    i, f, g, o = (gates_x + linear(h, w_hh, b_hh, precision)).chunk(4, -1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def layer_weights(weights, layer: int, bias: bool):
    """(w_ih, w_hh, b_ih, b_hh) of `layer` from the flat list; biases None without `bias`."""
    per = 4 if bias else 2
    w = list(weights[layer * per: (layer + 1) * per])
    return (w[0], w[1], w[2], w[3]) if bias else (w[0], w[1], None, None)


def _step(carry, xs, params, cell: str, precision: str):
    w_hh, b_hh = params
    gates_x, *reset = xs
    if reset:
        carry = tuple(torch.where(reset[0], torch.zeros_like(c), c) for c in carry)
    if cell == "gru":
        return (gru_cell(carry[0], gates_x, w_hh, b_hh, precision),), ()
    return lstm_cell(carry, gates_x, w_hh, b_hh, precision), ()


def unrolled_rnn(driver: Driver, cell: str, x, states, weights, is_init, *, num_layers: int, bias: bool,
                 precision: str):
    """The reference math on `driver`: layer after layer, each a time-major unroll of the cell."""
    resets = None if is_init is None else is_init.transpose(0, 1).unsqueeze(-1)  # [T, B, 1]
    finals = []
    for layer in range(num_layers):
        w_ih, w_hh, b_ih, b_hh = layer_weights(weights, layer, bias)
        gates_x = linear(x, w_ih, b_ih, precision).transpose(0, 1)  # [T, B, G*H], off the chain
        carry = tuple(s[layer] for s in states)
        xs = (gates_x,) if resets is None else (gates_x, resets)
        carry, hidden, _ = driver(functools.partial(_step, cell=cell, precision=precision), carry, xs, (w_hh, b_hh))
        x = hidden[0].transpose(0, 1)  # h after every step: the layer's output
        finals.append(carry)
    return x, tuple(torch.stack(s) for s in zip(*finals))


rnn = functools.partial(unrolled_rnn, loop_unroll)
