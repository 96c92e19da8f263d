"""The action's share of the RSSM cell input in one Triton launch, for calls without gradients.

    action_share(spec, weights, action [..., A]) -> [..., H]    (None: not taken, see `fused_reason`)
    dyn_x_share(spec, weights, share [..., H]) -> [..., H]      (V3: share @ dyn_x.w[:, 2H:]^T)

`reference.action_in` over every step at once, before the unroll's kernel reads it: a = action /
max(1, |a|), y = a W^T (+ b) with W = weights["in_action.w"] [H, A]; V3 (`block_gru`) then act(norm(y))
(RMSNorm or LayerNorm, SiLU or ELU, as `reference.dense`), the dense cells (`gru`, `norm_gru`) y alone.
Torch runs that as five or six kernels (abs, clamp, div, the GEMM, the norm, the activation) that each read or write
the [..., H] output, a visible share of a short open-loop imagination (docs/kernels.md, "Launch
defaults"). Here one program takes BLOCK_R rows and every column: the
product over A as FMAs in the state dtype (A is an action's size, a handful; the reference's GEMM
runs at the process precision, so tf32 rows differ from it by tf32's rounding, float64 agrees to
1e-12), the row statistics over the whole row, one store.

For V3, where the whole unroll needs no gradient and hidden >= 256 (`dyn_x_share_pays`), `entry.py`
also multiplies the share by its columns of dyn_x.w before the launch (one GEMM over every step;
`autograd.unroll`'s a_share_pre), so the kernel's per-step dyn dot loses that quarter of its K (256
of 1,024 at V3-12m).

The share alone only where nothing needs a gradient (the share's weights and the action are then
constants of the unroll), outside autocast and torch.compile's tracing, for float32 / float64 with
the weights in the action's dtype; elsewhere `entry.py` calls `reference.action_in` as before.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from worldmodels.core import cuda_graphs
from worldmodels.ops.rssm.reference import RSSMSpec
from worldmodels.ops.triton_utils import ACT_CODES, wants_grad

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs without triton: `entry.py` never calls this module
    triton = None

if triton is not None:
    from worldmodels.ops.rssm.fused.launch import constants
    from worldmodels.ops.triton_utils import activation, rsqrt

    @triton.jit
    def _share_kernel(action, w, b, nw, nb, out, consts, R, A, H, HAS_B: tl.constexpr, NORM: tl.constexpr,
                      ACT: tl.constexpr, BLOCK_R: tl.constexpr, H_P2: tl.constexpr, ACTION_AT: tl.constexpr):
        """out[rows] = act(norm(a W^T + b)), a = action / max(1, |action|) (NORM 0: none, 1: RMS, 2:
        layer; ACT as `triton_utils.activation`, 2: identity; consts [1]: the norm's eps in the state dtype).
        ACTION_AT: `action` is its int64 slot of a CUDA graph's input table (`core/cuda_graphs.InputTable`)."""
        if ACTION_AT:
            action = tl.load(action).to(out.dtype)
        eps = tl.load(consts)
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        r_ok = rows < R
        cols = tl.arange(0, H_P2)
        c_ok = cols < H
        acc = tl.zeros([BLOCK_R, H_P2], dtype=out.dtype.element_ty)
        for k in range(A):
            a = tl.load(action + rows * A + k, mask=r_ok, other=0.0)
            a = a / tl.maximum(tl.abs(a), 1.0)
            acc += a[:, None] * tl.load(w + cols * A + k, mask=c_ok, other=0.0)[None, :]
        if HAS_B:
            acc += tl.load(b + cols, mask=c_ok, other=0.0)[None, :]
        if NORM == 1:
            inv = rsqrt(tl.sum(acc * acc, 1) / H + eps)
            acc = acc * inv[:, None] * tl.load(nw + cols, mask=c_ok, other=0.0)[None, :]
        elif NORM == 2:
            centred = tl.where(c_ok[None, :], acc - (tl.sum(acc, 1) / H)[:, None], 0.0)
            inv = rsqrt(tl.sum(centred * centred, 1) / H + eps)
            acc = (centred * inv[:, None] * tl.load(nw + cols, mask=c_ok, other=0.0)[None, :]
                   + tl.load(nb + cols, mask=c_ok, other=0.0)[None, :])
        tl.store(out + rows[:, None] * H + cols[None, :], activation(acc, ACT), mask=r_ok[:, None] & c_ok[None, :])


_NAMES = ("in_action.w", "in_action.b", "in_action.norm_w", "in_action.norm_b")


def fused_reason(spec: RSSMSpec, weights: dict, action: torch.Tensor) -> str | None:
    """Why this share runs on `reference.action_in` (None: the fused launch takes it)."""
    used = [weights[n] for n in _NAMES if n in weights]
    if wants_grad((action, *used)):
        return "a gradient is needed"
    if torch.compiler.is_compiling() or torch.is_autocast_enabled(action.device.type):
        return "under torch.compile's tracing or autocast"
    if action.dtype not in (torch.float32, torch.float64) or any(t.dtype != action.dtype for t in used):
        return "the action and the share's weights are not all float32 or all float64"
    if any(t.device != action.device for t in used):
        return "the action and the share's weights are on different devices"
    return None


def dyn_x_share(spec: RSSMSpec, weights: dict, share: torch.Tensor) -> torch.Tensor:
    """V3's action share times its columns of dyn_x.w: the action's part of dyn_x's pre-activation
    [..., H], one GEMM over every step before the launch (`autograd.unroll`'s a_share_pre), so each
    step's dyn dot in the kernel runs over [x | deter block] alone: K 768 of 1,024 at V3-12m."""
    h = spec.hidden
    return F.linear(share, weights["dyn_x.w"][:, 2 * h:])


def dyn_x_share_pays(spec: RSSMSpec) -> bool:
    """Whether V3's share is pre-multiplied by dyn_x's columns: at hidden >= 256, where the per-step K it
    saves outweighs the GEMM and its [..., H] output, which cost about the same at every hidden size."""
    return spec.hidden >= 256


def action_share(spec: RSSMSpec, weights: dict, action: torch.Tensor) -> torch.Tensor | None:
    """`reference.action_in(spec, weights, action)` in one launch, or None where `fused_reason` says no."""
    if fused_reason(spec, weights, action) is not None:
        return None
    w = weights["in_action.w"].contiguous()
    h, a = w.shape
    x = action.detach().contiguous()
    out = torch.empty(*x.shape[:-1], h, dtype=x.dtype, device=x.device)
    rows = x.numel() // max(a, 1)
    if rows == 0:
        return out
    v3 = spec.cell == "block_gru"  # the dense cells' action layer is a plain Linear
    norm = {"none": 0, "rms": 1, "layer": 2}[spec.norm] if v3 else 0
    h_p2 = triton.next_power_of_2(h)
    # one warp over 8 rows (<= 2048 accumulators, 64 per thread): latency-bound, so many small programs
    # beat fewer wide ones (the launch sweep: docs/kernels.md, "Launch defaults")
    block_r = max(1, min(8, 2048 // h_p2))
    dummy = w  # never read: the pointers of absent vectors
    b = weights.get("in_action.b")
    consts = constants((spec.norm_eps or 0.0,), x.dtype, x.device)
    x_arg, x_at = cuda_graphs.graph_input(x)
    _share_kernel[(triton.cdiv(rows, block_r),)](
        x_arg, w, dummy if b is None else b.contiguous(), weights.get("in_action.norm_w", dummy).contiguous(),
        weights.get("in_action.norm_b", dummy).contiguous(), out, consts, rows, a, h,
        HAS_B=b is not None, NORM=norm, ACT=(ACT_CODES[spec.act] if v3 else 2), BLOCK_R=block_r,
        H_P2=h_p2, ACTION_AT=x_at, num_warps=1)
    return out
