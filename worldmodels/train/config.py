"""Early checks of a run config: each bad value fails before any env or model is built, with
a message naming the field (`env.name`, `steps`, `backend.device`, ...)."""

from __future__ import annotations

import torch

from worldmodels.algos import ALGOS
from worldmodels.core import BACKENDS, IMPLEMENTED_BACKENDS
from worldmodels.envs import ENVS
from worldmodels.train.logger import KINDS


class ConfigError(ValueError):
    """A bad config value; the message names the field."""


def _int(cfg, field: str, minimum: int) -> None:
    value = _get(cfg, field)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{field}={value!r} must be an int >= {minimum}")


def _positive(cfg, field: str) -> None:
    value = _get(cfg, field)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{field}={value!r} must be a number > 0")


def _choice(cfg, field: str, choices) -> None:
    value = _get(cfg, field)
    if value not in choices:
        raise ConfigError(f"{field}={value!r} is not valid; expected one of {sorted(choices)}")


def _get(cfg, field: str):
    node = cfg
    for part in field.split("."):
        node = node[part]
    return node


def device_available(device: str) -> bool:
    """Whether this machine has `device`, its index included (cuda:1 on a one-GPU machine: no)."""
    device = torch.device(device)
    if device.type == "cpu":
        return True
    module = getattr(torch, device.type, None)
    if module is None or not hasattr(module, "is_available") or not module.is_available():
        return False
    return device.index is None or not hasattr(module, "device_count") or device.index < module.device_count()


def validate(cfg) -> None:
    _choice(cfg, "env.name", ENVS)
    _choice(cfg, "algo.name", ALGOS)
    _choice(cfg, "logger.kind", KINDS)
    for field, minimum in (("steps", 0), ("prefill", 0), ("batch_size", 1), ("seq_len", 2),
                           ("eval_every", 1), ("eval_episodes", 1), ("save_every", 1), ("log_every", 1),
                           ("collect_steps", 1), ("env.num_envs", 1), ("env.action_repeat", 1),
                           ("env.size", 8), ("replay.capacity", 1), ("algo.horizon", 1)):
        _int(cfg, field, minimum)
    _positive(cfg, "train_ratio")
    if cfg.env.time_limit is not None:
        _int(cfg, "env.time_limit", 1)
    if cfg.replay.memory_gb is not None:
        _positive(cfg, "replay.memory_gb")
    _choice(cfg, "backend.name", (*BACKENDS, "auto"))
    if cfg.backend.name not in (*IMPLEMENTED_BACKENDS, "auto"):
        raise ConfigError(f"backend.name={cfg.backend.name!r} is not available in this build; "
                          f"available: {list(IMPLEMENTED_BACKENDS)} or 'auto'")
    try:
        available = device_available(cfg.backend.device)
    except RuntimeError as err:
        raise ConfigError(f"backend.device={cfg.backend.device!r} is not a device: {err}") from None
    if not available:
        raise ConfigError(f"backend.device={cfg.backend.device!r} is not available on this machine")
    if cfg.backend.name == "cudnn" and torch.device(cfg.backend.device).type == "cuda" and not torch.backends.cudnn.is_available():
        raise ConfigError("backend.name='cudnn' needs cuDNN, which this CUDA device lacks")
