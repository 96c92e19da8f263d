"""Where the Triton backend can run: CUDA with triton importable, or CPU tensors under Triton's
interpreter (`TRITON_INTERPRET=1`, read when the kernels are first imported: tests only).

The registry asks this without importing any op; what the fused ops share lives in `ops/triton_utils.py`."""

from __future__ import annotations

import importlib.util
import os

import torch


# read once at import: `auto` asks while torch.compile traces, which cannot trace a cached call
TRITON_INSTALLED = importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether Triton's interpreter is on (TRITON_INTERPRET=1): the one check, `ops/triton_utils.INTERPRET`
    reads it when the kernels are imported."""
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

