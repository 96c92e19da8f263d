"""Importing the triton ops for their tests (tests/ops/test_fused_*.py, and the tests that launch them elsewhere).

On a CPU machine the kernels run under Triton's interpreter: TRITON_INTERPRET=1 must be set when an
op module is imported (triton decides interpreter mode when a kernel is decorated) and while its
kernels run. `import_op` sets it for the import only and restores it; each test file then sets it
per test with its `_interpreter` fixture. With WORLDMODELS_TEST_DEVICE=cuda the compiled kernels run.

`skip_device_call_repatch` (applied by tests/conftest.py) removes a cost of triton 3.6's interpreter:
every call of a @triton.jit helper from inside a kernel patches triton.language again
(`InterpretedFunction.__call__` runs `_patch_lang`, an `inspect.getmembers` walk of the language's
modules, and never restores it), although the kernel's launch (`GridExecutor.__call__`) has patched
the same modules with the same builder until it ends. Our kernels call helpers thousands of times a
launch, and the walks took a large share of an interpreted test's time. Inside a launch the workaround calls the
helper's rewritten function directly; outside one (a helper called on its own) it keeps the patch.

`skip_unasserted_overflow_checks` (applied by tests/conftest.py) removes another: triton 3.6's
semantic layer builds an int32 overflow check for every integer add, sub and mul
(`binary_op_sanitize_overflow_impl`: both operands cast to int64, the op again, two compares and an
and) while `sanitize_overflow` is on, its default, and hands the result to `device_assert`, which
drops it unless `debug` is on. Compiled, the unused ops are removed; interpreted, numpy computes them
for every index expression of every program, a third of a kernel's interpreted time. (The checks
came in gated on `debug`, triton-lang/triton#4589; the dead code they now leave without it is what
facebookexperimental/triton#769, closed, set out to remove.) With `debug` off the workaround turns
`sanitize_overflow` off in the interpreter's options: nothing is checked either way, and the values
are the same.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import sys
import threading
from functools import cache

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


WORKED_AROUND_TRITON = "3.6.0"
"""The triton version whose interpreter both workarounds (`skip_device_call_repatch`,
`skip_unasserted_overflow_checks`) are written against."""

_launches = threading.local()  # per thread: for each running launch, the language modules patched for it


@cache  # asked at every helper call: a module's imports do not change while kernels run
def _languages(fn) -> frozenset[int]:
    """ids of the triton.language modules `fn`'s globals name: what `_patch_lang(fn)` patches."""
    import triton.language as tl

    return frozenset(id(m) for m in fn.__globals__.values() if inspect.ismodule(m) and m in (tl, tl.core))


def device_calls_repatch() -> bool:
    """Whether the installed interpreter patches triton.language on every helper call (the cost the
    workaround removes): its `InterpretedFunction.__call__` runs `_patch_lang(self.fn)`."""
    from triton.runtime import interpreter

    call = interpreter.InterpretedFunction.__call__
    return "_patch_lang(self.fn)" in inspect.getsource(getattr(call, "original", call))


def skip_device_call_repatch() -> bool:
    """Install the workaround (module docstring) on triton `WORKED_AROUND_TRITON` where its interpreter
    still re-patches; True when installed. Another version is left as it is (tests/ops/test_interpreter_workaround.py
    then asks for the gate to be checked again)."""
    import triton
    from triton.runtime import interpreter

    if triton.__version__ != WORKED_AROUND_TRITON or not device_calls_repatch():
        return False
    grid_call, device_call = interpreter.GridExecutor.__call__, interpreter.InterpretedFunction.__call__
    if getattr(device_call, "skips_repatch", False):
        return True

    def launch(self, *args, **kwargs):
        running = _launches.__dict__.setdefault("patched", [])
        running.append(set(_languages(self.fn)))  # the launch patches these until it ends
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            running.pop()

    def call(self, *args, **kwargs):
        running = getattr(_launches, "patched", None)
        languages = _languages(self.fn)
        if not running or not languages <= running[-1]:
            # outside a launch, or a helper naming a module the launch did not patch (triton's own
            # helpers, `tl.zeros`, name `triton.language.core`): patched as the interpreter does
            if running:
                running[-1] |= languages
            return device_call(self, *args, **kwargs)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # as the original: the interpreter's error type, the cause chained
            raise interpreter.InterpreterError(repr(e)) from e

    call.skips_repatch, call.original = True, device_call
    interpreter.GridExecutor.__call__, interpreter.InterpretedFunction.__call__ = launch, call
    return True


def overflow_checks_unasserted() -> bool:
    """Whether the installed triton builds the overflow checks only to hand them to `device_assert`,
    and `device_assert` drops them unless the options' `debug` is on (the cost the workaround removes)."""
    from triton.language.semantic import TritonSemantic

    sanitize = inspect.getsource(TritonSemantic.binary_op_sanitize_overflow_impl)
    assertion = inspect.getsource(TritonSemantic.device_assert)
    return ("self.device_assert(cond, msg, None)" in sanitize
            and "if not self.builder.options.debug:\n            return" in assertion)


def skip_unasserted_overflow_checks() -> bool:
    """Turn the interpreter's `sanitize_overflow` off where its checks would not be asserted (module
    docstring): triton `WORKED_AROUND_TRITON` with `debug` off. True when it is off."""
    import triton
    from triton.runtime import interpreter

    options = interpreter.interpreter_builder.options
    if triton.__version__ != WORKED_AROUND_TRITON or options.debug or not overflow_checks_unasserted():
        return False
    interpreter.interpreter_builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True
