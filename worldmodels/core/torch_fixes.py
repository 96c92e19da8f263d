"""Workarounds for torch bugs, behind version gates where a torch release can make them unneeded:
wrong `scan` gradients, `scan` traces that break once shapes change, a norm that misses its fused
kernel in mixed precision, `module.compile()` that compiles nothing for torch's own modules, and a
failed CUDA-graph capture that breaks sampling.

Applied on import of the recurrent core, only on the torch versions that need them. The
plain-torch reproducers in `tests/core/test_torch_upstream.py` run without these fixes and fail
loudly the day an upgrade changes the answer, which is the signal to move a gate.

- pytorch#153679 (inductor, seen on 2.13.0; fixed upstream by pytorch#193960, after 2.13.0):
  inductor lowers scan's backward to a `while_loop` whose body subgraph inherits the outer
  backward graph's donated-buffer indices, so a carried gradient accumulator is updated in place
  and then overwritten by an unrelated buffer of the same size. The fix sets the subgraph's
  `bw_donated_idxs` to None; we backport it on 2.13.x.
- pytorch#184528 (eager scan, torch < 2.13; fixed by pytorch#185332): wrong gradients for
  weights the body closes over when the initial carry does not require grad. The scan ops make
  the carry require grad in a traceable way (`carry_requiring_grad`).
- torch < 2.13 under torch.compile: inductor's scan gradients were wrong for nearly every
  parameter even with donated buffers off (torch 2.11, CUDA), and aot_eager raised "scan might
  be aliasing the input or the output". There `scan` under compile is refused and `auto` uses
  `loop` (`scan_compiles_correctly`).
- scan with shapes that change within a process (seen on 2.13.0, gated on for every version until
  the reproducer passes; no upstream issue found, `tests/core/upstream/scan_dynamic_shapes.py` is the
  one to file): eager `scan` runs under a `torch.compile` of its own, shared by every call in the
  process, so a call with other sizes (a model of another width) recompiles with dynamo's
  automatic dynamic shapes. When the body ties sizes together (a block weight [G, D/G, D/G]
  against a [B, D] carry), the shape env rewrites D as 2*s, dynamo lifts that expression as an
  input of the body, and scan's autograd partitioner, which recomputes only the complex sizes the
  body computes itself, saves it for backward and then refuses it: "Invalid HopPartitionedGraph
  ... SymInt with basic symbols ... 2*s". A float that changes between calls turns dynamic the
  same way and fails the trace with "Could not guard on data-dependent expression" (block_gauss's
  norm under gradcheck). `core/unroll.scan_unroll` runs eager scan within `static_scan_shapes()`,
  so every new set of shapes is traced static, one trace per model shape as on the first call
  (`scan_needs_static_shapes`). Under a caller's torch.compile the caller's `dynamic=` governs:
  compile with `dynamic=False` there when one process compiles models of several sizes.
- pytorch#167308 (every version so far; a CUDA kernel for it is open as pytorch#195638):
  `rms_norm` with a bf16 input and an fp32 weight, what every RMSNorm after a Linear or conv
  sees under bf16 autocast, cannot dispatch to the fused kernel and runs as ~8 composite kernels
  forward and more backward, warning each time. torch 2.12 put `rms_norm` on autocast's fp32
  list instead (pytorch#174824), which fuses it in fp32 at the cost of fp32 copies of every
  activation (pytorch#188955). `rms_norm` here casts the weight to the input's dtype and runs
  outside autocast while `rms_norm_fuses_mixed_dtypes` is False; `models/layers.RMSNorm` and the
  RSSM ops' reference layers both call it.
- pytorch#150915 (every version so far; a fix is proposed in pytorch#185722): `module.compile()`
  installs `torch.compile(module._call_impl)`, and where the module's `forward` is torch's own code
  too (`nn.Sequential`, `nn.Linear`, ...), Dynamo finds no frame it may trace and the module runs
  eager with no warning: the backend is never called. `torch.compile(module)` works but wraps the
  module (its state_dict keys gain `_orig_mod.`). `compile_module` enters the compiled call through a
  function of ours instead, on every version: one code object per module also keeps Dynamo's 8
  compiled variants per code object from being shared by every module.
- pytorch#171263 (torch < 2.12; fixed by pytorch#176752, per-capture RNG state): a CUDA-graph
  capture whose end fails (an invalidated capture) skips its generators' capture epilogue, so the
  device's default generator stays in capture mode and every later random draw raises "Offset
  increment outside graph capture encountered unexpectedly". `core/cuda_graphs.capturing` heals it
  after a failed capture (`failed_capture_leaves_rng_capturing`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.util
import sys

import torch
import torch.nn.functional as F

TORCH_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


def scan_compiles_correctly(version: tuple[int, int] = TORCH_VERSION) -> bool:
    """Whether scan's gradients under torch.compile are right on this torch (with the fixes here)."""
    return version >= (2, 13)


