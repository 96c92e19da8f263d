"""Env factory: one interface (keys, dtypes, action range, done flags) across suites; task names
checked per suite with the nearest valid names; custom entry points; dict observations."""

from __future__ import annotations

import re

import pytest
import torch
from omegaconf import OmegaConf

from worldmodels.envs import PRESETS, check_env_config, env_info, env_label, headless_gl, make_env
from worldmodels.envs.pixels import PixelsCHW, image_layout
from worldmodels.envs.suites import atari_id


def env_cfg(name: str, **overrides):
    base = dict(name=name, pixels=False, size=64, action_repeat=2, time_limit=None, num_envs=2, parallel=False)
    return OmegaConf.create({**base, **overrides})


def gl_renders() -> bool:
    """True when MuJoCo can render offscreen here (EGL or OSMesa)."""
    if headless_gl() is None:
        return False
    try:
        from dm_control import suite

        suite.load("cartpole", "swingup").physics.render(8, 8)
        return True
    except Exception:
        return False


needs_gl = pytest.mark.skipif(not gl_renders(),
                              reason="no offscreen OpenGL (EGL/OSMesa) for MuJoCo rendering on this machine")


def test_pendulum_state_env_steps_and_truncates():
    env = make_env(env_cfg("pendulum", time_limit=5), seed=0)
    info = env_info(env)
    assert info == {"obs_key": "observation", "obs_shape": (3,), "action_dim": 1, "discrete": False}
    # actions are rescaled to [-1, 1]
    assert torch.equal(env.action_spec.space.low, -torch.ones(2, 1))
    td = env.reset()
    assert td["observation"].shape == (2, 3) and td["observation"].dtype == torch.float32
    for step in range(5):
        td["action"] = torch.ones(2, 1)
        out = env.step(td)
        td = out["next"]
    assert out["next", "truncated"].all() and not out["next", "terminated"].any()


def test_action_repeat_sums_rewards():
    single, double = (make_env(env_cfg("pendulum", action_repeat=r, num_envs=1), seed=3) for r in (1, 2))
    a, b = single.reset(), double.reset()
    assert torch.allclose(a["observation"], b["observation"])
    total = 0.0
    for _ in range(2):
        a["action"] = torch.full((1, 1), 0.5)
        a = single.step(a)
        total += a["next", "reward"].item()
        a = a["next"]
    b["action"] = torch.full((1, 1), 0.5)
    b = double.step(b)
    assert b["next", "reward"].item() == pytest.approx(total, rel=1e-5)
    assert torch.allclose(a["observation"], b["next", "observation"])


def test_unknown_env_name_fails_naming_the_field():
    with pytest.raises(ValueError, match=r"env\.name='nope'"):
        make_env(env_cfg("nope"), seed=0)


@needs_gl
def test_dm_control_pixels_render_straight_at_64():
    env = make_env(env_cfg("cartpole_swingup", pixels=True), seed=0)
    info = env_info(env)
    assert info["obs_shape"] == (3, 64, 64) and info["obs_key"] == "pixels"
    td = env.rand_step(env.reset())
    frame = td["next", "pixels"]
    assert frame.dtype == torch.uint8 and frame.shape == (2, 3, 64, 64) and frame.float().std() > 0


@needs_gl
def test_dm_control_state_concatenates_observations():
    env = make_env(env_cfg("cartpole_swingup"), seed=0)
    assert env_info(env)["obs_shape"] == (5,)  # position (3) + velocity (2)


def test_atari_discrete_one_hot_frames():
    pytest.importorskip("ale_py", reason="ale-py is not installed")
    env = make_env(env_cfg("pong", pixels=True, action_repeat=4), seed=0)
    info = env_info(env)
    assert info["discrete"] and info["obs_shape"] == (3, 64, 64) and info["action_dim"] == 6
    td = env.rand_step(env.reset())
    assert td["next", "pixels"].dtype == torch.uint8
    assert (td["action"].sum(-1) == 1).all()


def test_atari_needs_pixels():
    with pytest.raises(ValueError, match=r"env\.pixels=false"):
        make_env(env_cfg("pong"), seed=0)


# ---------------------------------------------------------------------------- suites and tasks
def suite_cfg(suite: str, task: str | None = None, **overrides):
    base = dict(suite=suite, task=task, pixels=False, size=64, action_repeat=1, time_limit=None, num_envs=1,
                parallel=False)
    return OmegaConf.create({**base, **overrides})


