"""Training: the trainer loop, checkpoints, logging, videos, config checks, loading runs."""

from worldmodels.train.checkpoint import Checkpoints
from worldmodels.train.config import ConfigError, validate
from worldmodels.train.load import load
from worldmodels.train.trainer import Trainer, build_agent

__all__ = ["Checkpoints", "ConfigError", "Trainer", "build_agent", "load", "validate"]