def eager_scan_needs_grad_carry(version: tuple[int, int] = TORCH_VERSION) -> bool:
    """pytorch#184528: before 2.13, eager scan drops closed-over weights' gradients unless the
    initial carry requires grad."""
    return version < (2, 13)


def carry_requiring_grad(carry: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    """`carry`, made part of the autograd graph of `params` without changing its value.

    Adds the sum of an empty slice of a weight (exactly 0, never NaN): traceable by Dynamo,
    unlike `requires_grad_()`, and free of the 0 * inf hazard of `0 * w.sum()`."""
    weight = next((p for p in params if p.requires_grad), None)
    if weight is None or carry.requires_grad:
        return carry
    return carry + weight.reshape(-1)[:0].sum().to(carry.dtype)


def scan_needs_static_shapes(version: tuple[int, int] = TORCH_VERSION) -> bool:
    """Whether scan's autograd refuses the dynamic sizes that a recompile for new shapes gives it
    (`tests/core/upstream/scan_dynamic_shapes.py`), so eager scan must trace every shape static."""
    return True


def static_scan_shapes() -> contextlib.AbstractContextManager:
    """A context within which eager `scan` traces new shapes static, where `scan_needs_static_shapes`.

    Only outside torch.compile: there scan runs on the caller's trace (and its `dynamic=`), and a
    config change cannot be traced."""
    if not scan_needs_static_shapes() or torch.compiler.is_compiling():
        return contextlib.nullcontext()
    return torch._dynamo.config.patch(automatic_dynamic_shapes=False)


def rms_norm_fuses_mixed_dtypes(version: tuple[int, int] = TORCH_VERSION) -> bool:
    """pytorch#167308: whether `rms_norm` runs its fused CUDA kernel when the input and the weight
    differ in dtype (no torch release does yet)."""
    return False


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`F.rms_norm` over the last dim that keeps torch's fused kernel in mixed precision: a bf16
    input with an fp32 weight (what a norm after a Linear sees under bf16 autocast) runs in the
    input's dtype on a cast of the weight, outside autocast, while `rms_norm_fuses_mixed_dtypes` is
    False (pytorch#167308). The statistics accumulate in fp32 either way; the weight's gradient
    comes back in its own dtype through the cast."""
    if x.dtype == weight.dtype or rms_norm_fuses_mixed_dtypes():
        return F.rms_norm(x, x.shape[-1:], weight, eps)
    with torch.autocast(x.device.type, enabled=False):
        return F.rms_norm(x, x.shape[-1:], weight.to(x.dtype), eps)


def compile_module(module: torch.nn.Module, backend="inductor") -> None:
    """What `module.compile(backend=backend)` means to do, in place: calls of `module` run compiled,
    its parameters and state_dict keys unchanged. The compiled call enters through a function
    defined here, one code object per module: for torch's own modules `module.compile()` compiles
    nothing (pytorch#150915), and Dynamo keeps at most `cache_size_limit` (8) compiled variants per
    code object, which a code object shared by every module (`Module._call_impl`) would spend on a
    few modules' shapes and grad modes, leaving the rest eager."""
    call = module._call_impl

    def enter(*args, **kwargs):
        return call(*args, **kwargs)

    enter.__code__ = enter.__code__.replace(co_name=f"compiled_{type(module).__name__}_{id(module):x}")
    module._compiled_call_impl = torch.compile(enter, backend=backend)  # what module.compile() sets


def failed_capture_leaves_rng_capturing(version: tuple[int, int] = TORCH_VERSION) -> bool:
    """pytorch#171263: whether a failed CUDA-graph capture leaves the default CUDA generator in
    capture mode on this torch (`tests/core/upstream/failed_capture_rng.py` checks it on a GPU)."""
    return version < (2, 12)


def inductor_subgraph_donation_needs_fix(version: tuple[int, int] = TORCH_VERSION) -> bool:
    return version == (2, 13)


def _backport_subgraph_donation_fix(graph_module) -> None:
    original_init = graph_module.SubgraphLowering.__init__

    def init_without_donated_buffers(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.bw_donated_idxs = None  # pytorch#193960: a subgraph never donates the outer graph's buffers

    graph_module.SubgraphLowering.__init__ = init_without_donated_buffers


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `patch(module)` right after `name` is first imported (inductor loads lazily, on the
    first compile; importing it up front would cost seconds on every `import worldmodels`)."""

    def __init__(self, name: str, patch):
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            self.patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


@functools.cache
def apply() -> bool:
    """Install the fixes this torch needs (once); True when the inductor backport is installed."""
    if not inductor_subgraph_donation_needs_fix():
        return False
    name = "torch._inductor.graph"
    if name in sys.modules:
        _backport_subgraph_donation_fix(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, _backport_subgraph_donation_fix))
    return True
