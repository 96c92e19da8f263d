"""`train_ratio` counts replayed steps per agent step (DreamerV3's unit; the update count of a run is
checked in test_train.py): configs written when it counted per frame are read at their own rate
or refused naming the conversion; the DreamerV3 protocol presets compose with any env."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests._train_config import CONFIGS, run_config
from worldmodels.train import ConfigError, Trainer
from worldmodels.train import config as config_module
from worldmodels.train.config import check_resume_unit, upgrade, validate
from worldmodels.train.run_dir import config_changes


def old_run_dir(tmp_path, train_ratio: int):
    """A run directory as the code before `train_ratio_unit` left it: a checkpoint directory and a
    config.yaml whose train_ratio counted per frame (no train_ratio_unit)."""
    stored = OmegaConf.to_container(run_config(tmp_path), resolve=True)
    del stored["train_ratio_unit"]
    stored["train_ratio"] = train_ratio
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step-0000000080").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(stored)))
    return run_dir, OmegaConf.create(stored)


def test_resuming_an_old_run_at_another_rate_is_refused_naming_the_conversion(tmp_path):
    run_dir, _ = old_run_dir(tmp_path, train_ratio=8)  # 8 per frame at action repeat 2
    message = (r"train_ratio=8 would change the update rate.*predates train_ratio_unit.*per env step \(frame\)"
               r".*train_ratio=16 \(= 8 x env\.action_repeat=2\): resume with train_ratio=16")
    with pytest.raises(ConfigError, match=message):
        Trainer(run_config(tmp_path, "train_ratio=8"))
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoints", "config.yaml"]  # nothing written


def test_the_converted_number_resumes_an_old_run_unchanged(tmp_path):
    run_dir, stored = old_run_dir(tmp_path, train_ratio=8)
    new = run_config(tmp_path, "train_ratio=16")
    check_resume_unit(run_dir, new)  # accepted
    refused, allowed = config_changes(stored, new)  # the resume check reads the stored config upgraded
    assert not refused and not allowed
    assert "train_ratio" in config_changes(stored, run_config(tmp_path, "train_ratio=8"))[0]


def test_a_config_without_the_unit_is_read_per_frame(monkeypatch):
    monkeypatch.setattr(config_module, "_warned", set())
    cfg = OmegaConf.create({"train_ratio": 64, "env": {"action_repeat": 2}})
    with pytest.warns(FutureWarning, match=r"train_ratio=64 replayed steps per env step \(frame\): read as "
                                           r"train_ratio=128 \(x env\.action_repeat=2\)"):
        upgrade(cfg)
    assert (cfg.train_ratio, cfg.train_ratio_unit) == (128, "agent_step")
    assert upgrade(cfg).train_ratio == 128  # once only


def test_another_unit_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"train_ratio_unit='frame' is not valid; expected one of \['agent_step'\]"):
        validate(run_config(tmp_path, "train_ratio_unit=frame"))


def preset(*overrides: str):
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        return compose("config", overrides=["device=cpu", *overrides])


@pytest.mark.parametrize("name, steps, pixels", [("dmc_proprio", 500_000, False), ("dmc_vision", 1_000_000, True)])
def test_dreamerv3_protocol_presets_compose_with_any_dmc_env(name, steps, pixels):
    cfg = preset(f"+experiment={name}", "env=cheetah_run")
    assert (cfg.env.task, cfg.env.action_repeat, cfg.env.num_envs, cfg.env.pixels) == ("cheetah/run", 2, 16, pixels)
    assert (cfg.steps, cfg.train_ratio, cfg.batch_size, cfg.seq_len, cfg.model.deter) == (steps, 512, 16, 64, 2048)
    assert cfg.precision == "tf32"  # the reference computes in bfloat16; fp32 would halve the frames/s
    validate(cfg)
    assert preset(f"+experiment={name}").env.task == "walker/walk"  # the reference's default task
    mine = preset(f"+experiment={name}", "env=dmc", "env.task=finger/spin", "model=size1m", "train_ratio=256")
    assert (mine.env.task, mine.model.deter, mine.train_ratio, mine.env.num_envs) == ("finger/spin", 512, 256, 16)


def test_pendulum_keeps_its_update_rate():
    """env=pendulum tunes CPU training: 128 per agent step at action repeat 2 is the 64 per frame
    the README's curve was measured with."""
    cfg = preset("env=pendulum")
    assert cfg.train_ratio / cfg.env.action_repeat == 64
