"""C-canonical layout: what kernels and the scan tracer expect when they read strides.

`is_contiguous()` ignores the stride of size-1 dims, so a [1, 4, 5] tensor with strides
(5, 5, 1) passes it while a kernel that reads the first stride gets the wrong one. These helpers
compare against the exact row-major strides and re-materialise when they differ.
"""

from __future__ import annotations

import torch


def canonical_strides(shape: torch.Size | tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def is_canonical(tensor: torch.Tensor) -> bool:
    """True when the strides are exactly the row-major ones for the shape (size-1 dims included)."""
    shape = tensor.shape
    if 1 not in shape and 0 not in shape:  # without size-1 or empty dims, contiguous is row-major (the cheaper check)
        return tensor.is_contiguous()
    return tensor.stride() == canonical_strides(shape)


def canonical(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor itself when canonical, else a row-major copy (differentiable; under vmap each
    sample is made contiguous on its own)."""
    if is_canonical(tensor):
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)
