"""The backend registry: one registration makes a backend appear everywhere names are read
(context setting, modules, `auto`, run-config validation), and `auto`'s rules per situation."""

from __future__ import annotations

import warnings

import pytest
import torch

import worldmodels
from worldmodels.core import IMPLEMENTED_BACKENDS, recurrent_backend, registry, torch_fixes
from worldmodels.core.registry import Backend
from worldmodels.ops.rnn import reference
from worldmodels.train.config import ConfigError, validate

CALLS: list[str] = []


def recording_rnn(*args, **kwargs):
    """The stand-in backend's `rnn` op: the reference math, recorded."""
    CALLS.append("standin")
    return reference.rnn(*args, **kwargs)


LOOP = registry.get("loop").ops


@pytest.fixture
def standin():
    CALLS.clear()
    backend = registry.register(Backend(
        "standin", {"rnn": f"{__name__}:recording_rnn", "rssm_observe": LOOP["rssm_observe"],
                    "rssm_imagine": LOOP["rssm_imagine"]},
        auto=lambda device, compiling, vmapped: not compiling, priority=-1, description="a test double"))
    try:
        yield backend
    finally:
        registry.unregister("standin")


def test_registered_backend_appears_everywhere(standin, tmp_path):
    from tests._train_config import run_config

    assert "standin" in IMPLEMENTED_BACKENDS and "standin" in worldmodels.core.BACKENDS
    assert "standin" in registry.available_backends("cpu", "rnn")
    gru = worldmodels.GRU(3, 4, backend="standin")  # module argument
    x = torch.randn(2, 5, 3)
    torch.testing.assert_close(gru(x)[0], gru(x, backend="loop")[0])
    with recurrent_backend("standin"):  # context setting
        worldmodels.GRU(3, 4)(x)
    worldmodels.GRU(3, 4)(x, backend="auto")  # auto: its priority beats cudnn's in eager code
    assert CALLS == ["standin"] * 3
    validate(run_config(tmp_path, "backend=standin"))  # the run config accepts it


def test_unregistered_backend_is_gone_everywhere(standin, tmp_path):
    from tests._train_config import run_config

    registry.unregister("standin")
    assert "standin" not in IMPLEMENTED_BACKENDS
    with pytest.raises(ValueError, match="standin"):
        worldmodels.GRU(3, 4, backend="standin")
    with pytest.raises(ConfigError, match="backend"):
        validate(run_config(tmp_path, "backend=standin"))


def test_backend_lacking_an_op_says_which_backends_have_it(standin):
    registry.register(Backend("rnn_only", {"rnn": LOOP["rnn"]}))
    try:
        rssm = worldmodels.RSSM(2, 5, deter=8, stoch=3, hidden=6)
        embed, action = torch.randn(2, 4, 5), torch.randn(2, 4, 2)
        with pytest.raises(ValueError, match="rnn_only.*rssm_observe.*available backends.*'loop'"):
            rssm.observe(embed, action, torch.zeros(2, 4, dtype=torch.bool), backend="rnn_only")
    finally:
        registry.unregister("rnn_only")


def test_register_rejects_bad_names_and_families():
    with pytest.raises(ValueError, match="auto"):
        registry.register(Backend("auto", {}))
    with pytest.raises(ValueError, match="unknown op families"):
        registry.register(Backend("odd", {"lstm_only": LOOP["rnn"]}))


@pytest.mark.parametrize("compiling, vmapped, expected", [
    (False, False, "cudnn"), (False, True, "loop"),
    (True, False, "scan" if torch_fixes.scan_compiles_correctly() else "loop"), (True, True, "loop"),
])
def test_auto_rules(compiling, vmapped, expected):
    for family in ("rnn", "rssm_observe", "rssm_imagine"):
        assert registry.choose_auto(family, torch.device("cpu"), compiling=compiling, vmapped=vmapped) == expected


def test_scan_under_compile_is_refused_and_auto_avoids_it_where_torch_is_wrong(monkeypatch):
    """On torch < 2.13 inductor's scan gradients are wrong (core/torch_fixes.py); simulated here."""
    monkeypatch.setattr(torch_fixes, "scan_compiles_correctly", lambda version=None: False)
    assert registry.choose_auto("rnn", torch.device("cpu"), compiling=True, vmapped=False) == "loop"
    gru = worldmodels.GRU(3, 4)
    x = torch.randn(2, 3, 3)
    compiled = torch.compile(lambda x: gru(x, backend="scan")[0], fullgraph=True, backend="eager")
    with pytest.raises(Exception, match="scan.*wrong gradients"):
        compiled(x)


