"""The `dmc` suite: any dm_control suite task as `domain/task` (e.g. `walker/walk`), its named
state vectors concatenated into one "observation", frames rendered offscreen at size x size, once per
agent step (the action repeated inside the pixel wrapper, not around it). A pixel env adds the physics
state each frame was rendered from (`envs/render_state.py`); `StateRenderer` renders frames again
from such states."""

from __future__ import annotations

import json
import os
from concurrent.futures import ProcessPoolExecutor
from functools import cache
from multiprocessing import get_context

import numpy as np

from worldmodels.envs.gl import GLUnavailable, headless_gl
from worldmodels.envs.render_state import RENDER_STATE, state_bits
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
    at the episode's last step, as `frame_skip` does. Every observation also holds `RENDER_STATE`:
    the physics state its frame was rendered from, as int64 bits."""
    from dm_control.suite.wrappers import pixels
    from dm_env import specs

    class RepeatThenRender(pixels.Wrapper):
        def __init__(self, env, repeat: int, **kwargs):
            super().__init__(env, **kwargs)
            self.repeat = repeat
            size = env.physics.get_state().size
            self._observation_spec[RENDER_STATE] = specs.Array((size,), np.int64, name=RENDER_STATE)

        def _add_pixel_observation(self, time_step):
            time_step = super()._add_pixel_observation(time_step)
            time_step.observation[RENDER_STATE] = state_bits(self._env.physics.get_state())
            return time_step

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

        keys = [k for k in env.observation_spec.keys() if k not in ("observation", "pixels", RENDER_STATE)]
        return [CatTensors(in_keys=keys, out_key="observation")] if keys else []

    def state_renderer(self, task: str, opts: dict) -> StateRenderer:
        return StateRenderer(task, opts["kwargs"] or None, opts["size"], opts["camera"])


PARALLEL_FROM = 4096  # states; fewer render in this process (worker processes take seconds to start)
CHUNK = 2048  # states per worker task
MAX_WORKERS = 8  # processes at most: more render no faster on a 16-core GPU host (benchmarks/render_rate.py)


class StateRenderer:
    """float64 physics states [n, S] of a task -> uint8 frames [n, size, size, 3], rendered as the
    pixel env renders them (same camera and size); many states render on several processes.

    Args:
        task: `domain/task`.
        kwargs: the task's keyword arguments (`env.kwargs`), or None.
        size: frame height and width.
        camera: the camera id.
        max_workers: processes a render of `PARALLEL_FROM` states or more uses at most (fewer where this
            process may run on fewer cores).
    """

    def __init__(self, task: str, kwargs: dict | None, size: int, camera: int, max_workers: int = MAX_WORKERS):
        self.key = json.dumps([task, kwargs, size, camera], sort_keys=True)
        self.max_workers = max_workers

    def __call__(self, states: np.ndarray) -> np.ndarray:
        states = np.asarray(states, dtype=np.float64)
        if len(states) < PARALLEL_FROM:
            return _render(self.key, states)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        workers = min(self.max_workers, cores)
        chunks = [states[i: i + CHUNK] for i in range(0, len(states), CHUNK)]
        # spawned, not forked: a fork would copy this process's GL contexts and CUDA state
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            return np.concatenate(list(pool.map(_render, [self.key] * len(chunks), chunks)))


@cache
def _physics(key: str):
    """The physics of a freshly loaded task (one per process and task), with its render arguments."""
    task, kwargs, size, camera = json.loads(key)
    headless_gl()
    from dm_control import suite

    domain, name = task.split("/")
    return suite.load(domain, name, task_kwargs=kwargs).physics, {"height": size, "width": size, "camera_id": camera}


def _render(key: str, states: np.ndarray) -> np.ndarray:
    try:
        physics, render = _physics(key)
        physics.render(**render)  # GL fails here, if anywhere: at the first frame
    except Exception as err:  # PyOpenGL and MuJoCo raise anything from AttributeError to FatalError
        raise GLUnavailable(err) from None
    frames = []
    for state in states:
        with physics.reset_context():  # sets the state, then recomputes what rendering reads (mj_forward)
            physics.set_state(state)
        frames.append(physics.render(**render))
    return np.stack(frames)
