"""Importing the triton ops for their tests (tests/ops/test_fused_*.py, and the tests that launch them elsewhere).

On a CPU machine the kernels run under Triton's interpreter: TRITON_INTERPRET=1 must be set when an
op module is imported (triton decides interpreter mode when a kernel is decorated) and while its
kernels run. `import_op` sets it for the import only and restores it; each test file then sets it
per test with its `_interpreter` fixture. With WORLDMODELS_TEST_DEVICE=cuda the compiled kernels run.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

DEVICE = torch.device(os.environ.get("WORLDMODELS_TEST_DEVICE", "cpu"))


SHARED = "worldmodels.ops.triton_utils"
"""The jit helpers every kernel module calls, and the interpreter flag read at its import."""


def _compiled(module) -> bool:
    """Whether `module` was imported without the interpreter: its @triton.jit functions are compiled
    ones (`JITFunction`; under the interpreter they are `InterpretedFunction`s), or its INTERPRET flag is off."""
    from triton.runtime.jit import JITFunction

    return getattr(module, "INTERPRET", True) is False or any(isinstance(v, JITFunction) for v in vars(module).values())


def import_op(name: str, *also_interpreted: str):
    """Module `name`; on CPU imported under the interpreter. When it (or one of `also_interpreted`,
    the modules it loads kernels from, or the shared helpers `SHARED`) was imported compiled earlier in
    this process, the calling test module is skipped: its kernels could not run on CPU tensors."""
    if DEVICE.type == "cuda":
        return importlib.import_module(name)
    compiled = [n for n in (name, *also_interpreted, SHARED) if n in sys.modules and _compiled(sys.modules[n])]
    if compiled:
        pytest.skip(f"{compiled} were imported without TRITON_INTERPRET=1 earlier in this process",
                    allow_module_level=True)
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        return importlib.import_module(name)
    finally:
        if before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = before
