"""Launching the fused RSSM kernels (`forward_kernels.rssm_kernel`, `backward_kernels.rssm_chain_kernel`): the
weights as kernel arguments, the launch configuration (`make_plan`) and the write-once scratch layout;
`forward` runs one launch over [B, T], `reverse_chain` the backward's reverse chain in one more.

Plan:
- off the chain, torch ops (cuBLAS) exactly as the reference: the action's share of the cell
  input (zeroed at resets, scaled by max(1, |a|)), the embedding's share of the posterior, and in
  `observe` the prior head over all posterior deters afterwards (`reference.prior`, batched).
- `forward_kernels.rssm_kernel`, one persistent launch, the time loop inside. Grid = (batch tiles
  of BLOCK_B rows, SPLIT programs): every layer's BLOCK_N-column tiles are dealt out round robin
  over the SPLIT programs of a batch tile, and a flag barrier over those programs (`triton_utils.sync`,
  one epoch per barrier) follows every layer that other programs read. Per step t:
  reset (observe: zero the previous deter / stoch where is_first), [imagine with an `Actor` in the
  loop: the actor MLP on [stoch, deter], its sample from the policy noise -> action[:, t], the
  RSSM's action layer], the cell (V1: dense in_stoch + action share -> norm -> act -> GRU cell; the
  2023 V3: the same input layer, then one normed layer of gates over [deter | x] and the GRU blend; V3:
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
  per batch tile runs the SPLIT ranks in turn (SPLIT=1 by default): the CPU tests check
  the split bookkeeping, the GPU tests the barrier and memory ordering.
- memory ordering: Triton pipelines K-loop loads as `cp.async.ca` (cached in the SM's
  non-coherent L1, `.cg` dropped), so everything one program reads of another's writes is
  *write-once*: deter and stoch as [B, T, DP / SP] sequences (step 0 reads the caller's initial
  state, which nothing writes) and a fresh per-step scratch slot
  per layer output / raw output / partials ([T, B, SW]); every (step, row, slot) region is whole
  128-byte lines (`triton_utils.lines`), written in one phase and first read after the barrier that ends it,
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

import dataclasses
import functools

import torch

from worldmodels.core import cuda_graphs
from worldmodels.ops.actor import ActorSpec
from worldmodels.ops.rssm.reference import RSSMSpec
from worldmodels.ops.triton_utils import ACT_CODES, kernel_precision, lines, overrides

import triton  # noqa: E402  (this module is imported only where triton is installed)

from worldmodels.ops.rssm.fused.backward_kernels import rssm_chain_kernel  # noqa: E402
from worldmodels.ops.rssm.fused.forward_kernels import rssm_kernel  # noqa: E402


def _kind(value: str, choices: tuple[str, ...]) -> int:
    return choices.index(value)


@functools.lru_cache(maxsize=64)
def constants(values: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The kernel's scalar constants as a device tensor, made once per value set: a host-to-device
    copy per call would be illegal inside a CUDA-graph capture (the kernel only reads it). A set first
    met inside a capture raises, naming it: its warm-up did not run this launch (else CUDA reports only
    an invalidated capture, at its end)."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"the fused RSSM's constants {values} ({dtype}, {device}) were first needed inside a "
                           "CUDA-graph capture, which cannot copy them to the device: the capture's warm-up "
                           "did not launch this kernel with them")
    return torch.tensor(values, dtype=dtype, device=device)


def _zeros_for(w: dict, sd: torch.dtype, n: int) -> torch.Tensor:
    """One zero vector that stands in for every absent bias / norm parameter (sliced by the kernel)."""
    return torch.zeros(n, dtype=sd, device=w["in_stoch.w"].device)


def rssm_args(spec: RSSMSpec, w: dict, head: str, sd: torch.dtype, operand: torch.dtype) -> dict:
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
    elif spec.cell == "norm_gru":  # the gates' norm in the block GRU's dyn_out arguments
        p.update(in_s_nw=vec("in.norm_w"), in_s_nb=vec("in.norm_b"), g_w=mat("gates.w"), g_b=vec("gates.b"),
                 dyn_nw=vec("gates.norm_w"), dyn_nb=vec("gates.norm_b"))
    else:
        p.update(in_s_nw=vec("in_stoch.norm_w"), in_s_nb=vec("in_stoch.norm_b"),
                 in_d_w=mat("in_deter.w"), in_d_b=vec("in_deter.b"), in_d_nw=vec("in_deter.norm_w"),
                 in_d_nb=vec("in_deter.norm_b"), dx_w=mat("dyn_x.w"), dx_b=vec("dyn_x.b"), dh_w=mat("dyn_h"),
                 dyn_nw=vec("dyn_out.norm_w"), dyn_nb=vec("dyn_out.norm_b"), g_w=mat("gates.w"), g_b=vec("gates.b"))
    norm = "post" if head == "post" else "prior"
    p.update(head_w=mat(f"{first}.w"), head_b=vec(f"{first}.b"), head_nw=vec(f"{norm}.norm_w"),
             head_nb=vec(f"{norm}.norm_b"), out_w=mat(f"{out}.w"), out_b=vec(f"{out}.b"))
    return p


def actor_args(actor: ActorSpec, params: dict, spec: RSSMSpec, w: dict, sd: torch.dtype,
               operand: torch.dtype) -> dict:
    """The kernel's actor arguments (and its sizes / kinds) from the Actor's spec and its weights
    `params` by name (`ops/actor.py`). Matrices in their native [N, K] layout; the hidden layers' weights
    and the per-layer vectors are stacked (a per-call copy of (LA - 1) HA^2 + 3 LA HA numbers: the one
    host-side repack left, see the module docstring)."""
    layers, width = actor.layers, actor.hidden
    zeros = _zeros_for(w, sd, max(width, spec.hidden))

    def mat(name):
        return params[name].to(operand).contiguous()

    def vecs(suffix):
        return torch.stack([params[f"net.{i}.{suffix}"].to(sd) if f"net.{i}.{suffix}" in params else zeros[:width]
                            for i in range(layers)]).contiguous()

    def vec(name):
        return w[name].to(sd).contiguous() if name in w else zeros

    hidden = [mat(f"net.{i}.0.weight") for i in range(1, layers)]
    norm_eps = actor.eps
    if norm_eps is None:
        norm_eps = torch.finfo(sd).eps  # nn.RMSNorm(eps=None)
    return dict(
        tensors=dict(act_w0=mat("net.0.0.weight"), act_w=torch.stack(hidden) if hidden else zeros.to(operand),
                     act_b=vecs("0.bias"), act_nw=vecs("1.weight"), act_nb=vecs("1.bias"),
                     act_ow=mat(f"net.{layers}.weight"), act_ob=params[f"net.{layers}.bias"].to(sd).contiguous(),
                     ina_w=w["in_action.w"].to(operand).contiguous(), ina_b=vec("in_action.b"),
                     ina_nw=vec("in_action.norm_w"), ina_nb=vec("in_action.norm_b")),
        width=width, layers=layers, action_dim=actor.action_dim, norm=_kind(actor.norm, ("none", "rms", "layer")),
        act=ACT_CODES[actor.act], dist=_kind(actor.dist, ("onehot", "tanh_normal", "normal", "bounded_normal")),
        eps=float(norm_eps), min_std=float(actor.min_std), max_std=float(actor.max_std), unimix=float(actor.unimix),
        stop_features=bool(actor.stop_features))


# ---------------------------------------------------------------------------------------------- launch
def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(1, n))


@dataclasses.dataclass(frozen=True)
class Dims:
    """An unroll's sizes as the kernels see them."""

    deter: int
    hidden: int
    stoch: int  # latents (Gaussian: the size; categorical: how many)
    classes: int  # 1 for Gaussian latents
    stoch_size: int  # stoch * classes: the flattened stoch state
    v3: bool  # the block GRU cell
    normed: bool  # the RSSM's layers carry a norm
    action: int  # the Actor's action size (0: no Actor in the loop)
    actor_width: int
    actor_layers: int


