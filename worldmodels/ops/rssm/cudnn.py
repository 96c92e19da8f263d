"""The RSSM unrolls on vendor kernels: the reference loop with the dense GRU step as torch's fused
`gru_cell`, and on CUDA the whole unroll (forward and backward) captured in CUDA graphs once per
static signature (`core/cuda_graphs.py`), then replayed.

Same signatures and results as `reference.py`. The captures live in the `cache` the module owns
(an `UnrollCache`, least recently used dropped), keyed by everything a capture bakes in: the op,
the spec, the policy, input shapes / dtypes / requires_grad, grad and autocast mode, and the
weights' storage (an optimiser step updates weights in place, which a replay sees).
"""

from __future__ import annotations

import torch

from worldmodels.core.cuda_graphs import GraphedUnroll
from worldmodels.core.strides import canonical
from worldmodels.core.unroll import loop_unroll
from worldmodels.ops.rssm import reference


def captures_graphs(tensor: torch.Tensor) -> bool:
    """Whether this unroll is captured in CUDA graphs (tests patch it to run the capture path's
    composition on CPU)."""
    return tensor.is_cuda


def observe(spec, weights, deter, stoch, action, embed, is_first, post_noise, prior_noise, *, cache=None):
    if not (captures_graphs(deter) and cache is not None):
        return reference.unrolled_observe(loop_unroll, spec, weights, deter, stoch, action, embed, is_first,
                                          post_noise, prior_noise, vendor=True)
    names = list(weights)

    def unroll(tensors, inputs):
        w = dict(zip(names, tensors))
        post, prior = reference.unrolled_observe(loop_unroll, spec, w, *inputs, vendor=True)
        return {**{f"post.{k}": v for k, v in post.items()}, **{f"prior.{k}": v for k, v in prior.items()}}

    inputs = (deter, stoch, action, embed, is_first, post_noise, prior_noise)
    out = _replay(cache, ("observe", spec), unroll, list(weights.values()), inputs)
    return ({k[5:]: v for k, v in out.items() if k.startswith("post.")},
            {k[6:]: v for k, v in out.items() if k.startswith("prior.")})


def imagine(spec, weights, deter, stoch, prior_noise, *, actions=None, policy=None, policy_params=None,
            policy_noise=None, cache=None):
    policy_params = policy_params or {}
    plain_callable = actions is None and not isinstance(policy, torch.nn.Module)
    if not (captures_graphs(deter) and cache is not None) or plain_callable:
        # a plain callable's weights are invisible to a capture: run the vendor loop uncaptured
        return reference.unrolled_imagine(loop_unroll, spec, weights, deter, stoch, prior_noise, actions=actions,
                                          policy=policy, policy_params=policy_params, policy_noise=policy_noise,
                                          vendor=True)
    names, policy_names = list(weights), list(policy_params)
    open_loop = actions is not None

    def unroll(tensors, inputs):
        w, p = dict(zip(names, tensors)), dict(zip(policy_names, tensors[len(names):]))
        deter, stoch, noise, extra = inputs
        return reference.unrolled_imagine(
            loop_unroll, spec, w, deter, stoch, noise, actions=extra if open_loop else None,
            policy=None if open_loop else policy, policy_params=p, policy_noise=None if open_loop else extra,
            vendor=True)

    extra = actions if open_loop else policy_noise
    inputs = (deter, stoch, prior_noise, extra)
    key = ("imagine", spec, open_loop, id(policy))
    return _replay(cache, key, unroll, [*weights.values(), *policy_params.values()], inputs)


def _replay(cache, key, unroll, params, inputs) -> dict[str, torch.Tensor]:
    """Capture `unroll(params, inputs) -> dict` once per signature, then replay it."""
    present = [i for i, t in enumerate(inputs) if t is not None]
    tensors = [canonical(inputs[i]) for i in present]
    key = (*key, tuple((t.shape, t.dtype, t.requires_grad) for t in tensors), torch.is_grad_enabled(),
           torch.is_autocast_enabled("cuda"), tuple(p.data_ptr() for p in params))
    entry = cache.get(key)
    if entry is None:
        names: list[str] = []
        trained = [i for i, p in enumerate(params) if p.requires_grad]

        def run(leaves, *static):
            current = list(params)  # frozen weights are read as they are; trained ones through the leaves
            for i, leaf in zip(trained, leaves):
                current[i] = leaf
            full = [None] * len(inputs)
            for i, t in zip(present, static):
                full[i] = t
            out = unroll(current, full)
            names[:] = list(out)
            return tuple(out.values())

        entry = cache.put(key, (GraphedUnroll(run, [params[i] for i in trained], tensors), names))
    graphed, names = entry
    return dict(zip(names, graphed(*tensors)))
