"""Drivers that unroll a step function over time: `loop` (reference), `scan` (compile-friendly) and
`compiled_loop_unroll` (the loop with its step compiled: cudnn's RSSM unrolls, where it is switched on).

A step is `step(carry, x, params) -> (carry, y)`; `carry`, `x`, `y` and `params` are pytrees
(tuples/dicts) of tensors, and `y` holds only what is not in the carry. `xs` are time-major,
[T, ...]; the result is `(final carry, states, ys)`: `states` the carry after every step and `ys`
the step outputs, both stacked on a leading time dim.
`params` are the tensors the step closes over (weights); they are passed explicitly so the scan
driver can un-alias them before the body closes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._higher_order_ops.scan import scan
from torch.utils import _pytree as pytree

from worldmodels.core import torch_fixes
from worldmodels.core.strides import canonical

torch_fixes.apply()  # scan's upstream workarounds, on the torch versions that need them

Step = Callable[[Any, Any, Any], tuple[Any, Any]]
Driver = Callable[[Step, Any, Any, Any], tuple[Any, Any, Any]]


def is_batched(tensor: torch.Tensor) -> bool:
    """True inside `torch.func.vmap` for a tensor carrying a vmapped dimension."""
    return torch._C._functorch.is_batchedtensor(tensor)


def _stack(trees: list) -> Any:
    return pytree.tree_map(lambda *v: torch.stack(v), *trees)


def loop_unroll(step: Step, carry: Any, xs: Any, params: Any = ()) -> tuple[Any, Any, Any]:
    """The reference: a Python loop over t, states and outputs stacked along dim 0."""
    steps = pytree.tree_leaves(xs)[0].shape[0]
    states, ys = [], []
    for t in range(steps):
        carry, y = step(carry, pytree.tree_map(lambda v: v[t], xs), params)
        states.append(carry)
        ys.append(y)
    return carry, _stack(states), _stack(ys)


def compiled_loop_unroll(step: Step, carry: Any, xs: Any, params: Any = (), *, backend: str = "inductor"
                         ) -> tuple[Any, Any, Any]:
    """`loop_unroll` with the step compiled (`torch.compile`, static shapes, one graph): its
    elementwise work (norms, activations, gates, sampling) fused into a few kernels forward and
    backward, the loop, the carry and autograd's graph between steps still Python's. A step is a
    fresh closure per call; the compiled code is kept per code object and guarded on what the
    closure holds (the spec, the policy), so a new call of the same RSSM reuses it."""
    return loop_unroll(torch.compile(step, backend=backend, dynamic=False, fullgraph=True), carry, xs, params)


def unalias(tensor: torch.Tensor) -> torch.Tensor:
    """A private, canonical copy of a weight the scan body closes over.

    The scan tracer rejects inputs that alias each other. A weight may share storage with the
    others without being a view: cuDNN's `flatten_parameters` `set_`s every layer's parameters
    into one flat buffer, so they have no `_base`, and storage cannot be inspected under vmap or
    fake tensors. So every weight is cloned (small next to the unroll); cloning is
    differentiable, so gradients still reach the flat buffer."""
    return tensor.clone(memory_format=torch.contiguous_format)


def scan_unroll(step: Step, carry: Any, xs: Any, params: Any = ()) -> tuple[Any, Any, Any]:
    """The same unroll under `torch._higher_order_ops.scan` (eager, and torch.compile fullgraph)."""
    if torch.compiler.is_compiling() and not torch_fixes.scan_compiles_correctly():
        raise ValueError(f"backend='scan' under torch.compile gives wrong gradients on torch {torch.__version__} "
                         "(worldmodels/core/torch_fixes.py); use backend='loop' or 'auto' there, or torch >= 2.13")
    params = pytree.tree_map_only(torch.Tensor, unalias, params)  # None leaves: absent biases
    carry = pytree.tree_map(unalias, carry)  # the carry's leaves may share storage too (h and c from one zeros)
    if torch_fixes.eager_scan_needs_grad_carry() and torch.is_grad_enabled():
        weights = [p for p in pytree.tree_leaves(params) if isinstance(p, torch.Tensor)]
        carry = pytree.tree_map(lambda c: torch_fixes.carry_requiring_grad(c, weights), carry)
    xs = pytree.tree_map(canonical, xs)

    def body(carry, x):
        new_carry, y = step(carry, x, params)
        # scan needs a fixed carry dtype; under autocast a step may return it in bf16
        new_carry = pytree.tree_map(lambda new, old: new.to(old.dtype), new_carry, carry)
        # scan's outputs may not alias each other or a saved activation, so every output is a
        # copy. The states are emitted as the *incoming* carry: emitting two copies of the new
        # carry made inductor return wrong weight gradients (torch 2.13, docs/recurrent-core.md).
        return pytree.tree_map(torch.clone, new_carry), pytree.tree_map(torch.clone, (carry, y))

    first = None
    if _carry_lacks_vmap_dim(carry, (xs, params)):
        # Under vmap, scan needs the carry batched like the step's output. When only the inputs or
        # weights carry the vmapped dim (an ensemble on shared data), step 0 runs outside the scan.
        carry, first = step(carry, pytree.tree_map(lambda v: v[0], xs), params)
        first = (carry, first)
        xs = pytree.tree_map(lambda v: v[1:], xs)
        if pytree.tree_leaves(xs)[0].shape[0] == 0:
            return carry, *pytree.tree_map(lambda v: v.unsqueeze(0), first)
    with torch_fixes.static_scan_shapes():  # eager scan's own trace refuses dynamic sizes (torch_fixes)
        final, (previous, ys) = scan(body, carry, xs)
    # states[t] = carry after step t = previous[t + 1], and the final carry last
    states = pytree.tree_map(lambda p, f: torch.cat([p[1:], f.unsqueeze(0)]), previous, final)
    if first is not None:
        states, ys = pytree.tree_map(lambda v, vs: torch.cat([v.unsqueeze(0), vs]), first, (states, ys))
    return final, states, ys


def _carry_lacks_vmap_dim(carry: Any, others: Any) -> bool:
    """True under vmap when an input or weight is batched but some carry leaf is not."""
    tensors = [v for v in pytree.tree_leaves(others) if isinstance(v, torch.Tensor)]
    return any(map(is_batched, tensors)) and not all(map(is_batched, pytree.tree_leaves(carry)))

