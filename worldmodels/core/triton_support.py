"""Where the Triton backend can run: CUDA with triton importable, or CPU tensors under Triton's
interpreter (`TRITON_INTERPRET=1`, read when the kernels are first imported: tests only)."""

from __future__ import annotations

import importlib.util
import os
import warnings

import torch


# read once at import: `auto` asks while torch.compile traces, which cannot trace a cached call
TRITON_INSTALLED = importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def triton_unavailable(device: torch.device) -> str | None:
    """None when the Triton kernels run on `device`, else why not."""
    if not TRITON_INSTALLED:
        return "the triton package is not installed"
    if device.type == "cuda":
        return None
    if device.type == "cpu" and interpreting():
        return None
    return "its kernels run on CUDA devices (on CPU only under TRITON_INTERPRET=1, for tests)"


_warned: set[str] = set()


def warn_if_slower_than_cudnn(device: torch.device, dtype: torch.dtype, precision: str, op: str) -> None:
    """One warning per op when an explicit `backend="triton"` call runs where it is slower than
    `cudnn`: fp32 in "ieee" precision on CUDA, where Triton's dots are FMA reductions on the CUDA
    cores and cuBLAS / cuDNN run the same IEEE math faster (docs/kernels.md). `auto` never picks
    triton there."""
    if device.type != "cuda" or dtype != torch.float32 or precision != "ieee" or op in _warned:
        return
    _warned.add(op)
    warnings.warn(f"backend='triton' runs {op} in 'ieee' precision as fp32 FMA dots, without tensor cores: slower "
                  f"than backend='cudnn' (or 'auto', which picks it here). For the fused kernels use precision "
                  f"'tf32', 'tf32x3' or 'bf16' (precision= on the module, set_recurrent_matmul_precision, or the "
                  f"run config's precision=)", stacklevel=4)
