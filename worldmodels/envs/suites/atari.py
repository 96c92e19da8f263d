"""The `atari` suite: any ALE game (`pong`, `ms_pacman`, or `Pong`, `MsPacman`, `ALE/Pong-v5`),
ALE v5 with DreamerV3's settings: sticky actions (p = 0.25), `action_repeat` frames per step with
the last two max-pooled, the minimal action set unless `full_actions`; frames under "pixels"."""

from __future__ import annotations

import re
from functools import cache

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
    options = {"sticky": True, "full_actions": False}

    def tasks(self) -> tuple[str, ...]:
        return tuple(sorted(_atari_ids()))

    def is_task(self, task: str, error: type[Exception] = ValueError) -> bool:
        return atari_id(task) is not None

    def check_options(self, cfg, task: str, error: type[Exception] = ValueError) -> None:
        if field(cfg, "pixels") is False:
            raise error(f"env.pixels=false is not supported for the Atari task {task!r}: Atari observations are "
                        "frames")

    def make(self, task: str, opts: dict, pixels: bool):
        import gymnasium as gym
        from torchrl.envs import GymWrapper

        env = gym.make(atari_id(task), frameskip=1, repeat_action_probability=0.25 if opts["sticky"] else 0.0,
                       full_action_space=bool(opts["full_actions"]), obs_type="rgb", **opts["kwargs"])
        if opts["action_repeat"] > 1:
            env = gym.wrappers.MaxAndSkipObservation(env, skip=opts["action_repeat"])
        return GymWrapper(env, categorical_action_encoding=False)

    def image_key(self, key):
        return "pixels"  # ALE frames arrive as "observation": call them "pixels" like every suite