def test_every_preset_file_is_its_suite_and_task():
    """configs/env/<preset>.yaml sets the suite and task PRESETS reads old name-only configs with."""
    from hydra import compose, initialize_config_dir

    from tests._train_config import CONFIGS

    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        for name, (suite, task) in PRESETS.items():
            env = compose("config", overrides=[f"env={name}"]).env
            assert (env.name, env.suite, env.task) == (name, suite, task)
        env = compose("config", overrides=["env=dmc", "env.task=walker/walk"]).env
        assert env.name == "walker-walk" == env_label("dmc", "walker/walk")


@pytest.mark.parametrize("suite, task, nearest", [
    ("gym", "CartPole-v9", "CartPole-v1"),
    ("dmc", "walker/wlak", "walker/walk"),
    ("atari", "pongg", "pong"),
])
def test_unknown_task_names_the_suites_nearest_tasks(suite, task, nearest):
    if suite == "atari":
        pytest.importorskip("ale_py", reason="ale-py is not installed")
    with pytest.raises(ValueError, match=rf"env\.task='{re.escape(task)}'.*{re.escape(repr(nearest))}"):
        check_env_config(suite_cfg(suite, task, name=task))


def test_an_ale_id_under_gym_points_to_the_atari_suite():
    with pytest.raises(ValueError, match=r"env\.task='ALE/Pong-v5': Atari games are the atari suite.*env=atari"):
        check_env_config(suite_cfg("gym", "ALE/Pong-v5", name="ALE-Pong-v5"))


def test_env_name_is_a_preset_or_the_tasks_label():
    check_env_config(suite_cfg("gym", "CartPole-v1", name="CartPole-v1"))
    check_env_config(suite_cfg("gym", "CartPole-v1", name="pendulum"))  # a preset with its task overridden
    with pytest.raises(ValueError, match=r"env\.name='mars_lander'.*env\.task"):
        check_env_config(suite_cfg("gym", "CartPole-v1", name="mars_lander"))
    with pytest.raises(ValueError, match=r"env\.suite='gmy'.*'gym'"):
        check_env_config(suite_cfg("gmy", "CartPole-v1", name="CartPole-v1"))
    with pytest.raises(ValueError, match=r"env\.image_keys='\('"):
        check_env_config(suite_cfg("gym", "CartPole-v1", name="CartPole-v1", image_keys="("))


@pytest.mark.parametrize("entry, message", [
    ("tests.custom_envs.make_dict_env", r"must be 'package\.module:function'"),
    ("tests.no_such_module:make", r"cannot import module 'tests\.no_such_module'"),
    ("tests.custom_envs:make_dict_nev", r"no callable 'make_dict_nev'.*'make_dict_env'"),
])
def test_bad_custom_entry_fails_naming_it(entry, message):
    with pytest.raises(ValueError, match=rf"env\.entry='{re.escape(entry)}'.*{message}"):
        check_env_config(suite_cfg("custom", entry=entry, name="x"), check_name=False)


def test_gym_discrete_actions_are_one_hot():
    env = make_env(suite_cfg("gym", "CartPole-v1", num_envs=2), seed=0)
    assert env_info(env) == {"obs_key": "observation", "obs_shape": (4,), "action_dim": 2, "discrete": True}
    td = env.rand_step(env.reset())
    assert (td["action"].sum(-1) == 1).all()


def test_dict_observation_keeps_every_key_and_patterns_select():
    cfg = suite_cfg("custom", entry="tests.custom_envs:make_dict_env", num_envs=2)
    info = env_info(make_env(cfg, seed=0))
    assert info["obs_shape"] == {"position": (2,), "camera": (3, 64, 64)}  # 16x16 HWC -> 64x64 CHW
    assert sorted(info["obs_key"]) == ["camera", "position"]
    env = make_env(OmegaConf.merge(cfg, {"image_keys": "nothing"}), seed=0)
    assert env_info(env)["obs_key"] == "position" and "camera" not in env.reset()
    with pytest.raises(ValueError, match=r"no observation matches.*camera: \[3, 64, 64\] uint8"):
        env_info(make_env(OmegaConf.merge(cfg, {"image_keys": "x", "vector_keys": "x"}), seed=0))


