"""The recurrent core's settings: backend choice and recurrent mode (context-local, compile-safe),
matmul precision (resolution order, presets, env var), and the canonical-strides helpers."""

from __future__ import annotations

import contextvars
import json
import os
import subprocess
import sys
import threading

import pytest
import torch

import worldmodels
from worldmodels.core import (
    BACKENDS,
    RECURRENT_MODES,
    canonical,
    canonical_strides,
    get_recurrent_backend,
    get_recurrent_matmul_precision,
    get_recurrent_mode,
    is_canonical,
    recurrent_backend,
    recurrent_mode,
    resolve_precision,
    set_recurrent_backend,
    set_recurrent_matmul_precision,
    set_recurrent_mode,
)
from worldmodels.core import precision as precision_module
from worldmodels.core.context import ContextSetting
from worldmodels.core.precision import CONCRETE_MODES, USER_MODES

BACKEND_NAMES = (*BACKENDS, "auto")
ENV_BACKEND = "WORLDMODELS_RNN_BACKEND"
ENV_PRECISION = "WORLDMODELS_RNN_PRECISION"
# What a thread that never set anything sees: the env var read at import, else "auto".
DEFAULT_BACKEND = os.environ.get(ENV_BACKEND, "").strip().lower() or "auto"
DEFAULT_MODE = "sequence"


def settings() -> tuple[str, str]:
    return get_recurrent_backend(), get_recurrent_mode()


def in_thread(fn):
    """Run `fn` in a fresh worker thread and return its result (re-raising its exception)."""
    result = {}

    def target():
        try:
            result["value"] = fn()
        except BaseException as error:  # noqa: BLE001 - handed back to the test thread
            result["error"] = error

    worker = threading.Thread(target=target)
    worker.start()
    worker.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def start_python(code: str, **env: str) -> subprocess.Popen:
    """`python -c code` in a fresh interpreter with exactly the given WORLDMODELS_* env vars."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("WORLDMODELS_")}
    return subprocess.Popen([sys.executable, "-c", code], env={**environment, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


READ_SETTINGS = """
import json, threading
import worldmodels as wm
from worldmodels.core import resolve_precision
out = {"backend": wm.get_recurrent_backend(), "precision": wm.get_recurrent_matmul_precision()}
seen = []
worker = threading.Thread(target=lambda: seen.append(wm.get_recurrent_backend()))
worker.start(); worker.join()
out["thread_backend"] = seen[0]
with wm.recurrent_backend("loop"):
    out["context_backend"] = wm.get_recurrent_backend()
wm.set_recurrent_matmul_precision("ieee")
out["setter_precision"] = wm.get_recurrent_matmul_precision()
out["module_precision"] = resolve_precision("tf32")
wm.set_recurrent_matmul_precision(None)
out["cleared_precision"] = wm.get_recurrent_matmul_precision()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def import_runs() -> dict[str, tuple[int, str, str]]:
    """Fresh interpreters importing worldmodels under env vars, started together (each one pays
    torch's import): name -> (exit status, stdout, stderr)."""
    runs = {
        "valid": start_python(READ_SETTINGS, **{ENV_BACKEND: " Scan ", ENV_PRECISION: "BF16"}),
        ENV_BACKEND: start_python("import worldmodels", **{ENV_BACKEND: "warp-speed"}),
        ENV_PRECISION: start_python("import worldmodels", **{ENV_PRECISION: "warp-speed"}),
    }
    outputs = {name: run.communicate(timeout=300) for name, run in runs.items()}
    return {name: (runs[name].returncode, *outputs[name]) for name in runs}


# ------------------------------------------------------------------------------ backend / mode
def test_defaults_and_public_reexports():
    assert settings() == (DEFAULT_BACKEND, DEFAULT_MODE)
    assert worldmodels.get_recurrent_backend is get_recurrent_backend
    assert worldmodels.recurrent_mode is recurrent_mode


def test_context_managers_nest_and_restore():
    with recurrent_backend("scan"):
        assert get_recurrent_backend() == "scan"
        with recurrent_backend("loop"), recurrent_mode("step"):
            assert settings() == ("loop", "step")
        assert settings() == ("scan", DEFAULT_MODE)
    assert settings() == (DEFAULT_BACKEND, DEFAULT_MODE)


def test_context_manager_restores_after_an_exception():
    with pytest.raises(RuntimeError, match="boom"):
        with recurrent_backend("cudnn"), recurrent_mode("step"):
            raise RuntimeError("boom")
    assert settings() == (DEFAULT_BACKEND, DEFAULT_MODE)


