"""`triton` backend for plain GRU / LSTM sequences: persistent kernels with the time loop inside.

    rnn(cell, x, states, weights, is_init, *, num_layers, bias, precision) -> (y, states)

Same interface and math as `reference.rnn` (torch.nn.GRU / nn.LSTM, batch_first, gate orders
r,z,n and i,f,g,o; `is_init[b, t]` zeroes h (and c) before step t).

Plan, per layer (G = 3 gates for GRU, 4 for LSTM; "state dtype" = float32, float64 for float64 input):
- off the chain: gx = x W_ih^T + b_ih, one GEMM over B*T          -> [B, T, G*H]
- forward kernel, grid (batch tiles, column groups), the time loop inside. Step t, for each of
  the program's BLOCK_H-column tiles of the hidden state:
      acc_g = h_{t-1} @ W_hh[g]^T[:, cols]   (K-loop over H with W_hh streamed from L2, or with
                                            W_RESIDENT the program's W_hh slice loaded once)
      gates, h_t[:, cols] (and c_t) in registers, fp32  -> hseq[:, t+1], saved gates
  then a step barrier: within one program a CTA barrier; with the columns split over SPLIT
  programs, a flag barrier between the programs of one batch tile (each writes the step number
  to its flag with release semantics and spins until its group's flags reach it).
  What one program reads of other programs' writes (h_{t-1} in the forward, dgh_t in the
  backward) lives in write-once sequence buffers whose (b, t) rows are padded to whole 128-byte
  lines: Triton pipelines those loads as `cp.async.ca`, which caches in the SM's non-coherent L1
  (`.cg` and `volatile` are dropped), so a line must never be read before it is completely
  written; with shared lines it was (stale values, seen on the H200 when H*4 % 128 != 0).
  Own columns (h_prev, c, dh, dc) are read back only by the program that wrote them.
- backward kernel, same grid, time reversed, two phases per step (each ending in a barrier):
      1. gate gradients of the program's columns from dh = dh_next + dy[t] and the saved gates
         -> dgx[:, t] (gradient of the input-side preactivations), dgh[:, t] (hidden side)
      2. dh_{t-1}[:, cols] = dgh[:, t] @ W_hh[:, cols] (+ dh * z for GRU), zeroed at resets
- after the kernel, weight gradients as GEMMs over B*T (as cuDNN does):
      dW_ih = dgx^T x, db_ih = sum dgx, dW_hh = dgh^T h_prev, db_hh = sum dgh, dx = dgx W_ih.
Precision: "ieee" / "tf32" / "tf32x3" go to `tl.dot(input_precision=...)`, tf32's operands rounded
to the nearest tf32 first (`_round_tf32`: the tensor cores would truncate them, a bias that adds
up over steps); "bf16" casts the dot operands (W_hh is cast once on the host) and accumulates in
fp32. State and gates stay fp32.

Registered as torch.library custom ops (`worldmodels::triton_rnn_forward` / `_backward`) with
fake implementations and autograd, so `torch.compile(fullgraph=True)` traces through them.
On CPU the kernels run only under TRITON_INTERPRET=1 (set before this module is imported and
while its kernels run). Launch configurations and their H200 timings: docs/kernels.md.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Optional

import torch
import torch.nn.functional as F

from worldmodels.core.triton_support import warn_if_slower_than_cudnn
from worldmodels.ops.rnn.reference import GATES, layer_weights
from worldmodels.ops.triton_utils import overrides

try:
    import triton
    import triton.language as tl
    from triton.runtime.errors import OutOfResources
except ImportError:  # CPU installs without triton: `available` says no
    triton = None

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_SAVED = {"gru": 4, "lstm": 5}  # per step: GRU r z n (W_hn h + b_hn); LSTM i f g o c
_L2_BUDGET_BYTES = 24 << 20  # W_hh of one layer must stay resident in L2 across steps (50 MB on H100/H200)
PRECISIONS = ("ieee", "tf32", "tf32x3", "bf16")


def available(device: torch.device | str) -> bool:
    """CUDA with triton importable, or CPU when TRITON_INTERPRET=1 was set before import."""
    device = torch.device(device)
    if triton is None:
        return False
    if device.type == "cuda":
        return torch.cuda.is_available() and not _INTERPRET
    return device.type == "cpu" and _INTERPRET


def unsupported_reason(cell: str, hidden_size: int, dtype: torch.dtype = torch.float32) -> str | None:
    """Why the triton op cannot run this shape / dtype, or None when it can."""
    if cell not in GATES:
        return f"cell={cell!r} is not one of {list(GATES)}"
    if dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        return f"dtype {dtype} is not supported (float32, float64, bfloat16, float16)"
    w_bytes = GATES[cell] * hidden_size * hidden_size * (8 if dtype == torch.float64 else 4)
    if w_bytes > _L2_BUDGET_BYTES:
        return (f"hidden_size={hidden_size}: W_hh ({w_bytes >> 20} MiB) exceeds the {_L2_BUDGET_BYTES >> 20} MiB "
                f"the persistent kernel keeps in L2 across steps")
    return None


def supports(cell: str, hidden_size: int, dtype: torch.dtype = torch.float32) -> bool:
    """For the registry: `auto` falls back where this is False; explicit `triton` raises the reason."""
    return unsupported_reason(cell, hidden_size, dtype) is None


def fits(problem: dict) -> bool:
    """Whether `auto` picks these kernels for a GRU / LSTM call: in tf32 / tf32x3 / bf16, where they beat
    cuDNN (in ieee Triton's fp32 dots are FMAs, without tensor cores), for the shapes they take."""
    if problem.get("precision") not in ("tf32", "tf32x3", "bf16"):
        return False
    return supports(problem["cell"], problem["hidden"], problem["dtype"])


# ---------------------------------------------------------------------------------------------- kernels
if triton is not None:

    @triton.jit
    def _sigmoid(x):
        return 1.0 / (1.0 + tl.exp(-x))

    @triton.jit
    def _tanh(x):
        return 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0

    @triton.jit
    def _add(a, b):
        return a + b

    @triton.jit
    def _round_tf32(x):
        """fp32 -> the nearest tf32 value (ties away from zero; what `cvt.rna.tf32.f32` computes). Fed
        raw fp32, the tensor cores drop the low 13 mantissa bits: a truncation towards zero, whose
        error has the same sign for every term of a dot and adds up over K and over steps (a bias),
        where a rounded operand's error is unbiased."""
        bits = x.to(tl.uint32, bitcast=True)
        return ((bits + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)

    @triton.jit
    def _dot(a, b, acc, PRECISION: tl.constexpr):
        """acc + a @ b in the requested matmul precision (acc fp32, or fp64 for fp64 operands)."""
        if PRECISION == "fma":  # float64 on the GPU: Triton 3.6 has no fp64 MMA for these tiles on sm90
            return acc + tl.reduce(a[:, :, None] * b[None, :, :], 1, _add)
        elif PRECISION == "tf32":  # operands rounded to nearest, not truncated by the MMA (`_round_tf32`)
            return tl.dot(_round_tf32(a.to(tl.float32)), _round_tf32(b), acc, input_precision="tf32",
                          out_dtype=acc.dtype)
        elif PRECISION == "bf16":
            return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
        elif PRECISION == "bf16-emulated":  # the interpreter cannot dot bf16: round, then fp32 dot
            return tl.dot(a.to(tl.bfloat16).to(tl.float32), b.to(tl.bfloat16).to(tl.float32), acc,
                          input_precision="ieee")
        else:
            return tl.dot(a.to(b.dtype), b, acc, input_precision=PRECISION, out_dtype=acc.dtype)

    @triton.jit
    def _step_barrier(flags_ptr, pid_b, pid_c, epoch, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr,
                      BARRIER: tl.constexpr):
        """Every program of this batch tile has finished step `epoch` (stores visible) on return.
        BARRIER=False skips the cross-program part: wrong results, only to time what it costs."""
        tl.debug_barrier()
        if SPLIT > 1 and BARRIER:
            group = flags_ptr + pid_b * SPLIT
            tl.atomic_xchg(group + pid_c, epoch, sem="release", scope="gpu")
            peers = tl.arange(0, SPLIT_P2)
            seen = tl.atomic_add(group + peers, 0, mask=peers < SPLIT, sem="acquire", scope="gpu")
            low = tl.min(tl.where(peers < SPLIT, seen, epoch), 0)
            while low < epoch:
                seen = tl.atomic_add(group + peers, 0, mask=peers < SPLIT, sem="acquire", scope="gpu")
                low = tl.min(tl.where(peers < SPLIT, seen, epoch), 0)
            tl.debug_barrier()

    @triton.jit
    def _count_barrier(flags_ptr, pid_b, epoch, SPLIT: tl.constexpr):
        """`_step_barrier` on one counter per batch tile (its first program's flag, unsigned): each
        program adds 1 and waits for epoch * SPLIT. A poll is one read per program (Triton compiles the
        add of 0 to one `ld.acquire`, broadcast to the CTA through shared memory), where
        `_step_barrier`'s is an acquire atomic per peer (SPLIT^2 atomics on the same lines per round:
        4,096 at 64 ranks). Launch key COUNT_BARRIER (`ops/rssm/triton_launch._flags`)."""
        tl.debug_barrier()
        if SPLIT > 1:
            counter = flags_ptr + pid_b * SPLIT
            target = (epoch * SPLIT).to(counter.dtype.element_ty)
            tl.atomic_add(counter, 1, sem="release", scope="gpu")
            seen = tl.atomic_add(counter, 0, sem="acquire", scope="gpu")
            while seen < target:
                seen = tl.atomic_add(counter, 0, sem="acquire", scope="gpu")
            tl.debug_barrier()

    @triton.jit
    def _resident_w(w_ptr, pid_c, H, stride_k, stride_col, LSTM: tl.constexpr, BLOCK_H: tl.constexpr,
                    BLOCK_K: tl.constexpr):
        """Each gate's [BLOCK_K, BLOCK_H] tile of this program's columns (the forward reads W_hh^T,
        stride_k 1; the backward W_hh, stride_k H). LSTM's fourth gate; GRU gets gate 0 again, unused."""
        kk = tl.arange(0, BLOCK_K)
        cols = pid_c * BLOCK_H + tl.arange(0, BLOCK_H)
        ptrs = w_ptr + kk[:, None] * stride_k + cols[None, :] * stride_col
        ok = (kk < H)[:, None] & (cols < H)[None, :]
        w0 = tl.load(ptrs, mask=ok, other=0.0)
        w1 = tl.load(ptrs + H * H, mask=ok, other=0.0)
        w2 = tl.load(ptrs + 2 * H * H, mask=ok, other=0.0)
        w3 = tl.load(ptrs + 3 * H * H, mask=ok, other=0.0) if LSTM else w0
        return w0, w1, w2, w3

    @triton.jit
    def _rnn_fwd_kernel(
        gx_ptr,     # [B, T, G*H] x W_ih^T + b_ih (state dtype)
        w_ptr,      # [G*H, H] W_hh (matmul operand dtype)
        b_ptr,      # [G*H] b_hh (state dtype), read only when HAS_BIAS
        reset_ptr,  # [B, T] int8, read only when HAS_RESET
        hseq_ptr,   # [B, T+1, HP] h before the first and after every step; hseq[:, 0] = h0 on entry
        c_ptr,      # [B, H] LSTM c: c0 on entry, c_T on exit
        saved_ptr,  # [B, T, S*H] for the backward (GRU r z n hn; LSTM i f g o c), written when SAVE
        flags_ptr,  # [batch tiles * SPLIT] int32 zeros
        B, T, H, HP,
        LSTM: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESET: tl.constexpr, SAVE: tl.constexpr,
        PRECISION: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
        TILES: tl.constexpr, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr, W_RESIDENT: tl.constexpr,
        BARRIER: tl.constexpr,
    ):
        pid_b = tl.program_id(0)
        pid_c = tl.program_id(1)
        G: tl.constexpr = 4 if LSTM else 3
        S: tl.constexpr = 5 if LSTM else 4
        rows = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
        row_ok = rows < B
        kk = tl.arange(0, BLOCK_K)
        if W_RESIDENT:  # TILES == 1 and BLOCK_K >= H: this program's W_hh^T columns, loaded once for all steps
            wr0, wr1, wr2, wr3 = _resident_w(w_ptr, pid_c, H, 1, H, LSTM, BLOCK_H, BLOCK_K)
        for t in range(T):
            h_src = hseq_ptr + rows[:, None] * ((T + 1) * HP) + t * HP  # [BLOCK_B, 1] row starts
            h_dst = h_src + HP
            if HAS_RESET:
                keep = tl.load(reset_ptr + rows * T + t, mask=row_ok, other=1) == 0
            else:
                keep = rows >= 0
            for j in range(TILES):
                cols = (pid_c * TILES + j) * BLOCK_H + tl.arange(0, BLOCK_H)
                col_ok = cols < H
                ok = row_ok[:, None] & col_ok[None, :]
                a0 = tl.full([BLOCK_B, BLOCK_H], 0.0, hseq_ptr.dtype.element_ty)
                a1 = tl.full([BLOCK_B, BLOCK_H], 0.0, hseq_ptr.dtype.element_ty)
                a2 = tl.full([BLOCK_B, BLOCK_H], 0.0, hseq_ptr.dtype.element_ty)
                a3 = tl.full([BLOCK_B, BLOCK_H], 0.0, hseq_ptr.dtype.element_ty)
                if W_RESIDENT:
                    hk = tl.load(h_src + kk[None, :], mask=row_ok[:, None] & (kk < H)[None, :], other=0.0)
                    hk = tl.where(keep[:, None], hk, 0.0)
                    a0 = _dot(hk, wr0, a0, PRECISION)
                    a1 = _dot(hk, wr1, a1, PRECISION)
                    a2 = _dot(hk, wr2, a2, PRECISION)
                    if LSTM:
                        a3 = _dot(hk, wr3, a3, PRECISION)
                for k0 in range(0, 0 if W_RESIDENT else H, BLOCK_K):  # acc_g = h_{t-1} @ W_hh[g]^T[:, cols]
                    ks = k0 + kk
                    k_ok = ks < H
                    hk = tl.load(h_src + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                    hk = tl.where(keep[:, None], hk, 0.0)
                    w_t = w_ptr + cols[None, :] * H + ks[:, None]  # [BLOCK_K, BLOCK_H] tile of W^T
                    w_ok = k_ok[:, None] & col_ok[None, :]
                    a0 = _dot(hk, tl.load(w_t, mask=w_ok, other=0.0), a0, PRECISION)
                    a1 = _dot(hk, tl.load(w_t + H * H, mask=w_ok, other=0.0), a1, PRECISION)
                    a2 = _dot(hk, tl.load(w_t + 2 * H * H, mask=w_ok, other=0.0), a2, PRECISION)
                    if LSTM:
                        a3 = _dot(hk, tl.load(w_t + 3 * H * H, mask=w_ok, other=0.0), a3, PRECISION)
                if HAS_BIAS:
                    a0 += tl.load(b_ptr + cols, mask=col_ok, other=0.0)[None, :]
                    a1 += tl.load(b_ptr + H + cols, mask=col_ok, other=0.0)[None, :]
                    a2 += tl.load(b_ptr + 2 * H + cols, mask=col_ok, other=0.0)[None, :]
                    if LSTM:
                        a3 += tl.load(b_ptr + 3 * H + cols, mask=col_ok, other=0.0)[None, :]
                gx = gx_ptr + rows[:, None] * (T * G * H) + t * (G * H) + cols[None, :]
                x0 = tl.load(gx, mask=ok, other=0.0)
                x1 = tl.load(gx + H, mask=ok, other=0.0)
                x2 = tl.load(gx + 2 * H, mask=ok, other=0.0)
                sv = saved_ptr + rows[:, None] * (T * S * H) + t * (S * H) + cols[None, :]
                here = rows[:, None] * H + cols[None, :]
                if LSTM:
                    x3 = tl.load(gx + 3 * H, mask=ok, other=0.0)
                    i = _sigmoid(x0 + a0)
                    f = _sigmoid(x1 + a1)
                    g = _tanh(x2 + a2)
                    o = _sigmoid(x3 + a3)
                    c = tl.where(keep[:, None], tl.load(c_ptr + here, mask=ok, other=0.0), 0.0)
                    c = f * c + i * g
                    h = o * _tanh(c)
                    tl.store(c_ptr + here, c, mask=ok)
                    if SAVE:
                        tl.store(sv, i, mask=ok)
                        tl.store(sv + H, f, mask=ok)
                        tl.store(sv + 2 * H, g, mask=ok)
                        tl.store(sv + 3 * H, o, mask=ok)
                        tl.store(sv + 4 * H, c, mask=ok)
                else:
                    h_prev = tl.load(h_src + cols[None, :], mask=ok, other=0.0)
                    h_prev = tl.where(keep[:, None], h_prev, 0.0)
                    r = _sigmoid(x0 + a0)
                    z = _sigmoid(x1 + a1)
                    n = _tanh(x2 + r * a2)
                    h = n + z * (h_prev - n)
                    if SAVE:
                        tl.store(sv, r, mask=ok)
                        tl.store(sv + H, z, mask=ok)
                        tl.store(sv + 2 * H, n, mask=ok)
                        tl.store(sv + 3 * H, a2, mask=ok)
                tl.store(h_dst + cols[None, :], h, mask=ok)
            _step_barrier(flags_ptr, pid_b, pid_c, t + 1, SPLIT, SPLIT_P2, BARRIER)

    @triton.jit
    def _rnn_bwd_kernel(
        dy_ptr,     # [B, T, H] gradient of y (state dtype)
        w_ptr,      # [G*H, H] W_hh (matmul operand dtype)
        reset_ptr,  # [B, T] int8, read only when HAS_RESET
        prev_ptr,   # [B, T, H] GRU: h before step t (after its reset); LSTM: c before step t
        saved_ptr,  # [B, T, S*H] from the forward
        dh_ptr,     # [2, B, H] double-buffered dh; dL/dh_T in dh_ptr[0] on entry, dL/dh_0 in dh_ptr[T % 2] on exit
        dc_ptr,     # [B, H] LSTM: dL/dc_T on entry, dL/dc_0 on exit
        dgx_ptr,    # [B, T, GS] gradient of the input-side preactivations (x W_ih^T + b_ih), GS >= G*H
        dgh_ptr,    # [B, T, GS] gradient of the hidden-side ones (h W_hh^T + b_hh); LSTM: == dgx_ptr
        flags_ptr,  # [batch tiles * SPLIT] int32 zeros
        B, T, H, GS,
        LSTM: tl.constexpr, HAS_RESET: tl.constexpr, PRECISION: tl.constexpr,
        BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
        TILES: tl.constexpr, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr, W_RESIDENT: tl.constexpr,
        BARRIER: tl.constexpr,
    ):
        pid_b = tl.program_id(0)
        pid_c = tl.program_id(1)
        G: tl.constexpr = 4 if LSTM else 3
        S: tl.constexpr = 5 if LSTM else 4
        rows = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
        row_ok = rows < B
        kk = tl.arange(0, BLOCK_K)
        if W_RESIDENT:  # TILES == 1 and BLOCK_K >= H: W_hh[g][:, cols] for each gate, loaded once
            wr0, wr1, wr2, wr3 = _resident_w(w_ptr, pid_c, H, H, 1, LSTM, BLOCK_H, BLOCK_K)
        for s in range(T):
            t = T - 1 - s
            dh_src = dh_ptr + (s % 2) * B * H
            dh_dst = dh_ptr + ((s + 1) % 2) * B * H
            if HAS_RESET:
                keep = tl.load(reset_ptr + rows * T + t, mask=row_ok, other=1) == 0
            else:
                keep = rows >= 0
            # phase 1: gate gradients of this program's columns
            for j in range(TILES):
                cols = (pid_c * TILES + j) * BLOCK_H + tl.arange(0, BLOCK_H)
                ok = row_ok[:, None] & (cols < H)[None, :]
                here = rows[:, None] * H + cols[None, :]
                at_t = rows[:, None] * (T * H) + t * H + cols[None, :]
                sv = saved_ptr + rows[:, None] * (T * S * H) + t * (S * H) + cols[None, :]
                dgx = dgx_ptr + rows[:, None] * (T * GS) + t * GS + cols[None, :]
                dh = tl.load(dh_src + here, mask=ok, other=0.0) \
                    + tl.load(dy_ptr + at_t, mask=ok, other=0.0)
                prev = tl.load(prev_ptr + at_t, mask=ok, other=0.0)
                if LSTM:
                    i = tl.load(sv, mask=ok, other=0.0)
                    f = tl.load(sv + H, mask=ok, other=0.0)
                    g = tl.load(sv + 2 * H, mask=ok, other=0.0)
                    o = tl.load(sv + 3 * H, mask=ok, other=0.0)
                    tc = _tanh(tl.load(sv + 4 * H, mask=ok, other=0.0))
                    dc = tl.load(dc_ptr + here, mask=ok, other=0.0) + dh * o * (1.0 - tc * tc)
                    tl.store(dc_ptr + here, tl.where(keep[:, None], dc * f, 0.0), mask=ok)
                    tl.store(dgx, dc * g * i * (1.0 - i), mask=ok)
                    tl.store(dgx + H, dc * prev * f * (1.0 - f), mask=ok)
                    tl.store(dgx + 2 * H, dc * i * (1.0 - g * g), mask=ok)
                    tl.store(dgx + 3 * H, dh * tc * o * (1.0 - o), mask=ok)
                else:
                    r = tl.load(sv, mask=ok, other=0.0)
                    z = tl.load(sv + H, mask=ok, other=0.0)
                    n = tl.load(sv + 2 * H, mask=ok, other=0.0)
                    hn = tl.load(sv + 3 * H, mask=ok, other=0.0)
                    dn = dh * (1.0 - z) * (1.0 - n * n)
                    dz = dh * (prev - n) * z * (1.0 - z)
                    dr = dn * hn * r * (1.0 - r)
                    dgh = dgh_ptr + rows[:, None] * (T * GS) + t * GS + cols[None, :]
                    tl.store(dgx, dr, mask=ok)
                    tl.store(dgx + H, dz, mask=ok)
                    tl.store(dgx + 2 * H, dn, mask=ok)
                    tl.store(dgh, dr, mask=ok)
                    tl.store(dgh + H, dz, mask=ok)
                    tl.store(dgh + 2 * H, dn * r, mask=ok)
            _step_barrier(flags_ptr, pid_b, pid_c, 2 * s + 1, SPLIT, SPLIT_P2, BARRIER)
            # phase 2: dh_{t-1}[:, cols] = dgh_t @ W_hh[:, cols] (+ dh_t * z_t for GRU), zero at resets
            for j in range(TILES):
                cols = (pid_c * TILES + j) * BLOCK_H + tl.arange(0, BLOCK_H)
                col_ok = cols < H
                ok = row_ok[:, None] & col_ok[None, :]
                here = rows[:, None] * H + cols[None, :]
                acc = tl.full([BLOCK_B, BLOCK_H], 0.0, dy_ptr.dtype.element_ty)
                if W_RESIDENT:
                    d_row = dgh_ptr + rows[:, None] * (T * GS) + t * GS + kk[None, :]
                    d_ok = row_ok[:, None] & (kk < H)[None, :]
                    acc = _dot(tl.load(d_row, mask=d_ok, other=0.0), wr0, acc, PRECISION)
                    acc = _dot(tl.load(d_row + H, mask=d_ok, other=0.0), wr1, acc, PRECISION)
                    acc = _dot(tl.load(d_row + 2 * H, mask=d_ok, other=0.0), wr2, acc, PRECISION)
                    if LSTM:
                        acc = _dot(tl.load(d_row + 3 * H, mask=d_ok, other=0.0), wr3, acc, PRECISION)
                for gate in tl.static_range(0 if W_RESIDENT else G):
                    for k0 in range(0, H, BLOCK_K):
                        ks = k0 + kk
                        k_ok = ks < H
                        a = tl.load(dgh_ptr + rows[:, None] * (T * GS) + t * GS + gate * H + ks[None, :],
                                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                        w = tl.load(w_ptr + (gate * H + ks)[:, None] * H + cols[None, :],
                                    mask=k_ok[:, None] & col_ok[None, :], other=0.0)
                        acc = _dot(a, w, acc, PRECISION)
                if not LSTM:
                    dh = tl.load(dh_src + here, mask=ok, other=0.0) \
                        + tl.load(dy_ptr + rows[:, None] * (T * H) + t * H + cols[None, :], mask=ok, other=0.0)
                    z = tl.load(saved_ptr + rows[:, None] * (T * S * H) + t * (S * H) + H + cols[None, :],
                                mask=ok, other=0.0)
                    acc += dh * z
                tl.store(dh_dst + here, tl.where(keep[:, None], acc, 0.0), mask=ok)
            _step_barrier(flags_ptr, pid_b, pid_c, 2 * s + 2, SPLIT, SPLIT_P2, BARRIER)


# ---------------------------------------------------------------------------------------------- launch
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
    else:  # from the H200 sweep in docs/kernels.md: fill the SMs with (batch tiles x column groups)
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


def _kernel_precision(precision: str, state_dtype: torch.dtype) -> str:
    if state_dtype == torch.float64:
        return "ieee" if _INTERPRET else "fma"
    if precision == "bf16":
        return "bf16-emulated" if _INTERPRET else "bf16"
    return precision


def _hh_operand(w_hh: torch.Tensor, precision: str, state_dtype: torch.dtype) -> torch.Tensor:
    if state_dtype == torch.float32 and precision == "bf16":
        return w_hh.to(torch.float32 if _INTERPRET else torch.bfloat16).contiguous()
    return w_hh.to(state_dtype).contiguous()


def _input_gates(x: torch.Tensor, w_ih: torch.Tensor, b_ih, precision: str, state_dtype) -> torch.Tensor:
    """x W_ih^T + b_ih over all B*T rows at once (off the recurrent chain), in the state dtype."""
    if precision == "bf16" and state_dtype == torch.float32:
        out = F.linear(x.bfloat16(), w_ih.bfloat16()).float()
        return out if b_ih is None else out + b_ih.float()
    return F.linear(x.to(state_dtype), w_ih.to(state_dtype), None if b_ih is None else b_ih.to(state_dtype))


def _state_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _forward_impl(cell, x, h0, c0, weights, is_init, num_layers, bias, precision, save):
    lstm = cell == "lstm"
    n_saved = _SAVED[cell]
    batch, steps, _ = x.shape
    hidden = h0.shape[-1]
    sd = _state_dtype(x.dtype)
    ys = x.new_empty(num_layers, batch, steps + 1, _line_padded(hidden), dtype=sd)
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
    kprec = _kernel_precision(precision, sd)
    layer_in = x
    for layer in range(num_layers):
        w_ih, w_hh, b_ih, b_hh = layer_weights(weights, layer, bias)
        gx = _input_gates(layer_in, w_ih, b_ih, precision, sd).contiguous()  # [B, T, G*H]
        hseq = ys[layer]
        hseq[:, 0, :hidden].copy_(h0[layer])
        c = c0[layer].to(sd).clone() if lstm else hseq  # c_n is written from it below
        flags = torch.zeros(grid[0] * grid[1], dtype=torch.int32, device=x.device)
        b = b_hh.to(sd).contiguous() if bias else gx
        meta = _launch(_rnn_fwd_kernel, grid, meta, (
            gx, _hh_operand(w_hh, precision, sd), b, resets, hseq, c,
            saved[layer] if save else gx, flags, batch, steps, hidden, hseq.shape[-1]),
            dict(LSTM=lstm, HAS_BIAS=bias, HAS_RESET=is_init is not None, SAVE=save, PRECISION=kprec))
        h_n[layer].copy_(hseq[:, steps, :hidden])
        if lstm:
            c_n[layer].copy_(c)
        layer_in = hseq[:, 1:, :hidden]
    return h_n, c_n, ys, saved


def _line_padded(n: int) -> int:
    """n rounded up to whole 128-byte lines of fp32 (32 elements): see the module docstring."""
    return -(-n // 32) * 32


def _previous(initial: torch.Tensor, seq: torch.Tensor, is_init) -> torch.Tensor:
    """[B, T, H]: the state entering step t (after its reset), from the initial one and seq[:, t-1]."""
    prev = torch.cat([initial.unsqueeze(1), seq[:, :-1]], 1)
    return prev if is_init is None else prev.masked_fill(is_init.unsqueeze(-1), 0.0)


def _backward_impl(cell, x, h0, c0, weights, is_init, ys, saved, g_ys, g_hn, g_cn, num_layers, bias, precision):
    lstm = cell == "lstm"
    gates = GATES[cell]
    batch, steps, _ = x.shape
    hidden = h0.shape[-1]
    sd = ys.dtype
    resets = is_init.to(torch.int8).contiguous() if is_init is not None else x.new_empty(0, dtype=torch.int8)
    cfg = _config(cell, batch, hidden, x.device, sd, precision)
    grid, meta = _grid(batch, hidden, cfg, x.device)
    kprec = _kernel_precision(precision, sd)
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
        dgx = x.new_empty(batch, steps, _line_padded(gates * hidden), dtype=sd)
        dgh = dgx if lstm else torch.empty_like(dgx)
        dhbuf = x.new_empty(2, batch, hidden, dtype=sd)
        dhbuf[0].copy_(g_hn[layer])
        dc = g_cn[layer].to(sd).clone() if lstm else dhbuf
        flags = torch.zeros(grid[0] * grid[1], dtype=torch.int32, device=x.device)
        if steps > 0 and batch > 0:
            meta = _launch(_rnn_bwd_kernel, grid, meta, (
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


# ---------------------------------------------------------------------------------------------- custom ops
@torch.library.custom_op("worldmodels::triton_rnn_forward", mutates_args=())
def _forward_op(cell: str, x: torch.Tensor, h0: torch.Tensor, c0: Optional[torch.Tensor], weights: list[torch.Tensor],
                is_init: Optional[torch.Tensor], num_layers: int, bias: bool, precision: str, save: bool,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> h_n [L, B, H], c_n [L, B, H] (LSTM; else empty), ys [L, B, T+1, HP] (every layer's h
    before the first and after every step, rows padded to HP = H rounded up to 32), saved
    [L, B, T, S*H] (gates for the backward; empty unless save), all in the state dtype."""
    return _forward_impl(cell, x, h0, c0, weights, is_init, num_layers, bias, precision, save)


@_forward_op.register_fake
def _(cell, x, h0, c0, weights, is_init, num_layers, bias, precision, save):
    batch, steps, _ = x.shape
    hidden = h0.shape[-1]
    sd = _state_dtype(x.dtype)
    c_n = x.new_empty(num_layers, batch, hidden, dtype=sd) if cell == "lstm" else x.new_empty(0, dtype=sd)
    saved = x.new_empty((num_layers, batch, steps, _SAVED[cell] * hidden) if save else (0,), dtype=sd)
    ys = x.new_empty(num_layers, batch, steps + 1, _line_padded(hidden), dtype=sd)
    return x.new_empty(num_layers, batch, hidden, dtype=sd), c_n, ys, saved


@torch.library.custom_op("worldmodels::triton_rnn_backward", mutates_args=())
def _backward_op(cell: str, x: torch.Tensor, h0: torch.Tensor, c0: Optional[torch.Tensor], weights: list[torch.Tensor],
                 is_init: Optional[torch.Tensor], ys: torch.Tensor, saved: torch.Tensor, g_ys: torch.Tensor,
                 g_hn: torch.Tensor, g_cn: Optional[torch.Tensor], num_layers: int, bias: bool, precision: str,
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """-> dx, dh0, dc0 (empty for GRU), one gradient per weight."""
    return _backward_impl(cell, x, h0, c0, weights, is_init, ys, saved, g_ys, g_hn, g_cn, num_layers, bias, precision)


@_backward_op.register_fake
def _(cell, x, h0, c0, weights, is_init, ys, saved, g_ys, g_hn, g_cn, num_layers, bias, precision):
    return (torch.empty_like(x), torch.empty_like(h0),
            torch.empty_like(h0) if cell == "lstm" else x.new_empty(0), [torch.empty_like(w) for w in weights])


def _setup_context(ctx, inputs, output):
    cell, x, h0, c0, weights, is_init, num_layers, bias, precision, save = inputs
    _, _, ys, saved = output
    ctx.save_for_backward(x, h0, c0, is_init, ys, saved, *weights)
    ctx.meta = (cell, num_layers, bias, precision, save)


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
    dx, dh0, dc0, dw = _backward_op(cell, x, h0, c0, weights, is_init, ys, saved, g_ys, g_hn, g_cn,
                                    num_layers, bias, precision)
    return None, dx, dh0, (dc0 if cell == "lstm" else None), list(dw), None, None, None, None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------------------------------------- the op
def rnn(cell: str, x: torch.Tensor, states: tuple[torch.Tensor, ...], weights: Sequence[torch.Tensor],
        is_init: torch.Tensor | None, *, num_layers: int, bias: bool, precision: str,
        ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """GRU / LSTM over a sequence. x [B, T, F]; states (h,) or (h, c), each [L, B, H]; weights per
    layer w_ih [G*H, F_l], w_hh [G*H, H], then b_ih, b_hh when bias; is_init [B, T] bool or None.
    Returns y [B, T, H] (the last layer's h at every step) and the final states, each [L, B, H]."""
    if triton is None:
        raise RuntimeError("the triton backend needs the `triton` package")
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}; expected one of {list(PRECISIONS)}")
    hidden = states[0].shape[-1]
    reason = unsupported_reason(cell, hidden, x.dtype)
    if reason is not None:
        raise ValueError(f"backend='triton' cannot run this {cell.upper()}: {reason}; use backend='cudnn' or 'auto'")
    if not available(x.device):
        raise RuntimeError(f"backend='triton' is not available on {x.device} "
                           "(CUDA with triton, or the CPU with TRITON_INTERPRET=1 set before import)")
    warn_if_slower_than_cudnn(x.device, x.dtype, precision, f"the {cell.upper()}")
    if len(weights) != num_layers * (4 if bias else 2):
        raise ValueError(f"expected {num_layers * (4 if bias else 2)} weight tensors, got {len(weights)}")
    lstm = cell == "lstm"
    h0 = states[0].contiguous()
    c0 = states[1].contiguous() if lstm else None
    x = x.contiguous()
    weights = [w.contiguous() for w in weights]
    save = torch.is_grad_enabled() and any(t.requires_grad for t in (x, *states, *weights))
    h_n, c_n, ys, _ = _forward_op(cell, x, h0, c0, weights, is_init, num_layers, bias, precision, save)
    y = ys[-1, :, 1:, :hidden].to(x.dtype, memory_format=torch.contiguous_format)
    return y, ((h_n.to(x.dtype), c_n.to(x.dtype)) if lstm else (h_n.to(x.dtype),))
