"""The `dmc` suite: any dm_control suite task as `domain/task` (e.g. `walker/walk`), its named
state vectors concatenated into one "observation", frames rendered offscreen at size x size."""

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
        render = {"height": opts["size"], "width": opts["size"], "camera_id": opts["camera"]}
        return DMControlWrapper(suite.load(domain, name, task_kwargs=opts["kwargs"] or None), from_pixels=pixels,
                                pixels_only=bool(opts["pixels_only"]), frame_skip=opts["action_repeat"],
                                render_kwargs=render)

    def observation_transforms(self, env) -> list:
        """dm_control's named state vectors -> one "observation"."""
        from torchrl.envs import CatTensors

        keys = [k for k in env.observation_spec.keys() if k not in ("observation", "pixels")]
        return [CatTensors(in_keys=keys, out_key="observation")] if keys else []

