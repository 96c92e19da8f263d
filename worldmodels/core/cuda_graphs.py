"""Capture a whole unroll (forward and backward) in CUDA graphs once per static shape, then replay.

`GraphedUnroll(fn, params, inputs)` warms `fn(leaves, *inputs) -> tuple[Tensor]` up on a side
stream, captures its forward into one graph and, when gradients are needed, the backward w.r.t.
the inputs and the parameters into a second graph sharing the forward's memory pool. `leaves`
are detached aliases of `params` (same storage, so optimiser steps are seen by the replays) that
`fn` must compute with: autograd nodes the real parameters already have belong to the default
stream, and a captured backward may not reach them. `__call__` copies the new inputs into the
static buffers and replays; the parameters' gradients come back through autograd as usual.

Inputs read through a table. A no-grad capture may instead read some inputs where the caller's
tensors are: `GraphedUnroll(indirect=...)` names inputs that `fn` reads only through kernels that
ask `graph_input` for them (our Triton launches: the RSSM kernel's initial state and noise, the
action share). While the graph is captured those kernels get the input's slot in an
`InputTable` (an int64 device tensor) and load the address from it; a replay writes the call's
addresses there when they differ from the last ones (one small host-to-device copy) and copies
nothing, where copying the inputs into the capture's buffers cost a large imagination tens of MB per
call, in GPU and host time (docs/kernels.md, "Measurements behind the code's choices"). The kernels
then read the caller's tensors when the replay runs, in stream order, as an eager launch would; an
input they did not claim, or one whose address is not 16-byte aligned (the capture's kernels assume
it), is copied as before. A claimed input's buffer is filled with NaN
after the capture, so that a read of it that bypasses the table shows (tests/core/test_graph_inputs.py).

What a replay returns is the caller's to keep. A differentiable call returns copies of the
outputs (its backward graph reads the pool the next forward overwrites). A no-grad call returns
the graph's own output buffers, without a copy, from a capture none of whose earlier outputs is
still referenced (a view, or a tensor autograd saved, counts): the caller's tensors are never
overwritten, and in the usual pattern, where a call's outputs are dropped or replaced by the next
call's, one or two captures serve every call. While every capture's outputs are still held
(`max_forward_captures`), calls replay one more capture and copy its outputs. At V3-12m imagination
(N1024 H15) the copies were ~190 MB per call (`python -m benchmarks.triton_rssm`, docs/kernels.md).

The backward graph reads the activations the latest forward replay left in the pool: a second
forward of the same entry before the first one's backward would give wrong gradients, so it is
detected (a generation counter) and raises.

Captures that fail. Every kernel a capture launches must be compiled and loaded before it: a
Triton compile or module load inside a capture invalidates it ("operation failed due to a previous
error during capture"), and a kernel that reads its inputs through the table is another
specialisation than one that reads them directly. So the eager warm-up runs on clones of the inputs
(fresh allocations, aligned as the capture's buffers are) and, for a no-grad capture, reads them
through a table of its own (`reading_through`): the capture then launches only kernels the warm-up
compiled. A capture that fails anyway (`capturing`) ends the stream's capture, heals the CUDA
generator the failed capture left in capture mode (`torch_fixes.failed_capture_leaves_rng_capturing`)
and raises `CaptureFailed`; `replay_captured` then warns once naming the op and runs the call
eagerly, tries one more capture on the next call, and after a second failure stays eager for that
signature.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from worldmodels.core import torch_fixes
from worldmodels.core.strides import canonical, is_canonical


def no_autocast_cache():
    """The caller's autocast settings with its cache of cast weights off. A capture must not use that
    cache: a cast cached before (or during) the capture would be read by every replay, with the
    weights of that moment, and its memory freed when the caller's autocast region ends."""
    return torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), enabled=torch.is_autocast_enabled("cuda"),
                          cache_enabled=False)


def random_state_kept(tensors: Sequence[torch.Tensor]):
    """Random draws inside leave torch's generators (CPU, and the CUDA devices of `tensors`) as they
    were. A capture's warm-up runs the function eagerly: without this its draws would advance the
    caller's stream, so a call that captures (the first of a shape, or a second capture made while the
    first one's outputs are held) would sample other noise than the same call run eagerly from the
    same seed. The capture itself draws nothing eagerly: its replays take the generator's offset then."""
    devices = sorted({t.device.index or 0 for t in tensors if t.is_cuda})
    capturing = bool(devices) and torch.cuda.is_current_stream_capturing()  # a CPU build can't ask
    return torch.random.fork_rng(devices=devices, enabled=not capturing)


