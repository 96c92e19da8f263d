"""`triton` backend for plain GRU / LSTM sequences: persistent kernels with the time loop inside.

    rnn(cell, x, states, weights, is_init, *, num_layers, bias, precision) -> (y, states)

Same interface and math as `reference.rnn` (torch.nn.GRU / nn.LSTM, batch_first, gate orders
r,z,n and i,f,g,o; `is_init[b, t]` zeroes h (and c) before step t).

The plan: the input side's gates as one GEMM over B*T off the chain, then per layer one persistent
forward kernel (`forward_kernels.py`, which also states the memory-ordering rule) and, for gradients,
one reverse kernel followed by the weight gradients as GEMMs over B*T (`backward_kernels.py`);
launch configuration and the layer loops: `launch.py`.
Precision: "ieee" / "tf32" / "tf32x3" go to `tl.dot(input_precision=...)`, tf32's operands rounded
to the nearest tf32 first (`triton_utils.round_tf32`: the tensor cores would truncate them, a bias that
adds up over steps); "bf16" casts the dot operands (W_hh is cast once on the host) and accumulates in
fp32. State and gates stay fp32.

Registered as torch.library custom ops (`worldmodels::triton_rnn_forward` / `_backward`, `autograd.py`)
with fake implementations and autograd, so `torch.compile(fullgraph=True)` traces through them.
On CPU the kernels run only under TRITON_INTERPRET=1 (set before this module is imported and
while its kernels run). Launch configurations and their timings: docs/kernels.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from worldmodels.ops.rnn.fused.autograd import forward_op
from worldmodels.ops.rnn.reference import GATES
from worldmodels.ops.triton_utils import INTERPRET, L2_BUDGET_BYTES, wants_grad, warn_if_slower_than_cudnn

try:
    import triton
except ImportError:  # CPU installs without triton: `available` says no
    triton = None

PRECISIONS = ("ieee", "tf32", "tf32x3", "bf16")


def available(device: torch.device | str) -> bool:
    """CUDA with triton importable, or CPU when TRITON_INTERPRET=1 was set before import."""
    device = torch.device(device)
    if triton is None:
        return False
    if device.type == "cuda":
        return torch.cuda.is_available() and not INTERPRET
    return device.type == "cpu" and INTERPRET


def unsupported_reason(cell: str, hidden_size: int, dtype: torch.dtype = torch.float32) -> str | None:
    """Why the triton op cannot run this shape / dtype, or None when it can."""
    if cell not in GATES:
        return f"cell={cell!r} is not one of {list(GATES)}"
    if dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        return f"dtype {dtype} is not supported (float32, float64, bfloat16, float16)"
    w_bytes = GATES[cell] * hidden_size * hidden_size * (8 if dtype == torch.float64 else 4)
    if w_bytes > L2_BUDGET_BYTES:
        return (f"hidden_size={hidden_size}: W_hh ({w_bytes >> 20} MiB) exceeds the {L2_BUDGET_BYTES >> 20} MiB "
                f"the persistent kernel keeps in L2 across steps")
    return None


def supports(cell: str, hidden_size: int, dtype: torch.dtype = torch.float32) -> bool:
    """For the registry: `auto` falls back where this is False; explicit `triton` raises the reason."""
    return unsupported_reason(cell, hidden_size, dtype) is None


def fits(problem: dict) -> bool:
    """Whether `auto` picks these kernels for a GRU / LSTM call: in tf32 / tf32x3 / bf16, where they beat
    cuDNN (in ieee Triton's fp32 dots are FMAs, without tensor cores), for the shapes they take."""
    if problem.get("precision") not in ("tf32", "tf32x3", "bf16"):
        return False
    return supports(problem["cell"], problem["hidden"], problem["dtype"])


def rnn(cell: str, x: torch.Tensor, states: tuple[torch.Tensor, ...], weights: Sequence[torch.Tensor],
        is_init: torch.Tensor | None, *, num_layers: int, bias: bool, precision: str,
        ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """GRU / LSTM over a sequence. x [B, T, F]; states (h,) or (h, c), each [L, B, H]; weights per
    layer w_ih [G*H, F_l], w_hh [G*H, H], then b_ih, b_hh when bias; is_init [B, T] bool or None.
    Returns y [B, T, H] (the last layer's h at every step) and the final states, each [L, B, H]."""
    if triton is None:
        raise RuntimeError("the triton backend needs the `triton` package")
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}; expected one of {list(PRECISIONS)}")
    hidden = states[0].shape[-1]
    reason = unsupported_reason(cell, hidden, x.dtype)
    if reason is not None:
        raise ValueError(f"backend='triton' cannot run this {cell.upper()}: {reason}; use backend='cudnn' or 'auto'")
    if not available(x.device):
        raise RuntimeError(f"backend='triton' is not available on {x.device} "
                           "(CUDA with triton, or the CPU with TRITON_INTERPRET=1 set before import)")
    warn_if_slower_than_cudnn(x.device, x.dtype, precision, f"the {cell.upper()}")
    if len(weights) != num_layers * (4 if bias else 2):
        raise ValueError(f"expected {num_layers * (4 if bias else 2)} weight tensors, got {len(weights)}")
    lstm = cell == "lstm"
    h0 = states[0].contiguous()
    c0 = states[1].contiguous() if lstm else None
    x = x.contiguous()
    weights = [w.contiguous() for w in weights]
    save = wants_grad((x, *states, *weights))
    h_n, c_n, ys, _ = forward_op(cell, x, h0, c0, weights, is_init, num_layers, bias, precision, save)
    y = ys[-1, :, 1:, :hidden].to(x.dtype, memory_format=torch.contiguous_format)
    return y, ((h_n.to(x.dtype), c_n.to(x.dtype)) if lstm else (h_n.to(x.dtype),))
