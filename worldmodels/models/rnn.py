"""`GRU` and `LSTM`: drop-in for `nn.GRU` / `nn.LSTM(batch_first=True)` with mid-sequence resets
and interchangeable backends.

Shapes: x [B, T, F] (or [T, F] unbatched); hx [L, B, H] (LSTM: a pair); is_init [B, T] bool,
True where the hidden state is zeroed before step t. Output [B, T, H] and the final hidden.
In step mode (`recurrent_mode("step")`, or `.step`) x is one step, [B, F], and is_init [B].

The module owns the parameters (laid out as torch's, so state_dicts load), checks its inputs and
resolves the backend; the math is the `rnn` op of that backend (`worldmodels/ops/rnn/`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from worldmodels.core.backends import backend_op, get_recurrent_mode, is_batched, resolve_backend, validate_backend
from worldmodels.core.precision import resolve_precision, validate_precision
from worldmodels.core.strides import canonical


class _RecurrentBase(nn.Module):
    """Parameters laid out exactly as torch's RNN modules, so their state_dicts load."""

    cell: str  # the op's cell name: "gru" or "lstm"
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
        self.flatten_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def flat_weights(self) -> list[torch.Tensor]:
        """Per layer w_ih, w_hh (then b_ih, b_hh): the `weights` argument of the `rnn` op."""
        return [w for layer in range(self.num_layers) for w in self.layer_weights(layer) if w is not None]

    def flatten_parameters(self) -> None:
        """Lay the parameters out as views of one buffer in cuDNN's order, as `nn.GRU` does, so
        cuDNN uses them in place instead of compacting them on every call. CUDA + cuDNN only."""
        weights = self.flat_weights()
        first = weights[0]
        if not (first.is_cuda and torch.backends.cudnn.is_acceptable(first) and torch._use_cudnn_rnn_flatten_weight()):
            return
        if any(w.dtype != first.dtype for w in weights) or len({w.data_ptr() for w in weights}) != len(weights):
            return
        from torch.backends.cudnn import rnn as cudnn_rnn

        with torch.cuda.device_of(first), torch.no_grad():
            torch._cudnn_rnn_flatten_weight(weights, 4 if self.bias else 2, self.input_size,
                                            cudnn_rnn.get_cudnn_mode(self.cell.upper()), self.hidden_size, 0,
                                            self.num_layers, True, False)

    def _apply(self, fn, recurse=True):
        module = super()._apply(fn, recurse)
        self.flatten_parameters()  # .to(cuda) / .half() give new, separate storages
        return module

    def layer_weights(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        w = (getattr(self, f"weight_ih_l{layer}"), getattr(self, f"weight_hh_l{layer}"))
        b = (getattr(self, f"bias_ih_l{layer}"), getattr(self, f"bias_hh_l{layer}")) if self.bias else (None, None)
        return (*w, *b)

    # ---------------------------------------------------------------- input checks
    def _check(self, x: torch.Tensor, hx, is_init: torch.Tensor | None):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor, got {type(x).__name__} {getattr(x, 'dtype', '')}")
        if x.dim() not in (2, 3) or x.shape[-1] != self.input_size:
            raise ValueError(f"x must be [B, T, {self.input_size}] (or [T, {self.input_size}] unbatched), "
                             f"got {list(x.shape)}")
        batch, steps = (x.shape[0], x.shape[1]) if x.dim() == 3 else (None, x.shape[0])
        if steps == 0:
            raise ValueError(f"x must hold at least one step, got shape {list(x.shape)} (T = 0)")
        param_dtype = self.weight_ih_l0.dtype
        if x.dtype != param_dtype and not torch.is_autocast_enabled(x.device.type):
            raise TypeError(f"x dtype {x.dtype} does not match the parameters' dtype {param_dtype}; "
                            f"convert x with x.to({param_dtype}) or the module with .to({x.dtype})")
        states = () if hx is None else ((hx,) if self.n_states == 1 else tuple(hx))
        if hx is not None and len(states) != self.n_states:
            raise ValueError(f"hx must be a pair (h, c) for LSTM, got {len(states)} tensors")
        want = [self.num_layers] + ([] if batch is None else [batch]) + [self.hidden_size]
        for s in states:
            if not isinstance(s, torch.Tensor) or list(s.shape) != want:
                raise ValueError(f"hx must be {want} ([num_layers, B, hidden_size]), "
                                 f"got {list(getattr(s, 'shape', []))}")
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
            states = tuple(x.new_zeros(self.num_layers, x.shape[0], self.hidden_size) for _ in range(self.n_states))
        # Under vmap any of these may carry the vmapped dim (an ensemble often shares x).
        weights = self.flat_weights()
        vmapped = any(is_batched(t) for t in (x, *states, *weights, *([] if is_init is None else [is_init])))
        precision = resolve_precision(self.precision, x.device)
        problem = {"cell": self.cell, "hidden": self.hidden_size, "dtype": x.dtype, "precision": precision}
        name = resolve_backend(backend, self.backend, device=x.device, vmapped=vmapped, family="rnn", problem=problem)
        x, states = canonical(x), tuple(canonical(s) for s in states)
        y, states = backend_op(name, "rnn")(self.cell, x, states, weights, is_init, num_layers=self.num_layers,
                                            bias=self.bias, precision=precision)
        if unbatched:
            y, states = y.squeeze(0), tuple(s.squeeze(1) for s in states)
        return y, (states[0] if self.n_states == 1 else states)


class GRU(_RecurrentBase):
    """Drop-in `nn.GRU(batch_first=True)`: `forward(x, hx=None, is_init=None) -> (y, h_n)`.

    Args:
        input_size: features per step of `x`.
        hidden_size: size of the hidden state.
        num_layers: stacked layers (each reads the previous one's output).
        bias: whether the layers have `bias_ih` / `bias_hh`.
        batch_first: must be True (accepted for drop-in compatibility).
        dropout, bidirectional: must be 0.0 / False (accepted for drop-in compatibility).
        backend: the recurrent backend for this module (None: the context's; see the README).
        precision: its matmul precision (None: the process setting; see the README).
        device, dtype: where and in what dtype the parameters are created.
    """

    cell, gates, n_states = "gru", 3, 1


class LSTM(_RecurrentBase):
    """Drop-in `nn.LSTM(batch_first=True)`: `forward(x, (h, c)=None, is_init=None) -> (y, (h_n, c_n))`.

    Args: as `GRU`'s.
    """

    cell, gates, n_states = "lstm", 4, 2
