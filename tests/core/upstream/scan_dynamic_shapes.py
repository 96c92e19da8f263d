"""Eager `scan` over a block-diagonal recurrence, run with one width and then another in one process
(two models of different sizes), in plain torch. Prints one JSON line: whether forward and
backward run and the weights' gradients match the Python loop for every width, without and with
`static_scan_shapes`.

Eager scan runs under a `torch.compile` of its own, shared by all calls. The second width
recompiles with automatic dynamic shapes; the block weight [G, D/G, D/G] against the [B, D] carry
makes the shape env write D as 2*s, and scan's autograd partitioner refuses that size at its
forward/backward boundary ("Invalid HopPartitionedGraph ... SymInt with basic symbols ... 2*s").

Before torch 2.13 eager scan has another bug: it drops closed-over weights' gradients unless the
initial carry requires grad (pytorch#184528, gate `eager_scan_needs_grad_carry`, its own reproducer).
Where that gate is on, both arms here apply its fix, so that this script sees this bug alone.
"""

import json

import torch
from torch._higher_order_ops.scan import scan

from worldmodels.core.torch_fixes import carry_requiring_grad, eager_scan_needs_grad_carry

BLOCKS, BATCH, STEPS = 2, 3, 4


def gradients_match(width: int) -> bool:
    """Forward + backward of a scan of width `width`; False when the partitioner refuses it or the
    gradients are wrong (any other error propagates: a new failure is not this bug)."""
    torch.manual_seed(width)
    w = torch.randn(BLOCKS, width // BLOCKS, width // BLOCKS, requires_grad=True)
    scale = torch.randn(width, requires_grad=True)
    xs = torch.randn(STEPS, BATCH, width)

    def body(h, x):
        mixed = torch.einsum("bgi,gio->bgo", (h + x).unflatten(-1, (BLOCKS, -1)), w).flatten(-2)
        new = torch.tanh(mixed * scale)
        return new.clone(), new.clone()

    h, ys = torch.zeros(BATCH, width), []
    for t in range(STEPS):
        h, y = body(h, xs[t])
        ys.append(y)
    expected = torch.autograd.grad(torch.stack(ys).square().sum(), [w, scale])
    init = torch.zeros(BATCH, width)
    if eager_scan_needs_grad_carry():  # the other bug's fix (module docstring)
        init = carry_requiring_grad(init, [w, scale])
    try:
        _, ys = scan(body, init, xs)
        got = torch.autograd.grad(ys.square().sum(), [w, scale])
    except Exception as e:  # torch's RuntimeError, wrapped in a dynamo error type
        if "HopPartitionedGraph" not in str(e):
            raise
        return False
    return all(torch.allclose(g, e, atol=1e-5) for g, e in zip(got, expected))


def every_width_works(context) -> bool:
    torch._dynamo.reset()  # a fresh trace cache: the first width is the first scan of the process
    results = []
    for width in (8, 12):  # all of them run, so a failure cannot hide a later width
        with context():
            results.append(gradients_match(width))
    return all(results)


if __name__ == "__main__":
    import contextlib

    from worldmodels.core.torch_fixes import static_scan_shapes

    print(json.dumps({"plain": every_width_works(contextlib.nullcontext),
                      "with_fix": every_width_works(static_scan_shapes)}))
