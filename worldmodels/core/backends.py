"""Which backend unrolls a recurrent program, and the recurrent mode of policy RNNs.

Resolution, most specific first: per-call `backend=` -> per-module `backend=` ->
`recurrent_backend(...)` / `set_recurrent_backend(...)` in this context -> env var
`WORLDMODELS_RNN_BACKEND` (read at import) -> "auto". The names come from the registry
(`core/registry.py`); the built-in backends are registered here, their ops imported on first use.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from worldmodels.core import registry, torch_fixes
from worldmodels.core.context import ContextSetting, resolve
from worldmodels.core.registry import Backend, RegistryNames
from worldmodels.core.triton_support import triton_unavailable
from worldmodels.core.unroll import is_batched  # noqa: F401 (re-exported)


def _cudnn_unavailable(device: torch.device) -> str | None:
    if device.type == "cuda" and not torch.backends.cudnn.is_available():
        return "it needs cuDNN on CUDA tensors, and torch.backends.cudnn is not available"
    return None


registry.register(Backend(
    "loop", {"rnn": "worldmodels.ops.rnn.reference:rnn", "rssm_observe": "worldmodels.ops.rssm.reference:observe",
             "rssm_imagine": "worldmodels.ops.rssm.reference:imagine"},
    auto=lambda device, compiling, vmapped: True, priority=30,
    description="the step function in an eager Python loop: the reference every backend is tested against"))
registry.register(Backend(
    "scan", {"rnn": "worldmodels.ops.rnn.scan:rnn", "rssm_observe": "worldmodels.ops.rssm.scan:observe",
             "rssm_imagine": "worldmodels.ops.rssm.scan:imagine"},
    # under torch.compile its compile time stays flat in T, where the unrolled loop's grows
    auto=lambda device, compiling, vmapped: compiling and not vmapped and torch_fixes.scan_compiles_correctly(),
    priority=20,
    description="the step function under torch's scan: one traced body, no graph breaks under torch.compile"))
registry.register(Backend(
    "cudnn", {"rnn": "worldmodels.ops.rnn.cudnn:rnn", "rssm_observe": "worldmodels.ops.rssm.cudnn:observe",
              "rssm_imagine": "worldmodels.ops.rssm.cudnn:imagine"},
    unavailable=_cudnn_unavailable, auto=lambda device, compiling, vmapped: not compiling and not vmapped,
    priority=10, vmappable=False,
    description="vendor kernels (cuDNN RNNs; the RSSM unroll captured in CUDA graphs); on CPU the same native ops"))
registry.register(Backend(
    "triton", {"rnn": "worldmodels.ops.rnn.fused:rnn", "rssm_observe": "worldmodels.ops.rssm.fused:observe",
               "rssm_imagine": "worldmodels.ops.rssm.fused:imagine"},
    unavailable=triton_unavailable,
    auto=lambda device, compiling, vmapped: device.type == "cuda" and not compiling and not vmapped,
    fits=registry.lazy("worldmodels.ops.triton_utils:fits"), priority=0, vmappable=False, vmap_fallback=True,
    description="fused persistent Triton kernels (GRU/LSTM; RSSM unrolls: fused forward, backward from the carries)"))

BACKENDS = RegistryNames(registry.names)
"""Registered backends (a live view). `auto` picks one of them per call."""

IMPLEMENTED_BACKENDS = RegistryNames(registry.implemented)
"""Registered backends with at least one op in this build (a live view)."""

RECURRENT_MODES = ("sequence", "step")
"""`sequence`: inputs are [B, T, F] (training). `step`: one step [B, F], hidden carried by the
caller (a policy inside a collector)."""

_backend = ContextSetting("recurrent backend", RegistryNames(lambda: (*registry.names(), "auto")), "auto",
                          "WORLDMODELS_RNN_BACKEND")
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


def resolve_backend(*requested: str | None, device: torch.device, vmapped: bool = False, family: str = "rnn",
                    problem: dict | Callable[[], dict] | None = None) -> str:
    """The concrete backend for one call of op `family`.

    `requested` are the explicit choices, most specific first (call, then module); `None` defers.
    `auto` asks the registry: `cudnn` in eager code, `scan` while torch.compile traces where
    torch's scan gradients are right (`core/torch_fixes.py`), `loop` under vmap or otherwise.
    An explicit name that cannot run here is a ValueError naming the ones that can; under vmap a
    backend without a batching rule either raises (cudnn) or, with `vmap_fallback` (triton), runs
    the call on `auto`'s vmappable choice after a one-time warning. `problem` (what `fits` reads)
    may be a function that builds it, called only when `auto` chooses.
    """
    name = resolve(*requested, setting=_backend)
    if callable(problem) and (name == "auto" or vmapped):
        problem = problem()
    if name == "auto":
        return registry.choose_auto(family, device, compiling=torch.compiler.is_compiling(), vmapped=vmapped,
                                    problem=problem)
    backend = registry.check_runs(name, family, device)
    if vmapped and not backend.vmappable:
        if not backend.vmap_fallback:
            registry.check_runs(name, family, device, vmapped=True)  # the clear error
        fallback = registry.choose_auto(family, device, compiling=torch.compiler.is_compiling(), vmapped=True,
                                        problem=problem)
        _warn_once((name, family, fallback), f"backend={name!r} has no torch.func.vmap batching rule for "
                   f"{family!r}: under vmap these calls run on {fallback!r} instead")
        return fallback
    return name


_warned: set = set()


def _warn_once(key, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=4)


def backend_op(name: str, family: str):
    """The op `family` of backend `name` (imported on first use)."""
    return registry.get(name).op(family)
