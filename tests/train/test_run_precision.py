"""The run config's `precision` speaks the recurrent core's names (`ieee`, `tf32`, `tf32x3`, `bf16`,
`fast`, `high-prec`, `auto`) and `fp16`: what each sets, what fp16 refuses, and the old spelling `fp32`
read as `ieee`, with a one-time warning, in new and stored configs alike."""

from __future__ import annotations

import warnings

import pytest
import torch
from omegaconf import OmegaConf

from tests._train_config import run_config
from worldmodels.core import get_recurrent_matmul_precision
from worldmodels.core.precision import USER_MODES
from worldmodels.train import config
from worldmodels.train.config import ConfigError, RunPrecision, upgrade, validate
from worldmodels.train.run_dir import config_changes


@pytest.mark.parametrize("mode", USER_MODES)
def test_every_core_precision_name_is_a_valid_run_precision(tmp_path, mode):
    cfg = run_config(tmp_path, f"precision={mode}")
    validate(cfg)
    assert cfg.precision == mode


def test_each_precision_sets_torch_and_the_recurrent_core():
    bf16, fp16 = torch.bfloat16, torch.float16
    expected = {"ieee": ("highest", "ieee", None, False), "tf32": ("high", "tf32", None, False),
                "tf32x3": ("high", "tf32x3", None, False), "fast": ("high", "fast", None, False),
                "high-prec": ("high", "high-prec", None, False), "bf16": ("high", "bf16", bf16, False),
                "fp16": ("high", "ieee", fp16, True), "auto": (None, None, None, False),
                "fp32": ("highest", "ieee", None, False)}
    for mode, want in expected.items():
        run = RunPrecision.of(mode)
        assert (run.float32_matmul, run.recurrent, run.autocast, run.loss_scale) == want, mode
    RunPrecision.of("tf32").apply()
    assert torch.get_float32_matmul_precision() == "high"
    assert get_recurrent_matmul_precision(torch.device("cpu")) != "tf32"  # the core's mode: only in its context
    with RunPrecision.of("tf32").recurrent_context():
        assert get_recurrent_matmul_precision(torch.device("cpu")) == "tf32"
    RunPrecision.of("auto").apply()  # leaves torch's setting
    assert torch.get_float32_matmul_precision() == "high"
    torch.set_float32_matmul_precision("highest")
    with pytest.raises(ConfigError, match=r"precision='fp8'.*'ieee'"):
        RunPrecision.of("fp8")


def test_old_spelling_fp32_reads_as_ieee_with_one_message(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "_warned", set())
    cfg = run_config(tmp_path, "precision=fp32")
    with pytest.warns(FutureWarning, match=r"precision=fp32 is the old spelling of precision=ieee.*use precision=ieee"):
        validate(cfg)
    assert cfg.precision == "ieee"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        validate(run_config(tmp_path, "precision=fp32"))  # once per process
    with pytest.raises(ConfigError, match=r"precision='fp8' is not valid.*'high-prec'"):
        validate(run_config(tmp_path, "precision=fp8"))


@pytest.mark.parametrize("stored_precision", ["fp32", None])
def test_a_stored_config_with_fp32_or_without_precision_resumes_unchanged(tmp_path, stored_precision):
    """A run directory's config.yaml from before the core's names (`fp32`) or before the field
    (IEEE then too) reads as `ieee`: resuming it with today's default changes nothing."""
    stored = OmegaConf.to_container(run_config(tmp_path), resolve=True)
    if stored_precision is None:
        del stored["precision"]
    else:
        stored["precision"] = stored_precision
    stored = OmegaConf.create(stored)
    assert config_changes(stored, run_config(tmp_path)) == ({}, {})
    assert upgrade(stored.copy(), warn=False).precision == "ieee"
    _, allowed = config_changes(stored, run_config(tmp_path, "precision=bf16"))
    assert allowed == {"precision": ("ieee", "bf16")}


