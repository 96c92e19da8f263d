"""Where the Triton backend can run: CUDA with triton importable, or CPU tensors under Triton's
interpreter (`TRITON_INTERPRET=1`, read when the kernels are first imported: tests only)."""

from __future__ import annotations

import functools
import importlib.util
import os

import torch


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def triton_unavailable(device: torch.device) -> str | None:
    """None when the Triton kernels run on `device`, else why not."""
    if not _triton_installed():
        return "the triton package is not installed"
    if device.type == "cuda":
        return None
    if device.type == "cpu" and interpreting():
        return None
    return "its kernels run on CUDA devices (on CPU only under TRITON_INTERPRET=1, for tests)"
