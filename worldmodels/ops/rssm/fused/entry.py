"""`triton` backend of the RSSM unrolls: one persistent kernel launch per unroll, the time loop inside.

    observe(spec, weights, deter, stoch, action, embed, is_first, post_noise, prior_noise, *, cache=None)
        -> (post, prior): dicts of [B, T, ...] tensors
    imagine(spec, weights, deter, stoch, prior_noise, *, actions=None, policy=None, policy_params=None,
            policy_noise=None, cache=None) -> dict of [N, H, ...] tensors

Same signatures, math, output keys, shapes and dtypes as `ops/rssm/reference.py` (which documents the
shapes): deter [B, D], stoch [B, S] (S = stoch or stoch * classes); action [B, T, A]; embed
[B, T, E]; is_first [B, T] bool; noise [B, T, stoch] (Gaussian eps) or [B, T, stoch, classes]
(Gumbel); outputs "deter" [B, T, D], "stoch" [B, T, S], "mean"/"std" [B, T, stoch] or "logits"
[B, T, stoch, classes], and `imagine`'s "action" [N, H, A]. `cache` (an `UnrollCache`): on
CUDA, a call that needs gradients runs as a replay of CUDA graphs captured once per signature
(`core/cuda_graphs.py`, as the cudnn backend), forward and backward.

Differentiable: the unroll is a pair of `torch.library` custom ops (`autograd.py`), so autograd
and `torch.compile(fullgraph=True)` see one opaque node per unroll. The backward
(`core/chain_backward.py`) walks the chain in reverse time over the carries the kernel wrote (on
CUDA each step's VJP compiled by inductor), then computes the weight and input gradients in one
pass batched over B*T; no double backward.
Dtypes float32 and float64 (state and accumulators in the input dtype).
Matmul precision: the process setting (`worldmodels.core.resolve_precision`, as the rnn op gets
it): "ieee" / "tf32" / "tf32x3" go to `tl.dot(input_precision=...)`, "bf16" casts the dot operands
(the weights per call, on the host) and accumulates in fp32; under `torch.autocast` the state
stays fp32 (half-precision inputs are cast up) and the dots run in the autocast dtype's mode
("bf16"; fp16 autocast too, as bf16 operands); float64 runs in float64 (under the
interpreter `tl.dot`, on the GPU FMA reductions, as the rnn kernels). The backward runs torch
ops at the same process precision.

The project's `Actor` is recognised here (`_actor_in_kernel`) and handed on as its `ActorSpec` and
weights (`ops/actor.py`): below this module the op takes specs and tensors, never modules.
Policies other than the project's `Actor` (or an Actor without pre-drawn noise) run on
`reference.imagine`, after a one-time warning saying why and naming `cudnn` as the faster choice
(`auto` picks triton only for the Actor). On CUDA in "ieee" precision the dots run without tensor
cores, slower than `cudnn`: an explicit triton call there warns once (`auto` never picks it).

Limits: fp32 / fp64; classes <= 256, one-hot actions <= 1024; the weights read every step <= 24
MiB (L2-resident); every buffer < 2^31 elements (32-bit indexing). Not vmappable (the registry
falls back to `auto`'s choice under vmap, with one warning).
On CPU the kernels run only under TRITON_INTERPRET=1 (set before this module is imported).
Kernel plan and launch configuration: `launch.py`; kernels: `forward_kernels.py`, `backward_kernels.py`.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch import nn

from worldmodels.core import cuda_graphs
from worldmodels.core.precision import resolve_precision
from worldmodels.core.triton_support import triton_unavailable
from worldmodels.models.actor import Actor, is_stopped_actor
from worldmodels.ops.actor import ActorSpec, weight_names
from worldmodels.ops.rssm import reference
from worldmodels.ops.rssm.reference import RSSMSpec
from worldmodels.ops.triton_utils import ACT_CODES, L2_BUDGET_BYTES, wants_grad, warn_if_slower_than_cudnn, warn_once

try:
    import triton
except ImportError:  # CPU installs without triton: `unsupported_reason` / the registry say no
    triton = None

if triton is not None:
    from worldmodels.ops.rssm.fused import autograd, share

_MAX_CLASSES = 256  # one register tile holds a categorical's classes
_MAX_ACTIONS = 1024  # likewise the actions of a one-hot actor


def _streamed_bytes(spec: RSSMSpec, dtype: torch.dtype) -> int:
    """Bytes of the weights the kernel reads every step (actor not counted)."""
    d, h = spec.deter, spec.hidden
    s = spec.stoch * spec.classes if spec.classes else spec.stoch
    stats = s if spec.classes else 2 * spec.stoch
    if spec.cell == "gru":
        cell = s * h + h * 3 * d + d * 3 * d
    elif spec.cell == "norm_gru":
        cell = s * h + (d + h) * 3 * d
    else:
        cell = d * h + s * h + 3 * h * h + d * h + h * 3 * d
    return (cell + d * h + h * stats) * (8 if dtype == torch.float64 else 4)


FUSED_ACTOR_DISTS = ("onehot", "tanh_normal", "normal", "bounded_normal")  # the Actors the imagination kernel samples
UNTIMED_ACTOR_DISTS = ("bounded_normal",)  # sampled and reversed by the kernels; timed only on the 2023 GRU (fits)
OPEN_LOOP_MAX_ROWS = 2048
"""No-grad open loop above this many rows stays on cudnn. In PlaNet's planner (deter 200, H12, ten CEM
iterations, tf32) the fused kernel is ahead at one env's 1,000 candidates and behind at 16 envs'
16,000; a line through the two crosses near 4,000 rows, so the fused kernel keeps the rows where it is
clearly ahead (the timings: docs/kernels.md, "RSSM unroll")."""


@functools.lru_cache(maxsize=256)  # asked on every call
def unsupported_reason(spec: RSSMSpec, dtype: torch.dtype = torch.float32) -> str | None:
    """Why the triton RSSM ops cannot run this spec / dtype, or None when they can."""
    if spec.cell not in ("gru", "norm_gru", "block_gru"):
        return f"cell={spec.cell!r} is not 'gru', 'norm_gru' or 'block_gru'"
    if spec.initial != "zeros" and spec.cell != "norm_gru":
        return f"initial={spec.initial!r}: the fused kernels start episodes from zeros, except for cell='norm_gru'"
    if spec.norm not in ("none", "rms", "layer") or spec.act not in ACT_CODES:
        return f"norm={spec.norm!r} / act={spec.act!r} are not supported"
    if dtype not in (torch.float32, torch.float64):
        return f"dtype {dtype} is not supported (float32, float64)"
    if spec.classes and spec.classes > _MAX_CLASSES:
        return f"classes={spec.classes} exceeds {_MAX_CLASSES} (one register tile per categorical)"
    if spec.dyn_hidden not in (0, spec.hidden) or spec.dyn_norm != "block" or spec.prior_layers != 1:
        return (f"the block GRU's hidden layer must be `hidden` wide with per-block norms and the prior head one "
                f"layer deep (got dyn_hidden={spec.dyn_hidden}, dyn_norm={spec.dyn_norm!r}, "
                f"prior_layers={spec.prior_layers}: DreamerV3's reference layout runs on cudnn / scan / loop)")
    if spec.cell == "block_gru" and (spec.deter % spec.blocks or spec.hidden % spec.blocks):
        return f"blocks={spec.blocks} must divide deter={spec.deter} and hidden={spec.hidden}"
    streamed = _streamed_bytes(spec, dtype)
    if streamed > L2_BUDGET_BYTES:
        return (f"the weights read every step ({streamed >> 20} MiB) exceed the {L2_BUDGET_BYTES >> 20} MiB the "
                f"persistent kernel keeps in L2 across steps")
    return None


def supports(spec: RSSMSpec, dtype: torch.dtype = torch.float32) -> bool:
    """For the registry: `auto` falls back where this is False; explicit `triton` raises the reason."""
    return unsupported_reason(spec, dtype) is None


def fits(problem: dict) -> bool:
    """Whether `auto` picks the fused kernel for an RSSM unroll: tensor-core dots (not ieee's FMAs);
    without gradients in tf32 / bf16, and in tf32x3 up to deter 1024; with gradients up to deter 1024,
    where its reverse chain beats cudnn's graphed backward, and above it for observe in tf32 / bf16;
    imagination with gradients above deter 1024 stays on cudnn, whose graphed backward is faster there
    (docs/kernels.md, "the reverse chain"). Not for a policy other than the Actor, or an
    Actor whose distribution the kernel does not sample (either would run on the loop reference) or has not
    been timed with (`UNTIMED_ACTOR_DISTS`, or an Actor on stop-gradient features: both run, forward and
    reverse chain, untimed against cudnn), nor for the dense cell's imagination with the Actor, whose
    two dense layers per step keep its few programs busy longer than cudnn's graphed launches take,
    nor for open loop without gradients above `OPEN_LOOP_MAX_ROWS` rows. The 2023 dense GRU
    (`norm_gru`) has been timed only as the 2023 preset's whole update, both unrolls with gradients
    (observe, and imagination with its bounded normal Actor on stop-gradient features): fused, it is
    faster than cudnn in tf32 and slower in tf32x3, where its dots run three TF32 products while cuBLAS
    runs plain TF32 under either (docs/kernels.md, "RSSM unroll"). So `auto` takes it fused in tf32
    with gradients up to deter 1024 (the preset's 512) and nowhere else."""
    spec, precision = problem["spec"], problem.get("precision")
    kind = problem.get("kind")
    if not supports(spec, problem["dtype"]) or kind == "policy" or (kind == "actor" and spec.cell == "gru"):
        return False
    if kind == "actor" and problem.get("policy_dist") not in FUSED_ACTOR_DISTS:
        return False
    if spec.cell == "norm_gru":
        return (precision == "tf32" and bool(problem.get("grad")) and kind in ("observe", "actor")
                and spec.deter <= 1024)
    if kind == "actor" and (problem.get("policy_dist") in UNTIMED_ACTOR_DISTS or problem.get("stop_features")):
        return False
    if kind == "open" and not problem.get("grad") and problem.get("batch", 0) > OPEN_LOOP_MAX_ROWS:
        return False
    if problem.get("grad"):
        if spec.deter <= 1024:
            return precision in ("tf32", "tf32x3", "bf16")
        return kind == "observe" and precision in ("tf32", "bf16")
    return precision in ("tf32", "bf16") or (precision == "tf32x3" and spec.deter <= 1024)


# ---------------------------------------------------------------------------------------------- checks
def _check_runs(spec: RSSMSpec, deter: torch.Tensor, tensors) -> None:
    """That the kernels take this spec on deter's device and dtype, and `tensors` (the inputs) with it."""
    if triton is None:
        raise RuntimeError("the triton backend needs the `triton` package")
    dtype, device = deter.dtype, deter.device
    # under torch.compile the cache is traced through anyway (with a warning): ask the function itself
    reason = (unsupported_reason.__wrapped__ if torch.compiler.is_compiling() else unsupported_reason)(spec, dtype)
    if reason is not None:
        raise ValueError(f"backend='triton' cannot run this RSSM: {reason}")
    unavailable = triton_unavailable(device)
    if unavailable is not None:
        raise RuntimeError(f"backend='triton' is not available on {device}: {unavailable}")
    _check_tensors(deter, tensors)


def _check_tensors(deter: torch.Tensor, tensors) -> None:
    """Every floating tensor of `tensors` in deter's dtype, on its device (None entries allowed)."""
    dtype = deter.dtype
    # run over ~50 weights by an uncaptured call: the common case (deter's dtype, on its CUDA device) in two
    # cheap reads per tensor (dtypes are singletons; `device` builds an object per read)
    index = deter.get_device() if deter.is_cuda else None
    for t in tensors:
        if not isinstance(t, torch.Tensor) or (t.dtype is dtype and index is not None and t.get_device() == index):
            continue
        if t.is_floating_point() and (t.dtype, t.device) != (dtype, deter.device):
            raise TypeError(f"backend='triton': every tensor must be {dtype} on {deter.device} like deter, "
                            f"got {t.dtype} on {t.device}")


def _actor_in_kernel(policy, policy_noise, spec: RSSMSpec, weights: dict, prior_noise,
                     named: dict) -> tuple[str | None, ActorSpec | None]:
    """(None, its `ActorSpec`) when the policy is an `Actor` the kernel reproduces (its math, the pure
    op `ops/actor.py`, on `named` as the weights); else (why not, None). `named`: its named parameters
    (read once per call by the caller: `_actor_parameters`, or `named_parameters` for other trees). The
    kernel runs one structure for every hidden block: each is checked."""
    name = type(policy).__name__
    if not isinstance(policy, Actor) or any(getattr(type(policy), m) is not getattr(Actor, m)
                                            for m in ("forward", "_params", "op_spec")):
        return f"policy {name} is not the project's Actor (models/actor.py), whose MLP the kernel reproduces", None
    if policy.dist_type not in FUSED_ACTOR_DISTS:
        return (f"the fused imagination kernel samples {', '.join(FUSED_ACTOR_DISTS)} Actors, "
                f"not {policy.dist_type!r}", None)
    if policy_noise is None:
        return "the Actor in the loop needs pre-drawn policy noise (noise['policy'] or Actor.noise)", None
    *blocks, out = policy.net  # (unpacked once: a Sequential's int index walks its modules each time)
    if not blocks:
        return "an Actor without hidden layers is not supported", None
    if not isinstance(out, nn.Linear) or any(not isinstance(b, nn.Sequential) or len(b) != 3 for b in blocks):
        return "the Actor's MLP is not the [Linear, norm, activation] blocks and output Linear it makes", None
    linear, norm, act = blocks[0]
    if not isinstance(norm, (nn.Identity, nn.RMSNorm, nn.LayerNorm)) or not isinstance(act, (nn.ELU, nn.SiLU, nn.ReLU)):
        return (f"the Actor's norm / activation ({type(norm).__name__}, {type(act).__name__}) are not supported",
                None)
    if isinstance(act, nn.ELU) and act.alpha != 1.0:
        return "the Actor's ELU has alpha != 1", None
    if not isinstance(norm, nn.Identity) and norm.weight is None:
        return "the Actor's norm has no elementwise weight", None
    for lin, nrm, a in blocks[1:]:
        if (type(nrm) is not type(norm) or type(a) is not type(act) or lin.out_features != linear.out_features
                or getattr(nrm, "eps", None) != getattr(norm, "eps", None) or getattr(a, "alpha", 1.0) != 1.0
                or (not isinstance(nrm, nn.Identity) and nrm.weight is None)):
            return "the Actor's hidden blocks differ (the kernel runs the first one's structure for all)", None
    actor = policy.op_spec()
    if sorted(named) != sorted(weight_names(actor)):
        return "the Actor's parameters are not those its constructor makes", None
    stoch = spec.stoch * spec.classes if spec.classes else spec.stoch
    if actor.feat_dim != stoch + spec.deter or actor.action_dim != weights["in_action.w"].shape[1]:
        return "the Actor's feature / action sizes do not match the RSSM's", None
    if actor.dist == "onehot" and actor.action_dim > _MAX_ACTIONS:
        return f"a one-hot Actor with more than {_MAX_ACTIONS} actions", None
    if policy_noise.shape != (*prior_noise.shape[:2], actor.action_dim):
        return f"policy noise of shape {list(policy_noise.shape)} is not [N, H, action_dim]", None
    return None, actor


def _actor_parameters(policy) -> dict[str, torch.Tensor] | None:
    """`dict(policy.named_parameters())` for an Actor whose module tree has the shape its constructor
    makes (policy.net: Sequentials of three leaf modules, then a leaf; no modules below the leaves, no
    parameters outside them, none shared), read from the leaves' own tables; None for any other tree
    (the caller walks it with `named_parameters`). Which leaves the kernel takes is
    `_actor_in_kernel`'s to check. Asked on every Actor-in-the-loop call: torch's
    walk (named_modules' generators, its memo and prefixes) was ~1/3 of the host's time before a
    replay (V3-1m, `python -m benchmarks.profile.host_path V3-1m-imagine-actor --profile`)."""
    modules = policy._modules
    if policy._parameters or len(modules) != 1 or "net" not in modules:
        return None
    net = modules["net"]
    if type(net) is not nn.Sequential or net._parameters or not net._modules:
        return None
    named: dict[str, torch.Tensor] = {}
    *blocks, out = net._modules.items()
    for i, (name, block) in enumerate(blocks):
        if name != str(i) or type(block) is not nn.Sequential or block._parameters or len(block._modules) != 3:
            return None
        for j, (key, leaf) in enumerate(block._modules.items()):
            if key != str(j) or not _leaf_parameters(leaf, f"net.{i}.{j}.", named):
                return None
    if out[0] != str(len(blocks)) or not _leaf_parameters(out[1], f"net.{out[0]}.", named):
        return None
    if len({id(t) for t in named.values()}) != len(named):  # a shared parameter: named_parameters lists it once
        return None
    return named


def _leaf_parameters(module, prefix: str, named: dict) -> bool:
    """Adds `module`'s parameters (those not None) as named_parameters names them; False if it has submodules."""
    if module is None or module._modules:
        return False
    for name, p in module._parameters.items():
        if p is not None:
            named[prefix + name] = p
    return True


# ---------------------------------------------------------------------------------------------- the ops
def _captured(deter, cache) -> bool:
    """Whether this call runs as a CUDA-graph replay: on CUDA with a cache, with or without gradients
    (the capture takes the host path around the launches off the host: the off-chain GEMMs,
    allocations, checks and the backward's pass 2)."""
    return cuda_graphs.captures_graphs(deter) and cache is not None


def _action_share(spec, weights, action, *others) -> dict:
    """The unroll's a_share: `reference.action_in`, or where the share needs no gradient its one-launch
    form (`share.action_share`); for V3 where the whole unroll (`others`: its other inputs) needs none and it
    pays (`share.dyn_x_share_pays`), multiplied on by its columns of dyn_x.w (a_share_pre)."""
    a_share = share.action_share(spec, weights, action)
    if a_share is None:
        return dict(a_share=reference.action_in(spec, weights, action))
    grad = wants_grad((*weights.values(), *others))
    if spec.cell != "block_gru" or grad or not share.dyn_x_share_pays(spec):
        return dict(a_share=a_share)
    return dict(a_share=share.dyn_x_share(spec, weights, a_share), a_share_pre=True)


def _observe(spec, weights, deter, stoch, action, embed, is_first, post_noise, prior_noise):
    reset = is_first.unsqueeze(-1)
    a_share = _action_share(spec, weights, torch.where(reset, torch.zeros_like(action), action), deter, stoch,
                            embed)
    post = autograd.unroll("observe", spec, reference.with_initial(spec, weights), deter, stoch, post_noise, **a_share,
                           e_share=reference.embed_in(weights, embed), resets=is_first)
    return post, reference.prior(spec, weights, post["deter"], prior_noise)  # nothing in the loop reads the prior


def _under_autocast(device: torch.device, tensors):
    """Under torch.autocast the unroll keeps its state in fp32 (float64 stays float64): the floating
    inputs an autocast region made in half precision (an encoder's embedding) are cast up, and the
    kernel's dots take bf16 operands (`autograd.forward_precision`). Outside autocast: the tensors as they are."""
    if not torch.is_autocast_enabled(device.type):
        return tensors
    state = torch.float64 if tensors[0].dtype == torch.float64 else torch.float32
    return tuple(t.to(state) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in tensors)


def observe(spec, weights, deter, stoch, action, embed, is_first, post_noise, prior_noise, *, cache=None):
    inputs = _under_autocast(deter.device, (deter, stoch, action, embed, is_first, post_noise, prior_noise))
    deter = inputs[0]
    _check_runs(spec, deter, inputs)
    warn_if_slower_than_cudnn(deter.device, deter.dtype, autograd.forward_precision(deter), "the RSSM's observe")
    if not _captured(deter, cache):
        _check_tensors(deter, weights.values())
        return _observe(spec, weights, *inputs)
    def unroll(groups, inputs):
        return reference.join_observed(*_observe(spec, groups[0], *inputs))

    key = ("triton", "observe", spec, resolve_precision(None, deter.device))
    # deter, stoch (the initial state) and post_noise are read by the kernel through the replay's input
    # table, not copied (`cuda_graphs.InputTable`); the rest feed torch's ops
    return reference.split_observed(cuda_graphs.replay_captured(
        cache, key, unroll, [weights], inputs, indirect=(0, 1, 5),
        validate=lambda: _check_tensors(deter, weights.values()), what="triton observe"))


def _imagine(spec, weights, deter, stoch, prior_noise, actions, actor, policy_params, policy_noise):
    """The unroll's outputs; in open loop without "action" (the caller's actions, which `imagine` adds).
    actor: the `ActorSpec` of the Actor in the loop, policy_params its weights."""
    if actions is not None:
        return autograd.unroll("open_loop", spec, weights, deter, stoch, prior_noise,
                               **_action_share(spec, weights, actions, deter, stoch))
    return autograd.unroll("actor", spec, weights, deter, stoch, prior_noise, actor=actor,
                           policy_params=policy_params, policy_noise=policy_noise)


def imagine(spec, weights, deter, stoch, prior_noise, *, actions=None, policy=None, policy_params=None,
            policy_noise=None, cache=None):
    if (actions is None) == (policy is None):
        raise ValueError("imagine needs exactly one of actions= (open loop) and policy= (policy in the loop)")
    params = dict(policy_params or {})
    deter, stoch, prior_noise, actions, policy_noise = _under_autocast(
        deter.device, (deter, stoch, prior_noise, actions, policy_noise))
    inputs = (deter, stoch, prior_noise, actions, policy_noise)
    _check_runs(spec, deter, inputs)
    warn_if_slower_than_cudnn(deter.device, deter.dtype, autograd.forward_precision(deter), "the RSSM's imagine")

    def check_weights():  # reads `params` when called: the caller's, then all the Actor's once merged in
        _check_tensors(deter, [*weights.values(), *params.values()])

    actor = None
    if actions is None:
        # an Actor on stop-gradient features (a backprop actor's imagination): the same forward, its
        # spec says the backward drops the features' gradient through the actor's input
        stopped = is_stopped_actor(policy)
        inner = policy.policy if stopped else policy
        named = _actor_parameters(inner) if isinstance(inner, Actor) else None
        if named is None:
            named = dict(inner.named_parameters()) if isinstance(inner, nn.Module) else {}
        reason, actor = _actor_in_kernel(inner, policy_noise, spec, weights, prior_noise, named)
        if stopped:
            params = {name.removeprefix("policy."): p for name, p in params.items()}  # the wrapper's names
            actor = actor and dataclasses.replace(actor, stop_features=True)
        if reason is not None:
            check_weights()
            warn_once(f"backend='triton' runs imagine with this policy on the loop reference, slower than "
                      f"backend='cudnn' (or 'auto', which picks it for such a policy): {reason}")
            return reference.imagine(spec, weights, deter, stoch, prior_noise, policy=policy,
                                     policy_params=policy_params, policy_noise=policy_noise)
        params = {**named, **params}  # all of them: the kernel reads every one

    if not _captured(deter, cache):
        check_weights()
        return _with_actions(_imagine(spec, weights, *inputs[:3], actions, actor, params, policy_noise), actions)

    def unroll(groups, inputs):
        w, p = groups
        deter, stoch, prior_noise, actions, policy_noise = inputs
        return _imagine(spec, w, deter, stoch, prior_noise, actions, actor, p, policy_noise)

    # the Actor's spec too: a capture bakes its structure in (an activation swapped in place changes no
    # parameter, but must not replay the old one)
    key = ("triton", "imagine", spec, id(policy), actor, resolve_precision(None, deter.device))
    # every input is read by our launches (the kernel, the action share), so
    # a no-grad replay reads them where they are (`cuda_graphs.InputTable`): no copy of 41 MB at V3-12m
    # the weights' dtype and device checked once per capture (`validate`): their addresses are in its key
    out = cuda_graphs.replay_captured(cache, key, unroll, [weights, params], inputs,
                                      indirect=range(len(inputs)),
                                      validate=check_weights, what="triton imagine")
    return _with_actions(out, actions)


def _with_actions(out: dict, actions) -> dict:
    """Open loop returns the actions it was given, as `reference.imagine` does (not a graph's buffer)."""
    if actions is not None:
        out["action"] = actions
    return out
