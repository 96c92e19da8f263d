"""Launching the fused GRU / LSTM kernels (`forward_kernels.rnn_forward_kernel`,
`backward_kernels.rnn_backward_kernel`): the launch configuration (`_config`: tile shapes, column
groups SPLIT, W_RESIDENT; `_grid`), the off-chain GEMMs, and the loops over layers.

    forward(cell, x, h0, c0, weights, is_init, num_layers, bias, precision, save) -> (h_n, c_n, ys, saved)
    backward(cell, x, h0, c0, weights, is_init, ys, saved, g_ys, g_hn, g_cn, num_layers, bias, precision)
        -> (dx, dh0, dc0, d_weights)

Shapes as the custom ops in `autograd.py`. Launch configurations and their timings: docs/kernels.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from worldmodels.ops.rnn.reference import GATES, layer_weights
from worldmodels.ops.triton_utils import kernel_precision, lines, operand_dtype, overrides

try:
    import triton
    from triton.runtime.errors import OutOfResources
except ImportError:  # CPU installs without triton: `entry.available` says no
    triton = None

if triton is not None:
    from worldmodels.ops.rnn.fused.backward_kernels import rnn_backward_kernel
    from worldmodels.ops.rnn.fused.forward_kernels import rnn_forward_kernel

SAVED = {"gru": 4, "lstm": 5}  # per step: GRU r z n (W_hn h + b_hn); LSTM i f g o c


def _pow2(n: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(n))


def _config(cell: str, batch: int, hidden: int, device: torch.device, dtype: torch.dtype, precision: str) -> dict:
    """Launch configuration: batch tile, column tile, K tile, column groups (SPLIT), warps, and
    W_RESIDENT (one column tile per program, its W_hh slice held in registers across steps); keys
    overridden by `triton_utils.launch_overrides("rnn", ...)` win."""
    if device.type != "cuda":  # interpreter: programs run one after another, so no split
        cfg = dict(BLOCK_B=16, BLOCK_H=16, BLOCK_K=16, SPLIT=1, num_warps=4)
    elif dtype == torch.float64:  # FMA dots over a [16, 16, 16] product: small tiles
        cfg = dict(BLOCK_B=16, BLOCK_H=16, BLOCK_K=16, SPLIT=1, num_warps=4)
    else:  # from the sweep in docs/kernels.md: fill the SMs with (batch tiles x column groups)
        block_b = 32 if batch > 64 else min(64, _pow2(batch))
        block_h = 32 if hidden >= 256 else 16
        n_b = triton.cdiv(batch, block_b)
        n_c = triton.cdiv(hidden, block_h)
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        split = max(1, min(n_c, sms // n_b))
        w_bytes = GATES[cell] * _pow2(hidden) * block_h * (2 if dtype == torch.bfloat16 else 4)
        # tf32x3 splits W into two tf32 halves: twice the shared memory (262 KB, over the limit)
        resident = cell == "gru" and n_b > 1 and split == n_c and w_bytes <= 96 << 10 and precision != "tf32x3"
        cfg = dict(BLOCK_B=block_b, BLOCK_H=block_h, BLOCK_K=64 if hidden >= 64 else _pow2(hidden),
                   SPLIT=split, W_RESIDENT=resident, num_warps=8 if resident else 4)
    return {**cfg, **overrides("rnn")}


def _grid(batch: int, hidden: int, cfg: dict, device: torch.device):
    n_b = triton.cdiv(batch, cfg["BLOCK_B"])
    n_c = triton.cdiv(hidden, cfg["BLOCK_H"])
    split = min(cfg["SPLIT"], n_c)
    tiles = triton.cdiv(n_c, split)
    split = triton.cdiv(n_c, tiles)  # no program without columns
    if split > 1:
        if device.type != "cuda":
            raise ValueError("column-split launches need a GPU (the interpreter runs programs one by one)")
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        if n_b * split > sms:  # every program of the grid must be resident for the step barrier
            raise ValueError(f"split launch of {n_b * split} programs exceeds the {sms} SMs")
    resident = bool(cfg.get("W_RESIDENT", False)) and tiles == 1
    meta = dict(BLOCK_B=cfg["BLOCK_B"], BLOCK_H=cfg["BLOCK_H"], TILES=tiles, SPLIT=split,
                BLOCK_K=_pow2(hidden) if resident else cfg["BLOCK_K"], W_RESIDENT=resident,
                SPLIT_P2=triton.next_power_of_2(split), num_warps=cfg["num_warps"],
                BARRIER=cfg.get("BARRIER", True))
    return (n_b, split), meta


def _launch(kernel, grid, meta: dict, args: tuple, consts: dict) -> dict:
    """Launch; where the W_hh slice does not fit on chip (the compiler says so before anything
    runs), launch the streaming variant instead. Returns the meta that ran."""
    try:
        kernel[grid](*args, **consts, **meta)
    except OutOfResources:
        if not meta["W_RESIDENT"]:
            raise
        meta = {**meta, "W_RESIDENT": False, "BLOCK_K": min(meta["BLOCK_K"], 64), "num_warps": 4}
        kernel[grid](*args, **consts, **meta)
    return meta


def _hh_operand(w_hh: torch.Tensor, precision: str, sd: torch.dtype) -> torch.Tensor:
    """W_hh as the kernels stream it (`triton_utils.operand_dtype`: bf16 in bf16 mode on the GPU)."""
    return w_hh.to(operand_dtype(precision, sd)).contiguous()


def _input_gates(x: torch.Tensor, w_ih: torch.Tensor, b_ih, precision: str, state_dtype) -> torch.Tensor:
    """x W_ih^T + b_ih over all B*T rows at once (off the recurrent chain), in the state dtype."""
    if precision == "bf16" and state_dtype == torch.float32:
        out = F.linear(x.bfloat16(), w_ih.bfloat16()).float()
        return out if b_ih is None else out + b_ih.float()
    return F.linear(x.to(state_dtype), w_ih.to(state_dtype), None if b_ih is None else b_ih.to(state_dtype))


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the state, the gates and the accumulators: float64 for float64 inputs, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def forward(cell, x, h0, c0, weights, is_init, num_layers, bias, precision, save):
    """The layers' forward launches; returns (h_n, c_n, ys, saved) as `autograd.forward_op` documents."""
    lstm = cell == "lstm"
    n_saved = SAVED[cell]
    batch, steps, _ = x.shape
    hidden = h0.shape[-1]
    sd = state_dtype(x.dtype)
    ys = x.new_empty(num_layers, batch, steps + 1, lines(hidden), dtype=sd)
    saved = x.new_empty((num_layers, batch, steps, n_saved * hidden) if save else (0,), dtype=sd)
    h_n = x.new_empty(num_layers, batch, hidden, dtype=sd)
    c_n = x.new_empty(num_layers, batch, hidden, dtype=sd) if lstm else x.new_empty(0, dtype=sd)
    if steps == 0 or batch == 0:
        ys[:, :, :1, :hidden].copy_(h0.unsqueeze(2))
        h_n.copy_(h0)
        if lstm:
            c_n.copy_(c0)
        return h_n, c_n, ys, saved
    resets = is_init.to(torch.int8).contiguous() if is_init is not None else x.new_empty(0, dtype=torch.int8)
    cfg = _config(cell, batch, hidden, x.device, sd, precision)
    grid, meta = _grid(batch, hidden, cfg, x.device)
    kprec = kernel_precision(precision, sd)
    layer_in = x
    for layer in range(num_layers):
        w_ih, w_hh, b_ih, b_hh = layer_weights(weights, layer, bias)
        gx = _input_gates(layer_in, w_ih, b_ih, precision, sd).contiguous()  # [B, T, G*H]
        hseq = ys[layer]
        hseq[:, 0, :hidden].copy_(h0[layer])
        c = c0[layer].to(sd).clone() if lstm else hseq  # c_n is written from it below
        flags = torch.zeros(grid[0] * grid[1], dtype=torch.int32, device=x.device)
        b = b_hh.to(sd).contiguous() if bias else gx
        meta = _launch(rnn_forward_kernel, grid, meta, (
            gx, _hh_operand(w_hh, precision, sd), b, resets, hseq, c,
            saved[layer] if save else gx, flags, batch, steps, hidden, hseq.shape[-1]),
            dict(LSTM=lstm, HAS_BIAS=bias, HAS_RESET=is_init is not None, SAVE=save, PRECISION=kprec))
        h_n[layer].copy_(hseq[:, steps, :hidden])
        if lstm:
            c_n[layer].copy_(c)
        layer_in = hseq[:, 1:, :hidden]
    return h_n, c_n, ys, saved


