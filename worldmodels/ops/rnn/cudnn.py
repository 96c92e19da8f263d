"""GRU / LSTM sequences on the vendor RNN (cuDNN on CUDA, torch's native kernel on CPU).

Same signature and results as `reference.rnn`. Resets split the sequence into segments between
reset times (one host sync to find them, one vendor call per segment). Weights that the module
keeps flattened into one buffer (`GRU.flatten_parameters`) are used in place by cuDNN; otherwise
cuDNN copies them into its layout on every call.
"""

from __future__ import annotations

import torch


def _vendor_call(cell: str, x, states, weights, num_layers: int, bias: bool):
    train = torch.is_grad_enabled()  # cuDNN keeps what its backward needs only in training mode
    if cell == "gru":
        y, h = torch._VF.gru(x, states[0], weights, bias, num_layers, 0.0, train, False, True)
        return y, (h,)
    y, h, c = torch._VF.lstm(x, states, weights, bias, num_layers, 0.0, train, False, True)
    return y, (h, c)


def rnn(cell: str, x, states, weights, is_init, *, num_layers: int, bias: bool, precision: str):
    dtype = weights[0].dtype
    if precision == "bf16" and x.dtype == torch.float32:
        x, states, weights = x.bfloat16(), tuple(s.bfloat16() for s in states), [w.bfloat16() for w in weights]
    steps = x.shape[1]
    starts = [0] if is_init is None else sorted({0, *is_init.any(0).nonzero().flatten().tolist()})
    outputs = []
    for start, end in zip(starts, [*starts[1:], steps]):
        if is_init is not None:
            reset = is_init[:, start].view(1, -1, 1)
            states = tuple(torch.where(reset, torch.zeros_like(s), s) for s in states)
        y, states = _vendor_call(cell, x[:, start:end], states, list(weights), num_layers, bias)
        outputs.append(y)
    y = outputs[0] if len(outputs) == 1 else torch.cat(outputs, 1)
    return y.to(dtype), tuple(s.to(dtype) for s in states)