def test_custom_torchrl_env_actions_are_rescaled_to_unit_range():
    env = make_env(suite_cfg("custom", entry="tests.custom_envs:make_torchrl_env"), seed=0)
    assert env_info(env)["obs_shape"] == (3,)
    space = env.action_spec.space
    assert torch.equal(space.low, -torch.ones(1, 1)) and torch.equal(space.high, torch.ones(1, 1))
    td = env.reset()
    td["action"] = torch.ones(1, 1)
    env.step(td)  # +1 reaches the env as its own bound, +2


def test_atari_task_by_game_name_grayscale_and_sticky():
    pytest.importorskip("ale_py", reason="ale-py is not installed")
    assert atari_id("ms_pacman") == atari_id("MsPacman") == atari_id("ALE/MsPacman-v5") == "ALE/MsPacman-v5"
    env = make_env(suite_cfg("atari", "breakout", pixels=True, action_repeat=4, grayscale=True), seed=0)
    assert env_info(env)["obs_shape"] == (1, 64, 64)
    ale = env._envs[0].base_env._env.unwrapped.ale
    assert ale.getFloat("repeat_action_probability") == pytest.approx(0.25)


def test_pixels_chw_reads_chw_frames_and_makes_grayscale():
    frames = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    resized = PixelsCHW(64, layout="chw")._apply_transform(frames)
    assert resized.shape == (2, 3, 64, 64)
    gray = PixelsCHW(32, layout="chw", grayscale=True)._apply_transform(frames)
    expected = (0.299 * frames[:, 0] + 0.587 * frames[:, 1] + 0.114 * frames[:, 2]).round()
    assert gray.shape == (2, 1, 32, 32) and torch.allclose(gray[:, 0].float(), expected, atol=1)
    assert image_layout((64, 64, 3), torch.uint8) == "hwc" and image_layout((1, 64, 64), torch.uint8) == "chw"
    assert image_layout((3, 64, 64), torch.float32) is None


# ---------------------------------------------------------------------------- the suite registry
def test_each_suite_is_registered_with_its_tasks_and_episode_length():
    from worldmodels.envs import suites

    assert tuple(suites.SUITES) == suites.names() == ("gym", "dmc", "atari", "custom")
    assert "Pendulum-v1" in suites.get("gym").tasks() and "walker/walk" in suites.get("dmc").tasks()
    assert suites.get("gym").episode_frames("Pendulum-v1") == 200
    assert suites.get("dmc").episode_frames("walker/walk") == 1000
    assert suites.get("custom").episode_frames("tests.custom_envs:make_dict_env") is None
    assert env_label("custom", "tests.custom_envs:make_dict_env") == "make_dict_env"
    with pytest.raises(ValueError, match=r"env\.suite='dmcc' is not valid; expected one of \['gym', 'dmc', 'atari', "
                                         r"'custom'\].*'dmc'"):
        suites.get("dmcc")


def test_a_registered_suite_is_checked_made_and_listed_like_the_built_in_ones():
    """A new suite is one class and one `register` call: the env checks, `make_env` and the
    suite list take it, with its own tasks and episode length."""
    from worldmodels.envs import suites
    from worldmodels.envs.suites.gym import Gym

    class Classic(Gym):  # gymnasium's classic-control tasks, under their short names
        name, example = "classic", "pendulum"
        ids = {"pendulum": "Pendulum-v1", "cartpole": "CartPole-v1"}

        def tasks(self):
            return tuple(self.ids)

        def is_task(self, task, error=ValueError):
            return task in self.ids

        def episode_frames(self, task):
            return super().episode_frames(self.ids[task])

        def make(self, task, opts, pixels):
            return super().make(self.ids[task], opts, pixels)

    suites.register(Classic())
    try:
        assert "classic" in suites.SUITES
        with pytest.raises(ValueError, match=r"env\.task='pendulm'.*'pendulum'"):
            check_env_config(suite_cfg("classic", "pendulm", name="pendulm"))
        env = make_env(suite_cfg("classic", "pendulum", name="pendulum", time_limit=3), seed=0)
        assert env_info(env)["obs_shape"] == (3,) and suites.get("classic").episode_frames("pendulum") == 200
        assert env.rollout(5).shape[-1] == 3  # truncated at time_limit
    finally:
        suites.unregister("classic")
    with pytest.raises(ValueError, match=r"env\.suite='classic' is not valid"):
        check_env_config(suite_cfg("classic", "pendulum", name="pendulum"))
