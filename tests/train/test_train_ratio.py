"""`train_ratio` counts replayed steps per agent step (DreamerV3's unit; the update count of a run is
checked in test_train.py): configs written when it counted per frame are read at their own rate
or refused naming the conversion; the DreamerV3, PlaNet and Dreamer V1 protocol presets compose with
any dmc env."""

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
    assert cfg.precision == "high-prec"  # TF32 nets, tf32x3 core: the reference computes in bfloat16
    validate(cfg)
    assert preset(f"+experiment={name}").env.task == "walker/walk"  # the reference's default task
    mine = preset(f"+experiment={name}", "env=dmc", "env.task=finger/spin", "model=size1m", "train_ratio=256")
    assert (mine.env.task, mine.model.deter, mine.train_ratio, mine.env.num_envs) == ("finger/spin", 512, 256, 16)


def test_the_2023_protocol_preset_is_what_the_published_dmc_scores_were_made_with():
    """danijar/dreamerv3 423291a, configs.yaml `defaults` + `dmc_proprio` (the score file's runs; the
    preset's header says how that was established)."""
    cfg = preset("+experiment=dmc_proprio_2023", "env=cheetah_run")
    assert (cfg.env.task, cfg.env.action_repeat, cfg.env.num_envs, cfg.env.pixels) == ("cheetah/run", 2, 4, False)
    assert (cfg.steps, cfg.train_ratio, cfg.batch_size, cfg.seq_len) == (500_000, 512, 16, 64)
    model, algo = cfg.model, cfg.algo
    assert (model.deter, model.hidden, model.stoch, model.classes, model.norm) == (512, 512, 32, 32, "layer")
    assert (model.cell, model.initial_state) == ("norm_gru", "learned")
    assert (model.units, model.head_layers, model.actor_layers) == (512, 2, 2)
    assert (model.encoder_units, model.encoder_layers, model.actor_outscale, model.init_fan) == (1024, 5, 1.0, "avg")
    assert (algo.actor_grad, algo.twohot_bins, algo.replay_context, algo.replay_critic) == ("backprop", "symlog",
                                                                                             False, 0.0)
    assert (algo.kl.dyn, algo.kl.rep, algo.kl.free) == (0.5, 0.1, 1.0)
    opt = algo.optim
    assert (opt.kind, opt.model_lr, opt.actor_lr, opt.critic_lr, opt.agc) == ("adam", 1e-4, 3e-5, 3e-5, 0.0)
    assert (opt.model_eps, opt.eps, opt.model_clip, opt.clip) == (1e-8, 1e-5, 1000.0, 100.0)
    assert cfg.replay.cross_episodes
    validate(cfg)


# PlaNet (google-research/planet c04226b, planet/scripts/tasks.py): the action repeat of each task, and the
# train ratio it implies: one 1000-frame episode per 100 updates of 50 x 50 = 250 replayed steps per frame.
PLANET_REPEAT = {"cartpole_swingup": 8, "cheetah_run": 4, "walker_walk": 2}


@pytest.mark.parametrize("env", sorted(PLANET_REPEAT))
def test_planet_protocol_preset_follows_the_task(env):
    cfg = preset("+experiment=planet_dmc", f"env={env}")
    repeat = PLANET_REPEAT[env]
    assert (cfg.algo.name, cfg.env.name, cfg.env.action_repeat, cfg.env.num_envs) == ("planet", env, repeat, 1)
    assert (cfg.env.pixels, cfg.env.pixels_only, cfg.env.size) == (True, True, 64)
    assert (cfg.steps, cfg.prefill, cfg.batch_size, cfg.seq_len) == (1_000_000, 5000, 50, 50)
    assert cfg.train_ratio == 250 * repeat  # 100 updates x 50 x 50 per episode of 1000 / repeat agent steps
    assert OmegaConf.to_container(cfg.algo.cem) == {"horizon": 12, "candidates": 1000, "top": 100, "iterations": 10}
    assert (cfg.algo.explore_noise, cfg.algo.kl.free) == (0.3, 3.0)
    assert (cfg.algo.optim.model_lr, cfg.algo.optim.eps, cfg.algo.optim.clip) == (1e-3, 1e-4, 1000.0)
    assert (cfg.model.deter, cfg.model.stoch, cfg.model.units, cfg.model.classes) == (200, 30, 300, None)
    # configs.py: activation relu, image_bits 5, loss_scales reward 10
    assert (cfg.model.act, cfg.model.cnn_act, cfg.model.image_bits, cfg.algo.reward_scale) == ("relu", None, 5, 10.0)
    validate(cfg)


