"""`make_env(cfg)`: a batched torchrl env of `cfg.num_envs` copies of one task, any suite;
`env_info(env)`: the observation keys and shapes and the action space the models are built for.

Every env this returns has the same interface, whatever the suite (`suites/<suite>.py` makes one
env of a task; this file batches it and gives every suite the same observations):
- observations: float vectors [N, O] and/or uint8 images [N, C, size, size] (C = 3, or 1 with
  `grayscale`). State envs give `"observation"` (dm_control's named vectors concatenated);
  `pixels=true` gives `"pixels"` (rendered straight at size x size where the simulator can),
  beside the state with `pixels_only=false`; a gymnasium Dict space keeps its own keys;
- continuous actions rescaled to [-1, 1], or one-hot discrete actions;
- `action_repeat` frames per agent step (rewards summed; Atari max-pools the last two frames; a
  pixel env renders the last frame only), an optional `time_limit` in agent steps (-> `truncated`),
  and `done` / `terminated` / `truncated` flags from which the collector derives `is_first`.

Config fields (`configs/env/<suite>.yaml`): suite, task (entry for custom), name, pixels,
pixels_only, size, action_repeat, time_limit, num_envs, parallel, image_keys, vector_keys,
grayscale, kwargs (gym.make / factory keyword arguments); dmc: camera; atari: sticky,
full_actions, noops, resize (suites/atari.py). Configs that predate suites (only `name`, a preset)
read the preset's suite/task.
"""

from __future__ import annotations

import re
from functools import partial

import torch
from omegaconf import DictConfig, OmegaConf
from torchrl.envs import DoubleToFloat, EnvBase, ParallelEnv, SerialEnv, StepCounter, TransformedEnv
from torchrl.envs.transforms import Compose, ExcludeTransform

from worldmodels.envs import suites
from worldmodels.envs.gl import headless_gl
from worldmodels.envs.pixels import PixelsCHW, image_layout
from worldmodels.envs.render_state import state_values
from worldmodels.envs.suites import Suite, check_env_config, resolve_env

NOT_OBSERVATIONS = ("step_count",)  # StepCounter's counter sits in the observation spec


def env_options(cfg, suite: Suite) -> dict:
    """The env config as a plain dict (resolved), with the defaults of fields old configs lack."""
    opts = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    defaults = {"pixels": False, "pixels_only": True, "size": 64, "action_repeat": 1, "time_limit": None,
                "num_envs": 1, "parallel": False, "grayscale": False, "kwargs": {}, "image_keys": ".*",
                "vector_keys": ".*", **suite.options}
    return {**defaults, **{k: v for k, v in opts.items() if v is not None}}


def _observation_transforms(env: EnvBase, suite: Suite, opts: dict) -> list:
    """The suite's own (dm_control: named state vectors -> one "observation"), then every uint8
    image -> CHW at size, under the suite's image key."""
    spec = env.observation_spec
    transforms = suite.observation_transforms(env)
    for key in list(spec.keys(True, True)):
        layout = image_layout(spec[key].shape, spec[key].dtype)
        if layout is not None:
            transforms.append(PixelsCHW(opts["size"], key, suite.image_key(key), layout=layout,
                                        grayscale=bool(opts["grayscale"])))
    return transforms


def _single_env(suite: Suite, task: str, opts: dict, render: bool) -> EnvBase:
    pixels = bool(opts["pixels"]) or render
    if render and not opts["pixels"]:
        opts = {**opts, "pixels_only": False}  # keep the state the agent reads; "pixels" is for the video
    base = suite.make(task, opts, pixels)
    env = TransformedEnv(base, Compose(*_observation_transforms(base, suite, opts), DoubleToFloat()))
    chosen = observation_keys(env, opts["image_keys"], opts["vector_keys"])
    rendered = ("pixels",) if render else ()  # the video's frames stay, whatever the patterns
    unused = [key for key in observation_keys(env, strict=False) if key not in chosen and key not in rendered]
    if unused:  # observations the patterns leave out never reach the collector or replay
        env.append_transform(ExcludeTransform(*unused))
    if opts["time_limit"]:
        env.append_transform(StepCounter(max_steps=opts["time_limit"]))
    return env


