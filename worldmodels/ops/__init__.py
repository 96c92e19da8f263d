"""The ops: pure functions of tensors (weights passed in), one folder per op family, each with a
`reference.py` (the loop math every backend is tested against) beside one file per backend.
Modules (`worldmodels.models`) own the weights and call these through the registry
(`worldmodels.core.registry`); nothing here knows a module."""
