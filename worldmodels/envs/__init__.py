"""Environments: torchrl env factories for gymnasium, dm_control and Atari tasks."""

from worldmodels.envs.factory import ENVS, EnvSpec, env_info, headless_gl, make_env

__all__ = ["ENVS", "EnvSpec", "env_info", "headless_gl", "make_env"]
