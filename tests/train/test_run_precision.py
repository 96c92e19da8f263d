"""The run config's `precision` speaks the recurrent core's names (`ieee`, `tf32`, `tf32x3`, `bf16`,
`fast`, `high-prec`, `auto`): what each sets, and the old spelling `fp32` read as `ieee`, with a
one-time warning, in new and stored configs alike."""

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
    expected = {"ieee": ("highest", "ieee", False), "tf32": ("high", "tf32", False),
                "tf32x3": ("high", "tf32x3", False), "fast": ("high", "fast", False),
                "high-prec": ("high", "high-prec", False), "bf16": ("high", "bf16", True),
                "auto": (None, None, False), "fp32": ("highest", "ieee", False)}
    for mode, (matmul, recurrent, autocast) in expected.items():
        run = RunPrecision.of(mode)
        assert (run.float32_matmul, run.recurrent, run.autocast) == (matmul, recurrent, autocast), mode
    RunPrecision.of("tf32").apply()
    assert torch.get_float32_matmul_precision() == "high"
    assert get_recurrent_matmul_precision(torch.device("cpu")) != "tf32"  # the core's mode: only in its context
    with RunPrecision.of("tf32").recurrent_context():
        assert get_recurrent_matmul_precision(torch.device("cpu")) == "tf32"
    RunPrecision.of("auto").apply()  # leaves torch's setting
    assert torch.get_float32_matmul_precision() == "high"
    torch.set_float32_matmul_precision("highest")
    with pytest.raises(ConfigError, match=r"precision='fp16'.*'ieee'"):
        RunPrecision.of("fp16")


def test_old_spelling_fp32_reads_as_ieee_with_one_message(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "_warned", set())
    cfg = run_config(tmp_path, "precision=fp32")
    with pytest.warns(FutureWarning, match=r"precision=fp32 is the old spelling of precision=ieee.*use precision=ieee"):
        validate(cfg)
    assert cfg.precision == "ieee"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        validate(run_config(tmp_path, "precision=fp32"))  # once per process
    with pytest.raises(ConfigError, match=r"precision='fp16' is not valid.*'high-prec'"):
        validate(run_config(tmp_path, "precision=fp16"))


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
