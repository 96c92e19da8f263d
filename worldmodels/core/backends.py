"""Which backend unrolls a recurrent program, and the recurrent mode of policy RNNs.

Resolution, most specific first: per-call `backend=` -> per-module `backend=` ->
`recurrent_backend(...)` / `set_recurrent_backend(...)` in this context -> env var
`WORLDMODELS_RNN_BACKEND` (read at import) -> "auto".
"""

from __future__ import annotations

import torch

from worldmodels.core.context import ContextSetting, resolve

BACKENDS = ("loop", "scan", "cudnn", "triton")
"""Concrete backends. `auto` picks one of them per call."""

IMPLEMENTED_BACKENDS = ("loop", "scan", "cudnn")
"""Backends this build can run; `triton` lands with the fused kernels."""

RECURRENT_MODES = ("sequence", "step")
"""`sequence`: inputs are [B, T, F] (training). `step`: one step [B, F], hidden carried by the
caller (a policy inside a collector)."""

_backend = ContextSetting("recurrent backend", (*BACKENDS, "auto"), "auto", "WORLDMODELS_RNN_BACKEND")
_mode = ContextSetting("recurrent mode", RECURRENT_MODES, "sequence")

recurrent_backend = _backend.use
set_recurrent_backend = _backend.set
get_recurrent_backend = _backend.get

recurrent_mode = _mode.use
set_recurrent_mode = _mode.set
get_recurrent_mode = _mode.get


def validate_backend(name: str | None, argument: str = "backend") -> str | None:
    """Check a `backend=` argument early (module construction); None means 'defer'."""
    if name is not None:
        _backend.validate(name, source=argument)
    return name


def is_batched(tensor: torch.Tensor) -> bool:
    """True inside `torch.func.vmap` for a tensor carrying a vmapped dimension."""
    return torch._C._functorch.is_batchedtensor(tensor)


def resolve_backend(*requested: str | None, device: torch.device, vmapped: bool = False) -> str:
    """The concrete backend for one call.

    `requested` are the explicit choices, most specific first (call, then module); `None` defers.
    `auto` picks `loop` while torch.compile traces (Dynamo unrolls it: no graph break) or under
    vmap (the vendor ops have no batching rules), else `cudnn` (cuDNN on CUDA, the same native ops
    on CPU). Not `scan`: torch's scan autograd gave wrong gradients in our tests (torch 2.11 CUDA
    eager, torch 2.13 inductor; docs/recurrent-core.md), so it is opt-in until that is fixed.
    """
    name = resolve(*requested, setting=_backend)
    if name == "auto":
        if torch.compiler.is_compiling() or vmapped:
            return "loop"
        return "cudnn"
    if name not in IMPLEMENTED_BACKENDS:
        raise ValueError(
            f"backend={name!r} is not available in this build; available backends: "
            f"{list(IMPLEMENTED_BACKENDS)} (or 'auto')"
        )
    if name == "cudnn" and device.type == "cuda" and not torch.backends.cudnn.is_available():
        raise ValueError("backend='cudnn' needs cuDNN on CUDA tensors, and torch.backends.cudnn is not available")
    return name
