"""The fused RSSM unrolls (the `triton` backend of `rssm_observe` / `rssm_imagine`): one persistent
kernel launch per unroll direction, the time loop inside. Same signatures and math as `../reference.py`.

    entry.py             observe / imagine: checks, the Actor-in-the-loop check, CUDA-graph replays; the
                         registry's `unsupported_reason` / `supports` / `fits`
    autograd.py          the unroll as a pair of `torch.library` custom ops (forward, backward) with autograd
    launch.py            the launch plan: kernel arguments, tile shapes, work split, write-once scratch slots
    forward_kernels.py   the forward kernel (@triton.jit)
    backward_kernels.py  the backward's reverse chain kernel (@triton.jit)
    share.py             the action's share of the cell input in one launch (calls without gradients)

The @triton.jit helpers they share with the GRU / LSTM op (dots, activations, barriers) are in
`ops/triton_utils.py`. Importable without triton: `unsupported_reason` and `fits` answer on CPU installs.
"""

from worldmodels.ops.rssm.fused.entry import FUSED_ACTOR_DISTS, fits, imagine, observe, supports, unsupported_reason

__all__ = ["FUSED_ACTOR_DISTS", "fits", "imagine", "observe", "supports", "unsupported_reason"]