def test_set_get_and_clear():
    for name in BACKEND_NAMES:
        set_recurrent_backend(name)
        assert get_recurrent_backend() == name
    set_recurrent_mode("step")
    assert get_recurrent_mode() == "step"
    with recurrent_backend("loop"):  # a context inside a set value wins, then hands it back
        assert get_recurrent_backend() == "loop"
    assert get_recurrent_backend() == BACKEND_NAMES[-1]
    set_recurrent_backend(None)
    set_recurrent_mode(None)
    assert settings() == (DEFAULT_BACKEND, DEFAULT_MODE)


@pytest.mark.parametrize("call", [
    lambda: set_recurrent_backend("fast"),
    lambda: recurrent_backend("gpu").__enter__(),
    lambda: set_recurrent_backend(3),
])
def test_invalid_backend_names_list_the_valid_ones(call):
    with pytest.raises(ValueError, match="backend") as info:
        call()
    for name in BACKEND_NAMES:
        assert repr(name) in str(info.value)
    assert settings() == (DEFAULT_BACKEND, DEFAULT_MODE)


def test_invalid_mode_lists_the_valid_ones():
    with pytest.raises(ValueError, match="mode") as info:
        set_recurrent_mode("batch")
    for name in RECURRENT_MODES:
        assert repr(name) in str(info.value)


def test_worker_thread_sees_defaults_unless_the_context_is_copied():
    with recurrent_backend("scan"), recurrent_mode("step"):
        assert in_thread(settings) == (DEFAULT_BACKEND, DEFAULT_MODE)
        context = contextvars.copy_context()
        assert in_thread(lambda: context.run(settings)) == ("scan", "step")


def test_setting_in_a_worker_thread_does_not_leak():
    def set_and_read():
        set_recurrent_backend("loop")
        set_recurrent_mode("step")
        return settings()

    assert in_thread(set_and_read) == ("loop", "step")
    assert settings() == (DEFAULT_BACKEND, DEFAULT_MODE)


def test_env_default_is_read_once_validated_and_normalised(monkeypatch):
    monkeypatch.setenv("WORLDMODELS_TEST_SETTING", "  Beta ")
    setting = ContextSetting("test setting", ("alpha", "beta"), "alpha", "WORLDMODELS_TEST_SETTING")
    monkeypatch.setenv("WORLDMODELS_TEST_SETTING", "alpha")  # read at construction only
    assert setting.get() == "beta"
    monkeypatch.setenv("WORLDMODELS_TEST_SETTING", "gamma")
    with pytest.raises(ValueError, match="WORLDMODELS_TEST_SETTING") as info:
        ContextSetting("test setting", ("alpha", "beta"), "alpha", "WORLDMODELS_TEST_SETTING")
    assert "'alpha'" in str(info.value) and "'beta'" in str(info.value)


def test_compiled_code_reads_the_current_settings_not_stale_ones():
    def encode(x):
        return (x + 10 * BACKEND_NAMES.index(get_recurrent_backend())
                + RECURRENT_MODES.index(get_recurrent_mode()))

    compiled = torch.compile(encode, fullgraph=True, backend="eager")
    x = torch.zeros(2)

    def check(expected_backend, expected_mode):
        expected = encode(x)  # eager
        assert torch.equal(expected, x + 10 * BACKEND_NAMES.index(expected_backend)
                           + RECURRENT_MODES.index(expected_mode))
        assert torch.equal(compiled(x), expected)
        return True

    check(DEFAULT_BACKEND, DEFAULT_MODE)
    with recurrent_backend("scan"), recurrent_mode("step"):
        check("scan", "step")
        assert in_thread(lambda: compiled(x)).equal(x + 10 * BACKEND_NAMES.index(DEFAULT_BACKEND))
        context = contextvars.copy_context()
        assert in_thread(lambda: context.run(check, "scan", "step"))
        set_recurrent_backend("loop")
        check("loop", "step")
    check(DEFAULT_BACKEND, DEFAULT_MODE)
    set_recurrent_mode("step")
    check(DEFAULT_BACKEND, "step")


def test_env_vars_set_the_defaults_at_import(import_runs):
    status, stdout, stderr = import_runs["valid"]
    assert status == 0, stderr
    out = json.loads(stdout.strip().splitlines()[-1])
    assert out == {"backend": "scan", "precision": "bf16", "thread_backend": "scan",
                   "context_backend": "loop", "setter_precision": "ieee", "module_precision": "tf32",
                   "cleared_precision": "bf16"}


@pytest.mark.parametrize("env_var, valid", [(ENV_BACKEND, BACKEND_NAMES), (ENV_PRECISION, USER_MODES)])
def test_invalid_env_var_fails_at_import_listing_valid_values(import_runs, env_var, valid):
    status, _, stderr = import_runs[env_var]
    assert status != 0
    message = stderr.strip().splitlines()[-1]
    assert message.startswith("ValueError") and env_var in message and "warp-speed" in message
    for name in valid:
        assert repr(name) in message


