"""A CPU stand-in for `core/cuda_graphs.GraphedUnroll` (the `graphs_on_cpu` fixture in conftest)."""

from __future__ import annotations

import torch

from worldmodels.core import cuda_graphs


class EagerGraph:
    """Stands in for GraphedUnroll on CPU: runs the function it would capture, on the real
    parameters, so the capture path's composition (weights swapped for the graph's leaves,
    output naming, cache keys) is checked without a GPU. `made` counts the captures.

    Inputs a no-grad capture reads through its `InputTable` (`indirect`) are handed to the function
    as buffers of their own, as a capture's, with the table holding the caller's addresses, as a
    replay writes them. The first call finds which ones the launches claim (a capture's job); from
    the second call on those buffers are NaN, so a read that bypasses the table shows."""
    made = 0

    def __init__(self, fn, params, inputs, indirect=(), what="unroll"):
        self.fn, self.params = fn, params
        differentiable = torch.is_grad_enabled() and (bool(params) or any(x.requires_grad for x in inputs))
        self.indirect = [] if differentiable else list(indirect)
        self.claimed = None if self.indirect else set()
        EagerGraph.made += 1

    def __call__(self, *inputs):
        if not self.indirect:
            return self.fn(self.params, *inputs)
        statics = [inputs[i].detach().clone() for i in self.indirect]
        table = cuda_graphs.InputTable(statics)
        table.claimed = set(range(len(statics))) if self.claimed is None else set(self.claimed)
        if self.claimed is not None:
            table.poison()
        for static, x in table.point([inputs[i] for i in self.indirect]):
            static.copy_(x)
        table.claimed = set()
        run = list(inputs)
        for slot, i in enumerate(self.indirect):
            run[i] = statics[slot]
        with cuda_graphs.reading_through(table):
            out = self.fn(self.params, *run)
        if self.claimed is None:
            self.claimed = set(table.claimed)
        return out
