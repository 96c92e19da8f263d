"""`make_env(cfg)`: a batched torchrl env of `cfg.num_envs` copies of one task, any suite;
`env_info(env)`: the observation keys and shapes and the action space the models are built for.

Every env this returns has the same interface, whatever the suite (see suites.py):
- observations: float vectors [N, O] and/or uint8 images [N, C, size, size] (C = 3, or 1 with
  `grayscale`). State envs give `"observation"` (dm_control's named vectors concatenated);
  `pixels=true` gives `"pixels"` (rendered straight at size x size where the simulator can),
  beside the state with `pixels_only=false`; a gymnasium Dict space keeps its own keys;
- continuous actions rescaled to [-1, 1], or one-hot discrete actions;
- `action_repeat` frames per agent step (rewards summed; Atari max-pools the last two frames),
  an optional `time_limit` in agent steps (-> `truncated`), and `done` / `terminated` /
  `truncated` flags from which the collector derives `is_first`.

Config fields (`configs/env/<suite>.yaml`): suite, task (entry for custom), name, pixels,
pixels_only, size, action_repeat, time_limit, num_envs, parallel, image_keys, vector_keys,
grayscale, kwargs (gym.make / factory keyword arguments); dmc: camera; atari: sticky,
full_actions. Configs that predate suites (only `name`, a preset) read the preset's suite/task.
"""

from __future__ import annotations

import inspect
import re
from functools import partial

import torch
from omegaconf import DictConfig, OmegaConf
from torchrl.envs import CatTensors, DoubleToFloat, EnvBase, ParallelEnv, SerialEnv, StepCounter, TransformedEnv
from torchrl.envs.transforms import ActionScaling, Compose, ExcludeTransform, FrameSkipTransform

from worldmodels.envs.gl import headless_gl
from worldmodels.envs.pixels import PixelsCHW, image_layout
from worldmodels.envs.suites import atari_id, check_env_config, load_entry, resolve_env

NOT_OBSERVATIONS = ("step_count",)  # StepCounter's counter sits in the observation spec


def _options(cfg) -> dict:
    """The env config as a plain dict (resolved), with the defaults of fields old configs lack."""
    opts = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    defaults = {"pixels": False, "pixels_only": True, "size": 64, "action_repeat": 1, "time_limit": None,
                "num_envs": 1, "parallel": False, "camera": 0, "sticky": True, "grayscale": False,
                "full_actions": False, "kwargs": {}, "image_keys": ".*", "vector_keys": ".*"}
    return {**defaults, **{k: v for k, v in opts.items() if v is not None}}


def _wrap_gym(env, opts: dict, pixels: bool) -> EnvBase:
    """A gymnasium env -> torchrl, Box actions rescaled to [-1, 1], Discrete as one-hot,
    `action_repeat` steps per agent step."""
    import gymnasium as gym
    from torchrl.envs import GymWrapper

    if isinstance(env.action_space, gym.spaces.Box):
        env = gym.wrappers.RescaleAction(env, -1.0, 1.0)
    return GymWrapper(env, from_pixels=pixels, pixels_only=bool(opts["pixels_only"]),
                      frame_skip=opts["action_repeat"],
                      categorical_action_encoding=False)


def _gym_env(task: str, opts: dict, pixels: bool) -> EnvBase:
    import gymnasium as gym

    kwargs = dict(opts["kwargs"])
    if pixels:
        kwargs["render_mode"] = "rgb_array"
        if "mujoco" in str(gym.spec(task).entry_point):
            kwargs.update(width=opts["size"], height=opts["size"])  # MuJoCo renders straight at size x size
    return _wrap_gym(gym.make(task, **kwargs), opts, pixels)


def _dmc_env(task: str, opts: dict, pixels: bool) -> EnvBase:
    headless_gl()
    from dm_control import suite
    from torchrl.envs import DMControlWrapper

    domain, name = task.split("/")
    render = {"height": opts["size"], "width": opts["size"], "camera_id": opts["camera"]}
    return DMControlWrapper(suite.load(domain, name, task_kwargs=opts["kwargs"] or None), from_pixels=pixels,
                            pixels_only=bool(opts["pixels_only"]), frame_skip=opts["action_repeat"],
                            render_kwargs=render)


