"""Env suites, one file each (`gym.py`, `dmc.py`, `atari.py`, `custom.py`), registered by name in
`base.py`; `check_env_config(cfg)` validates an env config before anything is built.

An env config names a suite and a task (`configs/env/<suite>.yaml`, or a preset such as
`configs/env/pendulum.yaml` that sets both and tunes training for that task):

| suite    | `env.task`                                 | example                        |
|----------|--------------------------------------------|--------------------------------|
| `gym`    | any registered gymnasium id                | `CartPole-v1`, `Hopper-v5`     |
| `dmc`    | `domain/task` of the dm_control suite      | `walker/walk`, `cartpole/swingup` |
| `atari`  | an ALE game (`pong`, `ms_pacman`, `Pong`)   | `breakout`                     |
| `custom` | unused: `env.entry=package.module:factory` | see docs/custom-envs.md        |

A new suite is a `Suite` subclass (base.py: its tasks, its maker, its episode length) passed to
`register` (the built-in ones are registered below); the env checks, `make_env` and the run-config
checks then take `env.suite=<its name>`.

`env.name` is the run's label (run directories are named after it): a preset's name, or the
label `env_label(suite, task)` that the suite files derive through the `wm_env_label` resolver.
Configs written before suites existed hold only `env.name` (one of `PRESETS`); they still load.
"""

from __future__ import annotations

import re

from omegaconf import OmegaConf

from worldmodels.core.registry import RegistryNames
from worldmodels.envs.suites.atari import Atari, atari_id
from worldmodels.envs.suites.base import (
    Suite,
    field,
    get,
    hint,
    names,
    nearest,
    register,
    safe_label,
    unregister,
)
from worldmodels.envs.suites.custom import Custom, load_entry
from worldmodels.envs.suites.dmc import DMC
from worldmodels.envs.suites.gym import Gym

for _suite in (Gym(), DMC(), Atari(), Custom()):
    register(_suite)

SUITES = RegistryNames(names)
"""The registered suites (a live view: a suite registered later is listed too)."""

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
    `my_pkg.envs:make_env` -> `make_env`. An unknown suite gets the plain label (the config
    check then names the suite)."""
    return get(suite).label(task) if suite in names() else safe_label(task, suite)


if not OmegaConf.has_resolver("wm_env_label"):
    OmegaConf.register_new_resolver("wm_env_label", lambda suite, task: env_label(str(suite), str(task)))


def resolve_env(cfg, error: type[Exception] = ValueError) -> tuple[str, str]:
    """(suite, task) of an env config: its `suite` and `task` (or `entry` for custom), or for a
    config that holds only `name`, the preset's. Raises `error` naming the field when invalid."""
    suite = field(cfg, "suite")
    if suite is None:
        name = field(cfg, "name")
        if name not in PRESETS:
            raise error(f"env.name={name!r} is not a known env; expected one of {sorted(PRESETS)} "
                        f"({hint(str(name), PRESETS)}), or a suite: env=<{'|'.join(names())}> env.task=<task>")
        return PRESETS[name]
    return suite, get(suite, error).task(cfg, error)


def code_fields(cfg) -> dict[str, str]:
    """The fields of an env config that name code building the env would import or call (`Suite.code_fields`),
    field -> value; nothing is imported to find them. A suite this process has not registered names none
    here (building it is refused before anything is imported)."""
    suite = field(cfg, "suite")
    return get(suite).code_fields(cfg) if isinstance(suite, str) and suite in names() else {}


def check_env_config(cfg, error: type[Exception] = ValueError, *, check_name: bool = True) -> None:
    """Validate an env config (the `env` node of a run config) before anything is built: the
    suite, the task (unknown tasks name the suite's nearest valid names), `env.name` (a preset's
    name or the task's label; `check_name=False` skips it: `make_env` does not read it) and the
    observation and suite options. Raises `error` naming the field."""
    suite, task = resolve_env(cfg, error)
    name = field(cfg, "name")
    if check_name and field(cfg, "suite") is not None and name not in PRESETS and name != env_label(suite, task):
        raise error(f"env.name={name!r} is neither a preset ({sorted(PRESETS)}) nor the label of "
                    f"env.task ({env_label(suite, task)!r}); choose a task with env=<{'|'.join(names())}> "
                    "env.task=<task>, and name a run with run_dir=...")
    get(suite, error).check_options(cfg, task, error)
    for option in ("image_keys", "vector_keys"):
        pattern = field(cfg, option)
        if pattern is None:
            continue
        try:
            re.compile(pattern)
        except (TypeError, re.error) as err:
            raise error(f"env.{option}={pattern!r} must be a regular expression over observation keys "
                        f"({err})") from None


__all__ = ["PRESETS", "SUITES", "Suite", "atari_id", "check_env_config", "code_fields", "env_label", "get",
           "load_entry", "names", "nearest", "register", "resolve_env", "unregister"]
