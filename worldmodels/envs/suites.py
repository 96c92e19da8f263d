"""Env suites and their task names; `check_env_config(cfg)` validates an env config before
anything is built.

An env config names a suite and a task (`configs/env/<suite>.yaml`, or a preset such as
`configs/env/pendulum.yaml` that sets both and tunes training for that task):

| suite    | `env.task`                                 | example                        |
|----------|--------------------------------------------|--------------------------------|
| `gym`    | any registered gymnasium id                | `CartPole-v1`, `Hopper-v5`     |
| `dmc`    | `domain/task` of the dm_control suite      | `walker/walk`, `cartpole/swingup` |
| `atari`  | an ALE game (`pong`, `ms_pacman`, `Pong`)   | `breakout`                     |
| `custom` | unused: `env.entry=package.module:factory` | see docs/custom-envs.md        |

`env.name` is the run's label (run directories are named after it): a preset's name, or the
label `env_label(suite, task)` that the suite files derive through the `wm_env_label` resolver.
Configs written before suites existed hold only `env.name` (one of `PRESETS`); they still load.
"""

from __future__ import annotations

import difflib
import importlib
import re
import sys
from functools import cache
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

SUITES = ("gym", "dmc", "atari", "custom")

PRESETS: dict[str, tuple[str, str]] = {
    "pendulum": ("gym", "Pendulum-v1"),
    "cartpole_swingup": ("dmc", "cartpole/swingup"),
    "walker_walk": ("dmc", "walker/walk"),
    "cheetah_run": ("dmc", "cheetah/run"),
    "hopper": ("gym", "Hopper-v5"),
    "half_cheetah": ("gym", "HalfCheetah-v5"),
    "pong": ("atari", "pong"),
}
"""Preset name -> (suite, task): the `configs/env/<name>.yaml` presets (a test keeps the two in
step), and how a config that holds only `env.name` (written before suites) is read."""


def env_label(suite: str, task: str) -> str:
    """A run-directory-safe label for a task: `walker/walk` -> `walker-walk`,
    `my_pkg.envs:make_env` -> `make_env`."""
    if suite == "custom":
        task = task.rsplit(":", 1)[-1]
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", task).strip("-") or suite


if not OmegaConf.has_resolver("wm_env_label"):
    OmegaConf.register_new_resolver("wm_env_label", lambda suite, task: env_label(str(suite), str(task)))


# ---------------------------------------------------------------------------- task names per suite
@cache
def gym_tasks() -> tuple[str, ...]:
    """Registered gymnasium ids, but ALE's (whether ale_py registered them yet): those are the atari suite."""
    import gymnasium as gym

    return tuple(sorted(env_id for env_id in gym.registry if not env_id.startswith("ALE/")))


@cache
def dmc_tasks() -> tuple[str, ...]:
    from worldmodels.envs.gl import headless_gl

    headless_gl()  # before dm_control imports MuJoCo's renderer
    from dm_control import suite

    return tuple(f"{domain}/{task}" for domain, task in suite.ALL_TASKS)


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


def atari_tasks() -> tuple[str, ...]:
    return tuple(sorted(_atari_ids()))


def atari_id(task: str) -> str | None:
    """The gymnasium id of an ALE game given as `pong`, `Pong`, `ms_pacman`, `MsPacman` or
    `ALE/Pong-v5`; None when there is no such game."""
    name = task.removeprefix("ALE/").removesuffix("-v5")
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    for rom, env_id in _atari_ids().items():
        if rom.replace("_", "") == key:
            return env_id
    return None


TASKS = {"gym": gym_tasks, "dmc": dmc_tasks, "atari": atari_tasks}
"""suite -> the function listing its valid task names (`custom` has none: it takes an entry point)."""


def nearest(name: str, names, count: int = 5) -> list[str]:
    """Up to `count` of `names` closest to `name` (difflib), case-insensitively."""
    lowered = {n.lower(): n for n in names}
    return [lowered[n] for n in difflib.get_close_matches(name.lower(), lowered, n=count, cutoff=0.5)]


def _hint(name: str, names) -> str:
    close = nearest(name, names)
    return f"nearest valid names: {close}" if close else f"e.g. {list(names)[:5]}"


