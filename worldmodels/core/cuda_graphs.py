"""Capture a whole unroll (forward and backward) in CUDA graphs once per static shape, then replay.

`GraphedUnroll(fn, params, inputs)` warms `fn(leaves, *inputs) -> tuple[Tensor]` up on a side
stream, captures its forward into one graph and, when gradients are needed, the backward w.r.t.
the inputs and the parameters into a second graph sharing the forward's memory pool. `leaves`
are detached aliases of `params` (same storage, so optimiser steps are seen by the replays) that
`fn` must compute with: autograd nodes the real parameters already have belong to the default
stream, and a captured backward may not reach them. `__call__` copies the new inputs into the
static buffers, replays, and returns copies of the outputs (the static buffers are overwritten by
the next replay); the parameters' gradients come back through autograd as usual.

The backward graph reads the activations the latest forward replay left in the pool: a second
forward of the same entry before the first one's backward would give wrong gradients, so it is
detected (a generation counter) and raises.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from worldmodels.core.strides import canonical


def no_autocast_cache():
    """The caller's autocast settings with its cache of cast weights off. A capture must not use that
    cache: a cast cached before (or during) the capture would be read by every replay, with the
    weights of that moment, and its memory freed when the caller's autocast region ends."""
    return torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), enabled=torch.is_autocast_enabled("cuda"),
                          cache_enabled=False)


class GraphedUnroll:
    def __init__(self, fn: Callable[..., tuple[torch.Tensor, ...]], params: Sequence[torch.Tensor],
                 inputs: Sequence[torch.Tensor], warmup: int = 2):
        self.static_inputs = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
        self.params = [p for p in params if p.requires_grad]
        leaves = [p.detach().requires_grad_() for p in self.params]
        self.differentiable = torch.is_grad_enabled() and (
            bool(self.params) or any(x.requires_grad for x in self.static_inputs))
        wrt = [x for x in self.static_inputs if x.requires_grad] + leaves
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), no_autocast_cache():
            for _ in range(warmup):  # cuBLAS handles, autotuning and allocator state before capture
                outputs = fn(leaves, *self.static_inputs)
                if self.differentiable:
                    self._grad(outputs, wrt, [torch.ones_like(o) for o in outputs])
        torch.cuda.current_stream().wait_stream(stream)
        self.forward_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.forward_graph, stream=stream), no_autocast_cache():
            self.static_outputs = fn(leaves, *self.static_inputs)
        if self.differentiable:
            self.static_grad_outputs = [torch.empty_like(o) for o in self.static_outputs]
            self.backward_graph = torch.cuda.CUDAGraph()
            with (torch.cuda.graph(self.backward_graph, pool=self.forward_graph.pool(), stream=stream),
                  no_autocast_cache()):
                self.static_grads = self._grad(self.static_outputs, wrt, self.static_grad_outputs)
        self.generation = 0

    @staticmethod
    def _grad(outputs, wrt, grad_outputs):
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if o.requires_grad]
        return torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True)

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.differentiable and torch.is_grad_enabled():
            return _Replay.apply(self, *inputs, *self.params)
        return self.replay_forward(inputs)

    def replay_forward(self, inputs) -> tuple[torch.Tensor, ...]:
        for static, x in zip(self.static_inputs, inputs):
            if static.data_ptr() != x.data_ptr():
                static.detach().copy_(x)
        self.forward_graph.replay()
        self.generation += 1
        return tuple(o.detach().clone() for o in self.static_outputs)


class _Replay(torch.autograd.Function):
    @staticmethod
    def forward(ctx, graphed: GraphedUnroll, *inputs_and_params):
        inputs = inputs_and_params[: len(graphed.static_inputs)]
        outputs = graphed.replay_forward(inputs)
        ctx.graphed, ctx.generation = graphed, graphed.generation
        return outputs

    @staticmethod
    def backward(ctx, *grad_outputs):
        graphed: GraphedUnroll = ctx.graphed
        if graphed.generation != ctx.generation:
            raise RuntimeError(
                "this unroll's CUDA graph was replayed again before its backward ran; "
                "its saved activations are gone. Run backward before the next forward of the same shape, "
                "or use backend='loop' for this call.")
        for static, g in zip(graphed.static_grad_outputs, grad_outputs):
            if g is None:
                static.zero_()
            else:
                static.copy_(g)
        graphed.backward_graph.replay()
        grads = iter(g.clone() if g is not None else None for g in graphed.static_grads)
        input_grads = [next(grads) if x.requires_grad else None for x in graphed.static_inputs]
        return (None, *input_grads, *grads)


class UnrollCache:
    """A bounded, least-recently-used map from a capture's signature to what a backend keeps for
    it (cudnn: the captured graphs). A module owns one, so captures go away with the module.

    Args:
        max_entries: how many entries are kept; the least recently used is dropped beyond it
            (a pending backward keeps its own graphs alive).
    """

    def __init__(self, max_entries: int = 16):
        self.max_entries = max_entries
        self._entries: OrderedDict = OrderedDict()

    def get(self, key):
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key, value):
        self._entries[key] = value
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._entries)

    def __deepcopy__(self, memo) -> UnrollCache:
        """An empty cache: a capture reads the storage of the module that made it, so a copy of the
        module must capture its own."""
        return UnrollCache(self.max_entries)


_outer = threading.local()


@contextlib.contextmanager
def inside_outer_graph():
    """Within this block unrolls are not captured on their own: a whole training step is being warmed
    up or captured as one graph (`train/graphed_update.py`), and a capture cannot nest in another."""
    before = getattr(_outer, "active", False)
    _outer.active = True
    try:
        yield
    finally:
        _outer.active = before


def captures_graphs(tensor: torch.Tensor) -> bool:
    """Whether an unroll on this tensor's device is captured in CUDA graphs: on CUDA, unless a whole
    step is captured around it (tests patch it, and `GraphedUnroll`, to run the capture path's
    composition on CPU). Not while torch.compile traces: the compiled graph holds the unroll's op as
    one node (torch.compile's own "reduce-overhead" mode graphs it), and dynamo cannot trace
    `torch.cuda.is_current_stream_capturing` (a non-tensor result: a graph break, an error under
    fullgraph=True)."""
    if torch.compiler.is_compiling():
        return False
    return tensor.is_cuda and not getattr(_outer, "active", False) and not torch.cuda.is_current_stream_capturing()


def replay_captured(cache: UnrollCache, key: tuple, unroll: Callable, groups: Sequence[dict[str, torch.Tensor]],
                    inputs: Sequence[torch.Tensor | None]) -> dict[str, torch.Tensor]:
    """`unroll(groups, inputs) -> dict of tensors`, captured in CUDA graphs once per signature (in
    `cache`, under `key` plus everything a capture bakes in: the inputs' shapes / dtypes /
    requires_grad, grad and autocast mode, the parameters' storage), then replayed. `groups`: the
    parameters by name (e.g. the weights, the policy's), handed to `unroll` as dicts of the same
    names, the trained ones swapped for the graph's leaves; `inputs` may hold None (passed through)."""
    params = [t for group in groups for t in group.values()]
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
            regrouped, at = [], 0
            for group in groups:
                regrouped.append(dict(zip(group, current[at:at + len(group)])))
                at += len(group)
            full = [None] * len(inputs)
            for i, t in zip(present, static):
                full[i] = t
            out = unroll(regrouped, full)
            names[:] = list(out)
            return tuple(out.values())

        entry = cache.put(key, (GraphedUnroll(run, [params[i] for i in trained], tensors), names))
    graphed, names = entry
    return dict(zip(names, graphed(*tensors)))