def _atari_env(task: str, opts: dict, pixels: bool) -> EnvBase:
    """ALE v5 with DreamerV3's settings: sticky actions (p = 0.25), `action_repeat` frames per
    step with the last two max-pooled, the minimal action set unless `full_actions`."""
    import gymnasium as gym
    from torchrl.envs import GymWrapper

    env = gym.make(atari_id(task), frameskip=1, repeat_action_probability=0.25 if opts["sticky"] else 0.0,
                   full_action_space=bool(opts["full_actions"]), obs_type="rgb", **opts["kwargs"])
    if opts["action_repeat"] > 1:
        env = gym.wrappers.MaxAndSkipObservation(env, skip=opts["action_repeat"])
    return GymWrapper(env, categorical_action_encoding=False)


def _accepts(function, keyword: str) -> bool:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == keyword or p.kind == p.VAR_KEYWORD for p in parameters)


def _custom_env(entry: str, opts: dict, pixels: bool) -> EnvBase:
    """A user's factory (`env.entry`), called with `env.kwargs` (and render_mode="rgb_array" when
    frames are wanted and it takes that keyword): a gymnasium.Env or torchrl EnvBase."""
    import gymnasium as gym

    factory, kwargs = load_entry(entry), dict(opts["kwargs"])
    if pixels and _accepts(factory, "render_mode"):
        kwargs.setdefault("render_mode", "rgb_array")
    env = factory(**kwargs)
    if isinstance(env, gym.Env):
        return _wrap_gym(env, opts, pixels)
    if not isinstance(env, EnvBase):
        raise TypeError(f"env.entry={entry!r} returned {type(env).__name__}; expected a gymnasium.Env or a torchrl "
                        "EnvBase")
    if env.batch_size != torch.Size([]):
        raise ValueError(f"env.entry={entry!r} returned an env of batch_size {tuple(env.batch_size)}; expected one "
                         "unbatched env (make_env batches env.num_envs copies)")
    transforms = []
    spec = env.action_spec
    if spec.domain == "continuous" and hasattr(spec.space, "low") and not (
            torch.all(spec.space.low == -1) and torch.all(spec.space.high == 1)):
        transforms.append(ActionScaling())  # the agent acts in [-1, 1]
    if opts["action_repeat"] > 1:
        transforms.append(FrameSkipTransform(opts["action_repeat"]))
    return TransformedEnv(env, Compose(*transforms)) if transforms else env


_BUILDERS = {"gym": _gym_env, "dmc": _dmc_env, "atari": _atari_env, "custom": _custom_env}


def _observation_transforms(env: EnvBase, suite: str, opts: dict) -> list:
    """dm_control's named state vectors -> one "observation"; every uint8 image -> CHW at size."""
    spec = env.observation_spec
    transforms = []
    if suite == "dmc":
        keys = [k for k in spec.keys() if k not in ("observation", "pixels")]
        if keys:
            transforms.append(CatTensors(in_keys=keys, out_key="observation"))
    for key in list(spec.keys(True, True)):
        layout = image_layout(spec[key].shape, spec[key].dtype)
        if layout is not None:  # Atari frames arrive as "observation": call them "pixels" like every suite
            out_key = "pixels" if suite == "atari" else key
            transforms.append(PixelsCHW(opts["size"], key, out_key, layout=layout, grayscale=bool(opts["grayscale"])))
    return transforms


def _single_env(suite: str, task: str, opts: dict, render: bool) -> EnvBase:
    pixels = bool(opts["pixels"]) or render
    if render and not opts["pixels"]:
        opts = {**opts, "pixels_only": False}  # keep the state the agent reads; "pixels" is for the video
    base = _BUILDERS[suite](task, opts, pixels)
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
    suite, task = resolve_env(cfg)
    opts = _options(cfg)
    if suite == "dmc" or (opts["pixels"] or render) and suite in ("gym", "custom"):
        headless_gl()
    count = num_envs or opts["num_envs"]
    make_one = partial(_single_env, suite, task, opts, render)
    batched = ParallelEnv if opts["parallel"] and count > 1 else SerialEnv
    env = batched(count, make_one)
    env.set_seed(seed)
    return env


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

