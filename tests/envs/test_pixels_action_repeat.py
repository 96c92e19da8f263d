"""Pixel envs render one frame per agent step: the action repeats inside the pixel wrapper
(dm_control's and gymnasium's render at every `step` they get), and the transitions are those of
torchrl's `frame_skip` around the wrapper (the old path, which rendered every repeated step): same
frames, summed rewards, the same last step when an episode ends inside a repeat. gymnasium state
envs repeat through the same wrapper, with the same transitions as `frame_skip`."""

from __future__ import annotations

import pytest
import torch

from worldmodels.envs import suites
from tests.envs.test_env_factory import needs_gl


def counting(monkeypatch, cls, name: str = "render") -> dict:
    """Count calls of `cls.name` per instance (keyed by id)."""
    original, calls = getattr(cls, name), {}

    def wrapper(self, *args, **kwargs):
        calls[id(self)] = calls.get(id(self), 0) + 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, wrapper)
    return calls


def roll(env, actions: torch.Tensor, key: str = "pixels") -> tuple[list, int]:
    """Step `env` through `actions` until done: [(env[key], reward, done)] per step, and the steps taken."""
    td, out = env.reset(), []
    for action in actions:
        td["action"] = action
        td = env.step(td)
        nxt = td["next"]
        out.append((nxt[key].clone(), float(nxt["reward"]), bool(nxt["done"])))
        if out[-1][2]:
            break
        td = nxt
    return out, len(out)


def assert_same_transitions(new: list, old: list) -> None:
    assert len(new) == len(old)
    for (frame, reward, done), (frame0, reward0, done0) in zip(new, old):
        assert torch.equal(frame, frame0)
        assert reward == pytest.approx(reward0, rel=1e-6, abs=1e-9) and done == done0


@needs_gl
@pytest.mark.parametrize("repeat", [3, 8])
def test_dmc_pixels_render_once_per_agent_step_with_frame_skips_transitions(monkeypatch, repeat):
    from dm_control import suite
    from dm_control.mujoco import Physics
    from torchrl.envs import DMControlWrapper

    # a 0.25 s episode: 25 physics steps, so the last agent step ends inside its repeat (25 % 3, 25 % 8)
    opts = {"size": 32, "camera": 0, "kwargs": {"time_limit": 0.25}, "pixels_only": True, "action_repeat": repeat}
    new = suites.get("dmc").make("cartpole/swingup", opts, pixels=True)
    old = DMControlWrapper(suite.load("cartpole", "swingup", task_kwargs={"time_limit": 0.25}), from_pixels=True,
                           pixels_only=True, frame_skip=repeat,
                           render_kwargs={"height": 32, "width": 32, "camera_id": 0})
    for env in (new, old):
        env.set_seed(0)
    renders = counting(monkeypatch, Physics)
    actions = torch.rand(40, 1, generator=torch.Generator().manual_seed(0)) * 2 - 1
    got, steps = roll(new, actions)
    want, _ = roll(old, actions)
    assert steps == -(-25 // repeat)
    assert_same_transitions(got, want)
    assert renders[id(new._env.physics)] == 1 + steps  # the reset's frame, then one per agent step
    assert renders[id(old._env.physics)] == 1 + 25  # every physics step (the old path)


def test_gym_pixels_render_once_per_agent_step_with_frame_skips_transitions(monkeypatch):
    pytest.importorskip("pygame", reason="Pendulum-v1 renders with pygame, which is not installed")
    import gymnasium as gym
    from gymnasium.envs.classic_control.pendulum import PendulumEnv
    from torchrl.envs import GymWrapper

    opts = {"kwargs": {"max_episode_steps": 10}, "pixels_only": True, "action_repeat": 3}
    renders = counting(monkeypatch, PendulumEnv)
    new = suites.get("gym").make("Pendulum-v1", opts, pixels=True)
    inner = gym.make("Pendulum-v1", render_mode="rgb_array", max_episode_steps=10)
    old = GymWrapper(gym.wrappers.RescaleAction(inner, -1.0, 1.0), from_pixels=True, pixels_only=True, frame_skip=3)
    for env in (new, old):
        env.set_seed(0)
    renders.clear()
    actions = torch.rand(10, 1, generator=torch.Generator().manual_seed(0)) * 2 - 1
    got, steps = roll(new, actions)
    new_renders = sum(renders.values())
    renders.clear()
    want, _ = roll(old, actions)
    assert steps == 4  # 3 + 3 + 3 + 1 of the 10 steps the time limit allows
    assert_same_transitions(got, want)
    assert new_renders == 1 + steps and sum(renders.values()) == 1 + 10


def test_gym_state_envs_repeat_inside_with_frame_skips_transitions():
    """State envs repeat through the same gymnasium wrapper as pixel envs: the transitions of
    torchrl's `frame_skip`, also when the time limit ends an episode inside a repeat."""
    import gymnasium as gym
    from torchrl.envs import GymWrapper

    opts = {"kwargs": {"max_episode_steps": 10}, "pixels_only": False, "action_repeat": 3}
    new = suites.get("gym").make("Pendulum-v1", opts, pixels=False)
    inner = gym.make("Pendulum-v1", max_episode_steps=10)
    old = GymWrapper(gym.wrappers.RescaleAction(inner, -1.0, 1.0), frame_skip=3)
    for env in (new, old):
        env.set_seed(0)
    actions = torch.rand(10, 1, generator=torch.Generator().manual_seed(0)) * 2 - 1
    got, steps = roll(new, actions, key="observation")
    want, _ = roll(old, actions, key="observation")
    assert steps == 4  # 3 + 3 + 3 + 1 of the 10 steps the time limit allows
    assert_same_transitions(got, want)