# ------------------------------------------------------------------------------ precision
def test_precision_resolution_order(monkeypatch):
    monkeypatch.setattr(precision_module, "_env_mode", None)
    torch.set_float32_matmul_precision("highest")
    assert get_recurrent_matmul_precision() == "ieee"  # torch's setting, last
    monkeypatch.setattr(precision_module, "_env_mode", "bf16")
    assert get_recurrent_matmul_precision() == "bf16"  # env var beats torch's setting
    set_recurrent_matmul_precision("tf32")
    assert get_recurrent_matmul_precision() == "tf32"  # the setter beats the env var
    assert resolve_precision("tf32x3") == "tf32x3"  # a module argument beats the setter
    assert resolve_precision("auto") == "tf32"  # "auto" on a module defers
    set_recurrent_matmul_precision(None)
    assert get_recurrent_matmul_precision() == "bf16"
    set_recurrent_matmul_precision("ieee")
    set_recurrent_matmul_precision("auto")  # "auto" clears like None
    assert get_recurrent_matmul_precision() == "bf16"


@pytest.mark.parametrize("tensor_cores", [True, False])
def test_torch_precision_and_presets_map_per_device(monkeypatch, tensor_cores):
    """highest -> ieee, high -> high-prec, medium -> fast; presets are tf32x3 / tf32 on a CUDA device
    with tensor cores (the hardware query is stubbed) and ieee elsewhere, the CPU included."""
    monkeypatch.setattr(precision_module, "_env_mode", None)
    monkeypatch.setattr(precision_module, "_has_tensor_cores", lambda index: tensor_cores)
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    fast, high = ("tf32", "tf32x3") if tensor_cores else ("ieee", "ieee")
    for torch_mode, on_cuda in (("highest", "ieee"), ("high", high), ("medium", fast)):
        torch.set_float32_matmul_precision(torch_mode)
        assert get_recurrent_matmul_precision(cuda) == on_cuda
        assert get_recurrent_matmul_precision(cpu) == "ieee"
    for preset, on_cuda in (("fast", fast), ("high-prec", high)):
        set_recurrent_matmul_precision(preset)
        assert get_recurrent_matmul_precision(cuda) == on_cuda
        assert get_recurrent_matmul_precision(cpu) == "ieee"
        assert resolve_precision(preset, cpu) == "ieee"
    for mode in CONCRETE_MODES:  # concrete modes are taken as they are, on every device
        assert resolve_precision(mode, cuda) == resolve_precision(mode, cpu) == mode


def test_env_precision_is_validated_and_normalised(monkeypatch):
    for raw, expected in ((" BF16 ", "bf16"), ("auto", None), ("", None), ("high-prec", "high-prec")):
        monkeypatch.setenv(ENV_PRECISION, raw)
        assert precision_module._read_env() == expected
    monkeypatch.setenv(ENV_PRECISION, "fp8")
    with pytest.raises(ValueError, match=ENV_PRECISION):
        precision_module._read_env()


@pytest.mark.parametrize("mode", ["fp8", "double", 16])
def test_invalid_precision_lists_the_valid_ones(mode):
    with pytest.raises(ValueError, match="precision") as info:
        set_recurrent_matmul_precision(mode)
    for name in USER_MODES:
        assert repr(name) in str(info.value)
    assert get_recurrent_matmul_precision(torch.device("cpu")) == resolve_precision(None, torch.device("cpu"))


def test_compiled_code_resolves_precision_per_call(monkeypatch):
    monkeypatch.setattr(precision_module, "_env_mode", None)

    def encode(x):
        return x + CONCRETE_MODES.index(get_recurrent_matmul_precision(torch.device("cpu")))

    compiled = torch.compile(encode, fullgraph=True, backend="eager")
    x = torch.zeros(1)
    for mode in ("bf16", None, "tf32", "auto", "tf32x3"):
        set_recurrent_matmul_precision(mode)
        assert torch.equal(compiled(x), encode(x))
    for torch_mode in ("high", "highest", "medium"):
        torch.set_float32_matmul_precision(torch_mode)
        assert torch.equal(compiled(x), encode(x))


# ------------------------------------------------------------------------------ strides
@pytest.mark.parametrize("shape", [(2, 3, 4), (1, 4, 5), (3,), (), (2, 0, 3), (1, 1, 1), (5, 1)])
def test_canonical_strides_are_torch_row_major(shape):
    assert canonical_strides(shape) == torch.empty(shape).stride()
    assert canonical_strides(torch.Size(shape)) == torch.empty(shape).stride()