@dataclasses.dataclass(frozen=True)
class Plan:
    """One unroll's launch: tile shapes and work split, the rules' choices, and the write-once
    scratch layout (`slots`: each slot's offset in a [T, B, slot_width] scratch row, by kernel argument)."""

    dims: Dims
    block_b: int  # rows per batch tile
    block_n: int  # columns per matmul tile
    block_k: int  # depth of each dot
    num_warps: int
    tiles: int  # batch tiles
    split: int  # column ranks per batch tile
    nprog: int  # programs per batch tile (split, or 1 where the ranks run in turn: the interpreter)
    fold: bool  # FOLD_NORMS in effect: no norm phases in this forward
    dyn_k_parts: int  # K parts of V3's dyn_x dot
    logits_k_parts: int  # K parts of the categorical logits dot
    k_split_rows: bool  # KSPLIT_ROWS in effect
    count_barrier: bool  # one counter per batch tile instead of one flag per program
    blocks_k_major: bool  # V3's block-diagonal weights read transposed
    preload_h: bool  # V3's gates phase loads its biases and previous deter before its dots
    deter_tile: int  # columns per tile of the phases over deter
    partials_width: int  # one norm's partial sums per row (2 per rank, in whole lines)
    actor_width_padded: int  # one Actor layer's output per row (whole lines)
    slots: dict
    slot_width: int
    barrier: bool = True  # timing only: False skips the cross-program wait (wrong results)
    profile: list | None = None  # timing only: a list the launch appends (kernel, plan, flags) to


