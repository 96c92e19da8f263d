"""`+experiment=atari100k` composes the 2023 DreamerV3 Atari 100K protocol (danijar/dreamerv3 at 423291a,
configs.yaml `atari100k`, embodied/envs/atari.py), and its env does what that code's does: 0-29 NOOP
frames after each reset, no sticky actions, the minimal action set, ALE v5's 108000-frame limit, no flag
at a lost life, and frames shrunk as cv2.INTER_AREA shrinks them."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from tests._train_config import CONFIGS
from worldmodels.envs import check_env_config, env_info, make_env
from worldmodels.envs.suites.atari import area_weights, shrink

pytest.importorskip("ale_py", reason="ale-py is not installed")


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        return compose("config", overrides=["+experiment=atari100k", "logger=none",
                                            f"run_dir={tmp_path_factory.mktemp('atari100k') / 'run'}"])


def env_config(preset, **overrides):
    return OmegaConf.merge(preset.env, overrides)


def ale_of(env):
    return env._envs[0].base_env._env.unwrapped.ale


def test_the_preset_is_the_2023_atari100k_block(preset):
    """The values of configs.yaml's `atari100k` block over `defaults`, in our units (steps in frames)."""
    env, model, algo = preset.env, preset.model, preset.algo
    assert (env.suite, env.task, env.num_envs, env.action_repeat, env.size) == ("atari", "pong", 1, 4, 64)
    assert (env.sticky, env.noops, env.full_actions, env.grayscale, env.resize) == (False, 30, False, False, "opencv")
    assert env.time_limit is None  # ALE v5's own 108000 frames
    assert (preset.steps, preset.train_ratio, preset.batch_size, preset.seq_len) == (400_000, 1024, 16, 64)
    assert (preset.eval_every, preset.eval_episodes, preset.precision) == (400_000, 100, "ieee")
    assert (model.deter, model.hidden, model.stoch, model.classes, model.depth) == (512, 512, 32, 32, 32)
    assert (model.units, model.head_layers, model.actor_layers, model.norm, model.act) == (512, 2, 2, "layer", "silu")
    assert (model.cell, model.initial_state, model.init) == ("norm_gru", "learned", "dreamerv3")
    assert (algo.update_order, algo.imagined_continue, algo.start_state) == ("world_model_first", "mode", "initial")
    assert dict(algo.kl) == {"free": 1.0, "dyn": 0.5, "rep": 0.1} and algo.twohot_bins == "symlog"
    check_env_config(env)


def test_noop_starts_take_0_to_29_frames_after_each_reset(preset):
    """env.noops=30: each reset then takes a uniform count in [0, 30) of NOOP frames (atari.py `_reset`:
    randint(noops)); env.noops=0 takes none."""
    env = make_env(env_config(preset), seed=0)
    ale, frames = ale_of(env), []
    for _ in range(40):
        env.reset()
        frames.append(ale.getEpisodeFrameNumber())
    assert min(frames) >= 0 and max(frames) <= 29 and len(set(frames)) > 10
    plain = make_env(env_config(preset, noops=0), seed=0)
    plain.reset()
    assert ale_of(plain).getEpisodeFrameNumber() == 0


def test_no_sticky_actions_the_minimal_action_set_and_the_v5_frame_limit(preset):
    env = make_env(env_config(preset), seed=0)
    ale = ale_of(env)
    assert ale.getFloat("repeat_action_probability") == 0.0  # env.atari.sticky False
    assert ale.getInt("max_num_frames_per_episode") == 108_000  # atari.py length=108000
    assert env_info(env) == {"obs_key": "pixels", "obs_shape": (3, 64, 64), "action_dim": 6, "discrete": True}


def test_a_lost_life_neither_ends_the_episode_nor_marks_the_step(preset):
    """lives: unused (configs.yaml `defaults`): Breakout's first lost life is a step like any other."""
    env = make_env(env_config(preset, task="breakout"), seed=0)
    ale, generator = ale_of(env), torch.Generator().manual_seed(0)
    td = env.reset()
    lives = ale.lives()
    for _ in range(2000):
        td["action"] = torch.nn.functional.one_hot(torch.randint(4, (1,), generator=generator), 4)
        td = env.step(td)["next"]
        if ale.lives() < lives:
            break
    assert ale.lives() == lives - 1, "no life lost in 2000 steps"
    assert not td["done"].any() and not td["terminated"].any() and not td["truncated"].any()


def test_opencv_resize_is_cv2_inter_area():
    """`shrink` by `area_weights` equals cv2.resize(frame, (64, 64), interpolation=cv2.INTER_AREA)
    on a 210x160 frame of noise: its crc32 and pixels as opencv-python-headless 5.1.0.95 made them."""
    frame = np.random.default_rng(0).integers(0, 256, (210, 160, 3), dtype=np.uint8)
    out = shrink(frame, area_weights(210, 64), area_weights(160, 64))
    assert out[0, 0].tolist() == [126, 161, 186] and out[63, 63].tolist() == [136, 102, 141]
    assert zlib.crc32(out.tobytes()) == 1800566685


def test_the_env_frame_is_the_resized_max_of_the_last_two(preset):
    """With resize=opencv the env's frame is the max of a step's last two frames, area-weighted to 64x64."""
    env = make_env(env_config(preset, noops=0), seed=0)
    ale = ale_of(env)
    td = env.reset()
    td["action"] = torch.nn.functional.one_hot(torch.tensor([2]), 6)
    screens = []
    gym_env = env._envs[0].base_env._env
    step = gym_env.unwrapped.step

    def recording(action):
        result = step(action)
        screens.append(ale.getScreenRGB())
        return result

    gym_env.unwrapped.step = recording
    frame = env.step(td)["next", "pixels"][0]
    want = shrink(np.maximum(screens[-2], screens[-1]), area_weights(210, 64), area_weights(160, 64))
    assert len(screens) == 4 and torch.equal(frame, torch.as_tensor(want).permute(2, 0, 1))


@pytest.mark.parametrize(("override", "message"), [({"noops": -1}, "env.noops=-1"),
                                                   ({"resize": "bilinear"}, "env.resize='bilinear'"),
                                                   ({"size": 256}, "env.size=256 with env.resize='opencv'")])
def test_invalid_options_name_the_field(preset, override, message):
    with pytest.raises(ValueError, match=message):
        check_env_config(env_config(preset, **override))