def test_triton_on_cpu_without_the_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="triton") as info:
        worldmodels.GRU(3, 4)(torch.randn(2, 3, 3), backend="triton")
    assert "'loop'" in str(info.value)


_V1 = dict(deter=8, stoch=3, hidden=6)  # the dense GRU cell (PlaNet / Dreamer V1)
_V3_12M = dict(deter=2048, stoch=32, classes=16, hidden=256, cell="block_gru", blocks=8, norm="rms", act="silu")
_V3_S = dict(deter=16, stoch=4, classes=4, hidden=8, cell="block_gru", blocks=2, norm="rms", act="silu")


@pytest.mark.parametrize("model, kind, precision, grad, expected", [
    # tensor-core dots: the fused kernel is ahead (docs/kernels.md)
    (_V1, "observe", "tf32", False, True), (_V1, "observe", "bf16", False, True),
    (_V1, "observe", "tf32x3", False, True), (_V1, "observe", "tf32", True, True),
    (_V3_S, "actor", "tf32", False, True), (_V3_S, "open", "bf16", True, True),
    (_V1, "open", "tf32", False, True),
    # fp32 FMA dots: cudnn is faster
    (_V1, "observe", "ieee", False, False), (_V1, "observe", "ieee", True, False),
    # deter 2048: cudnn's IEEE graphs win in tf32x3, and its backward for imagination with grad; the
    # training observe (B16 T64) fused with grad: the size12m update 1.6-2x faster (learner_suite_*.json)
    (_V3_12M, "open", "tf32x3", False, False), (_V3_12M, "open", "tf32", True, False),
    (_V3_12M, "open", "tf32", False, True), (_V3_12M, "observe", "tf32", True, True),
    (_V3_12M, "observe", "bf16", True, True), (_V3_12M, "observe", "tf32x3", True, False),
    # a policy the kernel does not fuse runs on the loop reference: not the Actor, or a dist it does not sample
    (_V3_S, "policy", "tf32", False, False), (_V3_S, "actor:bounded_normal", "tf32", False, False),
    # the dense cell's imagination with the Actor: cudnn's graphs are faster (V1-imagine-actor)
    (_V1, "actor", "tf32", False, False), (_V1, "actor", "bf16", True, False),
])
def test_default_backend_for_rssm_unrolls(model, kind, precision, grad, expected):
    """`auto`'s choice between the fused RSSM kernel and cudnn, case by case, as measured on the H200."""
    spec = worldmodels.RSSM(6, 64, **model).op_spec()
    kind, _, dist = kind.partition(":")
    problem = {"spec": spec, "dtype": torch.float32, "precision": precision, "grad": grad, "kind": kind,
               "policy_dist": dist or "tanh_normal", "batch": 16, "steps": 64}
    assert registry.get("triton").fits(problem) is expected


@pytest.mark.parametrize("rows, grad, expected", [(1000, False, True), (2048, False, True), (4000, False, False),
                                                  (16000, False, False), (16000, True, True)])
def test_wide_open_loop_without_gradients_stays_on_cudnn(rows, grad, expected):
    """PlaNet's planner: 1,000 candidates plan faster fused, 16,000 (16 envs at once) on cudnn (H100,
    tf32, docs/results/planner_rate_by_precision_h100.json); a backward is not part of that rule."""
    problem = {"spec": worldmodels.RSSM(6, 64, **_V1).op_spec(), "dtype": torch.float32, "precision": "tf32",
               "grad": grad, "kind": "open", "batch": rows, "steps": 12}
    assert registry.get("triton").fits(problem) is expected


def test_an_explicit_triton_call_in_ieee_on_cuda_warns_once(monkeypatch):
    from worldmodels.ops import triton_utils

    monkeypatch.setattr(triton_utils, "_warned", set())
    cuda = torch.device("cuda", 0)
    with pytest.warns(UserWarning, match="'ieee' precision.*slower than backend='cudnn'"):
        triton_utils.warn_if_slower_than_cudnn(cuda, torch.float32, "ieee", "the GRU")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        triton_utils.warn_if_slower_than_cudnn(cuda, torch.float32, "ieee", "the GRU")  # once per op
        triton_utils.warn_if_slower_than_cudnn(cuda, torch.float32, "tf32", "the LSTM")
        triton_utils.warn_if_slower_than_cudnn(torch.device("cpu"), torch.float32, "ieee", "the LSTM")
        triton_utils.warn_if_slower_than_cudnn(cuda, torch.float64, "ieee", "the LSTM")