def test_planet_protocol_preset_other_tasks_and_repeats():
    assert preset("+experiment=planet_dmc").env.task == "cheetah/run"  # the reference's default task
    for task, repeat in (("reacher/easy", 4), ("finger/spin", 2), ("ball_in_cup/catch", 4), ("cartpole/swingup", 8)):
        cfg = preset("+experiment=planet_dmc", "env=dmc", f"env.task={task}")
        assert (cfg.env.action_repeat, cfg.train_ratio) == (repeat, 250 * repeat)
    mine = preset("+experiment=planet_dmc", "env=walker_walk", "env.action_repeat=8")
    assert mine.train_ratio == 2000  # the train ratio follows a repeat given on the command line
    unknown = preset("+experiment=planet_dmc", "env=dmc", "env.task=hopper/hop")  # no PlaNet repeat: name one
    with pytest.raises(ConfigError, match=r"env\.action_repeat=None must be an int >= 1"):
        validate(unknown)
    validate(preset("+experiment=planet_dmc", "env=dmc", "env.task=hopper/hop", "env.action_repeat=4"))


@pytest.mark.parametrize("env", ["cartpole_swingup", "cheetah_run", "walker_walk"])
def test_dreamer_v1_protocol_preset_composes_with_any_dmc_env(env, monkeypatch):
    from worldmodels.train import config
    cfg = preset("+experiment=dreamer_v1_dmc", f"env={env}")
    # its replay keeps every episode (29 GiB of frames in RAM): refused, naming the way out, on a smaller machine
    monkeypatch.setattr(config, "_ram_bytes", lambda: 16 * 2**30)
    with pytest.raises(ConfigError, match=r"replay\.memory_gb=32 take at least 29\.\d GiB in RAM.*replay\.memmap=true"):
        validate(cfg)
    validate(preset("+experiment=dreamer_v1_dmc", f"env={env}", "replay.memmap=true"))
    monkeypatch.setattr(config, "_ram_bytes", lambda: 128 * 2**30)  # the GPU machine the runs used
    assert (cfg.algo.name, cfg.env.name, cfg.env.action_repeat, cfg.env.num_envs) == ("dreamer_v1", env, 2, 1)
    assert (cfg.env.pixels, cfg.env.pixels_only, cfg.env.size) == (True, True, 64)
    # 100 updates of 50 x 50 every 1000 frames (500 agent steps) for 5M frames after 5000 random ones
    assert (cfg.steps, cfg.prefill, cfg.batch_size, cfg.seq_len, cfg.train_ratio) == (5_000_000, 5000, 50, 50, 500)
    assert (cfg.algo.horizon, cfg.algo.gamma, cfg.algo.lam, cfg.algo.kl.free) == (15, 0.99, 0.95, 3.0)
    optim = cfg.algo.optim
    assert (optim.model_lr, optim.actor_lr, optim.critic_lr, optim.eps, optim.clip) == (6e-4, 8e-5, 8e-5, 1e-7, 100.0)
    assert (cfg.model.deter, cfg.model.stoch, cfg.model.units, cfg.model.actor_layers) == (200, 30, 400, 4)
    # dreamer.py: cnn_act relu, dense_act elu; images as p / 255 - 0.5; the reward unweighted
    assert (cfg.model.act, cfg.model.cnn_act, cfg.model.image_bits, cfg.algo.reward_scale) == ("elu", "relu", None, 1.0)
    assert cfg.precision == "tf32"  # chosen against ieee / bf16 / fp16 by benchmarks.loop_pace (the preset says why)
    validate(cfg)
    assert preset("+experiment=dreamer_v1_dmc").env.task == "walker/walk"  # the reference's default task


def test_pendulum_keeps_its_update_rate():
    """env=pendulum tunes CPU training: 128 per agent step at action repeat 2 is the 64 per frame
    the README's curve was measured with."""
    cfg = preset("env=pendulum")
    assert cfg.train_ratio / cfg.env.action_repeat == 64
