"""Launching the fused RSSM kernel (`triton_kernels.rssm_kernel`): the weights as kernel arguments,
the launch configuration and the write-once scratch layout; `unroll` runs one launch over [B, T].

Plan (v1):
- off the chain, torch ops (cuBLAS) exactly as the reference: the action's share of the cell
  input (zeroed at resets, scaled by max(1, |a|)), the embedding's share of the posterior, and in
  `observe` the prior head over all posterior deters afterwards (`reference.prior`, batched).
- `triton_kernels.rssm_kernel`, one persistent launch, the time loop inside. Grid = (batch tiles
  of BLOCK_B rows, SPLIT programs): every layer's BLOCK_N-column tiles are dealt out round robin
  over the SPLIT programs of a batch tile, and a flag barrier over those programs (ops/rnn/triton.py
  `_step_barrier`, one epoch per barrier) follows every layer that other programs read. Per step t:
  reset (observe: zero the previous deter / stoch where is_first), [imagine with an `Actor` in the
  loop: the actor MLP on [stoch, deter], its sample from the policy noise -> action[:, t], the
  RSSM's action layer], the cell (V1: dense in_stoch + action share -> norm -> act -> GRU cell; V3:
  block GRU), the head that feeds back (observe: post_deter + embed share -> norm -> act ->
  post_out; imagine: dense prior -> prior_out), the distribution (Gaussian mean / std and
  mean + std * eps; categorical unimix logits and the one-hot argmax of logits + Gumbel noise).
  A layer is one phase (matmul tiles, activated) or, with a norm, two: raw output + per-program
  partial row sums / sums of squares, barrier, normalise own tiles from the reduced partials,
  barrier. Per-block norms (V3 dyn_out) and categorical sampling deal whole blocks / latents out
  over the programs in their second phase. V3 observe with norms: 9 barriers per step.
- SPLIT: on CUDA by default min(SMs // batch tiles, the widest layer's column tiles), all programs
  co-resident (at most one per SM; an explicit SPLIT over that raises). On the CPU the interpreter
  runs programs one after another (a cross-program barrier would deadlock), so there one program
  per batch tile runs the SPLIT ranks in turn (`EMULATE`; SPLIT=1 by default): the CPU tests check
  the split bookkeeping, the GPU tests the barrier and memory ordering.
- memory ordering: Triton pipelines K-loop loads as `cp.async.ca` (cached in the SM's
  non-coherent L1, `.cg` dropped), so everything one program reads of another's writes is
  *write-once*: deter and stoch as [B, T, DP / SP] sequences (step 0 reads the caller's initial
  state, which nothing writes) and a fresh per-step scratch slot
  per layer output / raw output / partials ([T, B, SW]); every (step, row, slot) region is whole
  128-byte lines (`_lines`), written in one phase and first read after the barrier that ends it,
  so no SM can hold a line in L1 before it is final. Cost: scratch of T x B x SW numbers (V3-12m
  imagine with the actor, N1024 H15: ~300 MB, and ~360 MB more for KSPLIT_ROWS' parts) and padded
  deter / stoch sequences [B, T, DP / SP]; the kernel stores each step's deter / stoch a second
  time into the contiguous outputs [B, T, D / S], which it never reads.
- weights in their native layouts, read through strides (W [N, K]; V3's dyn_h [G, D/G, H/G],
  gates.w [G, H/G, 3 D/G], gates.b [G, 3 D/G] per block): no host packing per call except dtype
  casts (bf16) and the Actor's hidden-layer weights and per-layer vectors (stacked per call).
- policies other than the project's `Actor` (or an Actor without pre-drawn noise) run on
  `reference.imagine`, after a one-time warning saying why.

"""

from __future__ import annotations

import functools
import os

import torch
from torch import nn

from worldmodels.core import cuda_graphs
from worldmodels.ops.rssm.reference import RSSMSpec

import triton  # noqa: E402  (this module is imported only where triton is installed)

from worldmodels.ops.rnn.triton import _kernel_precision  # noqa: E402
from worldmodels.ops.rssm.triton_chain_kernels import rssm_chain_kernel  # noqa: E402
from worldmodels.ops.rssm.triton_kernels import rssm_kernel  # noqa: E402

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

# Benchmarks override the launch configuration through this (keys of `_config`'s result).
config_override: dict | None = None


def _kind(value: str, choices: tuple[str, ...]) -> int:
    return choices.index(value)


def _operand_dtype(precision: str, state_dtype: torch.dtype) -> torch.dtype:
    """The dtype of the dot operands the kernel streams: bf16 weights in bf16 mode on the GPU
    (the interpreter emulates it by rounding fp32 operands), else the state dtype."""
    if precision == "bf16" and state_dtype == torch.float32 and not _INTERPRET:
        return torch.bfloat16
    return state_dtype