def test_is_canonical_sees_through_size_one_dims():
    base = torch.randn(3, 4, 5)
    assert is_canonical(base)
    assert not is_canonical(base.transpose(0, 1))
    assert not is_canonical(torch.randn(1, 4, 5).expand(3, 4, 5))
    odd = base.as_strided((1, 4, 5), (7, 5, 1))  # is_contiguous() ignores the size-1 dim's stride
    assert odd.is_contiguous() and not is_canonical(odd)
    assert is_canonical(base[1:2])  # a canonical slice with an offset is fine


def test_is_canonical_is_the_exact_row_major_check_on_every_view():
    """Its fast path (contiguous, no size-1 or empty dims) agrees with comparing every stride."""
    base = torch.randn(4, 3, 6)
    views = [base, base[1:], base[:, 1:], base[..., ::2], base.transpose(1, 2), base.permute(2, 0, 1),
             base[:1], base[:, :1], base[2], base[2, 1], base.reshape(12, 6), base[:0], torch.randn(0, 3),
             torch.randn(3, 1).expand(3, 4), base.as_strided((4, 1, 6), (18, 99, 1)), torch.tensor(1.0)]
    for view in views:
        assert is_canonical(view) == (view.stride() == canonical_strides(view.shape)), (view.shape, view.stride())


def test_canonical_is_a_no_op_on_canonical_tensors():
    tensor = torch.randn(2, 3)
    assert canonical(tensor) is tensor


@pytest.mark.parametrize("make", [
    lambda base: base.transpose(0, 1),
    lambda base: base[:1].as_strided((1, 4, 5), (7, 5, 1)),
    lambda base: base[:, :1].expand(3, 4, 5),
    lambda base: base[..., ::2],
], ids=["transposed", "odd_strides", "expanded", "sliced"])
def test_canonical_rematerialises_differentiably(make):
    base = torch.randn(3, 4, 5, requires_grad=True)
    view = make(base)
    out = canonical(view)
    assert not is_canonical(view)
    assert is_canonical(out) and out.stride() == canonical_strides(view.shape)
    assert torch.equal(out, view)
    assert out.untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    weights = torch.randn(view.shape)
    (grad,) = torch.autograd.grad((out * weights).sum(), base)
    (expected,) = torch.autograd.grad((view * weights).sum(), base)
    torch.testing.assert_close(grad, expected, rtol=0, atol=0)


def test_canonical_under_vmap_makes_each_sample_canonical():
    batch = torch.randn(4, 5, 3).transpose(1, 2)  # each sample [3, 5] is transposed

    def per_sample(sample):
        out = canonical(sample)
        return torch.tensor([is_canonical(sample), is_canonical(out)]), out

    flags, out = torch.func.vmap(per_sample)(batch)
    assert not flags[:, 0].any() and flags[:, 1].all()
    assert torch.equal(out, batch)


# ------------------------------------------------------------------------------ precision per context
def test_precision_context_manager_is_context_local_nests_and_compiles(monkeypatch):
    """`recurrent_matmul_precision(mode)` beats the process setter in this thread only, nests,
    "auto" defers to the setter, a module argument still wins, and compiled code reads it per call."""
    from worldmodels.core.precision import recurrent_matmul_precision

    monkeypatch.setattr(precision_module, "_env_mode", None)
    cpu = torch.device("cpu")
    set_recurrent_matmul_precision("tf32")
    compiled = torch.compile(lambda x: x + CONCRETE_MODES.index(get_recurrent_matmul_precision(cpu)),
                             fullgraph=True, backend="eager")
    x = torch.zeros(1)
    with recurrent_matmul_precision(" BF16 "):  # normalised like every precision argument
        assert get_recurrent_matmul_precision(cpu) == "bf16"
        assert in_thread(lambda: get_recurrent_matmul_precision(cpu)) == "tf32"  # a worker keeps its own
        assert resolve_precision("tf32x3", cpu) == "tf32x3"
        assert compiled(x).item() == CONCRETE_MODES.index("bf16")
        with recurrent_matmul_precision("ieee"):
            assert get_recurrent_matmul_precision(cpu) == "ieee"
            assert compiled(x).item() == CONCRETE_MODES.index("ieee")
        with recurrent_matmul_precision("auto"):
            assert get_recurrent_matmul_precision(cpu) == "tf32"
        assert get_recurrent_matmul_precision(cpu) == "bf16"
    assert get_recurrent_matmul_precision(cpu) == "tf32"
    assert compiled(x).item() == CONCRETE_MODES.index("tf32")
    with pytest.raises(ValueError, match="mode='fp8'"), recurrent_matmul_precision("fp8"):
        pass
