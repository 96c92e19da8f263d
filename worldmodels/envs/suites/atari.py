"""The `atari` suite: any ALE game (`pong`, `ms_pacman`, or `Pong`, `MsPacman`, `ALE/Pong-v5`),
ALE v5 with DreamerV3's settings: sticky actions (p = 0.25), `action_repeat` frames per step with
the last two max-pooled, the minimal action set unless `full_actions`; frames under "pixels".

Options beside those (`configs/env/atari.yaml`), each as danijar/dreamerv3's embodied/envs/atari.py
at 423291a does it where set: `noops` (after each reset, a uniform count in [0, noops) of NOOP frames,
a game over among them resetting again; 0: none) and `resize` ("torch": the factory's area average of
whole source pixels, `PixelsCHW`; "opencv": cv2.INTER_AREA's, each source pixel weighted by the part of
it an output pixel covers, rounded half to even, equal to cv2's without importing it). Episodes end at
game over or ALE v5's 108000 frames (truncated); a lost life neither ends an episode nor marks a step.
"""

from __future__ import annotations

import re
from functools import cache

import numpy as np

from worldmodels.envs.suites.base import Suite, field


@cache
def _atari_ids() -> dict[str, str]:
    """ALE game (snake_case ROM name) -> gymnasium id (`ALE/<Game>-v5`)."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    by_key = {env_id[4:-3].lower(): env_id for env_id in gym.registry
              if env_id.startswith("ALE/") and env_id.endswith("-v5")}
    games = {}
    for rom in ale_py.roms.get_all_rom_ids():
        env_id = by_key.get(rom.replace("_", ""))
        if env_id is not None:
            games[rom] = env_id
    return games


def atari_id(task: str) -> str | None:
    """The gymnasium id of an ALE game given as `pong`, `Pong`, `ms_pacman`, `MsPacman` or
    `ALE/Pong-v5`; None when there is no such game."""
    name = task.removeprefix("ALE/").removesuffix("-v5")
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    for rom, env_id in _atari_ids().items():
        if rom.replace("_", "") == key:
            return env_id
    return None


class Atari(Suite):
    name = "atari"
    example = "pong"
    options = {"sticky": True, "full_actions": False, "noops": 0, "resize": "torch"}

    def tasks(self) -> tuple[str, ...]:
        return tuple(sorted(_atari_ids()))

    def is_task(self, task: str, error: type[Exception] = ValueError) -> bool:
        return atari_id(task) is not None

    def check_options(self, cfg, task: str, error: type[Exception] = ValueError) -> None:
        if field(cfg, "pixels") is False:
            raise error(f"env.pixels=false is not supported for the Atari task {task!r}: Atari observations are "
                        "frames")
        noops = field(cfg, "noops")
        if noops is not None and (not isinstance(noops, int) or isinstance(noops, bool) or noops < 0):
            raise error(f"env.noops={noops!r} must be an integer >= 0 (NOOP frames drawn from [0, noops) at reset)")
        resize = field(cfg, "resize")
        if resize is not None and resize not in RESIZES:
            raise error(f"env.resize={resize!r} is not valid; expected one of {list(RESIZES)}")
        size = field(cfg, "size")
        if resize == "opencv" and isinstance(size, int) and size > FRAME_WIDTH:
            raise error(f"env.size={size} with env.resize='opencv': its area weights only shrink, and ALE frames are "
                        f"{FRAME_WIDTH} wide (env.size <= {FRAME_WIDTH}, or env.resize=torch)")

    def make(self, task: str, opts: dict, pixels: bool):
        import gymnasium as gym
        from torchrl.envs import GymWrapper

        env = gym.make(atari_id(task), frameskip=1, repeat_action_probability=0.25 if opts["sticky"] else 0.0,
                       full_action_space=bool(opts["full_actions"]), obs_type="rgb", **opts["kwargs"])
        if opts["noops"]:
            env = noop_starts(env, opts["noops"])
        if opts["action_repeat"] > 1:
            env = gym.wrappers.MaxAndSkipObservation(env, skip=opts["action_repeat"])
        if opts["resize"] == "opencv":
            env = area_resize(env, opts["size"])
        return GymWrapper(env, categorical_action_encoding=False)

    def image_key(self, key):
        return "pixels"  # ALE frames arrive as "observation": call them "pixels" like every suite


RESIZES = ("torch", "opencv")
FRAME_WIDTH = 160  # ALE frames are 210 x 160
"""`env.resize` of an Atari env: how its 210x160 frames shrink to `size` (see the module docstring)."""


def noop_starts(env, noops: int):
    """`env` (one frame per step) whose reset then takes a uniform count in [0, `noops`) of NOOP frames
    (action 0) drawn from the env's own generator, resetting again where one ends the game."""
    import gymnasium as gym

    class NoopStarts(gym.Wrapper):
        def reset(self, **kwargs):
            obs, info = self.env.reset(**kwargs)
            for _ in range(int(self.np_random.integers(noops))):
                obs, _, terminated, truncated, info = self.env.step(0)
                if terminated or truncated:
                    obs, info = self.env.reset()
            return obs, info

    return NoopStarts(env)


def area_weights(size_in: int, size_out: int) -> np.ndarray:
    """[size_out, size_in]: the part of each source pixel that each output pixel covers, over the
    output pixel's width (size_in / size_out source pixels): cv2.INTER_AREA's weights when shrinking."""
    scale = size_in / size_out
    edges = np.arange(size_out + 1) * scale
    lo, hi = edges[:-1, None], edges[1:, None]
    pixel = np.arange(size_in)[None]
    return np.clip(np.minimum(hi, pixel + 1) - np.maximum(lo, pixel), 0, None) / scale


def shrink(frame: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """uint8 [H, W, C] -> uint8 [h, w, C]: rows [h, H] and cols [w, W] (`area_weights`) applied, rounded
    half to even."""
    out = np.tensordot(cols, np.tensordot(rows, frame.astype(np.float64), (1, 0)), (1, 1)).transpose(1, 0, 2)
    return np.rint(out).clip(0, 255).astype(np.uint8)


def area_resize(env, size: int):
    """`env` whose RGB frames [H, W, 3] shrink to [size, size, 3] with `area_weights`, rounded half to even."""
    import gymnasium as gym

    height, width, channels = env.observation_space.shape
    rows, cols = area_weights(height, size), area_weights(width, size)
    space = gym.spaces.Box(0, 255, (size, size, channels), np.uint8)

    class AreaResize(gym.ObservationWrapper):
        def __init__(self, env):
            super().__init__(env)
            self.observation_space = space

        def observation(self, frame):
            return shrink(frame, rows, cols)

    return AreaResize(env)
