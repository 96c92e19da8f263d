"""The recurrent core: backend choice, recurrent mode, precision, strides and unroll drivers."""

from worldmodels.core.backends import (
    BACKENDS,
    IMPLEMENTED_BACKENDS,
    RECURRENT_MODES,
    get_recurrent_backend,
    get_recurrent_mode,
    recurrent_backend,
    recurrent_mode,
    resolve_backend,
    set_recurrent_backend,
    set_recurrent_mode,
)
from worldmodels.core.precision import (
    get_recurrent_matmul_precision,
    recurrent_matmul_precision,
    resolve_precision,
    set_recurrent_matmul_precision,
)
from worldmodels.core.strides import canonical, canonical_strides, is_canonical
from worldmodels.core.unroll import loop_unroll, scan_unroll

__all__ = [
    "BACKENDS", "IMPLEMENTED_BACKENDS", "RECURRENT_MODES", "canonical", "canonical_strides",
    "get_recurrent_backend", "get_recurrent_matmul_precision", "get_recurrent_mode", "is_canonical",
    "loop_unroll", "recurrent_backend", "recurrent_matmul_precision", "recurrent_mode", "resolve_backend",
    "resolve_precision",
    "scan_unroll", "set_recurrent_backend", "set_recurrent_matmul_precision", "set_recurrent_mode",
]
