"""The ops: pure functions of tensors (weights passed in), one folder per op family, each with a
`reference.py` (the loop math every backend is tested against) beside one file or package per backend
(`scan.py`, `cudnn.py`, `fused/`: the `triton` backend). `triton_utils.py` holds what the fused ops
share (jit helpers, launch overrides, the interpreter check); `sampling.py` the noise-driven samplers;
`actor.py` the Actor's math. Modules (`worldmodels.models`) own the weights and call these through the
registry (`worldmodels.core.registry`); nothing here knows a module, but for the fused RSSM op's host
entry, which recognises the project's `Actor` among the policies it is given."""
