"""Checks made on the first call of every row, before it is timed.

- parity: a row's outputs (and gradients) equal the reference's (our `loop` backend) to a relative
  tolerance: max |actual - expected| / max |expected|, per tensor, worst tensor reported;
- informative data: inputs, noise and outputs are finite and not all zeros / constant, so no row is
  timed on degenerate data.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

Outputs = dict[str, torch.Tensor]


class ParityError(AssertionError):
    pass


def flatten(value, prefix: str = "") -> Outputs:
    """Tensors of a (nested) dict / TensorDict / tuple, keyed by their path."""
    if isinstance(value, torch.Tensor):
        return {prefix or "out": value}
    if hasattr(value, "items") and not isinstance(value, Mapping):  # TensorDict
        value = dict(value.items())
    if isinstance(value, Mapping):
        items = value.items()
    elif isinstance(value, (tuple, list)):
        items = enumerate(value)
    elif value is None:
        return {}
    else:
        raise TypeError(f"cannot flatten {type(value).__name__} into tensors")
    out: Outputs = {}
    for key, item in items:
        out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    return out


def detach(outputs: Outputs) -> Outputs:
    return {k: v.detach().clone() for k, v in outputs.items()}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    if actual.shape != expected.shape:
        raise ParityError(f"shape {list(actual.shape)} != reference {list(expected.shape)}")
    actual, expected = actual.double(), expected.double()
    scale = expected.abs().max().clamp_min(1e-12)
    return float((actual - expected).abs().max() / scale)


def assert_parity(actual: Outputs, expected: Outputs, rtol: float) -> float:
    """Worst relative error over the reference's tensors; raises ParityError above `rtol`."""
    missing = sorted(set(expected) - set(actual))
    if missing:
        raise ParityError(f"outputs missing next to the reference: {missing}")
    worst = 0.0
    for key, ref in expected.items():
        err = relative_error(actual[key], ref)
        if not err <= rtol:  # NaN fails too
            raise ParityError(f"{key}: relative error {err:.2e} > {rtol:.0e} against the reference")
        worst = max(worst, err)
    return worst


def assert_informative(tensors: Outputs, what: str) -> None:
    """Floating tensors must be finite and vary; nothing is timed on zeros."""
    for key, tensor in tensors.items():
        if not tensor.is_floating_point() or tensor.numel() == 0:
            continue
        t = tensor.detach()
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{what} {key!r} has non-finite values")
        if not bool((t != 0).any()):
            raise ValueError(f"{what} {key!r} is all zeros")
        if t.numel() > 1 and float(t.float().std()) == 0.0:
            raise ValueError(f"{what} {key!r} is constant")
