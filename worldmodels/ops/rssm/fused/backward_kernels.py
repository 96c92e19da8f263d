"""The @triton.jit code of an unroll's reverse chain: pass 1 of the backward, fused.

    rssm_chain_kernel: one persistent launch, time reversed inside. Per step t it takes the
    cotangent of the carry after step t (deter_t, stoch_t: what later steps and the outputs sent
    back) and gives that of the carry before it, with the weights frozen: no weight gradients on
    the chain (pass 2 of `core/chain_backward.py` computes those as GEMMs over B*T, as cuDNN does).

It is the forward kernel (`forward_kernels.py`) run backwards, with the same work split (grid =
batch tiles x SPLIT ranks, each layer's BLOCK_N-column tiles dealt out round robin, RANKS ranks per
program when emulated under the interpreter), the same flag barrier and the same write-once rule:
every per-step slot of `bsc` [T, B, BW] and every entry of the cotangent sequences is written in
one phase and first read after the barrier that ends it. The pointwise values the derivatives need
come from the forward's saved scratch `fsc` [T, B, FW] (raw layer outputs and their norm partials,
the cell's gates, the Gaussians' softplus' and tanh'), so nothing is recomputed but the transposed
products (and NG's normed gates, from their raw output and partials, as its forward made them).
Phases per step (V1 = dense GRU, Gaussian; V3 = block GRU, categorical; NG = the 2023 dense GRU,
CELL_NG: its gates one normed layer over [deter | x]; the head is the posterior in observe, the
prior in imagine):

    head    dL/d(raw stats): Gaussian (mean + std * eps, std = softplus + min_std) or categorical
            (unimix log-probabilities; the straight-through sample through q = softmax(logits))
    sync    g_h = g_stats @ W_out; act' and the norm's backward (two phases with a norm)
    cell    g_d = g_deter_t + g_hr @ W_pd; the gate derivatives from the saved gates -> GG; NG (normed):
            g_y w_norm of its 3 D normed gates and each rank's partial sums, sync, the norm's backward
            over all 3 D columns (as a dense layer's second phase) -> GG
    sync    V1: g_x = GG @ W_ih; NG: g_x = GG @ W_g[:, D:]; V3: g_u = blockdiag(GG, gates.w^T), then the
            per-block norm's backward, then g_x = g_u @ W_dx; each followed by act' / norm backward
    sync    (POLICY: the Actor in the loop) the action layer's backward (V1, NG: its output is added to
            in's raw; V3: g_u @ W_dx[:, 2H:], act' / norm); the action's total cotangent, its own
            plus g_scaled / max(1, |a|); sync; its distribution's backward (one-hot, tanh-normal,
            normal, bounded normal: from the derivatives its forward saved); sync; the Actor's
            layers, last to first (act' / norm each). An Actor on stop-gradient features sends
            nothing back to the carry: the host launches the chain without POLICY
    sync    g_deter_{t-1} = [direct] + [GG @ W_hh (V1) | GG @ W_g[:, :D] (NG)
                                            | blockdiag(g_u, dyn_h^T) + g_xd @ W_in_deter (V3)]
            g_stoch_{t-1} = g_xs @ W_in_stoch [+ g_feat @ W_actor0, the Actor's input]; both zero where
            is_first[t]; + the outputs' cotangents
    sync

A learned initial state (NG observe: the forward reads the carry as zeros at a reset, the host adds
the initial state's products to the layers' inputs) needs nothing here: at a reset the carry's
cotangent is zero whatever that step's gate derivatives (which read the previous deter as zeros
there; nothing the chain returns depends on them), and pass 2 steps the reference, which reads the
initial state as a parameter, so its gradients come from there.
A transposed product reads W [N, K] as [K, N] rows (`_mmT`: tiles along N, the contiguous axis).
Limit: a layer without a norm must be ELU (its derivative comes from the stored output; SiLU would
need the raw value the forward does not keep there), the RSSM's and the Actor's (unless its
features are stopped): the host falls back to the torch chain (`autograd.fused_chain`).
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs without triton: the host module says the backend is unavailable
    triton = None

if triton is not None:
    from worldmodels.ops.rssm.fused.forward_kernels import (mm_blocks, partial_sums, program_rows, row_stats,
                                                            row_vector)
    from worldmodels.ops.triton_utils import activation_grad, dot, rsqrt, sigmoid, sync, tanh

    @triton.jit
    def _mmT(acc, src, src_stride, rows, src_ok, K, w, w_ld, cols, col_ok, BLOCK_K: tl.constexpr,
             PRECISION: tl.constexpr):
        """acc + src[rows, :K] @ W[:K, cols] for W row-major [K, N] with row stride w_ld: the
        transposed product of a forward layer's W [N, K]."""
        kk = tl.arange(0, BLOCK_K)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + kk
            k_ok = ks < K
            a = tl.load(src + rows[:, None] * src_stride + ks[None, :], mask=src_ok[:, None] & k_ok[None, :],
                        other=0.0)
            wt = tl.load(w + ks[:, None] * w_ld + cols[None, :], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            acc = dot(a, wt, acc, PRECISION)
        return acc

    @triton.jit
    def _after(rank, N, TILE: tl.constexpr, SPLIT: tl.constexpr):
        """The first tile of a second list that rank takes when a list of cdiv(N, TILE) tiles was dealt
        out over the SPLIT ranks in turn (tile j to rank j mod SPLIT) and the second list continues
        the turn: ((rank - cdiv(N, TILE)) mod SPLIT)."""
        return (rank + SPLIT - tl.cdiv(N, TILE) % SPLIT) % SPLIT

    @triton.jit
    def _grad_tile(g, rows, row_ok, cols, col_ok, raw, out, f_stride, mean, inv, nw, nb, gdst, gyw, b_stride,
                   NORM: tl.constexpr, ACT: tl.constexpr):
        """The tail of a dense layer's backward on one tile, g = dL/d(its activated output). NORM 0
        (ELU): dL/d(raw) = g act' (from the stored output) -> gdst. Else g_yw = g act'(y) w_norm with
        y = norm(raw) w_norm (+ b_norm) -> gyw; returns the row sums of g_yw and g_yw xhat."""
        ok = row_ok[:, None] & col_ok[None, :]
        if NORM == 0:
            o = tl.load(out + rows[:, None] * f_stride + cols[None, :], mask=ok, other=0.0)
            tl.store(gdst + rows[:, None] * b_stride + cols[None, :], g * tl.where(o > 0, 1.0, o + 1.0), mask=ok)
            sa = tl.sum(g, 1) * 0.0
            sb = sa
        else:
            xhat = (tl.load(raw + rows[:, None] * f_stride + cols[None, :], mask=ok, other=0.0)
                    - mean[:, None]) * inv[:, None]
            w = row_vector(nw, cols, col_ok)
            y = xhat * w
            if NORM == 2:
                y += row_vector(nb, cols, col_ok)
            gy = tl.where(ok, g * activation_grad(y, ACT) * w, 0.0)
            tl.store(gyw + rows[:, None] * b_stride + cols[None, :], gy, mask=ok)
            sa = tl.sum(gy, 1)
            sb = tl.sum(gy * xhat, 1)
        return sa, sb

    @triton.jit
    def _norm_rows_grad(gdst, gyw, bpart, b_stride, raw, fpart, f_stride, rows, row_ok, N, eps, r0,
                        NORM: tl.constexpr, RANKS: tl.constexpr, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr,
                        BLOCK_N: tl.constexpr):
        """Phase 2 of a normed layer's backward, own column tiles: dL/d(raw) = inv (g_yw - xhat
        mean(g_yw xhat) [- mean(g_yw), LayerNorm]) from the SPLIT ranks' partial sums."""
        mean, inv = row_stats(fpart, f_stride, rows, row_ok, N, eps, NORM, SPLIT, SPLIT_P2)
        sa, sb = partial_sums(bpart, b_stride, rows, row_ok, SPLIT, SPLIT_P2)
        sa = sa / N
        sb = sb / N
        for i in tl.static_range(RANKS):
            for n0 in range((r0 + i) * BLOCK_N, N, SPLIT * BLOCK_N):
                cols = n0 + tl.arange(0, BLOCK_N)
                ok = row_ok[:, None] & (cols < N)[None, :]
                xhat = (tl.load(raw + rows[:, None] * f_stride + cols[None, :], mask=ok, other=0.0)
                        - mean[:, None]) * inv[:, None]
                g = tl.load(gyw + rows[:, None] * b_stride + cols[None, :], mask=ok, other=0.0) - xhat * sb[:, None]
                if NORM == 2:
                    g -= sa[:, None]
                tl.store(gdst + rows[:, None] * b_stride + cols[None, :], g * inv[:, None], mask=ok)

    @triton.jit
    def _store_partials(bpart, b_stride, rows, row_ok, rank, sa, sb):
        tl.store(bpart + rows * b_stride + 2 * rank, sa, mask=row_ok)
        tl.store(bpart + rows * b_stride + 2 * rank + 1, sb, mask=row_ok)

    @triton.jit
    def _dense_grad(flags, pid_b, pid_c, epoch, src, b_stride, K, w, w_ld, N, raw, out, fpart, f_stride, nw, nb,
                    graw, gyw, bpart, rows, row_ok, eps, r0, NORM: tl.constexpr, ACT: tl.constexpr,
                    RANKS: tl.constexpr, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr, NPROG: tl.constexpr,
                    NPROG_P2: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    PRECISION: tl.constexpr):
        """The backward of a dense layer (linear -> norm -> act, its forward slots raw / out / fpart) on
        own column tiles: dL/d(its output) = src[:, :K] @ W (W row-major [K, N]: the next layer's
        weight read transposed), then act' and the norm's backward -> graw = dL/d(raw output), via gyw
        and the partials bpart when normed; ends with a barrier (graw complete). Returns the epoch."""
        if NORM != 0:
            mean, inv = row_stats(fpart, f_stride, rows, row_ok, N, eps, NORM, SPLIT, SPLIT_P2)
        else:
            mean = tl.zeros([BLOCK_B], dtype=graw.dtype.element_ty)
            inv = mean
        for i in tl.static_range(RANKS):
            sa = tl.zeros([BLOCK_B], dtype=graw.dtype.element_ty)
            sb = sa
            for n0 in range((r0 + i) * BLOCK_N, N, SPLIT * BLOCK_N):
                cols = n0 + tl.arange(0, BLOCK_N)
                col_ok = cols < N
                g = _mmT(tl.zeros([BLOCK_B, BLOCK_N], dtype=graw.dtype.element_ty), src, b_stride, rows, row_ok, K, w,
                         w_ld, cols, col_ok, BLOCK_K, PRECISION)
                a, b = _grad_tile(g, rows, row_ok, cols, col_ok, raw, out, f_stride, mean, inv, nw, nb, graw, gyw,
                                  b_stride, NORM, ACT)
                sa += a
                sb += b
            if NORM != 0:
                _store_partials(bpart, b_stride, rows, row_ok, r0 + i, sa, sb)
        epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
        if NORM != 0:
            _norm_rows_grad(graw, gyw, bpart, b_stride, raw, fpart, f_stride, rows, row_ok, N, eps, r0, NORM, RANKS,
                            SPLIT, SPLIT_P2, BLOCK_N)
            epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
        return epoch

    @triton.jit
    def _group_chunk(f_at, gu_at, cs, rg_ok, CG, mean, inv, nw, nb, NORM: tl.constexpr, ACT: tl.constexpr):
        """One BLOCK_C chunk of a per-group norm's backward: xhat, g_yw = g act'(y) w_norm (zero
        outside the group) and the chunk's mask; f_at / gu_at: the raw values' and g's group starts."""
        ok = rg_ok & (cs < CG)[None, None, :]
        w_ok = (cs < CG)[None, None, :]
        xhat = (tl.load(f_at + cs[None, None, :], mask=ok, other=0.0) - mean[:, :, None]) * inv[:, :, None]
        w = tl.load(nw + cs[None, None, :], mask=w_ok, other=0.0)
        y = xhat * w
        if NORM == 2:
            y += tl.load(nb + cs[None, None, :], mask=w_ok, other=0.0)
        gy = tl.where(ok, tl.load(gu_at + cs[None, None, :], mask=ok, other=0.0) * activation_grad(y, ACT) * w, 0.0)
        return xhat, gy, ok

    @triton.jit
    def _norm_groups_grad(gdst, gu, b_stride, raw, f_stride, rows, row_ok, G, CG, nw, nb, eps, r0,
                          NORM: tl.constexpr, ACT: tl.constexpr, RANKS: tl.constexpr, SPLIT: tl.constexpr,
                          BLOCK_B: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr):
        """V3's dyn_out backward, whole groups dealt out over the ranks (as `_norm_groups`): from
        gu = dL/d(activated output), dL/d(raw) of each group of CG columns."""
        gg = tl.arange(0, BLOCK_G)
        cc = tl.arange(0, BLOCK_C)
        for i in tl.static_range(RANKS):
            for g0 in range((r0 + i) * BLOCK_G, G, SPLIT * BLOCK_G):
                gs = g0 + gg
                rg_ok = row_ok[:, None, None] & (gs < G)[None, :, None]
                f_at = raw + rows[:, None, None] * f_stride + gs[None, :, None] * CG
                b_at = rows[:, None, None] * b_stride + gs[None, :, None] * CG
                mean = tl.zeros([BLOCK_B, BLOCK_G], dtype=gdst.dtype.element_ty)
                if NORM == 2:
                    for c0 in range(0, CG, BLOCK_C):
                        cs = c0 + cc
                        ok = rg_ok & (cs < CG)[None, None, :]
                        mean += tl.sum(tl.load(f_at + cs[None, None, :], mask=ok, other=0.0), 2)
                    mean = mean / CG
                var = tl.zeros([BLOCK_B, BLOCK_G], dtype=gdst.dtype.element_ty)
                for c0 in range(0, CG, BLOCK_C):
                    cs = c0 + cc
                    ok = rg_ok & (cs < CG)[None, None, :]
                    x = tl.where(ok, tl.load(f_at + cs[None, None, :], mask=ok, other=0.0) - mean[:, :, None], 0.0)
                    var += tl.sum(x * x, 2)
                inv = rsqrt(var / CG + eps)
                sa = tl.zeros([BLOCK_B, BLOCK_G], dtype=gdst.dtype.element_ty)
                sb = tl.zeros([BLOCK_B, BLOCK_G], dtype=gdst.dtype.element_ty)
                for c0 in range(0, CG, BLOCK_C):
                    xhat, gy, ok = _group_chunk(f_at, gu + b_at, c0 + cc, rg_ok, CG, mean, inv, nw, nb, NORM, ACT)
                    sa += tl.sum(gy, 2)
                    sb += tl.sum(gy * xhat, 2)
                sa = sa / CG
                sb = sb / CG
                for c0 in range(0, CG, BLOCK_C):
                    cs = c0 + cc
                    xhat, gy, ok = _group_chunk(f_at, gu + b_at, cs, rg_ok, CG, mean, inv, nw, nb, NORM, ACT)
                    g = gy - xhat * sb[:, :, None]
                    if NORM == 2:
                        g -= sa[:, :, None]
                    tl.store(gdst + b_at + cs[None, None, :], g * inv[:, :, None], mask=ok)

    @triton.jit
    def _norm_gru_tile(g_d, h, raw, f_stride, gyw, gg, b_stride, rows, ok, cols, col_ok, mean, inv, nw, nb, D,
                       NORM: tl.constexpr):
        """The 2023 dense GRU's cell backward on one tile of deter columns: from g_d = dL/d(new deter), the
        previous deter h and the gates' raw output (reset | cand | update, 3 D wide; normalised here from
        the rows' mean / inv as the forward did), the gates' derivatives g_y = dL/d(normed gates). NORM 0:
        g_y is dL/d(raw) -> gg. Else g_y w_norm -> gyw, for `_norm_rows_grad`'s second phase. Returns
        (the direct term g_d (1 - up), the tile's row sums of g_y w_norm and of g_y w_norm xhat)."""
        at = raw + rows[:, None] * f_stride + cols[None, :]
        xr = tl.load(at, mask=ok, other=0.0)
        xc = tl.load(at + D, mask=ok, other=0.0)
        xu = tl.load(at + 2 * D, mask=ok, other=0.0)
        if NORM != 0:
            xr = (xr - mean[:, None]) * inv[:, None]
            xc = (xc - mean[:, None]) * inv[:, None]
            xu = (xu - mean[:, None]) * inv[:, None]
            wr = row_vector(nw, cols, col_ok)
            wc = row_vector(nw + D, cols, col_ok)
            wu = row_vector(nw + 2 * D, cols, col_ok)
            yr = xr * wr
            yc = xc * wc
            yu = xu * wu
            if NORM == 2:
                yr += row_vector(nb, cols, col_ok)
                yc += row_vector(nb + D, cols, col_ok)
                yu += row_vector(nb + 2 * D, cols, col_ok)
        else:
            yr = xr
            yc = xc
            yu = xu
        sr = sigmoid(yr)
        cand = tanh(sr * yc)
        up = sigmoid(yu - 1.0)
        g_a = g_d * up * (1.0 - cand * cand)
        g_r = tl.where(ok, g_a * yc * sr * (1.0 - sr), 0.0)
        g_c = tl.where(ok, g_a * sr, 0.0)
        g_u = tl.where(ok, g_d * (cand - h) * up * (1.0 - up), 0.0)
        at = rows[:, None] * b_stride + cols[None, :]
        if NORM != 0:
            g_r *= wr
            g_c *= wc
            g_u *= wu
            tl.store(gyw + at, g_r, mask=ok)
            tl.store(gyw + at + D, g_c, mask=ok)
            tl.store(gyw + at + 2 * D, g_u, mask=ok)
            sa = tl.sum(g_r + g_c + g_u, 1)
            sb = tl.sum(g_r * xr + g_c * xc + g_u * xu, 1)
        else:
            tl.store(gg + at, g_r, mask=ok)
            tl.store(gg + at + D, g_c, mask=ok)
            tl.store(gg + at + 2 * D, g_u, mask=ok)
            sa = tl.sum(g_r, 1) * 0.0
            sb = sa
        return g_d * (1.0 - up), sa, sb

    @triton.jit
    def _gaussian_grad(gs, gs_stride, gm, gsd, g_stride, noise, n_stride, sig, f_stride, dst, b_stride, rows,
                       row_ok, N, r0, RANKS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr):
        """dL/d[mean | raw std] of a Gaussian head: stoch = mean + std eps, std = softplus(raw) + min_std
        (sig = softplus'(raw), saved by the forward); gs, gm, gsd: the cotangents of stoch, mean, std."""
        for i in tl.static_range(RANKS):
            for n0 in range((r0 + i) * BLOCK_N, N, SPLIT * BLOCK_N):
                cols = n0 + tl.arange(0, BLOCK_N)
                ok = row_ok[:, None] & (cols < N)[None, :]
                g_s = tl.load(gs + rows[:, None] * gs_stride + cols[None, :], mask=ok, other=0.0)
                at = rows[:, None] * g_stride + cols[None, :]
                g_mean = tl.load(gm + at, mask=ok, other=0.0) + g_s
                g_std = tl.load(gsd + at, mask=ok, other=0.0) + g_s * tl.load(
                    noise + rows[:, None] * n_stride + cols[None, :], mask=ok, other=0.0)
                g_std *= tl.load(sig + rows[:, None] * f_stride + cols[None, :], mask=ok, other=0.0)
                tl.store(dst + rows[:, None] * b_stride + cols[None, :], g_mean, mask=ok)
                tl.store(dst + rows[:, None] * b_stride + N + cols[None, :], g_std, mask=ok)

    @triton.jit
    def _categorical_grad(raw, f_stride, gl, gl_stride, gs, gs_stride, dst, b_stride, rows, row_ok, G, C, unimix, r0,
                          HAS_GL: tl.constexpr, UNIMIX: tl.constexpr, RANKS: tl.constexpr, SPLIT: tl.constexpr,
                          BLOCK_G: tl.constexpr, C_P2: tl.constexpr):
        """dL/d(raw logits) of a categorical head (the latent, or a one-hot actor with G = 1),
        BLOCK_G-group tiles dealt out over the ranks. With UNIMIX the logits are log(q),
        q = (1 - unimix) softmax(raw) + unimix / C, else raw (q = softmax(raw)); the one-hot sample's
        straight-through gradient gs enters through q = softmax(logits); gl: the logits' cotangent."""
        cs = tl.arange(0, C_P2)
        c_ok = (cs < C)[None, None, :]
        for i in tl.static_range(RANKS):
            for g0 in range((r0 + i) * BLOCK_G, G, SPLIT * BLOCK_G):
                gg = g0 + tl.arange(0, BLOCK_G)
                ok = row_ok[:, None, None] & (gg < G)[None, :, None] & c_ok
                at = gg[None, :, None] * C + cs[None, None, :]
                x = tl.where(c_ok, tl.load(raw + rows[:, None, None] * f_stride + at, mask=ok, other=0.0),
                             float("-inf"))
                p = tl.exp(x - tl.max(x, 2)[:, :, None])
                p = p / tl.sum(p, 2)[:, :, None]
                if UNIMIX:
                    q = tl.where(c_ok, (1.0 - unimix) * p + unimix / C, 0.0)
                else:
                    q = p
                g_s = tl.load(gs + rows[:, None, None] * gs_stride + at, mask=ok, other=0.0)
                g = q * (g_s - tl.sum(g_s * q, 2)[:, :, None])
                if HAS_GL:
                    g += tl.load(gl + rows[:, None, None] * gl_stride + at, mask=ok, other=0.0)
                if UNIMIX:
                    g_p = tl.where(c_ok, (1.0 - unimix) * g / q, 0.0)
                    g = p * (g_p - tl.sum(g_p * p, 2)[:, :, None])
                tl.store(dst + rows[:, None, None] * b_stride + at, g, mask=ok)

    @triton.jit
    def rssm_chain_kernel(
        dseq,                # [B, T+1, D] deter0 then the forward's deter outputs (read)
        gd_seq, gs_seq,      # [B, T+1, DP / SP] out: the cotangent of the carry after step t-1 at entry t
                             # (entry T given: the last outputs' cotangents); entry 0 = carry0's
        resets,              # [B, T] int8 (observe; zeros in imagine)
        noise,               # [B, T, S] the latent's noise (Gaussian eps)
        g_deter, g_stoch,    # [B, T, D], [B, T, S] the cotangents of the deter / stoch outputs
        g_stat0, g_stat1,    # [B, T, S] the cotangents of logits, or of mean and std
        action, g_action,    # [B, T, A] the actor's actions and their cotangents (POLICY)
        policy_noise,        # [B, T, A] the actor's noise (POLICY)
        fsc,                 # [T, B, FW] the forward's saved scratch (forward_kernels.py's slots, OFF_*)
        bsc,                 # [T, B, BW] this kernel's write-once per-step slots (OFF_B*)
        flags, consts,       # barrier epochs; [7] min_std, unimix, eps, ... (the forward's)
        in_s_w, in_s_nw, in_s_nb, in_d_w, in_d_nw, in_d_nb, gru_wi, gru_wh, dx_w, dh_w, dyn_nw, dyn_nb, g_w,
        head_w, head_nw, head_nb, out_w,
        act_w0, act_w, act_nw, act_nb, act_ow, ina_w, ina_nw, ina_nb,     # the actor and the action layer (POLICY)
        # D, H, G constexpr: the block-diagonal layers' tiles then load 16 bytes per copy, not 4 (docs/kernels.md)
        B, T, D: tl.constexpr, S, Z, C, H: tl.constexpr, G: tl.constexpr, A, HA, LA, DP, SP, FW, BW,
        OFF_XR, OFF_X, OFF_XP, OFF_UR, OFF_U, OFF_HR, OFF_HD, OFF_HP, OFF_LG, OFF_GT, OFF_SG,
        OFF_P, P_SLOT, HAP, OFF_AO, OFF_AHR, OFF_AH, OFF_AHP, OFF_ASG, OFF_GR, OFF_GP,
        OFF_BGS, OFF_BHY, OFF_BHP, OFF_BHR, OFF_BGD, OFF_BGG, OFF_BGY, OFF_BGP, OFF_BU, OFF_BUR, OFF_BXY, OFF_BXP,
        OFF_BXR, OFF_BAR, OFF_BAY, OFF_BAP, OFF_BGA, OFF_BAO, OFF_BP, BP_SLOT,
        CELL_V3: tl.constexpr, CELL_NG: tl.constexpr, CAT: tl.constexpr, NORM: tl.constexpr, ACT: tl.constexpr,
        UNIMIX: tl.constexpr,
        POLICY: tl.constexpr, A_NORM: tl.constexpr, A_ACT: tl.constexpr, A_DIST: tl.constexpr,
        A_UNIMIX: tl.constexpr, A_P2: tl.constexpr,
        SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr, NPROG: tl.constexpr, NPROG_P2: tl.constexpr,
        BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLK_G: tl.constexpr,
        BLK_C: tl.constexpr, CAT_G: tl.constexpr, C_P2: tl.constexpr, PRECISION: tl.constexpr,
        BLOCK_ND: tl.constexpr,  # column tiles of the cell's and the carry's phases (launch._deter_tile)
    ):
        RANKS: tl.constexpr = SPLIT // NPROG
        pid_b, pid_c, r0, rows, row_ok = program_rows(B, BLOCK_B, RANKS)
        gd_stride = (T + 1) * DP
        gs_stride = (T + 1) * SP
        unimix = tl.load(consts + 1)
        eps = tl.load(consts + 2)
        a_eps = tl.load(consts + 3)
        a_unimix = tl.load(consts + 5)
        DG = D // G
        HG = H // G
        epoch = pid_c * 0
        for tt in range(T):
            t = T - 1 - tt
            fs = fsc + t * B * FW
            bs = bsc + t * B * BW
            prev_ok = row_ok & (tl.load(resets + rows * T + t, mask=row_ok, other=1) == 0)
            # the head's distribution
            if CAT:
                _categorical_grad(fs + OFF_LG, FW, g_stat0 + t * S, T * S, gs_seq + (t + 1) * SP, gs_stride,
                                  bs + OFF_BGS, BW, rows, row_ok, Z, C, unimix, r0, True, UNIMIX, RANKS, SPLIT, CAT_G,
                                  C_P2)
                K_OUT = S
            else:
                _gaussian_grad(gs_seq + (t + 1) * SP, gs_stride, g_stat0 + t * Z, g_stat1 + t * Z, T * Z,
                               noise + t * Z, T * Z, fs + OFF_SG, FW, bs + OFF_BGS, BW, rows, row_ok, Z, r0, RANKS,
                               SPLIT, BLOCK_N)
                K_OUT = 2 * Z
            epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
            # the head's layer: g_h = g_stats @ W_out, then act' / norm
            epoch = _dense_grad(flags, pid_b, pid_c, epoch, bs + OFF_BGS, BW, K_OUT, out_w, H, H, fs + OFF_HR,
                                fs + OFF_HD, fs + OFF_HP, FW, head_nw, head_nb, bs + OFF_BHR, bs + OFF_BHY,
                                bs + OFF_BHP, rows, row_ok, eps, r0, NORM, ACT, RANKS, SPLIT, SPLIT_P2, NPROG,
                                NPROG_P2, BLOCK_B, BLOCK_N, BLOCK_K, PRECISION)
            # the cell: g_d = g_deter_t + g_hr @ W_pd, then the gates' derivatives -> GG, the direct term -> GD
            if CELL_NG and NORM != 0:  # the gates' row statistics, from the forward's partials
                mean_g, inv_g = row_stats(fs + OFF_GP, FW, rows, row_ok, 3 * D, eps, NORM, SPLIT, SPLIT_P2)
            else:
                mean_g = tl.zeros([BLOCK_B], dtype=fsc.dtype.element_ty)
                inv_g = mean_g
            for i in tl.static_range(RANKS):
                sa_g = tl.zeros([BLOCK_B], dtype=fsc.dtype.element_ty)
                sb_g = sa_g
                for n0 in range((r0 + i) * BLOCK_ND, D, SPLIT * BLOCK_ND):
                    cols = n0 + tl.arange(0, BLOCK_ND)
                    col_ok = cols < D
                    ok = row_ok[:, None] & col_ok[None, :]
                    g_d = tl.load(gd_seq + (t + 1) * DP + rows[:, None] * gd_stride + cols[None, :], mask=ok,
                                  other=0.0)
                    g_d = _mmT(g_d, bs + OFF_BHR, BW, rows, row_ok, H, head_w, D, cols, col_ok, BLOCK_K, PRECISION)
                    h = tl.load(dseq + t * D + rows[:, None] * (T + 1) * D + cols[None, :], mask=ok & prev_ok[:, None],
                                other=0.0)
                    gt = fs + OFF_GT + rows[:, None] * FW + cols[None, :]
                    if CELL_V3:
                        sr = sigmoid(tl.load(gt, mask=ok, other=0.0))
                        c = tl.load(gt + D, mask=ok, other=0.0)
                        up = sigmoid(tl.load(gt + 2 * D, mask=ok, other=0.0) - 1.0)
                        cand = tanh(sr * c)
                        g_a = g_d * up * (1.0 - cand * cand)
                        blk = cols // DG
                        at = bs + OFF_BGG + rows[:, None] * BW + (blk * (3 * DG) + cols - blk * DG)[None, :]
                        tl.store(at, g_a * c * sr * (1.0 - sr), mask=ok)
                        tl.store(at + DG, g_a * sr, mask=ok)
                        tl.store(at + 2 * DG, g_d * (cand - h) * up * (1.0 - up), mask=ok)
                        direct = g_d * (1.0 - up)
                    elif CELL_NG:
                        direct, a, b = _norm_gru_tile(g_d, h, fs + OFF_GR, FW, bs + OFF_BGY, bs + OFF_BGG, BW, rows,
                                                      ok, cols, col_ok, mean_g, inv_g, dyn_nw, dyn_nb, D, NORM)
                        sa_g += a
                        sb_g += b
                    else:
                        r = tl.load(gt, mask=ok, other=0.0)
                        z = tl.load(gt + D, mask=ok, other=0.0)
                        n = tl.load(gt + 2 * D, mask=ok, other=0.0)
                        g_np = g_d * (1.0 - z) * (1.0 - n * n)
                        at = bs + OFF_BGG + rows[:, None] * BW + cols[None, :]
                        tl.store(at, g_np * tl.load(gt + 3 * D, mask=ok, other=0.0) * r * (1.0 - r), mask=ok)
                        tl.store(at + D, g_d * (h - n) * z * (1.0 - z), mask=ok)
                        tl.store(at + 2 * D, g_np, mask=ok)
                        tl.store(at + 3 * D, g_np * r, mask=ok)
                        direct = g_d * z
                    tl.store(bs + OFF_BGD + rows[:, None] * BW + cols[None, :], direct, mask=ok)
                if CELL_NG and NORM != 0:
                    _store_partials(bs + OFF_BGP, BW, rows, row_ok, r0 + i, sa_g, sb_g)
            epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
            if CELL_NG and NORM != 0:  # the gates' norm backward, over all 3 D columns -> GG
                _norm_rows_grad(bs + OFF_BGG, bs + OFF_BGY, bs + OFF_BGP, BW, fs + OFF_GR, fs + OFF_GP, FW, rows,
                                row_ok, 3 * D, eps, r0, NORM, RANKS, SPLIT, SPLIT_P2, BLOCK_N)
                epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
            if CELL_V3:
                # g_u = blockdiag(GG, gates.w^T) (gates.w [G, H/G, 3 D/G]), then dyn_out's backward -> g_uraw
                for i in tl.static_range(RANKS):
                    for n0 in range((r0 + i) * BLOCK_N, H, SPLIT * BLOCK_N):
                        cols = n0 + tl.arange(0, BLOCK_N)
                        col_ok = cols < H
                        g_hi = tl.minimum((n0 + BLOCK_N - 1) // HG + 1, G)
                        g = mm_blocks(tl.zeros([BLOCK_B, BLOCK_N], dtype=fsc.dtype.element_ty), bs + OFF_BGG, BW,
                                      rows, row_ok, (n0 // HG) * 3 * DG, g_hi * 3 * DG, g_w, HG * 3 * DG, 1, 0, cols,
                                      col_ok, HG, 3 * DG, BLOCK_K, PRECISION, 3 * DG)
                        ok = row_ok[:, None] & col_ok[None, :]
                        if NORM == 0:  # ELU from the stored output
                            o = tl.load(fs + OFF_U + rows[:, None] * FW + cols[None, :], mask=ok, other=0.0)
                            tl.store(bs + OFF_BUR + rows[:, None] * BW + cols[None, :],
                                     g * tl.where(o > 0, 1.0, o + 1.0), mask=ok)
                        else:
                            tl.store(bs + OFF_BU + rows[:, None] * BW + cols[None, :], g, mask=ok)
                epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
                if NORM != 0:
                    _norm_groups_grad(bs + OFF_BUR, bs + OFF_BU, BW, fs + OFF_UR, FW, rows, row_ok, G, HG, dyn_nw,
                                      dyn_nb, eps, r0, NORM, ACT, RANKS, SPLIT, BLOCK_B, BLK_G, BLK_C)
                    epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
                # g_x = g_uraw @ W_dx[:, :2H] for in_deter's and in_stoch's outputs, then their act' / norms
                if NORM != 0:
                    mean_d, inv_d = row_stats(fs + OFF_XP, FW, rows, row_ok, H, eps, NORM, SPLIT, SPLIT_P2)
                    mean_s, inv_s = row_stats(fs + OFF_XP + 2 * SPLIT, FW, rows, row_ok, H, eps, NORM, SPLIT,
                                              SPLIT_P2)
                else:
                    mean_d = tl.zeros([BLOCK_B], dtype=fsc.dtype.element_ty)
                    inv_d = mean_d
                    mean_s = mean_d
                    inv_s = mean_d
                # in_deter's column tiles and then in_stoch's, dealt out in turn over the ranks (at B16 the
                # H-wide layers have half as many tiles as ranks: each rank one dot instead of two on half)
                for i in tl.static_range(RANKS):
                    sa_d = tl.zeros([BLOCK_B], dtype=fsc.dtype.element_ty)
                    sb_d = sa_d
                    sa_s = sa_d
                    sb_s = sa_d
                    zero = tl.zeros([BLOCK_B, BLOCK_N], dtype=fsc.dtype.element_ty)
                    for n0 in range((r0 + i) * BLOCK_N, H, SPLIT * BLOCK_N):
                        cols = n0 + tl.arange(0, BLOCK_N)
                        col_ok = cols < H
                        g = _mmT(zero, bs + OFF_BUR, BW, rows, row_ok, H, dx_w, 3 * H, cols, col_ok, BLOCK_K,
                                 PRECISION)
                        a, b = _grad_tile(g, rows, row_ok, cols, col_ok, fs + OFF_XR, fs + OFF_X, FW, mean_d, inv_d,
                                          in_d_nw, in_d_nb, bs + OFF_BXR, bs + OFF_BXY, BW, NORM, ACT)
                        sa_d += a
                        sb_d += b
                    for n0 in range(_after(r0 + i, H, BLOCK_N, SPLIT) * BLOCK_N, H, SPLIT * BLOCK_N):
                        cols = n0 + tl.arange(0, BLOCK_N)
                        col_ok = cols < H
                        g = _mmT(zero, bs + OFF_BUR, BW, rows, row_ok, H, dx_w + H, 3 * H, cols, col_ok, BLOCK_K,
                                 PRECISION)
                        a, b = _grad_tile(g, rows, row_ok, cols, col_ok, fs + OFF_XR + H, fs + OFF_X + H, FW, mean_s,
                                          inv_s, in_s_nw, in_s_nb, bs + OFF_BXR + H, bs + OFF_BXY + H, BW, NORM, ACT)
                        sa_s += a
                        sb_s += b
                    if NORM != 0:
                        _store_partials(bs + OFF_BXP, BW, rows, row_ok, r0 + i, sa_d, sb_d)
                        _store_partials(bs + OFF_BXP + 2 * SPLIT, BW, rows, row_ok, r0 + i, sa_s, sb_s)
                epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
                if NORM != 0:
                    _norm_rows_grad(bs + OFF_BXR, bs + OFF_BXY, bs + OFF_BXP, BW, fs + OFF_XR, fs + OFF_XP, FW, rows,
                                    row_ok, H, eps, r0, NORM, RANKS, SPLIT, SPLIT_P2, BLOCK_N)
                    _norm_rows_grad(bs + OFF_BXR + H, bs + OFF_BXY + H, bs + OFF_BXP + 2 * SPLIT, BW, fs + OFF_XR + H,
                                    fs + OFF_XP + 2 * SPLIT, FW, rows, row_ok, H, eps, r0, NORM, RANKS, SPLIT,
                                    SPLIT_P2, BLOCK_N)
                    epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
            elif CELL_NG:
                # g_x = GG @ W_g[:, D:] (x's columns of the gates' weight), then in's act' / norm
                epoch = _dense_grad(flags, pid_b, pid_c, epoch, bs + OFF_BGG, BW, 3 * D, g_w + D, D + H, H, fs + OFF_XR,
                                    fs + OFF_X, fs + OFF_XP, FW, in_s_nw, in_s_nb, bs + OFF_BXR, bs + OFF_BXY,
                                    bs + OFF_BXP, rows, row_ok, eps, r0, NORM, ACT, RANKS, SPLIT, SPLIT_P2, NPROG,
                                    NPROG_P2, BLOCK_B, BLOCK_N, BLOCK_K, PRECISION)
            else:
                # g_x = GG[:, :3D] @ W_ih (the input side's gate derivatives), then in's act' / norm
                epoch = _dense_grad(flags, pid_b, pid_c, epoch, bs + OFF_BGG, BW, 3 * D, gru_wi, H, H, fs + OFF_XR,
                                    fs + OFF_X, fs + OFF_XP, FW, in_s_nw, in_s_nb, bs + OFF_BXR, bs + OFF_BXY,
                                    bs + OFF_BXP, rows, row_ok, eps, r0, NORM, ACT, RANKS, SPLIT, SPLIT_P2, NPROG,
                                    NPROG_P2, BLOCK_B, BLOCK_N, BLOCK_K, PRECISION)
            if POLICY:
                # the action layer: V1 adds its output to in's raw (its cotangent: g_xraw); V3's dense
                # output is dyn_x's third input: g = g_uraw @ W_dx[:, 2H:], then act' / norm
                if CELL_V3:
                    epoch = _dense_grad(flags, pid_b, pid_c, epoch, bs + OFF_BUR, BW, H, dx_w + 2 * H, 3 * H, H,
                                        fs + OFF_AHR, fs + OFF_AH, fs + OFF_AHP, FW, ina_nw, ina_nb, bs + OFF_BAR,
                                        bs + OFF_BAY, bs + OFF_BAP, rows, row_ok, eps, r0, NORM, ACT, RANKS, SPLIT,
                                        SPLIT_P2, NPROG, NPROG_P2, BLOCK_B, BLOCK_N, BLOCK_K, PRECISION)
                    g_ina = bs + OFF_BAR
                else:
                    g_ina = bs + OFF_BXR
                # the action's total cotangent: its own, plus the action layer's through a / max(1, |a|)
                for i in tl.static_range(RANKS):
                    for n0 in range((r0 + i) * BLOCK_N, A, SPLIT * BLOCK_N):
                        cols = n0 + tl.arange(0, BLOCK_N)
                        col_ok = cols < A
                        ok = row_ok[:, None] & col_ok[None, :]
                        at = rows[:, None] * (T * A) + t * A + cols[None, :]
                        g = _mmT(tl.zeros([BLOCK_B, BLOCK_N], dtype=fsc.dtype.element_ty), g_ina, BW, rows, row_ok, H,
                                 ina_w, A, cols, col_ok, BLOCK_K, PRECISION)
                        g = g / tl.maximum(tl.abs(tl.load(action + at, mask=ok, other=0.0)), 1.0)
                        g += tl.load(g_action + at, mask=ok, other=0.0)
                        tl.store(bs + OFF_BGA + rows[:, None] * BW + cols[None, :], g, mask=ok)
                epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
                # the action's distribution -> dL/d(the actor's raw output)
                if A_DIST == 0:
                    _categorical_grad(fs + OFF_AO, FW, g_action, 0, bs + OFF_BGA, BW, bs + OFF_BAO, BW, rows, row_ok, 1,
                                      A, a_unimix, r0, False, A_UNIMIX, RANKS, SPLIT, 1, A_P2)
                    K_AO = A
                else:
                    for i in tl.static_range(RANKS):
                        for n0 in range((r0 + i) * BLOCK_N, A, SPLIT * BLOCK_N):
                            cols = n0 + tl.arange(0, BLOCK_N)
                            ok = row_ok[:, None] & (cols < A)[None, :]
                            at = rows[:, None] * (T * A) + t * A + cols[None, :]
                            g = tl.load(bs + OFF_BGA + rows[:, None] * BW + cols[None, :], mask=ok, other=0.0)
                            sg = fs + OFF_ASG + rows[:, None] * FW + cols[None, :]
                            if A_DIST == 1:  # action = tanh(sample), mean = 5 tanh(raw / 5)
                                act = tl.load(action + at, mask=ok, other=0.0)
                                g = g * (1.0 - act * act)
                                g_mean = g * tl.load(sg + A, mask=ok, other=0.0)
                            elif A_DIST == 3:  # bounded normal: mean = tanh(raw mean), sg + A its derivative
                                g_mean = g * tl.load(sg + A, mask=ok, other=0.0)
                            else:
                                g_mean = g
                            g_std = g * tl.load(policy_noise + at, mask=ok, other=0.0) * tl.load(sg, mask=ok,
                                                                                                 other=0.0)
                            tl.store(bs + OFF_BAO + rows[:, None] * BW + cols[None, :], g_mean, mask=ok)
                            tl.store(bs + OFF_BAO + rows[:, None] * BW + A + cols[None, :], g_std, mask=ok)
                    K_AO = 2 * A
                epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
                # the actor's layers, last to first: g = g_raw(next) @ W(next), then act' / norm
                for lt in range(LA):
                    layer = LA - 1 - lt
                    f_at = fs + OFF_P + layer * P_SLOT
                    b_at = bs + OFF_BP + layer * BP_SLOT
                    if lt == 0:  # the output layer's raw gradient, act_ow [K_AO, HA]
                        src = bs + OFF_BAO
                        k = K_AO
                        w = act_ow
                    else:  # layer + 1's, act_w[layer] [HA, HA]
                        src = b_at + BP_SLOT
                        k = HA
                        w = act_w + layer * HA * HA
                    epoch = _dense_grad(flags, pid_b, pid_c, epoch, src, BW, k, w, HA, HA, f_at, f_at + HAP,
                                        f_at + 2 * HAP, FW, act_nw + layer * HA, act_nb + layer * HA, b_at, b_at + HAP,
                                        b_at + 2 * HAP, rows, row_ok, a_eps, r0, A_NORM, A_ACT, RANKS, SPLIT, SPLIT_P2,
                                        NPROG, NPROG_P2, BLOCK_B, BLOCK_N, BLOCK_K, PRECISION)
            # the carry before step t: zero where is_first[t]; plus the cotangents of step t-1's outputs
            for i in tl.static_range(RANKS):
                for n0 in range((r0 + i) * BLOCK_ND, D, SPLIT * BLOCK_ND):
                    cols = n0 + tl.arange(0, BLOCK_ND)
                    col_ok = cols < D
                    ok = row_ok[:, None] & col_ok[None, :]
                    g = tl.load(bs + OFF_BGD + rows[:, None] * BW + cols[None, :], mask=ok, other=0.0)
                    if CELL_V3:
                        g_hi = tl.minimum((n0 + BLOCK_ND - 1) // DG + 1, G)
                        g = mm_blocks(g, bs + OFF_BUR, BW, rows, row_ok, (n0 // DG) * HG, g_hi * HG, dh_w, DG * HG, 1,
                                      0, cols, col_ok, DG, HG, BLOCK_K, PRECISION, HG)
                        g = _mmT(g, bs + OFF_BXR, BW, rows, row_ok, H, in_d_w, D, cols, col_ok, BLOCK_K, PRECISION)
                    elif CELL_NG:  # GG @ W_g[:, :D]: deter's columns of the gates' weight [3 D, D + H]
                        g = _mmT(g, bs + OFF_BGG, BW, rows, row_ok, 3 * D, g_w, D + H, cols, col_ok, BLOCK_K,
                                 PRECISION)
                    else:
                        g = _mmT(g, bs + OFF_BGG, BW, rows, row_ok, 2 * D, gru_wh, D, cols, col_ok, BLOCK_K, PRECISION)
                        g = _mmT(g, bs + OFF_BGG + 3 * D, BW, rows, row_ok, D, gru_wh + 2 * D * D, D, cols, col_ok,
                                 BLOCK_K, PRECISION)
                    if POLICY:  # the actor reads [stoch, deter]: act_w0 [HA, S + D]
                        g = _mmT(g, bs + OFF_BP, BW, rows, row_ok, HA, act_w0 + S, S + D, cols, col_ok, BLOCK_K,
                                 PRECISION)
                    # tl.where, not `ok & (t > 0)`: the interpreter splats a scalar compare to int32 data, and
                    # Triton >= 3.9's interpreted tl.load rejects a non-bool mask ("mask has unsupported dtype")
                    g = tl.where(prev_ok[:, None], g, 0.0) + tl.load(
                        g_deter + rows[:, None] * (T * D) + (t - 1) * D + cols[None, :],
                        mask=tl.where(t > 0, ok, False), other=0.0)
                    tl.store(gd_seq + t * DP + rows[:, None] * gd_stride + cols[None, :], g, mask=ok)
                if CELL_V3:
                    g_xs = bs + OFF_BXR + H  # [in_deter | in_stoch]
                else:
                    g_xs = bs + OFF_BXR
                # stoch's tiles continue deter's turn over the ranks
                for n0 in range(_after(r0 + i, D, BLOCK_ND, SPLIT) * BLOCK_N, S, SPLIT * BLOCK_N):
                    cols = n0 + tl.arange(0, BLOCK_N)
                    col_ok = cols < S
                    ok = row_ok[:, None] & col_ok[None, :]
                    g = _mmT(tl.zeros([BLOCK_B, BLOCK_N], dtype=fsc.dtype.element_ty), g_xs, BW, rows, row_ok, H,
                             in_s_w, S, cols, col_ok, BLOCK_K, PRECISION)
                    if POLICY:
                        g = _mmT(g, bs + OFF_BP, BW, rows, row_ok, HA, act_w0, S + D, cols, col_ok, BLOCK_K, PRECISION)
                    g = tl.where(prev_ok[:, None], g, 0.0) + tl.load(
                        g_stoch + rows[:, None] * (T * S) + (t - 1) * S + cols[None, :],
                        mask=tl.where(t > 0, ok, False), other=0.0)  # not `ok & (t > 0)`: as for deter's
                    tl.store(gs_seq + t * SP + rows[:, None] * gs_stride + cols[None, :], g, mask=ok)
            epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