def _previous(initial: torch.Tensor, seq: torch.Tensor, is_init) -> torch.Tensor:
    """[B, T, H]: the state entering step t (after its reset), from the initial one and seq[:, t-1]."""
    prev = torch.cat([initial.unsqueeze(1), seq[:, :-1]], 1)
    return prev if is_init is None else prev.masked_fill(is_init.unsqueeze(-1), 0.0)


def backward(cell, x, h0, c0, weights, is_init, ys, saved, g_ys, g_hn, g_cn, num_layers, bias, precision):
    """The layers' backward launches, last layer first, then the weight gradients as GEMMs over B*T;
    returns (dx, dh0, dc0, d_weights) as `autograd.backward_op` documents."""
    lstm = cell == "lstm"
    gates = GATES[cell]
    batch, steps, _ = x.shape
    hidden = h0.shape[-1]
    sd = ys.dtype
    resets = is_init.to(torch.int8).contiguous() if is_init is not None else x.new_empty(0, dtype=torch.int8)
    cfg = _config(cell, batch, hidden, x.device, sd, precision)
    grid, meta = _grid(batch, hidden, cfg, x.device)
    kprec = kernel_precision(precision, sd)
    dh0, dc0 = torch.empty_like(h0, dtype=sd), torch.empty_like(h0, dtype=sd)
    d_weights: list[torch.Tensor] = [None] * len(weights)  # type: ignore[list-item]
    dy = g_ys[num_layers - 1, :, 1:, :hidden].to(sd).contiguous()
    for layer in reversed(range(num_layers)):
        w_ih, w_hh, b_ih, b_hh = layer_weights(weights, layer, bias)
        layer_in = x.to(sd) if layer == 0 else ys[layer - 1, :, 1:, :hidden]
        sv = saved[layer]
        h_prev = ys[layer, :, :-1, :hidden]
        h_prev = (h_prev if is_init is None else h_prev.masked_fill(is_init.unsqueeze(-1), 0.0)).contiguous()
        prev = _previous(c0[layer].to(sd), sv[..., 4 * hidden:], is_init).contiguous() if lstm else h_prev
        dgx = x.new_empty(batch, steps, lines(gates * hidden), dtype=sd)
        dgh = dgx if lstm else torch.empty_like(dgx)
        dhbuf = x.new_empty(2, batch, hidden, dtype=sd)
        dhbuf[0].copy_(g_hn[layer])
        dc = g_cn[layer].to(sd).clone() if lstm else dhbuf
        flags = torch.zeros(grid[0] * grid[1], dtype=torch.int32, device=x.device)
        if steps > 0 and batch > 0:
            meta = _launch(rnn_backward_kernel, grid, meta, (
                dy, _hh_operand(w_hh, precision, sd), resets, prev, sv, dhbuf, dc, dgx, dgh, flags,
                batch, steps, hidden, dgx.shape[-1]), dict(LSTM=lstm, HAS_RESET=is_init is not None, PRECISION=kprec))
        dh0[layer].copy_(dhbuf[steps % 2])
        if lstm:
            dc0[layer].copy_(dc)
        dgx2 = dgx[..., :gates * hidden].reshape(-1, gates * hidden)
        dgh2 = dgx2 if lstm else dgh[..., :gates * hidden].reshape(-1, gates * hidden)
        per = 4 if bias else 2
        d_weights[layer * per] = (dgx2.t() @ layer_in.reshape(-1, layer_in.shape[-1])).to(w_ih.dtype)
        d_weights[layer * per + 1] = (dgh2.t() @ h_prev.reshape(-1, hidden)).to(w_hh.dtype)
        if bias:
            d_weights[layer * per + 2] = dgx2.sum(0).to(b_ih.dtype)
            d_weights[layer * per + 3] = dgh2.sum(0).to(b_hh.dtype)
        dy = (dgx2 @ w_ih.to(sd)).reshape(batch, steps, -1)  # gradient of this layer's input
        if layer > 0:
            dy = dy + g_ys[layer - 1, :, 1:, :hidden].to(sd)
    return dy.to(x.dtype), dh0.to(h0.dtype), (dc0.to(h0.dtype) if lstm else x.new_empty(0)), d_weights
