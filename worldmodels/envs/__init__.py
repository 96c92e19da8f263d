"""Environments: torchrl envs for gymnasium, dm_control, Atari and user-defined tasks."""

from worldmodels.envs.factory import env_info, make_env, observation_keys
from worldmodels.envs.gl import headless_gl
from worldmodels.envs.suites import PRESETS, SUITES, check_env_config, env_label, resolve_env

__all__ = ["PRESETS", "SUITES", "check_env_config", "env_info", "env_label", "headless_gl", "make_env",
           "observation_keys", "resolve_env"]
