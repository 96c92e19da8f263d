"""Matmul precision of the recurrent core, resolved per call and applied per kernel.

Modes: concrete "ieee", "tf32", "tf32x3", "bf16"; GPU-aware presets "fast" (Ampere+ -> tf32,
else ieee) and "high-prec" (Ampere+ -> tf32x3, else ieee); "auto" defers to the next level.
Resolution, most specific first: module argument -> `recurrent_matmul_precision(mode)` (a context
manager: this thread / task only, like `recurrent_backend`) -> `set_recurrent_matmul_precision`
(process global) -> env var WORLDMODELS_RNN_PRECISION (read at import) ->
torch.get_float32_matmul_precision() (highest -> ieee, high -> high-prec, medium -> fast).

How each concrete mode is applied never touches a global flag such as
`torch.backends.cuda.matmul.allow_tf32`:
- Triton kernels take it as the `tl.dot` input precision.
- On the torch-op backends (loop, scan, cudnn) "bf16" casts the matmul operands to bfloat16 and
  accumulates back in the state dtype; "ieee", "tf32" and "tf32x3" run the fp32 ops as they are
  (cuBLAS has no per-call tf32 switch, so those two are at least as precise as asked).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from worldmodels.core.context import ContextSetting

CONCRETE_MODES = ("ieee", "tf32", "tf32x3", "bf16")
PRESET_MODES = ("fast", "high-prec")
USER_MODES = ("auto", *PRESET_MODES, *CONCRETE_MODES)
ENV_VAR = "WORLDMODELS_RNN_PRECISION"
_FROM_TORCH = {"highest": "ieee", "high": "high-prec", "medium": "fast"}


def validate_precision(mode: object, argument: str = "precision") -> str:
    if not isinstance(mode, str) or mode.strip().lower() not in USER_MODES:
        raise ValueError(f"{argument}={mode!r} is not a valid recurrent matmul precision; "
                         f"expected one of {list(USER_MODES)}")
    return mode.strip().lower()


def _read_env() -> str | None:
    raw = os.environ.get(ENV_VAR, "").strip()
    if not raw:
        return None
    mode = validate_precision(raw, argument=ENV_VAR)
    return None if mode == "auto" else mode


_env_mode: str | None = _read_env()  # raises at import on an invalid value
_global_mode: str | None = None
_context_mode = ContextSetting("recurrent matmul precision", USER_MODES, "auto")  # "auto": not set here


@contextlib.contextmanager
def recurrent_matmul_precision(mode: str) -> Iterator[None]:
    """Within the block, modules without their own `precision=` run at `mode` in this context
    only (this thread or asyncio task; a worker thread keeps its own setting), over the process
    setting of `set_recurrent_matmul_precision`; "auto" defers to that process setting. Nests."""
    with _context_mode.use(validate_precision(mode, argument="mode")):
        yield


def set_recurrent_matmul_precision(mode: str | None) -> None:
    """Process-global precision for every recurrent module without its own `precision=`.
    `None` or "auto" clears it."""
    global _global_mode
    mode = None if mode is None else validate_precision(mode, argument="mode")
    _global_mode = None if mode == "auto" else mode


@functools.lru_cache(maxsize=16)
def _has_tensor_cores(device_index: int) -> bool:
    if torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(device_index)[0] >= 8


def _default_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _from_torch() -> str:
    """torch's float32 matmul precision as a mode. Dynamo cannot trace
    `torch.get_float32_matmul_precision()`; it constant-folds the TF32 flag and guards on it, so
    compiled code reads that ("medium" then resolves as "high": at least as precise as asked)."""
    if torch.compiler.is_compiling():
        return "high-prec" if torch._C._get_cublas_allow_tf32() else "ieee"
    return _FROM_TORCH[torch.get_float32_matmul_precision()]


def resolve_precision(module_mode: str | None = None, device: torch.device | None = None) -> str:
    """The concrete mode ("ieee", "tf32", "tf32x3" or "bf16") for one call on `device`."""
    mode = None if module_mode in (None, "auto") else module_mode
    context = _context_mode.get()  # a compile-safe read (core/context.py)
    mode = mode or (None if context == "auto" else context) or _global_mode or _env_mode or _from_torch()
    if mode in PRESET_MODES:
        device = device or _default_device()
        tensor_cores = device.type == "cuda" and _has_tensor_cores(device.index or 0)
        mode = ("tf32" if mode == "fast" else "tf32x3") if tensor_cores else "ieee"
    return mode


def get_recurrent_matmul_precision(device: torch.device | None = None) -> str:
    """The resolved concrete mode for modules without their own `precision=` on `device`
    (default: the current CUDA device if there is one, else the CPU)."""
    return resolve_precision(None, device)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, precision: str) -> torch.Tensor:
    """`F.linear` with the concrete precision applied to this call only."""
    if precision == "bf16" and x.dtype == torch.float32:
        out = F.linear(x.bfloat16(), weight.bfloat16(), None).float()
        return out if bias is None else out + bias
    return F.linear(x, weight, bias)
