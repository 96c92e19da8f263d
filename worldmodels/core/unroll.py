"""Drivers that unroll a step function over time: `loop` (reference) and `scan` (compile-friendly).

A step is `step(carry, x, params) -> (carry, y)`; `carry`, `x`, `y` and `params` are pytrees
(tuples/dicts) of tensors. `xs` are time-major, [T, ...]; the result is `(final carry, ys[T, ...])`.
`params` are the tensors the step closes over (weights); they are passed explicitly so the scan
driver can un-alias them before the body closes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._higher_order_ops.scan import scan
from torch.utils import _pytree as pytree

from worldmodels.core.strides import canonical, is_canonical

Step = Callable[[Any, Any, Any], tuple[Any, Any]]


def loop_unroll(step: Step, carry: Any, xs: Any, params: Any = ()) -> tuple[Any, Any]:
    """The reference: a Python loop over t, outputs stacked along dim 0."""
    steps = pytree.tree_leaves(xs)[0].shape[0]
    ys = []
    for t in range(steps):
        carry, y = step(carry, pytree.tree_map(lambda v: v[t], xs), params)
        ys.append(y)
    return carry, pytree.tree_map(lambda *v: torch.stack(v), *ys)


def unalias(tensor: torch.Tensor) -> torch.Tensor:
    """A clone of a view (e.g. one layer's weight inside cuDNN's flat buffer), else the tensor.

    The scan tracer rejects inputs that alias each other; cloning is differentiable, so gradients
    still reach the flat buffer."""
    if tensor._base is not None or not is_canonical(tensor):
        return tensor.clone(memory_format=torch.contiguous_format)
    return tensor


def scan_unroll(step: Step, carry: Any, xs: Any, params: Any = ()) -> tuple[Any, Any]:
    """The same unroll under `torch._higher_order_ops.scan` (eager, and torch.compile fullgraph)."""
    params = pytree.tree_map_only(torch.Tensor, unalias, params)  # None leaves: absent biases
    carry = pytree.tree_map(canonical, carry)
    xs = pytree.tree_map(canonical, xs)

    def body(carry, x):
        new_carry, y = step(carry, x, params)
        # scan outputs may not alias each other or the carry: copy a y that is also carried.
        carried = {id(c) for c in pytree.tree_leaves(new_carry)}
        y = pytree.tree_map(lambda v: v.clone() if id(v) in carried else v, y)
        return new_carry, y

    return scan(body, carry, xs)


DRIVERS: dict[str, Callable[..., tuple[Any, Any]]] = {"loop": loop_unroll, "scan": scan_unroll}
