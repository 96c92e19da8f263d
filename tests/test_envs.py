"""Env factory: one interface (keys, dtypes, action range, done flags) across suites."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from worldmodels.envs import env_info, headless_gl, make_env


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


needs_gl = pytest.mark.skipif(not gl_renders(), reason="no offscreen OpenGL (EGL/OSMesa) for MuJoCo rendering on this machine")


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
