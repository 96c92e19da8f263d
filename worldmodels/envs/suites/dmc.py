"""The `dmc` suite: any dm_control suite task as `domain/task` (e.g. `walker/walk`), its named
state vectors concatenated into one "observation", frames rendered offscreen at size x size, once per
agent step (the action repeated inside the pixel wrapper, not around it)."""

from __future__ import annotations

from functools import cache

from worldmodels.envs.gl import headless_gl
from worldmodels.envs.suites.base import Suite

EPISODE_FRAMES = {"cartpole/swingup": 1000, "walker/walk": 1000, "cheetah/run": 1000}
"""Frames per episode of the tasks whose limit is known without loading them."""


@cache
def _dmc_tasks() -> tuple[str, ...]:
    headless_gl()  # before dm_control imports MuJoCo's renderer
    from dm_control import suite

    return tuple(f"{domain}/{task}" for domain, task in suite.ALL_TASKS)


@cache
def repeat_then_render() -> type:
    """dm_control's `pixels.Wrapper` that repeats each action `repeat` times, then renders once.

    dm_control's wrapper renders at every `step`, so torchrl's `frame_skip` around it renders every
    repeated physics step and keeps only the last frame: R renders per agent step (8 for PlaNet's
    cartpole). Inside, the same transitions cost one render. Rewards are summed and the repeat stops
    at the episode's last step, as `frame_skip` does."""
    from dm_control.suite.wrappers import pixels

    class RepeatThenRender(pixels.Wrapper):
        def __init__(self, env, repeat: int, **kwargs):
            super().__init__(env, **kwargs)
            self.repeat = repeat

        def step(self, action):
            reward = 0.0
            for _ in range(self.repeat):
                time_step = self._env.step(action)
                reward += time_step.reward or 0.0
                if time_step.last():
                    break
            return self._add_pixel_observation(time_step._replace(reward=reward))

    return RepeatThenRender


class DMC(Suite):
    name = "dmc"
    example = "walker/walk"
    options = {"camera": 0}

    def tasks(self) -> tuple[str, ...]:
        return _dmc_tasks()

    def episode_frames(self, task: str) -> int | None:
        return EPISODE_FRAMES.get(task)

    def needs_gl(self, pixels: bool) -> bool:
        return True  # dm_control imports MuJoCo's renderer, frames or not

    def make(self, task: str, opts: dict, pixels: bool):
        headless_gl()
        from dm_control import suite
        from torchrl.envs import DMControlWrapper

        domain, name = task.split("/")
        env = suite.load(domain, name, task_kwargs=opts["kwargs"] or None)
        if not pixels:
            return DMControlWrapper(env, frame_skip=opts["action_repeat"])
        render = {"height": opts["size"], "width": opts["size"], "camera_id": opts["camera"]}
        env = repeat_then_render()(env, opts["action_repeat"], pixels_only=bool(opts["pixels_only"]),
                                   render_kwargs=render)
        return DMControlWrapper(env)  # renders itself: from_pixels would wrap it again

    def observation_transforms(self, env) -> list:
        """dm_control's named state vectors -> one "observation"."""
        from torchrl.envs import CatTensors

        keys = [k for k in env.observation_spec.keys() if k not in ("observation", "pixels")]
        return [CatTensors(in_keys=keys, out_key="observation")] if keys else []