def _base_tiles(device: torch.device, dtype: torch.dtype, batch: int, weight_bytes: int) -> dict:
    """Tile shapes before the rules: 16 x 32 x 32 with 4 warps; 64-row tiles with 8 warps where many rows
    re-read over 2 MB of weights per step from L2; 16 x 16 x 16 for fp64 FMA dots and the interpreter."""
    if device.type != "cuda" or dtype == torch.float64:
        return dict(BLOCK_B=16, BLOCK_N=16, BLOCK_K=16, num_warps=4)
    if batch >= 512 and weight_bytes >= 2 << 20:
        return dict(BLOCK_B=64, BLOCK_N=32, BLOCK_K=32, num_warps=8)
    return dict(BLOCK_B=16, BLOCK_N=32, BLOCK_K=32, num_warps=4)


def _open_loop_rows(batch: int, hidden: int, sms: int) -> int:
    """Rows per batch tile of a wide no-grad open-loop imagination: the widest of 64 / 32 whose ranks are at
    most twice the hidden layers' column tiles (fewer programs re-read the weights; more ranks would idle)."""
    for rows in (64, 32):
        if sms // triton.cdiv(batch, rows) <= 2 * triton.cdiv(hidden, 32):
            return rows
    return 16


def _fold_pays(block_b: int, split: int) -> bool:
    """FOLD_NORMS: a folded norm is recomputed by every consumer tile, which is cheaper than a norm phase
    and its barrier only with few rows and few ranks."""
    return block_b <= 16 and split <= 4


def _dyn_k_split(v3: bool, normed: bool, fold: bool, split: int, hidden: int, block_n: int) -> int:
    """K parts of V3's dyn_x dot: 2 where its column tiles fill at most half the ranks, which would idle
    otherwise (needs the dyn_out norm phase to add the parts)."""
    return 2 if v3 and normed and not fold and split >= 2 * triton.cdiv(hidden, block_n) else 1


def _count_pays(split: int) -> bool:
    """COUNT_BARRIER: above 8 ranks a poll of one counter beats SPLIT^2 acquire atomics on the flags."""
    return split > 8


def _k_parts(block_n: int, block_k: int, k: int, n: int, split: int) -> int:
    """K parts of the categorical logits dot: the most (up to 4) whose rank groups each still hold all its
    column tiles, each part at least one K tile (idle ranks take a share of K instead)."""
    parts = 1
    tiles = triton.cdiv(n, block_n)
    while parts < 4 and 2 * parts * tiles <= split and 2 * parts <= triton.cdiv(k, block_k):
        parts *= 2
    return parts


def _k_rows(wanted: bool, block_b: int, split: int, fold: bool, save: bool) -> bool:
    """KSPLIT_ROWS in effect: the normed long-K layers split over K (each rank reads 1 / SPLIT of the rows'
    activations), their norms over rows; needs whole rows per rank and nothing saved or folded."""
    return wanted and split > 1 and block_b % split == 0 and not fold and not save


def _k_rows_tiles(width: int) -> tuple[int, int]:
    """(columns per tile of KSPLIT_ROWS' K parts, of its norm phase) for layers `width` wide: the whole
    layer where it fits (the MMA work one program issues per K slice grows with the tile)."""
    return min(_pow2(width), 256), min(_pow2(width), 512)


