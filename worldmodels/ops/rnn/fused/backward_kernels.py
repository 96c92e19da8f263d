"""The backward kernel of the fused GRU / LSTM op (host side: `launch.py`; the forward and the
memory-ordering rule both follow: `forward_kernels.py`).

Same grid as the forward, time reversed, two phases per step (each ending in a barrier):
    1. gate gradients of the program's columns from dh = dh_next + dy[t] and the saved gates
       -> dgx[:, t] (gradient of the input-side preactivations), dgh[:, t] (hidden side)
    2. dh_{t-1}[:, cols] = dgh[:, t] @ W_hh[:, cols] (+ dh * z for GRU), zeroed at resets
After the kernel, weight gradients as GEMMs over B*T (as cuDNN does; `launch.backward`):
    dW_ih = dgx^T x, db_ih = sum dgx, dW_hh = dgh^T h_prev, db_hh = sum dgh, dx = dgx W_ih.
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs without triton: `entry.available` says no
    triton = None

if triton is not None:
    from worldmodels.ops.rnn.fused.forward_kernels import resident_w
    from worldmodels.ops.triton_utils import dot, step_barrier, tanh

    @triton.jit
    def rnn_backward_kernel(
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
            wr0, wr1, wr2, wr3 = resident_w(w_ptr, pid_c, H, H, 1, LSTM, BLOCK_H, BLOCK_K)
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
                    tc = tanh(tl.load(sv + 4 * H, mask=ok, other=0.0))
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
            step_barrier(flags_ptr, pid_b, pid_c, 2 * s + 1, SPLIT, SPLIT_P2, BARRIER)
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
                    acc = dot(tl.load(d_row, mask=d_ok, other=0.0), wr0, acc, PRECISION)
                    acc = dot(tl.load(d_row + H, mask=d_ok, other=0.0), wr1, acc, PRECISION)
                    acc = dot(tl.load(d_row + 2 * H, mask=d_ok, other=0.0), wr2, acc, PRECISION)
                    if LSTM:
                        acc = dot(tl.load(d_row + 3 * H, mask=d_ok, other=0.0), wr3, acc, PRECISION)
                for gate in tl.static_range(0 if W_RESIDENT else G):
                    for k0 in range(0, H, BLOCK_K):
                        ks = k0 + kk
                        k_ok = ks < H
                        a = tl.load(dgh_ptr + rows[:, None] * (T * GS) + t * GS + gate * H + ks[None, :],
                                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                        w = tl.load(w_ptr + (gate * H + ks)[:, None] * H + cols[None, :],
                                    mask=k_ok[:, None] & col_ok[None, :], other=0.0)
                        acc = dot(a, w, acc, PRECISION)
                if not LSTM:
                    dh = tl.load(dh_src + here, mask=ok, other=0.0) \
                        + tl.load(dy_ptr + rows[:, None] * (T * H) + t * H + cols[None, :], mask=ok, other=0.0)
                    z = tl.load(saved_ptr + rows[:, None] * (T * S * H) + t * (S * H) + H + cols[None, :],
                                mask=ok, other=0.0)
                    acc += dh * z
                tl.store(dh_dst + here, tl.where(keep[:, None], acc, 0.0), mask=ok)
            step_barrier(flags_ptr, pid_b, pid_c, 2 * s + 2, SPLIT, SPLIT_P2, BARRIER)
