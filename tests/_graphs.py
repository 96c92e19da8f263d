"""A CPU stand-in for `core/cuda_graphs.GraphedUnroll` (the `graphs_on_cpu` fixture in conftest)."""

from __future__ import annotations


class EagerGraph:
    """Stands in for GraphedUnroll on CPU: runs the function it would capture, on the real
    parameters, so the capture path's composition (weights swapped for the graph's leaves,
    output naming, cache keys) is checked without a GPU. `made` counts the captures."""
    made = 0

    def __init__(self, fn, params, inputs):
        self.fn, self.params = fn, params
        EagerGraph.made += 1

    def __call__(self, *inputs):
        return self.fn(self.params, *inputs)