class CaptureFailed(RuntimeError):
    """A CUDA-graph capture failed; the stream and the CUDA generators were restored (`capturing`)."""


@contextlib.contextmanager
def capturing(graph: torch.cuda.CUDAGraph, what: str, *, stream: torch.cuda.Stream, pool=None):
    """`torch.cuda.graph(graph, pool=, stream=)` for op `what`, in thread-local capture mode (an
    unsafe CUDA call of another thread, a logger's or a collector's, does not invalidate it). When the
    capture fails: the stream's capture is ended, the device's CUDA generator is taken out of the
    capture mode a failed capture leaves it in (where this torch needs it, `heal_generator`), and
    `CaptureFailed` names `what` and the error."""
    try:
        with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
            yield
    except Exception as err:  # torch's AcceleratorError, Triton's RuntimeError, a host sync's error
        _end_capture(graph, stream)
        if torch_fixes.failed_capture_leaves_rng_capturing():
            heal_generator(stream.device)
        raise CaptureFailed(f"{what}: the CUDA-graph capture failed ({type(err).__name__}: {err})") from err


def _end_capture(graph, stream) -> None:
    """The stream out of capture mode (`torch.cuda.graph` ends it on the way out unless it failed
    before that)."""
    with torch.cuda.stream(stream):
        if torch.cuda.is_current_stream_capturing():
            with contextlib.suppress(Exception):
                graph.capture_end()


