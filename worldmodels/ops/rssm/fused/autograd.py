"""The fused RSSM unroll as a pair of `torch.library` custom ops: differentiable, and one opaque
node per unroll under `torch.compile(fullgraph=True)`.

    unroll(mode, spec, weights, deter0, stoch0, noise, *, a_share=None, e_share=None, resets=None,
           actor=None, policy_params=None, policy_noise=None, a_share_pre=False) -> dict of [B, T, ...] tensors

mode: "observe" (the filtering step: a_share [B, T, H_in] the action's share of the cell input,
e_share [B, T, H] the embedding's share of the posterior, resets [B, T] bool), "open_loop" (the
prior step: a_share) or "actor" (the prior step with the project's `Actor` in the loop: actor, its
`ActorSpec`; policy_params, its weights by name, all of them (`ops/actor.weight_names`); policy_noise
[B, T, A]). a_share_pre (V3 observe / open
loop, where no gradient is needed): a_share is already the action's share of dyn_x's pre-activation,
share @ dyn_x.w[:, 2H:]^T [B, T, H] (`share.dyn_x_share`). deter0 [B, D], stoch0 [B, S],
noise [B, T, stoch] or [B, T, stoch, classes]. Returns "deter" [B, T, D], "stoch" [B, T, S],
"mean"/"std" [B, T, stoch] or "logits" [B, T, stoch, classes], and in "actor" mode "action".

- `worldmodels::triton_rssm_unroll`: one launch of the persistent kernel (`launch.forward`);
  its fake implementation gives the output shapes. Outputs that a mode has no use for (std of a
  categorical, action without an actor) are empty tensors: a custom op has a fixed output list.
- `worldmodels::triton_rssm_unroll_backward`: `core/chain_backward.py` on the reference step
  functions (`reference.obs_step_fn` / `img_step_fn`; the Actor as its pure op, `ops/actor.sample_action`
  on the given parameters), computing only the gradients autograd asks for;
  on CUDA (`compile_chain`) the per-step VJP of the reverse chain is compiled.
`weights` may hold every RSSM weight: the op is given only those its mode reads (`_OUTSIDE`).
Under torch.autocast the dots take bf16 operands (`forward_precision`).
The static description (mode, spec, weight names, the `ActorSpec`) travels as one JSON string: the
op takes specs and tensors, never modules.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Optional

import torch

from worldmodels.core.chain_backward import chain_backward
from worldmodels.core.precision import resolve_precision
from worldmodels.ops.actor import ActorSpec
from worldmodels.ops.rssm import reference
from worldmodels.ops.rssm.fused import launch
from worldmodels.ops.rssm.reference import RSSMSpec
from worldmodels.ops.triton_utils import operand_dtype, overrides, pinned_launch, wants_grad

# ---------------------------------------------------------------------------------------------- the static description
@torch.compiler.assume_constant_result  # a constant of the traced call: torch.compile cannot trace json's encoder
def _json(value) -> str:
    return json.dumps(value)


_SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(RSSMSpec))
_ACTOR_FIELDS = tuple(f.name for f in dataclasses.fields(ActorSpec))


def _describe(mode: str, spec: RSSMSpec, names, actor: ActorSpec | None = None, policy_names=(), save=False,
              a_pre=False, launch_keys: dict | None = None) -> str:
    # the specs field by field (torch 2.11's dynamo cannot pass a frozen dataclass to a constant function)
    return _json(dict(mode=mode, spec={f: getattr(spec, f) for f in _SPEC_FIELDS}, names=list(names),
                      actor=None if actor is None else {f: getattr(actor, f) for f in _ACTOR_FIELDS},
                      policy_names=list(policy_names), save=save, a_pre=a_pre,
                      launch=dict(sorted((launch_keys or {}).items()))))


def _launch(config: str):
    """The launch keys overridden where the unroll was called, pinned for the op's forward, fake and
    backward alike (`triton_utils.pinned_launch`)."""
    return pinned_launch("rssm", dict(_launch_keys(config)))


@functools.lru_cache(maxsize=256)
def _launch_keys(config: str) -> tuple:
    return tuple(json.loads(config)["launch"].items())


@functools.lru_cache(maxsize=256)
def _parse(config: str):
    c = json.loads(config)
    actor = None if c["actor"] is None else ActorSpec(**c["actor"])
    return c["mode"], RSSMSpec(**c["spec"]), c["names"], actor, c["policy_names"]


@functools.lru_cache(maxsize=256)
def _forward_options(config: str) -> tuple[bool, bool]:
    """(save, a_pre): whether the forward keeps its scratch for the fused reverse chain (when gradients
    are wanted, for the specs and Actors `launch.chain_supported` takes; `unroll` decides), and
    whether a_share is already the action's share of V3's dyn_x pre-activation (`unroll`'s a_share_pre)."""
    c = json.loads(config)
    return c["save"], c["a_pre"]


def _stats_shape(spec: RSSMSpec, batch: int, steps: int) -> tuple[list[int], list[int]]:
    if spec.classes:
        return [batch, steps, spec.stoch * spec.classes], [0]
    return [batch, steps, spec.stoch], [batch, steps, spec.stoch]


# ---------------------------------------------------------------------------------------------- forward op
def forward_precision(deter0: torch.Tensor) -> str:
    """The process's recurrent precision; under torch.autocast (a custom op's implementation still
    sees the autocast state) the dots take bf16 operands, as autocast's matmuls would."""
    if deter0.dtype == torch.float32 and torch.is_autocast_enabled(deter0.device.type):
        return "bf16"
    return resolve_precision(None, deter0.device)


def _packed(config: str, precision: str, deter0: torch.Tensor, weights, policy_params) -> tuple[dict, dict | None]:
    """The kernels' weight arguments (and the Actor's, in "actor" mode) for the forward's precision."""
    mode, spec, names, actor, policy_names = _parse(config)
    w = dict(zip(names, weights))
    operand = operand_dtype(precision, deter0.dtype)
    packed = launch.rssm_args(spec, w, "post" if mode == "observe" else "prior", deter0.dtype, operand)
    if mode != "actor":
        return packed, None
    return packed, launch.actor_args(actor, dict(zip(policy_names, policy_params)), spec, w,
                                     deter0.dtype, operand)


def _initial_shares(spec: RSSMSpec, w: dict, a_share: torch.Tensor, resets: torch.Tensor):
    """The kernel's inputs for observing from a learned initial state (the 2023 dense GRU): the kernel reads
    the carry as zeros at a reset, as for a zero initial state, so the initial state's products with the
    carry's weights join the layers' other inputs there: a_share + stoch0 W_in^T, and g_add = deter0
    W_g[:, :D]^T [B, T, 3 D] (zeros where no reset); d_init = deter0 [D] for the GRU's blend. Made
    inside the op, for the forward alone: the backward needs no cotangent of them. Its reverse chain
    (fused or torch) gives the carry's cotangents, zero at a reset, and its pass 2 steps the reference,
    which reads the plain a_share and the initial state itself ("initial.deter" / "initial.stoch", op
    weights): the initial state's gradients come from there, with either chain."""
    deter0, stoch0 = w["initial.deter"], w["initial.stoch"]
    at_reset = resets.unsqueeze(-1).to(a_share.dtype)
    a_share = a_share + at_reset * torch.nn.functional.linear(stoch0, w["in_stoch.w"])
    g_add = at_reset * torch.nn.functional.linear(deter0, w["gates.w"][:, :spec.deter])
    return a_share, dict(g_add=g_add, d_init=deter0)


@torch.library.custom_op("worldmodels::triton_rssm_unroll", mutates_args=())
def _unroll_op(config: str, deter0: torch.Tensor, stoch0: torch.Tensor, noise: torch.Tensor,
               a_share: Optional[torch.Tensor], e_share: Optional[torch.Tensor], resets: Optional[torch.Tensor],
               policy_noise: Optional[torch.Tensor], weights: list[torch.Tensor], policy_params: list[torch.Tensor]
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    mode, spec, names, actor, policy_names = _parse(config)
    save, a_pre = _forward_options(config)
    precision = forward_precision(deter0)
    packed, actor_args = _packed(config, precision, deter0, weights, policy_params)
    initial = {}
    if mode == "observe" and spec.initial == "learned":
        a_share, initial = _initial_shares(spec, dict(zip(names, weights)), a_share, resets)
    with _launch(config):
        out = launch.forward(spec, packed, deter0, stoch0, noise, precision, observe=mode == "observe",
                             a_share=a_share, e_share=e_share, resets=resets, actor=actor_args,
                             policy_noise=policy_noise, save=save, a_pre=a_pre, **initial)
    empty = deter0.new_empty(0)
    stat0, stat1 = (out["logits"].flatten(-2), empty) if spec.classes else (out["mean"], out["std"])
    return (out["deter"], out["stoch"], stat0, stat1, out.get("action", empty.clone()),
            out.get("saved", empty.clone()))


@_unroll_op.register_fake
def _(config, deter0, stoch0, noise, a_share, e_share, resets, policy_noise, weights, policy_params):
    mode, spec, names, *_ = _parse(config)
    batch, steps = noise.shape[:2]
    stat0, stat1 = _stats_shape(spec, batch, steps)
    action = policy_noise.shape[-1] if mode == "actor" else None
    saved = [0]
    if _forward_options(config)[0]:  # the forward's scratch: its width depends on the launch plan (SPLIT, the slots)
        packed, actor_args = _packed(config, forward_precision(deter0), deter0, weights, policy_params)
        with _launch(config):
            saved = [steps, batch, launch.make_plan(spec, batch, steps, packed, actor_args, deter0.device,
                                                    deter0.dtype, save=True).slot_width]
    return (deter0.new_empty(batch, steps, deter0.shape[-1]), stoch0.new_empty(batch, steps, stoch0.shape[-1]),
            deter0.new_empty(stat0), deter0.new_empty(stat1),
            deter0.new_empty(batch, steps, action) if action else deter0.new_empty(0), deter0.new_empty(saved))


# ---------------------------------------------------------------------------------------------- backward op
def compile_chain(tensor: torch.Tensor) -> bool:
    """Whether the backward's per-step VJP is compiled (`chain_backward(compiled=True)`): on CUDA,
    where it fuses the step's pointwise work into a few kernels. Tests patch it to check the
    compiled path on CPU."""
    return tensor.is_cuda


@functools.lru_cache(maxsize=64)
def _step(config: str):
    """The reference step function of a description, made once (the compiled VJP is cached per
    step function)."""
    mode, spec, _, actor, _ = _parse(config)
    if mode == "observe":
        return reference.obs_step_fn(spec)
    return reference.img_step_fn(spec, policy=actor if mode == "actor" else None)


def _autograd_inside_op():
    """Autograd on inside a custom op's implementation, which the dispatcher runs below the
    autograd keys: the backward recomputes steps and takes VJPs of them."""
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in (torch._C.DispatchKey.AutogradFunctionality, torch._C.DispatchKey.AutogradOther,
                torch._C.DispatchKey.AutogradNestedTensor, torch._C.DispatchKey.ADInplaceOrView):
        exclude = exclude.remove(key)
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)


def _time_major(t):
    return None if t is None else t.transpose(0, 1)


@torch.library.custom_op("worldmodels::triton_rssm_unroll_backward", mutates_args=())
def _backward_op(config: str, deter0: torch.Tensor, stoch0: torch.Tensor, noise: torch.Tensor,
                 a_share: Optional[torch.Tensor], e_share: Optional[torch.Tensor], resets: Optional[torch.Tensor],
                 policy_noise: Optional[torch.Tensor], weights: list[torch.Tensor], policy_params: list[torch.Tensor],
                 deter: torch.Tensor, stoch: torch.Tensor, action: torch.Tensor, saved: torch.Tensor,
                 g_deter: torch.Tensor, g_stoch: torch.Tensor, g_stat0: torch.Tensor, g_stat1: torch.Tensor,
                 g_action: torch.Tensor, wanted: list[bool], precision: str) -> list[torch.Tensor]:
    mode, spec, names, actor, policy_names = _parse(config)
    w = dict(zip(names, weights))
    tm = _time_major
    step = _step(config)
    if mode == "observe":
        params = w
        xs = (tm(a_share), tm(e_share), tm(resets).unsqueeze(-1), tm(noise))
        xs_grad, params_grad = (wanted[2], wanted[3], False, False), dict(zip(names, wanted[4:]))
    else:
        params = (w, dict(zip(policy_names, policy_params)))
        xs = (tm(noise), tm(a_share) if mode == "open_loop" else tm(policy_noise))
        xs_grad = (False, wanted[2] if mode == "open_loop" else False)
        params_grad = (dict(zip(names, wanted[4:4 + len(names)])), dict(zip(policy_names, wanted[4 + len(names):])))
    if spec.classes:
        g_ys = {"logits": tm(g_stat0).unflatten(-1, (spec.stoch, spec.classes))}
    else:
        g_ys = {"mean": tm(g_stat0), "std": tm(g_stat1)}
    if mode == "actor":
        g_ys["action"] = tm(g_action)
    chain = None
    if saved.numel():  # pass 1 in the fused reverse-chain kernel, from the forward's scratch, launched as
        # the forward was (its precision, whatever the autocast state now: the plan depends on the operands)
        packed, actor_args = _packed(config, precision, deter0, weights, policy_params)
        with _launch(config):
            g_d0, g_s0, tot_d, tot_s = launch.reverse_chain(
                spec, packed, precision, deter0, deter, saved, resets, noise, g_deter, g_stoch, g_stat0,
                g_stat1, actor=actor_args, action=action if mode == "actor" else None,
                g_action=g_action if mode == "actor" else None, policy_noise=policy_noise)
        chain = ((g_d0, g_s0), (tm(tot_d), tm(tot_s)))
    with _autograd_inside_op():
        g_carry0, g_xs, g_params = chain_backward(step, (deter0, stoch0), (tm(deter), tm(stoch)), xs, params,
                                                  (tm(g_deter), tm(g_stoch)), g_ys, xs_grad=xs_grad,
                                                  params_grad=params_grad, compiled=compile_chain(deter0), chain=chain)
    empty = deter0.new_empty(0)
    if mode == "observe":
        g_inputs = [tm(g_xs[0]), tm(g_xs[1])]
        g_weights = [g_params[n] for n in names]
        g_policy = []
    else:
        g_inputs = [tm(g_xs[1]) if mode == "open_loop" else None, None]
        g_weights = [g_params[0][n] for n in names]
        g_policy = [g_params[1][n] for n in policy_names]
    grads = [*g_carry0, *g_inputs, *g_weights, *g_policy]
    return [empty.clone() if g is None else g.contiguous() for g in grads]


@_backward_op.register_fake
def _(config, deter0, stoch0, noise, a_share, e_share, resets, policy_noise, weights, policy_params, deter, stoch,
      action, saved, g_deter, g_stoch, g_stat0, g_stat1, g_action, wanted, precision):
    def like(t, want):
        return torch.empty_like(t) if want and t is not None else deter0.new_empty(0)

    return [torch.empty_like(deter0), torch.empty_like(stoch0), like(a_share, wanted[2]), like(e_share, wanted[3]),
            *(like(t, want) for t, want in zip([*weights, *policy_params], wanted[4:]))]


# ---------------------------------------------------------------------------------------------- autograd
def _setup_context(ctx, inputs, output):
    ctx.inputs = inputs
    ctx.deter, ctx.stoch, ctx.action, ctx.saved = output[0], output[1], output[4], output[5]
    ctx.mark_non_differentiable(output[5])
    ctx.precision = forward_precision(inputs[1])  # setup_context runs inside the forward's autocast state


def _backward(ctx, g_deter, g_stoch, g_stat0, g_stat1, g_action, g_saved):
    config, deter0, stoch0, noise, a_share, e_share, resets, policy_noise, weights, policy_params = ctx.inputs
    need = ctx.needs_input_grad
    wanted = [need[1], need[2], need[4], need[5], *(p.requires_grad for p in [*weights, *policy_params])]
    grads = _backward_op(config, deter0, stoch0, noise, a_share, e_share, resets, policy_noise, weights,
                         policy_params, ctx.deter, ctx.stoch, ctx.action, ctx.saved, g_deter, g_stoch, g_stat0,
                         g_stat1, g_action, wanted, ctx.precision)
    n = len(weights)
    out_w = [g if want else None for g, want in zip(grads[4:4 + n], wanted[4:4 + n])]
    out_p = [g if want else None for g, want in zip(grads[4 + n:], wanted[4 + n:])]
    pick = [g if want else None for g, want in zip(grads[:4], wanted[:4])]
    return None, pick[0], pick[1], None, pick[2], pick[3], None, None, out_w, out_p


_unroll_op.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------------------------------------- entry point
# the layers each mode's kernel and step leave to the caller (computed outside: the action / embedding
# shares, observe's prior) or never reach (the other head): not passed, so autograd sees no path
# through the op to them (a gradient of None, as the reference gives, not a tensor of zeros)
_OUTSIDE = {"observe": {"prior", "prior_out", "in_action", "post_embed"},
            "open_loop": {"post_deter", "post_embed", "post", "post_out", "in_action"},
            "actor": {"post_deter", "post_embed", "post", "post_out"}}


def fused_chain(mode: str, spec: RSSMSpec, actor: ActorSpec | None = None) -> bool:
    """Whether the backward's reverse chain runs in the fused kernel (else the compiled torch chain): where
    the kernel takes the spec and Actor, for every observe and imagination up to deter 1024 (above, the
    fused chain's few programs per batch tile are slower than the torch chain's batched GEMMs)."""
    return launch.chain_supported(spec, actor) and (mode == "observe" or spec.deter <= 1024)


def unroll(mode: str, spec: RSSMSpec, weights: dict, deter0, stoch0, noise, *, a_share=None, e_share=None,
           resets=None, actor: ActorSpec | None = None, policy_params=None, policy_noise=None,
           a_share_pre=False) -> dict[str, torch.Tensor]:
    # a learned initial state reaches the op as with_initial's "initial.deter" / "initial.stoch" (observe's
    # resets), not as the parameter they are made from
    weights = {n: t for n, t in weights.items() if n.split(".")[0] not in _OUTSIDE[mode] and n != "initial"}
    names = list(weights)
    policy_params = policy_params or {}
    grad = wants_grad((deter0, stoch0, a_share, e_share, *weights.values(), *policy_params.values()))
    if a_share_pre and grad:  # the backward (either chain) reads a_share as the share of the cell input
        raise ValueError("a_share_pre: a pre-multiplied action share is for unrolls that need no gradient")
    save = fused_chain(mode, spec, actor) and grad
    # launch overrides are read here, in eager calls (tests, benchmarks); a compiled caller plans by the rules
    launch_keys = {} if torch.compiler.is_compiling() else overrides("rssm")
    config = _describe(mode, spec, names, actor, policy_params, save, a_share_pre, launch_keys)
    deter, stoch, stat0, stat1, action, _ = _unroll_op(
        config, deter0, stoch0, noise, a_share, e_share, resets, policy_noise, list(weights.values()),
        list(policy_params.values()))
    out = {"deter": deter, "stoch": stoch}
    if spec.classes:
        out["logits"] = stat0.unflatten(-1, (spec.stoch, spec.classes))
    else:
        out["mean"], out["std"] = stat0, stat1
    if mode == "actor":
        out["action"] = action
    return out
