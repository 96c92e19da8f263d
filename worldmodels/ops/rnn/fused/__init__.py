"""The fused GRU / LSTM op (the `triton` backend of `rnn`): persistent kernels with the time loop
inside, forward and backward. Same signature and math as `../reference.py`.

    entry.py             rnn: checks, then the custom op; the registry's `unsupported_reason` / `supports` / `fits`
    autograd.py          the forward and backward as `torch.library` custom ops with autograd
    launch.py            the launch configuration, the off-chain GEMMs and the loops over layers
    forward_kernels.py   the forward kernel (@triton.jit), with the memory-ordering rule
    backward_kernels.py  the backward kernel (@triton.jit)

The @triton.jit helpers they share with the RSSM op (dots, activations, barriers) are in
`ops/triton_utils.py`. Importable without triton: `available`, `unsupported_reason` and `fits` answer on
CPU installs.
"""

from worldmodels.ops.rnn.fused.entry import PRECISIONS, available, fits, rnn, supports, unsupported_reason

__all__ = ["PRECISIONS", "available", "fits", "rnn", "supports", "unsupported_reason"]