@pytest.mark.parametrize("overrides, field", [
    (("backend=triton",), "backend=triton"),
    (("algo.optim.kind=laprop",), "algo.optim.kind=laprop"),
    (("algo.update_order=same_weights",), "algo.update_order=same_weights"),
])
def test_fp16_refuses_what_its_loss_scale_cannot_take_naming_the_field(tmp_path, overrides, field):
    with pytest.raises(ConfigError, match=f"precision=fp16 with {field}"):
        validate(run_config(tmp_path, "precision=fp16", "algo.update_order=world_model_first", *overrides))


def test_fp16_refuses_the_fused_kernels_where_they_are_not_available_too(tmp_path, monkeypatch):
    """Where Triton cannot run on the config's device (a GPU machine's CPU without the interpreter),
    precision=fp16 with backend=triton still gets fp16's refusal, not the machine's: it holds anywhere."""
    monkeypatch.setattr(config, "available_backends", lambda device: ("loop", "scan", "cudnn"))
    with pytest.raises(ConfigError, match="precision=fp16 with backend=triton"):
        validate(run_config(tmp_path, "precision=fp16", "algo.update_order=world_model_first", "backend=triton"))
    with pytest.raises(ConfigError, match="backend='triton' is not available"):
        validate(run_config(tmp_path, "backend=triton"))


SMALL_2023 = ("+experiment=dmc_proprio_2023", "env=pendulum", "model.encoder_units=32", "model.units=16",
              "model.deter=16", "model.hidden=16")


@pytest.mark.parametrize("overrides, optimisers", [
    (SMALL_2023, {"model", "actor", "critic"}),
    (("algo=dreamer_v1",), {"model", "actor", "value"}),
    (("algo=planet",), {"model"}),
], ids=["dreamer_v3_2023", "dreamer_v1", "planet"])
def test_fp16_is_valid_where_every_optimiser_has_its_own_backward(tmp_path, overrides, optimisers):
    """DreamerV3 in the 2023 order, Dreamer V1 and PlaNet take fp16: the run builds, under float16
    autocast, and each of the algorithm's optimisers holds a loss scale of its own (the reference's
    bounds, 1e-4 to 1e4)."""
    from worldmodels.algos.optim import LossScale
    from worldmodels.train import Trainer

    trainer = Trainer(run_config(tmp_path, "precision=fp16", *overrides))
    assert trainer.precision.autocast == torch.float16
    scales = {name: opt.loss_scale for name, opt in trainer.agent.optimizers().items()}
    assert set(scales) == optimisers
    assert all(isinstance(s, LossScale) and (s.low, s.high) == (1e-4, 1e4) for s in scales.values())
    assert len({id(s) for s in scales.values()}) == len(scales)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_cache_sums_a_recurrent_weights_gradient_in_half_precision(dtype):
    """Why a run's updates (`train/config.update_autocast`) turn autocast's cache of cast weights off: a
    weight used at every step of an unroll (an RSSM's Linear) shares one cast with the cache on, so
    autograd adds the steps' gradients in the half dtype before the cast's backward reaches the float32
    weight; with it off, each use casts on its own and the sum is float32. Plain torch, against float64.
    If torch starts adding them in float32 with the cache on, the two agree and this test says so."""
    gen = torch.Generator().manual_seed(0)
    w, x0 = torch.randn(64, 64, generator=gen) / 8, torch.randn(32, 64, generator=gen)

    def weight_grad(run_dtype, cache: bool) -> torch.Tensor:
        w_ = w.to(torch.float64 if run_dtype is None else torch.float32, copy=True).requires_grad_()
        h, x = x0.to(w_.dtype), x0.to(w_.dtype)
        with torch.autocast("cpu", dtype=run_dtype or torch.bfloat16, enabled=run_dtype is not None,
                            cache_enabled=cache):
            for _ in range(64):
                h = torch.tanh(torch.nn.functional.linear(h, w_)) + 0.5 * x
            h.to(w_.dtype).square().mean().backward()
        return w_.grad.double()

    exact = weight_grad(None, cache=False)
    error = {cache: ((weight_grad(dtype, cache) - exact).norm() / exact.norm()).item() for cache in (True, False)}
    assert error[True] > 1.5 * error[False], (f"torch {torch.__version__}: with autocast's cache on, a recurrent "
                                              f"weight's gradient is no longer worse in {dtype} ({error}): "
                                              "update_autocast's cache_enabled=False may go")
