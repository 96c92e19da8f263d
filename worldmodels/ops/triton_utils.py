"""What the fused Triton ops share: launch overrides, the interpreter check, the L2 budget,
one-time warnings, and (where triton is installed) the jit helpers every kernel calls: dots in
each precision, activations, and the cross-program barriers.

Importable without triton: the registry asks `fits` on CPU installs too.
"""

from __future__ import annotations

import contextlib
import contextvars
import warnings

from worldmodels.core.triton_support import interpreting

INTERPRET = interpreting()
"""Triton's interpreter (TRITON_INTERPRET=1, read at import: the tests set it before importing the kernels)."""

L2_BUDGET_BYTES = 24 << 20
"""The weights a persistent kernel reads every step must stay resident in L2 across steps (50 MB on H100/H200)."""

LAUNCH_KEYS = {
    "rnn": ("BLOCK_B", "BLOCK_H", "BLOCK_K", "SPLIT", "W_RESIDENT", "num_warps", "BARRIER"),
    "rssm": ("BLOCK_B", "BLOCK_N", "BLOCK_K", "num_warps", "SPLIT", "FOLD_NORMS", "COUNT_BARRIER", "KSPLIT_ROWS",
             "BLOCKS_KMAJOR", "PRELOAD_H", "BARRIER", "PROFILE"),
}
"""The launch keys benchmarks and tests may override, per fused op (docs/kernels.md has their defaults)."""

_overrides: contextvars.ContextVar[dict] = contextvars.ContextVar("launch_overrides", default={})


@contextlib.contextmanager
def launch_overrides(op: str, **keys):
    """Override launch keys of fused op `op` ("rnn" or "rssm") for the calls inside (benchmarks, tests).

        with launch_overrides("rssm", SPLIT=2, BLOCK_N=16):
            rssm.observe(...)
    """
    unknown = sorted(set(keys) - set(LAUNCH_KEYS[op]))
    if unknown:
        raise ValueError(f"unknown {op} launch keys {unknown}; expected some of {list(LAUNCH_KEYS[op])}")
    current = _overrides.get()
    token = _overrides.set({**current, op: {**current.get(op, {}), **keys}})
    try:
        yield
    finally:
        _overrides.reset(token)


def overrides(op: str) -> dict:
    """The launch keys of `op` overridden in this context (empty outside `launch_overrides`)."""
    return _overrides.get().get(op, {})


def fits(problem: dict) -> bool:
    """The triton backend's `fits` (registered by name in `core/backends.py`): the RSSM op's rule for
    RSSM unrolls (problems with a "spec"), the GRU / LSTM op's otherwise."""
    if "spec" in problem:
        from worldmodels.ops.rssm.triton import fits as rssm_fits
        return rssm_fits(problem)
    from worldmodels.ops.rnn.triton import fits as rnn_fits
    return rnn_fits(problem)


_warned: set = set()


def warn_once(message: str, stacklevel: int = 3) -> None:
    """`warnings.warn(message)` the first time this message is given in the process."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, stacklevel=stacklevel)
