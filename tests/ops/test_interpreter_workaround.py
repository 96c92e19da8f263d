"""The interpreter workarounds of tests/_triton.py, installed by tests/conftest.py:
`skip_device_call_repatch` (helpers called inside an interpreted kernel skip patching triton.language
again, with the same values and errors as the interpreter's own path) and
`skip_unasserted_overflow_checks` (no int32 overflow checks built only for `device_assert` to drop
them); the gates notice a new triton."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton", reason="the triton package is not installed: no interpreter to work around")

from tests._triton import (  # noqa: E402
    DEVICE,
    WORKED_AROUND_TRITON,
    device_calls_repatch,
    overflow_checks_unasserted,
    skip_device_call_repatch,
    skip_unasserted_overflow_checks,
)

pytestmark = pytest.mark.skipif(DEVICE.type != "cpu", reason="the workaround is for Triton's CPU interpreter")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.language.semantic import TritonSemantic  # noqa: E402
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
    still re-patches on every helper call (then move WORKED_AROUND_TRITON), or not (then drop the workaround)."""
    assert triton.__version__ == WORKED_AROUND_TRITON, (
        f"triton {triton.__version__} is installed, the workaround is written for {WORKED_AROUND_TRITON}: check "
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


@triton.jit
def _int32_kernel(out, a, b, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(a + offs)
    y = tl.load(b + offs)
    tl.store(out + offs, x * y + x - y)  # overflows int32 where the values are large


def _int32_run(monkeypatch, options) -> tuple[torch.Tensor, int]:
    """The int32 kernel's output under these interpreter options, and how many checks reached
    `device_assert`."""
    monkeypatch.setattr(interpreter.interpreter_builder, "options", options)
    asserts = []
    assert_ = TritonSemantic.device_assert
    monkeypatch.setattr(TritonSemantic, "device_assert", lambda self, *a: asserts.append(1) or assert_(self, *a))
    a = torch.tensor([3, -7, 2**30, 46341], dtype=torch.int32)
    b = torch.tensor([5, 11, 4, 46341], dtype=torch.int32)
    out = torch.zeros(4, dtype=torch.int32)
    _int32_kernel[(1,)](out, a, b, BLOCK=4)
    return out, len(asserts)


def test_the_overflow_gate_matches_the_installed_triton():
    """A new triton must be checked again: whether it still builds the checks for `device_assert` to
    drop without `debug` (then move WORKED_AROUND_TRITON), or not (then drop the workaround)."""
    assert triton.__version__ == WORKED_AROUND_TRITON
    assert overflow_checks_unasserted(), (f"triton {triton.__version__} asserts its overflow checks otherwise "
                                          "now: drop skip_unasserted_overflow_checks")
    assert not interpreter.interpreter_builder.options.sanitize_overflow  # installed by conftest
    assert skip_unasserted_overflow_checks()  # idempotent


def test_without_debug_the_checks_were_dropped_and_the_values_are_the_same(monkeypatch):
    """With `debug` off the interpreter built each check and dropped it: the same wrapped int32 values
    with the checks on (three reach `device_assert`, mul, add and sub, and are dropped) as without them (none built)."""
    options = interpreter.interpreter_builder.options
    checked, built = _int32_run(monkeypatch, dataclasses.replace(options, sanitize_overflow=True, debug=False))
    unchecked, none = _int32_run(monkeypatch, dataclasses.replace(options, sanitize_overflow=False, debug=False))
    want = torch.tensor([3 * 5 + 3 - 5, -7 * 11 - 7 - 11, 0, 0], dtype=torch.int64)
    want[2], want[3] = [(x * y + x - y + 2**31) % 2**32 - 2**31 for x, y in ((2**30, 4), (46341, 46341))]
    assert torch.equal(checked, unchecked) and torch.equal(checked.long(), want)
    assert built == 3 and none == 0


def test_with_debug_on_the_checks_stay(monkeypatch):
    """`debug` asserts the checks (an overflow is an error): the workaround then leaves them on."""
    options = interpreter.interpreter_builder.options
    monkeypatch.setattr(interpreter.interpreter_builder, "options",
                        dataclasses.replace(options, sanitize_overflow=True, debug=True))
    assert not skip_unasserted_overflow_checks()
    assert interpreter.interpreter_builder.options.sanitize_overflow
    with pytest.raises(interpreter.InterpreterError, match="overflow"):
        _int32_run(monkeypatch, interpreter.interpreter_builder.options)