def _wide_tiles_pay(block_b: int) -> bool:
    """KSPLIT_ROWS, BLOCKS_KMAJOR and PRELOAD_H: at 64-row tiles, where Triton emits wgmma (wider dots,
    K-contiguous operand copies, load latency hidden under the dots); within noise at 16 rows."""
    return block_b >= 64


def _narrow_tiles(widest: int, tiles: int, sms: int) -> bool:
    """16-column tiles where the widest layer's 16-column tiles still get an SM each: twice the ranks."""
    return widest <= 1024 and 2 * triton.cdiv(widest, 32) <= sms // tiles


def _deter_tile(deter: int, split: int, block_n: int, stoch: int = 0) -> int:
    """Columns per tile of the phases over deter: a rank's share, from BLOCK_N up to 64, and wider (up to 64)
    while the carry's deter tiles and stoch tiles outnumber the ranks (one tile per rank)."""
    tile = max(block_n, min(_pow2(triton.cdiv(deter, split)), 64))
    stoch_tiles = triton.cdiv(stoch, block_n)
    while tile < 64 and triton.cdiv(deter, tile) + stoch_tiles > split:
        tile *= 2
    return tile


def _gpu_sms(device: torch.device) -> int | None:
    """The SMs of the GPU a plan is for; None under the interpreter."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else None


def _split(split: int | None, tiles: int, col_tiles: int, sms: int | None) -> tuple[int, int]:
    """(SPLIT ranks, programs) per batch tile. On the GPU every program of a split grid must be resident
    for the barrier (at most one per SM); the interpreter runs a tile's ranks in turn in one program."""
    if sms is None:
        return split or 1, 1
    if split is None:
        split = max(1, min(col_tiles, sms // tiles))
    if split > 1 and tiles * split > sms:
        raise ValueError(f"backend='triton': a column-split launch of {tiles} batch tiles x SPLIT={split} = "
                         f"{tiles * split} programs exceeds the {sms} SMs (all must be resident for the barrier); "
                         f"use a larger BLOCK_B or a smaller SPLIT")
    return split, split


def _slots(widths: dict) -> tuple[dict, int]:
    """The write-once slots' offsets (`OFF_<name>`, in order) and the row width they add up to."""
    offsets, width = {}, 0
    for name, w in widths.items():
        offsets[f"OFF_{name}"] = width
        width += w
    return offsets, width


def make_plan(spec: RSSMSpec, batch: int, steps: int, weights: dict, actor: dict | None, device: torch.device,
              dtype: torch.dtype, save: bool = False, open_loop: bool = False) -> Plan:
    """The launch and the write-once scratch layout of one unroll (the custom op's fake implementation sizes
    the saved scratch from it too). `save`: slots for what the backward reads. `open_loop`: an imagination
    with given actions. Launch keys overridden by `triton_utils.launch_overrides("rssm", ...)` win."""
    d, h, z, c = spec.deter, spec.hidden, spec.stoch, spec.classes or 1
    s = z * c
    v3 = spec.cell == "block_gru"
    normed = spec.norm != "none"
    a = actor["action_dim"] if actor else 0
    ha = actor["width"] if actor else 0
    la = actor["layers"] if actor else 0
    dims = Dims(d, h, z, c, s, v3, normed, a, ha, la)
    asked = overrides("rssm")
    weight_bytes = sum(w.numel() * w.element_size() for w in weights.values())
    weight_bytes += sum(t.numel() * t.element_size() for t in (actor["tensors"] if actor else {}).values())
    cfg = {**_base_tiles(device, dtype, batch, weight_bytes), **asked}
    sms = _gpu_sms(device)
    if (sms and open_loop and not save and batch >= 512 and cfg["BLOCK_B"] == 16 and dtype != torch.float64
            and "BLOCK_B" not in asked):
        rows = _open_loop_rows(batch, h, sms)
        if rows > 16:
            cfg.update(BLOCK_B=rows, num_warps=8)
    block_b = cfg["BLOCK_B"]
    tiles = triton.cdiv(batch, block_b)
    widest = max(2 * h if v3 else h, d, s, ha)
    if sms and cfg["BLOCK_N"] == 32 and "BLOCK_N" not in asked and _narrow_tiles(widest, tiles, sms):
        cfg["BLOCK_N"] = 16
    block_n, block_k = cfg["BLOCK_N"], cfg["BLOCK_K"]
    split, nprog = _split(cfg.get("SPLIT"), tiles, triton.cdiv(widest, block_n), sms)
    if sms:  # the rules decide on the GPU; the interpreter runs the optional paths only where asked
        wide = _wide_tiles_pay(block_b)
        defaults = dict(FOLD_NORMS=_fold_pays(block_b, split), COUNT_BARRIER=_count_pays(split), KSPLIT_ROWS=wide,
                        BLOCKS_KMAJOR=wide, PRELOAD_H=wide)
        cfg = {**defaults, **cfg}
    fold = bool(cfg.get("FOLD_NORMS", False)) and not save  # the forward's FOLD
    ksr = _k_rows(bool(cfg.get("KSPLIT_ROWS", False)), block_b, split, fold, save)
    dyn_ks = _dyn_k_split(v3, normed, fold, split, h, block_n)
    # not when the head's norm is folded into the logits' load
    logits_ks = _k_parts(block_n, block_k, h, s, split) if spec.classes and not fold else 1
    # write-once per-step scratch slots (see forward_kernels.py), each a whole number of 128-byte lines;
    # the kernels take each slot's offset as OFF_<name>:
    #   XR / X / XP    the cell's input layer: raw output, normalised output, norm partials
    #   UR / U         V3's block GRU hidden layer: raw output (per K part), normalised output
    #   GT / SG        saved for the backward: the GRU gates (V1, V3); the Gaussian head's std derivative
    #   HR / HD / HP   the prior / posterior head's hidden layer: raw output, output, norm partials
    #   LG / LGP       the categorical logits and their K-part partial sums
    #   P              the Actor's hidden layers, one slot each (raw, output, partials)
    #   AO / AS / ASG  the Actor's output layer, its scaled action sample, its saved std derivative
    #   AHR / AH / AHP the RSSM's action layer on the Actor's action: raw output, output, norm partials
    #   KD / KH / KA   per-rank K-part products of the normed layers split over K rows (KSPLIT_ROWS)
    #   GR / GP        the 2023 dense GRU's gates: raw output [3 D], norm partials (what its backward reads too)
    part = lines(2 * split)
    ng = spec.cell == "norm_gru"
    xw = lines(2 * h if v3 else h)
    hap = lines(ha)
    widths = dict(XR=xw if normed else 0, X=xw, XP=2 * part if normed else 0,
                  UR=lines(dyn_ks * h) if v3 and normed else 0, U=lines(h) if v3 else 0,
                  HR=lines(h) if normed else 0, HD=lines(h), HP=part if normed else 0,
                  LG=lines(s) if spec.classes else 0, LGP=lines(logits_ks * s) if logits_ks > 1 else 0,
                  GT=lines((3 if v3 else 4) * d) if save and not ng else 0,
                  SG=lines(z) if save and not spec.classes else 0,
                  P=la * (2 * hap + part), AO=lines(a) if actor and actor["dist"] == 0 else 0, AS=lines(a),
                  AHR=lines(h) if actor and v3 and normed else 0, AH=lines(h) if actor else 0,
                  AHP=part if actor and v3 and normed else 0,
                  ASG=lines(2 * a) if save and actor and actor["dist"] != 0 else 0,
                  KD=lines(split * h) if ksr and v3 and normed else 0, KH=lines(split * h) if ksr and normed else 0,
                  KA=lines(split * ha) if ksr and actor and actor["norm"] else 0,
                  GR=lines(3 * d) if ng else 0, GP=part if ng and normed else 0)
    offsets, sw = _slots(widths)
    return Plan(dims=dims, block_b=block_b, block_n=block_n, block_k=block_k, num_warps=cfg["num_warps"], tiles=tiles,
                split=split, nprog=nprog, fold=fold, dyn_k_parts=dyn_ks, logits_k_parts=logits_ks, k_split_rows=ksr,
                count_barrier=bool(cfg.get("COUNT_BARRIER", False)),
                blocks_k_major=v3 and bool(cfg.get("BLOCKS_KMAJOR", False)),
                preload_h=v3 and bool(cfg.get("PRELOAD_H", False)), deter_tile=_deter_tile(d, split, block_n, s),
                partials_width=part, actor_width_padded=hap, slots=offsets, slot_width=sw,
                barrier=bool(cfg.get("BARRIER", True)), profile=cfg.get("PROFILE"))


def _shared_args(spec: RSSMSpec, actor: dict | None, plan: Plan, batch: int, steps: int, precision: str,
                 dtype: torch.dtype, device: torch.device) -> tuple[dict, dict]:
    """(sizes, constexprs) that the forward and the reverse-chain kernels take alike, from one plan: the
    backward must run the forward's work split and tile shapes."""
    m = plan.dims
    split, nprog = plan.split, plan.nprog
    g = spec.blocks
    blk_c = min(_pow2(m.hidden // g), 64)
    c_p2 = _pow2(m.classes)
    consts = constants((spec.min_std, spec.unimix, spec.norm_eps, *(
        (actor["eps"], actor["min_std"], actor["unimix"], actor["max_std"]) if actor else (0.0, 0.0, 0.0, 0.0))),
        dtype, device)
    sizes = dict(B=batch, T=steps, D=m.deter, S=m.stoch_size, Z=m.stoch, C=m.classes, H=m.hidden, G=g, A=m.action,
                 HA=m.actor_width, LA=m.actor_layers, DP=lines(m.deter), SP=lines(m.stoch_size),
                 P_SLOT=2 * plan.actor_width_padded + plan.partials_width, HAP=plan.actor_width_padded, consts=consts)
    constexprs = dict(
        CELL_V3=m.v3, CELL_NG=spec.cell == "norm_gru", POLICY=actor is not None, CAT=bool(spec.classes),
        NORM=_kind(spec.norm, ("none", "rms", "layer")), ACT=ACT_CODES[spec.act],
        UNIMIX=spec.unimix > 0, A_NORM=actor["norm"] if actor else 0, A_ACT=actor["act"] if actor else 0,
        A_DIST=actor["dist"] if actor else 0, A_UNIMIX=bool(actor and actor["unimix"] > 0),
        A_P2=_pow2(m.action), SPLIT=split, SPLIT_P2=_pow2(split), NPROG=nprog, NPROG_P2=_pow2(nprog),
        BLOCK_B=plan.block_b, BLOCK_N=plan.block_n, BLOCK_K=plan.block_k, BLK_C=blk_c,
        # whole groups / latents per tile, at most a fair share of the SPLIT ranks'
        BLK_G=max(1, min(_pow2(g), 64 // blk_c, _pow2(triton.cdiv(g, split)))),
        CAT_G=max(1, min(_pow2(m.stoch), 128 // c_p2, _pow2(triton.cdiv(m.stoch, split)))), C_P2=c_p2,
        BLOCK_ND=plan.deter_tile,
        PRECISION=kernel_precision(precision, dtype))
    return sizes, constexprs


def _flags(plan: Plan, device: torch.device, steps: int, kernel: str) -> torch.Tensor:
    """The barrier's epochs, one int32 per program; uint32 with one counter per batch tile (COUNT_BARRIER,
    `_count_barrier`). Timing only: int16 without the barrier (the kernels skip the wait), and with PROFILE
    int64 (uint64 with the counter) with room for two %globaltimer stamps per program and barrier
    (`triton_utils.sync`), (kernel, plan, flags) appended to the PROFILE list."""
    programs = plan.tiles * plan.nprog
    if plan.profile is not None:
        flags = torch.zeros(programs * (1 + 2 * (PROFILE_BARRIERS_PER_STEP * steps + 1)),
                            dtype=torch.uint64 if plan.count_barrier else torch.int64, device=device)
        plan.profile.append((kernel, plan, flags))
        return flags
    if not plan.barrier:
        return torch.zeros(programs, dtype=torch.int16, device=device)
    return torch.zeros(programs, dtype=torch.uint32 if plan.count_barrier else torch.int32, device=device)


# room in a profiled launch's record (every kernel here has fewer barriers per step)
PROFILE_BARRIERS_PER_STEP = 64


def _launch(kernel, plan: Plan, **args) -> None:
    kernel[(plan.tiles, plan.nprog)](**args, num_warps=plan.num_warps)


def forward(spec: RSSMSpec, weights: dict, deter0: torch.Tensor, stoch0: torch.Tensor, noise: torch.Tensor,
            precision: str, *, observe: bool, a_share=None, e_share=None, resets=None, actor: dict | None = None,
            policy_noise=None, save: bool = False, a_pre: bool = False, g_add=None,
            d_init=None) -> dict[str, torch.Tensor]:
    """Launch the kernel over noise's [B, T] and return the reference's output dict (with `save`,
    also "saved": the scratch [T, B, SW] the backward kernel reads). `a_pre` (V3 without the Actor, nothing
    saved): a_share is the action's share already multiplied by its columns of dyn_x.w, [B, T, H].
    `g_add` [B, T, 3 D], `d_init` [D] (the 2023 dense GRU observing from a learned initial state): the
    initial deter's share of the gates' pre-activation at resets (zeros elsewhere), and that deter;
    a_share then holds the initial stoch's share of the cell input at resets."""
    if (g_add is None) != (d_init is None) or (g_add is not None and (spec.cell != "norm_gru" or not observe)):
        raise ValueError("g_add and d_init: both or neither, for the 2023 dense GRU's observe")
    if a_pre and (spec.cell != "block_gru" or actor is not None or save):
        raise ValueError("a_pre: a pre-multiplied action share is V3's, without the Actor, for a forward that "
                         "saves nothing")
    sd, dev = deter0.dtype, deter0.device
    batch, steps = noise.shape[:2]
    plan = make_plan(spec, batch, steps, weights, actor, dev, sd, save, open_loop=not observe and actor is None)
    m = plan.dims
    d, h, z, s, a = m.deter, m.hidden, m.stoch, m.stoch_size, m.action
    offsets, sw = plan.slots, plan.slot_width
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
    kmajor = plan.blocks_k_major
    if kmajor:  # per block: gates.w [G, H/G, 3 D/G] -> [G, 3 D/G, H/G], dyn_h [G, D/G, H/G] -> [G, H/G, D/G]
        given["g_w"] = given["g_w"].transpose(1, 2).contiguous()
        given["dh_w"] = given["dh_w"].transpose(1, 2).contiguous()
    tensors.update({n: given.get(n, dummy) for n in names})
    tensors["policy_noise"], policy_noise_at = (dummy, False) if policy_noise is None else \
        cuda_graphs.graph_input(policy_noise.contiguous())
    tensors["action"] = action
    tensors.update({n: given.get(n, dummy) for n in ("ina_w", "ina_b", "ina_nw", "ina_nb")})
    tensors["g_add"] = dummy if g_add is None else g_add.contiguous()
    tensors["d_init"] = dummy if d_init is None else d_init.contiguous()
    if batch > 0 and steps > 0:
        _launch(rssm_kernel, plan, **tensors, **sizes, SW=sw, TSTRIDE=batch * sw, **offsets, **constexprs,
                OBSERVE=observe, SAVE=save, FOLD=int(plan.fold), DYN_KS=plan.dyn_k_parts,
                LOGITS_KS=plan.logits_k_parts, KSR=int(plan.k_split_rows),
                **dict(zip(("BLOCK_NK", "BLOCK_NR"), _k_rows_tiles(max(h, m.actor_width)))),
                BLOCKS_KMAJOR=kmajor, PRELOAD_H=plan.preload_h, A_PRE=bool(a_pre),
                NOISE_AT=noise_at, POLICY_NOISE_AT=policy_noise_at, DETER0_AT=deter0_at, STOCH0_AT=stoch0_at,
                LEARNED=g_add is not None)
    out = {"deter": deter_out, "stoch": stoch_out}
    if spec.classes:
        out["logits"] = stat0.unflatten(-1, (z, m.classes))
    else:
        out["mean"], out["std"] = stat0, stat1
    if actor:
        out["action"] = action
    if save:
        out["saved"] = scratch
    return out


# ---------------------------------------------------------------------------------------------- the reverse chain
def chain_supported(spec: RSSMSpec, actor: ActorSpec | None = None) -> bool:
    """Whether `rssm_chain_kernel` runs this unroll's backward: every cell (the dense GRU, the 2023 dense
    GRU, from zeros or its learned initial state, and the block GRU), every Actor (each distribution, on
    stop-gradient features too), and a layer without a norm must be ELU (its derivative comes from the
    stored output), the RSSM's and, unless its features are stopped, the Actor's."""
    rssm = spec.norm != "none" or spec.act == "elu"
    return rssm and (actor is None or actor.stop_features or actor.norm != "none" or actor.act == "elu")


def reverse_chain(spec: RSSMSpec, weights: dict, precision: str, deter0: torch.Tensor, deter: torch.Tensor,
                  saved: torch.Tensor, resets: torch.Tensor | None, noise: torch.Tensor, g_deter: torch.Tensor,
                  g_stoch: torch.Tensor, g_stat0: torch.Tensor, g_stat1: torch.Tensor, *, actor: dict | None = None,
                  action: torch.Tensor | None = None, g_action: torch.Tensor | None = None,
                  policy_noise: torch.Tensor | None = None):
    """Pass 1 of the unroll's backward in one launch of `rssm_chain_kernel`, from the forward's `saved`
    scratch (`forward(save=True)` with the same weights and actor). Shapes as the op: deter0 [B, D],
    deter [B, T, D] (the forward's output), resets [B, T] (observe; None in imagine), noise [B, T,
    stoch], the outputs' cotangents g_deter [B, T, D], g_stoch [B, T, S], g_stat0 / g_stat1 (logits
    flattened [B, T, S], or mean and std [B, T, stoch]); with the Actor in the loop (`actor` from
    `actor_args`) its action [B, T, A], that action's cotangent and the policy noise. An Actor on
    stop-gradient features sends nothing back to the carry: the chain runs as without one (POLICY off;
    the forward's scratch layout, the Actor's slots included, stays). Returns
    (g_deter0 [B, D], g_stoch0 [B, S], totals_deter [B, T, D], totals_stoch [B, T, S]): totals are the
    cotangents of each step's carry as that step's output (`core/chain_backward.py`'s pass 2)."""
    sd, dev = deter0.dtype, deter0.device
    batch, steps = noise.shape[:2]
    plan = make_plan(spec, batch, steps, weights, actor, dev, sd, save=True)
    reversed_actor = actor if actor and not actor["stop_features"] else None  # what the chain reverses
    m = plan.dims
    d, h, z, s, v3, normed, a, la = m.deter, m.hidden, m.stoch, m.stoch_size, m.v3, m.normed, m.action, m.actor_layers
    part, hap = plan.partials_width, plan.actor_width_padded
    if saved.shape != (steps, batch, plan.slot_width):
        raise ValueError(f"triton RSSM backward: the saved scratch {list(saved.shape)} is not this launch's "
                         f"[{steps}, {batch}, {plan.slot_width}]")
    ng = spec.cell == "norm_gru"
    xw = lines(2 * h if v3 else h)
    widths = dict(BGS=lines(s if spec.classes else 2 * z), BHY=lines(h) if normed else 0,
                  BHP=part if normed else 0, BHR=lines(h), BGD=lines(d), BGG=lines((3 if v3 or ng else 4) * d),
                  BGY=lines(3 * d) if ng and normed else 0, BGP=part if ng and normed else 0,
                  BU=lines(h) if v3 and normed else 0, BUR=lines(h) if v3 else 0, BXY=xw if normed else 0,
                  BXP=2 * part if normed else 0, BXR=xw,
                  BAR=lines(h) if reversed_actor and v3 else 0,
                  BAY=lines(h) if reversed_actor and v3 and normed else 0,
                  BAP=part if reversed_actor and v3 and normed else 0, BGA=lines(a) if reversed_actor else 0,
                  BAO=lines(2 * a if actor["dist"] != 0 else a) if reversed_actor else 0,
                  BP=la * (2 * hap + part) if reversed_actor else 0)
    offsets, bw = _slots(widths)
    sizes, constexprs = _shared_args(spec, actor, plan, batch, steps, precision, sd, dev)
    constexprs["POLICY"] = reversed_actor is not None
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
    fwd = {k: v for k, v in plan.slots.items() if k not in ("OFF_AS", "OFF_LGP", "OFF_KD", "OFF_KH", "OFF_KA")}
    if batch > 0 and steps > 0:
        _launch(rssm_chain_kernel, plan, **tensors, **sizes, FW=plan.slot_width, BW=bw, BP_SLOT=sizes["P_SLOT"], **fwd,
                **offsets, **constexprs)
    return gd_seq[:, 0, :d], gs_seq[:, 0, :s], gd_seq[:, 1:, :d], gs_seq[:, 1:, :s]
