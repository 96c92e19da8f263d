"""The @triton.jit code of the fused RSSM forward (host side and contract: `entry.py`; plan: `launch.py`).

Work split (v1). Grid = (batch tiles of BLOCK_B rows, NPROG programs per tile); the columns of
every layer are dealt out over SPLIT *ranks* round robin in BLOCK_N-column tiles (rank r owns
tiles r, r + SPLIT, ...). On the GPU each program is one rank (NPROG = SPLIT, RANKS = 1); under
the interpreter (programs run one after another, a cross-program barrier would deadlock) one
program runs all ranks of a phase in turn (NPROG = 1, RANKS = SPLIT), which checks the whole
split bookkeeping on the CPU except the barrier itself. Every layer is one or two *phases*:

    phase 1  own column tiles: dst = [src | src2] @ W^T + bias (+ add), K-loop of `tl.dot`s with
             W in its native [N, K] layout; a layer without norm is activated and final here; a
             normed one stores its raw output and each rank's per-row partial sum and sum of
             squares of its columns (`part[row, 2 rank + {0, 1}]`, zeros for a rank without tiles)
    sync
    phase 2  (normed layers) full-row norm: reduce the SPLIT partials to mean / rms, normalise
             and activate own column tiles raw -> out; per-group norm (V3's dyn_out) and the
             categorical sample: whole groups / latents dealt out over the ranks, read from the
             complete raw output (or, split over K, the sum of its parts: `_linear_k_split`)
    sync

KSR (`launch._k_rows`, 64-row tiles): the normed long-K layers (V3's in_deter, the head, the
Actor's first) split the other way, for wider dot tiles: phase 1 over K (rank p: part p of K, every
column -> its partial product, `_linear_k_rows`), phase 2 over rows (rank q: BLOCK_B / SPLIT whole
rows, the parts' sum, the norm from the whole row, `_norm_k_rows`); the same two barriers.

`sync` (`ops/triton_utils.py`) is the flag barrier over the NPROG programs of a batch tile, with
an epoch that grows by one per barrier (a CTA barrier when NPROG = 1).

Memory ordering. Triton software-pipelines K-loop loads into `cp.async.ca`, which caches in the
SM's L1 (not coherent across SMs) and drops `.cg` / volatile (docs/kernels.md). So everything a
program reads of another program's writes is *write-once*: a fresh slot per step and layer in
`scratch` [T, B, SW] (raw outputs, partials, normalised outputs), the deter / stoch sequences
[B, T, DP / SP] (step 0 reads the caller's deter0 / stoch0, which nothing writes); every (step, row,
slot) region starts on a 128-byte line and is a whole number of lines (offsets and widths rounded
up to 32 elements), so each line is written in exactly one phase and first read (by anyone) after
the barrier that ends it: no line can be cached before it is final. Regions written in a phase
are never read in that phase, not even by their writer.
The op's outputs deter [B, T, D] and stoch [B, T, S] are stored a second time, from the same
registers, into contiguous buffers the kernel never reads (a separate pass over the padded
sequences after the launch would cost a visible share of a short imagination: docs/kernels.md).

Pipelining. The K loops of `_mm`, `_mm3`, `mm_blocks`, `_mm_blocks3` are plain `range` loops, which
Triton's pipeliner software-pipelines at the launch's default num_stages (cp.async with commit / wait
groups). A pipelined load reads exactly the addresses, under the same masks, that the unpipelined loop
reads, only earlier within the same loop run: the prologue sits after the phase's opening barrier
and the loop does not cross a barrier. What those loops read: weights (read-only), the host-
written shares (a_share, e_share), deter / stoch of the previous step or (head) of this step's
finished cell, and scratch slots of earlier phases (x, u, the head output, actor layers, the
scaled action): none is written in the phase that reads it, so the argument above covers them.

Weights are read in their native layouts (no host packing): W [N, K] row-major through
transposed-tile indexing; V3's dyn_h [G, D/G, H/G], gates [G, H/G, 3 D/G] (per block [reset |
cand | update]) and gates.b [G, 3 D/G] by per-block indexing (`mm_blocks`: a column tile reads
only the rows of its own blocks, other blocks' entries masked to zero).

Scalars that must be exact in float64 (epsilons, min_std, unimix) come from a small tensor of the
state dtype (`consts`), since Python floats reach kernels as float32.
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs without triton: the host module says the backend is unavailable
    triton = None

if triton is not None:
    from worldmodels.ops.triton_utils import activation, dot, rsqrt, sigmoid, softplus, sync, tanh

    @triton.jit
    def program_rows(B, BLOCK_B: tl.constexpr, RANKS: tl.constexpr):
        """This program's place in the grid (batch tile, rank program) = (pid_b, pid_c), the first of
        its RANKS ranks, its BLOCK_B rows and which of them are < B."""
        pid_b = tl.program_id(0)
        pid_c = tl.program_id(1)
        rows = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
        return pid_b, pid_c, pid_c * RANKS, rows, rows < B

    @triton.jit
    def row_vector(ptr, cols, col_ok):
        """A row vector [1, BLOCK_N] of ptr[cols] (zeros past the end)."""
        return tl.load(ptr + cols, mask=col_ok, other=0.0)[None, :]

    @triton.jit
    def _gate_bias_at(g_b, cols, DG):
        """Where V3's gates.b [G, 3 D/G] holds the reset biases of deter columns `cols` (the candidate's
        DG further, the update's 2 DG)."""
        g_n = cols // DG
        return g_b + g_n * (3 * DG) + (cols - g_n * DG)

    @triton.jit
    def _mm_step(acc, src, src_stride, rows, src_ok, K, w, w_ld, cols, col_ok, k0, kk, PRECISION: tl.constexpr,
                 mean, inv, s_nw, s_nb, S_NORM: tl.constexpr, S_ACT: tl.constexpr):
        """One BLOCK_K slice of `_mm`."""
        ks = k0 + kk
        k_ok = ks < K
        a_ok = src_ok[:, None] & k_ok[None, :]
        a = tl.load(src + rows[:, None] * src_stride + ks[None, :], mask=a_ok, other=0.0)
        if S_NORM != 0:  # the source is a normed layer's raw output: `_norm_rows`' formula on the load
            y = (a - mean[:, None]) * inv[:, None] * tl.load(s_nw + ks, mask=k_ok, other=0.0)[None, :]
            if S_NORM == 2:
                y += tl.load(s_nb + ks, mask=k_ok, other=0.0)[None, :]
            a = tl.where(a_ok, activation(y, S_ACT), 0.0)
        wt = tl.load(w + cols[None, :] * w_ld + ks[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        return dot(a, wt, acc, PRECISION)

    @triton.jit
    def _mm(acc, src, src_stride, rows, src_ok, K, w, w_ld, cols, col_ok,
            BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
            s_part=None, s_nw=None, s_nb=None, s_eps=None, S_NORM: tl.constexpr = 0, S_ACT: tl.constexpr = 2,
            SPLIT: tl.constexpr = 0, SPLIT_P2: tl.constexpr = 0):
        """acc + src[rows, :K] @ W[cols, :K]^T, W row-major with row stride w_ld; rows where not
        src_ok read as zeros. S_NORM != 0 (a folded norm, `FOLD`): src is a normed layer's raw output,
        with its SPLIT ranks' partials at s_part
        (row stride src_stride), norm weight / bias s_nw / s_nb and activation S_ACT, normalised and
        activated as it is loaded (what `_norm_rows` would have stored)."""
        kk = tl.arange(0, BLOCK_K)
        if S_NORM != 0:  # the ranks' partials: a call site that folds must pass the launch's SPLIT / SPLIT_P2
            tl.static_assert(SPLIT > 0, "a folded load (S_NORM) needs the launch's SPLIT")
            tl.static_assert(SPLIT_P2 >= SPLIT, "a folded load (S_NORM) needs the launch's SPLIT_P2")
            mean, inv = row_stats(s_part, src_stride, rows, src_ok, K, s_eps, S_NORM, SPLIT, SPLIT_P2)
        else:
            mean = None
            inv = None
        for k0 in range(0, K, BLOCK_K):
            acc = _mm_step(acc, src, src_stride, rows, src_ok, K, w, w_ld, cols, col_ok, k0, kk, PRECISION,
                           mean, inv, s_nw, s_nb, S_NORM, S_ACT)
        return acc

    @triton.jit
    def _mm3_step(a0, a1, a2, src, src_stride, rows, src_ok, K, w, w_ld, gate_stride, cols, col_ok, k0, kk,
                  PRECISION: tl.constexpr):
        """One BLOCK_K slice of `_mm3`."""
        ks = k0 + kk
        k_ok = ks < K
        a = tl.load(src + rows[:, None] * src_stride + ks[None, :], mask=src_ok[:, None] & k_ok[None, :], other=0.0)
        w_t = w + cols[None, :] * w_ld + ks[:, None]
        w_ok = k_ok[:, None] & col_ok[None, :]
        a0 = dot(a, tl.load(w_t, mask=w_ok, other=0.0), a0, PRECISION)
        a1 = dot(a, tl.load(w_t + gate_stride, mask=w_ok, other=0.0), a1, PRECISION)
        a2 = dot(a, tl.load(w_t + 2 * gate_stride, mask=w_ok, other=0.0), a2, PRECISION)
        return a0, a1, a2

    @triton.jit
    def _mm3(a0, a1, a2, src, src_stride, rows, src_ok, K, w, w_ld, gate_stride, cols, col_ok,
             BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
        """`_mm` for three gates at once: weight rows w + g * gate_stride share the source tile."""
        kk = tl.arange(0, BLOCK_K)
        for k0 in range(0, K, BLOCK_K):
            a0, a1, a2 = _mm3_step(a0, a1, a2, src, src_stride, rows, src_ok, K, w, w_ld, gate_stride, cols,
                                   col_ok, k0, kk, PRECISION)
        return a0, a1, a2

    @triton.jit
    def _mm_blocks_step(acc, src, src_stride, rows, src_ok, k_hi, w, w_gstride, w_kstride, w_coff, w_cstride, g_n,
                        c_n, col_ok, KG, k0, kk, PRECISION: tl.constexpr):
        """One BLOCK_K slice of `mm_blocks`."""
        ks = k0 + kk
        k_ok = ks < k_hi
        a = tl.load(src + rows[:, None] * src_stride + ks[None, :], mask=src_ok[:, None] & k_ok[None, :], other=0.0)
        g_k = ks // KG
        ok = k_ok[:, None] & col_ok[None, :] & (g_k[:, None] == g_n[None, :])
        wt = tl.load(w + g_n[None, :] * w_gstride + (ks - g_k * KG)[:, None] * w_kstride + w_coff
                     + c_n[None, :] * w_cstride, mask=ok, other=0.0)
        return dot(a, wt, acc, PRECISION)

    @triton.jit
    def mm_blocks(acc, src, src_stride, rows, src_ok, k_lo, k_hi, w, w_gstride, w_kstride, w_coff, cols, col_ok,
                  CG, KG, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, w_cstride=1):
        """acc + the block-diagonal product: output column n of block g = n // CG, c = n % CG reads
        src[:, g KG : (g+1) KG] @ w[g, :, w_coff + c] (w[g, k, c] at g w_gstride + k w_kstride + c w_cstride;
        the backward reads the transposes through w_kstride 1); K runs over [k_lo, k_hi) = the blocks
        of this column tile, entries of other blocks are zero."""
        kk = tl.arange(0, BLOCK_K)
        g_n = cols // CG
        c_n = cols - g_n * CG
        for k0 in range(k_lo, k_hi, BLOCK_K):
            acc = _mm_blocks_step(acc, src, src_stride, rows, src_ok, k_hi, w, w_gstride, w_kstride, w_coff,
                                  w_cstride, g_n, c_n, col_ok, KG, k0, kk, PRECISION)
        return acc

    @triton.jit
    def _mm_blocks3_step(a0, a1, a2, src, src_stride, rows, src_ok, k_hi, w, w_gstride, w_kstride, w_coff, g_n, c_n,
                         col_ok, KG, k0, kk, PRECISION: tl.constexpr, w_cstride=1):
        """One BLOCK_K slice of `_mm_blocks3`."""
        ks = k0 + kk
        k_ok = ks < k_hi
        a = tl.load(src + rows[:, None] * src_stride + ks[None, :], mask=src_ok[:, None] & k_ok[None, :], other=0.0)
        g_k = ks // KG
        ok = k_ok[:, None] & col_ok[None, :] & (g_k[:, None] == g_n[None, :])
        w_t = w + g_n[None, :] * w_gstride + (ks - g_k * KG)[:, None] * w_kstride + c_n[None, :] * w_cstride
        a0 = dot(a, tl.load(w_t, mask=ok, other=0.0), a0, PRECISION)
        a1 = dot(a, tl.load(w_t + w_coff, mask=ok, other=0.0), a1, PRECISION)
        a2 = dot(a, tl.load(w_t + 2 * w_coff, mask=ok, other=0.0), a2, PRECISION)
        return a0, a1, a2

    @triton.jit
    def _mm_blocks3(a0, a1, a2, src, src_stride, rows, src_ok, k_lo, k_hi, w, w_gstride, w_kstride, w_coff, cols,
                    col_ok, CG, KG, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
                    ONE_GROUP: tl.constexpr = False, g0=0, w_cstride=1):
        """`mm_blocks` for three column groups at once, w_coff apart within each block's columns (V3's
        [reset | cand | update] gates): one K loop whose slices load the source once and the three
        weight tiles together (three loops paid the load latency three times); w[g, k, c] at g w_gstride +
        k w_kstride + c w_cstride (w_coff: between the three groups). ONE_GROUP: the column
        tile lies in group g0 (a scalar, not `cols // CG` per column: Triton cannot tell that the
        division is constant over a tile narrower than the group, and copied V3-12m's gate weights 4
        bytes at a time)."""
        kk = tl.arange(0, BLOCK_K)
        if ONE_GROUP:
            g_n = tl.zeros_like(cols) + g0
            c_n = cols - g0 * CG
        else:
            g_n = cols // CG
            c_n = cols - g_n * CG
        for k0 in range(k_lo, k_hi, BLOCK_K):
            a0, a1, a2 = _mm_blocks3_step(a0, a1, a2, src, src_stride, rows, src_ok, k_hi, w, w_gstride,
                                          w_kstride, w_coff, g_n, c_n, col_ok, KG, k0, kk, PRECISION, w_cstride)
        return a0, a1, a2

    @triton.jit
    def _linear(dst, rows, row_ok, N, src, src_stride, src_ok, K, src2, src2_stride, K2, w, bias, add, add_stride,
                part, SW, r0, rot, HAS_ADD: tl.constexpr, NORM: tl.constexpr, ACT: tl.constexpr,
                RANKS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
                s_part=None, s_nw=None, s_nb=None, s_eps=None, S_NORM: tl.constexpr = 0, S_ACT: tl.constexpr = 2,
                SPLIT_P2: tl.constexpr = 0, src2_ok=None, OWN_SRC2_OK: tl.constexpr = False):
        """Phase 1 of a dense layer, own column tiles: dst[rows, :N] = [src[:, :K] | src2[:, :K2]] @ W^T
        + bias (+ add), W [N, K + K2]. NORM 0: activated (final). Else the raw output, and each rank's
        partial row sum / sum of squares -> part[rows, 2 rank], part[rows, 2 rank + 1]. Ranks are
        rotated by `rot` (spreads two layers of one phase over different programs). S_NORM != 0: src is
        a normed layer's raw output, normalised on the load (`_mm`'s s_* arguments). src2's rows read as
        zeros where not src_ok, or (OWN_SRC2_OK) where not src2_ok."""
        if OWN_SRC2_OK:
            ok2 = src2_ok
        else:
            ok2 = src_ok
        for i in tl.static_range(RANKS):
            rank = (r0 + i + rot) % SPLIT
            psum = tl.zeros([BLOCK_B], dtype=dst.dtype.element_ty)
            psq = tl.zeros([BLOCK_B], dtype=dst.dtype.element_ty)
            for n0 in range(rank * BLOCK_N, N, SPLIT * BLOCK_N):
                cols = n0 + tl.arange(0, BLOCK_N)
                col_ok = cols < N
                acc = tl.zeros([BLOCK_B, BLOCK_N], dtype=dst.dtype.element_ty)
                acc = _mm(acc, src, src_stride, rows, src_ok, K, w, K + K2, cols, col_ok, BLOCK_K, PRECISION,
                          s_part, s_nw, s_nb, s_eps, S_NORM, S_ACT, SPLIT, SPLIT_P2)
                acc = _mm(acc, src2, src2_stride, rows, ok2, K2, w + K, K + K2, cols, col_ok, BLOCK_K, PRECISION)
                acc += row_vector(bias, cols, col_ok)
                ok = row_ok[:, None] & col_ok[None, :]
                if HAS_ADD:
                    acc += tl.load(add + rows[:, None] * add_stride + cols[None, :], mask=ok, other=0.0)
                if NORM == 0:
                    acc = activation(acc, ACT)
                else:
                    kept = tl.where(ok, acc, 0.0)
                    psum += tl.sum(kept, 1)
                    psq += tl.sum(kept * kept, 1)
                tl.store(dst + rows[:, None] * SW + cols[None, :], acc, mask=ok)
            if NORM != 0:
                tl.store(part + rows * SW + 2 * rank, psum, mask=row_ok)
                tl.store(part + rows * SW + 2 * rank + 1, psq, mask=row_ok)

    @triton.jit
    def _k_part_start(rank, N, KS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr):
        """(K part, first column) of `rank` in a dot whose K is split in KS parts over KS groups of
        SPLIT // KS ranks (the group's ranks deal the column tiles out in turn); an uneven SPLIT's
        last ranks get part KS and column N: nothing to do."""
        part = rank // (SPLIT // KS)
        return part, tl.where(part < KS, (rank % (SPLIT // KS)) * BLOCK_N, N)

    @triton.jit
    def _linear_k_split(dst, dst_stride, rows, row_ok, N, src, src_stride, K, w, bias, r0, KS: tl.constexpr,
                        RANKS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
        """Phase 1 of a plain linear layer (no norm, no activation) with its K split in KS parts of whole
        K tiles over KS groups of SPLIT // KS ranks (`launch._k_parts`): rank q does the column
        tiles of rank q mod (SPLIT // KS) over part p = q // (SPLIT // KS) of src[:, :K] @ W^T (W [N,
        K]), the bias in part 0 -> dst + p N. The next phase adds the parts (`_categorical`'s KS); an
        uneven SPLIT's last ranks idle."""
        CR: tl.constexpr = SPLIT // KS
        k_part = tl.cdiv(tl.cdiv(K, KS), BLOCK_K) * BLOCK_K
        for i in tl.static_range(RANKS):
            p, start = _k_part_start(r0 + i, N, KS, SPLIT, BLOCK_N)
            k_lo = p * k_part
            for n0 in range(start, N, CR * BLOCK_N):
                cols = n0 + tl.arange(0, BLOCK_N)
                col_ok = cols < N
                acc = tl.zeros([BLOCK_B, BLOCK_N], dtype=dst.dtype.element_ty)
                acc = _mm(acc, src + k_lo, src_stride, rows, row_ok, tl.minimum(K - k_lo, k_part), w + k_lo, K,
                          cols, col_ok, BLOCK_K, PRECISION)
                if p == 0:
                    acc += row_vector(bias, cols, col_ok)
                tl.store(dst + p * N + rows[:, None] * dst_stride + cols[None, :], acc,
                         mask=row_ok[:, None] & col_ok[None, :])

    @triton.jit
    def _linear_k_rows(kp, rows, row_ok, N, src, src_stride, src_ok, K, src2, src2_stride, K2, w, SW, r0,
                       RANKS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
        # BLOCK_N here: the launch's BLOCK_NK (every column is this rank's, so its tiles may be wider)
        """Phase 1 of a normed dense layer split over K (KSR): rank p takes part p of the K range of
        [src[:, :K] | src2[:, :K2]] (whole K tiles, about (K + K2) / SPLIT long) and every column
        tile: its partial product over that part -> kp[rows, p N : (p + 1) N] (no bias). Each rank
        reads 1 / SPLIT of the rows' activations instead of all of them; `_norm_k_rows` adds the parts."""
        KT = K + K2
        k_part = tl.cdiv(tl.cdiv(KT, SPLIT), BLOCK_K) * BLOCK_K
        for i in tl.static_range(RANKS):
            p = r0 + i
            lo = tl.minimum(p * k_part, KT)
            hi = tl.minimum(lo + k_part, KT)
            a_lo = tl.minimum(lo, K)  # the part's range in src: [a_lo, a_hi), in src2: [b_lo, b_hi) - K
            a_hi = tl.minimum(hi, K)
            b_lo = tl.maximum(lo, K)
            for n0 in range(0, N, BLOCK_N):
                cols = n0 + tl.arange(0, BLOCK_N)
                col_ok = cols < N
                acc = tl.zeros([BLOCK_B, BLOCK_N], dtype=kp.dtype.element_ty)
                acc = _mm(acc, src + a_lo, src_stride, rows, src_ok, a_hi - a_lo, w + a_lo, KT, cols, col_ok,
                          BLOCK_K, PRECISION)
                acc = _mm(acc, src2 + (b_lo - K), src2_stride, rows, src_ok, tl.maximum(hi - b_lo, 0), w + b_lo, KT,
                          cols, col_ok, BLOCK_K, PRECISION)
                tl.store(kp + p * N + rows[:, None] * SW + cols[None, :], acc, mask=row_ok[:, None] & col_ok[None, :])

    @triton.jit
    def _k_rows_sum(kp, SW, rr, ok, N, cols, bias, col_ok, add, add_stride, HAS_ADD: tl.constexpr,
                    SPLIT: tl.constexpr):
        """The raw output of `_linear_k_rows` at rows rr, columns cols: its SPLIT parts + bias (+ add)."""
        at = rr[:, None] * SW + cols[None, :]
        x = row_vector(bias, cols, col_ok)
        for p in tl.static_range(SPLIT):
            x += tl.load(kp + p * N + at, mask=ok, other=0.0)
        if HAS_ADD:
            x += tl.load(add + rr[:, None] * add_stride + cols[None, :], mask=ok, other=0.0)
        return tl.where(ok, x, 0.0)

    @triton.jit
    def _norm_k_rows(dst, kp, SW, pid_b, B, N, bias, add, add_stride, nw, nb, eps, r0, HAS_ADD: tl.constexpr,
                     NORM: tl.constexpr, ACT: tl.constexpr, RANKS: tl.constexpr, SPLIT: tl.constexpr,
                     BLOCK_B: tl.constexpr, BLOCK_NR: tl.constexpr):
        """Phase 2 of a `_linear_k_rows` layer, split over rows: rank q takes BLOCK_B / SPLIT of the
        batch tile's rows and every column: raw = the parts' sum + bias (+ add), its row statistics
        over the whole row (no partials, no second barrier), dst = act(norm(raw)) (NORM 1: RMSNorm,
        2: LayerNorm with var = E[x^2] - mean^2, as `row_stats`). A row of at most BLOCK_NR columns
        is one tile, held while its statistics are reduced; wider rows take two passes over
        BLOCK_NR-column tiles (the statistics, then the output: the parts read again)."""
        RB: tl.constexpr = BLOCK_B // SPLIT
        for i in tl.static_range(RANKS):
            rr = pid_b * BLOCK_B + (r0 + i) * RB + tl.arange(0, RB)
            r_ok = rr < B
            if N <= BLOCK_NR:
                cols = tl.arange(0, BLOCK_NR)
                col_ok = cols < N
                ok = r_ok[:, None] & col_ok[None, :]
                x = _k_rows_sum(kp, SW, rr, ok, N, cols, bias, col_ok, add, add_stride, HAS_ADD, SPLIT)
                mean, inv = _whole_row_stats(tl.sum(x, 1), tl.sum(x * x, 1), N, eps, NORM)
                _store_normed(dst, SW, rr, ok, cols, col_ok, x, mean, inv, nw, nb, NORM, ACT)
            else:
                _norm_k_rows_wide(dst, kp, SW, rr, r_ok, N, bias, add, add_stride, nw, nb, eps, HAS_ADD, NORM, ACT,
                                  SPLIT, RB, BLOCK_NR)

    @triton.jit
    def _whole_row_stats(s1, s2, N, eps, NORM: tl.constexpr):
        """Mean (0 for RMSNorm) and 1 / sqrt(var + eps) from rows' sums and sums of squares (NORM 1:
        RMSNorm, var = E[x^2]; 2: LayerNorm, var = E[x^2] - mean^2)."""
        if NORM == 2:
            mean = s1 / N
            var = tl.maximum(s2 / N - mean * mean, 0.0)
        else:
            mean = s1 * 0.0
            var = s2 / N
        return mean, rsqrt(var + eps)

    @triton.jit
    def normed_tile(x, mean, inv, nw, nb, cols, col_ok, NORM: tl.constexpr):
        """A tile of a normed layer's raw output x normalised from its rows' mean (0 for RMSNorm) and
        1 / sqrt(var + eps): times the norm weight at cols, plus (LayerNorm, NORM 2) its bias."""
        y = (x - mean[:, None]) * inv[:, None] * row_vector(nw, cols, col_ok)
        if NORM == 2:
            y += row_vector(nb, cols, col_ok)
        return y

    @triton.jit
    def _store_normed(dst, SW, rr, ok, cols, col_ok, x, mean, inv, nw, nb, NORM: tl.constexpr, ACT: tl.constexpr):
        y = normed_tile(x, mean, inv, nw, nb, cols, col_ok, NORM)
        tl.store(dst + rr[:, None] * SW + cols[None, :], activation(y, ACT), mask=ok)

    @triton.jit
    def _norm_k_rows_wide(dst, kp, SW, rr, r_ok, N, bias, add, add_stride, nw, nb, eps, HAS_ADD: tl.constexpr,
                          NORM: tl.constexpr, ACT: tl.constexpr, SPLIT: tl.constexpr, RB: tl.constexpr,
                          BLOCK_NR: tl.constexpr):
        """`_norm_k_rows` for rows wider than BLOCK_NR: two passes over column tiles."""
        s1 = tl.zeros([RB], dtype=dst.dtype.element_ty)
        s2 = tl.zeros([RB], dtype=dst.dtype.element_ty)
        for n0 in range(0, N, BLOCK_NR):
            cols = n0 + tl.arange(0, BLOCK_NR)
            col_ok = cols < N
            x = _k_rows_sum(kp, SW, rr, r_ok[:, None] & col_ok[None, :], N, cols, bias, col_ok, add, add_stride,
                            HAS_ADD, SPLIT)
            s1 += tl.sum(x, 1)
            s2 += tl.sum(x * x, 1)
        mean, inv = _whole_row_stats(s1, s2, N, eps, NORM)
        for n0 in range(0, N, BLOCK_NR):
            cols = n0 + tl.arange(0, BLOCK_NR)
            col_ok = cols < N
            ok = r_ok[:, None] & col_ok[None, :]
            x = _k_rows_sum(kp, SW, rr, ok, N, cols, bias, col_ok, add, add_stride, HAS_ADD, SPLIT)
            _store_normed(dst, SW, rr, ok, cols, col_ok, x, mean, inv, nw, nb, NORM, ACT)

    @triton.jit
    def partial_sums(part, stride, rows, row_ok, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr):
        """The per-row totals of the SPLIT ranks' partial pairs part[row, 2 rank + {0, 1}]."""
        js = tl.arange(0, SPLIT_P2)
        at = part + rows[:, None] * stride + 2 * js[None, :]
        p_ok = row_ok[:, None] & (js < SPLIT)[None, :]
        return tl.sum(tl.load(at, mask=p_ok, other=0.0), 1), tl.sum(tl.load(at + 1, mask=p_ok, other=0.0), 1)

    @triton.jit
    def row_stats(part, stride, rows, row_ok, N, eps, NORM: tl.constexpr, SPLIT: tl.constexpr,
                  SPLIT_P2: tl.constexpr):
        """Mean (0 for RMSNorm) and 1 / sqrt(var + eps) of a normed layer's rows from its partials
        (NORM 1: RMSNorm, var = E[x^2]; 2: LayerNorm, var = E[x^2] - mean^2)."""
        s1, s2 = partial_sums(part, stride, rows, row_ok, SPLIT, SPLIT_P2)
        return _whole_row_stats(s1, s2, N, eps, NORM)

    @triton.jit
    def _norm_rows(dst, raw, rows, row_ok, N, part, SW, nw, nb, eps, r0, rot, NORM: tl.constexpr,
                   ACT: tl.constexpr, RANKS: tl.constexpr, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr,
                   BLOCK_N: tl.constexpr):
        """Phase 2 of a normed dense layer: row statistics from the SPLIT partials (NORM 1: RMSNorm,
        2: LayerNorm with var = E[x^2] - mean^2), then own column tiles dst = act(norm(raw))."""
        mean, inv = row_stats(part, SW, rows, row_ok, N, eps, NORM, SPLIT, SPLIT_P2)
        for i in tl.static_range(RANKS):
            rank = (r0 + i + rot) % SPLIT
            for n0 in range(rank * BLOCK_N, N, SPLIT * BLOCK_N):
                cols = n0 + tl.arange(0, BLOCK_N)
                col_ok = cols < N
                ok = row_ok[:, None] & col_ok[None, :]
                x = tl.load(raw + rows[:, None] * SW + cols[None, :], mask=ok, other=0.0)
                _store_normed(dst, SW, rows, ok, cols, col_ok, x, mean, inv, nw, nb, NORM, ACT)

    @triton.jit
    def _dense(flags, pid_b, pid_c, epoch, dst, raw, part, SW, rows, row_ok, N, src, src_stride, src_ok, K,
               src2, src2_stride, K2, w, bias, add, add_stride, nw, nb, eps, r0, HAS_ADD: tl.constexpr,
               NORM: tl.constexpr, ACT: tl.constexpr, RANKS: tl.constexpr, SPLIT: tl.constexpr,
               SPLIT_P2: tl.constexpr, NPROG: tl.constexpr, NPROG_P2: tl.constexpr, BLOCK_B: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
               FOLD: tl.constexpr = 0, s_part=None, s_nw=None, s_nb=None, s_eps=None, S_NORM: tl.constexpr = 0,
               S_ACT: tl.constexpr = 2, KSR: tl.constexpr = 0, kp=None, B=0, BLOCK_NR: tl.constexpr = 16,
               BLOCK_NK: tl.constexpr = 16):
        """Linear -> norm over the row -> act into dst (via raw + partials when NORM); ends with a
        barrier (dst complete for every program). Returns the epoch. FOLD (with NORM): only raw and
        the partials, no norm phase (the consumer normalises on its load, `_mm`'s S_NORM). S_NORM: src
        is itself a folded layer's raw output (`_linear`). KSR (with NORM, not FOLD, nothing saved):
        the dot split over K into the parts slot kp, the norm phase over rows (`_linear_k_rows`,
        `_norm_k_rows`; raw and the partials are not written)."""
        if KSR != 0 and NORM != 0:
            tl.static_assert(FOLD == 0 and S_NORM == 0, "a K-split layer (KSR) reads and writes normalised outputs")
            _linear_k_rows(kp, rows, row_ok, N, src, src_stride, src_ok, K, src2, src2_stride, K2, w, SW, r0, RANKS,
                           SPLIT, BLOCK_B, BLOCK_NK, BLOCK_K, PRECISION)
            epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
            _norm_k_rows(dst, kp, SW, pid_b, B, N, bias, add, add_stride, nw, nb, eps, r0, HAS_ADD, NORM, ACT, RANKS,
                         SPLIT, BLOCK_B, BLOCK_NR)
        elif NORM == 0:
            _linear(dst, rows, row_ok, N, src, src_stride, src_ok, K, src2, src2_stride, K2, w, bias, add, add_stride,
                    part, SW, r0, 0, HAS_ADD, 0, ACT, RANKS, SPLIT, BLOCK_B, BLOCK_N, BLOCK_K, PRECISION,
                    s_part, s_nw, s_nb, s_eps, S_NORM, S_ACT, SPLIT_P2)
        else:
            _linear(raw, rows, row_ok, N, src, src_stride, src_ok, K, src2, src2_stride, K2, w, bias, add, add_stride,
                    part, SW, r0, 0, HAS_ADD, NORM, ACT, RANKS, SPLIT, BLOCK_B, BLOCK_N, BLOCK_K, PRECISION,
                    s_part, s_nw, s_nb, s_eps, S_NORM, S_ACT, SPLIT_P2)
            if not FOLD:
                epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
                _norm_rows(dst, raw, rows, row_ok, N, part, SW, nw, nb, eps, r0, 0, NORM, ACT, RANKS, SPLIT, SPLIT_P2,
                           BLOCK_N)
        return sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)

    @triton.jit
    def _norm_groups(dst, raw, stride, rows, row_ok, G, CG, nw, nb, eps, r0, NORM: tl.constexpr, ACT: tl.constexpr,
                     RANKS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_G: tl.constexpr,
                     BLOCK_C: tl.constexpr, KS: tl.constexpr = 1):
        """Phase 2 of V3's dyn_out: each group of CG consecutive columns of raw normalised over its own
        values (weight nw[c], LayerNorm bias nb[c]) and activated -> dst; BLOCK_G-group tiles dealt
        out over the ranks. Statistics, then the update, in passes over column tiles. KS 2: raw holds
        the K-split dot's two partial sums (the second at raw + G CG), added and stored back to raw
        first (what the backward reads)."""
        gg = tl.arange(0, BLOCK_G)
        cc = tl.arange(0, BLOCK_C)
        for i in tl.static_range(RANKS):
            for g0 in range((r0 + i) * BLOCK_G, G, SPLIT * BLOCK_G):
                gs = g0 + gg
                g_ok = gs < G
                at = rows[:, None, None] * stride + gs[None, :, None] * CG
                rg_ok = row_ok[:, None, None] & g_ok[None, :, None]
                if KS == 2:
                    for c0 in range(0, CG, BLOCK_C):
                        cs = c0 + cc
                        ok = rg_ok & (cs < CG)[None, None, :]
                        both = tl.load(raw + at + cs[None, None, :], mask=ok, other=0.0)
                        both += tl.load(raw + G * CG + at + cs[None, None, :], mask=ok, other=0.0)
                        tl.store(raw + at + cs[None, None, :], both, mask=ok)
                    tl.debug_barrier()  # the sums visible to every thread of this program before the reads below
                mean = tl.zeros([BLOCK_B, BLOCK_G], dtype=dst.dtype.element_ty)
                if NORM == 2:
                    for c0 in range(0, CG, BLOCK_C):
                        cs = c0 + cc
                        ok = rg_ok & (cs < CG)[None, None, :]
                        mean += tl.sum(tl.load(raw + at + cs[None, None, :], mask=ok, other=0.0), 2)
                    mean = mean / CG
                var = tl.zeros([BLOCK_B, BLOCK_G], dtype=dst.dtype.element_ty)
                for c0 in range(0, CG, BLOCK_C):
                    cs = c0 + cc
                    ok = rg_ok & (cs < CG)[None, None, :]
                    x = tl.where(ok, tl.load(raw + at + cs[None, None, :], mask=ok, other=0.0) - mean[:, :, None], 0.0)
                    var += tl.sum(x * x, 2)
                inv = rsqrt(var / CG + eps)
                for c0 in range(0, CG, BLOCK_C):
                    cs = c0 + cc
                    ok = rg_ok & (cs < CG)[None, None, :]
                    w_ok = (cs < CG)[None, None, :]
                    x = tl.load(raw + at + cs[None, None, :], mask=ok, other=0.0)
                    y = (x - mean[:, :, None]) * inv[:, :, None] * tl.load(nw + cs[None, None, :], mask=w_ok, other=0.0)
                    if NORM == 2:
                        y += tl.load(nb + cs[None, None, :], mask=w_ok, other=0.0)
                    tl.store(dst + at + cs[None, None, :], activation(y, ACT), mask=ok)

    @triton.jit
    def _gru(flags, pid_b, pid_c, epoch, d_prev, dp_stride, d_new, d_stride, d_out, d_out_stride, s_prev, s_stride,
             prev_ok, rows, row_ok, sc, SW, OFF_XR, OFF_X, OFF_XP,
             a_src, a_stride, in_s_w, in_s_b, in_nw, in_nb, wi, bi, wh, bh, D, S, H, eps, r0, gates,
             SAVE: tl.constexpr, NORM: tl.constexpr, ACT: tl.constexpr, RANKS: tl.constexpr, SPLIT: tl.constexpr,
             SPLIT_P2: tl.constexpr, NPROG: tl.constexpr, NPROG_P2: tl.constexpr, BLOCK_B: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
        """V1: x = act(norm(stoch W_in^T + b + action share)); deter = GRUCell(x, deter) (r, z, n);
        w_ih [3D, H], w_hh [3D, D] native. SAVE: r, z, n and W_hn h + b_hn -> gates[:, {0, 1, 2, 3} D + col]
        (for the backward). The new deter also -> d_out (the output). Returns the epoch (d_new complete)."""
        x = sc + OFF_X
        epoch = _dense(flags, pid_b, pid_c, epoch, x, sc + OFF_XR, sc + OFF_XP, SW, rows, row_ok, H, s_prev, s_stride,
                       prev_ok, S, s_prev, s_stride, 0, in_s_w, in_s_b, a_src, a_stride, in_nw, in_nb, eps, r0, True,
                       NORM, ACT, RANKS, SPLIT, SPLIT_P2, NPROG, NPROG_P2, BLOCK_B, BLOCK_N, BLOCK_K, PRECISION)
        for i in tl.static_range(RANKS):
            for n0 in range((r0 + i) * BLOCK_N, D, SPLIT * BLOCK_N):
                cols = n0 + tl.arange(0, BLOCK_N)
                col_ok = cols < D
                ok = row_ok[:, None] & col_ok[None, :]
                zero = tl.zeros([BLOCK_B, BLOCK_N], dtype=d_new.dtype.element_ty)
                xr, xz, xn = _mm3(zero, zero, zero, x, SW, rows, row_ok, H, wi, H, D * H, cols, col_ok,
                                  BLOCK_K, PRECISION)
                hr, hz, hn = _mm3(zero, zero, zero, d_prev, dp_stride, rows, prev_ok, D, wh, D, D * D, cols, col_ok,
                                  BLOCK_K, PRECISION)
                xr += row_vector(bi, cols, col_ok) + row_vector(bh, cols, col_ok)
                xz += row_vector(bi + D, cols, col_ok) + row_vector(bh + D, cols, col_ok)
                xn += row_vector(bi + 2 * D, cols, col_ok)
                hn += row_vector(bh + 2 * D, cols, col_ok)
                r = sigmoid(xr + hr)
                z = sigmoid(xz + hz)
                n = tanh(xn + r * hn)
                h = tl.load(d_prev + rows[:, None] * dp_stride + cols[None, :], mask=ok & prev_ok[:, None], other=0.0)
                h = n + z * (h - n)
                tl.store(d_new + rows[:, None] * d_stride + cols[None, :], h, mask=ok)
                tl.store(d_out + rows[:, None] * d_out_stride + cols[None, :], h, mask=ok)
                if SAVE:
                    at = gates + rows[:, None] * SW + cols[None, :]
                    tl.store(at, r, mask=ok)
                    tl.store(at + D, z, mask=ok)
                    tl.store(at + 2 * D, n, mask=ok)
                    tl.store(at + 3 * D, hn, mask=ok)
        return sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)

    @triton.jit
    def _norm_gru(flags, pid_b, pid_c, epoch, d_prev, dp_stride, d_new, d_stride, d_out, d_out_stride, s_prev,
                  s_stride, prev_ok, rows, row_ok, sc, SW, OFF_XR, OFF_X, OFF_XP, OFF_GR, OFF_GP,
                  a_src, a_stride, in_s_w, in_s_b, in_nw, in_nb, g_w, g_b, g_nw, g_nb, g_add, g_add_stride, d_init,
                  D, S, H, eps, r0, NORM: tl.constexpr, ACT: tl.constexpr, LEARNED: tl.constexpr,
                  RANKS: tl.constexpr, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr, NPROG: tl.constexpr,
                  NPROG_P2: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  PRECISION: tl.constexpr):
        """The 2023 DreamerV3's dense GRU (`reference.cell`, "norm_gru"): x = act(norm(stoch W_in^T + b +
        action share)); [reset, cand, update] = norm([deter | x] W_g^T + b) (one norm over all 3 D gates);
        deter = up * tanh(sigmoid(reset) * cand) + (1 - up) * deter with up = sigmoid(update - 1).
        Phases: x (`_dense`); the gates' raw output and norm partials (own column tiles of 3 D); the norm
        and the GRU on own deter tiles, each reading its reset / cand / update columns of the whole raw
        row. LEARNED (a learned initial state, observe): at a reset row the previous deter is d_init [D],
        and the host has added the initial state's products to the layers' inputs (the action share
        holds stoch0 W_in^T, g_add [B, T, 3 D] deter0 W_g[:, :D]^T at resets, zeros elsewhere), so
        the masked loads of the carry stay as they are. Nothing to save beyond its phases' own slots:
        the backward (`backward_kernels`, CELL_NG) reads the gates' raw output (OFF_GR) and norm
        partials (OFF_GP), and the input layer's (OFF_XR / OFF_X / OFF_XP), which every forward
        writes. Returns the epoch (d_new complete)."""
        x = sc + OFF_X
        epoch = _dense(flags, pid_b, pid_c, epoch, x, sc + OFF_XR, sc + OFF_XP, SW, rows, row_ok, H, s_prev, s_stride,
                       prev_ok, S, s_prev, s_stride, 0, in_s_w, in_s_b, a_src, a_stride, in_nw, in_nb, eps, r0, True,
                       NORM, ACT, RANKS, SPLIT, SPLIT_P2, NPROG, NPROG_P2, BLOCK_B, BLOCK_N, BLOCK_K, PRECISION)
        raw = sc + OFF_GR
        part = sc + OFF_GP
        _linear(raw, rows, row_ok, 3 * D, d_prev, dp_stride, prev_ok, D, x, SW, H, g_w, g_b, g_add, g_add_stride,
                part, SW, r0, 0, LEARNED, NORM, 2, RANKS, SPLIT, BLOCK_B, BLOCK_N, BLOCK_K, PRECISION,
                SPLIT_P2=SPLIT_P2, src2_ok=row_ok, OWN_SRC2_OK=True)
        epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
        if NORM != 0:
            mean, inv = row_stats(part, SW, rows, row_ok, 3 * D, eps, NORM, SPLIT, SPLIT_P2)
        else:
            mean = None
            inv = None
        for i in tl.static_range(RANKS):
            for n0 in range((r0 + i) * BLOCK_N, D, SPLIT * BLOCK_N):
                cols = n0 + tl.arange(0, BLOCK_N)
                col_ok = cols < D
                ok = row_ok[:, None] & col_ok[None, :]
                at = raw + rows[:, None] * SW + cols[None, :]
                reset = tl.load(at, mask=ok, other=0.0)
                cand = tl.load(at + D, mask=ok, other=0.0)
                update = tl.load(at + 2 * D, mask=ok, other=0.0)
                if NORM != 0:
                    reset = normed_tile(reset, mean, inv, g_nw, g_nb, cols, col_ok, NORM)
                    cand = normed_tile(cand, mean, inv, g_nw + D, g_nb + D, cols, col_ok, NORM)
                    update = normed_tile(update, mean, inv, g_nw + 2 * D, g_nb + 2 * D, cols, col_ok, NORM)
                cand = tanh(sigmoid(reset) * cand)
                update = sigmoid(update - 1.0)
                h = tl.load(d_prev + rows[:, None] * dp_stride + cols[None, :], mask=ok & prev_ok[:, None], other=0.0)
                if LEARNED:
                    h = tl.where(prev_ok[:, None], h, row_vector(d_init, cols, col_ok))
                h = update * cand + (1.0 - update) * h
                tl.store(d_new + rows[:, None] * d_stride + cols[None, :], h, mask=ok)
                tl.store(d_out + rows[:, None] * d_out_stride + cols[None, :], h, mask=ok)
        return sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)

    @triton.jit
    def _action_part(acc, a_src, a_stride, rows, row_ok, H, dx_w, cols, col_ok, BLOCK_K: tl.constexpr,
                     PRECISION: tl.constexpr, A_PRE: tl.constexpr, a_part=None, a_nw=None,
                     a_nb=None, eps=None, A_SRC_NORM: tl.constexpr = 0, ACT: tl.constexpr = 2, SPLIT: tl.constexpr = 0,
                     SPLIT_P2: tl.constexpr = 0):
        """acc + the action's part of V3's dyn_x pre-activation at columns cols: a_src W_x[:, 2H:]^T
        (A_SRC_NORM: a_src the action layer's raw output, its norm applied on the load as `_mm`'s
        S_NORM), or (A_PRE) a_src itself, that product made before the launch."""
        if A_PRE:
            tl.static_assert(A_SRC_NORM == 0, "a pre-multiplied action share (A_PRE) has no norm to fold")
            return acc + tl.load(a_src + rows[:, None] * a_stride + cols[None, :],
                                 mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        return _mm(acc, a_src, a_stride, rows, row_ok, H, dx_w + 2 * H, 3 * H, cols, col_ok, BLOCK_K, PRECISION,
                   a_part, a_nw, a_nb, eps, A_SRC_NORM, ACT, SPLIT, SPLIT_P2)

    @triton.jit
    def _dyn_x_split(u_raw, rows, row_ok, prev_ok, x, SW, a_src, a_stride, dx_w, dx_b, dh_w, d_prev, d_stride,
                     D: tl.constexpr, H: tl.constexpr, G: tl.constexpr, r0, RANKS: tl.constexpr, SPLIT: tl.constexpr,
                     BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
                     BLOCKS_KMAJOR: tl.constexpr = False, A_PRE: tl.constexpr = False):
        """V3's dyn_x dot ([x | action share] W_x^T + b + the block-diagonal deter_g W_h[g]) with its K
        split in two halves of ~equal length: rank q < 2 (SPLIT // 2) does the column tiles of rank
        q mod (SPLIT // 2) over half q // (SPLIT // 2): x[:, :K0] and the bias -> u_raw, or
        x[:, K0:], the action share and the blocks -> u_raw + H (an odd SPLIT's last rank idles). A_PRE:
        a_src holds the action's share already multiplied by its columns of W_x (`_block_gru`)."""
        DG: tl.constexpr = D // G
        HG: tl.constexpr = H // G
        # where the K range [x (2H) | action (H) | one block of deter (DG)] splits: about half, whole K tiles
        K0: tl.constexpr = min((3 * H + DG) // 2 // BLOCK_K * BLOCK_K, 2 * H)
        CR: tl.constexpr = SPLIT // 2
        for i in tl.static_range(RANKS):
            half, start = _k_part_start(r0 + i, H, 2, SPLIT, BLOCK_N)
            for n0 in range(start, H, CR * BLOCK_N):
                cols = n0 + tl.arange(0, BLOCK_N)
                col_ok = cols < H
                acc = tl.zeros([BLOCK_B, BLOCK_N], dtype=u_raw.dtype.element_ty)
                if half == 0:
                    acc = _mm(acc, x, SW, rows, row_ok, K0, dx_w, 3 * H, cols, col_ok, BLOCK_K, PRECISION)
                    acc += row_vector(dx_b, cols, col_ok)
                else:
                    acc = _mm(acc, x + K0, SW, rows, row_ok, 2 * H - K0, dx_w + K0, 3 * H, cols, col_ok, BLOCK_K,
                              PRECISION)
                    acc = _action_part(acc, a_src, a_stride, rows, row_ok, H, dx_w, cols, col_ok, BLOCK_K,
                                       PRECISION, A_PRE)
                    g_hi = tl.minimum((n0 + BLOCK_N - 1) // HG + 1, G)
                    acc = mm_blocks(acc, d_prev, d_stride, rows, prev_ok, (n0 // HG) * DG, g_hi * DG, dh_w, DG * HG,
                                    1 if BLOCKS_KMAJOR else HG, 0, cols, col_ok, HG, DG, BLOCK_K, PRECISION,
                                    DG if BLOCKS_KMAJOR else 1)
                tl.store(u_raw + half * H + rows[:, None] * SW + cols[None, :], acc,
                         mask=row_ok[:, None] & col_ok[None, :])

    @triton.jit
    def _block_gru(flags, pid_b, pid_c, epoch, d_prev, dp_stride, d_new, d_stride, d_out, d_out_stride, s_prev,
                   s_stride, prev_ok, rows, row_ok, sc, SW,
                   OFF_XR, OFF_X, OFF_XP, OFF_UR, OFF_U, a_src, a_stride,
                   in_d_w, in_d_b, in_d_nw, in_d_nb, in_s_w, in_s_b, in_s_nw, in_s_nb, dx_w, dx_b, dh_w,
                   dyn_nw, dyn_nb, g_w, g_b, D, S, H, G, eps, r0, gates, SAVE: tl.constexpr, NORM: tl.constexpr,
                   ACT: tl.constexpr,
                   RANKS: tl.constexpr, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr, NPROG: tl.constexpr,
                   NPROG_P2: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   BLK_G: tl.constexpr, BLK_C: tl.constexpr, BLOCK_ND: tl.constexpr, PRECISION: tl.constexpr,
                   FOLD: tl.constexpr, a_part, a_nw, a_nb, A_SRC_NORM: tl.constexpr,
                   DYN_KS: tl.constexpr = 1, KSR: tl.constexpr = 0, kp=None, B=0, BLOCK_NR: tl.constexpr = 16,
                   BLOCK_NK: tl.constexpr = 16, BLOCKS_KMAJOR: tl.constexpr = False,
                   PRELOAD_H: tl.constexpr = False, A_PRE: tl.constexpr = False):
        """V3: x = [dense(deter), dense(stoch), action share]; per block g of G,
        u_g = act(norm(x W_x^T + b)_g + deter_g W_h[g]); [reset, cand, update]_g = u_g W_gates[g] + b;
        deter_g = up * tanh(sigmoid(reset) * cand) + (1 - up) * deter_g with up = sigmoid(update - 1).
        SAVE: reset, cand, update (pre-activation) -> gates[:, {0, 1, 2} D + col] (for the backward).
        FOLD (with NORM): the input layers' norms are applied on dyn_x's loads (no norm phase);
        A_SRC_NORM: a_src is the action layer's raw output, its partials at a_part (folded too).
        DYN_KS 2 (with NORM, without FOLD): dyn_x's columns on half the ranks, its K split in two
        between the halves (two partial sums -> u_raw, u_raw + H, added by the norm phase), for plans
        with more ranks than twice its column tiles (observe at B16). KSR (with NORM, not FOLD):
        in_deter's dot split over K into kp, its norm phase over rows (`_dense`'s KSR). BLOCKS_KMAJOR:
        the block-diagonal weights transposed per block, g_w [G, 3 D/G, H/G] and dh_w [G, H/G, D/G], and
        the gates' deter tiles addressed in one block where they fit in one (`_mm_blocks3`'s ONE_GROUP).
        PRELOAD_H: the gates phase loads each tile's biases and previous deter before its dots (the
        loads' latency under the dots), not after (`launch._wide_tiles_pay`). A_PRE (not with the
        Actor): a_src is the action's share times its columns of W_x, [B, T, H], made before the launch
        (`share.py`), so the dyn dot runs over [x | deter block] alone. Returns the epoch (d_new
        complete)."""
        DG = D // G
        HG = H // G
        x = sc + OFF_X
        raw = sc + OFF_XR
        part = sc + OFF_XP
        rot = tl.cdiv(H, BLOCK_N) % SPLIT  # in_stoch's tiles start where in_deter's end
        if NORM == 0:
            _linear(x, rows, row_ok, H, d_prev, dp_stride, prev_ok, D, d_prev, dp_stride, 0, in_d_w, in_d_b, x, 0, part,
                    SW, r0, 0,
                    False, 0, ACT, RANKS, SPLIT, BLOCK_B, BLOCK_N, BLOCK_K, PRECISION)
            _linear(x + H, rows, row_ok, H, s_prev, s_stride, prev_ok, S, s_prev, s_stride, 0, in_s_w, in_s_b, x, 0,
                    part, SW, r0,
                    rot, False, 0, ACT, RANKS, SPLIT, BLOCK_B, BLOCK_N, BLOCK_K, PRECISION)
        else:
            if KSR != 0:
                tl.static_assert(FOLD == 0, "in_deter's K split (KSR) writes its normalised output")
                _linear_k_rows(kp, rows, row_ok, H, d_prev, dp_stride, prev_ok, D, d_prev, dp_stride, 0, in_d_w, SW, r0,
                               RANKS, SPLIT, BLOCK_B, BLOCK_NK, BLOCK_K, PRECISION)
            else:
                _linear(raw, rows, row_ok, H, d_prev, dp_stride, prev_ok, D, d_prev, dp_stride, 0, in_d_w, in_d_b, x, 0,
                        part, SW, r0, 0, False, NORM, ACT, RANKS, SPLIT, BLOCK_B, BLOCK_N, BLOCK_K, PRECISION)
            _linear(raw + H, rows, row_ok, H, s_prev, s_stride, prev_ok, S, s_prev, s_stride, 0, in_s_w, in_s_b, x, 0,
                    part + 2 * SPLIT, SW, r0, rot, False, NORM, ACT, RANKS, SPLIT, BLOCK_B, BLOCK_N, BLOCK_K,
                    PRECISION)
            if not FOLD:
                epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
                if KSR != 0:
                    _norm_k_rows(x, kp, SW, pid_b, B, H, in_d_b, x, 0, in_d_nw, in_d_nb, eps, r0, False, NORM, ACT,
                                 RANKS, SPLIT, BLOCK_B, BLOCK_NR)
                else:
                    _norm_rows(x, raw, rows, row_ok, H, part, SW, in_d_nw, in_d_nb, eps, r0, 0, NORM, ACT, RANKS, SPLIT,
                               SPLIT_P2, BLOCK_N)
                _norm_rows(x + H, raw + H, rows, row_ok, H, part + 2 * SPLIT, SW, in_s_nw, in_s_nb, eps, r0, rot,
                           NORM, ACT, RANKS, SPLIT, SPLIT_P2, BLOCK_N)
        epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
        u = sc + OFF_U
        u_raw = sc + OFF_UR
        if DYN_KS == 2:
            tl.static_assert(NORM != 0 and not FOLD, "the dyn dot's K split needs the norm phase, unfolded inputs")
            _dyn_x_split(u_raw, rows, row_ok, prev_ok, x, SW, a_src, a_stride, dx_w, dx_b, dh_w, d_prev, dp_stride, D,
                         H, G, r0, RANKS, SPLIT, BLOCK_B, BLOCK_N, BLOCK_K, PRECISION, BLOCKS_KMAJOR, A_PRE)
        for i in tl.static_range(RANKS * (DYN_KS == 1)):
            for n0 in range((r0 + i) * BLOCK_N, H, SPLIT * BLOCK_N):
                cols = n0 + tl.arange(0, BLOCK_N)
                col_ok = cols < H
                acc = tl.zeros([BLOCK_B, BLOCK_N], dtype=d_new.dtype.element_ty)
                if FOLD and NORM != 0:  # in_deter's and in_stoch's raw outputs, each with its own norm
                    acc = _mm(acc, raw, SW, rows, row_ok, H, dx_w, 3 * H, cols, col_ok, BLOCK_K, PRECISION,
                              part, in_d_nw, in_d_nb, eps, NORM, ACT, SPLIT, SPLIT_P2)
                    acc = _mm(acc, raw + H, SW, rows, row_ok, H, dx_w + H, 3 * H, cols, col_ok, BLOCK_K, PRECISION,
                              part + 2 * SPLIT, in_s_nw, in_s_nb, eps, NORM, ACT, SPLIT, SPLIT_P2)
                else:
                    acc = _mm(acc, x, SW, rows, row_ok, 2 * H, dx_w, 3 * H, cols, col_ok, BLOCK_K, PRECISION)
                acc = _action_part(acc, a_src, a_stride, rows, row_ok, H, dx_w, cols, col_ok, BLOCK_K, PRECISION,
                                   A_PRE, a_part, a_nw, a_nb, eps, A_SRC_NORM, ACT, SPLIT, SPLIT_P2)
                g_hi = tl.minimum((n0 + BLOCK_N - 1) // HG + 1, G)
                acc = mm_blocks(acc, d_prev, dp_stride, rows, prev_ok, (n0 // HG) * DG, g_hi * DG, dh_w, DG * HG,
                                1 if BLOCKS_KMAJOR else HG, 0, cols, col_ok, HG, DG, BLOCK_K, PRECISION,
                                DG if BLOCKS_KMAJOR else 1)
                acc += row_vector(dx_b, cols, col_ok)
                ok = row_ok[:, None] & col_ok[None, :]
                if NORM == 0:
                    tl.store(u + rows[:, None] * SW + cols[None, :], activation(acc, ACT), mask=ok)
                else:
                    tl.store(u_raw + rows[:, None] * SW + cols[None, :], acc, mask=ok)
        if NORM != 0:
            epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
            _norm_groups(u, u_raw, SW, rows, row_ok, G, HG, dyn_nw, dyn_nb, eps, r0, NORM, ACT, RANKS, SPLIT,
                         BLOCK_B, BLK_G, BLK_C, DYN_KS)
        epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
        for i in tl.static_range(RANKS):
            for n0 in range((r0 + i) * BLOCK_ND, D, SPLIT * BLOCK_ND):
                cols = n0 + tl.arange(0, BLOCK_ND)
                col_ok = cols < D
                ok = row_ok[:, None] & col_ok[None, :]
                zero = tl.zeros([BLOCK_B, BLOCK_ND], dtype=d_new.dtype.element_ty)
                g_hi = tl.minimum((n0 + BLOCK_ND - 1) // DG + 1, G)
                k_lo = (n0 // DG) * HG
                if PRELOAD_H:
                    b_at = _gate_bias_at(g_b, cols, DG)
                    h = tl.load(d_prev + rows[:, None] * dp_stride + cols[None, :], mask=ok & prev_ok[:, None],
                                other=0.0)
                    b_r = tl.load(b_at, mask=col_ok, other=0.0)
                    b_c = tl.load(b_at + DG, mask=col_ok, other=0.0)
                    b_z = tl.load(b_at + 2 * DG, mask=col_ok, other=0.0)
                # BLOCKS_KMAJOR: g_w as [G, 3 D/G, H/G], K-contiguous tiles (`launch._wide_tiles_pay`)
                r, c, z = _mm_blocks3(zero, zero, zero, u, SW, rows, row_ok, k_lo, g_hi * HG, g_w, HG * 3 * DG,
                                      1 if BLOCKS_KMAJOR else 3 * DG, DG * HG if BLOCKS_KMAJOR else DG, cols, col_ok,
                                      DG, HG, BLOCK_K, PRECISION, BLOCKS_KMAJOR and DG % BLOCK_ND == 0,
                                      n0 // DG, HG if BLOCKS_KMAJOR else 1)
                if PRELOAD_H:
                    r += b_r[None, :]
                    c += b_c[None, :]
                    z += b_z[None, :]
                else:  # each load beside its add: grouped, the loads compile differently (unmeasured)
                    b_at = _gate_bias_at(g_b, cols, DG)
                    r += tl.load(b_at, mask=col_ok, other=0.0)[None, :]
                    c += tl.load(b_at + DG, mask=col_ok, other=0.0)[None, :]
                    z += tl.load(b_at + 2 * DG, mask=col_ok, other=0.0)[None, :]
                cand = tanh(sigmoid(r) * c)
                up = sigmoid(z - 1.0)
                if not PRELOAD_H:
                    h = tl.load(d_prev + rows[:, None] * dp_stride + cols[None, :], mask=ok & prev_ok[:, None],
                                other=0.0)
                h = up * cand + (1.0 - up) * h
                tl.store(d_new + rows[:, None] * d_stride + cols[None, :], h, mask=ok)
                tl.store(d_out + rows[:, None] * d_out_stride + cols[None, :], h, mask=ok)
                if SAVE:
                    at = gates + rows[:, None] * SW + cols[None, :]
                    tl.store(at, r, mask=ok)
                    tl.store(at + D, c, mask=ok)
                    tl.store(at + 2 * D, z, mask=ok)
        return sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)

    @triton.jit
    def _gaussian(src, src_stride, rows, row_ok, K, w, bias, N, min_std, noise, noise_stride,
                  out0, out0_stride, out1, out1_stride, out2, out2_stride, r0, KIND: tl.constexpr,
                  RANKS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, sig=None, sig_stride=0,
                  SAVE: tl.constexpr = False, s_part=None, s_nw=None, s_nb=None, s_eps=None, S_NORM: tl.constexpr = 0,
                  S_ACT: tl.constexpr = 2, SPLIT_P2: tl.constexpr = 0, out3=None, out3_stride=0, max_std=0.0):
        """Own column tiles of the head [mean | raw std] = src @ W^T + bias (W [2N, K]); std = softplus
        + min_std; sample = mean + std * noise. KIND 0 (latent): out0 mean, out1 std, out2 and out3 the sample.
        KIND 1 (tanh-normal action: mean = 5 tanh(mean / 5), action = tanh(sample)), 2 (normal action)
        and 3 (bounded normal action: mean = tanh(mean), std = (max_std - min_std) sigmoid(raw + 2) +
        min_std): out0 the action, out1 the action scaled by 1 / max(1, |a|) (what the action layer reads).
        SAVE (for the backward): d std / d raw std -> sig[:, :N] (sigmoid(raw std), softplus's derivative;
        KIND 3: (max_std - min_std) s (1 - s), s = sigmoid(raw + 2)); KIND 1 also d mean / d raw mean =
        1 - (mean / 5)^2, KIND 3 1 - tanh(raw mean)^2 -> sig[:, N:2N]."""
        for i in tl.static_range(RANKS):
            for n0 in range((r0 + i) * BLOCK_N, N, SPLIT * BLOCK_N):
                cols = n0 + tl.arange(0, BLOCK_N)
                col_ok = cols < N
                ok = row_ok[:, None] & col_ok[None, :]
                zero = tl.zeros([BLOCK_B, BLOCK_N], dtype=out0.dtype.element_ty)
                mean = _mm(zero, src, src_stride, rows, row_ok, K, w, K, cols, col_ok, BLOCK_K, PRECISION,
                           s_part, s_nw, s_nb, s_eps, S_NORM, S_ACT, SPLIT, SPLIT_P2)
                std = _mm(zero, src, src_stride, rows, row_ok, K, w + N * K, K, cols, col_ok, BLOCK_K, PRECISION,
                          s_part, s_nw, s_nb, s_eps, S_NORM, S_ACT, SPLIT, SPLIT_P2)
                mean += row_vector(bias, cols, col_ok)
                std += row_vector(bias + N, cols, col_ok)
                if KIND == 3:
                    mean = tanh(mean)
                    s2 = sigmoid(std + 2.0)
                    std = (max_std - min_std) * s2 + min_std
                    if SAVE:
                        at = sig + rows[:, None] * sig_stride + cols[None, :]
                        tl.store(at, (max_std - min_std) * s2 * (1.0 - s2), mask=ok)
                        tl.store(at + N, 1.0 - mean * mean, mask=ok)
                else:
                    if SAVE:
                        tl.store(sig + rows[:, None] * sig_stride + cols[None, :], sigmoid(std), mask=ok)
                    std = softplus(std) + min_std
                if KIND == 1:
                    mean = 5.0 * tanh(mean / 5.0)
                    if SAVE:
                        m5 = mean / 5.0
                        tl.store(sig + rows[:, None] * sig_stride + N + cols[None, :], 1.0 - m5 * m5, mask=ok)
                sample = mean + std * tl.load(noise + rows[:, None] * noise_stride + cols[None, :], mask=ok, other=0.0)
                if KIND == 0:
                    tl.store(out0 + rows[:, None] * out0_stride + cols[None, :], mean, mask=ok)
                    tl.store(out1 + rows[:, None] * out1_stride + cols[None, :], std, mask=ok)
                    tl.store(out2 + rows[:, None] * out2_stride + cols[None, :], sample, mask=ok)
                    tl.store(out3 + rows[:, None] * out3_stride + cols[None, :], sample, mask=ok)
                else:
                    if KIND == 1:
                        sample = tanh(sample)
                    tl.store(out0 + rows[:, None] * out0_stride + cols[None, :], sample, mask=ok)
                    tl.store(out1 + rows[:, None] * out1_stride + cols[None, :],
                             sample / tl.maximum(tl.abs(sample), 1.0), mask=ok)

    @triton.jit
    def _categorical(raw, raw_stride, rows, row_ok, G, C, unimix, noise, noise_stride, logits, logits_stride,
                     out, out_stride, out2, out2_stride, r0, STORE_LOGITS: tl.constexpr, HAS_OUT2: tl.constexpr,
                     UNIMIX: tl.constexpr, RANKS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_G: tl.constexpr,
                     C_P2: tl.constexpr, KS: tl.constexpr = 1, raw_sum=None):
        """Phase 2 of a categorical head, BLOCK_G-latent tiles dealt out over the ranks: from the raw
        logits [G * C], logits = log((1 - unimix) softmax + unimix / C) when UNIMIX (-> logits when
        STORE_LOGITS), the one-hot of argmax(logits + noise) (first index on ties, as torch) -> out
        (and out2). KS > 1: the raw logits are the sum of KS parts raw + p G C (`_linear_k_split`),
        stored -> raw_sum (what the backward reads)."""
        cs = tl.arange(0, C_P2)
        c_ok = (cs < C)[None, None, :]
        for i in tl.static_range(RANKS):
            for g0 in range((r0 + i) * BLOCK_G, G, SPLIT * BLOCK_G):
                gs = g0 + tl.arange(0, BLOCK_G)
                ok = row_ok[:, None, None] & (gs < G)[None, :, None] & c_ok
                at = gs[None, :, None] * C + cs[None, None, :]
                x = tl.load(raw + rows[:, None, None] * raw_stride + at, mask=ok, other=0.0)
                if KS > 1:
                    for p in tl.static_range(1, KS):
                        x += tl.load(raw + p * G * C + rows[:, None, None] * raw_stride + at, mask=ok, other=0.0)
                    tl.store(raw_sum + rows[:, None, None] * raw_stride + at, x, mask=ok)
                x = tl.where(c_ok, x, float("-inf"))
                if UNIMIX:
                    e = tl.exp(x - tl.max(x, 2)[:, :, None])
                    p = (1.0 - unimix) * (e / tl.sum(e, 2)[:, :, None]) + unimix / C
                    x = tl.where(c_ok, tl.log(p), float("-inf"))
                if STORE_LOGITS:
                    tl.store(logits + rows[:, None, None] * logits_stride + at, x, mask=ok)
                v = x + tl.load(noise + rows[:, None, None] * noise_stride + at, mask=ok, other=0.0)
                best = tl.min(tl.where(v == tl.max(v, 2)[:, :, None], cs[None, None, :], C_P2), 2)
                onehot = (cs[None, None, :] == best[:, :, None]).to(out.dtype.element_ty)
                tl.store(out + rows[:, None, None] * out_stride + at, onehot, mask=ok)
                if HAS_OUT2:
                    tl.store(out2 + rows[:, None, None] * out2_stride + at, onehot, mask=ok)

    @triton.jit
    def _actor(flags, pid_b, pid_c, epoch, t, T, s_prev, s_stride, d_prev, d_stride, rows, row_ok, sc, SW,
               OFF_P, P_SLOT, HAP, OFF_AO, OFF_AS, OFF_AHR, OFF_AH, OFF_AHP, OFF_ASG,
               act_w0, act_w, act_b, act_nw, act_nb, act_ow, act_ob, policy_noise, action,
               ina_w, ina_b, ina_nw, ina_nb, S, D, H, A, HA, LA, eps, a_eps, a_min_std, a_unimix, r0,
               CELL_V3: tl.constexpr, SAVE: tl.constexpr, NORM: tl.constexpr, ACT: tl.constexpr,
               A_NORM: tl.constexpr,
               A_ACT: tl.constexpr, A_DIST: tl.constexpr, A_UNIMIX: tl.constexpr, A_P2: tl.constexpr,
               RANKS: tl.constexpr, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr, NPROG: tl.constexpr,
               NPROG_P2: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               PRECISION: tl.constexpr, FOLD: tl.constexpr, KSR: tl.constexpr = 0, kp=None,
               B=0, BLOCK_NR: tl.constexpr = 16, BLOCK_NK: tl.constexpr = 16, a_max_std=0.0):
        """The Actor on features [stoch, deter]: LA dense layers of HA (layer l in its own slots at
        OFF_P + l P_SLOT: raw, out at + HAP, partials at + 2 HAP), its output layer and sample from
        policy_noise (A_DIST 0: one-hot with unimix, 1: tanh-normal, 2: normal, 3: bounded normal, whose
        std ceiling is a_max_std) -> action[:, t] and the
        scaled action -> OFF_AS; then the RSSM's action layer -> OFF_AH (FOLD with V3's norm: its raw
        output and partials only, normalised by the cell's load). FOLD: each normed hidden layer's
        norm is applied by the next layer's load. KSR: the first layer (normed) split over K into kp
        (`_dense`'s KSR). Returns the epoch."""
        hid = sc + OFF_P
        A_FOLD: tl.constexpr = A_NORM * FOLD  # the norm a layer's consumer applies (0: it reads `out`)
        out_at = HAP * (A_FOLD == 0)  # where a consumer reads a layer: out, or (folded) raw
        epoch = _dense(flags, pid_b, pid_c, epoch, hid + HAP, hid, hid + 2 * HAP, SW, rows, row_ok, HA, s_prev,
                       s_stride, row_ok, S, d_prev, d_stride, D, act_w0, act_b, hid, SW, act_nw, act_nb, a_eps, r0,
                       False, A_NORM, A_ACT, RANKS, SPLIT, SPLIT_P2, NPROG, NPROG_P2, BLOCK_B, BLOCK_N, BLOCK_K,
                       PRECISION, FOLD, KSR=KSR, kp=kp, B=B, BLOCK_NR=BLOCK_NR, BLOCK_NK=BLOCK_NK)
        for layer in range(1, LA):
            prev = hid + (layer - 1) * P_SLOT
            dst = hid + layer * P_SLOT
            epoch = _dense(flags, pid_b, pid_c, epoch, dst + HAP, dst, dst + 2 * HAP, SW, rows, row_ok, HA,
                           prev + out_at, SW, row_ok, HA, prev, SW, 0, act_w + (layer - 1) * HA * HA,
                           act_b + layer * HA, dst, SW, act_nw + layer * HA, act_nb + layer * HA, a_eps, r0, False,
                           A_NORM, A_ACT, RANKS, SPLIT, SPLIT_P2, NPROG, NPROG_P2, BLOCK_B, BLOCK_N, BLOCK_K,
                           PRECISION, FOLD, prev + 2 * HAP, act_nw + (layer - 1) * HA,
                           act_nb + (layer - 1) * HA, a_eps, A_FOLD, A_ACT)
        prev = hid + (LA - 1) * P_SLOT
        last = prev + out_at
        act_t = action + t * A
        scaled = sc + OFF_AS
        if A_DIST == 0:  # one-hot: logits (phase 1), sample (phase 2); a one-hot action is its own scaled copy
            _linear(sc + OFF_AO, rows, row_ok, A, last, SW, row_ok, HA, last, SW, 0, act_ow, act_ob, last, SW,
                    sc + OFF_AO, SW, r0, 0, False, 0, 2, RANKS, SPLIT, BLOCK_B, BLOCK_N, BLOCK_K, PRECISION,
                    prev + 2 * HAP, act_nw + (LA - 1) * HA, act_nb + (LA - 1) * HA, a_eps, A_FOLD, A_ACT, SPLIT_P2)
            epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
            _categorical(sc + OFF_AO, SW, rows, row_ok, 1, A, a_unimix, policy_noise + t * A, T * A, act_t, T * A,
                         act_t, T * A, scaled, SW, r0, False, True, A_UNIMIX, RANKS, SPLIT, 1, A_P2)
        else:
            _gaussian(last, SW, rows, row_ok, HA, act_ow, act_ob, A, a_min_std, policy_noise + t * A, T * A,
                      act_t, T * A, scaled, SW, act_t, T * A, r0, A_DIST, RANKS, SPLIT, BLOCK_B, BLOCK_N, BLOCK_K,
                      PRECISION, sc + OFF_ASG, SW, SAVE, prev + 2 * HAP, act_nw + (LA - 1) * HA,
                      act_nb + (LA - 1) * HA, a_eps, A_FOLD, A_ACT, SPLIT_P2, max_std=a_max_std)
        epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
        ash = sc + OFF_AH
        if CELL_V3:  # dense(in_action)
            epoch = _dense(flags, pid_b, pid_c, epoch, ash, sc + OFF_AHR, sc + OFF_AHP, SW, rows, row_ok, H, scaled,
                           SW, row_ok, A, scaled, SW, 0, ina_w, ina_b, ash, SW, ina_nw, ina_nb, eps, r0, False, NORM,
                           ACT, RANKS, SPLIT, SPLIT_P2, NPROG, NPROG_P2, BLOCK_B, BLOCK_N, BLOCK_K, PRECISION,
                           FOLD)
        else:  # V1: a plain linear layer
            epoch = _dense(flags, pid_b, pid_c, epoch, ash, sc + OFF_AHR, sc + OFF_AHP, SW, rows, row_ok, H, scaled,
                           SW, row_ok, A, scaled, SW, 0, ina_w, ina_b, ash, SW, ina_nw, ina_nb, eps, r0, False, 0,
                           2, RANKS, SPLIT, SPLIT_P2, NPROG, NPROG_P2, BLOCK_B, BLOCK_N, BLOCK_K, PRECISION)
        return epoch

    @triton.jit
    def rssm_kernel(
        deter0, stoch0,      # [B, D], [B, S] the initial state (read at step 0 only)
        deter, stoch,        # [B, T, DP], [B, T, SP] (rows padded to 128-byte lines): entry t the state after step t
        deter_out, stoch_out,  # [B, T, D], [B, T, S] the outputs: each step's state written again, never read
        a_share,             # [B, T, H] the action's share of the cell input (A_PRE: of dyn_x's; unused with POLICY)
        e_share,             # [B, T, H] the embedding's share of the posterior (OBSERVE)
        resets,              # [B, T] int8: zero deter and stoch before step t (OBSERVE)
        noise,               # [B, T, S]: Gaussian eps [stoch] or Gumbel noise [stoch * classes]
        stat0, stat1,        # out [B, T, stoch] mean and std, or stat0 [B, T, stoch * classes] logits
        scratch,             # [T, B, SW] write-once per-step slots (state dtype), see the module docstring
        flags,               # [batch tiles * NPROG] int32 zeros: the barrier's epochs
        consts,              # [7] state dtype: min_std, unimix, eps, actor eps, actor min_std, actor unimix,
                             # actor max_std
        # cell (V1: in_stoch + "in" norm, GRU; V3: in_deter, in_stoch + their norms, dyn_x, dyn_h, dyn_out norm, gates)
        in_s_w, in_s_b, in_s_nw, in_s_nb, in_d_w, in_d_b, in_d_nw, in_d_nb, gru_wi, gru_bi, gru_wh, gru_bh,
        dx_w, dx_b, dh_w, dyn_nw, dyn_nb, g_w, g_b,
        # the 2023 dense GRU (CELL_NG): its gates are g_w [3 D, D + H], g_b, their norm dyn_nw / dyn_nb; with a
        # learned initial state (LEARNED) g_add [B, T, 3 D] the initial deter's share of the gates at resets, d_init [D]
        g_add, d_init,
        # the head that feeds back (observe: post_deter + post norm; imagine: prior dense) and its output layer
        head_w, head_b, head_nw, head_nb, out_w, out_b,
        # the actor (POLICY): layers, output layer, noise [B, T, A], action out [B, T, A], RSSM action layer
        act_w0, act_w, act_b, act_nw, act_nb, act_ow, act_ob, policy_noise, action, ina_w, ina_b, ina_nw, ina_nb,
        # D, H, G constexpr: the block-diagonal layers' tiles then load 16 bytes per copy, not 4 (docs/kernels.md)
        B, T, D: tl.constexpr, S, Z, C, H: tl.constexpr, G: tl.constexpr, A, HA, LA, DP, SP, SW, TSTRIDE,
        OFF_XR, OFF_X, OFF_XP, OFF_UR, OFF_U, OFF_HR, OFF_HD, OFF_HP, OFF_LG, OFF_LGP, OFF_GT, OFF_SG,
        OFF_P, P_SLOT, HAP, OFF_AO, OFF_AS, OFF_AHR, OFF_AH, OFF_AHP, OFF_ASG, OFF_KD, OFF_KH, OFF_KA, OFF_GR, OFF_GP,
        CELL_V3: tl.constexpr, OBSERVE: tl.constexpr, POLICY: tl.constexpr, CAT: tl.constexpr, SAVE: tl.constexpr,
        NORM: tl.constexpr, ACT: tl.constexpr, UNIMIX: tl.constexpr,
        A_NORM: tl.constexpr, A_ACT: tl.constexpr, A_DIST: tl.constexpr, A_UNIMIX: tl.constexpr, A_P2: tl.constexpr,
        SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr, NPROG: tl.constexpr, NPROG_P2: tl.constexpr,
        BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLK_G: tl.constexpr,
        BLK_C: tl.constexpr, CAT_G: tl.constexpr, C_P2: tl.constexpr, PRECISION: tl.constexpr,
        BLOCK_ND: tl.constexpr,  # column tiles of the phases over deter's columns (launch._deter_tile)
        FOLD: tl.constexpr,  # 1: normed layers' norms applied by their consumers' loads (no norm phases; not with SAVE)
        DYN_KS: tl.constexpr,  # 2: V3's dyn_x dot split over K between two halves of the ranks (`_dyn_x_split`)
        LOGITS_KS: tl.constexpr,  # > 1: the categorical head's logits dot split over K (`_linear_k_split`)
        KSR: tl.constexpr,  # 1: the normed long-K layers (in_deter, the head, the Actor's first) split over K, their
                            # norm phases over rows (`_linear_k_rows` -> OFF_KD / OFF_KH / OFF_KA, `_norm_k_rows`)
        BLOCK_NR: tl.constexpr,  # column tiles of `_norm_k_rows`
        BLOCK_NK: tl.constexpr,  # column tiles of `_linear_k_rows`
        BLOCKS_KMAJOR: tl.constexpr,  # g_w given as [G, 3 D/G, H/G] (`launch._wide_tiles_pay`)
        PRELOAD_H: tl.constexpr = False,  # the gates' biases and previous deter loaded before their dots
        A_PRE: tl.constexpr = False,  # V3 without the Actor: a_share is the action's share times W_x[:, 2H:]
        # noise / policy_noise / deter0 / stoch0 given as their int64 slot of a CUDA graph's input table
        # (core/cuda_graphs.py `InputTable`): the address, 16-byte aligned, loaded where it is read
        NOISE_AT: tl.constexpr = False, POLICY_NOISE_AT: tl.constexpr = False, DETER0_AT: tl.constexpr = False,
        STOCH0_AT: tl.constexpr = False,
        CELL_NG: tl.constexpr = False,  # the cell is the 2023 dense GRU (`_norm_gru`)
        LEARNED: tl.constexpr = False,  # observe from a learned initial state (CELL_NG: g_add, d_init)
    ):
        RANKS: tl.constexpr = SPLIT // NPROG
        if NOISE_AT:
            noise = tl.multiple_of(tl.load(noise).to(stat0.dtype), 16)
        if POLICY_NOISE_AT:
            policy_noise = tl.multiple_of(tl.load(policy_noise).to(stat0.dtype), 16)
        # what the folded layers' consumers read: the raw output, and the norm to apply on the load
        HEAD_FOLD: tl.constexpr = NORM * FOLD
        ACTION_FOLD: tl.constexpr = NORM * FOLD * POLICY * CELL_V3  # V3's normed action layer in the loop
        pid_b, pid_c, r0, rows, row_ok = program_rows(B, BLOCK_B, RANKS)
        d_stride = T * DP
        s_stride = T * SP
        min_std = tl.load(consts + 0)
        unimix = tl.load(consts + 1)
        eps = tl.load(consts + 2)
        epoch = pid_c * 0
        for t in range(T):
            d_new = deter + t * DP
            s_new = stoch + t * SP
            if t == 0:  # the caller's initial state, read where it is (no copy into the sequences)
                if DETER0_AT:
                    d_prev = tl.multiple_of(tl.load(deter0).to(deter.dtype), 16)
                else:
                    d_prev = deter0
                if STOCH0_AT:
                    s_prev = tl.multiple_of(tl.load(stoch0).to(stoch.dtype), 16)
                else:
                    s_prev = stoch0
                dp_stride = d_stride * 0 + D
                sp_stride = s_stride * 0 + S
            else:
                d_prev = d_new - DP
                s_prev = s_new - SP
                dp_stride = d_stride
                sp_stride = s_stride
            sc = scratch + t * TSTRIDE
            if OBSERVE:
                prev_ok = row_ok & (tl.load(resets + rows * T + t, mask=row_ok, other=1) == 0)
            else:
                prev_ok = row_ok
            if POLICY:
                epoch = _actor(flags, pid_b, pid_c, epoch, t, T, s_prev, sp_stride, d_prev, dp_stride, rows, row_ok,
                               sc, SW, OFF_P, P_SLOT, HAP, OFF_AO, OFF_AS, OFF_AHR, OFF_AH, OFF_AHP, OFF_ASG,
                               act_w0, act_w, act_b, act_nw, act_nb, act_ow, act_ob, policy_noise, action,
                               ina_w, ina_b, ina_nw, ina_nb, S, D, H, A, HA, LA, eps,
                               tl.load(consts + 3), tl.load(consts + 4), tl.load(consts + 5), r0,
                               CELL_V3, SAVE, NORM, ACT, A_NORM, A_ACT, A_DIST, A_UNIMIX, A_P2, RANKS, SPLIT, SPLIT_P2,
                               NPROG, NPROG_P2, BLOCK_B, BLOCK_N, BLOCK_K, PRECISION, FOLD, KSR, sc + OFF_KA,
                               B, BLOCK_NR, BLOCK_NK, tl.load(consts + 6))
                if ACTION_FOLD != 0:
                    a_src = sc + OFF_AHR
                else:
                    a_src = sc + OFF_AH
                a_stride = SW
            else:
                a_src = a_share + t * H
                a_stride = T * H
            if CELL_V3:
                epoch = _block_gru(flags, pid_b, pid_c, epoch, d_prev, dp_stride, d_new, d_stride, deter_out + t * D,
                                   T * D, s_prev, sp_stride, prev_ok, rows, row_ok, sc, SW, OFF_XR, OFF_X, OFF_XP,
                                   OFF_UR, OFF_U, a_src, a_stride,
                                   in_d_w, in_d_b, in_d_nw, in_d_nb, in_s_w, in_s_b, in_s_nw, in_s_nb, dx_w, dx_b,
                                   dh_w, dyn_nw, dyn_nb, g_w, g_b, D, S, H, G, eps, r0, sc + OFF_GT, SAVE, NORM,
                                   ACT, RANKS, SPLIT, SPLIT_P2, NPROG, NPROG_P2, BLOCK_B, BLOCK_N, BLOCK_K, BLK_G,
                                   BLK_C, BLOCK_ND, PRECISION, FOLD, sc + OFF_AHP, ina_nw, ina_nb, ACTION_FOLD,
                                   DYN_KS, KSR, sc + OFF_KD, B, BLOCK_NR, BLOCK_NK, BLOCKS_KMAJOR, PRELOAD_H, A_PRE)
            elif CELL_NG:
                epoch = _norm_gru(flags, pid_b, pid_c, epoch, d_prev, dp_stride, d_new, d_stride, deter_out + t * D,
                                  T * D, s_prev, sp_stride, prev_ok, rows, row_ok, sc, SW, OFF_XR, OFF_X, OFF_XP,
                                  OFF_GR, OFF_GP, a_src, a_stride, in_s_w, in_s_b, in_s_nw, in_s_nb, g_w, g_b, dyn_nw,
                                  dyn_nb, g_add + t * 3 * D, T * 3 * D, d_init, D, S, H, eps, r0, NORM, ACT, LEARNED,
                                  RANKS, SPLIT, SPLIT_P2, NPROG, NPROG_P2, BLOCK_B, BLOCK_N, BLOCK_K, PRECISION)
            else:
                epoch = _gru(flags, pid_b, pid_c, epoch, d_prev, dp_stride, d_new, d_stride, deter_out + t * D, T * D,
                             s_prev, sp_stride, prev_ok, rows, row_ok, sc, SW,
                             OFF_XR, OFF_X, OFF_XP, a_src, a_stride, in_s_w, in_s_b, in_s_nw, in_s_nb,
                             gru_wi, gru_bi, gru_wh, gru_bh, D, S, H, eps, r0, sc + OFF_GT, SAVE, NORM, ACT, RANKS,
                             SPLIT, SPLIT_P2,
                             NPROG, NPROG_P2, BLOCK_B, BLOCK_N, BLOCK_K, PRECISION)
            # the head that feeds the next step: observe act(norm(deter W_pd^T + embed share)), imagine dense(prior)
            epoch = _dense(flags, pid_b, pid_c, epoch, sc + OFF_HD, sc + OFF_HR, sc + OFF_HP, SW, rows, row_ok, H,
                           d_new, d_stride, row_ok, D, d_new, d_stride, 0, head_w, head_b, e_share + t * H, T * H,
                           head_nw, head_nb, eps, r0, OBSERVE, NORM, ACT, RANKS, SPLIT, SPLIT_P2, NPROG, NPROG_P2,
                           BLOCK_B, BLOCK_N, BLOCK_K, PRECISION, FOLD, KSR=KSR, kp=sc + OFF_KH, B=B,
                           BLOCK_NR=BLOCK_NR, BLOCK_NK=BLOCK_NK)
            if HEAD_FOLD != 0:
                head = sc + OFF_HR
            else:
                head = sc + OFF_HD
            if CAT and LOGITS_KS > 1:  # the K parts -> OFF_LGP, their sum -> OFF_LG by the sample phase
                tl.static_assert(HEAD_FOLD == 0, "the logits' K split reads the head's normed output")
                _linear_k_split(sc + OFF_LGP, SW, rows, row_ok, Z * C, head, SW, H, out_w, out_b, r0, LOGITS_KS, RANKS,
                                SPLIT, BLOCK_B, BLOCK_N, BLOCK_K, PRECISION)
                epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
                _categorical(sc + OFF_LGP, SW, rows, row_ok, Z, C, unimix, noise + t * S, T * S, stat0 + t * S, T * S,
                             s_new, s_stride, stoch_out + t * S, T * S, r0, True, True, UNIMIX, RANKS, SPLIT, CAT_G,
                             C_P2, LOGITS_KS, sc + OFF_LG)
            elif CAT:
                _linear(sc + OFF_LG, rows, row_ok, Z * C, head, SW, row_ok, H, head, SW, 0, out_w, out_b,
                        sc, SW, sc, SW, r0, 0, False, 0, 2, RANKS, SPLIT, BLOCK_B, BLOCK_N, BLOCK_K, PRECISION,
                        sc + OFF_HP, head_nw, head_nb, eps, HEAD_FOLD, ACT, SPLIT_P2)
                epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
                _categorical(sc + OFF_LG, SW, rows, row_ok, Z, C, unimix, noise + t * S, T * S, stat0 + t * S, T * S,
                             s_new, s_stride, stoch_out + t * S, T * S, r0, True, True, UNIMIX, RANKS, SPLIT, CAT_G,
                             C_P2)
            else:
                _gaussian(head, SW, rows, row_ok, H, out_w, out_b, Z, min_std, noise + t * S, T * S,
                          stat0 + t * Z, T * Z, stat1 + t * Z, T * Z, s_new, s_stride, r0, 0, RANKS, SPLIT, BLOCK_B,
                          BLOCK_N, BLOCK_K, PRECISION, sc + OFF_SG, SW, SAVE, sc + OFF_HP, head_nw, head_nb,
                          eps, HEAD_FOLD, ACT, SPLIT_P2, stoch_out + t * S, T * S)
            epoch = sync(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2)
