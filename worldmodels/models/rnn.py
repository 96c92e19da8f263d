"""`GRU` and `LSTM`: drop-in for `nn.GRU` / `nn.LSTM(batch_first=True)` with mid-sequence resets
and interchangeable backends.

Shapes: x [B, T, F] (or [T, F] unbatched); hx [L, B, H] (LSTM: a pair); is_init [B, T] bool,
True where the hidden state is zeroed before step t. Output [B, T, H] and the final hidden.
In step mode (`recurrent_mode("step")`, or `.step`) x is one step, [B, F], and is_init [B].

Backends: `loop` / `scan` run the cell below layer by layer (each layer's input projection is
one matmul over the whole sequence, off the recurrent chain); `cudnn` calls the vendor RNN
(cuDNN on CUDA, torch's native kernel on CPU) on the segments between reset times.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

from worldmodels.core.backends import get_recurrent_mode, is_batched, resolve_backend, validate_backend
from worldmodels.core.precision import linear, resolve_precision, validate_precision
from worldmodels.core.strides import canonical
from worldmodels.core.unroll import DRIVERS


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


class _RecurrentBase(nn.Module):
    """Parameters laid out exactly as torch's RNN modules, so their state_dicts load."""

    gates: int
    n_states: int  # 1 for GRU (h), 2 for LSTM (h, c)

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = True, dropout: float = 0.0, bidirectional: bool = False, *,
                 backend: str | None = None, precision: str | None = None, device=None, dtype=None):
        super().__init__()
        for name, value in (("input_size", input_size), ("hidden_size", hidden_size), ("num_layers", num_layers)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not batch_first:
            raise ValueError("batch_first=False is not supported: inputs are [B, T, F] (batch_first=True)")
        if bidirectional:
            raise ValueError("bidirectional=True is not supported by worldmodels' recurrent core")
        if dropout != 0.0:
            raise ValueError(f"dropout={dropout!r} is not supported; expected 0.0")
        self.input_size, self.hidden_size, self.num_layers, self.bias = input_size, hidden_size, num_layers, bias
        self.batch_first = True
        self.backend = validate_backend(backend)
        self.precision = None if precision is None else validate_precision(precision)
        factory = {"device": device, "dtype": dtype}
        for layer in range(num_layers):
            layer_in = input_size if layer == 0 else hidden_size
            g = self.gates * hidden_size
            self.register_parameter(f"weight_ih_l{layer}", nn.Parameter(torch.empty(g, layer_in, **factory)))
            self.register_parameter(f"weight_hh_l{layer}", nn.Parameter(torch.empty(g, hidden_size, **factory)))
            if bias:
                self.register_parameter(f"bias_ih_l{layer}", nn.Parameter(torch.empty(g, **factory)))
                self.register_parameter(f"bias_hh_l{layer}", nn.Parameter(torch.empty(g, **factory)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def layer_weights(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        w = (getattr(self, f"weight_ih_l{layer}"), getattr(self, f"weight_hh_l{layer}"))
        b = (getattr(self, f"bias_ih_l{layer}"), getattr(self, f"bias_hh_l{layer}")) if self.bias else (None, None)
        return (*w, *b)

    # ---------------------------------------------------------------- input checks
    def _check(self, x: torch.Tensor, hx, is_init: torch.Tensor | None):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor, got {type(x).__name__} {getattr(x, 'dtype', '')}")
        if x.dim() not in (2, 3) or x.shape[-1] != self.input_size:
            raise ValueError(f"x must be [B, T, {self.input_size}] (or [T, {self.input_size}] unbatched), got {list(x.shape)}")
        batch, steps = (x.shape[0], x.shape[1]) if x.dim() == 3 else (None, x.shape[0])
        states = () if hx is None else ((hx,) if self.n_states == 1 else tuple(hx))
        if hx is not None and len(states) != self.n_states:
            raise ValueError(f"hx must be a pair (h, c) for LSTM, got {len(states)} tensors")
        want = [self.num_layers] + ([] if batch is None else [batch]) + [self.hidden_size]
        for s in states:
            if not isinstance(s, torch.Tensor) or list(s.shape) != want:
                raise ValueError(f"hx must be {want} ([num_layers, B, hidden_size]), got {list(getattr(s, 'shape', []))}")
            if s.dtype != x.dtype:
                raise TypeError(f"hx dtype {s.dtype} does not match x dtype {x.dtype}")
        if is_init is not None:
            want_init = ([] if batch is None else [batch]) + [steps]
            if not isinstance(is_init, torch.Tensor) or list(is_init.shape) != want_init:
                raise ValueError(f"is_init must be {want_init} ([B, T]), got {list(getattr(is_init, 'shape', []))}")
            if is_init.dtype != torch.bool:
                raise TypeError(f"is_init must be a bool tensor, got {is_init.dtype}")
        return states

    # ---------------------------------------------------------------- forward
    def forward(self, x: torch.Tensor, hx=None, is_init: torch.Tensor | None = None, *, backend: str | None = None):
        if get_recurrent_mode() == "step":
            return self.step(x, hx, is_init, backend=backend)
        return self._sequence(x, hx, is_init, backend)

    def step(self, x: torch.Tensor, hx=None, is_init: torch.Tensor | None = None, *, backend: str | None = None):
        """One step: x [B, F] (or [F]), is_init [B]; returns (y [B, H], hx)."""
        x = x.unsqueeze(-2)
        is_init = None if is_init is None else is_init.unsqueeze(-1)
        y, hx = self._sequence(x, hx, is_init, backend)
        return y.squeeze(-2), hx

    def _sequence(self, x, hx, is_init, backend):
        states = self._check(x, hx, is_init)
        unbatched = x.dim() == 2
        if unbatched:
            x, states = x.unsqueeze(0), tuple(s.unsqueeze(1) for s in states)
            is_init = None if is_init is None else is_init.unsqueeze(0)
        if not states:
            zeros = x.new_zeros(self.num_layers, x.shape[0], self.hidden_size)
            states = (zeros,) * self.n_states
        # Under vmap any of these may carry the vmapped dim (an ensemble often shares x).
        weights = [w for layer in range(self.num_layers) for w in self.layer_weights(layer) if w is not None]
        vmapped = any(is_batched(t) for t in (x, *states, *weights, *([] if is_init is None else [is_init])))
        name = resolve_backend(backend, self.backend, device=x.device, vmapped=vmapped)
        if name == "cudnn" and vmapped:
            raise ValueError("backend='cudnn' cannot run under torch.func.vmap (the vendor RNN ops have no "
                             "batching rule); use backend='scan', 'loop' or 'auto'")
        precision = resolve_precision(self.precision, x.device)
        x, states = canonical(x), tuple(canonical(s) for s in states)
        if name == "cudnn":
            y, states = self._vendor(x, states, is_init, precision)
        else:
            y, states = self._stepwise(x, states, is_init, precision, DRIVERS[name])
        if unbatched:
            y, states = y.squeeze(0), tuple(s.squeeze(1) for s in states)
        return y, (states[0] if self.n_states == 1 else states)

    def _stepwise(self, x, states, is_init, precision, driver):
        """loop / scan: layer after layer, each a time-major unroll of the cell."""
        resets = None if is_init is None else is_init.transpose(0, 1).unsqueeze(-1)  # [T, B, 1]
        finals = []
        for layer in range(self.num_layers):
            w_ih, w_hh, b_ih, b_hh = self.layer_weights(layer)
            gates_x = linear(x, w_ih, b_ih, precision).transpose(0, 1)  # [T, B, G*H], off the chain
            carry = tuple(s[layer] for s in states)
            xs = (gates_x,) if resets is None else (gates_x, resets)
            carry, hidden, _ = driver(functools.partial(self._step, precision=precision), carry, xs, (w_hh, b_hh))
            x = hidden[0].transpose(0, 1)  # h after every step: the layer's output
            finals.append(carry)
        return x, tuple(torch.stack(s) for s in zip(*finals))

    def _step(self, carry, xs, params, precision):
        w_hh, b_hh = params
        if len(xs) == 2:
            carry = tuple(torch.where(xs[1], torch.zeros_like(c), c) for c in carry)
        return self._cell(carry, xs[0], w_hh, b_hh, precision), ()

    def _vendor(self, x, states, is_init, precision):
        """cudnn: the vendor RNN over segments between reset times (one host sync for them)."""
        weights = [w for layer in range(self.num_layers) for w in self.layer_weights(layer) if w is not None]
        if precision == "bf16" and x.dtype == torch.float32:
            x, states, weights = x.bfloat16(), tuple(s.bfloat16() for s in states), [w.bfloat16() for w in weights]
        steps = x.shape[1]
        starts = [0] if is_init is None else sorted({0, *is_init.any(0).nonzero().flatten().tolist()})
        outputs = []
        for start, end in zip(starts, [*starts[1:], steps]):
            if is_init is not None:
                reset = is_init[:, start].view(1, -1, 1)
                states = tuple(torch.where(reset, torch.zeros_like(s), s) for s in states)
            y, states = self._vendor_call(x[:, start:end], states, weights)
            outputs.append(y)
        y = outputs[0] if len(outputs) == 1 else torch.cat(outputs, 1)
        dtype = self.layer_weights(0)[0].dtype
        return y.to(dtype), tuple(s.to(dtype) for s in states)


class GRU(_RecurrentBase):
    """Drop-in `nn.GRU(batch_first=True)`: `forward(x, hx=None, is_init=None) -> (y, h_n)`."""

    gates, n_states = 3, 1

    def _cell(self, carry, gates_x, w_hh, b_hh, precision):
        return (gru_cell(carry[0], gates_x, w_hh, b_hh, precision),)

    def _vendor_call(self, x, states, weights):
        y, h = torch._VF.gru(x, states[0], weights, self.bias, self.num_layers, 0.0, self.training, False, True)
        return y, (h,)


class LSTM(_RecurrentBase):
    """Drop-in `nn.LSTM(batch_first=True)`: `forward(x, (h, c)=None, is_init=None) -> (y, (h_n, c_n))`."""

    gates, n_states = 4, 2

    def _cell(self, carry, gates_x, w_hh, b_hh, precision):
        return lstm_cell(carry, gates_x, w_hh, b_hh, precision)

    def _vendor_call(self, x, states, weights):
        y, h, c = torch._VF.lstm(x, states, weights, self.bias, self.num_layers, 0.0, self.training, False, True)
        return y, (h, c)