# ---------------------------------------------------------------------------- custom entry points
def load_entry(entry: str, error: type[Exception] = ValueError):
    """The callable named by `entry` = 'package.module:function'. The current directory is
    searched too (as `python -m` would), so a module beside the run's working dir is found."""
    if not isinstance(entry, str) or entry.count(":") != 1 or not all(entry.split(":")):
        raise error(f"env.entry={entry!r} must be 'package.module:function' (a factory returning a "
                    "gymnasium.Env or torchrl EnvBase)")
    module_name, attr = entry.split(":")
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.append(cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise error(f"env.entry={entry!r}: cannot import module {module_name!r} ({err})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        public = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
        raise error(f"env.entry={entry!r}: module {module_name!r} has no callable {attr!r}; {_hint(attr, public)}")
    return factory


# ---------------------------------------------------------------------------- validation
def _field(cfg, name: str):
    """cfg's field `name`, None when absent or missing (`???`)."""
    if isinstance(cfg, DictConfig):
        return None if name not in cfg or OmegaConf.is_missing(cfg, name) else cfg[name]
    return cfg.get(name)


def resolve_env(cfg, error: type[Exception] = ValueError) -> tuple[str, str]:
    """(suite, task) of an env config: its `suite` and `task` (or `entry` for custom), or for a
    config that holds only `name`, the preset's. Raises `error` naming the field when invalid."""
    suite = _field(cfg, "suite")
    if suite is None:
        name = _field(cfg, "name")
        if name not in PRESETS:
            raise error(f"env.name={name!r} is not a known env; expected one of {sorted(PRESETS)} "
                        f"({_hint(str(name), PRESETS)}), or a suite: env=<{'|'.join(SUITES)}> env.task=<task>")
        return PRESETS[name]
    if suite not in SUITES:
        raise error(f"env.suite={suite!r} is not valid; expected one of {list(SUITES)} ({_hint(str(suite), SUITES)})")
    if suite == "custom":
        entry = _field(cfg, "entry")
        load_entry(entry, error)
        return suite, entry
    task = _field(cfg, "task")
    if not isinstance(task, str) or not task:
        example = {"gym": "CartPole-v1", "dmc": "walker/walk", "atari": "pong"}[suite]
        raise error(f"env.task={task!r}: env.suite={suite!r} needs a task name, e.g. env.task={example}")
    if suite == "gym" and task.startswith("ALE/"):
        raise error(f"env.task={task!r}: Atari games are the atari suite, e.g. env=atari env.task=pong "
                    "(sticky actions, frame skip with max-pooling, 64x64 frames)")
    valid = atari_id(task) is not None if suite == "atari" else task in TASKS[suite]()
    if not valid:
        raise error(f"env.task={task!r} is not a task of the {suite} suite; {_hint(task, TASKS[suite]())}")
    return suite, task


def check_env_config(cfg, error: type[Exception] = ValueError, *, check_name: bool = True) -> None:
    """Validate an env config (the `env` node of a run config) before anything is built: the
    suite, the task (unknown tasks name the suite's nearest valid names), `env.name` (a preset's
    name or the task's label; `check_name=False` skips it: `make_env` does not read it) and the
    observation/atari options. Raises `error` naming the field."""
    suite, task = resolve_env(cfg, error)
    name = _field(cfg, "name")
    if check_name and _field(cfg, "suite") is not None and name not in PRESETS and name != env_label(suite, task):
        raise error(f"env.name={name!r} is neither a preset ({sorted(PRESETS)}) nor the label of "
                    f"env.task ({env_label(suite, task)!r}); choose a task with env=<{'|'.join(SUITES)}> "
                    "env.task=<task>, and name a run with run_dir=...")
    if suite == "atari" and _field(cfg, "pixels") is False:
        raise error(f"env.pixels=false is not supported for the Atari task {task!r}: Atari observations are frames")
    for field in ("image_keys", "vector_keys"):
        pattern = _field(cfg, field)
        if pattern is None:
            continue
        try:
            re.compile(pattern)
        except (TypeError, re.error) as err:
            raise error(f"env.{field}={pattern!r} must be a regular expression over observation keys ({err})") from None


__all__ = ["PRESETS", "SUITES", "TASKS", "atari_id", "check_env_config", "env_label", "load_entry", "nearest",
           "resolve_env"]
