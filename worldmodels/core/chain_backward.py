"""The backward of an unroll whose forward ran elsewhere (a fused kernel), from the carries it wrote.

    chain_backward(step, carry0, carries, xs, params, g_carries, g_ys, *, xs_grad, params_grad,
                   compiled=False, chain=None) -> (g_carry0, g_xs, g_params)

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
   gives carry t-1's gradient (no weight-gradient GEMMs on the chain). With `compiled`, that
   per-step VJP is one `torch.compile`d function (inductor fuses its pointwise work: a few
   kernels per step instead of one per op), compiled once per step function and shape.
   `chain` = (g_carry0, totals): pass 1 done elsewhere (a fused reverse-chain kernel), where
   totals (tuple of [T, B, ...]) are the cotangents of every step's carry as the step's output
   (g_carries[t] plus what step t+1 sent back); only pass 2 runs here.
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

import functools
import warnings

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


def _carry_vjp(step, prev, x, params, g, g_y):
    """The gradient of carry t-1 from those of step t's carry and outputs (params frozen)."""
    def outputs(*carry):
        new, y = step(carry, x, params)
        return tuple(new), {k: y[k] for k in g_y}

    _, pullback = torch.func.vjp(outputs, *prev)
    return pullback((tuple(g), g_y))


@functools.lru_cache(maxsize=32)
def _compiled_carry_vjp(step):
    return torch.compile(functools.partial(_carry_vjp, step), dynamic=False, fullgraph=True)


_failed: set = set()


def _chain_step(step, compiled: bool):
    """The per-step carry VJP: compiled where asked (falling back to eager, with one warning, for
    a step function torch.compile cannot take)."""
    if not compiled or step in _failed:
        return functools.partial(_carry_vjp, step)
    fast = _compiled_carry_vjp(step)

    def run(*args):
        try:
            # one compiled entry per step function and shape, all on _carry_vjp's code object: let
            # dynamo keep more of them than its default (8) before it falls back to eager
            with torch._dynamo.config.patch(recompile_limit=64):
                return fast(*args)
        except Exception as e:  # noqa: BLE001 (any compile failure: the eager VJP computes the same)
            _failed.add(step)
            warnings.warn(f"chain_backward: torch.compile of the step's VJP failed ({type(e).__name__}: {e}); "
                          f"running it eagerly", stacklevel=2)
            return _carry_vjp(step, *args)
    return run


def _step_outputs(step, carry, x, params, g_carry, g_y):
    new, y = step(carry, x, params)
    return [*new, *(y[k] for k in g_y)], [*g_carry, *g_y.values()]


def _chain(step, prev, xs, params, g_carries, g_ys, compiled):
    """Pass 1: (g_carry0, totals), totals a tuple of [T, B, ...] (see the module docstring)."""
    frozen = pytree.tree_map(lambda p: p.detach() if isinstance(p, torch.Tensor) else p, params)
    carry_vjp = _chain_step(step, compiled)
    g = tuple(torch.zeros_like(p[0]) for p in prev)
    totals = []
    for t in reversed(range(prev[0].shape[0])):
        g = tuple(gc[t] + gi for gc, gi in zip(g_carries, g))
        totals.append(g)
        g = tuple(carry_vjp(tuple(p[t].detach() for p in prev), tuple(x[t] for x in xs), frozen, g,
                            {k: v[t] for k, v in g_ys.items()}))
    totals.reverse()
    return g, tuple(torch.stack([gt[i] for gt in totals]) for i in range(len(prev)))


def chain_backward(step, carry0, carries, xs, params, g_carries, g_ys, *, xs_grad, params_grad, compiled=False,
                   chain=None):
    prev = tuple(torch.cat([c0.unsqueeze(0), c[:-1]]) for c0, c in zip(carry0, carries))
    with torch.enable_grad():
        g, totals = chain if chain is not None else _chain(step, prev, xs, params, g_carries, g_ys, compiled)

        # pass 2: every step at once, over T*B rows
        flat_prev = tuple(p.flatten(0, 1).detach() for p in prev)
        flat_xs = tuple(x.flatten(0, 1).detach().requires_grad_(bool(want) and x.is_floating_point())
                        for x, want in zip(xs, xs_grad))
        param_list, spec = pytree.tree_flatten(params)
        wanted = pytree.tree_leaves(params_grad)
        leaf_params = [p.detach().requires_grad_(bool(w)) for p, w in zip(param_list, wanted)]
        g_total = tuple(gt.flatten(0, 1) for gt in totals)
        outs, cots = _step_outputs(step, flat_prev, flat_xs, pytree.tree_unflatten(leaf_params, spec), g_total,
                                   {k: v.flatten(0, 1) for k, v in g_ys.items()})
        wrt = [x for x in flat_xs if x.requires_grad] + [p for p in leaf_params if p.requires_grad]
        grads = list(_vjp(outs, cots, wrt)) if wrt else []

    g_xs = _scatter(grads, [x.requires_grad for x in flat_xs], xs)
    g_params = _scatter(grads, [p.requires_grad for p in leaf_params], leaf_params)
    return g, g_xs, pytree.tree_unflatten(g_params, spec)