def make_env(cfg, *, seed: int, num_envs: int | None = None, render: bool = False) -> EnvBase:
    """A batched env [N] from an env config (see the module docstring); the config is checked
    first (`check_env_config`). `num_envs` overrides the config's count (eval envs); `render`
    adds rendered frames under "pixels" to a state env (episode videos)."""
    check_env_config(cfg, check_name=False)
    name, task = resolve_env(cfg)
    suite = suites.get(name)
    opts = env_options(cfg, suite)
    if suite.needs_gl(bool(opts["pixels"]) or render):
        headless_gl()
    count = num_envs or opts["num_envs"]
    make_one = partial(_single_env, suite, task, opts, render)
    batched = ParallelEnv if opts["parallel"] and count > 1 else SerialEnv
    env = batched(count, make_one)
    env.set_seed(seed)
    return env


def frame_renderer(cfg):
    """For a pixel env config whose suite renders frames from a simulator state (`Suite.state_renderer`):
    a callable int64 `RENDER_STATE` bits [n, S] -> uint8 frames [n, C, size, size], as the env's
    "pixels" observation holds them; None for any other env."""
    name, task = resolve_env(cfg)
    suite = suites.get(name)
    opts = env_options(cfg, suite)
    render = suite.state_renderer(task, opts) if opts["pixels"] else None
    if render is None:
        return None
    to_chw = PixelsCHW(opts["size"], grayscale=bool(opts["grayscale"]))

    def frames(bits: torch.Tensor) -> torch.Tensor:
        return to_chw._apply_transform(torch.from_numpy(render(state_values(bits))))

    return frames


def observation_keys(env: EnvBase, image_keys: str = ".*", vector_keys: str = ".*", strict: bool = True) -> dict:
    """key -> per-env shape of the observations the models read, in the env's key order:
    every uint8 [C, H, W] image whose key matches `image_keys` (regex, whole key) and every
    float [O] vector whose key matches `vector_keys`. Nested keys match as 'outer/inner'.
    `strict`: raise when nothing matches."""
    spec = env.observation_spec
    chosen, seen = {}, []
    for key in spec.keys(True, True):
        name = "/".join(key) if isinstance(key, tuple) else key
        if name in NOT_OBSERVATIONS:
            continue
        shape, dtype = tuple(spec[key].shape[len(env.batch_size):]), spec[key].dtype
        seen.append(f"{name}: {list(shape)} {str(dtype).removeprefix('torch.')}")
        if len(shape) == 3 and dtype == torch.uint8 and re.fullmatch(image_keys, name):
            chosen[key] = shape
        elif len(shape) == 1 and dtype.is_floating_point and re.fullmatch(vector_keys, name):
            chosen[key] = shape
    if strict and not chosen:
        raise ValueError(f"no observation matches env.image_keys={image_keys!r} (uint8 [C, H, W]) or "
                         f"env.vector_keys={vector_keys!r} (float [O]); the env observes {seen}")
    return chosen


def _check_actions(env: EnvBase) -> None:
    spec = env.action_spec
    shape = spec.shape[len(env.batch_size):]
    if len(shape) != 1:
        raise ValueError(f"the env's actions have shape {list(shape)}; expected one vector (a Box of rank 1 or a "
                         "Discrete space, one-hot encoded)")
    if spec.domain == "discrete" and type(spec).__name__ != "OneHot":
        raise ValueError(f"the env's discrete actions are a {type(spec).__name__} spec; expected one-hot actions "
                         "(gymnasium Discrete spaces are converted; a torchrl env must use a OneHot action spec)")


def env_info(env: EnvBase) -> dict:
    """What the models need to know about a batched env from `make_env`: `obs_key` and
    `obs_shape` (per env) of its observations, `action_dim` and whether actions are discrete
    (one-hot). One observation key: `obs_key` is that key and `obs_shape` its shape, e.g.
    ("observation", (3,)); several: `obs_key` is the list of keys and `obs_shape` a dict
    key -> shape (the models then read a TensorDict of them)."""
    keys = observation_keys(env)  # make_env already dropped what env.image_keys / env.vector_keys leave out
    _check_actions(env)
    if len(keys) == 1:
        (obs_key, obs_shape), = keys.items()
    else:
        obs_key, obs_shape = list(keys), keys
    discrete = env.action_spec.domain == "discrete"
    return {"obs_key": obs_key, "obs_shape": obs_shape, "action_dim": int(env.action_spec.shape[-1]),
            "discrete": discrete}

