"""The backward of an unroll whose forward ran elsewhere (a fused kernel), from the carries it wrote.

    chain_backward(step, carry0, carries, xs, params, g_carries, g_ys, *, xs_grad, params_grad)
        -> (g_carry0, g_xs, g_params)

`step(carry, x, params) -> (carry, y)` is the unroll's step function (`core/unroll.py`'s
contract); carry is a tuple of [B, ...] tensors, y a dict of [B, ...] tensors. Inputs:
carry0 (tuple of [B, ...]), carries (tuple of [T, B, ...]: the carry after every step, as the
forward computed it), xs (tuple of [T, B, ...] per-step inputs), params (any pytree of tensors),
g_carries (tuple of [T, B, ...]: the cotangents of the carries as outputs) and g_ys (dict of
[T, B, ...]: those of the per-step outputs). Returns the gradients of carry0 (tuple), of the xs
flagged in `xs_grad` (None for the others) and of the params (same pytree; None where
`params_grad` is False).

Two passes, as cuDNN's RNN backward:
1. the chain, in reverse time: only the carry's gradient is sequential. At step t the step is
   recomputed from the saved carry t-1 with the params frozen, and one VJP w.r.t. the carry alone
   gives carry t-1's gradient (no weight-gradient GEMMs on the chain).
2. everything else at once: the step recomputed over all T*B rows (the carries in hand make
   the steps independent), one VJP with each step's total cotangent gives the params' and the
   inputs' gradients as GEMMs over B*T.
Values the backward sees are the step's math at the forward's carries, so the gradients are
those of the reference unroll wherever the forward matches it. Sampling inside the step is from
the inputs' pre-drawn noise: a recomputed one-hot sample may differ from the forward's in value
at a near tie, but its straight-through gradient (through the probabilities) does not depend on
which class won.
"""

from __future__ import annotations

import torch
from torch.utils import _pytree as pytree


def _vjp(outputs, cotangents, wrt):
    pairs = [(o, g) for o, g in zip(outputs, cotangents) if o.requires_grad]
    if not pairs:
        return [None] * len(wrt)
    return torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True)


def _scatter(grads: list, flags, like) -> list:
    """Per entry of `like`: the next of `grads` (zeros where autograd found no path) where its flag
    is set, else None."""
    out = []
    for t, flag in zip(like, flags):
        g = grads.pop(0) if flag else None
        out.append(None if not flag else torch.zeros_like(t) if g is None else g.view_as(t))
    return out


def _step_outputs(step, carry, x, params, g_carry, g_y):
    new, y = step(carry, x, params)
    return [*new, *(y[k] for k in g_y)], [*g_carry, *g_y.values()]


def chain_backward(step, carry0, carries, xs, params, g_carries, g_ys, *, xs_grad, params_grad):
    steps = carries[0].shape[0]
    prev = tuple(torch.cat([c0.unsqueeze(0), c[:-1]]) for c0, c in zip(carry0, carries))
    frozen = pytree.tree_map(lambda p: p.detach() if isinstance(p, torch.Tensor) else p, params)
    g = tuple(torch.zeros_like(c0) for c0 in carry0)
    totals = []
    with torch.enable_grad():
        for t in reversed(range(steps)):  # pass 1: the chain
            g = tuple(gc[t] + gi for gc, gi in zip(g_carries, g))
            totals.append(g)
            leaves = tuple(p[t].detach().requires_grad_() for p in prev)
            outs, cots = _step_outputs(step, leaves, tuple(x[t] for x in xs), frozen, g,
                                       {k: v[t] for k, v in g_ys.items()})
            g = tuple(torch.zeros_like(leaf) if gl is None else gl
                      for leaf, gl in zip(leaves, _vjp(outs, cots, leaves)))
        totals.reverse()

        # pass 2: every step at once, over T*B rows
        flat_prev = tuple(p.flatten(0, 1).detach() for p in prev)
        flat_xs = tuple(x.flatten(0, 1).detach().requires_grad_(bool(want) and x.is_floating_point())
                        for x, want in zip(xs, xs_grad))
        param_list, spec = pytree.tree_flatten(params)
        wanted = pytree.tree_leaves(params_grad)
        leaf_params = [p.detach().requires_grad_(bool(w)) for p, w in zip(param_list, wanted)]
        g_total = tuple(torch.stack([gt[i] for gt in totals]).flatten(0, 1) for i in range(len(carry0)))
        outs, cots = _step_outputs(step, flat_prev, flat_xs, pytree.tree_unflatten(leaf_params, spec), g_total,
                                   {k: v.flatten(0, 1) for k, v in g_ys.items()})
        wrt = [x for x in flat_xs if x.requires_grad] + [p for p in leaf_params if p.requires_grad]
        grads = list(_vjp(outs, cots, wrt)) if wrt else []

    g_xs = _scatter(grads, [x.requires_grad for x in flat_xs], xs)
    g_params = _scatter(grads, [p.requires_grad for p in leaf_params], leaf_params)
    return g, g_xs, pytree.tree_unflatten(g_params, spec)
