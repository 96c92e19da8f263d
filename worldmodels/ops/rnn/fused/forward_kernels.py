"""The forward kernel of the fused GRU / LSTM op (host side: `launch.py`; contract: `entry.py`).

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
  written; with shared lines it was (stale values when H*4 % 128 != 0).
  Own columns (h_prev, c, dh, dc) are read back only by the program that wrote them.
The backward kernel: `backward_kernels.py`.
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs without triton: `entry.available` says no
    triton = None

if triton is not None:
    from worldmodels.ops.triton_utils import dot, sigmoid, step_barrier, tanh

    @triton.jit
    def resident_w(w_ptr, pid_c, H, stride_k, stride_col, LSTM: tl.constexpr, BLOCK_H: tl.constexpr,
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
    def rnn_forward_kernel(
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
            wr0, wr1, wr2, wr3 = resident_w(w_ptr, pid_c, H, 1, H, LSTM, BLOCK_H, BLOCK_K)
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
                    a0 = dot(hk, wr0, a0, PRECISION)
                    a1 = dot(hk, wr1, a1, PRECISION)
                    a2 = dot(hk, wr2, a2, PRECISION)
                    if LSTM:
                        a3 = dot(hk, wr3, a3, PRECISION)
                for k0 in range(0, 0 if W_RESIDENT else H, BLOCK_K):  # acc_g = h_{t-1} @ W_hh[g]^T[:, cols]
                    ks = k0 + kk
                    k_ok = ks < H
                    hk = tl.load(h_src + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                    hk = tl.where(keep[:, None], hk, 0.0)
                    w_t = w_ptr + cols[None, :] * H + ks[:, None]  # [BLOCK_K, BLOCK_H] tile of W^T
                    w_ok = k_ok[:, None] & col_ok[None, :]
                    a0 = dot(hk, tl.load(w_t, mask=w_ok, other=0.0), a0, PRECISION)
                    a1 = dot(hk, tl.load(w_t + H * H, mask=w_ok, other=0.0), a1, PRECISION)
                    a2 = dot(hk, tl.load(w_t + 2 * H * H, mask=w_ok, other=0.0), a2, PRECISION)
                    if LSTM:
                        a3 = dot(hk, tl.load(w_t + 3 * H * H, mask=w_ok, other=0.0), a3, PRECISION)
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
                    i = sigmoid(x0 + a0)
                    f = sigmoid(x1 + a1)
                    g = tanh(x2 + a2)
                    o = sigmoid(x3 + a3)
                    c = tl.where(keep[:, None], tl.load(c_ptr + here, mask=ok, other=0.0), 0.0)
                    c = f * c + i * g
                    h = o * tanh(c)
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
                    r = sigmoid(x0 + a0)
                    z = sigmoid(x1 + a1)
                    n = tanh(x2 + r * a2)
                    h = n + z * (h_prev - n)
                    if SAVE:
                        tl.store(sv, r, mask=ok)
                        tl.store(sv + H, z, mask=ok)
                        tl.store(sv + 2 * H, n, mask=ok)
                        tl.store(sv + 3 * H, a2, mask=ok)
                tl.store(h_dst + cols[None, :], h, mask=ok)
            step_barrier(flags_ptr, pid_b, pid_c, t + 1, SPLIT, SPLIT_P2, BARRIER)
