"""`make_env(cfg)`: a batched torchrl env of `cfg.num_envs` copies of one task.

Every env this returns has the same interface, whatever the suite:
- observations under `"observation"` (float32 [N, O]) or, with `pixels=true`, `"pixels"`
  (uint8 [N, 3, size, size], rendered straight at that size where the simulator can);
- continuous actions rescaled to [-1, 1], or one-hot discrete actions (Atari);
- `action_repeat` frames per agent step (rewards summed), an optional `time_limit` in agent
  steps (-> `truncated`), and `done` / `terminated` / `truncated` flags from which the
  collector derives `is_first`.
"""

from __future__ import annotations

import ctypes.util
import os
from dataclasses import dataclass
from functools import partial

from torchrl.envs import CatTensors, DoubleToFloat, EnvBase, ParallelEnv, SerialEnv, StepCounter, TransformedEnv
from torchrl.envs.transforms import Compose

from worldmodels.envs.pixels import PixelsCHW


@dataclass(frozen=True)
class EnvSpec:
    suite: str  # "gym", "dmc" or "atari"
    task: str  # gymnasium id, "domain/task" for dm_control, ALE id for Atari
    camera: int = 0  # dm_control camera for pixels


ENVS: dict[str, EnvSpec] = {
    "pendulum": EnvSpec("gym", "Pendulum-v1"),
    "cartpole_swingup": EnvSpec("dmc", "cartpole/swingup"),
    "walker_walk": EnvSpec("dmc", "walker/walk"),
    "cheetah_run": EnvSpec("dmc", "cheetah/run"),
    "hopper": EnvSpec("gym", "Hopper-v5"),
    "half_cheetah": EnvSpec("gym", "HalfCheetah-v5"),
    "pong": EnvSpec("atari", "ALE/Pong-v5"),
}
"""Env names accepted by `env.name` (the Hydra `env=` group has one file per name)."""


def headless_gl() -> str | None:
    """Pick MuJoCo's offscreen GL before dm_control / mujoco import: EGL, else OSMesa.

    A value the user already exported wins. Returns the backend in use (None: MuJoCo's default)."""
    if "MUJOCO_GL" not in os.environ:
        for backend, library in (("egl", "EGL"), ("osmesa", "OSMesa")):
            if ctypes.util.find_library(library):
                os.environ["MUJOCO_GL"] = backend
                os.environ.setdefault("PYOPENGL_PLATFORM", backend)
                break
    return os.environ.get("MUJOCO_GL")


def _gym_env(spec: EnvSpec, pixels: bool, size: int, action_repeat: int) -> EnvBase:
    import gymnasium as gym
    from torchrl.envs import GymWrapper

    kwargs = {}
    if pixels:
        kwargs["render_mode"] = "rgb_array"
        if "mujoco" in str(gym.spec(spec.task).entry_point):
            kwargs.update(width=size, height=size)  # MuJoCo renders straight at size x size
    env = gym.make(spec.task, **kwargs)
    if isinstance(env.action_space, gym.spaces.Box):
        env = gym.wrappers.RescaleAction(env, -1.0, 1.0)
    return GymWrapper(env, from_pixels=pixels, pixels_only=True, frame_skip=action_repeat)


def _dmc_env(spec: EnvSpec, pixels: bool, size: int, action_repeat: int) -> EnvBase:
    headless_gl()
    from dm_control import suite
    from torchrl.envs import DMControlWrapper

    domain, task = spec.task.split("/")
    render = {"height": size, "width": size, "camera_id": spec.camera}
    return DMControlWrapper(suite.load(domain, task), from_pixels=pixels, pixels_only=True,
                            frame_skip=action_repeat, render_kwargs=render)


def _atari_env(spec: EnvSpec, pixels: bool, size: int, action_repeat: int) -> EnvBase:
    import ale_py
    import gymnasium as gym
    from torchrl.envs import GymWrapper

    gym.register_envs(ale_py)
    env = gym.make(spec.task, frameskip=action_repeat, obs_type="rgb", full_action_space=False)
    return GymWrapper(env, categorical_action_encoding=False)


_BUILDERS = {"gym": _gym_env, "dmc": _dmc_env, "atari": _atari_env}


def _single_env(spec: EnvSpec, pixels: bool, size: int, action_repeat: int, time_limit: int | None) -> EnvBase:
    env = _BUILDERS[spec.suite](spec, pixels, size, action_repeat)
    transforms = []
    if pixels or spec.suite == "atari":  # torchrl names image observations "pixels"
        transforms.append(PixelsCHW(size))
    else:
        keys = [k for k in env.observation_spec.keys() if k != "observation"]
        if keys:  # dm_control: several named vectors -> one "observation"
            transforms.append(CatTensors(in_keys=keys, out_key="observation"))
    transforms.append(DoubleToFloat())
    if time_limit:
        transforms.append(StepCounter(max_steps=time_limit))
    return TransformedEnv(env, Compose(*transforms))


def make_env(cfg, *, seed: int, num_envs: int | None = None) -> EnvBase:
    """A batched env [N] from an env config (fields: name, pixels, size, action_repeat,
    time_limit, num_envs, parallel). `num_envs` overrides the config's count (eval envs)."""
    if cfg.name not in ENVS:
        raise ValueError(f"env.name={cfg.name!r} is not a known env; expected one of {sorted(ENVS)}")
    spec = ENVS[cfg.name]
    if spec.suite == "atari" and not cfg.pixels:
        raise ValueError(f"env.pixels=false is not supported for env.name={cfg.name!r}: Atari observations are frames")
    if spec.suite == "dmc" or (cfg.pixels and spec.suite == "gym"):
        headless_gl()
    count = num_envs or cfg.num_envs
    make_one = partial(_single_env, spec, bool(cfg.pixels), int(cfg.size), int(cfg.action_repeat), cfg.time_limit)
    batched = ParallelEnv if cfg.parallel and count > 1 else SerialEnv
    env = batched(count, make_one)
    env.set_seed(seed)
    return env


def env_info(env: EnvBase) -> dict:
    """What the models need to know about a batched env from `make_env`:
    obs_key, obs_shape (per env), action_dim and whether actions are discrete (one-hot)."""
    obs_key = "pixels" if "pixels" in env.observation_spec.keys() else "observation"
    obs_shape = tuple(env.observation_spec[obs_key].shape[1:])
    action_spec = env.action_spec
    discrete = action_spec.domain == "discrete"
    return {"obs_key": obs_key, "obs_shape": obs_shape, "action_dim": int(action_spec.shape[-1]), "discrete": discrete}