def heal_generator(device: torch.device) -> None:
    """pytorch#171263: a capture whose end fails never runs its generators' capture epilogue, so
    the device's default CUDA generator stays in capture mode and every later random draw raises
    "Offset increment outside graph capture encountered unexpectedly". A tiny capture that succeeds
    runs the prologue and the epilogue on the same generator state: it leaves capture mode with its
    seed and offset as they were (a capture's draws only count its intragraph offset)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.device(device):
        stream = torch.cuda.Stream()
        buffer = torch.empty(1, device=device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.graph(graph, stream=stream):
            buffer.zero_()
        torch.cuda.current_stream().wait_stream(stream)


class InputTable:
    """The device addresses of a capture's inputs that its kernels read through a table (see the
    module docstring): `slots` [n] int64, one per input of `statics` (the capture's buffers).

    Args:
        statics: the capture's buffers of the inputs that may be read through the table.
    """

    ALIGN = 16  # bytes: Triton specialises pointer arguments on it, and the kernels hint it on the loaded ones

    def __init__(self, statics: Sequence[torch.Tensor]):
        self.statics = list(statics)
        self.slots = torch.tensor([s.data_ptr() for s in self.statics], dtype=torch.int64,
                                  device=self.statics[0].device)
        self.claimed: set[int] = set()
        self._written = [s.data_ptr() for s in self.statics]  # what `slots` holds

    def slot(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """The [1] slot holding `tensor`'s address (and the slot is claimed: replays write it), or None
        when `tensor` is not one of the statics: the same address and dtype, and, row-major, the same
        elements (a reshaped view, as a launch's flattened noise, is the same bytes)."""
        for i, s in enumerate(self.statics):
            if (s.data_ptr() == tensor.data_ptr() and s.dtype == tensor.dtype and s.numel() == tensor.numel()
                    and is_canonical(tensor)):
                self.claimed.add(i)
                return self.slots[i:i + 1]
        return None

    def poison(self) -> None:
        """NaN into the claimed floating buffers: after the capture nothing may read them directly."""
        for i in self.claimed:
            if self.statics[i].is_floating_point():
                self.statics[i].detach().fill_(float("nan"))

    def point(self, inputs: Sequence[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Write this call's addresses (`inputs`: one per static, the shapes and dtypes of the capture's)
        and return the (static, input) pairs still to be copied: the unclaimed ones, and claimed ones
        whose address or strides the kernels cannot take (their slot then holds the static's)."""
        addresses, copies = [], []
        for i, (s, x) in enumerate(zip(self.statics, inputs)):
            if i in self.claimed and x.data_ptr() % self.ALIGN == 0 and x.stride() == s.stride():
                addresses.append(x.data_ptr())
                continue
            addresses.append(s.data_ptr())
            if s.data_ptr() != x.data_ptr():
                copies.append((s.detach(), x.detach()))
        if addresses != self._written:  # (the same addresses as the last call's: often, and the copy's host time saved)
            # a pageable source: the copy stages it before returning, so the list may go (CUDA's async memcpy rules)
            self.slots.copy_(torch.tensor(addresses, dtype=torch.int64), non_blocking=True)
            self._written = addresses
        return copies


_local = threading.local()  # this thread's `reading_through` table and `inside_outer_graph` flag


@contextlib.contextmanager
def _thread_setting(name: str, value, default):
    """`_local.<name>` = value within the block, then what it was (`default` when unset)."""
    before = getattr(_local, name, default)
    setattr(_local, name, value)
    try:
        yield
    finally:
        setattr(_local, name, before)


def reading_through(table: InputTable | None):
    """Within this block (a capture), launches that ask `graph_input` read `table`'s inputs through it."""
    return _thread_setting("table", table, None)


def graph_input(tensor: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """What a kernel launch passes for an input it reads: (tensor, False); or, while a capture reads
    this tensor through its table (`reading_through`), (its [1] int64 slot, True), from which the
    kernel loads the address at every replay, aligned to `InputTable.ALIGN` bytes."""
    table = getattr(_local, "table", None)
    slot = None if table is None else table.slot(tensor)
    return (tensor, False) if slot is None else (slot, True)


class _ForwardCapture:
    """One captured forward: its graph, static inputs and outputs, and the table (None: none) through
    which it reads the inputs at positions `through`. `in_use()`: whether an output
    handed out by a replay (`handed_out`: aliases, no copy) is still referenced anywhere, a view or
    a tensor saved by autograd included: the storages' use counts above their idle counts, taken
    right after the capture, when only this object holds them."""

    def __init__(self, graph, static_inputs: list[torch.Tensor], static_outputs: tuple[torch.Tensor, ...],
                 table: InputTable | None = None, through: Sequence[int] = ()):
        self.graph, self.static_inputs, self.static_outputs = graph, static_inputs, static_outputs
        self.table, self.through = table, list(through) if table is not None else []
        self._direct = [i for i in range(len(static_inputs)) if i not in self.through]
        self._storages = [o.untyped_storage() for o in static_outputs]
        self._idle = [_storage_users(s) for s in self._storages]

    def in_use(self) -> bool:
        return any(_storage_users(s) > idle for s, idle in zip(self._storages, self._idle))

    def replay(self, inputs) -> None:
        # the new inputs in one foreach launch (a copy_ per input costs host time each, before the
        # replay can start), the table's first
        pairs = self.table.point([inputs[i] for i in self.through]) if self.table is not None else []
        for i in self._direct:
            static, x = self.static_inputs[i], inputs[i]
            if static.data_ptr() != x.data_ptr():
                pairs.append((static.detach(), x.detach()))
        if pairs:
            torch._foreach_copy_([s for s, _ in pairs], [x for _, x in pairs])
        self.graph.replay()

    def handed_out(self) -> tuple[torch.Tensor, ...]:
        return tuple(o.detach() for o in self.static_outputs)


def _storage_users(storage: torch.UntypedStorage) -> int:
    return torch._C._storage_Use_Count(storage._cdata)


def hands_out_outputs() -> bool:
    """Whether no-grad replays may return their graph's outputs without a copy: it needs the
    storages' use counts (torch's private `_storage_Use_Count`, which torch.compile's CUDA graph
    trees use the same way); without it every replay copies its outputs, as before."""
    return hasattr(torch._C, "_storage_Use_Count")


class GraphedUnroll:
    """Args:
        fn: `fn(leaves, *inputs) -> tuple of tensors`, the function captured.
        params: the parameters `fn` reads; those that require gradients get leaves.
        inputs: example inputs of the static shapes (cloned into the first capture's buffers).
        warmup: eager runs on the side stream before the first capture.
        max_forward_captures: no-grad captures whose outputs are handed out without a copy; one
            more, which copies them, serves calls while every one of these is still in use.
        indirect: positions of the inputs that `fn` reads only through launches that ask
            `graph_input` for them: a no-grad capture reads those the launches claim through its
            `InputTable` instead of copying them (ignored when gradients are needed).
        what: the op's name in the `CaptureFailed` a failed capture raises.
    """

    def __init__(self, fn: Callable[..., tuple[torch.Tensor, ...]], params: Sequence[torch.Tensor],
                 inputs: Sequence[torch.Tensor], warmup: int = 2, max_forward_captures: int = 2,
                 indirect: Sequence[int] = (), what: str = "unroll"):
        self.fn, self.what = fn, what
        self.params = [p for p in params if p.requires_grad]
        self.leaves = [p.detach().requires_grad_() for p in self.params]
        self.differentiable = torch.is_grad_enabled() and (
            bool(self.params) or any(x.requires_grad for x in inputs))
        self.max_forward_captures = max_forward_captures if hands_out_outputs() else 0
        # a differentiable capture's backward graph may read its inputs: those keep their buffers
        self.indirect = [] if self.differentiable else sorted(set(indirect))
        self._warm(inputs, warmup)
        first = self._capture(inputs)
        # no grad: captures handing out their outputs, then the one that copies them (made when needed)
        self.captures = [first] if self.max_forward_captures and not self.differentiable else []
        self.copying = None if self.captures else first
        if self.differentiable:
            wrt = [x for x in first.static_inputs if x.requires_grad] + self.leaves
            self.static_grad_outputs = [torch.empty_like(o) for o in first.static_outputs]
            self.backward_graph = torch.cuda.CUDAGraph()
            with (capturing(self.backward_graph, f"{self.what} (backward)", pool=first.graph.pool(),
                            stream=self._stream),
                  no_autocast_cache()):
                self.static_grads = self._grad(first.static_outputs, wrt, self.static_grad_outputs)
        self.generation = 0

    def _warm(self, inputs, runs: int) -> None:
        """cuBLAS handles, autotuning, allocator state and every kernel the capture launches, compiled
        and loaded, before it, on the captures' stream; the caller's random stream as it was
        (`random_state_kept`). The runs take clones of the inputs, as the capture does (a caller's view
        at an offset would be another alignment, so another Triton specialisation), read through a
        table of their own where the capture reads through one (another specialisation too)."""
        self._stream = getattr(self, "_stream", None) or torch.cuda.Stream()
        self._stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self._stream), no_autocast_cache(), random_state_kept(inputs):
            for _ in range(runs):
                static = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
                table = InputTable([static[i] for i in self.indirect]) if self.indirect else None
                with reading_through(table):
                    outputs = self.fn(self.leaves, *static)
                if self.differentiable:
                    wrt = [x for x in static if x.requires_grad] + self.leaves
                    self._grad(outputs, wrt, [torch.ones_like(o) for o in outputs])
        torch.cuda.current_stream().wait_stream(self._stream)

    def _capture(self, inputs) -> _ForwardCapture:
        """The forward captured in a graph of its own (its own memory pool), on buffers cloned from `inputs`."""
        static_inputs = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
        table = InputTable([static_inputs[i] for i in self.indirect]) if self.indirect else None
        graph = torch.cuda.CUDAGraph()
        with capturing(graph, self.what, stream=self._stream), no_autocast_cache(), reading_through(table):
            static_outputs = self.fn(self.leaves, *static_inputs)
        if table is None or not table.claimed:
            return _ForwardCapture(graph, static_inputs, static_outputs)
        table.poison()
        return _ForwardCapture(graph, static_inputs, static_outputs, table, self.indirect)

    @staticmethod
    def _grad(outputs, wrt, grad_outputs):
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if o.requires_grad]
        return torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True)

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.differentiable and torch.is_grad_enabled():
            return _Replay.apply(self, *inputs, *self.params)
        return self.replay_forward(inputs)

    def replay_forward(self, inputs) -> tuple[torch.Tensor, ...]:
        """Outputs the caller owns: a free capture's own buffers (no copy), or, while the outputs of
        every capture are still in use, copies of the copying capture's (the static buffers are
        overwritten by that capture's next replay)."""
        capture = next((c for c in self.captures if not c.in_use()), None)
        if capture is None and 0 < len(self.captures) < self.max_forward_captures:
            self._warm(inputs, 1)
            capture = self._capture(inputs)
            self.captures.append(capture)
        if capture is not None:
            capture.replay(inputs)
            return capture.handed_out()
        if self.copying is None:
            self._warm(inputs, 1)
            self.copying = self._capture(inputs)
        self.copying.replay(inputs)
        self.generation += 1
        return tuple(o.detach().clone() for o in self.copying.static_outputs)


class _Replay(torch.autograd.Function):
    @staticmethod
    def forward(ctx, graphed: GraphedUnroll, *inputs_and_params):
        inputs = inputs_and_params[: len(graphed.copying.static_inputs)]
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
        input_grads = [next(grads) if x.requires_grad else None for x in graphed.copying.static_inputs]
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

    def values(self) -> list:
        return list(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def __deepcopy__(self, memo) -> UnrollCache:
        """An empty cache: a capture reads the storage of the module that made it, so a copy of the
        module must capture its own."""
        return UnrollCache(self.max_entries)


def inside_outer_graph():
    """Within this block unrolls are not captured on their own: a whole training step is being warmed
    up or captured as one graph (`train/graphed_update.py`), and a capture cannot nest in another."""
    return _thread_setting("outer", True, False)


def captures_graphs(tensor: torch.Tensor) -> bool:
    """Whether an unroll on this tensor's device is captured in CUDA graphs: on CUDA, unless a whole
    step is captured around it (tests patch it, and `GraphedUnroll`, to run the capture path's
    composition on CPU). Not while torch.compile traces: the compiled graph holds the unroll's op as
    one node (torch.compile's own "reduce-overhead" mode graphs it), and dynamo cannot trace
    `torch.cuda.is_current_stream_capturing` (a non-tensor result: a graph break, an error under
    fullgraph=True)."""
    if torch.compiler.is_compiling():
        return False
    return tensor.is_cuda and not getattr(_local, "outer", False) and not torch.cuda.is_current_stream_capturing()


def replay_captured(cache: UnrollCache, key: tuple, unroll: Callable, groups: Sequence[dict[str, torch.Tensor]],
                    inputs: Sequence[torch.Tensor | None], indirect: Sequence[int] = (),
                    validate: Callable[[], None] | None = None, what: str = "unroll") -> dict[str, torch.Tensor]:
    """`unroll(groups, inputs) -> dict of tensors`, captured in CUDA graphs once per signature (in
    `cache`, under `key` plus everything a capture bakes in: the inputs' shapes / dtypes /
    requires_grad, grad and autocast mode, the parameters' storage), then replayed. `groups`: the
    parameters by name (e.g. the weights, the policy's), handed to `unroll` as dicts of the same
    names, the trained ones swapped for the graph's leaves; `inputs` may hold None (passed through).
    `indirect`: positions in `inputs` that `unroll` reads only through `graph_input` launches
    (`GraphedUnroll`'s). `validate()`, when given, runs before a capture is made (raising refuses
    it): checks of the parameters that the key makes redundant on a hit, where the same addresses
    are the same tensors (CUDA's unified addressing puts each device's memory at addresses of its own;
    only a storage reinterpreted in place as another dtype would keep its address).

    A capture that fails (`CaptureFailed`: the stream and generators already restored) runs this call
    eagerly after a one-time warning naming the op (`what`); the next call of the signature tries once more
    (the eager call has compiled whatever was missing), and after `CAPTURE_ATTEMPTS` failures its
    calls stay eager."""
    params = [t for group in groups for t in group.values()]
    present = [i for i, t in enumerate(inputs) if t is not None]
    tensors = [canonical(inputs[i]) for i in present]
    key = (*key, tuple((t.shape, t.dtype, t.requires_grad) for t in tensors), torch.is_grad_enabled(),
           torch.is_autocast_enabled("cuda"), tuple(p.data_ptr() for p in params))
    entry = cache.get(key)
    if isinstance(entry, _Failed) and entry.attempts >= CAPTURE_ATTEMPTS:
        return unroll([dict(group) for group in groups], list(inputs))
    if entry is None or isinstance(entry, _Failed):
        attempts = entry.attempts if entry is not None else 0
        if validate is not None:
            validate()
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

        through = [present.index(i) for i in indirect if i in present]
        try:
            entry = (GraphedUnroll(run, [params[i] for i in trained], tensors, indirect=through, what=what), names)
        except CaptureFailed as err:
            return _eager_after_failure(cache, key, attempts + 1, err, unroll, groups, inputs)
        cache.put(key, entry)
    graphed, names = entry
    try:
        outputs = graphed(*tensors)  # a no-grad call may capture once more (its outputs still held)
    except CaptureFailed as err:
        return _eager_after_failure(cache, key, CAPTURE_ATTEMPTS, err, unroll, groups, inputs)
    return dict(zip(names, outputs))


CAPTURE_ATTEMPTS = 2
"""Captures a signature gets before its calls stay eager (`replay_captured`)."""


class _Failed:
    """A cache entry: this signature's captures failed `attempts` times."""

    def __init__(self, attempts: int):
        self.attempts = attempts


_warned_failures: set[str] = set()


def _eager_after_failure(cache, key, attempts: int, err: CaptureFailed, unroll, groups, inputs):
    op = str(err).split(":", 1)[0]
    if op not in _warned_failures:
        _warned_failures.add(op)
        warnings.warn(f"{err}; this call runs eagerly"
                      + (", and so will every later one of its shape" if attempts >= CAPTURE_ATTEMPTS else
                         "; the next call of its shape tries to capture once more"), stacklevel=3)
    cache.put(key, _Failed(attempts))
    return unroll([dict(group) for group in groups], list(inputs))
