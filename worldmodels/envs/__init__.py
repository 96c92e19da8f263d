"""Environments: torchrl envs for gymnasium, dm_control, Atari and user-defined tasks."""

from worldmodels.envs.gl import check_mujoco_gl, headless_gl

check_mujoco_gl()  # before torchrl, which imports MuJoCo (and its GL) with its envs

from worldmodels.envs.factory import env_info, make_env, observation_keys  # noqa: E402
from worldmodels.envs.suites import PRESETS, SUITES, check_env_config, env_label, resolve_env  # noqa: E402

__all__ = ["PRESETS", "SUITES", "check_env_config", "env_info", "env_label", "headless_gl", "make_env",
           "observation_keys", "resolve_env"]
