"""The interpreter workaround of tests/_triton.py (`skip_device_call_repatch`, installed by
tests/conftest.py): helpers called inside an interpreted kernel skip patching triton.language again,
with the same values and errors as the interpreter's own path, and the gate notices a new triton."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the triton package is not installed: no interpreter to work around")

from tests._triton import DEVICE, REPATCHING_TRITON, device_calls_repatch, skip_device_call_repatch  # noqa: E402

pytestmark = pytest.mark.skipif(DEVICE.type != "cpu", reason="the workaround is for Triton's CPU interpreter")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@triton.jit
def _scale(x, k: tl.constexpr):
    return x * k + tl.zeros(x.shape, dtype=x.dtype)  # tl.zeros: triton's own helper, naming triton.language.core


@triton.jit
def _twice(x, k: tl.constexpr):
    return _scale(_scale(x, k), k)


@triton.jit
def _kernel(out, n, K: tl.constexpr, CALLS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = offs.to(tl.float32)
    for _ in tl.static_range(CALLS):
        x = _twice(x, K)
    tl.store(out + offs, x, mask=offs < n)


@triton.jit
def _failing_helper(x):
    tl.static_assert(x.shape[0] == 3, "the helper asserts")
    return x


@triton.jit
def _failing_kernel(out, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out + offs, _failing_helper(offs.to(tl.float32)))


def test_the_gate_matches_the_installed_triton():
    """pyproject pins triton for the tests; a new version must be checked again: whether its interpreter
    still re-patches on every helper call (then move REPATCHING_TRITON), or not (then drop the workaround)."""
    assert triton.__version__ == REPATCHING_TRITON, (
        f"triton {triton.__version__} is installed, the workaround is written for {REPATCHING_TRITON}: check "
        "InterpretedFunction.__call__ and the gate in tests/_triton.py")
    assert device_calls_repatch(), (f"triton {triton.__version__}'s interpreter no longer patches the language on "
                                    "every helper call: drop skip_device_call_repatch")
    assert skip_device_call_repatch()  # installed (by conftest), idempotent


def test_helpers_in_a_launch_give_the_interpreters_values_with_one_patch(monkeypatch):
    """Eight helper calls a program, two programs: the kernel's launch patches the language, and triton's
    own helper (which names triton.language.core) patches once more; the values are the plain math."""
    calls = []
    patch = interpreter._patch_lang
    monkeypatch.setattr(interpreter, "_patch_lang", lambda fn: calls.append(fn.__name__) or patch(fn))
    n, block = 27, 16
    out = torch.zeros(n)
    _kernel[(triton.cdiv(n, block),)](out, n, K=3.0, CALLS=2, BLOCK=block)
    torch.testing.assert_close(out, torch.arange(n, dtype=torch.float32) * 3.0 ** 4)
    assert calls == ["_kernel", "zeros"], calls


def test_a_helpers_error_is_the_interpreters_error():
    with pytest.raises(interpreter.InterpreterError, match="the helper asserts"):
        _failing_kernel[(1,)](torch.zeros(4), BLOCK=4)
