"""The RSSM unrolls on vendor kernels: the reference loop with the dense GRU step as torch's fused
`gru_cell`, and on CUDA the whole unroll (forward and backward) captured in CUDA graphs once per
static signature (`core/cuda_graphs.py`), then replayed.

With `WORLDMODELS_CUDNN_STEP=compiled` (or `cudnn_step.use("compiled")`) the step of the block GRU
and of the 2023 dense GRU (`norm_gru`) is compiled first (`core.unroll.compiled_loop_unroll`): on
CUDA, outside torch.compile and vmap, the step's elementwise work (norms, gates, sampling) in a few
fused kernels instead of some forty launches per step. The plain dense GRU keeps torch's fused
`gru_cell`.

Same signatures and results as `reference.py`. The captures live in the `cache` the module owns
(an `UnrollCache`, least recently used dropped), keyed by everything a capture bakes in: the op,
the spec, the policy, input shapes / dtypes / requires_grad, grad and autocast mode, and the
weights' storage (an optimiser step updates weights in place, which a replay sees).
"""

from __future__ import annotations

import torch

from worldmodels.core import cuda_graphs
from worldmodels.core.context import ContextSetting
from worldmodels.core.unroll import compiled_loop_unroll, is_batched, loop_unroll
from worldmodels.ops.rssm import reference

cudnn_step = ContextSetting("cudnn step", ("eager", "compiled"), "eager", env_var="WORLDMODELS_CUDNN_STEP")
"""How cudnn's RSSM unrolls run the block GRU's and norm GRU's step: "eager" (torch's ops one by one)
or "compiled"."""

COMPILED_CELLS = ("block_gru", "norm_gru")
"""The cells whose step `cudnn_step` "compiled" compiles (the dense "gru" is one fused `gru_cell`)."""


def driver(spec, deter: torch.Tensor):
    """The unroll driver for this call: the compiled step where it is switched on and can run."""
    if (cudnn_step.get() == "compiled" and spec.cell in COMPILED_CELLS and deter.is_cuda
            and not torch.compiler.is_compiling() and not is_batched(deter)):
        return compiled_loop_unroll
    return loop_unroll


def observe(spec, weights, deter, stoch, action, embed, is_first, post_noise, prior_noise, *, cache=None):
    unroll_with = driver(spec, deter)
    if not (cuda_graphs.captures_graphs(deter) and cache is not None):
        return reference.unrolled_observe(unroll_with, spec, weights, deter, stoch, action, embed, is_first,
                                          post_noise, prior_noise, vendor=True)

    def unroll(groups, inputs):
        return reference.join_observed(*reference.unrolled_observe(unroll_with, spec, groups[0], *inputs, vendor=True))

    inputs = (deter, stoch, action, embed, is_first, post_noise, prior_noise)
    return reference.split_observed(cuda_graphs.replay_captured(cache, ("observe", spec), unroll, [weights], inputs,
                                                                 what="cudnn observe"))


def imagine(spec, weights, deter, stoch, prior_noise, *, actions=None, policy=None, policy_params=None,
            policy_noise=None, cache=None):
    policy_params = policy_params or {}
    plain_callable = actions is None and not isinstance(policy, torch.nn.Module)
    unroll_with = loop_unroll if plain_callable else driver(spec, deter)
    if not (cuda_graphs.captures_graphs(deter) and cache is not None) or plain_callable:
        # a plain callable's weights are invisible to a capture: run the vendor loop uncaptured
        return reference.unrolled_imagine(unroll_with, spec, weights, deter, stoch, prior_noise, actions=actions,
                                          policy=policy, policy_params=policy_params, policy_noise=policy_noise,
                                          vendor=True)
    open_loop = actions is not None

    def unroll(groups, inputs):
        w, p = groups
        deter, stoch, noise, extra = inputs
        return reference.unrolled_imagine(
            unroll_with, spec, w, deter, stoch, noise, actions=extra if open_loop else None,
            policy=None if open_loop else policy, policy_params=p, policy_noise=None if open_loop else extra,
            vendor=True)

    extra = actions if open_loop else policy_noise
    inputs = (deter, stoch, prior_noise, extra)
    key = ("imagine", spec, open_loop, id(policy))
    return cuda_graphs.replay_captured(cache, key, unroll, [weights, policy_params], inputs, what="cudnn imagine")