@functools.lru_cache(maxsize=64)
def _constants(values: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The kernel's scalar constants as a device tensor, made once per value set: a host-to-device
    copy per call would be illegal inside a CUDA-graph capture (the kernel only reads it)."""
    return torch.tensor(values, dtype=dtype, device=device)


def _zeros_for(w: dict, sd: torch.dtype, n: int) -> torch.Tensor:
    """One zero vector that stands in for every absent bias / norm parameter (sliced by the kernel)."""
    return torch.zeros(n, dtype=sd, device=w["in_stoch.w"].device)


def _rssm_args(spec: RSSMSpec, w: dict, head: str, sd: torch.dtype, operand: torch.dtype) -> dict:
    """The kernel's RSSM weight arguments, in their native layouts (no copies unless a dtype cast is
    needed: bf16 operands, or weights of another dtype): matrices W [N, K] (operand dtype), V3's
    dyn_h [G, D/G, H/G], gates.w [G, H/G, 3 D/G], gates.b [G, 3 D/G]; vectors in the state dtype;
    absent biases / norm parameters read from one zero vector. `head`: "post" (observe) or "prior"."""
    first, out = ("post_deter", "post_out") if head == "post" else ("prior", "prior_out")
    zeros = _zeros_for(w, sd, 3 * max(spec.deter, spec.hidden, w[f"{out}.w"].shape[0]))

    def mat(name):
        return w[name].to(operand).contiguous()

    def vec(name):
        t = w.get(name)
        return zeros if t is None else t.to(sd).contiguous()

    p = {"in_s_w": mat("in_stoch.w"), "in_s_b": vec("in_stoch.b")}
    if spec.cell == "gru":
        p.update(in_s_nw=vec("in.norm_w"), in_s_nb=vec("in.norm_b"), gru_wi=mat("gru.w_ih"), gru_bi=vec("gru.b_ih"),
                 gru_wh=mat("gru.w_hh"), gru_bh=vec("gru.b_hh"))
    else:
        p.update(in_s_nw=vec("in_stoch.norm_w"), in_s_nb=vec("in_stoch.norm_b"),
                 in_d_w=mat("in_deter.w"), in_d_b=vec("in_deter.b"), in_d_nw=vec("in_deter.norm_w"),
                 in_d_nb=vec("in_deter.norm_b"), dx_w=mat("dyn_x.w"), dx_b=vec("dyn_x.b"), dh_w=mat("dyn_h"),
                 dyn_nw=vec("dyn_out.norm_w"), dyn_nb=vec("dyn_out.norm_b"), g_w=mat("gates.w"), g_b=vec("gates.b"))
    norm = "post" if head == "post" else "prior"
    p.update(head_w=mat(f"{first}.w"), head_b=vec(f"{first}.b"), head_nw=vec(f"{norm}.norm_w"),
             head_nb=vec(f"{norm}.norm_b"), out_w=mat(f"{out}.w"), out_b=vec(f"{out}.b"))
    return p


def _actor_args(policy, params: dict, spec: RSSMSpec, w: dict, sd: torch.dtype, operand: torch.dtype) -> dict:
    """The kernel's actor arguments (and its sizes / kinds) from the Actor's parameters by
    functional_call name, overridden by `params`. Matrices in their native [N, K] layout; the hidden
    layers' weights and the per-layer vectors are stacked (a per-call copy of (LA - 1) HA^2 + 3 LA HA
    numbers: the one host-side repack left, see the module docstring)."""
    params = {**dict(policy.named_parameters()), **params}
    layers = len(policy.net) - 1
    width = policy.net[0][0].out_features
    norm, act = policy.net[0][1], policy.net[0][2]
    norm_kind = 0 if isinstance(norm, nn.Identity) else (1 if isinstance(norm, nn.RMSNorm) else 2)
    zeros = _zeros_for(w, sd, max(width, spec.hidden))

    def mat(name):
        return params[name].to(operand).contiguous()

    def vecs(suffix):
        return torch.stack([params[f"net.{i}.{suffix}"].to(sd) if f"net.{i}.{suffix}" in params else zeros[:width]
                            for i in range(layers)]).contiguous()

    def vec(name):
        return w[name].to(sd).contiguous() if name in w else zeros

    hidden = [mat(f"net.{i}.0.weight") for i in range(1, layers)]
    norm_eps = getattr(norm, "eps", None)
    if norm_eps is None:
        norm_eps = torch.finfo(sd).eps  # nn.RMSNorm(eps=None)
    return dict(
        tensors=dict(act_w0=mat("net.0.0.weight"), act_w=torch.stack(hidden) if hidden else zeros.to(operand),
                     act_b=vecs("0.bias"), act_nw=vecs("1.weight"), act_nb=vecs("1.bias"),
                     act_ow=mat(f"net.{layers}.weight"), act_ob=params[f"net.{layers}.bias"].to(sd).contiguous(),
                     ina_w=w["in_action.w"].to(operand).contiguous(), ina_b=vec("in_action.b"),
                     ina_nw=vec("in_action.norm_w"), ina_nb=vec("in_action.norm_b")),
        width=width, layers=layers, action_dim=policy.action_dim, norm=norm_kind,
        act=0 if isinstance(act, nn.ELU) else 1, dist=_kind(policy.dist_type, ("onehot", "tanh_normal", "normal")),
        eps=float(norm_eps), min_std=float(policy.min_std), unimix=float(policy.unimix))


# ---------------------------------------------------------------------------------------------- launch
def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(1, n))


def _config(device: torch.device, dtype: torch.dtype, batch: int = 0, weight_bytes: int = 0) -> dict:
    """Launch configuration: BLOCK_B rows per program (>= 16 for tl.dot), BLOCK_N-column tiles,
    BLOCK_K-deep dots, warps, SPLIT column ranks per batch tile (None: as many as the SMs allow,
    up to the widest layer's column tiles; on the CPU 1). EMULATE=True runs the SPLIT ranks one
    after another inside one program per batch tile (always so under the interpreter).
    `weight_bytes`: the weights read per step; every batch tile re-reads them from L2. (`_plan`
    widens the 16-row tiles of no-grad open-loop imagination: `_open_loop_rows`.)
    Optional keys (benchmarks): STAGES (default 1: the K loops of the matmul tiles are plain `range`
    loops, pipelined or not by Triton's own choice at the launch's num_stages; > 1: `tl.range(...,
    num_stages=STAGES)`, software-pipelined weight / activation loads), num_stages (the launch
    option, Triton's default 3 when absent), BLK_G / CAT_G (groups / latents per tile of the group
    norm and the categorical, default a fair share of the ranks'), FOLD_NORMS (the forward without
    norm phases: each row norm applied by its consumer's load; calls that save nothing for a
    backward; default `_fold_pays`), DYN_KSPLIT (V3's dyn_x dot split over K between two halves of
    the ranks where there are at least twice as many ranks as its column tiles, observe at B16;
    default on on CUDA: `_dyn_k_split`), LOGITS_KSPLIT (the categorical logits dot split over K,
    `_k_parts`, default on on CUDA), ND_MAX / ND_FILL (`_deter_tile`), COUNT_BARRIER (the barrier
    on one counter per batch tile; default `_count_pays`), KSPLIT_ROWS (the normed long-K layers
    split over K, their norms over rows: `_k_rows`; default `_k_rows_pays`; KSR_N / KSR_NR: the
    column tiles of its K parts and of its norm phase), BLOCKS_KMAJOR (V3's
    block-diagonal weights read transposed: `_blocks_k_major`; default `_k_major_pays`), PRELOAD_H
    (V3's gates phase loads each tile's biases and previous deter before its dots; default
    `_preload_pays`) and the timing-only BARRIER / PROFILE (`_flags`).
    BLOCK_N / BLOCK_K: any power of two >= 16."""
    if device.type != "cuda" or dtype == torch.float64:  # interpreter; fp64 FMA dots over [16, 16, 16] products
        cfg = dict(BLOCK_B=16, BLOCK_N=16, BLOCK_K=16, num_warps=4, SPLIT=None if device.type == "cuda" else 1)
    elif batch >= 512 and weight_bytes >= 2 << 20:
        # H200 (docs/kernels.md): V3-12m imagine N1024, 16-row tiles re-read ~7 MB of weights 64x per
        # step (7.9 ms); 64-row tiles with 8 warps cut that 4x (3.0 ms). Below ~2 MB it does not pay.
        cfg = dict(BLOCK_B=64, BLOCK_N=32, BLOCK_K=32, num_warps=8, SPLIT=None)
    else:
        cfg = dict(BLOCK_B=16, BLOCK_N=32, BLOCK_K=32, num_warps=4, SPLIT=None)
    if config_override:
        cfg.update(config_override)
    return cfg


def _open_loop_rows(batch: int, hidden: int, sms: int) -> int:
    """Rows per batch tile of a no-grad open-loop imagination at N >= 512 under the 2 MB weight rule
    of `_config` (16 there): the widest tile of 64 / 32 rows whose ranks (the SMs over the batch
    tiles) are at most twice the hidden layers' 32-column tiles, else 16. Wider tiles mean fewer
    programs re-reading the weights and wider dots; past that many ranks the hidden layers' phases
    leave most of them idle. H200, tf32, no grad, same call (`python -m benchmarks.triton_rssm
    --cases V1-imagine-open,V3-1m-imagine-open --variants b16,default`, docs/kernels.md):
    V1 N1000 H12 (hidden 200: 64 rows, 8 ranks) 0.581 -> 0.478 ms, 0.628 -> 0.465; V3-1m N1024 H15
    (hidden 64: 32 rows, 4 ranks) 0.711 -> 0.622, 0.755 -> 0.687, 0.731 -> 0.645, 0.720 -> 0.644 in
    four calls, where 64 rows (8 ranks) measured 0.725 / 0.721 / 0.667. With the Actor in the loop
    V3-1m keeps 16 rows: 32 measured 1.30 against 1.19-1.22 (its 64-wide layers: four phases more
    with half the ranks idle)."""
    for rows in (64, 32):
        if sms // triton.cdiv(batch, rows) <= 2 * triton.cdiv(hidden, 32):
            return rows
    return 16


def _fold_pays(block_b: int, split: int) -> bool:
    """Whether the forward folds its row norms into their consumers' loads (FOLD_NORMS) by default
    on CUDA. The folded load re-applies the norm (and the activation) to every A tile of every column
    tile, and reduces the ranks' partial sums for its rows' statistics, which costs more than the
    norm phase and barrier it saves once the tiles have many rows or there are many ranks. H200,
    tf32, no grad, off -> forced on in one run (`python -m benchmarks.triton_rssm --variants
    nofold,fold`, docs/kernels.md): V3-1m imagine with the Actor (16-row tiles, 2 ranks) 1.242 ->
    1.112 ms, open loop 0.879 -> 0.876; V3-12m imagine with the Actor (64 rows, 8 ranks) 3.90 ->
    5.22, open loop 2.69 -> 3.30; V3-s512 observe (16 rows, 64 ranks) 2.66 -> 3.45; V1 observe (13
    ranks, where only the head folds) 1.122 -> 1.119. This rule against off (`--variants
    nofold,default`): V3-1m with the Actor 1.348 -> 1.164, open loop 0.789 -> 0.759."""
    return block_b <= 16 and split <= 4


def _dyn_k_split(cfg: dict, v3: bool, normed: bool, fold: bool, split: int, hidden: int) -> int:
    """How many K parts V3's dyn_x dot runs in (DYN_KSPLIT): 2 where its column tiles fill at most
    half the ranks, so the other half would idle through its K of 3 hidden + a block of deter (V3-s512
    observe at B16: 32 column tiles, 64 ranks); the dyn_out norm phase adds the two partial sums, so
    not without norms, nor with FOLD_NORMS (no norm phase). On by default on CUDA; the interpreter
    splits only where asked. H200, tf32, off -> split in one run (`python -m benchmarks.triton_rssm
    --cases V3-s512-observe --variants nodynk,default [--grad] [--graph-call]`, docs/kernels.md):
    V3-s512 observe no grad 2.699 -> 2.455 ms, fwd+bwd 6.810 -> 6.605, replayed from one CUDA graph
    6.398 -> 6.133; imagination's plans (2 and 8 ranks) do not split."""
    on = cfg.get("DYN_KSPLIT", False)
    return 2 if on and v3 and normed and not fold and split >= 2 * triton.cdiv(hidden, cfg["BLOCK_N"]) else 1


def _count_pays(split: int) -> bool:
    """Whether the barrier runs on one counter per batch tile (COUNT_BARRIER, `_count_barrier`: a poll
    is one acquire load per program) by default on CUDA, rather than on one flag per program (a poll
    is an acquire atomic per peer: SPLIT^2 per round on the same lines). H200, tf32, flags -> count
    in one run, three times (`python -m benchmarks.triton_rssm --variants nocount,default [--grad
    --graph-call]`, docs/kernels.md): V3-s512 observe (64 ranks) no grad 2.440 -> 2.309, 2.563 ->
    2.395, 2.467 -> 2.237 ms, fwd+bwd replayed 5.650 -> 5.403, 5.632 -> 5.277, 5.651 -> 5.344; V1
    observe (13 ranks) 1.139 -> 1.113, 1.279 -> 1.249, 1.132 -> 1.111, replayed 2.584 -> 2.542, 2.558
    -> 2.513, 2.571 -> 2.515. Imagination (2 and 8 ranks) moved by -3.4% to +3.4% either way in two
    runs (V3-1m with the Actor +3.4%, +1.0%; V3-12m with it -3.4%, -1.1%), as much as two rows of
    one launch differ in one run (2-3%): it keeps the flags."""
    return split > 8


def _k_parts(cfg: dict, k: int, n: int, split: int) -> int:
    """How many K parts the forward's categorical logits dot (n columns, depth k) runs in
    (LOGITS_KSPLIT, `triton_kernels._linear_k_split`): the most, up to 4, whose groups of ranks still
    hold all its column tiles, each part at least one K tile. V3-s512 observe at B16 has 64 ranks and
    32 column tiles of 16 there: 2 parts of K 256 (phase_profile, H200: the logits dot's slowest rank
    3.0 -> 1.75-2.25 us, the median 0.25 -> 1.75-2.0). On by default on CUDA; the interpreter splits
    only where asked. H200, tf32, off -> split in one run, twice (`python -m benchmarks.triton_rssm
    --cases V3-s512-observe --variants nolks,default [--grad --graph-call]`, docs/kernels.md): no grad
    2.607 -> 2.563 and 2.350 -> 2.237 ms, fwd+bwd replayed 5.702 -> 5.625 and 5.422 -> 5.344. The same
    split of the reverse chain's head layer (g_h = g_stats @ W_out, linear up to its norm phase)
    gained nothing on top (5.625 -> 5.632) and is not in the tree. Imagination's plans do not split."""
    parts = 1
    tiles = triton.cdiv(n, cfg["BLOCK_N"])
    while (cfg.get("LOGITS_KSPLIT", False) and parts < 4 and 2 * parts * tiles <= split
           and 2 * parts <= triton.cdiv(k, cfg["BLOCK_K"])):
        parts *= 2
    return parts


def _k_rows(cfg: dict, split: int, fold: bool, save: bool) -> bool:
    """Whether the forward splits its normed long-K layers over K (KSPLIT_ROWS; `triton_kernels._linear_k_rows`
    and `_norm_k_rows`): in_deter, the head and the Actor's first layer, each of which reads all of
    deter. Split over columns, each of a batch tile's SPLIT ranks reads the tile's whole [rows, K]
    activation block for its own column tiles; split over K, each reads 1 / SPLIT of it (and the
    same weight bytes), and the norm phase, split over rows, adds the parts and needs no partials.
    It needs whole rows per rank (BLOCK_B a multiple of SPLIT) and nothing saved for a backward or
    folded (it writes neither the raw output nor the partials)."""
    return (bool(cfg.get("KSPLIT_ROWS", False)) and split > 1 and cfg["BLOCK_B"] % split == 0
            and not fold and not save)


def _k_rows_pays(block_b: int) -> bool:
    """KSPLIT_ROWS by default on CUDA: at 64-row tiles (V3-12m imagination, 8 ranks). What it buys is
    not the bytes but the tile shape: split over columns, each rank's dot is one 64 x 32 tile over K
    2048-2560; split over K with the parts' column tiles as narrow (32: `--variants ksr-n32`), the
    same FLOPs from 2.4x fewer L2 bytes ran 12% slower, and with them as wide as the layer (256, the
    default `KSR_N`) 12% faster: the dots are bound by the MMA work one program issues per K slice,
    which a wider tile makes larger. H200, tf32, off -> on in one call, twice (`python -m
    benchmarks.triton_rssm --cases V3-12m-imagine-open,V3-12m-imagine-actor --variants noksr,default`,
    docs/kernels.md): open loop 2.587 -> 2.270 and 2.586 -> 2.306 ms, with the Actor 3.862 -> 3.405
    and 3.859 -> 3.381; with the Actor fwd+bwd (its torch chain) 15.90 -> 15.44; the DreamerV3
    size12m bf16 update, graphed, 20.08 / 20.09 -> 19.70. At 16-row tiles (V3-1m imagination, 2
    ranks) the norms fold by default (`_fold_pays`), which this cannot combine with; with the Actor
    the fold is faster (1.080 / 1.183 ms) than the split without it (`ksr-nofold`: 1.164 / 1.263;
    neither: 1.224 / 1.327), open loop the three within 3%; so off there. Where it pays it may still
    not apply (`_k_rows`: whole rows per rank, nothing saved or folded)."""
    return block_b >= 64


def _blocks_k_major(cfg: dict) -> bool:
    """Whether the forward reads V3's block-diagonal weights transposed per block (BLOCKS_KMAJOR; gates.w
    [G, 3 D/G, H/G], dyn_h [G, H/G, D/G], one copy each per call): K-contiguous tiles, the layout
    Hopper's wgmma reads tf32 operands in from shared memory. Triton emits wgmma for 64-row tiles
    (V3-12m imagination) and, for the native layouts (columns contiguous), copies those tiles in one
    element at a time (`benchmarks.profile.kernel_asm V3-12m-imagine-actor`: 4-byte `cp.async`, 16-byte with
    the transposes). With it the gates' deter tiles that lie in one block are addressed by that block
    (a scalar) instead of a division per column: sm_90 spills at V3-12m imagination 1,876 -> 972
    bytes, at V3-1m 116 -> 0. Default on CUDA: `_k_major_pays`."""
    return bool(cfg.get("BLOCKS_KMAJOR", False))


def _k_major_pays(block_b: int) -> bool:
    """BLOCKS_KMAJOR by default on CUDA at 64-row tiles, where Triton emits wgmma (V3-12m imagination).
    H200, tf32, off -> on in one call, twice (`python -m benchmarks.triton_rssm --cases
    V3-12m-imagine-open,V3-12m-imagine-actor,V3-1m-imagine-actor,V3-s512-observe --variants nokm,km
    --precisions tf32`, docs/kernels.md): V3-12m open loop 2.345 -> 2.011 and 2.310 -> 1.899 ms, with
    the Actor 3.583 -> 3.029 and 3.529 -> 3.006; with the Actor fwd+bwd (`--grad --graph-call`) 14.77
    -> 14.36; the DreamerV3 size12m bf16 update, graphed, 19.51 -> 19.43. At 16-row tiles (too few rows
    for wgmma's 64 per warpgroup: mma.sync) within 1%: V3-1m with the Actor 1.144 ->
    1.138 and 1.343 -> 1.344, V3-s512 observe 2.262 -> 2.241, fwd+bwd 5.371 -> 5.322; so off there,
    sparing the two copies per call."""
    return block_b >= 64


def _preload_pays(block_b: int) -> bool:
    """PRELOAD_H by default on CUDA at 64-row tiles (V3-12m imagination): the gates phase issues each
    deter tile's previous-deter and bias loads before its dots, so their L2 latency runs under the
    dots instead of after them (4 tiles per rank per step). H200, tf32, no grad, same call
    (`python -m benchmarks.triton_rssm --cases V3-12m-imagine-open,V3-12m-imagine-actor,V3-1m-imagine-actor
    --variants default,preh --precisions tf32`, docs/kernels.md): V3-12m open loop 1.824 -> 1.700,
    1.825 -> 1.612 and 1.784 -> 1.662 ms in three runs over two calls, with the Actor 2.982 -> 2.886;
    at 16-row tiles (V3-1m with the Actor) 1.071 -> 1.069, kept off. sm_90 spills at V3-12m open
    loop 384 -> 468 bytes."""
    return block_b >= 64


def _gpu_sms(device: torch.device) -> int | None:
    """The SMs of the GPU a plan is for; None under the interpreter (`benchmarks.profile.kernel_asm` plans
    for the H200's 132 on a CPU machine)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else None


def _split(cfg: dict, tiles: int, col_tiles: int, device: torch.device) -> tuple[int, int]:
    """(SPLIT ranks, NPROG programs) per batch tile. A real split (NPROG = SPLIT > 1) needs every
    program of the grid resident at once for the flag barrier: at most one program per SM."""
    split = cfg.get("SPLIT")
    sms = _gpu_sms(device)
    if sms is None or cfg.get("EMULATE", False):
        split = split or 1
        return split, 1
    if split is None:
        split = max(1, min(col_tiles, sms // tiles))
    if split > 1 and tiles * split > sms:
        raise ValueError(f"backend='triton': a column-split launch of {tiles} batch tiles x SPLIT={split} = "
                         f"{tiles * split} programs exceeds the {sms} SMs (all must be resident for the barrier); "
                         f"use a larger BLOCK_B or a smaller SPLIT")
    return split, split


def _lines(n: int) -> int:
    """n rounded up to whole 128-byte lines of fp32 (32 elements; 2 lines of fp64)."""
    return -(-n // 32) * 32


def _slots(widths: dict) -> tuple[dict, int]:
    """The write-once slots' offsets (`OFF_<name>`, in order) and the row width they add up to."""
    offsets, width = {}, 0
    for name, w in widths.items():
        offsets[f"OFF_{name}"] = width
        width += w
    return offsets, width


def _narrow_tiles(widest: int, tiles: int, sms: int) -> bool:
    """Whether 16-column tiles beat 32-column ones: when the 16-column tiles of the widest layer still
    each get an SM of their own, they give twice the ranks. H200, tf32: V1 observe B50 fwd+bwd 4.31
    -> 3.57 ms, no grad 1.94 -> 1.72; V3-s512 fwd+bwd 8.35 -> 8.15 (docs/kernels.md). Imagination at
    N1024 is SM-bound (kept at 32); layers wider than 1024 (size12m's deter 2048) are not measured
    with 16 (kept at 32)."""
    return widest <= 1024 and 2 * triton.cdiv(widest, 32) <= sms // tiles


def _plan(spec: RSSMSpec, batch: int, steps: int, weights: dict, actor: dict | None, device: torch.device,
          dtype: torch.dtype, save: bool = False, open_loop: bool = False) -> dict:
    """The launch configuration and the write-once scratch layout of one unroll (the fake
    implementation of the custom op sizes the saved scratch from it too). `save`: slots for what
    the backward reads (the cell's gates; the Gaussian head's and a Gaussian Actor's softplus' and
    tanh'). `open_loop`: an imagination with given actions (`_open_loop_rows`)."""
    d, h, z, c = spec.deter, spec.hidden, spec.stoch, spec.classes or 1
    s = z * c
    v3 = spec.cell == "block_gru"
    normed = spec.norm != "none"
    a = actor["action_dim"] if actor else 0
    ha = actor["width"] if actor else 0
    la = actor["layers"] if actor else 0
    weight_bytes = sum(w.numel() * w.element_size() for w in weights.values())
    weight_bytes += sum(t.numel() * t.element_size() for t in (actor["tensors"] if actor else {}).values())
    cfg = _config(device, dtype, batch, weight_bytes)
    sms = _gpu_sms(device)
    if (sms and open_loop and not save and batch >= 512 and cfg["BLOCK_B"] == 16 and dtype != torch.float64
            and not (config_override and "BLOCK_B" in config_override)):
        rows = _open_loop_rows(batch, h, sms)
        if rows > 16:
            cfg.update(BLOCK_B=rows, num_warps=8)
    tiles = triton.cdiv(batch, cfg["BLOCK_B"])
    widest = max(2 * h if v3 else h, d, s, ha)
    if sms and cfg["BLOCK_N"] == 32 and not (config_override and "BLOCK_N" in config_override):
        if _narrow_tiles(widest, tiles, sms):
            cfg["BLOCK_N"] = 16
    split, nprog = _split(cfg, tiles, triton.cdiv(widest, cfg["BLOCK_N"]), device)
    if sms:  # the interpreter runs the fold and the K split only where asked
        cfg.setdefault("FOLD_NORMS", _fold_pays(cfg["BLOCK_B"], split))
        cfg.setdefault("DYN_KSPLIT", True)
        cfg.setdefault("LOGITS_KSPLIT", True)
        cfg.setdefault("COUNT_BARRIER", _count_pays(split))
        cfg.setdefault("KSPLIT_ROWS", _k_rows_pays(cfg["BLOCK_B"]))
        cfg.setdefault("BLOCKS_KMAJOR", _k_major_pays(cfg["BLOCK_B"]))
        cfg.setdefault("PRELOAD_H", _preload_pays(cfg["BLOCK_B"]))
    fold = bool(cfg.get("FOLD_NORMS", False)) and not save  # the forward's FOLD
    ksr = _k_rows(cfg, split, fold, save)
    dyn_ks = _dyn_k_split(cfg, v3, normed, fold, split, h)
    deter_tile = _deter_tile(d, split, cfg, s)
    # not when the head's norm is folded into the logits' load
    logits_ks = _k_parts(cfg, h, s, split) if spec.classes and not fold else 1
    # write-once per-step scratch slots (see triton_kernels.py), each a whole number of 128-byte lines
    part = _lines(2 * split)
    xw = _lines(2 * h if v3 else h)
    hap = _lines(ha)
    widths = dict(XR=xw if normed else 0, X=xw, XP=2 * part if normed else 0,
                  UR=_lines(dyn_ks * h) if v3 and normed else 0, U=_lines(h) if v3 else 0,
                  HR=_lines(h) if normed else 0, HD=_lines(h), HP=part if normed else 0,
                  LG=_lines(s) if spec.classes else 0, LGP=_lines(logits_ks * s) if logits_ks > 1 else 0,
                  GT=_lines((3 if v3 else 4) * d) if save else 0, SG=_lines(z) if save and not spec.classes else 0,
                  P=la * (2 * hap + part), AO=_lines(a) if actor and actor["dist"] == 0 else 0, AS=_lines(a),
                  AHR=_lines(h) if actor and v3 and normed else 0, AH=_lines(h) if actor else 0,
                  AHP=part if actor and v3 and normed else 0,
                  ASG=_lines(2 * a) if save and actor and actor["dist"] != 0 else 0,
                  KD=_lines(split * h) if ksr and v3 and normed else 0, KH=_lines(split * h) if ksr and normed else 0,
                  KA=_lines(split * ha) if ksr and actor and actor["norm"] else 0)
    offsets, sw = _slots(widths)
    return dict(cfg=cfg, tiles=tiles, split=split, nprog=nprog, part=part, hap=hap, offsets=offsets, sw=sw,
                dims=(d, h, z, c, s, v3, normed, a, ha, la), fold=fold, dyn_ks=dyn_ks, logits_ks=logits_ks, ksr=ksr,
                deter_tile=deter_tile)


def _shared_args(spec: RSSMSpec, actor: dict | None, plan: dict, batch: int, steps: int, precision: str,
                 dtype: torch.dtype, device: torch.device) -> tuple[dict, dict]:
    """(sizes, constexprs) that the forward and the reverse-chain kernels take alike, from one plan: the
    backward must run the forward's work split and tile shapes."""
    d, h, z, c, s, v3, _, a, ha, la = plan["dims"]
    cfg, split, nprog = plan["cfg"], plan["split"], plan["nprog"]
    g = spec.blocks
    blk_c = min(_pow2(h // g), 64)
    c_p2 = _pow2(c)
    consts = _constants((spec.min_std, spec.unimix, spec.norm_eps, *(
        (actor["eps"], actor["min_std"], actor["unimix"]) if actor else (0.0, 0.0, 0.0))), dtype, device)
    sizes = dict(B=batch, T=steps, D=d, S=s, Z=z, C=c, H=h, G=g, A=a, HA=ha, LA=la, DP=_lines(d), SP=_lines(s),
                 P_SLOT=2 * plan["hap"] + plan["part"], HAP=plan["hap"], consts=consts)
    constexprs = dict(
        CELL_V3=v3, POLICY=actor is not None, CAT=bool(spec.classes),
        NORM=_kind(spec.norm, ("none", "rms", "layer")), ACT=_kind(spec.act, ("elu", "silu")),
        UNIMIX=spec.unimix > 0, A_NORM=actor["norm"] if actor else 0, A_ACT=actor["act"] if actor else 0,
        A_DIST=actor["dist"] if actor else 0, A_UNIMIX=bool(actor and actor["unimix"] > 0),
        A_P2=_pow2(a), SPLIT=split, SPLIT_P2=_pow2(split), NPROG=nprog, NPROG_P2=_pow2(nprog),
        BLOCK_B=cfg["BLOCK_B"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], BLK_C=blk_c,
        # whole groups / latents per tile, at most a fair share of the SPLIT ranks' (phase_profile, H200: one
        # rank sampled all 32 latents of V3-1m imagination while the other waited)
        BLK_G=cfg.get("BLK_G") or max(1, min(_pow2(g), 64 // blk_c, _pow2(triton.cdiv(g, split)))),
        CAT_G=cfg.get("CAT_G") or max(1, min(_pow2(z), 128 // c_p2, _pow2(triton.cdiv(z, split)))), C_P2=c_p2,
        BLOCK_ND=plan["deter_tile"],
        PRECISION=_kernel_precision(precision, dtype))
    return sizes, constexprs


def _deter_tile(deter: int, split: int, cfg: dict, stoch: int = 0) -> int:
    """Column-tile width of the phases over deter's columns (the forward's V3 gates, the reverse
    chain's cell and carry): a rank's share of the columns, from BLOCK_N up to 64. Each tile is a
    few short dots plus loads, so a rank's 32-column tiles one after another took 16 of V3-1m
    imagination's 68 us per forward step, and 2 x 29 of 118 per reverse step (phase_profile, H200).
    Wider still (up to 64) while the carry's deter tiles and stoch's BLOCK_N tiles after them are
    more than the ranks: V1 observe's 13 deter tiles of 16 and 2 stoch tiles put two tiles on two
    of its 13 ranks (phase_profile: the carry's slowest rank 7.25 us, the median 4.5); 7 of 32 and 2
    leave every rank one. Launch keys (benchmarks): ND_MAX moves the 64; ND_FILL=False keeps the
    share."""
    cap = cfg.get("ND_MAX", 64)
    tile = max(cfg["BLOCK_N"], min(_pow2(triton.cdiv(deter, split)), cap))
    stoch_tiles = triton.cdiv(stoch, cfg["BLOCK_N"])
    while cfg.get("ND_FILL", True) and tile < cap and triton.cdiv(deter, tile) + stoch_tiles > split:
        tile *= 2
    return tile


def _flags(plan: dict, device: torch.device, steps: int, kernel: str) -> torch.Tensor:
    """The barrier's epochs, one int32 per program. `COUNT_BARRIER=True` (default on CUDA above 8
    ranks: `_count_pays`) gives uint32: one counter per batch tile in its first program's place
    (`_count_barrier`). Two timing-only launch keys change them too: `BARRIER=False` gives int16
    flags, on which the kernels skip the cross-program wait (results wrong); `PROFILE=[]` gives int64
    (uint64 with the counter) flags with room after them for two %globaltimer stamps per program and
    barrier (`triton_kernels._stamp`), and appends (kernel, plan, flags) to that list."""
    programs = plan["tiles"] * plan["nprog"]
    cfg = plan["cfg"]
    count = bool(cfg.get("COUNT_BARRIER", False))
    profile = cfg.get("PROFILE")
    if profile is not None:
        flags = torch.zeros(programs * (1 + 2 * (PROFILE_BARRIERS_PER_STEP * steps + 1)),
                            dtype=torch.uint64 if count else torch.int64, device=device)
        profile.append((kernel, plan, flags))
        return flags
    if not cfg.get("BARRIER", True):
        return torch.zeros(programs, dtype=torch.int16, device=device)
    return torch.zeros(programs, dtype=torch.uint32 if count else torch.int32, device=device)


# room in a profiled launch's record (every kernel here has fewer barriers per step)
PROFILE_BARRIERS_PER_STEP = 64


def _launch(kernel, plan: dict, **args) -> None:
    cfg = plan["cfg"]
    kernel[(plan["tiles"], plan["nprog"])](**args, num_warps=cfg["num_warps"],
                                           **({"num_stages": cfg["num_stages"]} if "num_stages" in cfg else {}))


def _unroll(spec: RSSMSpec, weights: dict, deter0: torch.Tensor, stoch0: torch.Tensor, noise: torch.Tensor,
            precision: str, *, observe: bool, a_share=None, e_share=None, resets=None, actor: dict | None = None,
            policy_noise=None, save: bool = False, a_pre: bool = False) -> dict[str, torch.Tensor]:
    """Launch the kernel over noise's [B, T] and return the reference's output dict (with `save`,
    also "saved": the scratch [T, B, SW] the backward kernel reads). `a_pre` (V3 without the Actor, nothing
    saved): a_share is the action's share already multiplied by its columns of dyn_x.w, [B, T, H]."""
    if a_pre and (spec.cell == "gru" or actor is not None or save):
        raise ValueError("a_pre: a pre-multiplied action share is V3's, without the Actor, for a forward that "
                         "saves nothing")
    sd, dev = deter0.dtype, deter0.device
    batch, steps = noise.shape[:2]
    plan = _plan(spec, batch, steps, weights, actor, dev, sd, save, open_loop=not observe and actor is None)
    d, h, z, c, s, v3, _, a, ha, la = plan["dims"]
    offsets, sw = plan["offsets"], plan["sw"]
    sizes, constexprs = _shared_args(spec, actor, plan, batch, steps, precision, sd, dev)
    dp, sp = sizes["DP"], sizes["SP"]
    deter = deter0.new_empty(batch, steps, dp)
    stoch = deter0.new_empty(batch, steps, sp)
    # the outputs, written by the kernel beside the sequences it reads (a copy of the padded [:, 1:] views
    # would be a pass over them after the launch: 126 MB of deter at V3-12m imagination N1024 H15)
    deter_out = deter0.new_empty(batch, steps, d)
    stoch_out = deter0.new_empty(batch, steps, s)
    scratch = deter0.new_empty(steps, batch, sw)
    if max(scratch.numel(), deter.numel(), stoch.numel(), batch * steps * max(s, h, a)) >= 2 ** 31:
        raise ValueError("backend='triton': this unroll's buffers exceed 2^31 elements (32-bit indexing)")
    stat0 = deter0.new_empty(batch, steps, s if spec.classes else z)
    stat1 = stat0 if spec.classes else torch.empty_like(stat0)
    dummy = deter0.new_zeros(1)
    action = deter0.new_empty(batch, steps, a) if actor else dummy
    flags = _flags(plan, dev, steps, "rssm_kernel")
    tensors = dict(deter=deter, stoch=stoch, deter_out=deter_out, stoch_out=stoch_out,
                   a_share=dummy if a_share is None else a_share.contiguous(),
                   e_share=dummy if e_share is None else e_share.contiguous(),
                   resets=dummy if resets is None else resets.to(torch.int8).contiguous(),
                   stat0=stat0, stat1=stat1, scratch=scratch, flags=flags)
    tensors["noise"], noise_at = cuda_graphs.graph_input(noise.contiguous())
    tensors["deter0"], deter0_at = cuda_graphs.graph_input(deter0.contiguous())
    tensors["stoch0"], stoch0_at = cuda_graphs.graph_input(stoch0.contiguous())
    names = ("in_s_w", "in_s_b", "in_s_nw", "in_s_nb", "in_d_w", "in_d_b", "in_d_nw", "in_d_nb",
             "gru_wi", "gru_bi", "gru_wh", "gru_bh", "dx_w", "dx_b", "dh_w", "dyn_nw", "dyn_nb", "g_w", "g_b",
             "head_w", "head_b", "head_nw", "head_nb", "out_w", "out_b", "act_w0", "act_w", "act_b", "act_nw",
             "act_nb", "act_ow", "act_ob")
    given = {**weights, **(actor["tensors"] if actor else {})}
    kmajor = v3 and _blocks_k_major(plan["cfg"])
    if kmajor:  # per block: gates.w [G, H/G, 3 D/G] -> [G, 3 D/G, H/G], dyn_h [G, D/G, H/G] -> [G, H/G, D/G]
        given["g_w"] = given["g_w"].transpose(1, 2).contiguous()
        given["dh_w"] = given["dh_w"].transpose(1, 2).contiguous()
    tensors.update({n: given.get(n, dummy) for n in names})
    tensors["policy_noise"], policy_noise_at = (dummy, False) if policy_noise is None else \
        cuda_graphs.graph_input(policy_noise.contiguous())
    tensors["action"] = action
    tensors.update({n: given.get(n, dummy) for n in ("ina_w", "ina_b", "ina_nw", "ina_nb")})
    if batch > 0 and steps > 0:
        _launch(rssm_kernel, plan, **tensors, **sizes, SW=sw, TSTRIDE=batch * sw, **offsets, **constexprs,
                OBSERVE=observe, SAVE=save, STAGES=plan["cfg"].get("STAGES", 1),
                FOLD=int(plan["fold"]), DYN_KS=plan["dyn_ks"], LOGITS_KS=plan["logits_ks"], KSR=int(plan["ksr"]),
                BLOCK_NR=plan["cfg"].get("KSR_NR", min(_pow2(max(h, ha)), 512)),
                BLOCK_NK=plan["cfg"].get("KSR_N", min(_pow2(max(h, ha)), 256)), BLOCKS_KMAJOR=kmajor,
                PRELOAD_H=v3 and bool(plan["cfg"].get("PRELOAD_H", False)), A_PRE=bool(a_pre),
                NOISE_AT=noise_at, POLICY_NOISE_AT=policy_noise_at, DETER0_AT=deter0_at, STOCH0_AT=stoch0_at)
    out = {"deter": deter_out, "stoch": stoch_out}
    if spec.classes:
        out["logits"] = stat0.unflatten(-1, (z, c))
    else:
        out["mean"], out["std"] = stat0, stat1
    if actor:
        out["action"] = action
    if save:
        out["saved"] = scratch
    return out


# ---------------------------------------------------------------------------------------------- the reverse chain
def chain_supported(spec: RSSMSpec, actor: dict | None = None) -> bool:
    """Whether `rssm_chain_kernel` runs this unroll's backward: a layer without a norm must be ELU (its
    derivative comes from the stored output), the RSSM's and (`actor`: `actor_structure`) the Actor's."""
    rssm = spec.norm != "none" or spec.act == "elu"
    return rssm and (actor is None or actor["norm"] != "none" or actor["act"] == "elu")


def _chain(spec: RSSMSpec, weights: dict, precision: str, deter0: torch.Tensor, deter: torch.Tensor,
           saved: torch.Tensor, resets: torch.Tensor | None, noise: torch.Tensor, g_deter: torch.Tensor,
           g_stoch: torch.Tensor, g_stat0: torch.Tensor, g_stat1: torch.Tensor, *, actor: dict | None = None,
           action: torch.Tensor | None = None, g_action: torch.Tensor | None = None,
           policy_noise: torch.Tensor | None = None):
    """Pass 1 of the unroll's backward in one launch of `rssm_chain_kernel`, from the forward's `saved`
    scratch (`_unroll(save=True)` with the same weights and actor). Shapes as the op: deter0 [B, D],
    deter [B, T, D] (the forward's output), resets [B, T] (observe; None in imagine), noise [B, T,
    stoch], the outputs' cotangents g_deter [B, T, D], g_stoch [B, T, S], g_stat0 / g_stat1 (logits
    flattened [B, T, S], or mean and std [B, T, stoch]); with the Actor in the loop (`actor` from
    `_actor_args`) its action [B, T, A], that action's cotangent and the policy noise. Returns
    (g_deter0 [B, D], g_stoch0 [B, S], totals_deter [B, T, D], totals_stoch [B, T, S]): totals are the
    cotangents of each step's carry as that step's output (`core/chain_backward.py`'s pass 2)."""
    sd, dev = deter0.dtype, deter0.device
    batch, steps = noise.shape[:2]
    plan = _plan(spec, batch, steps, weights, actor, dev, sd, save=True)
    d, h, z, c, s, v3, normed, a, ha, la = plan["dims"]
    part, hap = plan["part"], plan["hap"]
    if saved.shape != (steps, batch, plan["sw"]):
        raise ValueError(f"triton RSSM backward: the saved scratch {list(saved.shape)} is not this launch's "
                         f"[{steps}, {batch}, {plan['sw']}]")
    xw = _lines(2 * h if v3 else h)
    widths = dict(BGS=_lines(s if spec.classes else 2 * z), BHY=_lines(h) if normed else 0,
                  BHP=part if normed else 0, BHR=_lines(h), BGD=_lines(d), BGG=_lines((3 if v3 else 4) * d),
                  BU=_lines(h) if v3 and normed else 0, BUR=_lines(h) if v3 else 0, BXY=xw if normed else 0,
                  BXP=2 * part if normed else 0, BXR=xw,
                  BAR=_lines(h) if actor and v3 else 0, BAY=_lines(h) if actor and v3 and normed else 0,
                  BAP=part if actor and v3 and normed else 0, BGA=_lines(a),
                  BAO=_lines(2 * a if actor and actor["dist"] != 0 else a), BP=la * (2 * hap + part))
    offsets, bw = _slots(widths)
    sizes, constexprs = _shared_args(spec, actor, plan, batch, steps, precision, sd, dev)
    dp, sp = sizes["DP"], sizes["SP"]
    gd_seq = deter0.new_empty(batch, steps + 1, dp)
    gs_seq = deter0.new_empty(batch, steps + 1, sp)
    gd_seq[:, steps, :d] = g_deter[:, -1]
    gs_seq[:, steps, :s] = g_stoch[:, -1]
    bsc = deter0.new_empty(steps, batch, bw)
    if max(bsc.numel(), gd_seq.numel(), gs_seq.numel()) >= 2 ** 31:
        raise ValueError("backend='triton': this unroll's backward buffers exceed 2^31 elements (32-bit indexing)")
    dummy = deter0.new_zeros(1)
    given = {**weights, **(actor["tensors"] if actor else {})}
    names = ("in_s_w", "in_s_nw", "in_s_nb", "in_d_w", "in_d_nw", "in_d_nb", "gru_wi", "gru_wh", "dx_w", "dh_w",
             "dyn_nw", "dyn_nb", "g_w", "head_w", "head_nw", "head_nb", "out_w", "act_w0", "act_w", "act_nw",
             "act_nb", "act_ow", "ina_w", "ina_nw", "ina_nb")
    if resets is None:
        resets = torch.zeros(batch, steps, dtype=torch.int8, device=dev)

    def given_or_dummy(t):
        return dummy if t is None else t.contiguous()

    tensors = dict(dseq=torch.cat([deter0.unsqueeze(1), deter], 1).contiguous(), gd_seq=gd_seq, gs_seq=gs_seq,
                   resets=resets.to(torch.int8).contiguous(), noise=noise.contiguous(), g_deter=g_deter.contiguous(),
                   g_stoch=g_stoch.contiguous(), g_stat0=g_stat0.contiguous(),
                   g_stat1=g_stat1.contiguous() if not spec.classes else dummy, action=given_or_dummy(action),
                   g_action=given_or_dummy(g_action), policy_noise=given_or_dummy(policy_noise), fsc=saved, bsc=bsc,
                   flags=_flags(plan, dev, steps, "rssm_chain_kernel"),
                   **{n: given.get(n, dummy) for n in names})
    # the forward's slots it reads (OFF_LG: the summed logits, also under LOGITS_KS)
    fwd = {k: v for k, v in plan["offsets"].items() if k not in ("OFF_AS", "OFF_LGP", "OFF_KD", "OFF_KH", "OFF_KA")}
    if batch > 0 and steps > 0:
        _launch(rssm_chain_kernel, plan, **tensors, **sizes, FW=plan["sw"], BW=bw, BP_SLOT=sizes["P_SLOT"], **fwd,
                **offsets, **constexprs)
    return gd_seq[:, 0, :d], gs_seq[:, 0, :s], gd_seq[:, 1:, :d], gs_seq[:, 1:, :s]
